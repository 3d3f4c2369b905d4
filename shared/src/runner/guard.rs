//! What surrounds every reconcile: the wait for its scope's watches, the bounded
//! debounce, metrics and a log (and trace) span, panic recovery, and the per-object
//! error backoff.

use std::{
    collections::HashMap,
    future::Future,
    sync::{Arc, Mutex, PoisonError},
    time::Instant,
};

use futures::FutureExt;
use kube::{
    Resource, ResourceExt,
    runtime::{
        controller::{self, Action},
        reflector::ObjectRef,
    },
};
use tracing::Instrument;

use crate::{
    backoff::{Debounce, ErrorBackoff, Gate, Progress},
    error::ReconcileError,
    namespaces::ScopeStatus,
    runner::fair::Slot,
    runner::metrics::{Metrics, Queued, ReconcileResult},
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
    /// The objects waiting for a slot, and the slots kept for them.
    pub(super) waiting: Arc<Waiting>,
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
    /// Then it takes a reconcile slot ([`Guard::slots`], in turn by namespace). kube's
    /// queue runs with no limit of its own (its hand-out at a limit is in no fair order),
    /// so every trigger reaches this. When no slot is free, the object is queued for one
    /// ([`Waiting`]) and this returns at once, holding nothing: when its turn comes, the
    /// slot is kept for it and `trigger` (a `reconcile_on` stream of the scope's
    /// controller) asks kube for the object again, which hands over the latest one; that
    /// reconcile runs in the slot kept. kube then never holds more running reconciles
    /// than there are slots, and a burst of N objects waits as N queued names.
    pub(super) async fn reconcile<E>(
        self: Arc<Self>,
        mut synced: tokio::sync::watch::Receiver<ScopeStatus>,
        trigger: futures::channel::mpsc::UnboundedSender<ObjectRef<K>>,
        obj: Arc<K>,
        ctx: Arc<Ctx>,
    ) -> Result<Action, E>
    where
        Fut: Future<Output = Result<Action, E>>,
    {
        // An error means the runner is shutting down; the reconcile then runs on
        // whatever the caches hold, as before.
        let _ = synced.wait_for(ScopeStatus::synced).await;
        let key = object_key(obj.as_ref());
        // Asked at most once per trigger, and only where it decides something.
        let mut progress = None;
        let mut progress = || *progress.get_or_insert_with(|| ctx.progress(obj.as_ref()));
        let namespace = obj.meta().namespace.as_deref().unwrap_or_default();
        let (slot, queued) = match self.waiting.granted(&key) {
            // Its turn: the debounce let it through when it was queued.
            Some(granted) => granted,
            None if self.waiting.is_queued(&key) => {
                // Folded into its turn; a trigger that now completes the object moves
                // that turn to the front of its namespace (once). A slot free meanwhile
                // is not taken here: the queued turn is on its way to one.
                if progress() == Progress::Completes && self.waiting.promote(&key) {
                    let granted = self.turn(&key, obj.as_ref(), trigger);
                    drop(self.slots.try_acquire_or_queue(namespace, || true, granted));
                }
                return Ok(Action::await_change());
            }
            None => {
                // The debounce first, as a trigger comes: a deferred one takes no turn.
                // A queued resync skips it (claimed when it runs, so the resyncs queued
                // stay bounded).
                if !self.resyncs.is_queued(&key) {
                    // tokio's clock (the same as std's outside paused-time tests).
                    let now = tokio::time::Instant::now().into_std();
                    let generation = obj.meta().generation;
                    if let Gate::Wait(wait) =
                        self.debounce.check(&key, generation, now, &mut progress)
                    {
                        return Ok(Action::requeue(wait));
                    }
                }
                // In the map before its turn can come (from another task's release).
                self.waiting
                    .queue(&key, self.metrics.queued(self.controller));
                let granted = self.turn(&key, obj.as_ref(), trigger);
                // A trigger that completes its object goes before its namespace's others:
                // the object is done sooner, and what it holds meanwhile is let go.
                let completes = || progress() == Progress::Completes;
                let Some(slot) = self
                    .slots
                    .try_acquire_or_queue(namespace, completes, granted)
                else {
                    return Ok(Action::await_change());
                };
                let queued = self
                    .waiting
                    .unqueue(&key)
                    .unwrap_or_else(|| self.metrics.queued(self.controller));
                (slot, queued)
            }
        };
        let span = reconcile_span(self.controller, obj.as_ref(), &key);
        Box::pin(
            self.run_in_slot(obj, ctx, key, queued, slot)
                .instrument(span),
        )
        .await
    }

    /// What `key`'s turn does when it comes: keep the slot for it and ask kube (through
    /// `trigger`) for `obj` again.
    fn turn(
        &self,
        key: &str,
        obj: &K,
        trigger: futures::channel::mpsc::UnboundedSender<ObjectRef<K>>,
    ) -> impl FnOnce(Slot) + Send + 'static {
        let (waiting, key) = (Arc::clone(&self.waiting), key.to_owned());
        let obj = ObjectRef::from_obj(obj);
        move |slot| {
            Waiting::grant(&waiting, key, slot, move || {
                trigger.unbounded_send(obj).is_ok()
            });
        }
    }

    /// The reconcile with its metrics, in the slot taken by [`Guard::reconcile`] (a resync
    /// claimed here records its generation as reconciled).
    async fn run_in_slot<E>(
        &self,
        obj: Arc<K>,
        ctx: Arc<Ctx>,
        key: String,
        queued: Queued,
        _slot: Slot,
    ) -> Result<Action, E>
    where
        Fut: Future<Output = Result<Action, E>>,
    {
        if self.resyncs.claim(&key) {
            self.debounce.ran(&key, obj.meta().generation);
        }
        let _worker = queued.start(&self.metrics);
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

/// How long a slot kept for a queued object waits for kube to hand the object over
/// (normally at once; an object deleted meanwhile is reported and forgotten sooner):
/// after this the slot goes to the next in turn.
const GRANT_CLAIM_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(30);

/// The objects waiting for a reconcile slot, by key, and the slots kept for them until
/// kube hands them over again ([`Guard::reconcile`]).
///
/// A burst of N objects is N entries at once; once they have run, the map gives the room
/// back ([`shrink_when_sparse`](crate::expiring::shrink_when_sparse)), and the grants
/// not claimed yet wait in one queue of deadlines, not in a timer task each.
#[derive(Debug, Default)]
pub(super) struct Waiting {
    entries: Mutex<HashMap<String, Wait>>,
    /// Tells one grant of a key from a later one (for [`GRANT_CLAIM_TIMEOUT`]).
    grants: std::sync::atomic::AtomicU64,
    /// The grants to let go of if still unclaimed, oldest first (one timeout for all, so
    /// the order of the grants is the order of their deadlines).
    unclaimed: Mutex<Unclaimed>,
}

/// See [`Waiting::unclaimed`].
#[derive(Debug, Default)]
struct Unclaimed {
    deadlines: std::collections::VecDeque<(tokio::time::Instant, String, u64)>,
    /// Whether the task that lets them go is running.
    sweeping: bool,
}

#[derive(Debug)]
enum Wait {
    /// In the slots' queue, waiting since the work-queue entry was made; `promoted`: a
    /// second turn at the front of its namespace was queued for it.
    Queued { queued: Queued, promoted: bool },
    /// Its turn came: the slot kept for it (grant `id`).
    Granted { slot: Slot, queued: Queued, id: u64 },
}

/// Removes `key`'s entry; the map gives its room back once a burst has run.
fn removed(entries: &mut HashMap<String, Wait>, key: &str) -> Option<Wait> {
    let removed = entries.remove(key);
    crate::expiring::shrink_when_sparse(entries);
    removed
}

impl Waiting {
    fn entries(&self) -> std::sync::MutexGuard<'_, HashMap<String, Wait>> {
        // Each statement leaves the map consistent: a panic elsewhere cannot break it.
        self.entries.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn unclaimed(&self) -> std::sync::MutexGuard<'_, Unclaimed> {
        self.unclaimed
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// Queues `key`, with its work-queue entry.
    fn queue(&self, key: &str, queued: Queued) {
        self.entries().insert(
            key.to_owned(),
            Wait::Queued {
                queued,
                promoted: false,
            },
        );
    }

    /// Whether `key` is queued and its turn has not come.
    fn is_queued(&self, key: &str) -> bool {
        matches!(self.entries().get(key), Some(Wait::Queued { .. }))
    }

    /// Marks queued `key` promoted; `false` when it was already (or is not queued).
    fn promote(&self, key: &str) -> bool {
        match self.entries().get_mut(key) {
            Some(Wait::Queued { promoted, .. }) if !*promoted => {
                *promoted = true;
                true
            }
            _ => false,
        }
    }

    /// Takes `key` out of the queue (a slot came at once), with its work-queue entry.
    fn unqueue(&self, key: &str) -> Option<Queued> {
        match self.take_if(key, |w| matches!(w, Wait::Queued { .. }))? {
            Wait::Queued { queued, .. } => Some(queued),
            Wait::Granted { .. } => None,
        }
    }

    /// The slot kept for `key`, if its turn came.
    fn granted(&self, key: &str) -> Option<(Slot, Queued)> {
        match self.take_if(key, |w| matches!(w, Wait::Granted { .. }))? {
            Wait::Granted { slot, queued, .. } => Some((slot, queued)),
            Wait::Queued { .. } => None,
        }
    }

    /// Removes the entry of `key` if it is `wanted`.
    fn take_if(&self, key: &str, wanted: impl FnOnce(&Wait) -> bool) -> Option<Wait> {
        let mut entries = self.entries();
        if entries.get(key).is_some_and(wanted) {
            removed(&mut entries, key)
        } else {
            None
        }
    }

    /// `key`'s turn: keeps `slot` for it and asks kube for the object (`ask`); the slot
    /// goes on to the next in turn when `key` was forgotten meanwhile, when `ask` fails
    /// (the controller is gone), or when nobody claims it in [`GRANT_CLAIM_TIMEOUT`].
    fn grant(this: &Arc<Self>, key: String, slot: Slot, ask: impl FnOnce() -> bool) {
        let id = this
            .grants
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let kept = {
            let mut entries = this.entries();
            match entries.remove(&key) {
                Some(Wait::Queued { queued, .. }) => {
                    entries.insert(key.clone(), Wait::Granted { slot, queued, id });
                    None
                }
                other => {
                    if let Some(other) = other {
                        entries.insert(key.clone(), other);
                    }
                    Some(slot)
                }
            }
        };
        // Dropped outside the lock: a slot let go is handed on at once, maybe to a call
        // that takes the lock.
        if let Some(unused) = kept {
            drop(unused);
            return;
        }
        if !ask() {
            this.expire(&key, id);
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let deadline = tokio::time::Instant::now() + GRANT_CLAIM_TIMEOUT;
        let start = {
            let mut unclaimed = this.unclaimed();
            unclaimed.deadlines.push_back((deadline, key, id));
            !std::mem::replace(&mut unclaimed.sweeping, true)
        };
        if start {
            runtime.spawn(Arc::clone(this).sweep_unclaimed());
        }
    }

    /// Lets go of each grant in [`Waiting::unclaimed`] as its deadline comes (those claimed
    /// meanwhile are only forgotten); ends when none is left.
    async fn sweep_unclaimed(self: Arc<Self>) {
        loop {
            let (due, next) = {
                let mut unclaimed = self.unclaimed();
                let now = tokio::time::Instant::now();
                let mut due = Vec::new();
                while unclaimed
                    .deadlines
                    .front()
                    .is_some_and(|(deadline, _, _)| *deadline <= now)
                {
                    due.extend(unclaimed.deadlines.pop_front());
                }
                let next = unclaimed
                    .deadlines
                    .front()
                    .map(|(deadline, _, _)| *deadline);
                if next.is_none() {
                    unclaimed.sweeping = false;
                    unclaimed.deadlines.shrink_to_fit();
                }
                (due, next)
            };
            for (_, key, id) in due {
                self.expire(&key, id);
            }
            match next {
                Some(deadline) => tokio::time::sleep_until(deadline).await,
                None => return,
            }
        }
    }

    /// Lets go of the slot of grant `id` of `key` if still unclaimed.
    fn expire(&self, key: &str, id: u64) {
        let expired = {
            let mut entries = self.entries();
            match entries.get(key) {
                Some(Wait::Granted { id: kept, .. }) if *kept == id => removed(&mut entries, key),
                _ => None,
            }
        };
        drop(expired);
    }

    /// Forgets `key` (its object is gone): its slot, if kept, goes to the next in turn;
    /// a turn still to come finds nobody and passes the slot on.
    fn forget(&self, key: &str) {
        let gone = removed(&mut self.entries(), key);
        drop(gone);
    }
}

impl<K, Ctx, Fut> Guard<K, Ctx, Fut> {
    /// Drops what is kept of the object `key` (gone): its backoff, debounce and queued
    /// resync.
    pub(super) fn forget(&self, key: &str) {
        self.waiting.forget(key);
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
/// do until a change), `requeue`, or `error` (also the span's OpenTelemetry status).
/// Nothing on a span without the fields.
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
        guard_of(slots, large)
    }

    /// A guard of `slots` slots around `reconcile`.
    fn guard_of<Ctx, F>(
        slots: usize,
        reconcile: fn(Arc<ConfigMap>, Arc<Ctx>) -> F,
    ) -> Arc<Guard<ConfigMap, Ctx, F>> {
        Arc::new(Guard {
            controller: "test",
            metrics: Metrics::new(),
            backoff: ErrorBackoff::default(),
            debounce: crate::backoff::Debounce::new(Duration::ZERO, Duration::ZERO),
            resyncs: Arc::new(super::super::Admission::new(8)),
            status_writes: Arc::new(crate::status::StatusWrites::default()),
            slots: crate::runner::fair::FairSlots::new(slots),
            waiting: Arc::default(),
            reconcile,
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

    /// Whether `metrics` counted a reconcile.
    fn reconciled(metrics: &Metrics) -> bool {
        metrics
            .encode()
            .contains(r#"controller_runtime_reconcile_total{controller="test""#)
    }

    /// One trigger of `ns/a` (its `data.seen`) handed to `guard` as kube would, with
    /// `trigger` its scope's turns; what the reconcile answered.
    async fn dispatch<F>(
        guard: &Arc<Guard<ConfigMap, Settled, F>>,
        trigger: &futures::channel::mpsc::UnboundedSender<ObjectRef<ConfigMap>>,
        seen: &str,
    ) -> Action
    where
        F: Future<Output = Result<Action, Failed>>,
    {
        guard
            .clone()
            .reconcile::<Failed>(
                synced(),
                trigger.clone(),
                Arc::new(config_map(seen)),
                Arc::new(Settled),
            )
            .await
            .unwrap()
    }

    #[tokio::test]
    async fn without_a_free_slot_an_object_is_queued_and_asked_for_again_in_its_turn() {
        let guard = guard(1);
        let (trigger, mut asked) = futures::channel::mpsc::unbounded();
        let held = guard.slots.acquire("ns").await;
        // What kube holds per running reconcile: not the reconcile's own future (64 KiB
        // here), made and boxed once a slot is taken.
        let own = std::mem::size_of_val(&large(Arc::new(config_map("1")), Arc::new(Settled)));
        let dispatched = guard.clone().reconcile::<Failed>(
            synced(),
            trigger.clone(),
            Arc::new(config_map("1")),
            Arc::new(Settled),
        );
        let size = std::mem::size_of_val(&dispatched);
        assert!(
            own >= 64 * 1024 && size < 4 * 1024,
            "{size} bytes beside {own}"
        );
        drop(dispatched);
        for _ in 0..3 {
            // Returns at once, holding nothing, and reconciles nothing.
            assert_eq!(
                dispatch(&guard, &trigger, "1").await,
                Action::await_change()
            );
        }
        assert!(!reconciled(&guard.metrics));
        assert!(asked.try_recv().is_err(), "not asked for before its turn");
        drop(held);
        // Its turn: asked for once (three triggers folded into one turn).
        let asked_for = asked.try_recv().unwrap();
        assert_eq!(asked_for.name, "a");
        assert!(asked.try_recv().is_err());
        // kube hands over the latest object, which runs in the slot kept for it.
        assert_eq!(
            dispatch(&guard, &trigger, "2").await,
            Action::requeue(Duration::from_secs(2))
        );
        assert!(reconciled(&guard.metrics));
        // And gave it back.
        assert!(
            guard
                .slots
                .try_acquire_or_queue("b", || false, drop)
                .is_some()
        );
    }

    /// A context whose objects complete once `done` is set.
    struct Completing(std::sync::atomic::AtomicBool);
    impl Pacing<ConfigMap> for Completing {
        fn progress(&self, _: &ConfigMap) -> Progress {
            Progress::converging_until(self.0.load(std::sync::atomic::Ordering::Relaxed))
        }
    }

    /// The config map `ns/<name>`.
    fn named(name: &str) -> Arc<ConfigMap> {
        let mut cm = config_map("0");
        cm.metadata.name = Some(name.into());
        Arc::new(cm)
    }

    #[tokio::test]
    async fn a_queued_object_whose_trigger_now_completes_it_moves_to_the_front() {
        async fn quick(_: Arc<ConfigMap>, _: Arc<Completing>) -> Result<Action, Failed> {
            Ok(Action::await_change())
        }
        let guard = guard_of(1, quick);
        let ctx = Arc::new(Completing(false.into()));
        let (trigger, mut asked) = futures::channel::mpsc::unbounded();
        let held = guard.slots.acquire("ns").await;
        for name in ["first", "second", "second"] {
            let queued = guard.clone().reconcile::<Failed>(
                synced(),
                trigger.clone(),
                named(name),
                Arc::clone(&ctx),
            );
            assert_eq!(queued.await.unwrap(), Action::await_change());
            // The second's next trigger completes it.
            ctx.0
                .store(name == "second", std::sync::atomic::Ordering::Relaxed);
        }
        drop(held);
        // The second's turn came first; its kept slot goes on only once it has run.
        assert_eq!(asked.try_recv().unwrap().name, "second");
        assert!(asked.try_recv().is_err());
        let ran = guard.clone().reconcile::<Failed>(
            synced(),
            trigger.clone(),
            named("second"),
            Arc::clone(&ctx),
        );
        assert_eq!(ran.await.unwrap(), Action::await_change());
        assert_eq!(asked.try_recv().unwrap().name, "first");
        // The second's first turn, met later, finds nobody and passes the slot on.
        assert!(asked.try_recv().is_err());
    }

    #[tokio::test]
    async fn a_slot_kept_for_an_object_gone_goes_on_to_the_next() {
        let guard = guard(1);
        let (trigger, mut asked) = futures::channel::mpsc::unbounded();
        for forget_when in ["queued", "granted"] {
            let held = guard.slots.acquire("ns").await;
            assert_eq!(
                dispatch(&guard, &trigger, "1").await,
                Action::await_change()
            );
            if forget_when == "queued" {
                guard.forget("ns/a");
                drop(held);
                assert!(asked.try_recv().is_err(), "nobody to ask for");
            } else {
                drop(held);
                assert!(asked.try_recv().is_ok());
                // kube found it deleted (`ObjectNotFound`).
                guard.forget("ns/a");
            }
            let next = tokio::time::timeout(Duration::from_secs(1), guard.slots.acquire("b")).await;
            assert!(
                next.is_ok(),
                "forgotten when {forget_when}: the slot came back"
            );
        }
        assert!(!reconciled(&guard.metrics));
    }

    #[tokio::test(start_paused = true)]
    async fn a_grant_nobody_claims_lets_its_slot_go_after_the_timeout() {
        let guard = guard(1);
        let (trigger, mut asked) = futures::channel::mpsc::unbounded();
        let held = guard.slots.acquire("ns").await;
        assert_eq!(
            dispatch(&guard, &trigger, "1").await,
            Action::await_change()
        );
        // Its turn: the slot is kept for it, kube is asked, and nothing claims it.
        drop(held);
        assert!(asked.try_recv().is_ok());
        let early = tokio::time::timeout(
            GRANT_CLAIM_TIMEOUT - Duration::from_secs(1),
            guard.slots.acquire("b"),
        )
        .await;
        assert!(
            early.is_err(),
            "kept for the granted object until the timeout"
        );
        let later = tokio::time::timeout(Duration::from_secs(2), guard.slots.acquire("b")).await;
        assert!(later.is_ok(), "let go once the timeout passed");
        // The one sweeping task has ended, and nothing is left waiting.
        tokio::task::yield_now().await;
        let unclaimed = guard.waiting.unclaimed();
        assert!(unclaimed.deadlines.is_empty() && !unclaimed.sweeping);
        drop(unclaimed);
        assert!(guard.waiting.entries().is_empty());
        assert!(!reconciled(&guard.metrics));
    }

    #[test]
    fn a_burst_of_waiting_objects_leaves_no_room_behind() {
        let (waiting, metrics) = (Waiting::default(), Metrics::new());
        let keys: Vec<String> = (0..10_000).map(|i| format!("ns/o-{i}")).collect();
        for key in &keys {
            waiting.queue(key, metrics.queued("c"));
        }
        assert!(waiting.entries().capacity() >= 10_000);
        for key in &keys[..9_990] {
            assert!(waiting.unqueue(key).is_some());
        }
        let (len, capacity) = {
            let entries = waiting.entries();
            (entries.len(), entries.capacity())
        };
        assert_eq!(len, 10);
        assert!(capacity <= 128, "room for {capacity} left after the burst");
        // What each waiting object holds besides its key.
        assert!(std::mem::size_of::<Queued>() <= 48);
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
