//! Pods that left the operator's label-selected pod watch while they still exist.
//!
//! The pod watch selects `app.kubernetes.io/managed-by=<operator>`, so the cache never
//! holds the namespace's unrelated pods. The price: a pod of ours whose label someone
//! removed drops out of the watch as if it were deleted (the API server sends `DELETED`
//! with the last matching state, no deletion timestamp). [`Strays`] remembers such pods per
//! PodSet so the next reconcile reads them once and puts the labels back, instead of
//! creating a replacement beside a pod that still runs.

use std::collections::{BTreeSet, HashMap};
use std::sync::Mutex;

/// Pod names per PodSet uid that left the watch without being deleted.
///
/// Bounded: only PodSets the cache holds get entries (the caller checks), each PodSet's
/// entries are handled by its next reconcile, and a PodSet remembers at most
/// [`MAX_PER_PODSET`] at once. Pods past that are not remembered: at worst the PodSet
/// creates a replacement beside a pod someone unlabelled in their own namespace.
#[derive(Debug, Default)]
pub struct Strays {
    by_owner: Mutex<HashMap<String, BTreeSet<String>>>,
}

/// The most strays one PodSet remembers: twice the most pods a PodSet may ask for.
pub const MAX_PER_PODSET: usize = 2 * crate::api::MAX_REPLICAS as usize;

impl Strays {
    /// Remembers that pod `name` of the PodSet `owner_uid` left the watch (unless that
    /// PodSet already remembers [`MAX_PER_PODSET`]).
    pub fn add(&self, owner_uid: &str, name: &str) {
        if let Ok(mut m) = self.by_owner.lock() {
            let set = m.entry(owner_uid.to_owned()).or_default();
            if set.len() < MAX_PER_PODSET {
                set.insert(name.to_owned());
            }
        }
    }

    /// The strays of `owner_uid`, still remembered.
    #[must_use]
    pub fn of(&self, owner_uid: &str) -> Vec<String> {
        self.by_owner
            .lock()
            .ok()
            .and_then(|m| m.get(owner_uid).map(|s| s.iter().cloned().collect()))
            .unwrap_or_default()
    }

    /// Forgets one stray (handled: relabelled, or gone).
    pub fn handled(&self, owner_uid: &str, name: &str) {
        if let Ok(mut m) = self.by_owner.lock()
            && let Some(set) = m.get_mut(owner_uid)
        {
            set.remove(name);
            if set.is_empty() {
                m.remove(owner_uid);
            }
        }
    }

    /// Forgets every stray of a PodSet that is gone (its pods are garbage-collected).
    pub fn forget(&self, owner_uid: &str) {
        if let Ok(mut m) = self.by_owner.lock() {
            m.remove(owner_uid);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn remembered_until_handled_or_forgotten() {
        let s = Strays::default();
        s.add("u1", "a");
        s.add("u1", "b");
        s.add("u1", "a");
        s.add("u2", "c");
        assert_eq!(s.of("u1"), ["a", "b"]);
        s.handled("u1", "a");
        assert_eq!(s.of("u1"), ["b"]);
        s.handled("u1", "b");
        assert!(s.of("u1").is_empty());
        assert!(
            !s.by_owner.lock().unwrap().contains_key("u1"),
            "an owner with no strays left is dropped"
        );
        s.forget("u2");
        assert!(s.by_owner.lock().unwrap().is_empty());
        assert!(s.of("nobody").is_empty());
    }

    #[test]
    fn one_podset_remembers_a_bounded_number() {
        let s = Strays::default();
        for i in 0..MAX_PER_PODSET + 10 {
            s.add("u1", &format!("pod-{i}"));
        }
        assert_eq!(s.of("u1").len(), MAX_PER_PODSET);
        s.add("u2", "other");
        assert_eq!(s.of("u2"), ["other"], "another PodSet is not affected");
    }
}
