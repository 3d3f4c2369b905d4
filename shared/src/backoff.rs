//! Pacing of reconciles.
//!
//! [`ErrorBackoff`]: per-object exponential backoff for failed reconciles
//! (controller-runtime's rate-limited queue, simplified): the n-th consecutive failure of
//! one object waits `base * 2^(n-1)`, capped; a success resets the object; a deleted
//! object is forgotten.
//!
//! [`Debounce`]: a spec change, and a trigger that completes it, reconcile at once;
//! everything else (child events, status echoes, annotations) waits in a trailing debounce
//! with a maximum wait. Such an object is reconciled once its triggers have been quiet for
//! `quiet` (an object on its way to its spec: once `max_wait` has passed), but never later
//! than `max_wait` after the first trigger it deferred, so a constant stream of child
//! events cannot postpone it forever.

use std::{
    collections::HashMap,
    hash::{BuildHasher, RandomState},
    sync::{Mutex, MutexGuard},
    time::{Duration, Instant},
};

use crate::expiring::{Expiring, shrink_when_sparse};

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
pub(crate) enum Gate {
    /// Reconcile now.
    Run,
    /// Not yet: look again after this long (requeue the object).
    Wait(Duration),
}

/// Where an object stands when a trigger of it would be folded ([`crate::Pacing::progress`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Progress {
    /// Its stored status says `Ready` for its generation, or it is being deleted, or its
    /// kind does not say: folded until its triggers have been quiet for the debounce.
    Settled,
    /// On its way to its spec (its status does not say `Ready` for its generation) and not
    /// there yet: folded for the runner's progress interval (15 s).
    Converging,
    /// The caches show it done while its stored status does not say so yet: reconciled
    /// at once.
    Completes,
}

impl Progress {
    /// [`Progress::Completes`] when `done`, else [`Progress::Converging`]: for an object
    /// that `awaiting_ready` says is on its way.
    #[must_use]
    pub fn converging_until(done: bool) -> Self {
        if done {
            Progress::Completes
        } else {
            Progress::Converging
        }
    }
}

#[derive(Debug, Clone, Copy)]
struct Deferred {
    first: Instant,
    last: Instant,
}

/// Reconcile a spec change and what completes it at once, fold everything else: a
/// trailing debounce per object with a maximum wait, skipped by a new
/// `metadata.generation` and by a trigger that completes the object.
///
/// Every trigger of an object (a watch event, or the requeue a deferral asked for) calls
/// [`Debounce::check`] with the object's generation as the cache holds it.
///
/// - A generation this process has not reconciled yet (the object is new, or its spec was
///   changed: `kubectl scale`, an edit) runs at once. That is the trigger a person waits
///   on, and it comes alone: the API server bumps the generation once per spec write.
/// - A trigger after which the caches show the object done while its status does not say
///   so yet (the operator's [`Pacing::progress`](crate::Pacing::progress) is
///   [`Progress::Completes`]: the last pod Ready) runs at once: it is the status write the
///   person waits for next, and it comes once per change.
/// - A trigger of an object still on its way ([`Progress::Converging`]: created or
///   changed, not done) is deferred until the progress interval
///   ([`Debounce::progress_every`], else `max_wait`) has passed since the first deferred
///   trigger, however quiet they are meanwhile: its progress (pods created, some Ready) is
///   written at most once per interval, and the trigger that completes it runs at once
///   anyway. On a busy control plane an object's pods can come seconds apart, which a
///   quiet window alone would write one status for each.
/// - Any other trigger (a child's event, the echo of the operator's own status write, a
///   label or annotation change) is deferred by `quiet`; each further trigger within
///   `quiet` of the previous one defers again, until the triggers have been quiet for
///   `quiet` or `max_wait` has passed since the first deferred trigger: then it runs.
///
/// The generation reconciled last is kept per object as a hash of its key and the number
/// (16 bytes an object), until [`Debounce::forget`] (the object is gone).
#[derive(Debug)]
pub(crate) struct Debounce {
    quiet: Duration,
    max_wait: Duration,
    /// How long a converging object's triggers are folded.
    progress_every: Duration,
    deferred: Mutex<Expiring<Deferred>>,
    /// The generation each object was last reconciled at, by [`Debounce::hash`] of its key.
    reconciled: Mutex<HashMap<u64, i64>>,
    hasher: RandomState,
}

impl Debounce {
    /// A debounce of `quiet` (zero: none) bounded by `max_wait`.
    #[must_use]
    pub(crate) fn new(quiet: Duration, max_wait: Duration) -> Self {
        let max_wait = max_wait.max(quiet);
        Self {
            quiet,
            max_wait,
            progress_every: max_wait,
            // Entries whose object was deleted while deferred (and not pruned by `forget`).
            deferred: Mutex::new(Expiring::new(max_wait.saturating_mul(2))),
            reconciled: Mutex::new(HashMap::new()),
            hasher: RandomState::new(),
        }
    }

    /// Folds the triggers of an object on its way to its spec ([`Progress::Converging`])
    /// for `every` (at least the quiet window) instead of `max_wait`: its progress is
    /// written at most that often. What completes it, and a spec change, still run at once.
    #[must_use]
    pub(crate) fn progress_every(mut self, every: Duration) -> Self {
        self.progress_every = every.max(self.quiet);
        let longest = self.progress_every.max(self.max_wait);
        self.deferred = Mutex::new(Expiring::new(longest.saturating_mul(2)));
        self
    }

    fn hash(&self, key: &str) -> u64 {
        self.hasher.hash_one(key)
    }

    /// Decides whether a trigger of `key`, whose cached object is at `generation`, runs
    /// the reconcile at `now` or waits; `progress` (asked only when it would wait) says
    /// where the object stands ([`Progress`]). A [`Gate::Run`] records `generation` as
    /// reconciled.
    pub(crate) fn check(
        &self,
        key: &str,
        generation: Option<i64>,
        now: Instant,
        progress: impl FnOnce() -> Progress,
    ) -> Gate {
        let hash = self.hash(key);
        if let Some(generation) = generation {
            let mut reconciled = lock(&self.reconciled);
            if reconciled.get(&hash) != Some(&generation) {
                reconciled.insert(hash, generation);
                drop(reconciled);
                return self.run_now(key);
            }
        }
        if self.quiet.is_zero() {
            return Gate::Run;
        }
        let converging = match progress() {
            Progress::Completes => return self.run_now(key),
            Progress::Converging => true,
            Progress::Settled => false,
        };
        let mut deferred = lock(&self.deferred);
        deferred.prune(now, key, |d| Some(d.last));
        deferred.touched(now);
        let Some(d) = deferred.get_mut(key) else {
            deferred.insert(
                key,
                Deferred {
                    first: now,
                    last: now,
                },
            );
            return Gate::Wait(if converging {
                self.progress_every
            } else {
                self.quiet
            });
        };
        let quiet_for = now.saturating_duration_since(d.last);
        let waited = now.saturating_duration_since(d.first);
        let bound = if converging {
            self.progress_every
        } else {
            self.max_wait
        };
        if (!converging && quiet_for >= self.quiet) || waited >= bound {
            deferred.remove(key);
            return Gate::Run;
        }
        d.last = now;
        let left = bound.saturating_sub(waited);
        Gate::Wait(if converging {
            left
        } else {
            self.quiet.min(left)
        })
    }

    /// Runs `key` ahead of its deferral: what was deferred is seen by this reconcile, and a
    /// requeue still pending finds no entry and folds what follows.
    fn run_now(&self, key: &str) -> Gate {
        lock(&self.deferred).remove(key);
        Gate::Run
    }

    /// Records that `key` is reconciled at `generation` without asking (a resync after a
    /// full list), so its next trigger at that generation is folded.
    pub(crate) fn ran(&self, key: &str, generation: Option<i64>) {
        if let Some(generation) = generation {
            lock(&self.reconciled).insert(self.hash(key), generation);
        }
    }

    /// Forgets `key` (the object is gone).
    pub(crate) fn forget(&self, key: &str) {
        lock(&self.deferred).remove(key);
        let mut reconciled = lock(&self.reconciled);
        if reconciled.remove(&self.hash(key)).is_some() {
            shrink_when_sparse(&mut reconciled);
        }
    }

    /// How many objects are deferred.
    #[cfg(test)]
    #[must_use]
    pub(crate) fn len(&self) -> usize {
        lock(&self.deferred).len()
    }

    /// How many objects have a reconciled generation recorded.
    #[cfg(test)]
    #[must_use]
    pub(crate) fn reconciled_len(&self) -> usize {
        lock(&self.reconciled).len()
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
    /// earlier than the pending time replaces it. `generation(ms)` is the object's
    /// generation in the cache at that time. Returns the times (ms) reconciles ran.
    fn simulate(
        gate: &Debounce,
        events_ms: &[u64],
        until_ms: u64,
        generation: impl Fn(u64) -> Option<i64>,
    ) -> Vec<u64> {
        simulate_progress(gate, events_ms, until_ms, generation, |_| Progress::Settled)
    }

    /// [`simulate`], where `progress(ms)` is what the operator's
    /// [`Pacing::progress`](crate::Pacing::progress) says at that time.
    fn simulate_progress(
        gate: &Debounce,
        events_ms: &[u64],
        until_ms: u64,
        generation: impl Fn(u64) -> Option<i64>,
        progress: impl Fn(u64) -> Progress,
    ) -> Vec<u64> {
        let t0 = Instant::now();
        let mut scheduled: Option<u64> = None;
        let mut runs = Vec::new();
        for now in 0..=until_ms {
            let event = events_ms.contains(&now);
            if event || scheduled == Some(now) {
                scheduled = None;
                let at = t0 + Duration::from_millis(now);
                match gate.check("ns/o", generation(now), at, || progress(now)) {
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

    /// An object already reconciled at generation 1 whose spec never changes.
    fn at_rest(quiet_ms: u64, max_wait: Duration) -> Debounce {
        let gate = Debounce::new(Duration::from_millis(quiet_ms), max_wait);
        gate.ran("ns/o", Some(1));
        gate
    }

    #[test]
    fn debounce_coalesces_a_burst() {
        let gate = at_rest(500, Duration::from_secs(5));
        let runs = simulate(&gate, &[0, 100, 250, 300], 2000, |_| Some(1));
        assert_eq!(runs, [800]);
        assert_eq!(gate.len(), 0);
        assert_eq!(
            simulate(
                &Debounce::new(Duration::ZERO, Duration::ZERO),
                &[0, 7],
                10,
                |_| Some(1)
            ),
            [0, 7]
        );
    }

    #[test]
    fn a_spec_change_runs_at_once_and_what_follows_is_folded() {
        // Created at 0 (generation 1): at once; its status echo and the pods it created
        // (100-300 ms) fold into one reconcile. Scaled at 2,000 (generation 2): at once;
        // its pods (2,050-2,200 ms) fold again. A label change at 4,000 waits.
        let gate = Debounce::new(Duration::from_millis(500), Duration::from_secs(5));
        let events = [0, 10, 100, 250, 300, 2_000, 2_050, 2_200, 4_000];
        let generation = |ms| Some(if ms < 2_000 { 1 } else { 2 });
        let runs = simulate(&gate, &events, 6_000, generation);
        assert_eq!(runs, [0, 800, 2_000, 2_700, 4_500]);
        assert_eq!(gate.reconciled_len(), 1);

        // A scale in the middle of a burst runs at once too; the burst's pending requeue
        // then folds what follows it.
        let gate = Debounce::new(Duration::from_millis(500), Duration::from_secs(5));
        let generation = |ms| Some(if ms < 200 { 1 } else { 2 });
        let runs = simulate(&gate, &[0, 100, 200, 300], 2_000, generation);
        assert_eq!(runs, [0, 200, 800]);

        // With no debounce, every trigger runs.
        let none = Debounce::new(Duration::ZERO, Duration::ZERO);
        assert_eq!(simulate(&none, &[0, 7], 10, |_| Some(1)), [0, 7]);
        // A kind without generations is only ever debounced.
        let gate = Debounce::new(Duration::from_millis(500), Duration::from_secs(5));
        assert_eq!(simulate(&gate, &[0], 1_000, |_| None), [500]);
    }

    #[test]
    fn the_trigger_that_completes_a_change_runs_at_once() {
        // Scaled at 0 (generation 2): at once. The new pod's events at 10 and 30 ms fold;
        // the one at 60 ms makes the caches show the object done: at once. Its status echo
        // at 70 ms (the status says Ready: settled) folds into one more reconcile.
        let gate = at_rest(500, Duration::from_secs(5));
        let generation = |_| Some(2);
        let progress = |ms| match ms {
            0..60 => Progress::Converging,
            60..70 => Progress::Completes,
            _ => Progress::Settled,
        };
        let runs = simulate_progress(&gate, &[0, 10, 30, 60, 70], 6_000, generation, progress);
        assert_eq!(runs, [0, 60, 570]);

        // Asked only for a trigger that would wait: never for a new generation, and never
        // with no debounce.
        let gate = Debounce::new(Duration::from_millis(500), Duration::from_secs(5));
        let t0 = Instant::now();
        let asked = std::cell::Cell::new(0);
        let count = || {
            asked.set(asked.get() + 1);
            Progress::Completes
        };
        assert_eq!(gate.check("ns/o", Some(1), t0, count), Gate::Run);
        assert_eq!(asked.get(), 0);
        assert_eq!(gate.check("ns/o", Some(1), t0, count), Gate::Run);
        assert_eq!((asked.get(), gate.len()), (1, 0));
        let none = Debounce::new(Duration::ZERO, Duration::ZERO);
        assert_eq!(none.check("ns/o", Some(1), t0, count), Gate::Run);
        assert_eq!(none.check("ns/o", Some(1), t0, count), Gate::Run);
        assert_eq!(asked.get(), 1);
    }

    #[test]
    fn an_object_on_its_way_writes_its_progress_at_most_once_per_bound() {
        // Created at 0: at once. On a busy control plane its pods come 1.5 s apart
        // (created, scheduled, started, Ready: 1,500 to 6,000 ms) and the last one
        // completes it at 7,500 ms.
        let events = [0, 1_500, 3_000, 4_500, 6_000, 7_500];
        let generation = |_| Some(1);
        let progress = |ms| match ms {
            0..7_500 => Progress::Converging,
            7_500 => Progress::Completes,
            _ => Progress::Settled,
        };
        // Converging: one reconcile for everything the bound holds, then the completion.
        let gate = Debounce::new(Duration::from_millis(500), Duration::from_secs(5));
        let runs = simulate_progress(&gate, &events, 12_000, generation, progress);
        assert_eq!(runs, [0, 6_500, 7_500]);
        // Were it settled, every event would wait out the quiet window alone.
        let gate = Debounce::new(Duration::from_millis(500), Duration::from_secs(5));
        let runs = simulate(&gate, &events, 12_000, generation);
        assert_eq!(runs, [0, 2_000, 3_500, 5_000, 6_500, 8_000]);
        // A spec change on the way still runs at once.
        let gate = Debounce::new(Duration::from_millis(500), Duration::from_secs(5));
        let changed = |ms| Some(if ms < 3_000 { 1 } else { 2 });
        let runs = simulate_progress(&gate, &events, 12_000, changed, progress);
        assert_eq!(runs, [0, 3_000, 7_500]);
        // With a longer progress interval, the progress in between is not written at all;
        // a settled object's triggers still wait out the quiet window only.
        let gate = Debounce::new(Duration::from_millis(500), Duration::from_secs(5))
            .progress_every(Duration::from_secs(10));
        let runs = simulate_progress(&gate, &events, 12_000, generation, progress);
        assert_eq!(runs, [0, 7_500]);
        let slow: Vec<u64> = (0..=12).map(|i| i * 1_500).collect();
        let gate = Debounce::new(Duration::from_millis(500), Duration::from_secs(5))
            .progress_every(Duration::from_secs(10));
        let runs = simulate_progress(&gate, &slow, 20_000, generation, |_| Progress::Converging);
        assert_eq!(runs, [0, 11_500]);
        let gate = at_rest(500, Duration::from_secs(5)).progress_every(Duration::from_secs(10));
        assert_eq!(simulate(&gate, &[0, 100], 2_000, generation), [600]);
    }

    #[test]
    fn a_constant_stream_of_events_cannot_postpone_reconciles_forever() {
        // An event every 200 ms for 10 s, debounce 500 ms.
        let events: Vec<u64> = (0..=50).map(|i| i * 200).collect();
        let gate = at_rest(500, Duration::from_secs(5));
        let runs = simulate(&gate, &events, 12_000, |_| Some(1));
        // At most 5 s after the first deferred event, then again at most 5 s after the
        // next one; the events stop at 10 s, which the last reconcile has seen.
        assert_eq!(runs, [5_000, 10_200]);
        for pair in runs.windows(2) {
            assert!(pair[1] - pair[0] <= 5_200, "gap too long: {runs:?}");
        }
        assert_eq!(gate.len(), 0);

        // Unbounded (kube's plain trailing debounce): nothing until the events stop.
        let unbounded = at_rest(500, Duration::MAX);
        assert_eq!(simulate(&unbounded, &events, 12_000, |_| Some(1)), [10_500]);
    }

    #[test]
    fn deferred_objects_that_vanish_are_forgotten() {
        let gate = Debounce::new(Duration::from_millis(500), Duration::from_secs(5));
        let t0 = Instant::now();
        for key in ["ns/a", "ns/b"] {
            assert_eq!(
                gate.check(key, Some(1), t0, || Progress::Settled),
                Gate::Run
            );
            assert!(matches!(
                gate.check(key, Some(1), t0, || Progress::Settled),
                Gate::Wait(_)
            ));
        }
        assert_eq!(gate.reconciled_len(), 2);
        gate.forget("ns/a");
        assert_eq!(gate.len(), 1);
        assert_eq!(gate.reconciled_len(), 1);
        // ns/b deleted without a report: its deferral is swept after 2 x max wait.
        assert!(matches!(
            gate.check("ns/c", None, t0 + Duration::from_secs(11), || {
                Progress::Settled
            }),
            Gate::Wait(_)
        ));
        assert_eq!(gate.len(), 1);
        // A new object of the same name is new: its generation 1 runs at once again.
        assert_eq!(
            gate.check("ns/a", Some(1), t0, || Progress::Settled),
            Gate::Run
        );
    }

    #[test]
    fn forgetting_a_burst_of_objects_gives_the_memory_back() {
        let gate = Debounce::new(Duration::from_millis(500), Duration::from_secs(5));
        let keys: Vec<String> = (0..10_000).map(|i| format!("ns/o{i}")).collect();
        for key in &keys {
            gate.ran(key, Some(1));
        }
        let full = lock(&gate.reconciled).capacity();
        for key in &keys[10..] {
            gate.forget(key);
        }
        assert_eq!(gate.reconciled_len(), 10);
        assert!(lock(&gate.reconciled).capacity() < full / 100, "{full}");
    }
}
