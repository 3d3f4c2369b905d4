//! Pure builders: the Deployment a PulsarConsumer wants, what a Deployment runs with, and the
//! status that describes it. No client here; unit-tested below.

use std::collections::BTreeMap;

use k8s_openapi::{
    api::{
        apps::v1::Deployment,
        core::v1::{Container, ContainerPort, EnvVar, HTTPGetAction, Probe, ResourceRequirements},
    },
    apimachinery::pkg::{
        api::resource::Quantity,
        apis::meta::v1::{ObjectMeta, OwnerReference, Time},
        util::intstr::IntOrString,
    },
};
use kube::ResourceExt;
use shared::conditions::{new_condition, set_condition};
use shared::pod_security::{restricted_container_security_context, restricted_deployment};

use crate::{
    OPERATOR,
    api::{PulsarConsumer, PulsarConsumerStatus},
};

/// The `app.kubernetes.io/name` of the consumers.
pub const APP: &str = "pulsar-consumer";
/// The consumer container's name (as in the original operator).
pub const CONTAINER: &str = "pulsarconsumer";
/// The consumer image when the operator's `PULSAR_CONSUMER_IMAGE` is unset or empty.
pub const DEFAULT_IMAGE: &str = "pulsar-consumer:latest";
/// The consumer's `/healthz` and `/metrics` port (its `HTTP_BIND_ADDRESS` default).
pub const HTTP_PORT: i32 = 8080;
/// The non-root user the consumers run as (the image's `nonroot` user).
pub const POD_USER: i64 = 65532;
/// Environment variable of the consumer holding `spec.serverAddress`.
pub const ENV_SERVER: &str = "PULSAR_SERVER";
/// Environment variable of the consumer holding `spec.topic`.
pub const ENV_TOPIC: &str = "PULSAR_TOPIC";
/// Environment variable of the consumer holding `spec.subscriptionName`.
pub const ENV_SUBSCRIPTION: &str = "PULSAR_SUBSCRIPTION_NAME";

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

/// Name of the Deployment of `pc`: `<name>-deployment`, as the original operator named it.
#[must_use]
pub fn deployment_name(pc: &PulsarConsumer) -> String {
    format!("{}-deployment", pc.name_any())
}

/// The labels of the Deployment and its pods: the `app.kubernetes.io/*` set. Fixed and owned
/// by the operator; the PulsarConsumer's own labels are never copied (changing them must not
/// touch the Deployment's immutable selector).
#[must_use]
pub fn labels(pc: &PulsarConsumer) -> BTreeMap<String, String> {
    shared::apply::standard_labels(APP, &pc.name_any(), OPERATOR.name)
}

/// The labels the Deployment selects its pods by (a subset of [`labels`]).
#[must_use]
pub fn selector_labels(pc: &PulsarConsumer) -> BTreeMap<String, String> {
    let mut l = labels(pc);
    l.remove("app.kubernetes.io/part-of");
    l
}

/// [`selector_labels`] as a label selector string (for `status.selector`).
#[must_use]
pub fn selector(pc: &PulsarConsumer) -> String {
    selector_labels(pc)
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join(",")
}

/// The Deployment of `pc`: `replicas` consumers (`spec.replicas`, or the autoscaler's
/// count) with the spec's settings in their environment, ready while connected to the
/// broker (`/healthz`), under the `restricted` Pod Security Standard with a read-only root
/// filesystem.
#[must_use]
pub fn desired_deployment(
    pc: &PulsarConsumer,
    owner: OwnerReference,
    image: &str,
    replicas: i32,
) -> Deployment {
    let image = if image.is_empty() {
        DEFAULT_IMAGE
    } else {
        image
    };
    let env = |name: &str, value: &str| EnvVar {
        name: name.to_owned(),
        value: Some(value.to_owned()),
        value_from: None,
    };
    let quantities = |pairs: &[(&str, &str)]| {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), Quantity((*v).to_owned())))
            .collect::<BTreeMap<_, _>>()
    };
    let container = Container {
        name: CONTAINER.to_owned(),
        image: Some(image.to_owned()),
        env: Some(vec![
            env(ENV_SERVER, &pc.spec.server_address),
            env(ENV_TOPIC, &pc.spec.topic),
            env(ENV_SUBSCRIPTION, &pc.spec.subscription_name),
        ]),
        ports: Some(vec![ContainerPort {
            name: Some("http".to_owned()),
            container_port: HTTP_PORT,
            ..ContainerPort::default()
        }]),
        // Readiness only: a consumer that lost the broker reconnects by itself, so it is
        // taken out of "ready" but not restarted.
        readiness_probe: Some(Probe {
            http_get: Some(HTTPGetAction {
                path: Some("/healthz".to_owned()),
                port: IntOrString::String("http".to_owned()),
                ..HTTPGetAction::default()
            }),
            period_seconds: Some(5),
            ..Probe::default()
        }),
        resources: Some(ResourceRequirements {
            requests: Some(quantities(&[("cpu", "10m"), ("memory", "32Mi")])),
            limits: Some(quantities(&[("memory", "128Mi")])),
            ..ResourceRequirements::default()
        }),
        security_context: Some(restricted_container_security_context()),
        ..Container::default()
    };
    restricted_deployment(
        ObjectMeta {
            name: Some(deployment_name(pc)),
            namespace: pc.namespace(),
            labels: Some(labels(pc)),
            owner_references: Some(vec![owner]),
            ..ObjectMeta::default()
        },
        replicas,
        selector_labels(pc),
        labels(pc),
        POD_USER,
        container,
    )
}

/// The consumer settings a Deployment's pod template runs with.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Settings {
    /// `PULSAR_SERVER`.
    pub server: String,
    /// `PULSAR_TOPIC`.
    pub topic: String,
    /// `PULSAR_SUBSCRIPTION_NAME`.
    pub subscription: String,
}

/// The settings in the consumer container's environment (empty where unset).
#[must_use]
pub fn deployed_settings(deployment: &Deployment) -> Settings {
    let env = deployment
        .spec
        .as_ref()
        .and_then(|s| s.template.spec.as_ref())
        .and_then(|s| s.containers.iter().find(|c| c.name == CONTAINER))
        .and_then(|c| c.env.as_deref())
        .unwrap_or_default();
    let value = |name: &str| {
        env.iter()
            .find(|e| e.name == name)
            .and_then(|e| e.value.clone())
            .unwrap_or_default()
    };
    Settings {
        server: value(ENV_SERVER),
        topic: value(ENV_TOPIC),
        subscription: value(ENV_SUBSCRIPTION),
    }
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
    // The Deployment controller has seen the latest Deployment spec.
    let seen = deployment.is_some_and(|d| {
        observed.observed_generation.is_some()
            && observed.observed_generation >= d.metadata.generation
    });
    let deadline_exceeded = observed.conditions.iter().flatten().find(|c| {
        c.type_ == "Progressing" && c.reason.as_deref() == Some("ProgressDeadlineExceeded")
    });
    let rolled_out = seen && updated == want && current == want && ready == want;
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

    let mut conditions = pc
        .status
        .as_ref()
        .map(|s| s.conditions.clone())
        .unwrap_or_default();
    for (type_, (status, reason, message)) in [("Ready", ready_cond), ("Progressing", progressing)]
    {
        set_condition(
            &mut conditions,
            new_condition(type_, status, reason, message, generation, now),
        );
    }

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
        status
            .conditions
            .retain(|c| c.type_ != SCALING_ACTIVE && c.type_ != SCALING_LIMITED);
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
    match &scaling.reading {
        None => {}
        Some(Ok(backlog)) => {
            set_condition(
                &mut status.conditions,
                new_condition(
                    SCALING_ACTIVE,
                    true,
                    REASON_BACKLOG_READ,
                    format!(
                        "the backlog is read from the Pulsar admin API; {} wanted at {} per consumer",
                        crate::autoscale::replicas_for(*backlog, scaling.policy.target),
                        scaling.policy.target
                    ),
                    generation,
                    now,
                ),
            );
        }
        Some(Err((reason, message))) => {
            set_condition(
                &mut status.conditions,
                new_condition(
                    SCALING_ACTIVE,
                    false,
                    reason,
                    format!("{message}; the consumers are left at {replicas}"),
                    generation,
                    now,
                ),
            );
        }
    }
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
    set_condition(
        &mut status.conditions,
        new_condition(
            SCALING_LIMITED,
            limited,
            scaling.decision.limit.reason(),
            message,
            generation,
            now,
        ),
    );
    status
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::api::PulsarConsumerSpec;
    use k8s_openapi::api::apps::v1::{DeploymentCondition, DeploymentStatus};
    use shared::conditions::{find, is_true};

    fn consumer(replicas: i32) -> PulsarConsumer {
        let mut pc = PulsarConsumer::new(
            "orders",
            PulsarConsumerSpec {
                server_address: "pulsar://broker:6650".into(),
                topic: "my-topic".into(),
                subscription_name: "first-subscription".into(),
                replicas,
                autoscaling: None,
            },
        );
        pc.metadata.namespace = Some("ns".into());
        pc.metadata.uid = Some("uid-1".into());
        pc.metadata.generation = Some(2);
        pc.metadata.labels = Some(BTreeMap::from([("app".into(), "mine".into())]));
        pc
    }

    fn deployment(pc: &PulsarConsumer, status: DeploymentStatus) -> Deployment {
        let owner = shared::apply::owner_reference(pc).unwrap();
        let mut d = desired_deployment(pc, owner, "", pc.spec.replicas);
        d.metadata.generation = Some(5);
        d.status = Some(status);
        d
    }

    fn counts(observed: i64, replicas: i32, updated: i32, ready: i32) -> DeploymentStatus {
        DeploymentStatus {
            observed_generation: Some(observed),
            replicas: Some(replicas),
            updated_replicas: Some(updated),
            ready_replicas: Some(ready),
            ..DeploymentStatus::default()
        }
    }

    fn t(s: i64) -> jiff::Timestamp {
        jiff::Timestamp::from_second(s).unwrap()
    }

    #[test]
    fn deployment_is_restricted_owned_and_configured() {
        let pc = consumer(3);
        let owner = shared::apply::owner_reference(&pc).unwrap();
        let d = desired_deployment(&pc, owner, "mirror.local/pulsar-consumer:1", 3);
        assert_eq!(d.metadata.name.as_deref(), Some("orders-deployment"));
        assert_eq!(d.metadata.namespace.as_deref(), Some("ns"));
        let orefs = d.metadata.owner_references.clone().unwrap();
        assert_eq!(orefs[0].uid, "uid-1");
        assert_eq!(orefs[0].controller, Some(true));
        let labels = d.metadata.labels.clone().unwrap();
        assert_eq!(labels["app.kubernetes.io/managed-by"], OPERATOR.name);
        assert_eq!(labels["app.kubernetes.io/instance"], "orders");
        assert_eq!(
            labels.len(),
            4,
            "the custom resource's labels are not copied"
        );
        let spec = d.spec.clone().unwrap();
        assert_eq!(spec.replicas, Some(3));
        let selector = spec.selector.match_labels.unwrap();
        assert!(!selector.contains_key("app"));
        let template_labels = spec.template.metadata.unwrap().labels.unwrap();
        assert!(
            selector
                .iter()
                .all(|(k, v)| template_labels.get(k) == Some(v))
        );
        let pod = spec.template.spec.unwrap();
        assert_eq!(pod.automount_service_account_token, Some(false));
        let psc = pod.security_context.unwrap();
        assert_eq!(psc.run_as_non_root, Some(true));
        assert_eq!(psc.seccomp_profile.unwrap().type_, "RuntimeDefault");
        let c = &pod.containers[0];
        assert_eq!(c.name, CONTAINER);
        assert_eq!(c.image.as_deref(), Some("mirror.local/pulsar-consumer:1"));
        let sc = c.security_context.clone().unwrap();
        assert_eq!(sc.allow_privilege_escalation, Some(false));
        assert_eq!(sc.read_only_root_filesystem, Some(true));
        assert_eq!(sc.capabilities.unwrap().drop.unwrap(), ["ALL"]);
        let probe = c.readiness_probe.clone().unwrap().http_get.unwrap();
        assert_eq!(probe.path.as_deref(), Some("/healthz"));
        assert_eq!(c.ports.clone().unwrap()[0].container_port, 8080);
        assert!(c.liveness_probe.is_none());
        assert_eq!(
            deployed_settings(&d),
            Settings {
                server: "pulsar://broker:6650".into(),
                topic: "my-topic".into(),
                subscription: "first-subscription".into(),
            }
        );
        assert_eq!(
            selector_labels(&pc)
                .keys()
                .map(String::as_str)
                .collect::<Vec<_>>(),
            [
                "app.kubernetes.io/instance",
                "app.kubernetes.io/managed-by",
                "app.kubernetes.io/name"
            ]
        );
    }

    #[test]
    fn default_image() {
        let pc = consumer(1);
        let owner = shared::apply::owner_reference(&pc).unwrap();
        let d = desired_deployment(&pc, owner, "", 1);
        let image = d.spec.unwrap().template.spec.unwrap().containers[0]
            .image
            .clone();
        assert_eq!(image.as_deref(), Some(DEFAULT_IMAGE));
    }

    #[test]
    fn selector_ignores_the_custom_resource_labels() {
        let mut pc = consumer(1);
        let before = selector(&pc);
        pc.metadata.labels = Some(BTreeMap::from([("team".into(), "payments".into())]));
        assert_eq!(selector(&pc), before);
        assert_eq!(
            before,
            "app.kubernetes.io/instance=orders,app.kubernetes.io/managed-by=pulsar-consumer-operator,app.kubernetes.io/name=pulsar-consumer"
        );
    }

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
            reading: Some(Err(("AdminAPIUnavailable", "connection refused".into()))),
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
            active.message.contains("connection refused"),
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
}
