//! The controller: [`Context`], [`controller`] (what is watched), [`reconcile`] and [`Error`].
//!
//! The error policy is the common runner's (`shared::run`): a failed reconcile is retried
//! with per-object exponential backoff (1 s doubling to 5 min), never in a hot loop. A
//! Deployment name held by someone else's Deployment is never written to
//! (`shared::ownership`): it is a condition (`NameConflict`) looked at again with a backoff
//! of its own.

use std::{sync::Arc, time::Duration};

use k8s_openapi::{api::apps::v1::Deployment, apimachinery::pkg::apis::meta::v1::Condition};
use kube::{
    Api, ResourceExt,
    runtime::{Controller, controller::Action, events::EventType, watcher},
};
use shared::{
    Scope, Toolkit,
    apply::{apply, owner_reference, patch_status},
    backoff::ErrorBackoff,
    conditions::find,
    namespaces::ScopedStores,
    ownership::{Claim, claim},
};

use crate::{
    OPERATOR,
    api::PulsarConsumer,
    desired::{self, Problem, REASON_NAME_CONFLICT, REASON_REJECTED},
};

/// The operator's environment variable naming the consumer image
/// (default [`desired::DEFAULT_IMAGE`]).
pub const IMAGE_ENV: &str = "PULSAR_CONSUMER_IMAGE";

/// Why a reconcile failed.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A Kubernetes API call failed.
    #[error("kubernetes API call failed: {0}")]
    Kube(#[from] kube::Error),
    /// A helper of the common crate failed.
    #[error(transparent)]
    Shared(#[from] shared::Error),
    /// The API server refused the Deployment (quota, admission); reported in the `Ready`
    /// condition and retried with backoff.
    #[error("the API server refused the Deployment: {0}")]
    Rejected(String),
}

impl shared::ReconcileError for Error {
    fn metric_label(&self) -> &'static str {
        match self {
            Error::Kube(_) => "kube",
            Error::Shared(e) => e.metric_label(),
            Error::Rejected(_) => "deployment_rejected",
        }
    }
}

/// State shared by every reconcile.
#[derive(Debug)]
pub struct Context {
    /// Client, events, metrics.
    pub toolkit: Toolkit,
    /// The caches of the operator's Deployments, one per watched scope.
    pub deployments: ScopedStores<Deployment>,
    /// The consumer image (`PULSAR_CONSUMER_IMAGE`, else [`desired::DEFAULT_IMAGE`]).
    pub image: String,
    /// How long to wait before looking again at a Deployment name held by someone else,
    /// per PulsarConsumer (5 s doubling to 5 min).
    pub conflicts: ErrorBackoff,
}

impl Context {
    /// A context; `image` comes from `PULSAR_CONSUMER_IMAGE` (unset or empty = the default).
    #[must_use]
    pub fn new(toolkit: Toolkit, image: Option<String>) -> Self {
        Self {
            toolkit,
            deployments: ScopedStores::default(),
            image: image
                .filter(|i| !i.is_empty())
                .unwrap_or_else(|| desired::DEFAULT_IMAGE.to_owned()),
            conflicts: ErrorBackoff::new(Duration::from_secs(5), Duration::from_secs(300)),
        }
    }
}

/// The controller of one scope: PulsarConsumers, and the Deployments this operator manages
/// (selected by the `app.kubernetes.io/managed-by` label, so other Deployments are not
/// cached). A Deployment whose label someone removed leaves the cache, which reads as
/// "deleted": the next reconcile re-applies it, label included.
pub fn controller(scope: &Scope, ctx: &Context) -> Controller<PulsarConsumer> {
    let managed = format!("app.kubernetes.io/managed-by={}", OPERATOR.name);
    let (deployments, deployment_events) =
        scope.reflect::<Deployment>(watcher::Config::default().labels(&managed));
    ctx.deployments.insert(scope, deployments);
    scope
        .controller::<PulsarConsumer>(watcher::Config::default())
        .owns_stream(deployment_events)
}

/// Applies the Deployment of one PulsarConsumer (no write when the cached one matches) and
/// records what it runs in the status.
///
/// # Errors
/// [`Error`] on API failures; the runner retries with per-object backoff.
pub async fn reconcile(pc: Arc<PulsarConsumer>, ctx: Arc<Context>) -> Result<Action, Error> {
    let Some(ns) = pc.namespace() else {
        return Ok(Action::await_change());
    };
    if pc.metadata.deletion_timestamp.is_some() {
        // Garbage collection removes the Deployment through its owner reference.
        return Ok(Action::await_change());
    }
    let key = format!("{ns}/{}", pc.name_any());
    let client = ctx.toolkit.client.clone();
    let name = desired::deployment_name(&pc);
    let owner = owner_reference(pc.as_ref())?;
    let want = desired::desired_deployment(&pc, owner.clone(), &ctx.image);
    let cached = ctx
        .deployments
        .in_namespace(&ns, |d| d.name_any() == name)
        .into_iter()
        .next();
    let api: Api<Deployment> = Api::namespaced(client.clone(), &ns);
    let manager = ctx.toolkit.operator.name;
    let (deployment, problem) = match claim(&api, &name, cached, &owner).await? {
        // Someone else's Deployment has the name: never written, reported.
        Claim::Conflict(conflict) => {
            tracing::debug!(%conflict, "deployment name taken");
            (None, Some(Problem::name_conflict(&conflict)))
        }
        // The Deployment of a deleted PulsarConsumer of the same name: garbage collection
        // removes it, and its deletion (it carries our label) triggers a reconcile.
        Claim::Leftover => {
            tracing::info!(deployment = %name, "waiting for the Deployment of an earlier PulsarConsumer to go");
            (None, None)
        }
        Claim::Free => write(&api, manager, &want, None).await?,
        Claim::Ours(existing) => write(&api, manager, &want, Some(existing)).await?,
    };
    let now = jiff::Timestamp::from_second(jiff::Timestamp::now().as_second())
        .unwrap_or_else(|_| jiff::Timestamp::now());
    let new_status = desired::status(&pc, deployment.as_ref(), problem.as_ref(), now);
    let consumers: Api<PulsarConsumer> = Api::namespaced(client, &ns);
    let old_conditions = pc
        .status
        .as_ref()
        .map(|s| s.conditions.clone())
        .unwrap_or_default();
    if patch_status(&consumers, pc.as_ref(), pc.status.as_ref(), &new_status).await? {
        announce_ready(&ctx, &pc, &old_conditions, &new_status.conditions).await;
    }
    match problem {
        // Someone else's Deployment may be deleted without an event this operator watches
        // (it lacks our label): look again later, less and less often.
        Some(p) if p.reason == REASON_NAME_CONFLICT => {
            Ok(Action::requeue(ctx.conflicts.failed(&key)))
        }
        Some(p) => Err(Error::Rejected(p.message)),
        None => {
            ctx.conflicts.succeeded(&key);
            Ok(Action::await_change())
        }
    }
}

/// Server-side applies `want` unless `cached` (ours) already matches. A refusal by the API
/// server (quota, admission) is returned as a [`Problem`], not an error.
async fn write(
    api: &Api<Deployment>,
    manager: &str,
    want: &Deployment,
    cached: Option<Deployment>,
) -> Result<(Option<Deployment>, Option<Problem>), Error> {
    let name = want.name_any();
    match apply(api, manager, want, cached.as_ref()).await {
        Ok(Some(applied)) => {
            tracing::info!(deployment = %name, "applied the Deployment");
            Ok((Some(applied), None))
        }
        Ok(None) => Ok((cached, None)),
        // A namespace being deleted refuses new objects; nothing to do.
        Err(shared::Error::Kube(kube::Error::Api(s)))
            if s.code == 403 && s.message.contains("being terminated") =>
        {
            Ok((cached, None))
        }
        Err(shared::Error::Kube(kube::Error::Api(s))) if matches!(s.code, 403 | 422) => {
            tracing::warn!(deployment = %name, reason = %s.message, "the Deployment was refused");
            Ok((cached, Some(Problem::rejected(&s.message))))
        }
        Err(e) => Err(e.into()),
    }
}

/// One event when `Ready` changes status, and one Warning when the Deployment is first
/// refused or its name found taken (even if `Ready` was already `False`, e.g. during a
/// rollout).
async fn announce_ready(ctx: &Context, pc: &PulsarConsumer, old: &[Condition], new: &[Condition]) {
    let Some(ready) = find(new, "Ready") else {
        return;
    };
    let before = find(old, "Ready");
    let flipped = before.is_none_or(|b| b.status != ready.status);
    // A problem for the user to fix: announced as a Warning when it starts.
    let rejected = [REASON_REJECTED, REASON_NAME_CONFLICT].contains(&ready.reason.as_str());
    let newly_rejected = rejected && before.is_none_or(|b| b.reason != ready.reason);
    if !(flipped || newly_rejected) {
        return;
    }
    let type_ = if rejected {
        EventType::Warning
    } else {
        EventType::Normal
    };
    let note = format!("Ready is {}: {}", ready.status, ready.message);
    ctx.toolkit
        .events
        .publish(pc, type_, &ready.reason, &note, "ReadyChanged")
        .await;
}
