//! The status that describes a PulsarConsumer's Deployment and what the autoscaler read and
//! decided, and which condition changes are announced with events. Pure; unit-tested below.

use k8s_openapi::{
    api::apps::v1::Deployment,
    apimachinery::pkg::apis::meta::v1::{Condition, Time},
};
use shared::{
    conditions::{Conditions, HasConditions},
    events::Announce,
};

use crate::{
    api::{PulsarConsumer, PulsarConsumerStatus},
    desired::{deployed_settings, selector},
};

/// Reason of `Ready=False`/`Progressing=False` when the API server refused the Deployment.
pub const REASON_REJECTED: &str = "DeploymentRejected";
/// Reason of `Ready=False`/`Progressing=False` when the Deployment's name is held by a
/// Deployment this PulsarConsumer does not control (left untouched).
pub const REASON_NAME_CONFLICT: &str = shared::ownership::REASON_NAME_CONFLICT;

/// Why the Deployment cannot be written: a problem for the user to fix, reported in the
/// conditions with one Warning event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Problem {
    /// [`REASON_REJECTED`] or [`REASON_NAME_CONFLICT`].
    pub reason: &'static str,
    /// What is wrong, for the conditions' message.
    pub message: String,
}

impl Problem {
    /// The API server refused the Deployment with `message`.
    #[must_use]
    pub fn rejected(message: &str) -> Self {
        Self {
            reason: REASON_REJECTED,
            message: format!("the API server refused the Deployment: {message}"),
        }
    }

    /// The Deployment's name is held by someone else's Deployment.
    #[must_use]
    pub fn name_conflict(conflict: &shared::ownership::NameConflict) -> Self {
        Self {
            reason: REASON_NAME_CONFLICT,
            message: conflict.message(),
        }
    }
}

impl From<&shared::children::Problem> for Problem {
    /// The Deployment's name held by someone else's, or the API server refusing it.
    fn from(problem: &shared::children::Problem) -> Self {
        match problem {
            shared::children::Problem::NameConflict(c) => Self::name_conflict(c),
            shared::children::Problem::Refused(r) => Self::rejected(r.message()),
        }
    }
}

/// Whether the Deployment controller has seen `deployment`'s latest spec.
fn seen(deployment: &Deployment) -> bool {
    let observed = deployment
        .status
        .as_ref()
        .and_then(|s| s.observed_generation);
    observed.is_some() && observed >= deployment.metadata.generation
}

/// Whether `deployment` has rolled out to `want` consumers: its latest spec seen, and
/// `want` pods, all updated and ready ([`status`] says `Ready` when this holds and nothing
/// refused a write).
#[must_use]
pub fn is_rolled_out(deployment: &Deployment, want: i32) -> bool {
    let want = Some(want.max(0));
    seen(deployment)
        && deployment.status.as_ref().is_some_and(|s| {
            s.updated_replicas.or(Some(0)) == want
                && s.replicas.or(Some(0)) == want
                && s.ready_replicas.or(Some(0)) == want
        })
}

/// The status describing `deployment` (the PulsarConsumer's Deployment as last written or
/// observed; `None` when there is none), keeping `lastTransitionTime` of unchanged conditions.
/// `problem` is why the Deployment could not be written, if it could not; `replicas` the
/// consumers wanted (`spec.replicas`, or the autoscaler's count).
#[must_use]
pub fn status(
    pc: &PulsarConsumer,
    deployment: Option<&Deployment>,
    problem: Option<&Problem>,
    replicas: i32,
    now: jiff::Timestamp,
) -> PulsarConsumerStatus {
    let generation = pc.metadata.generation;
    let want = replicas.max(0);
    let settings = deployment.map(deployed_settings).unwrap_or_default();
    let observed = deployment
        .and_then(|d| d.status.clone())
        .unwrap_or_default();
    let current = observed.replicas.unwrap_or(0);
    let ready = observed.ready_replicas.unwrap_or(0);
    let updated = observed.updated_replicas.unwrap_or(0);
    let seen = deployment.is_some_and(seen);
    let deadline_exceeded = observed.conditions.iter().flatten().find(|c| {
        c.type_ == "Progressing" && c.reason.as_deref() == Some("ProgressDeadlineExceeded")
    });
    let rolled_out = deployment.is_some_and(|d| is_rolled_out(d, want));
    let counts = format!("{ready}/{want} consumers ready");

    let (ready_cond, progressing) = if let Some(p) = problem {
        (
            (false, p.reason, p.message.clone()),
            (false, p.reason, p.message.clone()),
        )
    } else if deployment.is_none() {
        let msg = "the Deployment does not exist yet".to_owned();
        (
            (false, "DeploymentMissing", msg.clone()),
            (true, "Creating", msg),
        )
    } else if rolled_out {
        (
            (true, "ConsumersReady", counts),
            (
                false,
                "RolloutComplete",
                format!("{want} consumers run the current spec and are ready"),
            ),
        )
    } else {
        let not_ready = (
            false,
            "ConsumersNotReady",
            format!("{counts} (a consumer is ready while it is connected to the broker)"),
        );
        let progressing = if let Some(c) = deadline_exceeded {
            (
                false,
                "ProgressDeadlineExceeded",
                c.message.clone().unwrap_or_default(),
            )
        } else if !seen || updated < want {
            (
                true,
                "RollingOut",
                format!("{updated} of {want} consumers run the current spec"),
            )
        } else if current != want {
            (
                true,
                "Scaling",
                format!("{current} consumer pods exist, {want} wanted"),
            )
        } else {
            (true, "WaitingForConsumers", counts)
        };
        (not_ready, progressing)
    };

    let old = pc.status.as_ref().map(HasConditions::conditions);
    let conditions = [("Ready", ready_cond), ("Progressing", progressing)]
        .into_iter()
        .fold(
            Conditions::new(old.unwrap_or_default(), generation, now),
            |c, (type_, (status, reason, message))| c.set(type_, status, reason, message),
        )
        .into_vec();

    PulsarConsumerStatus {
        server: settings.server,
        topic: settings.topic,
        subscription: settings.subscription,
        replicas: ready,
        current_replicas: current,
        selector: selector(pc),
        observed_generation: generation,
        backlog: None,
        desired_replicas: None,
        last_scale_time: None,
        conditions,
    }
}

/// Condition type: the backlog can be read (`False`: the replicas are left as they are).
pub const SCALING_ACTIVE: &str = "ScalingActive";
/// Condition type: the backlog asks for more than `maxReplicas` or fewer than `minReplicas`.
pub const SCALING_LIMITED: &str = "ScalingLimited";
/// `ScalingActive=True` reason.
pub const REASON_BACKLOG_READ: &str = "BacklogRead";

/// `ScalingActive=False` reason: the topic or admin URL cannot be used (the schema rejects
/// such specs; kept for objects stored before it did).
pub const REASON_INVALID_AUTOSCALING: &str = "InvalidAutoscaling";

/// `ScalingActive=False` reasons: announced as Warning events. Their messages are fixed
/// (`admin::AdminError`): nothing an admin API answered is in them, and every failed read
/// has the same reason and message ([`crate::admin::REASON_UNAVAILABLE`]), so a status
/// does not tell one target from another. The others depend on the spec alone.
pub const SCALING_WARNINGS: [&str; 3] = [
    crate::admin::REASON_UNAVAILABLE,
    crate::admin::REASON_TARGET_NOT_ALLOWED,
    REASON_INVALID_AUTOSCALING,
];

/// The conditions announced with events: `Ready` whenever its status changes, and with a
/// Warning when the Deployment is first refused or its name found taken (even if `Ready`
/// was already `False`, e.g. during a rollout); `ScalingActive` whenever its status
/// changes (a Warning when the backlog cannot be read).
pub const ANNOUNCED: [Announce; 2] = [
    Announce::normal_true("Ready")
        .warnings(&PROBLEMS)
        .on_entry(&PROBLEMS),
    Announce::normal_true(SCALING_ACTIVE).warnings(&SCALING_WARNINGS),
];

/// The `Ready=False` reasons that are a problem for the user to fix.
const PROBLEMS: [&str; 2] = [REASON_REJECTED, REASON_NAME_CONFLICT];

impl HasConditions for PulsarConsumerStatus {
    fn conditions(&self) -> &[Condition] {
        &self.conditions
    }
}

/// What the autoscaler read and decided, for the status.
#[derive(Debug, Clone, PartialEq)]
pub struct Scaling {
    /// The latest read of the backlog: the backlog, or why it failed (reason, message);
    /// `None` before the first read.
    pub reading: Option<Result<u64, (&'static str, String)>>,
    /// What the autoscaler decided.
    pub decision: crate::autoscale::Decision,
    /// The settings it decided with.
    pub policy: crate::autoscale::Policy,
}

/// `status` with the autoscaler's fields and conditions (`scaling`), or without any of them
/// when autoscaling is off (`None`). `old` is the status before, for what is kept:
/// the last backlog read when a read fails, `lastScaleTime` unless the count changes now,
/// `ScalingActive` before the first read.
#[must_use]
pub fn with_scaling(
    mut status: PulsarConsumerStatus,
    old: Option<&PulsarConsumerStatus>,
    scaling: Option<&Scaling>,
    generation: Option<i64>,
    now: jiff::Timestamp,
) -> PulsarConsumerStatus {
    let Some(scaling) = scaling else {
        status.conditions = Conditions::new(&status.conditions, generation, now)
            .remove(SCALING_ACTIVE)
            .remove(SCALING_LIMITED)
            .into_vec();
        status.backlog = None;
        status.desired_replicas = None;
        status.last_scale_time = None;
        return status;
    };
    let old_backlog = old.and_then(|o| o.backlog);
    let old_desired = old.and_then(|o| o.desired_replicas);
    let replicas = scaling.decision.replicas;
    status.desired_replicas = Some(replicas);
    status.last_scale_time = match old_desired {
        Some(before) if before != replicas => Some(Time(now)),
        _ => old.and_then(|o| o.last_scale_time.clone()),
    };
    status.backlog = match &scaling.reading {
        Some(Ok(backlog)) => Some(i64::try_from(*backlog).unwrap_or(i64::MAX)),
        _ => old_backlog,
    };
    let conditions = Conditions::new(&status.conditions, generation, now);
    let conditions = match &scaling.reading {
        None => conditions,
        Some(Ok(backlog)) => conditions.set(
            SCALING_ACTIVE,
            true,
            REASON_BACKLOG_READ,
            format!(
                "the backlog is read from the Pulsar admin API; {} wanted at {} per consumer",
                crate::autoscale::replicas_for(*backlog, scaling.policy.target),
                scaling.policy.target
            ),
        ),
        Some(Err((reason, message))) => conditions.set(
            SCALING_ACTIVE,
            false,
            reason,
            format!("{message}; the consumers are left at {replicas}"),
        ),
    };
    let p = &scaling.policy;
    let (limited, message) = match scaling.decision.limit {
        crate::autoscale::Limit::TooMany => (
            true,
            format!(
                "the backlog asks for more consumers than maxReplicas ({})",
                p.max
            ),
        ),
        crate::autoscale::Limit::TooFew => (
            true,
            format!(
                "the backlog asks for fewer consumers than minReplicas ({})",
                p.min
            ),
        ),
        crate::autoscale::Limit::WithinRange => (
            false,
            format!("the consumers wanted are within {}..{}", p.min, p.max),
        ),
    };
    status.conditions = conditions
        .set(
            SCALING_LIMITED,
            limited,
            scaling.decision.limit.reason(),
            message,
        )
        .into_vec();
    status
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::fixtures::{consumer, counts, deployment, t};
    use k8s_openapi::api::apps::v1::DeploymentCondition;
    use shared::conditions::{find, is_true};

    #[test]
    fn status_follows_the_rollout() {
        let mut pc = consumer(2);
        // Just applied: the Deployment controller has not seen it yet.
        let s = status(
            &pc,
            Some(&deployment(&pc, counts(4, 0, 0, 0))),
            None,
            pc.spec.replicas,
            t(10),
        );
        assert_eq!(s.server, "pulsar://broker:6650");
        assert_eq!(s.topic, "my-topic");
        assert_eq!(s.subscription, "first-subscription");
        assert_eq!((s.replicas, s.current_replicas), (0, 0));
        assert_eq!(s.observed_generation, Some(2));
        assert!(!is_true(&s.conditions, "Ready"));
        assert_eq!(
            find(&s.conditions, "Progressing").unwrap().reason,
            "RollingOut"
        );

        pc.status = Some(s);
        let s = status(
            &pc,
            Some(&deployment(&pc, counts(5, 2, 2, 1))),
            None,
            pc.spec.replicas,
            t(20),
        );
        assert_eq!((s.replicas, s.current_replicas), (1, 2));
        assert_eq!(
            find(&s.conditions, "Progressing").unwrap().reason,
            "WaitingForConsumers"
        );
        assert_eq!(
            find(&s.conditions, "Ready").unwrap().last_transition_time.0,
            t(10)
        );

        pc.status = Some(s);
        let s = status(
            &pc,
            Some(&deployment(&pc, counts(5, 2, 2, 2))),
            None,
            pc.spec.replicas,
            t(30),
        );
        assert!(is_true(&s.conditions, "Ready"));
        assert!(!is_true(&s.conditions, "Progressing"));
        assert_eq!(
            find(&s.conditions, "Ready").unwrap().last_transition_time.0,
            t(30)
        );

        // The same observation again: an identical status, so no write.
        pc.status = Some(s.clone());
        let again = status(
            &pc,
            Some(&deployment(&pc, counts(5, 2, 2, 2))),
            None,
            pc.spec.replicas,
            t(40),
        );
        assert_eq!(again, s);

        // An old pod still around (rolling update): not ready yet.
        let s = status(
            &pc,
            Some(&deployment(&pc, counts(5, 3, 2, 2))),
            None,
            pc.spec.replicas,
            t(50),
        );
        assert!(!is_true(&s.conditions, "Ready"));
        assert_eq!(
            find(&s.conditions, "Progressing").unwrap().reason,
            "Scaling"
        );
    }

    #[test]
    fn scaled_to_zero_is_ready() {
        let pc = consumer(0);
        let s = status(
            &pc,
            Some(&deployment(&pc, counts(5, 0, 0, 0))),
            None,
            pc.spec.replicas,
            t(1),
        );
        assert!(is_true(&s.conditions, "Ready"));
    }

    #[test]
    fn stuck_and_rejected() {
        let pc = consumer(1);
        let mut observed = counts(5, 1, 1, 0);
        observed.conditions = Some(vec![DeploymentCondition {
            type_: "Progressing".into(),
            status: "False".into(),
            reason: Some("ProgressDeadlineExceeded".into()),
            message: Some("ReplicaSet has timed out progressing.".into()),
            ..DeploymentCondition::default()
        }]);
        let s = status(&pc, Some(&deployment(&pc, observed)), None, 1, t(1));
        let p = find(&s.conditions, "Progressing").unwrap();
        assert_eq!(
            (p.status.as_str(), p.reason.as_str()),
            ("False", "ProgressDeadlineExceeded")
        );

        let s = status(
            &pc,
            None,
            Some(&Problem::rejected("exceeded quota")),
            pc.spec.replicas,
            t(1),
        );
        let r = find(&s.conditions, "Ready").unwrap();
        assert_eq!(r.reason, REASON_REJECTED);
        assert!(r.message.contains("exceeded quota"));
        assert_eq!(s.server, "");

        let conflict = shared::ownership::NameConflict {
            kind: "Deployment".into(),
            name: "orders-deployment".into(),
            owner_kind: "PulsarConsumer".into(),
        };
        let s = status(
            &pc,
            None,
            Some(&Problem::name_conflict(&conflict)),
            pc.spec.replicas,
            t(2),
        );
        for type_ in ["Ready", "Progressing"] {
            let c = find(&s.conditions, type_).unwrap();
            assert_eq!(
                (c.status.as_str(), c.reason.as_str()),
                ("False", "NameConflict")
            );
            assert!(
                c.message.contains("Deployment orders-deployment"),
                "{}",
                c.message
            );
        }
    }

    #[test]
    fn scaling_status_and_conditions() {
        use crate::autoscale::{Decision, Limit, Policy, Why};
        let pc = consumer(1);
        let policy = Policy {
            min: 0,
            max: 3,
            target: 2000,
            window: 10,
            up: None,
            down: None,
        };
        let decision = |replicas: i32, limit: Limit| Decision {
            replicas,
            recommendation: Some(replicas),
            limit,
            why: Why::Up,
        };
        let base = status(&pc, None, None, 3, t(1));

        // First read: 20,000 waiting asks for 10, limited to 3.
        let scaling = Scaling {
            reading: Some(Ok(20_000)),
            decision: decision(3, Limit::TooMany),
            policy: policy.clone(),
        };
        let s1 = with_scaling(base.clone(), None, Some(&scaling), Some(2), t(10));
        assert_eq!((s1.backlog, s1.desired_replicas), (Some(20_000), Some(3)));
        assert_eq!(s1.last_scale_time, None, "the first count is no rescale");
        let active = find(&s1.conditions, SCALING_ACTIVE).unwrap();
        assert_eq!(
            (active.status.as_str(), active.reason.as_str()),
            ("True", "BacklogRead")
        );
        assert!(
            active.message.contains("10 wanted at 2000"),
            "{}",
            active.message
        );
        let limited = find(&s1.conditions, SCALING_LIMITED).unwrap();
        assert_eq!(
            (limited.status.as_str(), limited.reason.as_str()),
            ("True", "TooManyReplicas")
        );

        // Drained and scaled to zero: lastScaleTime moves, no longer limited.
        let mut base2 = base.clone();
        base2.conditions = s1.conditions.clone();
        let scaling = Scaling {
            reading: Some(Ok(0)),
            decision: decision(0, Limit::WithinRange),
            policy: policy.clone(),
        };
        let s2 = with_scaling(base2.clone(), Some(&s1), Some(&scaling), Some(2), t(30));
        assert_eq!((s2.backlog, s2.desired_replicas), (Some(0), Some(0)));
        assert_eq!(s2.last_scale_time, Some(Time(t(30))));
        assert!(!is_true(&s2.conditions, SCALING_LIMITED));

        // The admin API goes away: ScalingActive=False with the reason, the last backlog and
        // the count kept, lastScaleTime unchanged.
        let mut base3 = base.clone();
        base3.conditions = s2.conditions.clone();
        let scaling = Scaling {
            reading: Some(Err((
                crate::admin::REASON_UNAVAILABLE,
                crate::admin::UNAVAILABLE_MESSAGE.into(),
            ))),
            decision: Decision {
                replicas: 0,
                recommendation: None,
                limit: Limit::WithinRange,
                why: Why::NoReading,
            },
            policy: policy.clone(),
        };
        let s3 = with_scaling(base3, Some(&s2), Some(&scaling), Some(2), t(40));
        assert_eq!((s3.backlog, s3.desired_replicas), (Some(0), Some(0)));
        assert_eq!(s3.last_scale_time, Some(Time(t(30))));
        let active = find(&s3.conditions, SCALING_ACTIVE).unwrap();
        assert_eq!(
            (active.status.as_str(), active.reason.as_str()),
            ("False", "AdminAPIUnavailable")
        );
        assert!(
            active
                .message
                .starts_with(crate::admin::UNAVAILABLE_MESSAGE),
            "{}",
            active.message
        );
        assert!(active.message.contains("left at 0"), "{}", active.message);

        // Autoscaling removed: every trace goes.
        let mut base4 = base;
        base4.conditions = s3.conditions.clone();
        let s4 = with_scaling(base4, Some(&s3), None, Some(3), t(50));
        assert_eq!(
            (s4.backlog, s4.desired_replicas, s4.last_scale_time),
            (None, None, None)
        );
        assert!(find(&s4.conditions, SCALING_ACTIVE).is_none());
        assert!(find(&s4.conditions, SCALING_LIMITED).is_none());
        assert!(find(&s4.conditions, "Ready").is_some());
    }

    #[test]
    fn announced_transitions() {
        use shared::events::announcements;
        let summary = |old: &[Condition], new: &[Condition]| {
            announcements(old, new, &ANNOUNCED)
                .into_iter()
                .map(|e| (e.action, e.reason, e.warning))
                .collect::<Vec<_>>()
        };
        let ready =
            |status, reason| Conditions::new(&[], Some(1), t(1)).set("Ready", status, reason, "m");
        let rolling = ready(false, "ConsumersNotReady").into_vec();
        let rejected = ready(false, REASON_REJECTED).into_vec();
        let conflict = ready(false, REASON_NAME_CONFLICT).into_vec();
        // Into a problem from another False reason: a Warning; staying in it: nothing.
        assert_eq!(
            summary(&rolling, &rejected),
            [("ReadyChanged".into(), REASON_REJECTED.into(), true)]
        );
        assert!(summary(&rejected, &rejected).is_empty());
        assert_eq!(
            summary(&rejected, &conflict),
            [("ReadyChanged".into(), REASON_NAME_CONFLICT.into(), true)]
        );
        // Out of it to another False reason: nothing; to True: Normal.
        assert!(summary(&rejected, &rolling).is_empty());
        let up = ready(true, "ConsumersReady").into_vec();
        assert_eq!(
            summary(&rejected, &up),
            [("ReadyChanged".into(), "ConsumersReady".into(), false)]
        );

        // ScalingActive: each status change; a Warning when the backlog cannot be read,
        // but not again for another failure while it stays False. ScalingLimited: never.
        let scaling = |status, reason| {
            Conditions::new(&up, Some(1), t(1))
                .set(SCALING_ACTIVE, status, reason, "m")
                .set(SCALING_LIMITED, status, "TooManyReplicas", "m")
                .into_vec()
        };
        let read = scaling(true, REASON_BACKLOG_READ);
        let unavailable = scaling(false, "AdminAPIUnavailable");
        assert_eq!(
            summary(&up, &read),
            [(
                "ScalingActiveChanged".into(),
                REASON_BACKLOG_READ.into(),
                false
            )]
        );
        assert_eq!(
            summary(&read, &unavailable),
            [(
                "ScalingActiveChanged".into(),
                "AdminAPIUnavailable".into(),
                true
            )]
        );
        // Another False reason while it stays False (the spec turned the target into a
        // refused one): no second Warning.
        assert!(
            summary(
                &unavailable,
                &scaling(false, crate::admin::REASON_TARGET_NOT_ALLOWED)
            )
            .is_empty()
        );
    }
}
