//! Creates and deletes in flight, per PodSet (the ReplicaSet controller's "expectations").
//!
//! The pod index lags behind our own writes. Without this bookkeeping a reconcile that runs
//! right after creating pods would not see them yet and create more, briefly exceeding
//! `spec.replicas`. So after creating or deleting pods, a PodSet is not scaled again until
//! the watch has shown every one of those changes, or until [`Expectations::timeout`]
//! passed (a lost watch event must not block the PodSet forever; client-go uses 5 min).
//!
//! Pure bookkeeping: time and the cache are passed in, so it is unit-tested without a cluster.

use std::{
    collections::BTreeSet,
    sync::Mutex,
    time::{Duration, Instant},
};

use shared::Expiring;

/// What the cache shows of one pod name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cached {
    /// Not in the cache.
    Absent,
    /// In the cache, not terminating.
    Present,
    /// In the cache with a deletionTimestamp.
    Terminating,
}

#[derive(Debug, Default)]
struct Pending {
    creates: BTreeSet<String>,
    deletes: BTreeSet<String>,
    since: Option<Instant>,
}

/// Pending creates and deletes, keyed by PodSet UID.
#[derive(Debug)]
pub struct Expectations {
    timeout: Duration,
    pending: Mutex<Expiring<Pending>>,
}

impl Default for Expectations {
    fn default() -> Self {
        Self::new(Duration::from_secs(300))
    }
}

impl Expectations {
    /// Expectations that expire `timeout` after the last recorded write.
    #[must_use]
    pub fn new(timeout: Duration) -> Self {
        Self {
            timeout,
            // An entry whose last write is more than twice the timeout old: a live PodSet
            // with such an entry was requeued at the timeout and cleared it, so these
            // belong to PodSets deleted without their deletion being seen (e.g. during a
            // watch gap).
            pending: Mutex::new(Expiring::new(timeout.saturating_mul(2))),
        }
    }

    /// How long unobserved writes block scaling.
    #[must_use]
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    fn with<R>(&self, f: impl FnOnce(&mut Expiring<Pending>) -> R) -> R {
        match self.pending.lock() {
            Ok(mut p) => f(&mut p),
            Err(poisoned) => f(&mut poisoned.into_inner()),
        }
    }

    /// Records a write for PodSet `uid` at `now`, after dropping stale entries.
    fn record<'a>(p: &'a mut Expiring<Pending>, uid: &str, now: Instant) -> &'a mut Pending {
        p.prune(now, uid, |e| e.since);
        p.touched(now);
        let e = p.entry_or_default(uid);
        e.since = Some(now);
        e
    }

    /// How many PodSets have writes in flight.
    #[must_use]
    pub fn len(&self) -> usize {
        self.with(|p| p.len())
    }

    /// Whether no PodSet has writes in flight.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Records that pod `name` was created for PodSet `uid`. `cached` is how the cache shows
    /// it *now* (checked under the same lock as [`Expectations::observe`], so a watch event
    /// that raced ahead of this call is not missed).
    pub fn created(&self, uid: &str, name: &str, cached: impl Fn(&str) -> Cached, now: Instant) {
        self.with(|p| {
            if cached(name) != Cached::Absent {
                p.prune(now, uid, |e| e.since);
                return;
            }
            Self::record(p, uid, now).creates.insert(name.to_owned());
        });
    }

    /// Records that pod `name` of PodSet `uid` is about to be deleted.
    pub fn deleting(&self, uid: &str, name: &str, now: Instant) {
        self.with(|p| {
            Self::record(p, uid, now).deletes.insert(name.to_owned());
        });
    }

    /// Forgets an expected deletion that did not happen (the DELETE failed).
    pub fn delete_failed(&self, uid: &str, name: &str) {
        self.with(|p| {
            if let Some(e) = p.get_mut(uid) {
                e.deletes.remove(name);
            }
        });
    }

    /// Called for every pod the watch delivers: marks its creation (and, if terminating,
    /// its deletion) as observed.
    pub fn observe(&self, owner_uid: &str, name: &str, terminating: bool) {
        self.with(|p| {
            if let Some(e) = p.get_mut(owner_uid) {
                e.creates.remove(name);
                if terminating {
                    e.deletes.remove(name);
                }
            }
        });
    }

    /// Whether PodSet `uid` may be scaled: every recorded write has been observed (a
    /// create is in the cache; a delete is gone or terminating), or the wait timed out.
    pub fn satisfied(&self, uid: &str, cached: impl Fn(&str) -> Cached, now: Instant) -> bool {
        let timeout = self.timeout;
        self.with(|p| {
            let Some(e) = p.get_mut(uid) else { return true };
            e.creates.retain(|n| cached(n) == Cached::Absent);
            e.deletes.retain(|n| cached(n) == Cached::Present);
            let done = e.creates.is_empty() && e.deletes.is_empty();
            let expired = e
                .since
                .is_some_and(|s| now.saturating_duration_since(s) >= timeout);
            if done || expired {
                if expired && !done {
                    tracing::warn!(
                        podset_uid = uid,
                        "pod writes not observed before the timeout; scaling anyway"
                    );
                }
                p.remove(uid);
                true
            } else {
                false
            }
        })
    }

    /// Drops everything about PodSet `uid` (it is being deleted, or is gone).
    pub fn forget(&self, uid: &str) {
        self.with(|p| {
            p.remove(uid);
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn absent(_: &str) -> Cached {
        Cached::Absent
    }

    #[test]
    fn creations_block_until_observed() {
        let e = Expectations::new(Duration::from_secs(300));
        let t0 = Instant::now();
        assert!(e.satisfied("u", absent, t0));
        e.created("u", "p-1", absent, t0);
        e.created("u", "p-2", absent, t0);
        assert!(!e.satisfied("u", absent, t0));
        e.observe("u", "p-1", false);
        assert!(!e.satisfied("u", absent, t0));
        // p-2 shows up in the cache without an observe call (e.g. the hook raced): fine too.
        assert!(e.satisfied(
            "u",
            |n| if n == "p-2" {
                Cached::Present
            } else {
                Cached::Absent
            },
            t0
        ));
        // Another PodSet is independent.
        e.created("v", "q-1", absent, t0);
        assert!(e.satisfied("u", absent, t0));
        assert!(!e.satisfied("v", absent, t0));
    }

    #[test]
    fn creation_already_cached_is_not_expected() {
        let e = Expectations::default();
        let t0 = Instant::now();
        e.created("u", "p-1", |_| Cached::Present, t0);
        assert!(e.satisfied("u", absent, t0));
    }

    #[test]
    fn deletions_block_until_gone_or_terminating() {
        let e = Expectations::default();
        let t0 = Instant::now();
        e.deleting("u", "p-1", t0);
        e.deleting("u", "p-2", t0);
        assert!(!e.satisfied("u", |_| Cached::Present, t0));
        e.observe("u", "p-1", true);
        assert!(!e.satisfied("u", |_| Cached::Present, t0));
        assert!(e.satisfied(
            "u",
            |n| if n == "p-2" {
                Cached::Terminating
            } else {
                Cached::Present
            },
            t0
        ));
        e.deleting("u", "p-3", t0);
        e.delete_failed("u", "p-3");
        assert!(e.satisfied("u", |_| Cached::Present, t0));
    }

    #[test]
    fn expectations_time_out() {
        let e = Expectations::new(Duration::from_secs(10));
        let t0 = Instant::now();
        e.created("u", "p-1", absent, t0);
        assert!(!e.satisfied("u", absent, t0 + Duration::from_secs(9)));
        assert!(e.satisfied("u", absent, t0 + Duration::from_secs(10)));
        // Cleared: satisfied afterwards too.
        assert!(e.satisfied("u", absent, t0 + Duration::from_secs(11)));
        e.created("u", "p-2", absent, t0);
        e.forget("u");
        assert!(e.satisfied("u", absent, t0));
    }

    #[test]
    fn deleted_podsets_do_not_leak() {
        let e = Expectations::new(Duration::from_secs(10));
        let t0 = Instant::now();
        e.created("deleted", "p-1", absent, t0);
        e.deleting("unseen", "q-1", t0);
        e.created("live", "r-1", absent, t0);
        assert_eq!(e.len(), 3);
        // A deletion the watch showed: forgotten at once.
        e.forget("deleted");
        assert_eq!(e.len(), 2);
        // A deletion nobody saw: swept by the next write once twice the timeout passed.
        e.created("live", "r-2", absent, t0 + Duration::from_secs(20));
        assert_eq!(e.len(), 2, "swept too early");
        e.created("other", "s-1", absent, t0 + Duration::from_secs(21));
        assert_eq!(e.len(), 2, "unseen was not swept");
        assert!(!e.satisfied("live", absent, t0 + Duration::from_secs(21)));
        assert!(!e.satisfied("other", absent, t0 + Duration::from_secs(21)));
    }
}
