//! [`ScopedStores`]: the caches of one child kind, one per [`Scope`].

use std::{fmt, sync::Arc};

use kube::{
    Resource,
    runtime::reflector::{ObjectRef, Store},
};

use super::Scope;

/// Stores of one child kind, one per [`Scope`], so a reconcile finds the cache that holds
/// its object's namespace. (Where a reconcile reads a few facts of many objects of its
/// own, such as its pods, a [`super::ScopedIndex`] keeps those facts instead.)
pub struct ScopedStores<K: Resource<DynamicType = ()> + 'static> {
    stores: std::sync::RwLock<Vec<(Option<String>, Store<K>)>>,
}

impl<K: Resource<DynamicType = ()> + 'static> fmt::Debug for ScopedStores<K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ScopedStores")
            .field("kind", &K::kind(&()))
            .finish_non_exhaustive()
    }
}

impl<K: Resource<DynamicType = ()> + Clone + 'static> Default for ScopedStores<K> {
    fn default() -> Self {
        Self {
            stores: std::sync::RwLock::new(Vec::new()),
        }
    }
}

impl<K: Resource<DynamicType = ()> + Clone + 'static> ScopedStores<K> {
    /// Registers the store of `scope`.
    pub fn insert(&self, scope: &Scope, store: Store<K>) {
        if let Ok(mut stores) = self.stores.write() {
            stores.push((scope.namespace().map(str::to_owned), store));
        }
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
    use kube::{
        Client, ResourceExt,
        runtime::{reflector, watcher},
    };

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
}
