//! The autoscaler's arithmetic and behaviour rules, pure (the caller passes the clock,
//! in seconds): from a backlog reading and what happened before, how many consumers.
//!
//! 1. Recommendation: `ceil(backlog / targetBacklogPerReplica)`, clamped to
//!    `minReplicas..=maxReplicas` ([`recommend`]); the clamping is reported
//!    (`ScalingLimited`).
//! 2. Stabilisation (as a HorizontalPodAutoscaler's `scaleDown.stabilizationWindowSeconds`):
//!    scale up at once; scale down only to the highest recommendation of the window, so a
//!    count is only dropped once nothing higher has been wanted for the whole window. The
//!    window starts afresh with the first reading after a (re)start, counting the current
//!    replicas as wanted then: a restarted operator never scales down sooner than a window
//!    after it started.
//! 3. Step limits: at most `maxStep` consumers added (removed) within any `periodSeconds`,
//!    counted from the replicas at the start of the period.
//! 4. No reading (the admin API cannot be read): the replicas stay as they are, only brought
//!    within `minReplicas..=maxReplicas` (a spec change of the bounds still applies).

use std::collections::VecDeque;

/// The autoscaling settings, with defaults applied (see `api::Autoscaling`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Policy {
    /// Fewest replicas (may be 0).
    pub min: i32,
    /// Most replicas.
    pub max: i32,
    /// Backlog one replica is expected to handle (at least 1).
    pub target: i64,
    /// Scale-down stabilisation window, seconds.
    pub window: i64,
    /// Most replicas added per period: `(max_step, period_seconds)`.
    pub up: Option<(i32, i64)>,
    /// Most replicas removed per period: `(max_step, period_seconds)`.
    pub down: Option<(i32, i64)>,
}

impl Policy {
    /// The settings of `spec.autoscaling`, defaults applied, nonsense made harmless
    /// (the schema rejects it; `min > max` becomes `max`, steps and targets at least 1).
    #[must_use]
    pub fn from_spec(a: &crate::api::Autoscaling) -> Self {
        let behavior = a.behavior.clone().unwrap_or_default();
        let step =
            |s: &crate::api::StepLimit| (s.max_step.max(1), i64::from(s.period_seconds.max(1)));
        let max = a.max_replicas.max(0);
        Self {
            min: a.min_replicas.clamp(0, max),
            max,
            target: a.target_backlog_per_replica.max(1),
            window: i64::from(behavior.scale_down_stabilization_seconds.max(0)),
            up: behavior.scale_up.as_ref().map(step),
            down: behavior.scale_down.as_ref().map(step),
        }
    }

    /// The replicas a new Deployment starts with before the first reading: one consumer
    /// (it creates the subscription if there is none yet), within the bounds.
    #[must_use]
    pub fn initial(&self) -> i32 {
        1.clamp(self.min, self.max)
    }
}

/// Whether the backlog asked for more or fewer replicas than the bounds allow.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Limit {
    /// Within `min..=max`.
    WithinRange,
    /// Below `minReplicas`: raised to it.
    TooFew,
    /// Above `maxReplicas`: lowered to it.
    TooMany,
}

impl Limit {
    /// The `ScalingLimited` condition's reason (HorizontalPodAutoscaler's wording).
    #[must_use]
    pub fn reason(self) -> &'static str {
        match self {
            Limit::WithinRange => "DesiredWithinRange",
            Limit::TooFew => "TooFewReplicas",
            Limit::TooMany => "TooManyReplicas",
        }
    }
}

/// `ceil(backlog / target)`, saturating; a target below 1 counts as 1.
#[must_use]
pub fn replicas_for(backlog: u64, target: i64) -> u64 {
    let target = u64::try_from(target.max(1)).unwrap_or(1);
    backlog.div_ceil(target)
}

/// The recommendation for `backlog`: [`replicas_for`] clamped to the bounds, and whether it
/// was clamped.
#[must_use]
pub fn recommend(policy: &Policy, backlog: u64) -> (i32, Limit) {
    let raw = replicas_for(backlog, policy.target);
    let min = u64::try_from(policy.min.max(0)).unwrap_or(0);
    let max = u64::try_from(policy.max.max(0)).unwrap_or(0);
    if raw > max {
        (policy.max, Limit::TooMany)
    } else if raw < min {
        (policy.min, Limit::TooFew)
    } else {
        (i32::try_from(raw).unwrap_or(policy.max), Limit::WithinRange)
    }
}

/// A change of the replicas the autoscaler made.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ScaleEvent {
    /// When, in seconds.
    pub at: i64,
    /// From how many.
    pub from: i32,
    /// To how many.
    pub to: i32,
}

/// Most entries the stabilisation window keeps per PulsarConsumer ([`Window`]).
pub const MAX_WINDOW_ENTRIES: usize = 16;
/// Most scale events kept per PulsarConsumer for the step limits.
pub const MAX_SCALE_EVENTS: usize = 32;

/// The recommendations of the stabilisation window, kept as a sliding-window maximum: the
/// window's highest recommendation is all a decision needs, so a recommendation that is
/// not above a newer one can never matter again (the newer one stays in the window longer)
/// and is dropped. What is left has reading times rising and recommendations strictly
/// falling from the oldest to the newest: at most one entry per distinct count, and at most
/// [`MAX_WINDOW_ENTRIES`], whatever the poll interval and the window (3,600 readings of a
/// 1-hour window at 1 s took 3,600 entries before). Past that bound the two entries closest
/// in time are merged into the higher count at the later time: the merged count is held a
/// little longer, never dropped sooner, so a scale-down can only come later, not earlier.
///
/// Recording is idempotent (the same reading twice leaves one entry), so the poller and
/// the reconcile may both record a reading.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Window {
    entries: VecDeque<(i64, i32)>,
}

impl Window {
    /// Records `recommendation`, wanted at `at`.
    pub fn record(&mut self, at: i64, recommendation: i32) {
        let mut at = at;
        while let Some(&(newer_at, r)) = self.entries.back() {
            if r > recommendation {
                // Kept; times stay in order (a reading recorded late counts from the
                // newer time: held longer, never shorter).
                at = at.max(newer_at);
                break;
            }
            at = at.max(newer_at);
            self.entries.pop_back();
        }
        self.entries.push_back((at, recommendation));
        if self.entries.len() > MAX_WINDOW_ENTRIES {
            self.merge_closest();
        }
    }

    /// Merges the two neighbours closest in time into the older's (higher) count at the
    /// newer's time.
    fn merge_closest(&mut self) {
        let closest = (1..self.entries.len())
            .min_by_key(|&i| self.entries[i].0.saturating_sub(self.entries[i - 1].0));
        if let Some(i) = closest {
            let higher = self.entries[i - 1].1;
            self.entries[i].1 = higher;
            self.entries.remove(i - 1);
        }
    }

    /// Forgets what left the window (`window` seconds before `now`).
    pub fn expire(&mut self, now: i64, window: i64) {
        while self
            .entries
            .front()
            .is_some_and(|(at, _)| *at <= now.saturating_sub(window))
        {
            self.entries.pop_front();
        }
    }

    /// The highest recommendation wanted after `since`.
    #[must_use]
    pub fn highest_after(&self, since: i64) -> Option<i32> {
        self.entries
            .iter()
            .filter(|(at, _)| *at > since)
            .map(|(_, r)| *r)
            .max()
    }

    /// The entries, oldest first (for tests and logs).
    #[must_use]
    pub fn entries(&self) -> Vec<(i64, i32)> {
        self.entries.iter().copied().collect()
    }
}

/// What the autoscaler remembers of one PulsarConsumer (in memory; it starts afresh when
/// the operator restarts). Bounded: at most [`MAX_WINDOW_ENTRIES`] recommendations and
/// [`MAX_SCALE_EVENTS`] scale events, about 1 KiB.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct History {
    /// The count last decided in this process (the caller keeps it: the status in the cache
    /// may lag behind its own writes).
    pub replicas: Option<i32>,
    /// Whether the window has started (the first reading after a (re)start was decided on).
    started: bool,
    /// The recommendations within the window.
    window: Window,
    /// Scale events, oldest first, within the longest step period.
    events: VecDeque<ScaleEvent>,
}

impl History {
    /// The recommendations it holds, oldest first (for tests and logs).
    #[must_use]
    pub fn recommendations(&self) -> Vec<(i64, i32)> {
        self.window.entries()
    }

    /// Records the recommendation of a reading (the poller does, for every reading, so the
    /// window sees each one even when it causes no reconcile).
    pub fn record_reading(&mut self, policy: &Policy, reading: Reading) {
        let (recommendation, _) = recommend(policy, reading.backlog);
        self.window.record(reading.at, recommendation);
    }
}

/// Why the replicas are what [`decide`] returns.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Why {
    /// No reading: the replicas as they are, within the bounds.
    NoReading,
    /// The recommendation is what runs already.
    Steady,
    /// Scaling up to the recommendation.
    Up,
    /// Scaling down to the highest recommendation of the window.
    Down,
    /// A lower count is wanted, but a higher one was within the window: held.
    Stabilizing,
    /// The change was cut to the step limit of its period.
    StepLimited,
}

/// What the autoscaler decided.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Decision {
    /// The replicas to run.
    pub replicas: i32,
    /// The recommendation of this reading (clamped); `None` without a reading.
    pub recommendation: Option<i32>,
    /// Whether the recommendation (or, without a reading, the current count) was clamped.
    pub limit: Limit,
    /// Why.
    pub why: Why,
}

/// A successful read of the backlog.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Reading {
    /// When it was read, in seconds.
    pub at: i64,
    /// Messages waiting on the subscription.
    pub backlog: u64,
}

/// How many replicas to run now, `current` running (as last decided), given the latest
/// `reading` (`None`: the backlog cannot be read) at `now`. Records the recommendation and the
/// scale event, if any, in `history`.
#[must_use]
pub fn decide(
    policy: &Policy,
    history: &mut History,
    current: i32,
    reading: Option<Reading>,
    now: i64,
) -> Decision {
    let Some(reading) = reading else {
        let replicas = current.clamp(policy.min, policy.max);
        let limit = if current > policy.max {
            Limit::TooMany
        } else if current < policy.min {
            Limit::TooFew
        } else {
            Limit::WithinRange
        };
        record_scale(policy, history, current, replicas, now);
        return Decision {
            replicas,
            recommendation: None,
            limit,
            why: Why::NoReading,
        };
    };
    let (recommendation, limit) = recommend(policy, reading.backlog);

    // The window starts with the first reading: what runs counts as wanted then.
    if !history.started {
        history.window.record(reading.at, current);
        history.started = true;
    }
    history.window.record(reading.at, recommendation);
    history.window.expire(now, policy.window);
    let highest_in_window = history
        .window
        .highest_after(now.saturating_sub(policy.window))
        .unwrap_or(recommendation)
        .max(recommendation);

    let (wanted, mut why) = if recommendation > current {
        (recommendation, Why::Up)
    } else if highest_in_window < current {
        (highest_in_window, Why::Down)
    } else if recommendation < current {
        (current, Why::Stabilizing)
    } else {
        (current, Why::Steady)
    };
    let limited = step_limit(policy, history, current, wanted, now);
    if limited != wanted {
        why = Why::StepLimited;
    }
    let replicas = limited.clamp(policy.min, policy.max);
    record_scale(policy, history, current, replicas, now);
    Decision {
        replicas,
        recommendation: Some(recommendation),
        limit,
        why,
    }
}

/// `wanted` cut to the step limits: within any period, at most `maxStep` added (removed)
/// counted from the replicas at the start of the period (the `from` of its first scale
/// event, else `current`).
fn step_limit(policy: &Policy, history: &History, current: i32, wanted: i32, now: i64) -> i32 {
    let at_period_start = |period: i64| {
        history
            .events
            .iter()
            .find(|e| e.at > now - period)
            .map_or(current, |e| e.from)
    };
    if wanted > current
        && let Some((step, period)) = policy.up
    {
        let ceiling = at_period_start(period).saturating_add(step);
        return wanted.min(ceiling.max(current));
    }
    if wanted < current
        && let Some((step, period)) = policy.down
    {
        let floor = at_period_start(period).saturating_sub(step);
        return wanted.max(floor.min(current));
    }
    wanted
}

/// Records a change from `from` to `to` (none when equal) and forgets events older than
/// the longest step period.
fn record_scale(policy: &Policy, history: &mut History, from: i32, to: i32, now: i64) {
    if from != to {
        history.events.push_back(ScaleEvent { at: now, from, to });
        if history.events.len() > MAX_SCALE_EVENTS {
            // The two oldest become one: the start of a period keeps the older count (the
            // step limit counts from it a little longer: slower, never faster).
            if let Some(oldest) = history.events.pop_front()
                && let Some(next) = history.events.front_mut()
            {
                next.from = oldest.from;
            }
        }
    }
    let longest = [policy.up, policy.down]
        .iter()
        .flatten()
        .map(|(_, period)| *period)
        .max()
        .unwrap_or(0);
    while history
        .events
        .front()
        .is_some_and(|e| e.at <= now - longest)
    {
        history.events.pop_front();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy(min: i32, max: i32, target: i64, window: i64) -> Policy {
        Policy {
            min,
            max,
            target,
            window,
            up: None,
            down: None,
        }
    }

    fn reading(at: i64, backlog: u64) -> Option<Reading> {
        Some(Reading { at, backlog })
    }

    /// Feeds readings `(at, backlog)` one after another starting from `current`, each
    /// decided at its reading time; returns the replicas after each.
    fn run(p: &Policy, mut current: i32, readings: &[(i64, u64)]) -> Vec<i32> {
        let mut h = History::default();
        readings
            .iter()
            .map(|&(at, backlog)| {
                current = decide(p, &mut h, current, reading(at, backlog), at).replicas;
                current
            })
            .collect()
    }

    #[test]
    fn ceil_of_backlog_over_target() {
        assert_eq!(replicas_for(0, 100), 0);
        assert_eq!(replicas_for(1, 100), 1);
        assert_eq!(replicas_for(100, 100), 1);
        assert_eq!(replicas_for(101, 100), 2);
        assert_eq!(replicas_for(20_000, 2_000), 10);
        assert_eq!(replicas_for(u64::MAX, 1), u64::MAX);
        assert_eq!(replicas_for(5, 0), 5, "a target below 1 counts as 1");
        assert_eq!(replicas_for(5, -3), 5);
    }

    #[test]
    fn clamped_to_the_bounds_and_reported() {
        let p = policy(2, 5, 100, 0);
        assert_eq!(recommend(&p, 0), (2, Limit::TooFew));
        assert_eq!(recommend(&p, 150), (2, Limit::WithinRange));
        assert_eq!(recommend(&p, 301), (4, Limit::WithinRange));
        assert_eq!(recommend(&p, 500), (5, Limit::WithinRange));
        assert_eq!(recommend(&p, 501), (5, Limit::TooMany));
        assert_eq!(recommend(&p, u64::MAX), (5, Limit::TooMany));
        assert_eq!(Limit::TooMany.reason(), "TooManyReplicas");
        assert_eq!(Limit::TooFew.reason(), "TooFewReplicas");
        assert_eq!(Limit::WithinRange.reason(), "DesiredWithinRange");
        // Zero is a valid minimum: an empty backlog asks for nothing and is not "limited".
        assert_eq!(recommend(&policy(0, 5, 100, 0), 0), (0, Limit::WithinRange));
    }

    #[test]
    fn scales_up_at_once() {
        let p = policy(1, 10, 100, 300);
        let mut h = History::default();
        let d = decide(&p, &mut h, 1, reading(0, 750), 0);
        assert_eq!((d.replicas, d.why), (8, Why::Up));
        assert_eq!(d.recommendation, Some(8));
        // Beyond the maximum: the maximum, reported.
        let d = decide(&p, &mut h, 8, reading(15, 100_000), 15);
        assert_eq!((d.replicas, d.limit), (10, Limit::TooMany));
    }

    #[test]
    fn scales_down_only_to_the_highest_recommendation_of_the_window() {
        let p = policy(1, 10, 100, 60);
        // 8 wanted at t=0, then the backlog falls: 3 at t=15, 5 at t=30, 1 from t=45.
        let replicas = run(
            &p,
            8,
            &[
                (0, 800),
                (15, 300),
                (30, 500),
                (45, 100),
                (60, 100),
                (75, 100),
                (90, 100),
                (105, 100),
            ],
        );
        // t=0..45: 8 is within the window. t=60: 8 (t=0) left it, the highest is 5 (t=30).
        // t=90: 5 left it (t=30 <= 90-60), the highest is 1.
        assert_eq!(replicas, [8, 8, 8, 8, 5, 5, 1, 1]);
    }

    #[test]
    fn a_dip_within_the_window_does_not_scale_down() {
        let p = policy(1, 10, 100, 60);
        let replicas = run(&p, 4, &[(0, 400), (15, 0), (30, 400), (45, 0), (60, 400)]);
        assert_eq!(replicas, [4, 4, 4, 4, 4]);
    }

    #[test]
    fn zero_window_scales_down_at_once() {
        let p = policy(0, 10, 100, 0);
        assert_eq!(run(&p, 5, &[(0, 500), (15, 200), (30, 0)]), [5, 2, 0]);
    }

    #[test]
    fn the_window_starts_with_the_first_reading_after_a_restart() {
        // A restarted operator finds 6 running and an empty backlog: it waits a window.
        let p = policy(0, 10, 100, 60);
        let replicas = run(&p, 6, &[(1000, 0), (1030, 0), (1059, 0), (1060, 0)]);
        assert_eq!(replicas, [6, 6, 6, 0]);
    }

    #[test]
    fn scale_to_zero_and_back() {
        let p = policy(0, 4, 1000, 30);
        let mut h = History::default();
        let mut current = 1;
        let mut step = |at: i64, backlog: u64, h: &mut History| {
            let d = decide(&p, h, current, reading(at, backlog), at);
            current = d.replicas;
            d
        };
        // Drained: held for the window, then zero.
        assert_eq!(step(0, 0, &mut h).replicas, 1);
        assert_eq!(step(10, 0, &mut h).why, Why::Stabilizing);
        assert_eq!(step(20, 0, &mut h).replicas, 1);
        let d = step(30, 0, &mut h);
        assert_eq!((d.replicas, d.why), (0, Why::Down));
        assert_eq!(step(40, 0, &mut h).why, Why::Steady);
        // One message waits: at least one consumer, at once.
        let d = step(50, 1, &mut h);
        assert_eq!((d.replicas, d.why), (1, Why::Up));
        // A burst: up to the maximum.
        assert_eq!(step(60, 3500, &mut h).replicas, 4);
        assert_eq!(step(70, 9000, &mut h).limit, Limit::TooMany);
        // Drained again: the window counts from the last high recommendation (t=70).
        assert_eq!(step(80, 0, &mut h).replicas, 4);
        assert_eq!(step(99, 0, &mut h).replicas, 4);
        assert_eq!(step(100, 0, &mut h).replicas, 0);
    }

    #[test]
    fn step_limits_per_period() {
        let mut p = policy(0, 100, 10, 0);
        p.up = Some((4, 60));
        p.down = Some((2, 30));
        let mut h = History::default();
        // 0 -> wants 50: +4 per 60 s, counted from the start of the period.
        let d = decide(&p, &mut h, 0, reading(0, 500), 0);
        assert_eq!((d.replicas, d.why), (4, Why::StepLimited));
        // Same period: nothing more.
        let d = decide(&p, &mut h, 4, reading(30, 500), 30);
        assert_eq!((d.replicas, d.why), (4, Why::StepLimited));
        // Next period (the t=0 event is 60 s old): 4 more.
        assert_eq!(decide(&p, &mut h, 4, reading(60, 500), 60).replicas, 8);
        // A small increase within the limit is not limited.
        let mut h2 = History::default();
        let d = decide(&p, &mut h2, 1, reading(0, 30), 0);
        assert_eq!((d.replicas, d.why), (3, Why::Up));
        // Down: -2 per 30 s.
        let d = decide(&p, &mut h, 8, reading(200, 0), 200);
        assert_eq!((d.replicas, d.why), (6, Why::StepLimited));
        assert_eq!(decide(&p, &mut h, 6, reading(215, 0), 215).replicas, 6);
        assert_eq!(decide(&p, &mut h, 6, reading(230, 0), 230).replicas, 4);
    }

    #[test]
    fn admin_api_failure_keeps_the_replicas() {
        let p = policy(0, 10, 100, 0);
        let mut h = History::default();
        let d = decide(&p, &mut h, 7, None, 0);
        assert_eq!(
            (d.replicas, d.why, d.recommendation),
            (7, Why::NoReading, None)
        );
        assert_eq!(d.limit, Limit::WithinRange);
        // Even a long outage changes nothing...
        assert_eq!(decide(&p, &mut h, 7, None, 10_000).replicas, 7);
        // ...and no recommendation was recorded for it.
        assert!(h.recommendations().is_empty());
        // Bounds changed meanwhile still apply.
        let d = decide(&policy(0, 5, 100, 0), &mut h, 7, None, 10_015);
        assert_eq!((d.replicas, d.limit), (5, Limit::TooMany));
        let d = decide(&policy(3, 5, 100, 0), &mut h, 1, None, 10_030);
        assert_eq!((d.replicas, d.limit), (3, Limit::TooFew));
    }

    #[test]
    fn one_recommendation_per_reading() {
        // Reconciles that see the same reading again record it once.
        let p = policy(0, 10, 100, 60);
        let mut h = History::default();
        for now in [0, 1, 2, 3] {
            let _ = decide(&p, &mut h, 2, reading(0, 200), now);
        }
        assert_eq!(h.recommendations(), [(0, 2)]);
        let _ = decide(&p, &mut h, 2, reading(15, 100), 15);
        assert_eq!(h.recommendations(), [(0, 2), (15, 1)]);
    }

    /// A small deterministic pseudo-random sequence (no dependency for it).
    fn lcg(seed: &mut u64) -> u64 {
        *seed = seed
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        *seed >> 33
    }

    /// The stabilisation as it was before the window was bounded: every reading kept.
    fn naive(p: &Policy, mut current: i32, readings: &[(i64, u64)]) -> Vec<i32> {
        let mut kept: Vec<(i64, i32)> = Vec::new();
        readings
            .iter()
            .map(|&(at, backlog)| {
                let (rec, _) = recommend(p, backlog);
                kept.push((
                    at,
                    if kept.is_empty() {
                        rec.max(current)
                    } else {
                        rec
                    },
                ));
                let highest = kept
                    .iter()
                    .filter(|(t, _)| *t > at - p.window)
                    .map(|(_, r)| *r)
                    .max()
                    .unwrap_or(rec)
                    .max(rec);
                current = if rec > current {
                    rec
                } else if highest < current {
                    highest
                } else {
                    current
                };
                current = current.clamp(p.min, p.max);
                current
            })
            .collect()
    }

    #[test]
    fn the_bounded_window_decides_as_keeping_every_reading() {
        // Up to 11 distinct counts: within the bound, so exactly the same decisions.
        let mut seed = 7;
        for window in [0, 1, 5, 30, 300] {
            let p = policy(0, 10, 100, window);
            let mut at = 0;
            let readings: Vec<(i64, u64)> = (0..2000)
                .map(|_| {
                    at += 1 + (lcg(&mut seed) % 4) as i64;
                    (at, lcg(&mut seed) % 1100)
                })
                .collect();
            assert_eq!(
                run(&p, 3, &readings),
                naive(&p, 3, &readings),
                "window {window}"
            );
        }
    }

    #[test]
    fn the_window_is_bounded_and_never_scales_down_sooner() {
        // A 1-hour window polled every second with a count falling by one each time (the
        // worst case: every reading is a new maximum of what follows it).
        let p = policy(0, 1000, 1, 3600);
        let readings: Vec<(i64, u64)> = (0..3600).map(|t| (t, 1000 - (t as u64 % 1000))).collect();
        let mut h = History::default();
        let mut current = 1000;
        let exact = naive(&p, 1000, &readings);
        for (i, &(at, backlog)) in readings.iter().enumerate() {
            current = decide(&p, &mut h, current, reading(at, backlog), at).replicas;
            assert!(h.recommendations().len() <= MAX_WINDOW_ENTRIES);
            assert!(current >= exact[i], "at {at}: {current} < {}", exact[i]);
        }
        // A rising count keeps one entry.
        let mut w = Window::default();
        for t in 0..3600 {
            w.record(t, i32::try_from(t).unwrap_or(0));
        }
        assert_eq!(w.entries(), [(3599, 3599)]);
    }

    #[test]
    fn a_reading_recorded_twice_or_late_counts_once() {
        let mut w = Window::default();
        w.record(10, 5);
        w.record(10, 5);
        assert_eq!(w.entries(), [(10, 5)]);
        w.record(20, 3);
        // A reading recorded after a newer one: held from the newer time.
        w.record(15, 4);
        assert_eq!(w.entries(), [(10, 5), (20, 4)]);
        w.record(12, 9);
        assert_eq!(w.entries(), [(20, 9)]);
        // In the window while it is younger than the window, then gone.
        w.expire(79, 60);
        assert_eq!((w.entries(), w.highest_after(19)), (vec![(20, 9)], Some(9)));
        w.expire(80, 60);
        assert!(w.entries().is_empty());
    }

    #[test]
    fn the_poller_and_the_reconcile_record_the_same_reading() {
        let p = policy(0, 10, 100, 60);
        let mut h = History::default();
        // The poller records a reading before the first decision: the window still starts
        // with what runs.
        h.record_reading(
            &p,
            Reading {
                at: 0,
                backlog: 100,
            },
        );
        let d = decide(&p, &mut h, 6, reading(0, 100), 0);
        assert_eq!((d.replicas, d.why), (6, Why::Stabilizing));
        h.record_reading(
            &p,
            Reading {
                at: 30,
                backlog: 300,
            },
        );
        assert_eq!(decide(&p, &mut h, 6, reading(30, 300), 30).replicas, 6);
        // The poller alone saw a reading of 5 at t=45: it holds the count at 5 until t=105.
        h.record_reading(
            &p,
            Reading {
                at: 45,
                backlog: 500,
            },
        );
        assert_eq!(decide(&p, &mut h, 6, reading(60, 0), 60).replicas, 5);
        assert_eq!(decide(&p, &mut h, 5, reading(104, 0), 104).replicas, 5);
        assert_eq!(decide(&p, &mut h, 5, reading(105, 0), 105).replicas, 0);
    }

    #[test]
    fn scale_events_are_bounded() {
        let mut p = policy(0, 100, 1, 0);
        p.up = Some((100, 1800));
        p.down = Some((100, 1800));
        let mut h = History::default();
        let mut current = 0;
        for t in 0..1000 {
            let backlog = if t % 2 == 0 { 50 } else { 0 };
            current = decide(&p, &mut h, current, reading(t, backlog), t).replicas;
        }
        assert!(h.events.len() <= MAX_SCALE_EVENTS, "{}", h.events.len());
        // The oldest event's start is kept: the period still counts from 0.
        assert_eq!(h.events.front().map(|e| e.from), Some(0));
    }

    #[test]
    fn policy_from_the_spec() {
        let spec: crate::api::Autoscaling = serde_json::from_value(serde_json::json!({
            "maxReplicas": 5,
            "targetBacklogPerReplica": 1000
        }))
        .unwrap_or_else(|e| panic!("{e}"));
        let p = Policy::from_spec(&spec);
        assert_eq!(
            p,
            Policy {
                min: 1,
                max: 5,
                target: 1000,
                window: 300,
                up: None,
                down: None
            }
        );
        assert_eq!(p.initial(), 1);
        let spec: crate::api::Autoscaling = serde_json::from_value(serde_json::json!({
            "minReplicas": 0, "maxReplicas": 3, "targetBacklogPerReplica": 10,
            "behavior": {
                "scaleDownStabilizationSeconds": 10,
                "scaleUp": {"maxStep": 2},
                "scaleDown": {"maxStep": 1, "periodSeconds": 60}
            }
        }))
        .unwrap_or_else(|e| panic!("{e}"));
        let p = Policy::from_spec(&spec);
        assert_eq!(
            (p.min, p.window, p.up, p.down),
            (0, 10, Some((2, 15)), Some((1, 60)))
        );
        assert_eq!(p.initial(), 1);
        assert_eq!(policy(3, 5, 1, 0).initial(), 3);
    }
}
