//! The controller: [`Context`], [`controller`] (what is watched), [`reconcile`] and [`Error`].
//! The reconcile reads as: the replicas ([`crate::scaling`] when `spec.autoscaling` is set), the
//! desired Deployment written through the kit (`shared::children`), the status published.
//!
//! The error policy is the common runner's (behind `shared::Operator::run`): a failed
//! reconcile is retried with per-object exponential backoff (1 s doubling to 5 min), never
//! in a hot loop. A
//! Deployment name held by someone else's Deployment is never written to
//! (`shared::ownership`): it is a condition (`NameConflict`) looked at again with a backoff
//! of its own.

use std::{sync::Arc, time::Duration};

use k8s_openapi::api::apps::v1::Deployment;
use kube::{
    ResourceExt,
    runtime::{Controller, controller::Action, watcher},
};
use shared::{
    ErrorBackoff, Toolkit, children::Children, conditions, namespaces::Scope,
    namespaces::ScopedStores, slim::Slim,
};

use crate::{
    OPERATOR,
    api::PulsarConsumer,
    desired,
    options::Options,
    poll::Pollers,
    scaling::{announce_scale, autoscale},
    status::{self, Problem, REASON_NAME_CONFLICT},
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
    /// The caches of the operator's Deployments, one per watched scope (compact:
    /// [`Slim`], parsed back whole when a reconcile compares one).
    pub deployments: ScopedStores<Slim<Deployment>>,
    /// The consumer image (`PULSAR_CONSUMER_IMAGE`, else [`desired::DEFAULT_IMAGE`]).
    pub image: String,
    /// How long to wait before looking again at a Deployment name held by someone else,
    /// per PulsarConsumer (5 s doubling to 5 min).
    pub conflicts: ErrorBackoff,
    /// The backlog pollers of the autoscaled PulsarConsumers, and what the autoscaler
    /// remembers of each.
    pub pollers: Pollers,
    /// The shortest interval between two reads of one object's backlog
    /// ([`Options::min_poll_interval`]).
    pub min_poll_interval: Duration,
}

impl shared::Pacing<PulsarConsumer> for Context {
    /// Completed by the rollout of a change: the cached Deployment rolled out to the
    /// replicas it asks for, while the status does not say `Ready` for this generation.
    /// (The reconcile may then still scale it: that costs one reconcile, not a wrong
    /// status.) Never `Converging`: with autoscaling, the reconcile also reads the backlog
    /// on the timer it asks for (its requeue), and a trigger folded for the progress
    /// interval would stretch that poll from seconds to more than the scale-down window,
    /// so a drained backlog would be reported only with the scale to zero.
    fn progress(&self, pc: &PulsarConsumer) -> shared::Progress {
        let Some(ns) = shared::awaiting_ready(pc) else {
            return shared::Progress::Settled;
        };
        let done = match self
            .deployments
            .find_full(&ns, &desired::deployment_name(pc))
        {
            Ok(Some(deployment)) => {
                let want = deployment
                    .spec
                    .as_ref()
                    .and_then(|s| s.replicas)
                    .unwrap_or(1);
                status::is_rolled_out(&deployment, want)
            }
            _ => false,
        };
        if done {
            shared::Progress::Completes
        } else {
            shared::Progress::Settled
        }
    }
}

impl Context {
    /// A context with the default [`Options`]; `image` comes from `PULSAR_CONSUMER_IMAGE`
    /// (unset or empty = the default).
    #[must_use]
    pub fn new(toolkit: Toolkit, image: Option<String>) -> Self {
        Self::with_options(toolkit, image, &Options::default())
    }

    /// A context reading backlogs as `options` allow.
    #[must_use]
    pub fn with_options(toolkit: Toolkit, image: Option<String>, options: &Options) -> Self {
        let pollers = Pollers::new(options);
        toolkit.add_object_gauges(Arc::new(crate::metrics::StatusGauges {
            pollers: pollers.clone(),
        }));
        Self {
            toolkit,
            deployments: ScopedStores::default(),
            image: image
                .filter(|i| !i.is_empty())
                .unwrap_or_else(|| desired::DEFAULT_IMAGE.to_owned()),
            conflicts: ErrorBackoff::new(Duration::from_secs(5), Duration::from_secs(300)),
            pollers,
            min_poll_interval: options.min_poll_interval,
        }
    }

    /// Stops autoscaling `pc`: its poller and what the autoscaler remembered.
    pub(crate) fn forget(&self, pc: &PulsarConsumer) {
        self.pollers.stop(pc);
    }
}

/// The controller of one scope: PulsarConsumers, and the Deployments this operator manages
/// (selected by the `app.kubernetes.io/managed-by` label, so other Deployments are not
/// cached). A Deployment whose label someone removed leaves the cache, which reads as
/// "deleted": the next reconcile re-applies it, label included. An autoscaled
/// PulsarConsumer is also reconciled after a read of its backlog that matters
/// (`poll::worth_a_reconcile`).
pub fn controller(scope: &Scope, ctx: &Context) -> Controller<PulsarConsumer> {
    let managed = format!("app.kubernetes.io/managed-by={}", OPERATOR.name);
    let (deployments, deployment_events) =
        scope.reflect::<Slim<Deployment>>(watcher::Config::default().labels(&managed));
    ctx.deployments.insert(scope, deployments);
    let (consumers, consumer_events) = scope.reflect::<PulsarConsumer>(watcher::Config::default());
    ctx.pollers.consumers().insert(scope, consumers.clone());
    Controller::for_stream(consumer_events, consumers)
        .owns_stream(deployment_events)
        .reconcile_on(ctx.pollers.triggers(scope.namespace().map(str::to_owned)))
}

/// Applies the Deployment of one PulsarConsumer (no write when the cached one matches) with
/// `spec.replicas` consumers, or as many as the autoscaler decides from the latest backlog
/// read, and records what it runs in the status.
///
/// # Errors
/// [`Error`] on API failures; the runner retries with per-object backoff.
pub async fn reconcile(pc: Arc<PulsarConsumer>, ctx: Arc<Context>) -> Result<Action, Error> {
    let Some(ns) = pc.namespace() else {
        return Ok(Action::await_change());
    };
    let key = format!("{ns}/{}", pc.name_any());
    if pc.metadata.deletion_timestamp.is_some() {
        // Garbage collection removes the Deployment through its owner reference.
        ctx.forget(&pc);
        return Ok(Action::await_change());
    }
    let name = desired::deployment_name(&pc);
    let mut children = Children::new(&ctx.toolkit.client, ctx.toolkit.operator.name, pc.as_ref())?;
    let now = conditions::now();
    let mut scaling = None;
    let mut replicas = pc.spec.replicas;
    let owner = children.owner();
    // The count starts from the Deployment holding the name (if it is ours); someone
    // else's is never written, and reported.
    let deployment = children
        .apply_with(&name, ctx.deployments.find(&ns, &name), |current| {
            scaling = autoscale(&pc, &ctx, current, now);
            replicas = scaling
                .as_ref()
                .map_or(replicas, |(s, _)| s.decision.replicas);
            desired::desired_deployment(&pc, owner, &ctx.image, replicas)
        })
        .await?;
    if deployment.is_held_by_another() && deployment.is_problem() {
        ctx.forget(&pc);
    }
    let problem = children.problems().first().map(Problem::from);
    let deployment = deployment.into_object()?;
    let new_status = status::with_scaling(
        status::status(&pc, deployment.as_ref(), problem.as_ref(), replicas, now),
        pc.status.as_ref(),
        scaling.as_ref().map(|(s, _)| s),
        pc.metadata.generation,
        now,
    );
    ctx.toolkit
        .publish_status(pc.as_ref(), &new_status, &status::ANNOUNCED)
        .await?;
    if let Some((s, from)) = &scaling
        && problem.is_none()
    {
        announce_scale(&pc, &ctx, s, *from).await;
    }
    match problem {
        // Someone else's Deployment may be deleted without an event this operator watches
        // (it lacks our label): look again later, less and less often.
        Some(p) if p.reason == REASON_NAME_CONFLICT => {
            Ok(Action::requeue(ctx.conflicts.failed(&key)))
        }
        Some(p) => Err(Error::Rejected(p.message)),
        None => {
            // A leftover whose label was removed is out of the watch: looked at again.
            let recheck = children.leftover_recheck();
            if recheck.is_none() {
                ctx.conflicts.succeeded(&key);
            }
            Ok(recheck.map_or_else(Action::await_change, Action::requeue))
        }
    }
}

#[cfg(test)]
mod tests {
    //! Reconcile against a scripted API server: the answers a real cluster rarely gives.
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::fixtures::consumer;
    use shared_testing::{Reply, Scripted, assert_events, cache, reconcile_scripted, toolkit};

    const GET_DEPLOYMENT: &str = "GET /apis/apps/v1/namespaces/ns/deployments/orders-deployment";
    const APPLY_DEPLOYMENT: &str =
        "PATCH /apis/apps/v1/namespaces/ns/deployments/orders-deployment";
    const STATUS: &str = "PATCH /apis/pulsar.pulsarconsumer.krvarma.com/v1/namespaces/ns/pulsarconsumers/orders/status";
    const EVENT: &str = "POST /apis/events.k8s.io/v1/namespaces/ns/events";

    /// Reconciles `pc` against `replies`; returns the result and the scripted server.
    async fn run(pc: PulsarConsumer, replies: Vec<Reply>) -> (Result<Action, Error>, Scripted) {
        let context = |client| Context::new(toolkit(client, OPERATOR), None);
        reconcile_scripted(pc, replies, context, reconcile).await
    }

    /// Reconciles a PulsarConsumer of one replica whose Deployment is created and whose
    /// status write is answered `code` with `message`; asserts that nothing came after it.
    async fn run_status_answered(code: u16, message: &str) -> Result<Action, Error> {
        let replies = vec![
            Reply::error(404, "not found"),
            Reply::Echo,
            Reply::error(code, message),
        ];
        let (result, api) = run(consumer(1), replies).await;
        assert_eq!(api.lines(), [GET_DEPLOYMENT, APPLY_DEPLOYMENT, STATUS]);
        result
    }

    /// Reconciles a PulsarConsumer of one replica whose Deployment is absent and whose
    /// create is answered `code` with `message`; asserts that the status and one event were
    /// written after it (they succeed).
    async fn run_refused(code: u16, message: &str) -> (Result<Action, Error>, Scripted) {
        let pc = consumer(1);
        let replies = vec![
            Reply::error(404, "not found"),
            Reply::error(code, message),
            Reply::Object(serde_json::to_value(&pc).unwrap()),
            Reply::Echo,
        ];
        let (result, api) = run(pc, replies).await;
        assert_eq!(
            api.lines(),
            [GET_DEPLOYMENT, APPLY_DEPLOYMENT, STATUS, EVENT]
        );
        (result, api)
    }

    #[tokio::test]
    async fn its_deployment_rolled_out_completes_an_object_awaiting_ready() {
        use crate::fixtures::{counts, deployment};
        use shared::{Pacing, Progress};
        let pc = consumer(2);
        // Its progress with `cached` in the Deployments' cache.
        let progress = |cached: Vec<Deployment>| {
            let client = Scripted::new(Vec::new()).client();
            let ctx = Context::new(toolkit(client.clone(), OPERATOR), None);
            cache(&ctx.deployments, &client, cached);
            ctx.progress(&pc)
        };
        assert_eq!(progress(vec![]), Progress::Settled, "no Deployment cached");
        // Cached under its own name, `orders-deployment`, not the PulsarConsumer's.
        let rolling = deployment(&pc, counts(5, 2, 2, 1));
        assert_eq!(
            progress(vec![rolling]),
            Progress::Settled,
            "one of two ready"
        );
        let rolled_out = deployment(&pc, counts(5, 2, 2, 2));
        assert_eq!(progress(vec![rolled_out]), Progress::Completes);
    }

    #[tokio::test]
    async fn a_refused_deployment_is_reported_and_retried() {
        for (code, message) in [
            (
                403,
                "deployments.apps \"orders-deployment\" is forbidden: exceeded quota",
            ),
            (422, "Deployment.apps \"orders-deployment\" is invalid"),
        ] {
            let (result, api) = run_refused(code, message).await;
            assert!(
                matches!(result, Err(Error::Rejected(ref m)) if m.contains(message)),
                "{result:?}"
            );
            assert_events(&api, &[("Warning", "DeploymentRejected")]);
        }
    }

    #[tokio::test]
    async fn a_namespace_being_deleted_is_no_error() {
        let message = "deployments.apps \"orders-deployment\" is forbidden: unable to create new content in namespace ns because it is being terminated";
        let (result, api) = run_refused(403, message).await;
        assert_eq!(result.unwrap(), Action::await_change());
        // The status still says what is (no Deployment), with a Normal event.
        assert_events(&api, &[("Normal", "DeploymentMissing")]);
    }

    #[tokio::test]
    async fn status_write_404_is_no_error() {
        let result = run_status_answered(404, "not found").await;
        assert_eq!(result.unwrap(), Action::await_change());
    }

    #[tokio::test]
    async fn status_write_409_is_retried() {
        let result = run_status_answered(409, "the object has been modified").await;
        assert!(
            matches!(
                result,
                Err(Error::Shared(shared::Error::Kube(kube::Error::Api(ref s)))) if s.code == 409
            ),
            "{result:?}"
        );
    }

    /// Reconciles `pc` with `deployment` in the cache.
    async fn run_cached(
        pc: PulsarConsumer,
        deployment: Deployment,
        replies: Vec<Reply>,
    ) -> (Result<Action, Error>, Scripted) {
        let context = |client: kube::Client| {
            let ctx = Context::new(toolkit(client.clone(), OPERATOR), None);
            cache(&ctx.deployments, &client, [deployment]);
            ctx
        };
        reconcile_scripted(pc, replies, context, reconcile).await
    }

    /// The Deployment `pc` wants, as the cache shows it once written.
    fn in_sync(pc: &PulsarConsumer) -> Deployment {
        let owner = shared::apply::owner_reference(pc).unwrap();
        desired::desired_deployment(pc, owner, desired::DEFAULT_IMAGE, pc.spec.replicas)
    }

    #[tokio::test]
    async fn a_deployment_in_sync_costs_no_request() {
        let pc = consumer(1);
        let deployment = in_sync(&pc);
        let replies = vec![
            Reply::Object(serde_json::to_value(&pc).unwrap()),
            Reply::Echo,
        ];
        let (result, api) = run_cached(pc, deployment, replies).await;
        assert_eq!(result.unwrap(), Action::await_change());
        assert_eq!(api.lines()[0], STATUS, "only the status: {:?}", api.lines());
        assert!(
            api.lines()[1..].iter().all(|l| l == EVENT),
            "{:?}",
            api.lines()
        );
    }

    #[tokio::test]
    async fn a_name_held_by_a_stranger_is_a_condition_looked_at_again() {
        let pc = consumer(1);
        let mut deployment = in_sync(&pc);
        deployment.metadata.owner_references = None;
        let replies = vec![
            Reply::Object(serde_json::to_value(&pc).unwrap()),
            Reply::Echo,
        ];
        let (result, api) = run_cached(pc, deployment, replies).await;
        assert_eq!(
            result.unwrap(),
            Action::requeue(std::time::Duration::from_secs(5))
        );
        assert_eq!(api.lines(), [STATUS, EVENT], "never written");
        assert_events(&api, &[("Warning", "NameConflict")]);
    }

    #[tokio::test]
    async fn a_leftover_deployment_is_waited_for() {
        let pc = consumer(1);
        let mut deployment = in_sync(&pc);
        deployment.metadata.owner_references.as_mut().unwrap()[0].uid = "uid-0".into();
        let replies = vec![
            Reply::Object(serde_json::to_value(&pc).unwrap()),
            Reply::Echo,
        ];
        let (result, api) = run_cached(pc, deployment, replies).await;
        assert_eq!(
            result.unwrap(),
            Action::requeue(shared::ownership::LEFTOVER_RECHECK)
        );
        assert_eq!(api.lines()[0], STATUS, "never written: {:?}", api.lines());
    }
}
