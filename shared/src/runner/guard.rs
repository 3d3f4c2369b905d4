//! What surrounds every reconcile: the wait for its scope's watches, the bounded
//! debounce, metrics and a log (and trace) span, panic recovery, and the per-object
//! error backoff.

use std::{future::Future, sync::Arc, time::Instant};

use futures::FutureExt;
use kube::{
    Resource, ResourceExt,
    runtime::{
        controller::{self, Action},
        reflector::{ObjectRef, Store},
    },
};
use tracing::Instrument;

use crate::{
    backoff::{Debounce, ErrorBackoff, Gate},
    error::ReconcileError,
    namespaces::ScopeStatus,
    runner::metrics::{Metrics, ReconcileResult},
    runner::toolkit::Pacing,
};

/// The operator's reconcile as the controllers call it, with what surrounds each call:
/// metrics, a log span, the bounded debounce and the per-object error backoff.
pub(super) struct Guard<K, Ctx, Fut> {
    /// The `controller` label of metrics and logs.
    pub(super) controller: &'static str,
    /// Where reconciles are counted and timed.
    pub(super) metrics: Metrics,
    /// The per-object error backoff.
    pub(super) backoff: ErrorBackoff,
    /// `--reconcile-debounce`, applied here rather than by kube's `Config::debounce`:
    /// kube's is a plain trailing debounce (every trigger pushes the object's deadline back
    /// by the debounce again), so even a `kubectl scale` would wait it out, and a child
    /// event every 200 ms with a 500 ms debounce would postpone the reconcile for as long
    /// as the events keep coming. kube runs with no debounce instead, and
    /// [`Guard::reconcile`] asks [`Debounce`] first: a generation not reconciled yet (a
    /// spec change) runs at once, and so does a trigger that completes the object (the
    /// context's [`Pacing::progress`]); any other trigger is deferred, returning a requeue
    /// after the remaining quiet time (an object on its way to its spec: the remaining
    /// bound), and waits at most [`MAX_DEBOUNCE_WAIT`](super::MAX_DEBOUNCE_WAIT) after its
    /// first deferred trigger.
    pub(super) debounce: Debounce,
    /// Resync triggers queued after a full list ([`super::resync`]): claimed when their
    /// reconcile starts, which then skips the debounce (no burst of events to fold).
    pub(super) resyncs: Arc<super::Admission>,
    /// The operator's own status writes (its toolkit's), whose echoes the scopes' primary
    /// watches do not pass on as triggers ([`crate::Scope::with_status_writes`]).
    pub(super) status_writes: Arc<crate::status::StatusWrites>,
    /// The reconcile slots (`--max-concurrent-reconciles`), taken in turn by namespace.
    pub(super) slots: Arc<crate::runner::fair::FairSlots>,
    /// The operator's reconcile.
    pub(super) reconcile: fn(Arc<K>, Arc<Ctx>) -> Fut,
}

impl<K, Ctx: Pacing<K>, Fut> Guard<K, Ctx, Fut>
where
    K: Resource<DynamicType = ()> + Clone + 'static,
{
    /// Reconciles `obj` once every watch of its scope (`synced`) has its first full list:
    /// kube's Controller only waits for the primary store, and a reconcile that sees the
    /// children's cache still empty would, after a restart, create children that already
    /// exist. Each scope waits for its own watches only, so a namespace whose watches fail
    /// (its RoleBinding removed, say) does not hold back the others: it is logged, retried
    /// by the watcher's backoff, and named in the `/readyz` body.
    ///
    /// Then it waits for a reconcile slot ([`Guard::slots`], in turn by namespace). kube's
    /// queue runs with no limit of its own, so every trigger kube hands over waits here,
    /// and a burst of N objects is N of these futures at once. While one waits it holds
    /// only the object, its key and span and the wait itself: the reconcile's own future
    /// (which can be kilobytes: every state of the operator's reconcile) is made, boxed,
    /// once the slot is taken. The object is then read again from the scope's `store`, as
    /// kube's own queue would hand it over at that moment, and the debounce asked then.
    pub(super) fn reconcile<E>(
        self: Arc<Self>,
        mut synced: tokio::sync::watch::Receiver<ScopeStatus>,
        store: Store<K>,
        obj: Arc<K>,
        ctx: Arc<Ctx>,
    ) -> impl Future<Output = Result<Action, E>>
    where
        Fut: Future<Output = Result<Action, E>>,
    {
        let controller = self.controller;
        let key = object_key(obj.as_ref());
        let span = reconcile_span(controller, obj.as_ref(), &key);
        async move {
            let queued = self.metrics.queued(controller);
            // An error means the runner is shutting down; the reconcile then runs on
            // whatever the caches hold, as before.
            let _ = synced.wait_for(ScopeStatus::synced).await;
            let slot = self
                .slots
                .acquire(obj.meta().namespace.as_deref().unwrap_or_default())
                .await;
            let Some(obj) = store.get(&ObjectRef::from_obj(obj.as_ref())) else {
                // Deleted while it waited: what kube reports as `ObjectNotFound`.
                self.forget(&key);
                return Ok(Action::await_change());
            };
            if let Some(generation) = obj.meta().generation {
                tracing::Span::current().record("generation", generation);
            }
            Box::pin(self.run_in_slot(obj, ctx, key, queued, slot)).await
        }
        .instrument(span)
    }

    /// The debounce, then the reconcile with its metrics, in the slot taken by
    /// [`Guard::reconcile`].
    async fn run_in_slot<E>(
        &self,
        obj: Arc<K>,
        ctx: Arc<Ctx>,
        key: String,
        queued: crate::runner::metrics::Queued,
        _slot: crate::runner::fair::Slot,
    ) -> Result<Action, E>
    where
        Fut: Future<Output = Result<Action, E>>,
    {
        // tokio's clock (the same as std's outside paused-time tests).
        let now = tokio::time::Instant::now().into_std();
        // A deferred resync would sit in kube's scheduler, taking back the room the
        // bounded resync saves.
        let resync = self.resyncs.claim(&key);
        let generation = obj.meta().generation;
        if resync {
            self.debounce.ran(&key, generation);
        } else if let Gate::Wait(wait) = self
            .debounce
            .check(&key, generation, now, || ctx.progress(obj.as_ref()))
        {
            record_result(&tracing::Span::current(), "deferred");
            return Ok(Action::requeue(wait));
        }
        let _worker = queued.start();
        let reconcile = (self.reconcile)(obj, ctx);
        guarded_reconcile(
            self.controller,
            &key,
            &self.metrics,
            &self.backoff,
            reconcile,
        )
        .await
    }

    /// The error policy: logs the failure and retries the object after its backoff.
    pub(super) fn error_policy<E: ReconcileError>(&self, obj: &K, error: &E) -> Action {
        let key = object_key(obj);
        let wait = self.backoff.failed(&key);
        tracing::warn!(controller = self.controller, object = %key, %error, kind = error.metric_label(), retry_in = ?wait, "reconcile failed");
        Action::requeue(wait)
    }
}

impl<K, Ctx, Fut> Guard<K, Ctx, Fut> {
    /// Drops what is kept of the object `key` (gone): its backoff, debounce and queued
    /// resync.
    pub(super) fn forget(&self, key: &str) {
        self.backoff.forget(key);
        self.debounce.forget(key);
        self.resyncs.claim(key);
    }
}

/// Runs one reconcile with its metrics, resetting the object's backoff on success.
///
/// A panic in the reconcile does not take the process down (controller-runtime recovers
/// them too): it is caught, logged, counted in `controller_runtime_reconcile_panics_total`
/// and as an error, and the object is retried with backoff. The objects a panicking
/// reconcile shares with others are only the context's caches and locks, which tolerate
/// it (poisoned locks are recovered), hence the `AssertUnwindSafe`. This needs
/// `panic = "unwind"` (the workspace's release profile).
pub(crate) async fn guarded_reconcile<E>(
    controller: &'static str,
    key: &str,
    metrics: &Metrics,
    backoff: &ErrorBackoff,
    reconcile: impl Future<Output = Result<Action, E>>,
) -> Result<Action, E> {
    let start = Instant::now();
    let outcome = std::panic::AssertUnwindSafe(reconcile).catch_unwind().await;
    let seconds = start.elapsed().as_secs_f64();
    let result = match outcome {
        Ok(result) => result,
        Err(payload) => {
            let message = payload
                .downcast_ref::<&str>()
                .map(|s| (*s).to_owned())
                .or_else(|| payload.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "(no message)".to_owned());
            metrics.reconcile_panicked(controller);
            record_result(&tracing::Span::current(), "error");
            metrics.reconciled(controller, ReconcileResult::Error, seconds);
            let wait = backoff.failed(key);
            tracing::error!(controller, object = %key, panic = %message, retry_in = ?wait, "reconcile panicked; recovered");
            return Ok(Action::requeue(wait));
        }
    };
    let result_label = match &result {
        Ok(action) if *action == Action::await_change() => ReconcileResult::Success,
        Ok(_) => ReconcileResult::RequeueAfter,
        Err(_) => ReconcileResult::Error,
    };
    if result.is_ok() {
        backoff.succeeded(key);
    }
    record_result(
        &tracing::Span::current(),
        match result_label {
            ReconcileResult::Success => "ok",
            ReconcileResult::RequeueAfter => "requeue",
            ReconcileResult::Error => "error",
        },
    );
    metrics.reconciled(controller, result_label, seconds);
    result
}

/// Logs what a controller stream reports; an object found deleted (a retry or a deferred
/// trigger came after it was gone) is dropped from the backoff, the debounce and the
/// queued resyncs.
pub(super) fn on_controller_result<K: Resource, Ctx, Fut, E: ReconcileError>(
    controller: &str,
    result: Result<
        (kube::runtime::reflector::ObjectRef<K>, Action),
        controller::Error<E, kube::runtime::watcher::Error>,
    >,
    guard: &Guard<K, Ctx, Fut>,
) {
    match result {
        Ok(_) => {}
        Err(controller::Error::ObjectNotFound(obj)) => {
            guard.forget(&ref_key(&obj));
            tracing::debug!(controller, object = %obj, "object gone before reconcile");
        }
        Err(controller::Error::ReconcilerFailed(..)) => {} // logged by the error policy
        // A failing watch: already logged with its namespace by the scope (`Scope::reflect`).
        Err(controller::Error::QueueError(error)) => {
            tracing::debug!(controller, %error, "watch error");
        }
        Err(error) => tracing::warn!(controller, %error, "controller error"),
    }
}

/// The span of one reconcile of `obj` (whose [`object_key`] is `key`): `controller`,
/// `object` (`namespace/name`), `namespace`, `object.name` (not `name`: JSON log lines
/// give the span's own name under that key), `generation`, and, recorded later, `result`
/// ([`record_result`]) and `trace_id` when traces are exported (so every log line inside
/// carries it).
pub(super) fn reconcile_span<K: Resource>(
    controller: &'static str,
    obj: &K,
    key: &str,
) -> tracing::Span {
    let meta = obj.meta();
    let span = tracing::info_span!(
        "reconcile",
        controller,
        object = %key,
        namespace = meta.namespace.as_deref().unwrap_or_default(),
        object.name = meta.name.as_deref().unwrap_or_default(),
        generation = tracing::field::Empty,
        result = tracing::field::Empty,
        otel.status_code = tracing::field::Empty,
        trace_id = tracing::field::Empty,
    );
    if let Some(generation) = meta.generation {
        span.record("generation", generation);
    }
    crate::runner::telemetry::record_trace_id(&span);
    span
}

/// Records how a reconcile ended in its span (`reconcile_span`): `ok` (nothing more to
/// do until a change), `requeue`, `error` (also the span's OpenTelemetry status), or
/// `deferred` (the debounce put the trigger off). Nothing on a span without the fields.
pub(super) fn record_result(span: &tracing::Span, result: &'static str) {
    span.record("result", result);
    if result == "error" {
        span.record("otel.status_code", "error");
    }
}

/// `namespace/name` of an object: its key in the backoff, the debounce and the resyncs.
fn object_key<K: Resource>(obj: &K) -> String {
    format!("{}/{}", obj.namespace().unwrap_or_default(), obj.name_any())
}

/// [`object_key`] of the object an `ObjectRef` names.
pub(super) fn ref_key<K: Resource>(obj: &kube::runtime::reflector::ObjectRef<K>) -> String {
    format!(
        "{}/{}",
        obj.namespace.as_deref().unwrap_or_default(),
        obj.name
    )
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use std::time::Duration;

    use super::*;

    #[derive(Debug, thiserror::Error)]
    #[error("failed")]
    struct Failed;

    use k8s_openapi::api::core::v1::ConfigMap;
    use kube::runtime::{reflector, watcher};

    /// A context that folds nothing the debounce asks about.
    struct Settled;
    impl Pacing<ConfigMap> for Settled {}

    /// A reconcile whose future is large (64 KiB held across an await), as an operator's
    /// reconcile with many states can be: it answers the object's `data.seen`.
    async fn large(cm: Arc<ConfigMap>, _: Arc<Settled>) -> Result<Action, Failed> {
        let buffer = [7u8; 64 * 1024];
        tokio::task::yield_now().await;
        std::hint::black_box(&buffer);
        let seen = cm.data.as_ref().and_then(|d| d.get("seen")).cloned();
        Ok(Action::requeue(Duration::from_secs(
            seen.and_then(|s| s.parse().ok()).unwrap_or(0),
        )))
    }

    /// A guard of `slots` slots around [`large`].
    fn guard(
        slots: usize,
    ) -> Arc<Guard<ConfigMap, Settled, impl Future<Output = Result<Action, Failed>>>> {
        Arc::new(Guard {
            controller: "test",
            metrics: Metrics::new(),
            backoff: ErrorBackoff::default(),
            debounce: crate::backoff::Debounce::new(Duration::ZERO, Duration::ZERO),
            resyncs: Arc::new(super::super::Admission::new(8)),
            status_writes: Arc::new(crate::status::StatusWrites::default()),
            slots: crate::runner::fair::FairSlots::new(slots),
            reconcile: large,
        })
    }

    /// The config map `ns/a` with `data.seen`.
    fn config_map(seen: &str) -> ConfigMap {
        ConfigMap {
            metadata: kube::api::ObjectMeta {
                name: Some("a".into()),
                namespace: Some("ns".into()),
                ..Default::default()
            },
            data: Some([("seen".to_owned(), seen.to_owned())].into()),
            ..Default::default()
        }
    }

    /// A scope whose one watch has listed.
    fn synced() -> tokio::sync::watch::Receiver<ScopeStatus> {
        let (tx, rx) = tokio::sync::watch::channel(ScopeStatus {
            namespace: Some("ns".into()),
            watches: vec![crate::namespaces::WatchStatus {
                kind: "ConfigMap".into(),
                synced: true,
                error: None,
            }],
        });
        std::mem::forget(tx);
        rx
    }

    #[tokio::test]
    async fn a_reconcile_waiting_for_its_slot_is_small_and_runs_on_the_latest_object() {
        let guard = guard(1);
        let (store, mut writer) = reflector::store::<ConfigMap>();
        writer.apply_watcher_event(&watcher::Event::Apply(config_map("1")));
        let held = guard.slots.acquire("ns").await;
        let waiting = guard.clone().reconcile::<Failed>(
            synced(),
            store,
            Arc::new(config_map("1")),
            Arc::new(Settled),
        );
        // A burst of N objects is N of these at once: each must not carry the
        // reconcile's own future, which is made once the slot is taken.
        let own = std::mem::size_of_val(&large(Arc::new(config_map("1")), Arc::new(Settled)));
        assert!(own >= 64 * 1024, "{own}");
        let size = std::mem::size_of_val(&waiting);
        assert!(size < 4 * 1024, "a waiting reconcile is {size} bytes");
        let mut waiting = Box::pin(waiting);
        assert!(futures::poll!(&mut waiting).is_pending());
        // Changed while it waited: the reconcile sees the change, as kube's own queue
        // would have handed it over.
        writer.apply_watcher_event(&watcher::Event::Apply(config_map("2")));
        drop(held);
        assert_eq!(
            waiting.await.unwrap(),
            Action::requeue(Duration::from_secs(2))
        );
    }

    #[tokio::test]
    async fn an_object_deleted_while_it_waited_is_not_reconciled() {
        let guard = guard(1);
        let (store, mut writer) = reflector::store::<ConfigMap>();
        writer.apply_watcher_event(&watcher::Event::Apply(config_map("1")));
        let held = guard.slots.acquire("ns").await;
        let mut waiting = Box::pin(guard.clone().reconcile::<Failed>(
            synced(),
            store,
            Arc::new(config_map("1")),
            Arc::new(Settled),
        ));
        assert!(futures::poll!(&mut waiting).is_pending());
        writer.apply_watcher_event(&watcher::Event::Delete(config_map("1")));
        drop(held);
        assert_eq!(waiting.await.unwrap(), Action::await_change());
        let text = guard.metrics.encode();
        assert!(
            !text.contains(r#"controller_runtime_reconcile_total{controller="test""#),
            "not reconciled: {text}"
        );
    }

    #[tokio::test]
    async fn a_panicking_reconcile_is_recovered_counted_and_retried() {
        let metrics = Metrics::new();
        metrics.controller_started("test", 1);
        let backoff = ErrorBackoff::new(Duration::from_secs(1), Duration::from_secs(60));
        let panicking = async {
            if backoff.is_empty() {
                panic!("boom");
            }
            Ok::<_, Failed>(Action::await_change())
        };
        let action = guarded_reconcile("test", "ns/a", &metrics, &backoff, panicking)
            .await
            .unwrap();
        // Requeued with backoff; a second panic waits longer.
        assert_eq!(action, Action::requeue(Duration::from_secs(1)));
        let again = guarded_reconcile("test", "ns/a", &metrics, &backoff, async {
            panic!("{}", String::from("boom again"))
        });
        let action: Result<Action, Failed> = again.await;
        assert_eq!(action.unwrap(), Action::requeue(Duration::from_secs(2)));
        let text = metrics.encode();
        assert!(
            text.contains(r#"controller_runtime_reconcile_panics_total{controller="test"} 2"#),
            "{text}"
        );
        assert!(
            text.contains(r#"controller_runtime_reconcile_errors_total{controller="test"} 2"#),
            "{text}"
        );
        // The process (this test) carries on, and the object reconciles normally again.
        let ok = guarded_reconcile("test", "ns/a", &metrics, &backoff, async {
            Ok::<_, Failed>(Action::await_change())
        });
        assert_eq!(ok.await.unwrap(), Action::await_change());
        assert!(backoff.is_empty());
        // Ordinary errors are returned for the error policy, not swallowed.
        let err = guarded_reconcile("test", "ns/b", &metrics, &backoff, async {
            Err::<Action, _>(Failed)
        });
        assert!(err.await.is_err());
        assert!(
            metrics
                .encode()
                .contains(r#"controller_runtime_reconcile_panics_total{controller="test"} 2"#)
        );
    }
}
