//! [`ScopedStores`]: the caches of one child kind, one per [`Scope`], optionally indexed
//! by a key of each object.

use std::{fmt, sync::Arc};

use kube::{
    Resource,
    runtime::{
        reflector::{ObjectRef, Store},
        watcher,
    },
};

use super::{Scope, ScopedIndex};

/// Stores of one child kind, one per [`Scope`], so a reconcile finds the cache that holds
/// its object's namespace; optionally indexed by a key of each object (a label, an owner's
/// UID), so a reconcile finds its own objects without scanning the namespace's whole cache.
pub struct ScopedStores<K: Resource<DynamicType = ()> + 'static> {
    stores: std::sync::RwLock<Vec<(Option<String>, Store<K>)>>,
    index: Option<KeyIndex<K>>,
}

/// The index of [`ScopedStores::indexed`]: each object's name under its key.
struct KeyIndex<K> {
    key: fn(&K) -> Option<String>,
    names: ScopedIndex<K, ()>,
}

impl<K: Resource<DynamicType = ()> + 'static> fmt::Debug for ScopedStores<K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ScopedStores")
            .field("kind", &K::kind(&()))
            .field("indexed", &self.index.is_some())
            .finish_non_exhaustive()
    }
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
                names: ScopedIndex::new(move |obj: &K| key(obj).map(|k| (k, ()))),
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
        index.names.apply(scope, event);
    }

    /// The cached objects in `namespace` whose key is `key` (none when not indexed).
    #[must_use]
    pub fn by_key(&self, namespace: &str, key: &str) -> Vec<Arc<K>> {
        let Some(index) = &self.index else {
            return Vec::new();
        };
        index
            .names
            .get(namespace, key)
            .iter()
            .filter_map(|(name, ())| self.find(namespace, name))
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
