//! [`Expiring`]: per-object bookkeeping (backoff counts, deferred triggers, writes in
//! flight) whose entries go stale when their object vanished unseen.
//!
//! Dropping stale entries used to scan the whole map on every call, which made a burst of
//! N objects cost N² entry visits (10⁸ at 10,000 PodSets). Here the map remembers the
//! earliest moment an entry can go stale and scans only from then on. It also gives
//! memory back: a burst grows a `HashMap` to the burst's size and removing entries never
//! shrinks it, so the map shrinks once it is less than a quarter full.

use std::{
    borrow::Borrow,
    collections::HashMap,
    hash::Hash,
    time::{Duration, Instant},
};

/// Smallest capacity worth shrinking from.
const MIN_SHRINK_CAPACITY: usize = 64;

/// A map by object key whose entries go stale `stale_after` past the instant
/// [`Expiring::prune`] reads from each.
#[derive(Debug)]
pub struct Expiring<V> {
    map: HashMap<String, V>,
    stale_after: Duration,
    /// The earliest instant an entry can be stale; `None` when none can.
    due: Option<Instant>,
}

impl<V> Expiring<V> {
    /// An empty map whose entries go stale `stale_after` past their last use.
    #[must_use]
    pub fn new(stale_after: Duration) -> Self {
        Self {
            map: HashMap::new(),
            stale_after,
            due: None,
        }
    }

    /// Drops the entries stale at `now`, except the one of `except`, when one can be:
    /// `last` gives the instant an entry was last used (`None`: it never goes stale).
    pub fn prune(&mut self, now: Instant, except: &str, last: impl Fn(&V) -> Option<Instant>) {
        if self.due.is_none_or(|due| now < due) {
            return;
        }
        let stale_after = self.stale_after;
        let mut earliest: Option<Instant> = None;
        self.map.retain(|key, value| {
            let Some(at) = last(value) else { return true };
            let keep = key == except || now.saturating_duration_since(at) <= stale_after;
            if keep {
                earliest = Some(earliest.map_or(at, |e| e.min(at)));
            }
            keep
        });
        self.due = earliest.and_then(|at| at.checked_add(stale_after));
        self.shrink();
    }

    /// Records that an entry was used at `at`: it can go stale `stale_after` later.
    pub fn touched(&mut self, at: Instant) {
        if let Some(stale) = at.checked_add(self.stale_after) {
            self.due = Some(self.due.map_or(stale, |due| due.min(stale)));
        }
    }

    /// The entry of `key`, created with `V::default()` when missing.
    pub fn entry_or_default(&mut self, key: &str) -> &mut V
    where
        V: Default,
    {
        self.map.entry(key.to_owned()).or_default()
    }

    /// Sets the entry of `key`.
    pub fn insert(&mut self, key: &str, value: V) {
        self.map.insert(key.to_owned(), value);
    }

    /// The entry of `key`.
    pub fn get<Q>(&self, key: &Q) -> Option<&V>
    where
        String: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        self.map.get(key)
    }

    /// The entry of `key`, to change.
    pub fn get_mut<Q>(&mut self, key: &Q) -> Option<&mut V>
    where
        String: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        self.map.get_mut(key)
    }

    /// Removes the entry of `key`.
    pub fn remove<Q>(&mut self, key: &Q) -> Option<V>
    where
        String: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        let removed = self.map.remove(key);
        if removed.is_some() {
            self.shrink();
        }
        removed
    }

    /// How many entries there are.
    #[must_use]
    pub fn len(&self) -> usize {
        self.map.len()
    }

    /// Whether there is none.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }

    /// The map's capacity (for tests of its shrinking).
    #[must_use]
    pub fn capacity(&self) -> usize {
        self.map.capacity()
    }

    fn shrink(&mut self) {
        shrink_when_sparse(&mut self.map);
    }
}

/// Gives a map's memory back once it is less than a quarter full (a burst grew it, and
/// removing entries never shrinks a `HashMap`), keeping room for twice what is left.
pub(crate) fn shrink_when_sparse<K: Eq + Hash, V, S: std::hash::BuildHasher>(
    map: &mut HashMap<K, V, S>,
) {
    let capacity = map.capacity();
    if capacity >= MIN_SHRINK_CAPACITY && map.len() * 4 < capacity {
        map.shrink_to(map.len() * 2);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prunes_only_once_an_entry_can_be_stale() {
        let t0 = Instant::now();
        let at = |s: u64| t0 + Duration::from_secs(s);
        let mut m: Expiring<Instant> = Expiring::new(Duration::from_secs(10));
        let last = |v: &Instant| Some(*v);
        m.insert("a", t0);
        m.touched(t0);
        m.insert("b", at(5));
        m.touched(at(5));
        // Nothing can be stale before t0 + 10 s.
        m.prune(at(9), "", last);
        assert_eq!(m.len(), 2);
        m.prune(at(11), "", last);
        assert_eq!(m.len(), 1, "a was not pruned");
        // b can be stale from t0 + 15 s; the entry being used is never pruned.
        m.prune(at(16), "b", last);
        assert_eq!(m.len(), 1);
        m.prune(at(16), "", last);
        assert!(m.is_empty());
        // Entries without an instant never go stale.
        let mut n: Expiring<Option<Instant>> = Expiring::new(Duration::from_secs(1));
        n.insert("x", None);
        n.insert("y", Some(t0));
        n.touched(t0);
        n.prune(at(100), "", |v| *v);
        assert_eq!(n.get("x"), Some(&None));
        assert_eq!(n.len(), 1);
    }

    #[test]
    fn a_burst_gives_its_memory_back() {
        let mut m: Expiring<u32> = Expiring::new(Duration::from_secs(10));
        for i in 0..10_000 {
            m.insert(&format!("ns/o-{i}"), i);
        }
        let burst = m.capacity();
        assert!(burst >= 10_000);
        for i in 0..9_990 {
            m.remove(&format!("ns/o-{i}"));
        }
        assert_eq!(m.len(), 10);
        assert!(
            m.capacity() < MIN_SHRINK_CAPACITY,
            "{} after the burst",
            m.capacity()
        );
        assert_eq!(m.get("ns/o-9995"), Some(&9995));
        *m.entry_or_default("ns/new") += 1;
        assert_eq!(m.get_mut("ns/new").map(|v| *v), Some(1));
    }
}
