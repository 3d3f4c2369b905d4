//! The controller: [`Context`], [`controller`] (what is watched), [`reconcile`] and [`Error`].
//!
//! The error policy is the common runner's (`shared::run`): a failed reconcile is retried
//! with per-object exponential backoff (1 s doubling to 5 min), never in a hot loop. A
//! Deployment name held by someone else's Deployment is never written to
//! (`shared::ownership`): it is a condition (`NameConflict`) looked at again with a backoff
//! of its own.

use std::{sync::Arc, time::Duration};

use k8s_openapi::api::apps::v1::Deployment;
use kube::{
    ResourceExt,
    runtime::{Controller, controller::Action, events::EventType, watcher},
};
use shared::{
    ErrorBackoff, Scope, Toolkit, children::Children, conditions, namespaces::ScopedStores,
    slim::Slim,
};

use crate::{
    OPERATOR, admin,
    api::{Autoscaling, PulsarConsumer},
    autoscale::{self, Decision, History, Policy, Reading, Why},
    desired,
    options::Options,
    poll::{self, Pollers},
    status::{self, Problem, REASON_INVALID_AUTOSCALING, REASON_NAME_CONFLICT, Scaling},
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
        let Some(ns) = shared::run::awaiting_ready(pc) else {
            return shared::Progress::Settled;
        };
        let done = match self.deployments.find_full(&ns, &pc.name_any()) {
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
        toolkit
            .metrics
            .add_object_gauges(Arc::new(crate::metrics::StatusGauges {
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
    fn forget(&self, pc: &PulsarConsumer) {
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
        && s.decision.replicas != *from
        && problem.is_none()
    {
        let note = scale_note(*from, s);
        tracing::info!(from, to = s.decision.replicas, "{note}");
        // The recorder folds events with the same reason and action into one
        // series (keeping the first note): the action names the change, so
        // every different scale is an event of its own.
        let action = format!("Scale{from}To{}", s.decision.replicas);
        ctx.toolkit
            .events
            .publish(pc.as_ref(), EventType::Normal, "Scaled", &note, &action)
            .await;
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

/// Where and how often to read the backlog of `pc`: every `pollIntervalSeconds`, but not
/// more often than every `min_interval` (the operator's floor).
fn poll_settings(
    pc: &PulsarConsumer,
    a: &Autoscaling,
    min_interval: Duration,
) -> Result<poll::Settings, String> {
    let topic = admin::parse_topic(&pc.spec.topic)
        .ok_or_else(|| format!("the topic {:?} cannot be parsed", pc.spec.topic))?;
    let admin_url = match a.admin_url.as_deref().filter(|u| !u.is_empty()) {
        Some(url) => url.trim_end_matches('/').to_owned(),
        None => admin::default_admin_url(&pc.spec.server_address).ok_or_else(|| {
            format!(
                "no admin URL can be derived from {:?}; set spec.autoscaling.adminUrl",
                pc.spec.server_address
            )
        })?,
    };
    Ok(poll::Settings {
        target: admin::Target {
            admin_url,
            topic,
            subscription: pc.spec.subscription_name.clone(),
        },
        interval: Duration::from_secs(u64::try_from(a.poll_interval_seconds.max(1)).unwrap_or(15))
            .max(min_interval),
    })
}

/// The autoscaler's decision for `pc` (none without `spec.autoscaling`, which also stops its
/// poller), from the latest backlog read, and the count it started from. `deployment` is
/// ours, as cached.
fn autoscale(
    pc: &PulsarConsumer,
    ctx: &Context,
    deployment: Option<&Deployment>,
    now: jiff::Timestamp,
) -> Option<(Scaling, i32)> {
    let Some(spec) = pc.spec.autoscaling.as_ref() else {
        ctx.forget(pc);
        return None;
    };
    let policy = Policy::from_spec(spec);
    let observation = match poll_settings(pc, spec, ctx.min_poll_interval) {
        Ok(settings) => ctx.pollers.ensure(pc, settings),
        Err(message) => {
            ctx.pollers.stop(pc);
            return Some(no_reading(pc, ctx, &policy, deployment, now, message));
        }
    };
    let reading = observation.as_ref().and_then(|o| {
        o.result
            .as_ref()
            .ok()
            .map(|&backlog| Reading { at: o.at, backlog })
    });
    let (decision, current) = decide(pc, ctx, &policy, deployment, reading, now);
    Some((
        Scaling {
            reading: observation.map(|o| o.result.map_err(|e| (e.reason(), e.to_string()))),
            decision,
            policy,
        },
        current,
    ))
}

/// The decision when the settings cannot be used: the replicas as they are.
fn no_reading(
    pc: &PulsarConsumer,
    ctx: &Context,
    policy: &Policy,
    deployment: Option<&Deployment>,
    now: jiff::Timestamp,
    message: String,
) -> (Scaling, i32) {
    let (decision, current) = decide(pc, ctx, policy, deployment, None, now);
    (
        Scaling {
            reading: Some(Err((REASON_INVALID_AUTOSCALING, message))),
            decision,
            policy: policy.clone(),
        },
        current,
    )
}

/// The autoscaler's decision for `pc` on `reading` (`None`: no usable reading), made with
/// and recorded in the history this process keeps of `pc` (a fresh one when it keeps
/// none); returns it with the replica count it started from ([`current_replicas`]).
fn decide(
    pc: &PulsarConsumer,
    ctx: &Context,
    policy: &Policy,
    deployment: Option<&Deployment>,
    reading: Option<Reading>,
    now: jiff::Timestamp,
) -> (Decision, i32) {
    let decide = |history: &mut History| {
        let current = current_replicas(pc, history, policy, deployment);
        let decision = autoscale::decide(policy, history, current, reading, now.as_second());
        history.replicas = Some(decision.replicas);
        (decision, current)
    };
    ctx.pollers
        .with_history(pc, decide)
        .unwrap_or_else(|| decide(&mut History::default()))
}

/// The count the autoscaler starts from: its own last decision in this process, else the
/// one recorded in the status, else the Deployment's, else [`Policy::initial`].
fn current_replicas(
    pc: &PulsarConsumer,
    history: &History,
    policy: &Policy,
    deployment: Option<&Deployment>,
) -> i32 {
    history
        .replicas
        .or_else(|| pc.status.as_ref().and_then(|s| s.desired_replicas))
        .or_else(|| {
            deployment
                .and_then(|d| d.spec.as_ref())
                .and_then(|s| s.replicas)
        })
        .unwrap_or_else(|| policy.initial())
}

/// What a scale event says.
fn scale_note(from: i32, s: &Scaling) -> String {
    let to = s.decision.replicas;
    let p = &s.policy;
    let backlog = match &s.reading {
        Some(Ok(b)) => format!("backlog {b}, {} per consumer", p.target),
        _ => "backlog unknown".to_owned(),
    };
    let why = match s.decision.why {
        Why::Up | Why::Steady => "scaled up at once".to_owned(),
        Why::Down => format!("nothing higher wanted within the last {}s", p.window),
        Why::Stabilizing => "held by the stabilization window".to_owned(),
        Why::StepLimited => "limited by the step limit of the period".to_owned(),
        Why::NoReading => format!(
            "brought within minReplicas..maxReplicas ({}..{})",
            p.min, p.max
        ),
    };
    format!("scaled the consumers from {from} to {to}: {backlog}; {why}")
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
