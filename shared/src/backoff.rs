//! Pacing of reconciles.
//!
//! [`ErrorBackoff`]: per-object exponential backoff for failed reconciles
//! (controller-runtime's rate-limited queue, simplified): the n-th consecutive failure of
//! one object waits `base * 2^(n-1)`, capped; a success resets the object; a deleted
//! object is forgotten.
//!
//! [`Debounce`]: a trailing debounce with a maximum wait. An object is reconciled once its
//! triggers have been quiet for `quiet`, but never later than `max_wait` after the first
//! trigger it deferred, so a constant stream of child events cannot postpone it forever.

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
struct Deferred {
    first: Instant,
    last: Instant,
}

/// A trailing debounce per object with a maximum wait.
///
/// Every trigger of an object (a watch event, or the requeue a deferral asked for) calls
/// [`Debounce::check`]. The first trigger is deferred by `quiet`; each further trigger
/// within `quiet` of the previous one defers again, until the triggers have been quiet for
/// `quiet` or `max_wait` has passed since the first deferred trigger: then it runs.
#[derive(Debug)]
pub struct Debounce {
    quiet: Duration,
    max_wait: Duration,
    deferred: Mutex<Expiring<Deferred>>,
}

impl Debounce {
    /// A debounce of `quiet` (zero: none) bounded by `max_wait`.
    #[must_use]
    pub fn new(quiet: Duration, max_wait: Duration) -> Self {
        let max_wait = max_wait.max(quiet);
        Self {
            quiet,
            max_wait,
            // Entries whose object was deleted while deferred (and not pruned by `forget`).
            deferred: Mutex::new(Expiring::new(max_wait.saturating_mul(2))),
        }
    }

    /// Decides whether a trigger of `key` at `now` runs the reconcile or waits.
    pub fn check(&self, key: &str, now: Instant) -> Gate {
        if self.quiet.is_zero() {
            return Gate::Run;
        }
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
            return Gate::Wait(self.quiet);
        };
        let quiet_for = now.saturating_duration_since(d.last);
        let waited = now.saturating_duration_since(d.first);
        if quiet_for >= self.quiet || waited >= self.max_wait {
            deferred.remove(key);
            return Gate::Run;
        }
        d.last = now;
        Gate::Wait(self.quiet.min(self.max_wait.saturating_sub(waited)))
    }

    /// Forgets `key` (the object is gone).
    pub fn forget(&self, key: &str) {
        lock(&self.deferred).remove(key);
    }

    /// How many objects are deferred.
    #[cfg(test)]
    #[must_use]
    pub fn len(&self) -> usize {
        lock(&self.deferred).len()
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
    fn debounce_coalesces_a_burst() {
        let gate = Debounce::new(Duration::from_millis(500), Duration::from_secs(5));
        let runs = simulate(&gate, &[0, 100, 250, 300], 2000);
        assert_eq!(runs, [800]);
        assert_eq!(gate.len(), 0);
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
        // At most 5 s after the first deferred event, then again at most 5 s after the
        // next one; the events stop at 10 s, which the last reconcile has seen.
        assert_eq!(runs, [5_000, 10_200]);
        for pair in runs.windows(2) {
            assert!(pair[1] - pair[0] <= 5_200, "gap too long: {runs:?}");
        }
        assert_eq!(gate.len(), 0);

        // Unbounded (kube's plain trailing debounce): nothing until the events stop.
        let unbounded = Debounce::new(Duration::from_millis(500), Duration::MAX);
        assert_eq!(simulate(&unbounded, &events, 12_000), [10_500]);
    }

    #[test]
    fn deferred_objects_that_vanish_are_forgotten() {
        let gate = Debounce::new(Duration::from_millis(500), Duration::from_secs(5));
        let t0 = Instant::now();
        assert!(matches!(gate.check("ns/a", t0), Gate::Wait(_)));
        assert!(matches!(gate.check("ns/b", t0), Gate::Wait(_)));
        gate.forget("ns/a");
        assert_eq!(gate.len(), 1);
        // ns/b deleted without a report: swept after 2 x max wait.
        assert!(matches!(
            gate.check("ns/c", t0 + Duration::from_secs(11)),
            Gate::Wait(_)
        ));
        assert_eq!(gate.len(), 1);
    }
}
