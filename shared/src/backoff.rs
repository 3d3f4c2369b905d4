//! Pacing of reconciles.
//!
//! [`ErrorBackoff`]: per-object exponential backoff for failed reconciles
//! (controller-runtime's rate-limited queue, simplified): the n-th consecutive failure of
//! one object waits `base * 2^(n-1)`, capped; a success resets the object; a deleted
//! object is forgotten.
//!
//! [`Debounce`]: reconcile at once, fold what follows. The first trigger of an object that
//! has been quiet for `quiet` runs at once (a person who scales by hand waits for nothing);
//! triggers within `quiet` of the one before are folded into one trailing reconcile once
//! they have been quiet for `quiet`, but never later than `max_wait` after the first one it
//! deferred, so a constant stream of child events cannot postpone it forever.

use std::{
    sync::{Mutex, MutexGuard},
    time::{Duration, Instant},
};

use crate::expiring::Expiring;

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

#[derive(Debug, Clone, Copy)]
struct Failures {
    count: u32,
    last: Instant,
}

impl Default for Failures {
    fn default() -> Self {
        Self {
            count: 0,
            last: Instant::now(),
        }
    }
}

/// Failure counts per object key (`namespace/name`).
#[derive(Debug)]
pub struct ErrorBackoff {
    base: Duration,
    max: Duration,
    failures: Mutex<Expiring<Failures>>,
}

impl Default for ErrorBackoff {
    /// 1 s doubling up to 5 min.
    fn default() -> Self {
        Self::new(Duration::from_secs(1), Duration::from_secs(300))
    }
}

impl ErrorBackoff {
    /// A backoff starting at `base`, doubling up to `max`.
    #[must_use]
    pub fn new(base: Duration, max: Duration) -> Self {
        Self {
            base,
            max,
            // An object that keeps failing fails again at least every `max` (plus its
            // reconcile time): twice that without a failure, it was deleted unseen.
            failures: Mutex::new(Expiring::new(max.saturating_mul(2))),
        }
    }

    /// Records a failure of `key`; returns how long to wait before retrying it.
    pub fn failed(&self, key: &str) -> Duration {
        self.failed_at(key, Instant::now())
    }

    /// [`ErrorBackoff::failed`] at time `now`. Also drops the entries of objects that have
    /// not failed for twice the maximum wait: an object that keeps failing fails again at
    /// least every `max` (plus its reconcile time), so those are objects deleted while a
    /// retry was pending and whose deletion was not seen (e.g. during a watch gap).
    pub fn failed_at(&self, key: &str, now: Instant) -> Duration {
        let n = {
            let mut f = lock(&self.failures);
            f.prune(now, key, |e| Some(e.last));
            let e = f.entry_or_default(key);
            e.count = e.count.saturating_add(1);
            e.last = now;
            let n = e.count;
            f.touched(now);
            n
        };
        let factor = 2u32.saturating_pow(n.saturating_sub(1).min(20));
        self.base.saturating_mul(factor).min(self.max)
    }

    /// Forgets the failures of `key` (after a successful reconcile).
    pub fn succeeded(&self, key: &str) {
        self.forget(key);
    }

    /// Forgets everything about `key` (the object is gone).
    pub fn forget(&self, key: &str) {
        lock(&self.failures).remove(key);
    }

    /// How many objects have failures recorded.
    #[must_use]
    pub fn len(&self) -> usize {
        lock(&self.failures).len()
    }

    /// Whether no object has failures recorded.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// What [`Debounce::check`] decides for one trigger of an object.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Gate {
    /// Reconcile now.
    Run,
    /// Not yet: look again after this long (requeue the object).
    Wait(Duration),
}

#[derive(Debug, Clone, Copy)]
struct Recent {
    /// The object's last trigger.
    last: Instant,
    /// The first trigger of the burst being folded; `None` when none is deferred.
    first_deferred: Option<Instant>,
}

/// Reconcile at once, fold what follows: a leading-edge debounce per object, with a
/// trailing reconcile for the triggers it folded and a maximum wait.
///
/// Every trigger of an object (a watch event, or the requeue a deferral asked for) calls
/// [`Debounce::check`]. A trigger `quiet` or more after the object's last one runs at once.
/// A trigger within `quiet` of the last one (the pods the reconcile just created, becoming
/// Ready one after another) is deferred, and each further one defers again, until the
/// triggers have been quiet for `quiet` or `max_wait` has passed since the first deferred
/// trigger: then the folded reconcile runs. A burst thus costs two reconciles (its first
/// trigger and its end) whatever its length, and the first comes without delay.
///
/// The entry of an object stays after it ran (that is how the next trigger knows whether it
/// is part of the same burst); entries whose last trigger is older than `max_wait` mean
/// nothing any more and are dropped on the next check after that.
#[derive(Debug)]
pub struct Debounce {
    quiet: Duration,
    max_wait: Duration,
    recent: Mutex<Expiring<Recent>>,
}

impl Debounce {
    /// A debounce of `quiet` (zero: none) bounded by `max_wait`.
    #[must_use]
    pub fn new(quiet: Duration, max_wait: Duration) -> Self {
        let max_wait = max_wait.max(quiet);
        Self {
            quiet,
            max_wait,
            // A trigger `quiet` after the last one runs whether the entry is there or not,
            // and a deferral asks for its requeue at most `quiet` after its last trigger.
            recent: Mutex::new(Expiring::new(max_wait)),
        }
    }

    /// Decides whether a trigger of `key` at `now` runs the reconcile or waits.
    pub fn check(&self, key: &str, now: Instant) -> Gate {
        if self.quiet.is_zero() {
            return Gate::Run;
        }
        let mut recent = lock(&self.recent);
        recent.prune(now, key, |r| Some(r.last));
        recent.touched(now);
        let ran = Recent {
            last: now,
            first_deferred: None,
        };
        let Some(r) = recent.get_mut(key) else {
            // Quiet until now: at once.
            recent.insert(key, ran);
            return Gate::Run;
        };
        if now.saturating_duration_since(r.last) >= self.quiet {
            // A new burst, or the end of the one being folded.
            *r = ran;
            return Gate::Run;
        }
        let first = *r.first_deferred.get_or_insert(now);
        let waited = now.saturating_duration_since(first);
        if waited >= self.max_wait {
            *r = ran;
            return Gate::Run;
        }
        r.last = now;
        Gate::Wait(self.quiet.min(self.max_wait.saturating_sub(waited)))
    }

    /// Forgets `key` (the object is gone).
    pub fn forget(&self, key: &str) {
        lock(&self.recent).remove(key);
    }

    /// How many objects had a trigger lately.
    #[cfg(test)]
    #[must_use]
    pub fn len(&self) -> usize {
        lock(&self.recent).len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn doubles_caps_and_resets() {
        let b = ErrorBackoff::new(Duration::from_secs(1), Duration::from_secs(10));
        let waits: Vec<_> = (0..6).map(|_| b.failed("ns/a").as_secs()).collect();
        assert_eq!(waits, [1, 2, 4, 8, 10, 10]);
        assert_eq!(b.failed("ns/b").as_secs(), 1);
        b.succeeded("ns/a");
        assert_eq!(b.failed("ns/a").as_secs(), 1);
    }

    #[test]
    fn deleted_objects_are_forgotten() {
        let b = ErrorBackoff::new(Duration::from_secs(1), Duration::from_secs(10));
        let t0 = Instant::now();
        b.failed_at("ns/deleted", t0);
        b.failed_at("ns/failing", t0);
        assert_eq!(b.len(), 2);
        // Deleted while failing: the runner forgets it when kube reports it gone.
        b.forget("ns/deleted");
        assert_eq!(b.len(), 1);
        // A deletion nobody reported: swept once it has not failed for 2 x max.
        b.failed_at("ns/unseen", t0);
        b.failed_at("ns/failing", t0 + Duration::from_secs(10));
        b.failed_at("ns/failing", t0 + Duration::from_secs(21));
        assert_eq!(b.len(), 1, "ns/unseen was not swept");
        // The one still failing kept its count (capped wait).
        assert_eq!(
            b.failed_at("ns/failing", t0 + Duration::from_secs(22)),
            Duration::from_secs(8)
        );
    }

    /// Drives `gate` like kube's scheduler does: one pending time per object, a trigger
    /// earlier than the pending time replaces it. Returns the times (ms) reconciles ran.
    fn simulate(gate: &Debounce, events_ms: &[u64], until_ms: u64) -> Vec<u64> {
        let t0 = Instant::now();
        let mut scheduled: Option<u64> = None;
        let mut runs = Vec::new();
        for now in 0..=until_ms {
            let event = events_ms.contains(&now);
            if event || scheduled == Some(now) {
                scheduled = None;
                match gate.check("ns/o", t0 + Duration::from_millis(now)) {
                    Gate::Run => runs.push(now),
                    Gate::Wait(d) => {
                        let d = u64::try_from(d.as_millis()).unwrap_or(u64::MAX);
                        scheduled = Some(now + d.max(1));
                    }
                }
            }
        }
        runs
    }

    #[test]
    fn the_first_trigger_runs_at_once_and_a_burst_is_folded() {
        let gate = Debounce::new(Duration::from_millis(500), Duration::from_secs(5));
        // A burst: its first trigger at once, the rest in one reconcile once quiet.
        let runs = simulate(&gate, &[0, 100, 250, 300, 2_000, 2_100, 3_200], 4_000);
        assert_eq!(runs, [0, 800, 2_000, 2_600, 3_200]);
        assert_eq!(
            simulate(&Debounce::new(Duration::ZERO, Duration::ZERO), &[0, 7], 10),
            [0, 7]
        );
    }

    #[test]
    fn a_constant_stream_of_events_cannot_postpone_reconciles_forever() {
        // An event every 200 ms for 10 s, debounce 500 ms.
        let events: Vec<u64> = (0..=50).map(|i| i * 200).collect();
        let gate = Debounce::new(Duration::from_millis(500), Duration::from_secs(5));
        let runs = simulate(&gate, &events, 12_000);
        // At once; then at most 5 s after the first deferred event (200 ms), then again
        // at most 5 s after the next one; the events stop at 10 s, which the last
        // reconcile has seen.
        assert_eq!(runs, [0, 5_200, 10_400]);
        for pair in runs.windows(2) {
            assert!(pair[1] - pair[0] <= 5_500, "gap too long: {runs:?}");
        }

        // Unbounded (a plain trailing debounce): nothing more until the events stop.
        let unbounded = Debounce::new(Duration::from_millis(500), Duration::MAX);
        assert_eq!(simulate(&unbounded, &events, 12_000), [0, 10_500]);
    }

    #[test]
    fn entries_go_once_they_mean_nothing() {
        let gate = Debounce::new(Duration::from_millis(500), Duration::from_secs(5));
        let t0 = Instant::now();
        for key in ["ns/a", "ns/b"] {
            assert_eq!(gate.check(key, t0), Gate::Run);
        }
        assert_eq!(gate.len(), 2);
        // A trigger after max wait sweeps the others: they would run at once anyway.
        assert_eq!(gate.check("ns/c", t0 + Duration::from_secs(6)), Gate::Run);
        assert_eq!(gate.len(), 1);
    }

    #[test]
    fn deferred_objects_that_vanish_are_forgotten() {
        let gate = Debounce::new(Duration::from_millis(500), Duration::from_secs(5));
        let t0 = Instant::now();
        let soon = t0 + Duration::from_millis(10);
        for key in ["ns/a", "ns/b"] {
            assert_eq!(gate.check(key, t0), Gate::Run);
            assert!(matches!(gate.check(key, soon), Gate::Wait(_)));
        }
        gate.forget("ns/a");
        assert_eq!(gate.len(), 1);
        // ns/b deleted while deferred, without a report: swept after max wait.
        assert_eq!(gate.check("ns/c", t0 + Duration::from_secs(6)), Gate::Run);
        assert_eq!(gate.len(), 1);
    }
}
