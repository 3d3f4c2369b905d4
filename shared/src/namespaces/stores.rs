//! [`ScopedStores`]: the caches of one child kind, one per [`Scope`], optionally indexed
//! by a key of each object.

use std::{collections::HashMap, fmt, sync::Arc};

use kube::{
    Resource,
    runtime::{
        reflector::{ObjectRef, Store},
        watcher,
    },
};

use super::Scope;

/// Stores of one child kind, one per [`Scope`], so a reconcile finds the cache that holds
/// its object's namespace; optionally indexed by a key of each object (a label, an owner's
/// UID), so a reconcile finds its own objects without scanning the namespace's whole cache.
pub struct ScopedStores<K: Resource<DynamicType = ()> + 'static> {
    stores: std::sync::RwLock<Vec<(Option<String>, Store<K>)>>,
    index: Option<KeyIndex<K>>,
}

impl<K: Resource<DynamicType = ()> + 'static> fmt::Debug for ScopedStores<K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ScopedStores")
            .field("kind", &K::kind(&()))
            .field("indexed", &self.index.is_some())
            .finish_non_exhaustive()
    }
}

/// The index of [`ScopedStores::indexed`]: per scope, object names by (namespace, key),
/// kept in step with the scope's store by the same watch events, applied the way the
/// reflector applies them (a relist's objects are gathered apart and replace the index
/// when the relist is complete, as they replace the store).
struct KeyIndex<K> {
    key: fn(&K) -> Option<String>,
    scopes: std::sync::RwLock<HashMap<Option<String>, ScopeIndex>>,
}

/// Names by (namespace, key), and each object's key by (namespace, name), per namespace so
/// the namespace is held once, with boxed strings and a list per key: at 10,000 pods the
/// earlier layout (a set per key and tuples of owned strings in two flat maps) took about
/// 600 bytes per pod, this one about 210 (heaptrack, 2,000 PodSets).
#[derive(Default)]
struct Names {
    namespaces: HashMap<Box<str>, NamespaceNames>,
}

/// [`Names`] of one namespace.
#[derive(Default)]
struct NamespaceNames {
    /// Names by key; a key has a handful of objects (the pods of one owner), so a list.
    by_key: HashMap<Box<str>, Vec<Box<str>>>,
    /// The key of each object, to find its entry again when it changes or goes.
    key_of: HashMap<Box<str>, Box<str>>,
}

impl Names {
    fn insert(&mut self, namespace: &str, name: &str, key: Option<String>) {
        self.remove(namespace, name);
        let Some(key) = key else { return };
        let names = match self.namespaces.get_mut(namespace) {
            Some(names) => names,
            None => self.namespaces.entry(namespace.into()).or_default(),
        };
        let key: Box<str> = key.into();
        names
            .by_key
            .entry(key.clone())
            .or_default()
            .push(name.into());
        names.key_of.insert(name.into(), key);
    }

    fn remove(&mut self, namespace: &str, name: &str) {
        let Some(names) = self.namespaces.get_mut(namespace) else {
            return;
        };
        if let Some(key) = names.key_of.remove(name)
            && let Some(list) = names.by_key.get_mut(&key)
        {
            list.retain(|n| &**n != name);
            if list.is_empty() {
                names.by_key.remove(&key);
            }
        }
        if names.key_of.is_empty() {
            self.namespaces.remove(namespace);
        }
    }

    /// The names under `key` in `namespace`, sorted.
    fn get(&self, namespace: &str, key: &str) -> Vec<String> {
        let mut found: Vec<String> = self
            .namespaces
            .get(namespace)
            .and_then(|names| names.by_key.get(key))
            .map(|list| list.iter().map(|n| n.to_string()).collect())
            .unwrap_or_default();
        found.sort_unstable();
        found
    }
}

#[derive(Default)]
struct ScopeIndex {
    live: Names,
    /// A relist in progress.
    relist: Option<Names>,
}

impl<K: Resource<DynamicType = ()> + Clone + 'static> Default for ScopedStores<K> {
    fn default() -> Self {
        Self {
            stores: std::sync::RwLock::new(Vec::new()),
            index: None,
        }
    }
}

impl<K: Resource<DynamicType = ()> + Clone + 'static> ScopedStores<K> {
    /// Stores indexed by `key` (see [`ScopedStores::by_key`]). Fill them with
    /// [`Scope::reflect_into`], which keeps the index in step with each store.
    #[must_use]
    pub fn indexed(key: fn(&K) -> Option<String>) -> Self {
        Self {
            stores: std::sync::RwLock::new(Vec::new()),
            index: Some(KeyIndex {
                key,
                scopes: std::sync::RwLock::new(HashMap::new()),
            }),
        }
    }

    /// Registers the store of `scope`.
    pub fn insert(&self, scope: &Scope, store: Store<K>) {
        if let Ok(mut stores) = self.stores.write() {
            stores.push((scope.namespace().map(str::to_owned), store));
        }
    }

    /// Applies a watch event of `scope`'s store to the index, after the reflector applied
    /// it to the store.
    pub(super) fn apply(&self, scope: &Option<String>, event: &watcher::Event<K>) {
        let Some(index) = &self.index else {
            return;
        };
        let Ok(mut scopes) = index.scopes.write() else {
            return;
        };
        let s = scopes.entry(scope.clone()).or_default();
        let id = |obj: &K| Some((obj.meta().namespace.clone()?, obj.meta().name.clone()?));
        match event {
            watcher::Event::Apply(obj) => {
                if let Some((ns, name)) = id(obj) {
                    s.live.insert(&ns, &name, (index.key)(obj));
                }
            }
            watcher::Event::Delete(obj) => {
                if let Some((ns, name)) = id(obj) {
                    s.live.remove(&ns, &name);
                }
            }
            watcher::Event::Init => s.relist = Some(Names::default()),
            watcher::Event::InitApply(obj) => {
                if let (Some((ns, name)), Some(relist)) = (id(obj), s.relist.as_mut()) {
                    relist.insert(&ns, &name, (index.key)(obj));
                }
            }
            watcher::Event::InitDone => {
                if let Some(relist) = s.relist.take() {
                    s.live = relist;
                }
            }
        }
    }

    /// The cached objects in `namespace` whose key is `key` (none when not indexed).
    #[must_use]
    pub fn by_key(&self, namespace: &str, key: &str) -> Vec<Arc<K>> {
        let Some(index) = &self.index else {
            return Vec::new();
        };
        let scope = self.stores.read().ok().and_then(|stores| {
            stores
                .iter()
                .find(|(ns, _)| ns.as_deref().is_none_or(|ns| ns == namespace))
                .map(|(ns, _)| ns.clone())
        });
        let Some(scope) = scope else {
            return Vec::new();
        };
        let names: Vec<String> = index
            .scopes
            .read()
            .ok()
            .and_then(|scopes| scopes.get(&scope).map(|s| s.live.get(namespace, key)))
            .unwrap_or_default();
        names
            .iter()
            .filter_map(|name| self.find(namespace, name))
            .filter(|obj| (index.key)(obj).as_deref() == Some(key))
            .collect()
    }

    /// The object `name` in `namespace`, from the store of the scope holding it.
    #[must_use]
    pub fn find(&self, namespace: &str, name: &str) -> Option<Arc<K>> {
        let stores = self.stores.read().ok()?;
        let (_, store) = stores
            .iter()
            .find(|(ns, _)| ns.as_deref().is_none_or(|ns| ns == namespace))?;
        store.get(&ObjectRef::new(name).within(namespace))
    }

    /// Every cached object, of every scope.
    #[must_use]
    pub fn all(&self) -> Vec<Arc<K>> {
        let Ok(stores) = self.stores.read() else {
            return Vec::new();
        };
        stores.iter().flat_map(|(_, store)| store.state()).collect()
    }

    /// Objects in `namespace` that satisfy `predicate`, from the store of the scope holding it
    /// (a scan of the store: prefer [`ScopedStores::by_key`] on a hot path).
    #[must_use]
    pub fn in_namespace(&self, namespace: &str, predicate: impl Fn(&K) -> bool) -> Vec<Arc<K>> {
        let Ok(stores) = self.stores.read() else {
            return Vec::new();
        };
        stores
            .iter()
            .find(|(ns, _)| ns.as_deref().is_none_or(|ns| ns == namespace))
            .map(|(_, store)| {
                store.state_filter(|obj| {
                    obj.meta().namespace.as_deref() == Some(namespace) && predicate(obj)
                })
            })
            .unwrap_or_default()
    }
}

impl<K> ScopedStores<crate::slim::Slim<K>>
where
    K: Resource<DynamicType = ()> + serde::de::DeserializeOwned + serde::Serialize + 'static,
{
    /// The cached child `name` in `namespace`, parsed back whole ([`crate::slim::Slim::full`]).
    ///
    /// # Errors
    /// When the cached text does not parse as a `K`.
    pub fn find_full(&self, namespace: &str, name: &str) -> Result<Option<Arc<K>>, crate::Error> {
        self.find(namespace, name)
            .map(|slim| slim.full())
            .transpose()
            .map(|full| full.map(Arc::new))
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use k8s_openapi::api::core::v1::Pod;
    use kube::{Client, ResourceExt, runtime::reflector};

    #[tokio::test]
    async fn find_looks_in_the_store_of_the_namespace() {
        let pod = |ns: &str, name: &str| {
            let mut p = Pod::default();
            p.metadata.namespace = Some(ns.into());
            p.metadata.name = Some(name.into());
            p
        };
        // A client that never connects (a scope makes no request until it watches).
        let client = || {
            let service = tower::service_fn(|_: axum::http::Request<kube::client::Body>| async {
                Err::<axum::http::Response<kube::client::Body>, _>(std::io::Error::other("offline"))
            });
            Client::new(service, "default")
        };
        let stores = ScopedStores::<Pod>::default();
        for (ns, pods) in [("a", vec![pod("a", "x")]), ("b", vec![pod("b", "y")])] {
            let (store, mut writer) = reflector::store::<Pod>();
            for p in pods {
                writer.apply_watcher_event(&watcher::Event::Apply(p));
            }
            stores.insert(&Scope::new(client(), Some(ns.into())), store);
        }
        assert_eq!(stores.find("a", "x").unwrap().name_any(), "x");
        assert!(stores.find("a", "y").is_none());
        assert!(stores.find("b", "x").is_none());
        assert_eq!(
            stores.find("b", "y").unwrap().namespace().as_deref(),
            Some("b")
        );
        assert!(stores.find("c", "x").is_none());
    }

    #[tokio::test]
    async fn the_index_finds_objects_by_key_as_the_watch_changes_them() {
        let pod = |name: &str, app: &str| {
            let mut p = Pod::default();
            p.metadata.namespace = Some("a".into());
            p.metadata.name = Some(name.into());
            p.metadata.labels = Some([("app".to_owned(), app.to_owned())].into());
            p
        };
        let client = || {
            let service = tower::service_fn(|_: axum::http::Request<kube::client::Body>| async {
                Err::<axum::http::Response<kube::client::Body>, _>(std::io::Error::other("offline"))
            });
            Client::new(service, "default")
        };
        let stores = ScopedStores::<Pod>::indexed(|p: &Pod| p.labels().get("app").cloned());
        let (store, mut writer) = reflector::store::<Pod>();
        stores.insert(&Scope::new(client(), None), store);
        let mut deliver = |event: watcher::Event<Pod>| {
            writer.apply_watcher_event(&event);
            stores.apply(&None, &event);
        };
        let names = |key: &str| {
            let mut n: Vec<String> = stores
                .by_key("a", key)
                .iter()
                .map(|p| p.name_any())
                .collect();
            n.sort();
            n
        };
        // The first list: nothing is found until it is complete, then all of it.
        deliver(watcher::Event::Init);
        deliver(watcher::Event::InitApply(pod("x1", "x")));
        deliver(watcher::Event::InitApply(pod("x2", "x")));
        assert!(names("x").is_empty());
        deliver(watcher::Event::InitApply(pod("y1", "y")));
        deliver(watcher::Event::InitDone);
        assert_eq!(names("x"), ["x1", "x2"]);
        assert_eq!(names("y"), ["y1"]);
        assert!(stores.by_key("b", "x").is_empty());
        // Deleted: gone from the index.
        deliver(watcher::Event::Delete(pod("x1", "x")));
        assert_eq!(names("x"), ["x2"]);
        // Relabelled: found under its new key only.
        deliver(watcher::Event::Apply(pod("x2", "y")));
        assert!(names("x").is_empty());
        assert_eq!(names("y"), ["x2", "y1"]);
        deliver(watcher::Event::Apply(pod("x3", "x")));
        // A relist (the watch fell behind): what the store shows stays found until the
        // relist is complete, then the relist's objects replace it (y1 and x3 are gone).
        deliver(watcher::Event::Init);
        deliver(watcher::Event::InitApply(pod("x2", "y")));
        deliver(watcher::Event::InitApply(pod("x4", "x")));
        assert_eq!(names("x"), ["x3"]);
        assert_eq!(names("y"), ["x2", "y1"]);
        deliver(watcher::Event::InitDone);
        assert_eq!(names("x"), ["x4"]);
        assert_eq!(names("y"), ["x2"]);
        // Not indexed: nothing by key.
        assert!(ScopedStores::<Pod>::default().by_key("a", "y").is_empty());
    }
}
