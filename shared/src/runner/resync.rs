//! Reconciling every object of a scope after a full list, a bounded number at a time.
//!
//! A controller that starts (or whose watch is re-listed) with N objects in place must
//! reconcile each once. Left to kube's `Controller`, the list queues N triggers at once
//! (its runner waits for the whole primary list before it reconciles anything), plus one
//! per child; its scheduler's tables grow to N entries and keep that room for the life of
//! the process (6 MiB at 10,000 PodSets). [`Scope`](crate::namespaces::Scope) does not
//! pass a list's objects on as triggers; [`resyncs`] feeds the scope's objects instead,
//! once every watch of the scope has synced, and never more than [`Admission`]'s limit
//! queued at a time: a trigger is released when its reconcile starts (or the object
//! turns out gone).

use std::{
    collections::HashMap,
    sync::{Mutex, PoisonError},
    time::Duration,
};

use futures::Stream;
use kube::{
    Resource,
    runtime::reflector::{ObjectRef, Store},
};
use tokio::{sync::Notify, time::Instant};

use crate::namespaces::ScopeStatus;

/// How many resync triggers may wait in kube's scheduler at a time.
pub(crate) const RESYNC_QUEUED: usize = 64;

/// A queued trigger still unclaimed after this long is assumed lost (its object gone
/// some way the controller did not report) and its room given back.
const LOST_AFTER: Duration = Duration::from_secs(30);

/// The resync triggers queued and not yet started, by `namespace/name`.
#[derive(Debug)]
pub(crate) struct Admission {
    limit: usize,
    queued: Mutex<HashMap<String, Instant>>,
    freed: Notify,
}

impl Admission {
    /// Room for `limit` queued triggers (at least one).
    pub(crate) fn new(limit: usize) -> Self {
        Self {
            limit: limit.max(1),
            queued: Mutex::new(HashMap::new()),
            freed: Notify::new(),
        }
    }

    /// Claims the queued resync trigger of `key`, if there is one: its reconcile starts.
    /// `true` means this reconcile is a resync (nothing to debounce).
    pub(crate) fn claim(&self, key: &str) -> bool {
        let claimed = self.lock().remove(key).is_some();
        if claimed {
            self.freed.notify_waiters();
        }
        claimed
    }

    /// Whether a resync trigger of `key` is queued (not claimed yet).
    pub(crate) fn is_queued(&self, key: &str) -> bool {
        self.lock().contains_key(key)
    }

    /// How many resync triggers are queued.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.lock().len()
    }

    /// Waits for room, then records `key` as queued.
    async fn admit(&self, key: String) {
        loop {
            let freed = self.freed.notified();
            {
                let mut queued = self.lock();
                let now = Instant::now();
                queued.retain(|_, since| now.saturating_duration_since(*since) < LOST_AFTER);
                if queued.len() < self.limit || queued.contains_key(&key) {
                    queued.insert(key, now);
                    return;
                }
            }
            // Woken by a claim, or after a while to drop lost entries.
            let _ = tokio::time::timeout(LOST_AFTER, freed).await;
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Instant>> {
        self.queued.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// Every object of `store`, each time the scope finishes a full list (`lists` changes),
/// once all of the scope's watches have synced (`status`); queued through `admission`.
/// Lists that finish while a pass is waiting or running fold into the next pass.
pub(crate) fn resyncs<K>(
    store: Store<K>,
    status: tokio::sync::watch::Receiver<ScopeStatus>,
    lists: tokio::sync::watch::Receiver<u64>,
    admission: std::sync::Arc<Admission>,
) -> impl Stream<Item = ObjectRef<K>> + Send + 'static
where
    K: Resource<DynamicType = ()> + Clone + Send + Sync + 'static,
{
    struct Pass<K: Resource> {
        status: tokio::sync::watch::Receiver<ScopeStatus>,
        lists: tokio::sync::watch::Receiver<u64>,
        todo: Vec<ObjectRef<K>>,
    }
    let pass = Pass {
        status,
        lists,
        todo: Vec::new(),
    };
    futures::stream::unfold(pass, move |mut pass| {
        let (store, admission) = (store.clone(), admission.clone());
        async move {
            while pass.todo.is_empty() {
                // Ends (with the stream) when the scope is dropped: shutting down.
                pass.lists.changed().await.ok()?;
                pass.status.wait_for(ScopeStatus::synced).await.ok()?;
                // Lists finished by now are covered by this pass.
                pass.lists.borrow_and_update();
                pass.todo = store
                    .state()
                    .iter()
                    .map(|o| ObjectRef::from_obj(o.as_ref()))
                    .collect();
                // Popped from the end: the store's order, reversed; any order will do.
                tracing::debug!(
                    objects = pass.todo.len(),
                    "reconciling every object after a full list"
                );
            }
            let next = pass.todo.pop()?;
            admission.admit(super::guard::ref_key(&next)).await;
            Some((next, pass))
        }
    })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use std::sync::Arc;

    use futures::StreamExt;
    use k8s_openapi::api::core::v1::ConfigMap;
    use kube::runtime::{reflector, watcher};

    use super::*;
    use crate::namespaces::WatchStatus;

    fn config_map(name: &str) -> ConfigMap {
        let mut cm = ConfigMap::default();
        cm.metadata.name = Some(name.into());
        cm.metadata.namespace = Some("ns".into());
        cm
    }

    fn status(synced: bool) -> ScopeStatus {
        ScopeStatus {
            namespace: Some("ns".into()),
            watches: vec![WatchStatus {
                kind: "ConfigMap".into(),
                synced,
                error: None,
            }],
        }
    }

    #[tokio::test(start_paused = true)]
    async fn every_object_once_per_list_never_more_than_the_limit_queued() {
        let (store, mut writer) = reflector::store::<ConfigMap>();
        writer.apply_watcher_event(&watcher::Event::Init);
        for i in 0..10 {
            writer.apply_watcher_event(&watcher::Event::InitApply(config_map(&format!("o{i}"))));
        }
        writer.apply_watcher_event(&watcher::Event::InitDone);
        let (status_tx, status_rx) = tokio::sync::watch::channel(status(false));
        let (lists_tx, lists_rx) = tokio::sync::watch::channel(0u64);
        let admission = Arc::new(Admission::new(3));
        let mut stream = Box::pin(resyncs(store, status_rx, lists_rx, admission.clone()));

        // Nothing before a list has finished, nor before every watch has synced.
        lists_tx.send_modify(|n| *n += 1);
        assert!(
            tokio::time::timeout(Duration::from_secs(60), stream.next())
                .await
                .is_err()
        );
        status_tx.send_replace(status(true));
        // A second list finishing meanwhile folds into the same pass.
        lists_tx.send_modify(|n| *n += 1);

        let mut seen = Vec::new();
        for _ in 0..3 {
            seen.push(stream.next().await.unwrap().name);
        }
        assert_eq!(admission.len(), 3);
        // Full: the fourth waits until a reconcile claims one.
        assert!(
            tokio::time::timeout(Duration::from_secs(5), stream.next())
                .await
                .is_err()
        );
        assert!(admission.claim(&format!("ns/{}", seen[0])));
        assert!(!admission.claim(&format!("ns/{}", seen[0])), "claimed once");
        seen.push(stream.next().await.unwrap().name);
        // Triggers never claimed (their objects gone unreported) give their room back.
        for _ in 4..10 {
            seen.push(stream.next().await.unwrap().name);
        }
        seen.sort();
        let mut all: Vec<_> = (0..10).map(|i| format!("o{i}")).collect();
        all.sort();
        assert_eq!(seen, all, "every object once");
        // The pass is over: nothing more until another list finishes.
        assert!(
            tokio::time::timeout(Duration::from_secs(120), stream.next())
                .await
                .is_err()
        );
        lists_tx.send_modify(|n| *n += 1);
        assert!(stream.next().await.is_some(), "a re-list starts a new pass");
    }
}
