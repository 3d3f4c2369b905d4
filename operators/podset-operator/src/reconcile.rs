//! The controller: [`Context`], [`controller`] (what is watched), [`reconcile`] and [`Error`].
//! The reconcile reads as: our pods' labels put back ([`labels`]), the plan
//! ([`desired::plan`]) carried out (creates through the kit, `shared::children`), the status
//! published.
//!
//! The error policy is the common runner's (behind `shared::Operator::run`): a failed
//! reconcile is retried with per-object exponential backoff (1 s doubling to 5 min), never
//! in a hot loop.

use std::{sync::Arc, time::Instant};

use futures::StreamExt;
use k8s_openapi::{api::core::v1::Pod, apimachinery::pkg::apis::meta::v1::OwnerReference};
use kube::{
    Api, ResourceExt,
    api::Preconditions,
    runtime::{
        Controller,
        controller::Action,
        reflector::{ObjectRef, Store},
        watcher,
    },
};
use shared::{
    Toolkit,
    children::{self, Children, Problem},
    conditions,
    namespaces::Scope,
    slim::SlimPod,
};

use crate::{
    api::PodSet,
    desired,
    expectations::{Cached, Expectations},
    labels,
    pods::{self, OurPod, Pods},
    status,
    strays::Strays,
};

/// Why a reconcile failed.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A Kubernetes API call failed.
    #[error("kubernetes API call failed: {0}")]
    Kube(#[from] kube::Error),
    /// A helper of the common crate failed.
    #[error(transparent)]
    Shared(#[from] shared::Error),
    /// Pods could not be created (quota, admission, invalid image name, ...).
    #[error("cannot create pods: {0}")]
    CreatePods(String),
}

impl shared::ReconcileError for Error {
    fn metric_label(&self) -> &'static str {
        match self {
            Error::Kube(_) => "kube",
            Error::Shared(e) => e.metric_label(),
            Error::CreatePods(_) => "create_pods",
        }
    }
}

/// State shared by every reconcile.
#[derive(Debug)]
pub struct Context {
    /// Client, events, metrics.
    pub toolkit: Toolkit,
    /// What is kept of the pods, by the UID of their PodSet, for every watched scope
    /// ([`pods`]).
    pub pods: Arc<Pods>,
    /// Pod creates/deletes in flight.
    pub expectations: Arc<Expectations>,
    /// Pods of ours that left the label-selected watch without being deleted.
    pub strays: Arc<Strays>,
    /// Image used when `spec.image` is unset (`PODSET_IMAGE`, else `busybox`).
    pub default_image: String,
}

impl Context {
    /// A context; `default_image` comes from `PODSET_IMAGE`.
    #[must_use]
    pub fn new(toolkit: Toolkit, default_image: Option<String>) -> Self {
        Self {
            toolkit,
            // By the controller's UID: a reconcile reads its own pods only.
            pods: Arc::new(pods::index()),
            expectations: Arc::new(Expectations::default()),
            strays: Arc::new(Strays::default()),
            default_image: default_image
                .filter(|i| !i.is_empty())
                .unwrap_or_else(|| crate::api::DEFAULT_IMAGE.to_owned()),
        }
    }
}

impl shared::Pacing<PodSet> for Context {
    /// Completed by the last pod of a change Ready, or the last extra pod gone:
    /// `spec.replicas` active pods in the cache, all ready, no create or delete of ours
    /// unseen; converging until then, while the status does not say `Ready` for this
    /// generation.
    fn progress(&self, ps: &PodSet) -> shared::Progress {
        let (Some(ns), Some(uid)) = (shared::awaiting_ready(ps), ps.uid()) else {
            return shared::Progress::Settled;
        };
        let owned = OurPod::of_podset(&self.pods, &ns, &uid);
        let done = status::is_ready(ps, &active_pods(&owned, &[]), false)
            && self
                .expectations
                .satisfied(&uid, |name| cached_state(&owned, name), Instant::now());
        shared::Progress::converging_until(done)
    }
}

/// The label every pod of the operator carries; the pod watch selects on it.
pub const MANAGED_BY: &str = "app.kubernetes.io/managed-by";

/// The controller of one scope: PodSets, and the pods labelled as managed by this
/// operator (unrelated pods are never listed, watched or cached). Ownership is still
/// decided by the controller owner reference's UID, and a pod of ours that loses the
/// label is caught as it leaves the watch ([`Strays`]) and relabelled.
pub fn controller(scope: &Scope, ctx: &Context) -> Controller<PodSet> {
    // A PodSet deleted while its pod writes were in flight would keep its expectations
    // forever: forget them when the watch shows it gone.
    let (podsets, podset_events) = scope.reflect::<PodSet>(watcher::Config::default());
    let (store, expectations, strays) = (
        podsets.clone(),
        ctx.expectations.clone(),
        ctx.strays.clone(),
    );
    let podset_events = podset_events.inspect(move |event| {
        if let Ok(ps) = event
            && forget_if_deleted(&expectations, &store, ps)
            && let Some(uid) = ps.uid()
        {
            strays.forget(&uid);
        }
    });
    let selector = format!("{MANAGED_BY}={}", ctx.toolkit.operator.name);
    let pod_events =
        scope.reflect_index::<SlimPod, _>(watcher::Config::default().labels(&selector), &ctx.pods);
    let (expectations, strays, pods, store) = (
        ctx.expectations.clone(),
        ctx.strays.clone(),
        ctx.pods.clone(),
        podsets.clone(),
    );
    let pod_events = pod_events.inspect(move |event| {
        if let Ok(pod) = event
            && let Some(owner) = pod
                .owner_references()
                .iter()
                .find(|r| r.controller == Some(true))
        {
            let terminating = pod.deletion_timestamp().is_some();
            expectations.observe(&owner.uid, &pod.name_any(), terminating);
            // The index has applied the event: a pod missing from it that is not being
            // deleted stopped matching the selector. Only a pod of a PodSet the cache
            // holds is remembered: anyone can label a pod as ours and point its owner
            // reference anywhere, and a stray of nothing we reconcile would never be
            // forgotten.
            if !terminating
                && !pods.contains(
                    pod.namespace().as_deref().unwrap_or_default(),
                    &pod.name_any(),
                )
                && owns_podset(&store, pod.namespace().as_deref(), owner)
            {
                strays.add(&owner.uid, &pod.name_any());
            }
        }
    });
    Controller::for_stream(podset_events, podsets).owns_stream(pod_events)
}

/// Whether `owner` (a pod's controller reference in namespace `ns`) is a PodSet the cache
/// holds, with that very UID.
fn owns_podset(store: &Store<PodSet>, ns: Option<&str>, owner: &OwnerReference) -> bool {
    if !pods::is_podset(owner) {
        return false;
    }
    let Some(ns) = ns else { return false };
    store
        .get(&ObjectRef::new(&owner.name).within(ns))
        .is_some_and(|ps| ps.uid().as_deref() == Some(owner.uid.as_str()))
}

/// Drops the expectations of `ps` when the store no longer holds it (the reflector applies
/// an event before passing it on, so a deleted PodSet is already gone from the store) or
/// holds a newer PodSet of the same name. `true` when it was gone.
fn forget_if_deleted(expectations: &Expectations, store: &Store<PodSet>, ps: &PodSet) -> bool {
    let Some(uid) = ps.uid() else { return false };
    let stored = store.get(&ObjectRef::from_obj(ps));
    let gone = stored.is_none_or(|s| s.uid().as_deref() != Some(uid.as_str()));
    if gone {
        expectations.forget(&uid);
    }
    gone
}

/// Brings the pods of one PodSet to `spec.replicas` and records what it saw in the status.
///
/// The steps: relabel the pods of ours that lost their labels, repair edited labels, and,
/// once the earlier creates and deletes have shown up in the cache, create the missing
/// pods and delete the extra ones; then the status.
///
/// # Errors
/// [`Error`] on API failures; the runner retries with per-object backoff.
pub async fn reconcile(ps: Arc<PodSet>, ctx: Arc<Context>) -> Result<Action, Error> {
    let (Some(ns), Some(uid)) = (ps.namespace(), ps.uid()) else {
        return Ok(Action::await_change());
    };
    if ps.metadata.deletion_timestamp.is_some() {
        // Garbage collection removes the pods through their owner references.
        ctx.expectations.forget(&uid);
        ctx.strays.forget(&uid);
        return Ok(Action::await_change());
    }
    let pod_api: Api<Pod> = Api::namespaced(ctx.toolkit.client.clone(), &ns);
    let owned = OurPod::of_podset(&ctx.pods, &ns, &uid);
    // Ours, but unlabelled: relabelled (back in the watch) and counted as they are.
    let returned = labels::relabel_strays(&ps, &uid, &owned, &pod_api, &ctx).await?;
    let active = active_pods(&owned, &returned);
    // Repair labels someone edited on our pods (ownership is by UID; the labels keep the
    // scale selector and `kubectl get -l app=...` truthful).
    labels::repair_labels(&ps, &active, &pod_api, ctx.toolkit.operator.name).await?;

    let cached = |name: &str| cached_state(&owned, name);
    let satisfied = ctx.expectations.satisfied(&uid, cached, Instant::now());
    let mut children = Children::new(&ctx.toolkit.client, ctx.toolkit.operator.name, ps.as_ref())?;
    let mut acted = false;
    if satisfied {
        let plan = desired::plan(&ps, &active);
        acted = plan.create > 0 || !plan.delete.is_empty();
        if plan.create > 0 {
            create_missing(&ps, &ns, &uid, plan.create, &mut children, &ctx).await?;
            if children.namespace_terminating() {
                // A namespace being deleted refuses new pods; nothing to do.
                return Ok(Action::await_change());
            }
        }
        delete_extra(&uid, &plan.delete, &active, &pod_api, &ctx).await?;
    }

    // Why the API server refused to create pods, if it did.
    let create_error = children.problems().first().map(Problem::message);
    let writes_pending = !satisfied || acted;
    update_status(&ps, &active, writes_pending, create_error.as_deref(), &ctx).await?;
    if let Some(msg) = create_error {
        return Err(Error::CreatePods(msg));
    }
    if !satisfied {
        // Re-check once the expectations would time out, in case a watch event was lost.
        return Ok(Action::requeue(ctx.expectations.timeout()));
    }
    Ok(Action::await_change())
}

/// Whether pod `name` is among the PodSet's pods the index holds (`owned`), and
/// terminating.
fn cached_state(owned: &[OurPod], name: &str) -> Cached {
    match owned.iter().find(|p| p.name == name) {
        None => Cached::Absent,
        Some(p) if p.facts.terminating => Cached::Terminating,
        Some(_) => Cached::Present,
    }
}

/// The pods that count: the PodSet's pods the index holds (`owned`) and the strays just
/// relabelled (`returned`), those neither finished nor terminating ([`desired::is_active`]).
fn active_pods<'a>(owned: &'a [OurPod], returned: &'a [OurPod]) -> Vec<&'a OurPod> {
    owned
        .iter()
        .chain(returned.iter())
        .filter(|p| desired::is_active(p))
        .collect()
}

/// At most this many pods are created by one reconcile; the rest by the next ones, once
/// these show up in the cache. A reconcile holds one of the operator's reconcile slots
/// while it creates: a PodSet of 500 replicas then lets the other namespaces' reconciles
/// through every 31 pods rather than holding its slot for all 500.
pub const MAX_CREATES_PER_RECONCILE: usize = 31;

/// Creates `count` pods (at most [`MAX_CREATES_PER_RECONCILE`]) for the PodSet `ps`
/// (`ns`, `uid`) in the kit's slow-start batches ([`Children::create`]: 1, 2, 4, 8 and 16
/// sent at once, none after a batch with a refusal), telling the expectations of each; a
/// refusal is among the children's problems.
async fn create_missing(
    ps: &PodSet,
    ns: &str,
    uid: &str,
    count: usize,
    children: &mut Children<'_, PodSet>,
    ctx: &Context,
) -> Result<(), Error> {
    let count = count.min(MAX_CREATES_PER_RECONCILE);
    tracing::info!(create = count, "scaling up");
    let pod = desired::desired_pod(ps, children.owner(), &ctx.default_image);
    let cached = |n: &str| {
        if ctx.pods.contains(ns, n) {
            Cached::Present
        } else {
            Cached::Absent
        }
    };
    children
        .create(&pod, count, |created: Pod| {
            ctx.expectations
                .created(uid, &created.name_any(), cached, Instant::now());
        })
        .await?;
    Ok(())
}

/// Deletes the pods `names` of the PodSet `uid`, telling the expectations first; a pod
/// already gone is fine.
///
/// Each delete carries the UID of the pod the cache showed (`active`) as a precondition
/// ([`children::delete`]): if that pod was deleted and someone else's pod took its name
/// meanwhile, the API server refuses (409) and the newcomer is left alone.
async fn delete_extra(
    uid: &str,
    names: &[String],
    active: &[&OurPod],
    api: &Api<Pod>,
    ctx: &Context,
) -> Result<(), Error> {
    for name in names {
        tracing::info!(pod = %name, "scaling down: deleting pod");
        ctx.expectations.deleting(uid, name, Instant::now());
        let same_pod = Preconditions {
            uid: active
                .iter()
                .find(|p| p.name == *name)
                .and_then(|p| p.facts.uid.as_deref().map(str::to_owned)),
            resource_version: None,
        };
        // Gone, or another pod now holds the name: ours is gone either way.
        if let Err(e) = children::delete(api, name, same_pod).await {
            ctx.expectations.delete_failed(uid, name);
            return Err(e.into());
        }
    }
    Ok(())
}

/// Describes the PodSet's active pods in its status (with `create_error` as `Degraded`),
/// and announces the transitions ([`status::ANNOUNCED`]).
async fn update_status(
    ps: &PodSet,
    active: &[&OurPod],
    writes_pending: bool,
    create_error: Option<&str>,
    ctx: &Context,
) -> Result<(), Error> {
    let new_status = status::status(ps, active, writes_pending, create_error, conditions::now());
    ctx.toolkit
        .publish_status(ps, &new_status, &status::ANNOUNCED)
        .await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use kube::{Resource, runtime::reflector};

    fn podset(uid: &str) -> PodSet {
        let mut ps = PodSet::new(
            "ps",
            crate::api::PodSetSpec {
                replicas: 1,
                image: None,
            },
        );
        ps.metadata.namespace = Some("ns".into());
        ps.metadata.uid = Some(uid.into());
        ps
    }

    #[test]
    fn strays_are_remembered_only_for_podsets_in_the_cache() {
        let (store, mut writer) = reflector::store::<PodSet>();
        writer.apply_watcher_event(&watcher::Event::Apply(podset("u1")));
        let owner = |kind: &str, name: &str, uid: &str| OwnerReference {
            api_version: PodSet::api_version(&()).into_owned(),
            kind: kind.into(),
            name: name.into(),
            uid: uid.into(),
            controller: Some(true),
            block_owner_deletion: None,
        };
        assert!(owns_podset(
            &store,
            Some("ns"),
            &owner("PodSet", "ps", "u1")
        ));
        // Someone's ConfigMap, a PodSet UID of another object, another namespace.
        assert!(!owns_podset(
            &store,
            Some("ns"),
            &owner("ConfigMap", "ps", "u1")
        ));
        assert!(!owns_podset(
            &store,
            Some("ns"),
            &owner("PodSet", "ps", "u9")
        ));
        assert!(!owns_podset(
            &store,
            Some("other"),
            &owner("PodSet", "ps", "u1")
        ));
        assert!(!owns_podset(&store, None, &owner("PodSet", "ps", "u1")));
        let mut other_group = owner("PodSet", "ps", "u1");
        other_group.api_version = "example.com/v1".into();
        assert!(!owns_podset(&store, Some("ns"), &other_group));
    }

    #[test]
    fn deleted_podset_expectations_are_forgotten() {
        let (store, mut writer) = reflector::store::<PodSet>();
        let expectations = Expectations::default();
        let now = Instant::now();
        let old = podset("u1");
        writer.apply_watcher_event(&watcher::Event::Apply(old.clone()));
        expectations.created("u1", "ps-pod-a", |_| Cached::Absent, now);

        // Still stored: kept.
        forget_if_deleted(&expectations, &store, &old);
        assert_eq!(expectations.len(), 1);

        // Deleted: the store no longer holds it by the time the event is seen.
        writer.apply_watcher_event(&watcher::Event::Delete(old.clone()));
        forget_if_deleted(&expectations, &store, &old);
        assert!(expectations.is_empty());

        // Replaced by a namesake (new UID): the old one's expectations go, the new one's stay.
        expectations.created("u1", "ps-pod-a", |_| Cached::Absent, now);
        expectations.created("u2", "ps-pod-b", |_| Cached::Absent, now);
        let new = podset("u2");
        writer.apply_watcher_event(&watcher::Event::Apply(new.clone()));
        forget_if_deleted(&expectations, &store, &old);
        forget_if_deleted(&expectations, &store, &new);
        assert_eq!(expectations.len(), 1);
        assert!(!expectations.satisfied("u2", |_| Cached::Absent, now));
    }

    /// Reconcile against a scripted API server: the answers a real cluster rarely gives.
    mod api {
        use super::*;
        use shared_testing::{Reply, Scripted, assert_events, reconcile_scripted, toolkit};

        const STATUS: &str =
            "PATCH /apis/batch.tutorial.kubebuilder.io/v1/namespaces/ns/podsets/ps/status";
        const CREATE_POD: &str = "POST /api/v1/namespaces/ns/pods";
        const EVENT: &str = "POST /apis/events.k8s.io/v1/namespaces/ns/events";

        /// Reconciles `ps` against `replies`; returns the result and the requests made.
        async fn run(ps: PodSet, replies: Vec<Reply>) -> (Result<Action, Error>, Scripted) {
            let context = |client| Context::new(toolkit(client, crate::OPERATOR), None);
            reconcile_scripted(ps, replies, context, reconcile).await
        }

        fn object(ps: &PodSet) -> Reply {
            Reply::Object(serde_json::to_value(ps).unwrap())
        }

        fn podset(replicas: i32) -> PodSet {
            let mut ps = super::podset("uid-1");
            ps.spec.replicas = replicas;
            ps
        }

        #[tokio::test]
        async fn status_write_404_is_no_error() {
            let (result, api) = run(podset(0), vec![Reply::error(404, "not found")]).await;
            assert_eq!(result.unwrap(), Action::await_change());
            assert_eq!(api.lines(), [STATUS], "no event for a PodSet that is gone");
        }

        #[tokio::test]
        async fn status_write_409_is_retried() {
            let (result, api) = run(podset(0), vec![Reply::error(409, "conflict")]).await;
            assert!(
                matches!(
                    result,
                    Err(Error::Shared(shared::Error::Kube(kube::Error::Api(ref s)))) if s.code == 409
                ),
                "{result:?}"
            );
            assert_eq!(api.lines(), [STATUS]);
        }

        #[tokio::test]
        async fn refused_pod_creates_are_degraded() {
            for (code, message) in [
                (403, "pods \"ps-pod-x\" is forbidden: exceeded quota"),
                (
                    422,
                    "Pod \"ps-pod-x\" is invalid: spec.containers[0].image: Required value",
                ),
            ] {
                let ps = podset(2);
                let replies = vec![
                    Reply::error(code, message),
                    object(&ps),
                    Reply::Echo,
                    Reply::Echo,
                ];
                let (result, api) = run(ps, replies).await;
                assert!(
                    matches!(result, Err(Error::CreatePods(ref m)) if m == message),
                    "{result:?}"
                );
                // One create (the second is not tried), the status, two events.
                assert_eq!(api.lines(), [CREATE_POD, STATUS, EVENT, EVENT]);
                let status = &api.seen()[1].body["status"];
                let degraded = status["conditions"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .find(|c| c["type"] == "Degraded")
                    .unwrap();
                assert_eq!(degraded["reason"], "FailedCreate");
                assert_events(
                    &api,
                    &[("Normal", "PodsNotReady"), ("Warning", "FailedCreate")],
                );
            }
        }

        fn created(i: usize) -> Reply {
            Reply::Object(serde_json::json!({
                "apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": format!("ps-pod-{i}"), "namespace": "ns"}
            }))
        }

        #[tokio::test]
        async fn a_large_scale_up_creates_in_growing_batches_and_at_most_31_per_reconcile() {
            let ps = podset(100);
            let mut replies: Vec<Reply> = (0..MAX_CREATES_PER_RECONCILE).map(created).collect();
            replies.extend([object(&ps), Reply::Echo, Reply::Echo]);
            let (result, api) = run(ps, replies).await;
            assert!(result.is_ok(), "{result:?}");
            let creates = api.lines().iter().filter(|l| *l == CREATE_POD).count();
            assert_eq!(
                creates, MAX_CREATES_PER_RECONCILE,
                "the rest by the next reconciles"
            );
        }

        #[tokio::test]
        async fn a_refusal_ends_the_scale_up_after_its_batch() {
            let ps = podset(100);
            // Batches of 1, 2 and 4: the second create of the third batch is refused.
            let mut replies: Vec<Reply> = (0..4).map(created).collect();
            replies.push(Reply::error(403, "exceeded quota"));
            replies.extend((5..7).map(created));
            replies.extend([object(&ps), Reply::Echo, Reply::Echo]);
            let (result, api) = run(ps, replies).await;
            assert!(matches!(result, Err(Error::CreatePods(_))), "{result:?}");
            let creates = api.lines().iter().filter(|l| *l == CREATE_POD).count();
            assert_eq!(creates, 7, "no batch after the one refused");
        }

        #[tokio::test]
        async fn a_status_write_the_cache_has_not_shown_is_not_repeated() {
            let writes = Arc::new(shared::status::StatusWrites::default());
            let run = |ps: PodSet, replies: Vec<Reply>| {
                let writes = Arc::clone(&writes);
                let context = move |client| {
                    let mut toolkit = toolkit(client, crate::OPERATOR);
                    toolkit.status_writes = writes;
                    Context::new(toolkit, None)
                };
                reconcile_scripted(ps, replies, context, reconcile)
            };
            let mut ps = podset(0);
            ps.metadata.resource_version = Some("1".into());
            let answer = object(&ps);
            let replies = || vec![answer.clone(), Reply::Echo, Reply::Echo, Reply::Echo];
            let (result, api) = run(ps.clone(), replies()).await;
            result.unwrap();
            assert_eq!(api.lines()[0], STATUS);
            assert_eq!(writes.len(), 1);
            // Triggered again before the watch showed the write: the cache still holds
            // version 1 without a status. Nothing is written, no event repeated.
            let (result, api) = run(ps.clone(), replies()).await;
            result.unwrap();
            assert!(api.lines().is_empty(), "{:?}", api.lines());
            // The cache shows a newer version whose status is not ours (someone reset
            // it): written again.
            ps.metadata.resource_version = Some("3".into());
            let (result, api) = run(ps.clone(), replies()).await;
            result.unwrap();
            assert_eq!(api.lines()[0], STATUS);
            let written = api.seen()[0].body["status"].clone();
            // Once the cache shows the object as written (a newer version with that
            // status), nothing is written and nothing is remembered.
            ps.metadata.resource_version = Some("4".into());
            ps.status = Some(serde_json::from_value(written).unwrap());
            let (result, api) = run(ps, replies()).await;
            result.unwrap();
            assert!(api.lines().is_empty(), "{:?}", api.lines());
            assert!(writes.is_empty());
        }

        #[tokio::test]
        async fn a_namespace_being_deleted_stops_quietly() {
            let message = "pods \"ps-pod-x\" is forbidden: unable to create new content in namespace ns because it is being terminated";
            let (result, api) = run(podset(1), vec![Reply::error(403, message)]).await;
            assert_eq!(result.unwrap(), Action::await_change());
            assert_eq!(api.lines(), [CREATE_POD], "no status write, no event");
        }
    }
}
