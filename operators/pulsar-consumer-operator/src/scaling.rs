//! The autoscaler in a reconcile (`spec.autoscaling`): where and how often the backlog is
//! read ([`poll`]), the decision on the latest reading ([`autoscale::decide`], with the
//! history this process keeps of each object), and the event that announces a scale.
//! Without `spec.autoscaling` there is none, and the object's poller stops.

use std::time::Duration;

use k8s_openapi::api::apps::v1::Deployment;
use kube::runtime::events::EventType;

use crate::{
    admin,
    api::{Autoscaling, PulsarConsumer},
    autoscale::{self, Decision, History, Policy, Reading, Why},
    poll,
    reconcile::Context,
    status::{REASON_INVALID_AUTOSCALING, Scaling},
};

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
pub fn autoscale(
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

/// Logs and announces (a Normal `Scaled` event) the scale of `pc` from `from` consumers
/// to the count `s` decided, when that is a change.
pub async fn announce_scale(pc: &PulsarConsumer, ctx: &Context, s: &Scaling, from: i32) {
    if s.decision.replicas == from {
        return;
    }
    let note = scale_note(from, s);
    tracing::info!(from, to = s.decision.replicas, "{note}");
    // The recorder folds events with the same reason and action into one
    // series (keeping the first note): the action names the change, so
    // every different scale is an event of its own.
    let action = format!("Scale{from}To{}", s.decision.replicas);
    ctx.toolkit
        .events
        .publish(pc, EventType::Normal, "Scaled", &note, &action)
        .await;
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
