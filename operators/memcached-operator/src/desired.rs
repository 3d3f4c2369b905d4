//! Pure builders: the Deployment and Service a Memcached wants, which pods are its own, and
//! the status that describes what was observed. No client here; unit-tested below.

use std::collections::BTreeMap;

use k8s_openapi::{
    api::{
        apps::v1::Deployment,
        core::v1::{
            Container, ContainerPort, Pod, ResourceRequirements, Service, ServicePort, ServiceSpec,
        },
    },
    apimachinery::pkg::{
        api::resource::Quantity,
        apis::meta::v1::{Condition, ObjectMeta, OwnerReference},
        util::intstr::IntOrString,
    },
};
use kube::ResourceExt;
use shared::conditions::{new_condition, set_condition};
use shared::pod_security::{restricted_container_security_context, restricted_deployment};

use crate::{
    OPERATOR,
    api::{Memcached, MemcachedStatus},
};

/// The `app.kubernetes.io/name` of everything this operator creates.
pub const APP: &str = "memcached";
/// The label naming the Memcached a child belongs to.
pub const INSTANCE_LABEL: &str = "app.kubernetes.io/instance";
/// Name of the container and of its port (the Service targets the port by this name).
pub const CONTAINER: &str = "memcached";
/// The non-root user memcached runs as (as in the Go original).
pub const POD_USER: i64 = 1001;
/// The memcached command line (64 MB of item memory, modern defaults, verbose).
/// `-m 64`, not the tutorial's `-m=64`: memcached parses the latter as 0 MB
/// and, before 1.6.2x, exits ("Cannot set item size limit higher than 1/2 of
/// memory max"), as Debian's 1.6.18 did when the pods first really ran.
pub const COMMAND: [&str; 6] = ["memcached", "-m", "64", "-o", "modern", "-v"];

/// Why a Memcached is `Degraded`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Problem {
    /// The Memcached is being deleted; the finalizer runs.
    Finalizing,
    /// The API server refused the Deployment or Service (admission, quota, invalid).
    ApplyFailed(String),
    /// A Deployment or Service of the same name exists and belongs to someone else.
    NameConflict(String),
}

/// The labels the pods are selected by: fixed, owned by the operator, never copied from the
/// Memcached's own labels.
#[must_use]
pub fn selector_labels(mc: &Memcached) -> BTreeMap<String, String> {
    BTreeMap::from([
        ("app.kubernetes.io/name".to_owned(), APP.to_owned()),
        (INSTANCE_LABEL.to_owned(), mc.name_any()),
        (
            "app.kubernetes.io/managed-by".to_owned(),
            OPERATOR.name.to_owned(),
        ),
    ])
}

/// The label selector of every pod this operator creates (for its pod watch).
#[must_use]
pub fn all_pods_selector() -> String {
    format!(
        "app.kubernetes.io/name={APP},app.kubernetes.io/managed-by={}",
        OPERATOR.name
    )
}

/// `status.selector`: the pods of `mc`, as a label selector string.
#[must_use]
pub fn selector(mc: &Memcached) -> String {
    selector_labels(mc)
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join(",")
}

/// The four standard labels of every child of `mc`.
#[must_use]
pub fn labels(mc: &Memcached) -> BTreeMap<String, String> {
    shared::apply::standard_labels(APP, &mc.name_any(), OPERATOR.name)
}

fn metadata(mc: &Memcached, owner: OwnerReference) -> ObjectMeta {
    ObjectMeta {
        name: Some(mc.name_any()),
        namespace: mc.namespace(),
        labels: Some(labels(mc)),
        owner_references: Some(vec![owner]),
        ..ObjectMeta::default()
    }
}

/// The Deployment of `mc`: named after it, `size` replicas of `image` running
/// `memcached -m 64 -o modern -v` as user 1001 under the `restricted` Pod Security
/// Standard, with a read-only root filesystem and no service account token.
#[must_use]
pub fn desired_deployment(mc: &Memcached, owner: OwnerReference, image: &str) -> Deployment {
    let mut pod_labels = selector_labels(mc);
    pod_labels.extend(labels(mc));
    let container = Container {
        name: CONTAINER.to_owned(),
        image: Some(image.to_owned()),
        command: Some(COMMAND.iter().map(|s| (*s).to_owned()).collect()),
        ports: Some(vec![ContainerPort {
            name: Some(CONTAINER.to_owned()),
            container_port: mc.spec.port(),
            protocol: Some("TCP".to_owned()),
            ..ContainerPort::default()
        }]),
        resources: Some(ResourceRequirements {
            requests: Some(BTreeMap::from([
                ("cpu".to_owned(), Quantity("50m".to_owned())),
                ("memory".to_owned(), Quantity("64Mi".to_owned())),
            ])),
            // -m 64 caps the item memory; connections and slabs need headroom.
            limits: Some(BTreeMap::from([(
                "memory".to_owned(),
                Quantity("128Mi".to_owned()),
            )])),
            ..ResourceRequirements::default()
        }),
        security_context: Some(restricted_container_security_context()),
        ..Container::default()
    };
    restricted_deployment(
        metadata(mc, owner),
        mc.spec.size.max(0),
        selector_labels(mc),
        pod_labels,
        POD_USER,
        container,
    )
}

/// The Service of `mc`: named after it, `containerPort` to the pods' `memcached` port.
#[must_use]
pub fn desired_service(mc: &Memcached, owner: OwnerReference) -> Service {
    Service {
        metadata: metadata(mc, owner),
        spec: Some(ServiceSpec {
            selector: Some(selector_labels(mc)),
            ports: Some(vec![ServicePort {
                name: Some(CONTAINER.to_owned()),
                port: mc.spec.port(),
                target_port: Some(IntOrString::String(CONTAINER.to_owned())),
                protocol: Some("TCP".to_owned()),
                ..ServicePort::default()
            }]),
            ..ServiceSpec::default()
        }),
        status: None,
    }
}

/// Whether `pod` is a pod of the Deployment `deployment` (named after the Memcached): its
/// controller is a ReplicaSet `<deployment>-<pod-template-hash>`. Labels alone could be
/// copied by anyone; this also needs the owner the Deployment controller sets.
#[must_use]
pub fn is_pod_of(pod: &Pod, deployment: &str) -> bool {
    let Some(hash) = pod.labels().get("pod-template-hash") else {
        return false;
    };
    let rs_name = format!("{deployment}-{hash}");
    pod.owner_references()
        .iter()
        .any(|r| r.controller == Some(true) && r.kind == "ReplicaSet" && r.name == rs_name)
}

/// Whether a pod counts: not terminating, and not finished (phase Succeeded or Failed).
#[must_use]
pub fn is_current(pod: &Pod) -> bool {
    pod.metadata.deletion_timestamp.is_none()
        && !matches!(
            pod.status.as_ref().and_then(|s| s.phase.as_deref()),
            Some("Succeeded" | "Failed")
        )
}

/// Whether the pod's Ready condition is True.
#[must_use]
pub fn is_ready(pod: &Pod) -> bool {
    pod.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

/// The message of the Deployment's `ReplicaFailure=True` condition (pods cannot be created:
/// quota, admission), if any.
#[must_use]
pub fn replica_failure(deployment: &Deployment) -> Option<String> {
    deployment
        .status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == "ReplicaFailure" && c.status == "True")
        .map(|c| {
            c.message
                .clone()
                .unwrap_or_else(|| c.reason.clone().unwrap_or_default())
        })
}

/// The status describing `deployment` and the current `pods` of `mc`, keeping
/// `lastTransitionTime` of unchanged conditions.
///
/// - `Available`: the Deployment has observed its latest spec and at least `size` pods
///   are available and ready (reason `AllPodsAvailable`; else `Reconciling`).
/// - `Progressing`: the pod count differs from `size` (reason `Resizing`) or pods are
///   still being updated or started (`Reconciling`); else `False` (`Reconciled`).
/// - `Degraded`: `problem` (`Finalizing`, `ApplyFailed`, `NameConflict`), or the
///   Deployment reports that it cannot create pods (`ReplicaFailure`); else `AsExpected`.
#[must_use]
pub fn status(
    mc: &Memcached,
    deployment: Option<&Deployment>,
    pods: &[&Pod],
    problem: Option<&Problem>,
    now: jiff::Timestamp,
) -> MemcachedStatus {
    let generation = mc.metadata.generation;
    let size = mc.spec.size.max(0);
    let name = mc.name_any();
    let current: Vec<&Pod> = pods.iter().copied().filter(|p| is_current(p)).collect();
    let replicas = i32::try_from(current.len()).unwrap_or(i32::MAX);
    let ready = i32::try_from(current.iter().filter(|p| is_ready(p)).count()).unwrap_or(i32::MAX);
    let mut nodes: Vec<String> = current.iter().map(|p| p.name_any()).collect();
    nodes.sort();

    let dep_status = deployment
        .and_then(|d| d.status.clone())
        .unwrap_or_default();
    let dep_observed = deployment.is_some_and(|d| {
        d.metadata.generation.is_some()
            && dep_status.observed_generation >= d.metadata.generation
            && d.spec.as_ref().and_then(|s| s.replicas) == Some(size)
    });
    let available = dep_status.available_replicas.unwrap_or(0);
    let updated = dep_status.updated_replicas.unwrap_or(0);
    let dep_replicas = dep_status.replicas.unwrap_or(0);

    let old = mc.status.clone().unwrap_or_default();
    let mut conditions = old.conditions;
    let counts = format!("{ready}/{size} pods ready");
    let is_available = dep_observed && available >= size && ready >= size;
    let available_message = match deployment {
        None => format!("Deployment {name} not created yet"),
        Some(_) if !dep_observed => {
            format!("Deployment {name} not yet updated by the Deployment controller")
        }
        Some(_) => format!("{available}/{size} pods available, {ready} ready"),
    };
    set_condition(
        &mut conditions,
        if is_available {
            new_condition(
                "Available",
                true,
                "AllPodsAvailable",
                format!("Deployment {name} has {size} available pods"),
                generation,
                now,
            )
        } else {
            new_condition(
                "Available",
                false,
                "Reconciling",
                available_message,
                generation,
                now,
            )
        },
    );
    // The contract's `Ready`, for tools and people that look for it: the same as
    // `Available` (the tutorial's own condition). Events announce `Available` only.
    if let Some(available) = conditions.iter().find(|c| c.type_ == "Available").cloned() {
        set_condition(
            &mut conditions,
            Condition {
                type_: "Ready".into(),
                ..available
            },
        );
    }
    let (progressing, reason, message) = if replicas != size || dep_replicas != size {
        (
            true,
            "Resizing",
            format!("{replicas} pods exist, {size} wanted"),
        )
    } else if !dep_observed || updated != size || available != size || ready != size {
        (true, "Reconciling", counts)
    } else {
        (
            false,
            "Reconciled",
            format!("{size} pods up to date and available"),
        )
    };
    set_condition(
        &mut conditions,
        new_condition("Progressing", progressing, reason, message, generation, now),
    );
    let failure = deployment.and_then(replica_failure);
    let degraded = match (problem, failure) {
        (Some(Problem::Finalizing), _) => new_condition(
            "Degraded",
            true,
            "Finalizing",
            format!("Memcached {name} is being deleted; its Deployment and Service go with it"),
            generation,
            now,
        ),
        (Some(Problem::ApplyFailed(msg)), _) => new_condition(
            "Degraded",
            true,
            "ApplyFailed",
            format!("cannot write the Deployment or Service: {msg}"),
            generation,
            now,
        ),
        (Some(Problem::NameConflict(msg)), _) => new_condition(
            "Degraded",
            true,
            "NameConflict",
            msg.clone(),
            generation,
            now,
        ),
        (None, Some(msg)) => new_condition(
            "Degraded",
            true,
            "ReplicaFailure",
            format!("cannot create pods: {msg}"),
            generation,
            now,
        ),
        (None, None) => new_condition(
            "Degraded",
            false,
            "AsExpected",
            "the Deployment and Service are in place",
            generation,
            now,
        ),
    };
    set_condition(&mut conditions, degraded);

    MemcachedStatus {
        nodes,
        replicas,
        ready_replicas: ready,
        selector: selector(mc),
        observed_generation: generation,
        conditions,
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::api::MemcachedSpec;
    use k8s_openapi::{
        api::{
            apps::v1::DeploymentStatus,
            core::v1::{PodCondition, PodStatus},
        },
        apimachinery::pkg::apis::meta::v1::Time,
    };
    use shared::conditions::{find, is_true};

    fn memcached(size: i32, port: Option<i32>) -> Memcached {
        let port = port.unwrap_or(crate::api::DEFAULT_PORT);
        let mut mc = Memcached::new(
            "cache",
            MemcachedSpec {
                size,
                container_port: port,
            },
        );
        mc.metadata.namespace = Some("ns".into());
        mc.metadata.uid = Some("uid-1".into());
        mc.metadata.generation = Some(2);
        mc
    }

    fn owner() -> OwnerReference {
        OwnerReference {
            api_version: "cache.example.com/v1alpha1".into(),
            kind: "Memcached".into(),
            name: "cache".into(),
            uid: "uid-1".into(),
            controller: Some(true),
            block_owner_deletion: Some(true),
        }
    }

    fn pod(name: &str, ready: bool, terminating: bool) -> Pod {
        Pod {
            metadata: ObjectMeta {
                name: Some(name.into()),
                labels: Some(BTreeMap::from([(
                    "pod-template-hash".to_owned(),
                    "abc".to_owned(),
                )])),
                owner_references: Some(vec![OwnerReference {
                    kind: "ReplicaSet".into(),
                    name: "cache-abc".into(),
                    controller: Some(true),
                    ..OwnerReference::default()
                }]),
                deletion_timestamp: terminating.then_some(Time(jiff::Timestamp::UNIX_EPOCH)),
                ..ObjectMeta::default()
            },
            spec: None,
            status: Some(PodStatus {
                phase: Some("Running".into()),
                conditions: Some(vec![PodCondition {
                    type_: "Ready".into(),
                    status: if ready { "True" } else { "False" }.into(),
                    ..PodCondition::default()
                }]),
                ..PodStatus::default()
            }),
        }
    }

    fn deployment(mc: &Memcached, replicas: i32, available: i32) -> Deployment {
        let mut d = desired_deployment(mc, owner(), "img");
        d.metadata.generation = Some(4);
        d.status = Some(DeploymentStatus {
            observed_generation: Some(4),
            replicas: Some(replicas),
            updated_replicas: Some(replicas),
            ready_replicas: Some(available),
            available_replicas: Some(available),
            ..DeploymentStatus::default()
        });
        d
    }

    #[test]
    fn deployment_follows_spec_and_is_restricted() {
        let mc = memcached(3, None);
        let d = desired_deployment(&mc, owner(), "memcached:1.6.38-alpine");
        let spec = d.spec.as_ref().unwrap();
        assert_eq!(spec.replicas, Some(3));
        assert_eq!(d.metadata.name.as_deref(), Some("cache"));
        assert_eq!(
            d.metadata.owner_references.as_ref().unwrap()[0].uid,
            "uid-1"
        );
        let template_labels = spec.template.metadata.as_ref().unwrap().labels.clone();
        let selector = spec.selector.match_labels.clone().unwrap();
        for (k, v) in &selector {
            assert_eq!(template_labels.as_ref().unwrap().get(k), Some(v));
        }
        let pod = spec.template.spec.as_ref().unwrap();
        assert_eq!(pod.automount_service_account_token, Some(false));
        let psc = pod.security_context.as_ref().unwrap();
        assert_eq!(psc.run_as_user, Some(1001));
        assert_eq!(psc.run_as_non_root, Some(true));
        let c = &pod.containers[0];
        assert_eq!(c.image.as_deref(), Some("memcached:1.6.38-alpine"));
        assert_eq!(
            c.command.clone().unwrap(),
            ["memcached", "-m", "64", "-o", "modern", "-v"]
        );
        let port = &c.ports.as_ref().unwrap()[0];
        assert_eq!(port.container_port, 11211);
        assert_eq!(port.name.as_deref(), Some("memcached"));
        let sc = c.security_context.as_ref().unwrap();
        assert_eq!(sc.allow_privilege_escalation, Some(false));
        assert_eq!(sc.read_only_root_filesystem, Some(true));
        assert_eq!(
            sc.capabilities.as_ref().unwrap().drop.clone().unwrap(),
            ["ALL"]
        );
    }

    #[test]
    fn selector_ignores_the_custom_resource_labels() {
        let mut mc = memcached(1, None);
        mc.metadata.labels = Some(BTreeMap::from([("team".to_owned(), "x".to_owned())]));
        let d = desired_deployment(&mc, owner(), "img");
        let sel = d.spec.unwrap().selector.match_labels.unwrap();
        assert!(!sel.contains_key("team"));
        assert_eq!(
            selector(&mc),
            "app.kubernetes.io/instance=cache,app.kubernetes.io/managed-by=memcached-operator,app.kubernetes.io/name=memcached"
        );
    }

    #[test]
    fn service_exposes_the_port() {
        let mc = memcached(1, Some(12345));
        let s = desired_service(&mc, owner());
        let spec = s.spec.unwrap();
        let port = &spec.ports.unwrap()[0];
        assert_eq!(port.port, 12345);
        assert_eq!(
            port.target_port,
            Some(IntOrString::String("memcached".into()))
        );
        assert_eq!(spec.selector.unwrap(), selector_labels(&mc));
        let d = desired_deployment(&mc, owner(), "img");
        let c = &d.spec.unwrap().template.spec.unwrap().containers[0];
        assert_eq!(c.ports.as_ref().unwrap()[0].container_port, 12345);
    }

    #[test]
    fn pods_of_the_deployment_only() {
        let p = pod("cache-abc-1", true, false);
        assert!(is_pod_of(&p, "cache"));
        assert!(!is_pod_of(&p, "other"));
        let mut stranger = p.clone();
        stranger.metadata.owner_references = None;
        assert!(!is_pod_of(&stranger, "cache"));
    }

    #[test]
    fn status_available_when_all_pods_ready() {
        let mc = memcached(2, None);
        let d = deployment(&mc, 2, 2);
        let (b, a, gone) = (
            pod("cache-abc-b", true, false),
            pod("cache-abc-a", true, false),
            pod("cache-abc-c", true, true),
        );
        let now = jiff::Timestamp::from_second(100).unwrap();
        let s = status(&mc, Some(&d), &[&b, &a, &gone], None, now);
        assert_eq!(s.nodes, ["cache-abc-a", "cache-abc-b"]);
        assert_eq!((s.replicas, s.ready_replicas), (2, 2));
        assert_eq!(s.observed_generation, Some(2));
        assert!(is_true(&s.conditions, "Available"));
        assert!(!is_true(&s.conditions, "Progressing"));
        assert!(!is_true(&s.conditions, "Degraded"));
        assert_eq!(s.selector, selector(&mc));
    }

    #[test]
    fn status_resizing_and_transition_times() {
        let mut mc = memcached(3, None);
        let d = deployment(&mc, 2, 2);
        let (a, b) = (
            pod("cache-abc-a", true, false),
            pod("cache-abc-b", false, false),
        );
        let t1 = jiff::Timestamp::from_second(100).unwrap();
        let s = status(&mc, Some(&d), &[&a, &b], None, t1);
        assert!(!is_true(&s.conditions, "Available"));
        let p = find(&s.conditions, "Progressing").unwrap();
        assert_eq!((p.status.as_str(), p.reason.as_str()), ("True", "Resizing"));
        mc.status = Some(s);
        let t2 = jiff::Timestamp::from_second(200).unwrap();
        let s2 = status(&mc, Some(&d), &[&a, &b], None, t2);
        assert_eq!(
            find(&s2.conditions, "Available")
                .unwrap()
                .last_transition_time,
            Time(t1)
        );
        assert_eq!(mc.status.as_ref(), Some(&s2), "same input, same status");
    }

    #[test]
    fn status_degraded_reasons() {
        let mc = memcached(1, None);
        let now = jiff::Timestamp::from_second(100).unwrap();
        let s = status(&mc, None, &[], Some(&Problem::Finalizing), now);
        let d = find(&s.conditions, "Degraded").unwrap();
        assert_eq!(
            (d.status.as_str(), d.reason.as_str()),
            ("True", "Finalizing")
        );
        let s = status(
            &mc,
            None,
            &[],
            Some(&Problem::ApplyFailed("forbidden".into())),
            now,
        );
        let d = find(&s.conditions, "Degraded").unwrap();
        assert_eq!(d.reason, "ApplyFailed");
        assert!(d.message.contains("forbidden"));
        let a = find(&s.conditions, "Available").unwrap();
        assert_eq!(a.status, "False");
    }

    #[test]
    fn size_zero_is_available() {
        let mc = memcached(0, None);
        let d = deployment(&mc, 0, 0);
        let now = jiff::Timestamp::from_second(100).unwrap();
        let s = status(&mc, Some(&d), &[], None, now);
        assert!(is_true(&s.conditions, "Available"));
        assert!(s.nodes.is_empty());
    }
}
