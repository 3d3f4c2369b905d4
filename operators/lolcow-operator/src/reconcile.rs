//! The controller: [`Context`], [`controller`] (what is watched), [`reconcile`] and [`Error`].
//!
//! The error policy is the common runner's (behind `shared::Operator::run`): a failed
//! reconcile is retried with per-object exponential backoff (1 s doubling to 5 min). A
//! Service the API server refuses (the NodePort is taken), or a child name held by an
//! object this Lolcow does not control (left untouched, `shared::ownership`), is not an
//! error but a condition: the reconcile succeeds and looks again after its own backoff,
//! since the port may be freed by a Service this operator cannot watch (another namespace),
//! and the stranger holding a name carries none of the labels the child watches select.

use std::{sync::Arc, time::Duration};

use k8s_openapi::api::{apps::v1::Deployment, core::v1::Service};
use kube::{
    Resource, ResourceExt,
    runtime::{Controller, controller::Action, watcher},
};
use shared::{
    ErrorBackoff, Toolkit,
    children::{Children, Outcome, Problem, Refusal},
    conditions,
    namespaces::Scope,
    namespaces::ScopedStores,
    slim::Slim,
};

use crate::{
    api::{DEFAULT_IMAGE, Lolcow},
    desired,
    status::{self, ChildProblem},
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
}

impl shared::ReconcileError for Error {
    fn metric_label(&self) -> &'static str {
        match self {
            Error::Kube(_) => "kube",
            Error::Shared(e) => e.metric_label(),
        }
    }
}

/// State shared by every reconcile.
#[derive(Debug)]
pub struct Context {
    /// Client, events, metrics.
    pub toolkit: Toolkit,
    /// The Deployment caches (children only, compact: [`Slim`]), one per watched scope.
    pub deployments: ScopedStores<Slim<Deployment>>,
    /// The Service caches (children only, compact: [`Slim`]), one per watched scope.
    pub services: ScopedStores<Slim<Service>>,
    /// The web app image (`LOLCOW_IMAGE`, else [`DEFAULT_IMAGE`]).
    pub image: String,
    /// How long to wait before retrying a refused Service, per Lolcow (5 s doubling to 5 min).
    pub refused: ErrorBackoff,
}

impl shared::Pacing<Lolcow> for Context {
    /// Completed by the rollout of a change: the cached Deployment rolled out, the cached
    /// Service on `spec.port`; converging until then, while the status does not say
    /// `Ready` for this generation.
    fn progress(&self, lc: &Lolcow) -> shared::Progress {
        let Some(ns) = shared::awaiting_ready(lc) else {
            return shared::Progress::Settled;
        };
        let name = lc.name_any();
        let done = match (
            self.deployments.find_full(&ns, &name),
            self.services.find_full(&ns, &name),
        ) {
            (Ok(Some(dep)), Ok(Some(svc))) => status::is_serving(lc, &dep, &svc),
            _ => false,
        };
        shared::Progress::converging_until(done)
    }
}

impl Context {
    /// A context; `image` comes from `LOLCOW_IMAGE`.
    #[must_use]
    pub fn new(toolkit: Toolkit, image: Option<String>) -> Self {
        Self {
            toolkit,
            deployments: ScopedStores::default(),
            services: ScopedStores::default(),
            image: image
                .filter(|i| !i.trim().is_empty())
                .unwrap_or_else(|| DEFAULT_IMAGE.to_owned()),
            refused: ErrorBackoff::new(Duration::from_secs(5), Duration::from_secs(300)),
        }
    }
}

/// The label every child carries; the child watches select on it, so the caches hold only
/// this operator's Deployments and Services. A child whose labels were edited away leaves
/// the watch (a delete event), which triggers the reconcile that puts them back.
fn children_selector() -> String {
    format!("app.kubernetes.io/managed-by={}", crate::OPERATOR.name)
}

/// The controller of one scope: Lolcows, and their Deployments and Services.
pub fn controller(scope: &Scope, ctx: &Context) -> Controller<Lolcow> {
    let children = watcher::Config::default().labels(&children_selector());
    let (deployments, deployment_events) = scope.reflect::<Slim<Deployment>>(children.clone());
    ctx.deployments.insert(scope, deployments);
    let (services, service_events) = scope.reflect::<Slim<Service>>(children);
    ctx.services.insert(scope, services);
    scope
        .controller::<Lolcow>(watcher::Config::default())
        .owns_stream(deployment_events)
        .owns_stream(service_events)
}

/// Runs the web app of one Lolcow and exposes it on `spec.port`; records what is served
/// in the status.
///
/// # Errors
/// [`Error`] on API failures; the runner retries with per-object backoff.
pub async fn reconcile(lc: Arc<Lolcow>, ctx: Arc<Context>) -> Result<Action, Error> {
    let Some(ns) = lc.namespace() else {
        return Ok(Action::await_change());
    };
    let name = lc.name_any();
    let key = format!("{ns}/{name}");
    if lc.meta().deletion_timestamp.is_some() {
        // Garbage collection removes the children through their owner references.
        ctx.refused.succeeded(&key);
        return Ok(Action::await_change());
    }
    let mut children = Children::new(&ctx.toolkit.client, ctx.toolkit.operator.name, lc.as_ref())?;
    let owner = children.owner();

    // The web app. The API server refusing it is an error, retried with backoff.
    let dep = desired::desired_deployment(&lc, owner.clone(), &ctx.image);
    let cached_dep = ctx.deployments.find(&ns, &name);
    let dep = children.apply(&dep, cached_dep.clone()).await?;
    match &dep.outcome {
        Outcome::Problem(Problem::Refused(refusal)) => {
            return Err(refusal.clone().into_error().into());
        }
        Outcome::Written => log_greeting(&lc, cached_dep.as_deref()),
        _ => {}
    }

    // The NodePort Service: a 422 (the port taken, out of range) is a condition.
    let svc = desired::desired_service(&lc, owner);
    let svc = children.apply(&svc, ctx.services.find(&ns, &name)).await?;
    if children.namespace_terminating() {
        return Ok(Action::await_change());
    }
    // Names held by objects this Lolcow does not control are never written to.
    let problem = ChildProblem::of(children.problems()).map_err(Refusal::into_error)?;
    let (dep, svc) = (dep.into_object()?, svc.into_object()?);

    // What is served, in the status; an event when Ready changes.
    let new_status = status::status(
        &lc,
        dep.as_ref(),
        svc.as_ref(),
        problem.as_ref(),
        conditions::now(),
    );
    ctx.toolkit
        .publish_status(lc.as_ref(), &new_status, &status::ANNOUNCED)
        .await?;

    if problem.is_some() {
        // The port may be freed, or the stranger holding a name deleted, without an event
        // this operator watches: look again later, less and less often; a spec change brings
        // the next look forward.
        return Ok(Action::requeue(ctx.refused.failed(&key)));
    }
    ctx.refused.succeeded(&key);
    // A leftover whose labels were removed is out of the watch: its deletion announces
    // nothing.
    Ok(children
        .leftover_recheck()
        .map_or_else(Action::await_change, Action::requeue))
}

/// Logs a change of the greeting the web app's Deployment was just written with, from
/// the one `cached` configured.
fn log_greeting(lc: &Lolcow, cached: Option<&Slim<Deployment>>) {
    let old = cached
        .and_then(|d| d.full().ok())
        .and_then(|d| desired::configured_greeting(&d));
    let new = desired::greeting(lc);
    match old {
        Some(old) if old != new => tracing::info!(old = %old, new = %new, "new greeting"),
        None => tracing::info!(greeting = %new, "web app greeting"),
        Some(_) => {}
    }
}

#[cfg(test)]
mod tests {
    //! Reconcile against a scripted API server: the answers a real cluster rarely gives.
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::fixtures::lolcow;
    use shared_testing::{Reply, Scripted, assert_events, cache, reconcile_scripted, toolkit};

    const APPLY_DEPLOYMENT: &str = "PATCH /apis/apps/v1/namespaces/ns/deployments/moo";
    const APPLY_SERVICE: &str = "PATCH /api/v1/namespaces/ns/services/moo";
    const STATUS: &str = "PATCH /apis/my.domain/v1alpha1/namespaces/ns/lolcows/moo/status";
    const EVENT: &str = "POST /apis/events.k8s.io/v1/namespaces/ns/events";

    /// Reconciles `lc` against `replies`; returns the result and the scripted server.
    async fn run(lc: Lolcow, replies: Vec<Reply>) -> (Result<Action, Error>, Scripted) {
        let context = |client| Context::new(toolkit(client, crate::OPERATOR), None);
        reconcile_scripted(lc, replies, context, reconcile).await
    }

    /// The Deployment is created (nothing cached: an apply that may only create); then
    /// the Service's answer is `service`.
    fn children(service: Reply) -> Vec<Reply> {
        vec![Reply::Echo, service]
    }

    #[tokio::test]
    async fn a_taken_node_port_is_a_condition_not_an_error() {
        let lc = lolcow(30080, Some("Hello"));
        let message = "Service \"moo\" is invalid: spec.ports[0].nodePort: Invalid value: 30080: provided port is already allocated";
        let mut replies = children(Reply::error(422, message));
        replies.push(Reply::Object(serde_json::to_value(&lc).unwrap()));
        replies.push(Reply::Echo);
        let (result, api) = run(lc, replies).await;
        // Looked at again after the refused-Service backoff (5 s at first).
        assert_eq!(
            result.unwrap(),
            Action::requeue(std::time::Duration::from_secs(5))
        );
        assert_eq!(
            api.lines(),
            [APPLY_DEPLOYMENT, APPLY_SERVICE, STATUS, EVENT]
        );
        let seen = api.seen();
        let ready = &seen[2].body["status"]["conditions"][0];
        assert_eq!(
            (&ready["type"], &ready["status"], &ready["reason"]),
            (&"Ready".into(), &"False".into(), &"PortConflict".into())
        );
        let event = &seen[3].body;
        assert_eq!(
            (&event["type"], &event["reason"], &event["action"]),
            (
                &"Warning".into(),
                &"PortConflict".into(),
                &"ReadyChanged".into()
            )
        );
        assert_eq!(event["note"], format!("Ready is False: {message}"));
    }

    #[tokio::test]
    async fn a_forbidden_service_is_an_error() {
        let (result, api) = run(
            lolcow(30080, None),
            children(Reply::error(403, "services \"moo\" is forbidden")),
        )
        .await;
        assert!(
            matches!(
                result,
                Err(Error::Shared(shared::Error::Kube(kube::Error::Api(ref s)))) if s.code == 403
            ),
            "{result:?}"
        );
        assert_eq!(
            api.lines(),
            [APPLY_DEPLOYMENT, APPLY_SERVICE],
            "no status write"
        );
    }

    #[tokio::test]
    async fn status_write_404_is_no_error() {
        let mut replies = children(Reply::Echo);
        replies.push(Reply::error(404, "not found"));
        let (result, api) = run(lolcow(30080, None), replies).await;
        assert_eq!(result.unwrap(), Action::await_change());
        assert_eq!(api.lines().len(), 3, "no event: {:?}", api.lines());
        assert_eq!(api.lines()[2], STATUS);
    }

    #[tokio::test]
    async fn status_write_409_is_retried() {
        let mut replies = children(Reply::Echo);
        replies.push(Reply::error(409, "the object has been modified"));
        let (result, api) = run(lolcow(30080, None), replies).await;
        assert!(
            matches!(
                result,
                Err(Error::Shared(shared::Error::Kube(kube::Error::Api(ref s)))) if s.code == 409
            ),
            "{result:?}"
        );
        assert_eq!(api.lines().len(), 3, "no event: {:?}", api.lines());
    }

    /// Reconciles `lc` with `deployments` and `services` in the caches.
    async fn run_cached(
        lc: Lolcow,
        deployments: Vec<Deployment>,
        services: Vec<Service>,
        replies: Vec<Reply>,
    ) -> (Result<Action, Error>, Scripted) {
        let context = |client: kube::Client| {
            let ctx = Context::new(toolkit(client.clone(), crate::OPERATOR), None);
            cache(&ctx.deployments, &client, deployments);
            cache(&ctx.services, &client, services);
            ctx
        };
        reconcile_scripted(lc, replies, context, reconcile).await
    }

    /// The children `lc` wants, as the cache shows them once written.
    fn in_sync(lc: &Lolcow) -> (Vec<Deployment>, Vec<Service>) {
        let owner = shared::apply::owner_reference(lc).unwrap();
        (
            vec![desired::desired_deployment(
                lc,
                owner.clone(),
                DEFAULT_IMAGE,
            )],
            vec![desired::desired_service(lc, owner)],
        )
    }

    #[tokio::test]
    async fn children_in_sync_cost_no_request() {
        let lc = lolcow(30080, None);
        let (deployments, services) = in_sync(&lc);
        let replies = vec![
            Reply::Object(serde_json::to_value(&lc).unwrap()),
            Reply::Echo,
        ];
        let (result, api) = run_cached(lc, deployments, services, replies).await;
        assert_eq!(result.unwrap(), Action::await_change());
        assert_eq!(api.lines()[0], STATUS, "only the status: {:?}", api.lines());
        assert!(
            api.lines()[1..].iter().all(|l| l == EVENT),
            "{:?}",
            api.lines()
        );
    }

    #[tokio::test]
    async fn names_held_by_strangers_are_one_condition_and_never_written() {
        let lc = lolcow(30080, None);
        let (mut deployments, mut services) = in_sync(&lc);
        deployments[0].metadata.owner_references = None;
        services[0].metadata.owner_references = None;
        let replies = vec![
            Reply::Object(serde_json::to_value(&lc).unwrap()),
            Reply::Echo,
        ];
        let (result, api) = run_cached(lc, deployments, services, replies).await;
        assert_eq!(
            result.unwrap(),
            Action::requeue(std::time::Duration::from_secs(5))
        );
        assert_eq!(api.lines(), [STATUS, EVENT]);
        let ready = &api.seen()[0].body["status"]["conditions"][0];
        assert_eq!(ready["reason"], status::REASON_NAME_CONFLICT);
        let message = ready["message"].as_str().unwrap();
        assert!(
            message.starts_with("Deployment moo exists")
                && message.contains("; Service moo exists"),
            "{message}"
        );
        assert_events(&api, &[("Warning", "NameConflict")]);
    }

    #[tokio::test]
    async fn a_leftover_deployment_is_waited_for() {
        let lc = lolcow(30080, None);
        let (mut deployments, services) = in_sync(&lc);
        deployments[0].metadata.owner_references.as_mut().unwrap()[0].uid = "uid-0".into();
        let replies = vec![
            Reply::Object(serde_json::to_value(&lc).unwrap()),
            Reply::Echo,
        ];
        let (result, api) = run_cached(lc, deployments, services, replies).await;
        assert_eq!(
            result.unwrap(),
            Action::requeue(shared::ownership::LEFTOVER_RECHECK)
        );
        assert_eq!(
            api.lines()[0],
            STATUS,
            "no child written: {:?}",
            api.lines()
        );
    }

    #[tokio::test]
    async fn a_namespace_being_deleted_stops_quietly() {
        let message = "deployments.apps \"moo\" is forbidden: unable to create new content in namespace ns because it is being terminated";
        let replies = vec![Reply::error(403, message)];
        let (result, api) = run(lolcow(30080, None), replies).await;
        assert_eq!(result.unwrap(), Action::await_change());
        assert_eq!(api.lines(), [APPLY_DEPLOYMENT]);
    }

    #[tokio::test]
    async fn a_refused_deployment_is_an_error() {
        for code in [403, 422] {
            let replies = vec![Reply::error(code, "refused")];
            let (result, api) = run(lolcow(30080, None), replies).await;
            assert!(
                matches!(
                    result,
                    Err(Error::Shared(shared::Error::Kube(kube::Error::Api(ref s)))) if s.code == code
                ),
                "{result:?}"
            );
            assert_eq!(api.lines(), [APPLY_DEPLOYMENT], "nothing after it");
        }
    }
}
