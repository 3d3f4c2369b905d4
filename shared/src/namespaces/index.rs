//! [`ScopedIndex`]: what an operator keeps of each object of a watched kind, by name,
//! grouped under a key of the object (a label, an owner's UID), one index per [`Scope`].
//!
//! [`Scope`]: super::Scope

use std::{collections::HashMap, fmt, sync::RwLock};

use kube::{Resource, runtime::watcher};

/// What becomes of one object in a [`ScopedIndex`]: its key and the value kept for it,
/// or `None` to keep nothing of it.
type Entry<K, V> = dyn Fn(&K) -> Option<(String, V)> + Send + Sync;

/// For each watched scope, a value `V` per object of kind `K`, found by namespace and
/// key ([`ScopedIndex::get`]) and kept in step with the scope's watch event by event
/// ([`super::Scope::reflect_index`]); a relist's objects are gathered apart and replace
/// the scope's entries when the relist is complete, as a reflector's store does.
///
/// Where a reconcile reads a few facts of many objects (the pods of its Deployment:
/// names, readiness), the index holds only those facts, a name and a small value, instead
/// of a cached object: about 150 bytes a pod instead of a kilobyte.
pub struct ScopedIndex<K, V> {
    entry: Box<Entry<K, V>>,
    scopes: RwLock<HashMap<Option<String>, ScopeEntries<V>>>,
}

impl<K: Resource<DynamicType = ()>, V> fmt::Debug for ScopedIndex<K, V> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ScopedIndex")
            .field("kind", &K::kind(&()))
            .finish_non_exhaustive()
    }
}

/// The entries of one scope: the live ones, and a relist's while it runs.
struct ScopeEntries<V> {
    live: Entries<V>,
    relist: Option<Entries<V>>,
}

impl<V> Default for ScopeEntries<V> {
    fn default() -> Self {
        Self {
            live: Entries::default(),
            relist: None,
        }
    }
}

/// Entries by namespace, so the namespace is held once, with boxed strings and a list per
/// key: a key has a handful of objects (the pods of one owner).
struct Entries<V> {
    namespaces: HashMap<Box<str>, NamespaceEntries<V>>,
}

impl<V> Default for Entries<V> {
    fn default() -> Self {
        Self {
            namespaces: HashMap::new(),
        }
    }
}

/// Up to this many objects under one key, its list grows one entry at a time; beyond, as
/// a `Vec` does (doubling).
const MIN_GROWTH: usize = 4;

/// [`Entries`] of one namespace.
struct NamespaceEntries<V> {
    /// Names and values by key.
    by_key: HashMap<Box<str>, Vec<(Box<str>, V)>>,
    /// The key of each object, to find its entry again when it changes or goes.
    key_of: HashMap<Box<str>, Box<str>>,
}

impl<V> Default for NamespaceEntries<V> {
    fn default() -> Self {
        Self {
            by_key: HashMap::new(),
            key_of: HashMap::new(),
        }
    }
}

impl<V> Entries<V> {
    /// Keeps `entry` for the object `name` in `namespace`, in place of what was kept
    /// (nothing for `None`).
    fn insert(&mut self, namespace: &str, name: &str, entry: Option<(String, V)>) {
        self.remove(namespace, name);
        let Some((key, value)) = entry else { return };
        let entries = match self.namespaces.get_mut(namespace) {
            Some(entries) => entries,
            None => self.namespaces.entry(namespace.into()).or_default(),
        };
        let key: Box<str> = key.into();
        let list = entries.by_key.entry(key.clone()).or_default();
        if list.len() == list.capacity() && list.len() < MIN_GROWTH {
            // A key holds one to a few objects (a PodSet x 1 one pod): room for exactly
            // what it holds, not the four entries a `Vec`'s first push makes room for.
            list.reserve_exact(1);
        }
        list.push((name.into(), value));
        entries.key_of.insert(name.into(), key);
    }

    fn remove(&mut self, namespace: &str, name: &str) {
        let Some(entries) = self.namespaces.get_mut(namespace) else {
            return;
        };
        if let Some(key) = entries.key_of.remove(name)
            && let Some(list) = entries.by_key.get_mut(&key)
        {
            list.retain(|(n, _)| &**n != name);
            if list.is_empty() {
                entries.by_key.remove(&key);
            }
        }
        if entries.key_of.is_empty() {
            self.namespaces.remove(namespace);
        }
    }

    /// Whether an entry is kept for the object `name` in `namespace`.
    fn contains(&self, namespace: &str, name: &str) -> bool {
        self.namespaces
            .get(namespace)
            .is_some_and(|entries| entries.key_of.contains_key(name))
    }

    /// The names and values under `key` in `namespace`, by name.
    fn get(&self, namespace: &str, key: &str) -> Vec<(String, V)>
    where
        V: Clone,
    {
        let mut found: Vec<(String, V)> = self
            .namespaces
            .get(namespace)
            .and_then(|entries| entries.by_key.get(key))
            .map(|list| {
                list.iter()
                    .map(|(n, v)| (n.to_string(), v.clone()))
                    .collect()
            })
            .unwrap_or_default();
        found.sort_unstable_by(|a, b| a.0.cmp(&b.0));
        found
    }
}

impl<K: Resource<DynamicType = ()>, V: Clone> ScopedIndex<K, V> {
    /// An empty index keeping `entry(object)` of each object: its key and value, or
    /// nothing for `None`.
    pub fn new(entry: impl Fn(&K) -> Option<(String, V)> + Send + Sync + 'static) -> Self {
        Self {
            entry: Box::new(entry),
            scopes: RwLock::new(HashMap::new()),
        }
    }

    /// Applies a watch event of `scope` (its namespace, `None` for all).
    pub(super) fn apply(&self, scope: &Option<String>, event: &watcher::Event<K>) {
        let Ok(mut scopes) = self.scopes.write() else {
            return;
        };
        let s = scopes.entry(scope.clone()).or_default();
        let id = |obj: &K| Some((obj.meta().namespace.clone()?, obj.meta().name.clone()?));
        match event {
            watcher::Event::Apply(obj) => {
                if let Some((ns, name)) = id(obj) {
                    s.live.insert(&ns, &name, (self.entry)(obj));
                }
            }
            watcher::Event::Delete(obj) => {
                if let Some((ns, name)) = id(obj) {
                    s.live.remove(&ns, &name);
                }
            }
            watcher::Event::Init => s.relist = Some(Entries::default()),
            watcher::Event::InitApply(obj) => {
                if let (Some((ns, name)), Some(relist)) = (id(obj), s.relist.as_mut()) {
                    relist.insert(&ns, &name, (self.entry)(obj));
                }
            }
            watcher::Event::InitDone => {
                if let Some(relist) = s.relist.take() {
                    s.live = relist;
                }
            }
        }
    }

    /// The names and values of the objects in `namespace` whose key is `key`, by name,
    /// from the scope watching that namespace.
    #[must_use]
    pub fn get(&self, namespace: &str, key: &str) -> Vec<(String, V)> {
        self.in_scope_of(namespace, |live| live.get(namespace, key))
            .unwrap_or_default()
    }

    /// Whether the object `name` in `namespace` has an entry (its watch has shown it, and
    /// `entry` kept something of it), in the scope watching that namespace.
    #[must_use]
    pub fn contains(&self, namespace: &str, name: &str) -> bool {
        self.in_scope_of(namespace, |live| live.contains(namespace, name))
            .unwrap_or_default()
    }

    /// `read` of the live entries of the scope watching `namespace` (its own, or the one
    /// of all namespaces); `None` when no scope does.
    fn in_scope_of<T>(&self, namespace: &str, read: impl FnOnce(&Entries<V>) -> T) -> Option<T> {
        let scopes = self.scopes.read().ok()?;
        scopes
            .get(&Some(namespace.to_owned()))
            .or_else(|| scopes.get(&None))
            .map(|s| read(&s.live))
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use k8s_openapi::api::core::v1::Pod;
    use kube::ResourceExt;

    fn pod(ns: &str, name: &str, app: &str, ready: bool) -> Pod {
        let mut p = Pod::default();
        p.metadata.namespace = Some(ns.into());
        p.metadata.name = Some(name.into());
        p.metadata.labels = Some([("app".to_owned(), app.to_owned())].into());
        p.metadata.annotations = Some([("ready".to_owned(), ready.to_string())].into());
        p
    }

    #[test]
    fn entries_follow_the_watch_by_key_and_scope() {
        // The value kept: the `ready` annotation; pods labelled `app=skip` are not kept.
        let index = ScopedIndex::<Pod, bool>::new(|p: &Pod| {
            let app = p.labels().get("app").filter(|a| *a != "skip")?;
            Some((app.clone(), p.annotations().get("ready")? == "true"))
        });
        let all = None;
        let deliver = |event: watcher::Event<Pod>| index.apply(&all, &event);
        let got = |ns: &str, key: &str| index.get(ns, key);
        let kept = |pairs: &[(&str, bool)]| -> Vec<(String, bool)> {
            pairs.iter().map(|(n, v)| ((*n).to_owned(), *v)).collect()
        };
        // The first list: nothing is found until it is complete, then all of it.
        deliver(watcher::Event::Init);
        deliver(watcher::Event::InitApply(pod("a", "x2", "x", false)));
        deliver(watcher::Event::InitApply(pod("a", "x1", "x", true)));
        assert!(got("a", "x").is_empty());
        deliver(watcher::Event::InitApply(pod("b", "x9", "x", true)));
        deliver(watcher::Event::InitApply(pod("a", "s1", "skip", true)));
        deliver(watcher::Event::InitDone);
        assert_eq!(got("a", "x"), kept(&[("x1", true), ("x2", false)]));
        assert_eq!(got("b", "x"), kept(&[("x9", true)]));
        assert!(got("a", "skip").is_empty());
        // Changed: the new value replaces the old.
        deliver(watcher::Event::Apply(pod("a", "x2", "x", true)));
        assert_eq!(got("a", "x"), kept(&[("x1", true), ("x2", true)]));
        // Relabelled: found under its new key only; then to a key not kept: gone.
        deliver(watcher::Event::Apply(pod("a", "x1", "y", true)));
        assert_eq!(got("a", "x"), kept(&[("x2", true)]));
        assert_eq!(got("a", "y"), kept(&[("x1", true)]));
        deliver(watcher::Event::Apply(pod("a", "x1", "skip", true)));
        assert!(got("a", "y").is_empty());
        // Deleted: gone.
        assert!(index.contains("a", "x2") && !index.contains("b", "x2"));
        deliver(watcher::Event::Delete(pod("a", "x2", "x", true)));
        assert!(got("a", "x").is_empty());
        assert!(!index.contains("a", "x2"), "gone once deleted");
        assert!(!index.contains("a", "x1"), "nothing kept of it: not found");
        deliver(watcher::Event::Apply(pod("a", "x3", "x", false)));
        // A relist (the watch fell behind): the old entries stay found until the relist
        // is complete, then the relist's replace them (x3 and b's x9 are gone).
        deliver(watcher::Event::Init);
        deliver(watcher::Event::InitApply(pod("a", "x4", "x", true)));
        assert_eq!(got("a", "x"), kept(&[("x3", false)]));
        deliver(watcher::Event::InitDone);
        assert_eq!(got("a", "x"), kept(&[("x4", true)]));
        assert!(got("b", "x").is_empty());
    }

    #[test]
    fn a_key_of_few_objects_has_room_for_them_only() {
        let index =
            ScopedIndex::<Pod, u64>::new(|p: &Pod| Some((p.labels().get("app")?.clone(), 7)));
        let all = None;
        for (i, name) in ["x1", "x2", "x3", "x4", "x5"].into_iter().enumerate() {
            index.apply(&all, &watcher::Event::Apply(pod("a", name, "x", true)));
            let scopes = index.scopes.read().unwrap();
            let list = &scopes[&all].live.namespaces["a"].by_key["x"];
            assert_eq!(list.len(), i + 1);
            if list.len() <= MIN_GROWTH {
                assert_eq!(list.capacity(), list.len(), "exactly the room it needs");
            }
        }
        assert_eq!(index.get("a", "x").len(), 5);
    }

    #[test]
    fn each_namespace_is_read_from_its_own_scope() {
        let index =
            ScopedIndex::<Pod, ()>::new(|p: &Pod| Some((p.labels().get("app")?.clone(), ())));
        for ns in ["a", "b"] {
            let scope = Some(ns.to_owned());
            index.apply(&scope, &watcher::Event::Init);
            index.apply(&scope, &watcher::Event::InitApply(pod(ns, ns, "x", true)));
            index.apply(&scope, &watcher::Event::InitDone);
        }
        // A relist of b's scope leaves a's entries alone.
        let b = Some("b".to_owned());
        index.apply(&b, &watcher::Event::Init);
        index.apply(&b, &watcher::Event::InitDone);
        assert_eq!(index.get("a", "x"), [("a".to_owned(), ())]);
        assert!(index.get("b", "x").is_empty());
        assert!(index.get("c", "x").is_empty());
    }
}
