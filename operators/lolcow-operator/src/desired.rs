//! Pure builders: the Deployment and Service a Lolcow wants, what the observed children
//! serve, the status that describes them and the events its changes deserve. No client
//! here; unit-tested below.

use std::collections::BTreeMap;

use k8s_openapi::{
    api::{
        apps::v1::Deployment,
        core::v1::{
            Container, ContainerPort, EnvVar, HTTPGetAction, Probe, ResourceRequirements, Service,
            ServicePort, ServiceSpec,
        },
    },
    apimachinery::pkg::{
        api::resource::Quantity,
        apis::meta::v1::{Condition, ObjectMeta, OwnerReference},
        util::intstr::IntOrString,
    },
};
use kube::ResourceExt;
use shared::conditions::{find, new_condition, set_condition};
use shared::pod_security::{restricted_container_security_context, restricted_deployment};

use crate::{
    OPERATOR,
    api::{DEFAULT_IMAGE, Lolcow, LolcowStatus},
};

/// The `app.kubernetes.io/name` of every child.
pub const APP: &str = "lolcow";
/// The name of the web app's container.
pub const CONTAINER: &str = "lolcow";
/// The port the web app listens on in its container (the image's `PORT`).
pub const CONTAINER_PORT: i32 = 8080;
/// The name of that port (the probes and the Service's target refer to it).
pub const PORT_NAME: &str = "http";
/// The Service's cluster-internal port.
pub const SERVICE_PORT: i32 = 80;
/// The web app's health endpoint.
pub const HEALTH_PATH: &str = "/healthz";
/// The URL path of the page, reported in `status.path`.
pub const PAGE_PATH: &str = "/";
/// The environment variable the web app reads its greeting from.
pub const GREETING_ENV: &str = "GREETING";
/// The non-root user the web app runs as (distroless `nonroot`, as in its image).
pub const APP_USER: i64 = 65532;

/// `Ready=False` reason: another Service holds the NodePort.
pub const REASON_PORT_CONFLICT: &str = "PortConflict";
/// `Ready=False` reason: the API server rejected the Service for another reason (e.g. the
/// port is outside the cluster's NodePort range).
pub const REASON_SERVICE_REJECTED: &str = "ServiceRejected";
/// `Ready=False` reason: the web app's Deployment is rolling out.
pub const REASON_ROLLING_OUT: &str = "RollingOut";
/// `Ready=False` reason: the Service does not serve `spec.port` yet.
pub const REASON_SERVICE_PENDING: &str = "ServicePending";
/// `Ready=True` reason.
pub const REASON_SERVING: &str = "Serving";
/// `Ready=False` reason: the Deployment's or Service's name is held by an object this
/// Lolcow does not control; that object is left untouched.
pub const REASON_NAME_CONFLICT: &str = shared::ownership::REASON_NAME_CONFLICT;
/// Reasons that are a problem for the user to fix: announced as Warning events.
pub const WARNING_REASONS: [&str; 3] = [
    REASON_PORT_CONFLICT,
    REASON_SERVICE_REJECTED,
    REASON_NAME_CONFLICT,
];

/// Labels of every child of `lc` (and of its pods): the `app.kubernetes.io/*` set.
#[must_use]
pub fn labels(lc: &Lolcow) -> BTreeMap<String, String> {
    shared::apply::standard_labels(APP, &lc.name_any(), OPERATOR.name)
}

/// The fixed selector of the web app's pods (never taken from the Lolcow's own labels).
#[must_use]
pub fn selector_labels(lc: &Lolcow) -> BTreeMap<String, String> {
    BTreeMap::from([
        ("app.kubernetes.io/name".to_owned(), APP.to_owned()),
        ("app.kubernetes.io/instance".to_owned(), lc.name_any()),
    ])
}

/// The greeting to serve: `spec.greeting`, or when it is blank a fortune chosen by the
/// object's UID, so the same object always gets the same one (a pod restart does not
/// change what the cow says, and the status can report it).
#[must_use]
pub fn greeting(lc: &Lolcow) -> String {
    match lc.spec.greeting.as_deref() {
        Some(g) if !g.trim().is_empty() => g.to_owned(),
        _ => fortune_for(&lc.uid().unwrap_or_else(|| lc.name_any())).to_owned(),
    }
}

/// A fortune of the web app's list, picked by a stable (FNV-1a) hash of `seed`.
#[must_use]
pub fn fortune_for(seed: &str) -> &'static str {
    let fortunes = lolcow_web::fortune::FORTUNES;
    let hash = seed.bytes().fold(0xcbf2_9ce4_8422_2325_u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    });
    let len = u64::try_from(fortunes.len()).unwrap_or(1).max(1);
    usize::try_from(hash % len)
        .ok()
        .and_then(|i| fortunes.get(i).copied())
        .unwrap_or("Moo.")
}

fn child_meta(lc: &Lolcow, owner: OwnerReference) -> ObjectMeta {
    ObjectMeta {
        name: Some(lc.name_any()),
        namespace: lc.namespace(),
        labels: Some(labels(lc)),
        owner_references: Some(vec![owner]),
        ..ObjectMeta::default()
    }
}

fn quantities(cpu: &str, memory: &str) -> BTreeMap<String, Quantity> {
    BTreeMap::from([
        ("cpu".to_owned(), Quantity(cpu.to_owned())),
        ("memory".to_owned(), Quantity(memory.to_owned())),
    ])
}

fn health_probe(period_seconds: i32) -> Probe {
    Probe {
        http_get: Some(HTTPGetAction {
            path: Some(HEALTH_PATH.to_owned()),
            port: IntOrString::String(PORT_NAME.to_owned()),
            ..HTTPGetAction::default()
        }),
        period_seconds: Some(period_seconds),
        ..Probe::default()
    }
}

/// The web app's Deployment: named like the Lolcow, one replica of `image` with the
/// greeting in `GREETING`, port 8080 named `http`, probes on `/healthz`, under the
/// `restricted` Pod Security Standard with a read-only root filesystem.
#[must_use]
pub fn desired_deployment(lc: &Lolcow, owner: OwnerReference, image: &str) -> Deployment {
    let image = if image.is_empty() {
        DEFAULT_IMAGE
    } else {
        image
    };
    let container = Container {
        name: CONTAINER.to_owned(),
        image: Some(image.to_owned()),
        image_pull_policy: Some("IfNotPresent".to_owned()),
        env: Some(vec![
            EnvVar {
                name: GREETING_ENV.to_owned(),
                value: Some(greeting(lc)),
                ..EnvVar::default()
            },
            EnvVar {
                name: "PORT".to_owned(),
                value: Some(CONTAINER_PORT.to_string()),
                ..EnvVar::default()
            },
        ]),
        ports: Some(vec![ContainerPort {
            name: Some(PORT_NAME.to_owned()),
            container_port: CONTAINER_PORT,
            protocol: Some("TCP".to_owned()),
            ..ContainerPort::default()
        }]),
        readiness_probe: Some(health_probe(5)),
        liveness_probe: Some(health_probe(10)),
        resources: Some(ResourceRequirements {
            requests: Some(quantities("10m", "16Mi")),
            limits: Some(quantities("200m", "64Mi")),
            ..ResourceRequirements::default()
        }),
        security_context: Some(restricted_container_security_context()),
        ..Container::default()
    };
    restricted_deployment(
        child_meta(lc, owner),
        1,
        selector_labels(lc),
        labels(lc),
        APP_USER,
        container,
    )
}

/// The Service: named like the Lolcow, type NodePort, port 80 to the container's 8080,
/// `nodePort = spec.port`.
#[must_use]
pub fn desired_service(lc: &Lolcow, owner: OwnerReference) -> Service {
    Service {
        metadata: child_meta(lc, owner),
        spec: Some(ServiceSpec {
            type_: Some("NodePort".to_owned()),
            selector: Some(selector_labels(lc)),
            ports: Some(vec![ServicePort {
                name: Some(PORT_NAME.to_owned()),
                protocol: Some("TCP".to_owned()),
                port: SERVICE_PORT,
                target_port: Some(IntOrString::Int(CONTAINER_PORT)),
                node_port: Some(lc.spec.port),
                ..ServicePort::default()
            }]),
            ..ServiceSpec::default()
        }),
        status: None,
    }
}

/// The greeting a Deployment configures (its container's `GREETING`).
#[must_use]
pub fn configured_greeting(dep: &Deployment) -> Option<String> {
    dep.spec
        .as_ref()?
        .template
        .spec
        .as_ref()?
        .containers
        .iter()
        .find(|c| c.name == CONTAINER)?
        .env
        .iter()
        .flatten()
        .find(|e| e.name == GREETING_ENV)
        .and_then(|e| e.value.clone())
}

/// The NodePort a Service serves on.
#[must_use]
pub fn node_port(svc: &Service) -> Option<i32> {
    svc.spec
        .as_ref()?
        .ports
        .iter()
        .flatten()
        .find_map(|p| p.node_port)
}

/// `None` when the Deployment's current spec is fully rolled out and available, else
/// what it waits for (as `kubectl rollout status` decides).
#[must_use]
pub fn rollout_pending(dep: &Deployment) -> Option<String> {
    let want = dep.spec.as_ref().and_then(|s| s.replicas).unwrap_or(1);
    let Some(status) = dep.status.as_ref() else {
        return Some("waiting for the Deployment to be observed".to_owned());
    };
    if status.observed_generation.unwrap_or(0) < dep.metadata.generation.unwrap_or(0) {
        return Some("waiting for the Deployment's new spec to be observed".to_owned());
    }
    let updated = status.updated_replicas.unwrap_or(0);
    let total = status.replicas.unwrap_or(0);
    let available = status.available_replicas.unwrap_or(0);
    if updated < want {
        return Some(format!("{updated} of {want} replicas updated"));
    }
    if total > updated {
        return Some(format!(
            "{} old replicas pending termination",
            total - updated
        ));
    }
    if available < want {
        return Some(format!("{available} of {want} replicas available"));
    }
    None
}

/// Why a child cannot be written: the API server refused the Service, or a child's name is
/// held by someone else's object (a problem for the user to fix, not retried as an error).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChildProblem {
    /// [`REASON_PORT_CONFLICT`], [`REASON_SERVICE_REJECTED`] or [`REASON_NAME_CONFLICT`].
    pub reason: &'static str,
    /// The API server's message, or which object holds the name.
    pub message: String,
}

impl ChildProblem {
    /// The children's names held by objects this Lolcow does not control (one or both).
    #[must_use]
    pub fn name_conflict(conflicts: &[shared::ownership::NameConflict]) -> Self {
        Self {
            reason: REASON_NAME_CONFLICT,
            message: conflicts
                .iter()
                .map(shared::ownership::NameConflict::message)
                .collect::<Vec<_>>()
                .join("; "),
        }
    }

    /// Classifies a rejected Service write; `None` when it is not a permanent problem
    /// (then the write is retried as an error).
    #[must_use]
    pub fn from_rejection(code: u16, message: &str) -> Option<Self> {
        if code != 422 {
            return None;
        }
        let reason = if message.contains("already allocated") {
            REASON_PORT_CONFLICT
        } else {
            REASON_SERVICE_REJECTED
        };
        Some(Self {
            reason,
            message: message.to_owned(),
        })
    }
}

/// The status describing the observed children, keeping `lastTransitionTime` of an
/// unchanged `Ready`. `problem` is why a child could not be written, if any.
#[must_use]
pub fn status(
    lc: &Lolcow,
    dep: Option<&Deployment>,
    svc: Option<&Service>,
    problem: Option<&ChildProblem>,
    now: jiff::Timestamp,
) -> LolcowStatus {
    let generation = lc.metadata.generation;
    let old = lc.status.clone().unwrap_or_default();
    let rollout = dep.map_or_else(
        || Some("waiting for the Deployment to be created".to_owned()),
        rollout_pending,
    );
    let port = svc.and_then(node_port);
    // The greeting being served is the Deployment's once it has rolled out; until then
    // the previous one still is.
    let served_greeting = match (dep, &rollout) {
        (Some(d), None) => configured_greeting(d),
        _ => old.greeting.clone(),
    };
    let ready = if let Some(p) = problem {
        new_condition("Ready", false, p.reason, p.message.clone(), generation, now)
    } else if let Some(waiting) = rollout {
        new_condition(
            "Ready",
            false,
            REASON_ROLLING_OUT,
            format!("the web app is rolling out: {waiting}"),
            generation,
            now,
        )
    } else if port != Some(lc.spec.port) {
        new_condition(
            "Ready",
            false,
            REASON_SERVICE_PENDING,
            format!("waiting for the Service to serve NodePort {}", lc.spec.port),
            generation,
            now,
        )
    } else {
        new_condition(
            "Ready",
            true,
            REASON_SERVING,
            format!("serving on NodePort {} at {PAGE_PATH}", lc.spec.port),
            generation,
            now,
        )
    };
    let mut conditions = old.conditions.clone();
    set_condition(&mut conditions, ready);
    LolcowStatus {
        greeting: served_greeting,
        port,
        path: Some(PAGE_PATH.to_owned()),
        observed_generation: generation,
        conditions,
    }
}

/// An event to publish about the Lolcow.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Announcement {
    /// Whether it is a Warning (else Normal).
    pub warning: bool,
    /// The condition's reason.
    pub reason: String,
    /// What happened.
    pub note: String,
}

/// The event `Ready` going from `old` to `new` deserves: one when its status changes,
/// and one when it turns to a problem for the user to fix (a Warning) even if it was
/// already `False` for another reason. Nothing when it stays as it was, so repeated
/// reconciles of a stuck object publish nothing.
#[must_use]
pub fn announcement(old: &[Condition], new: &[Condition]) -> Option<Announcement> {
    let new = find(new, "Ready")?;
    let old = find(old, "Ready");
    let warning = new.status == "False" && WARNING_REASONS.contains(&new.reason.as_str());
    let changed = match old {
        None => true,
        Some(o) => o.status != new.status || (warning && o.reason != new.reason),
    };
    changed.then(|| Announcement {
        warning,
        reason: new.reason.clone(),
        note: format!("Ready is {}: {}", new.status, new.message),
    })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::api::LolcowSpec;
    use k8s_openapi::{api::apps::v1::DeploymentStatus, apimachinery::pkg::apis::meta::v1::Time};
    use shared::conditions::is_true;

    fn lolcow(port: i32, greeting: Option<&str>) -> Lolcow {
        let mut lc = Lolcow::new(
            "moo",
            LolcowSpec {
                port,
                greeting: greeting.map(str::to_owned),
            },
        );
        lc.metadata.namespace = Some("ns".into());
        lc.metadata.uid = Some("uid-1".into());
        lc.metadata.generation = Some(2);
        lc
    }

    fn t(s: i64) -> jiff::Timestamp {
        jiff::Timestamp::from_second(s).unwrap()
    }

    fn rolled_out(mut dep: Deployment) -> Deployment {
        dep.metadata.generation = Some(4);
        dep.status = Some(DeploymentStatus {
            observed_generation: Some(4),
            replicas: Some(1),
            updated_replicas: Some(1),
            ready_replicas: Some(1),
            available_replicas: Some(1),
            ..DeploymentStatus::default()
        });
        dep
    }

    #[test]
    fn deployment_is_restricted_owned_and_configured() {
        let lc = lolcow(30080, Some("Hello"));
        let owner = shared::apply::owner_reference(&lc).unwrap();
        let d = desired_deployment(&lc, owner, "registry.local/lolcow-web:1");
        assert_eq!(d.metadata.name.as_deref(), Some("moo"));
        assert_eq!(d.metadata.namespace.as_deref(), Some("ns"));
        let orefs = d.metadata.owner_references.clone().unwrap();
        assert_eq!(orefs[0].uid, "uid-1");
        assert_eq!(orefs[0].controller, Some(true));
        let labels = d.metadata.labels.clone().unwrap();
        assert_eq!(labels["app.kubernetes.io/managed-by"], "lolcow-operator");
        assert_eq!(labels["app.kubernetes.io/instance"], "moo");
        let spec = d.spec.clone().unwrap();
        assert_eq!(spec.replicas, Some(1));
        let selector = spec.selector.match_labels.unwrap();
        assert_eq!(selector, selector_labels(&lc));
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
        assert_eq!(c.image.as_deref(), Some("registry.local/lolcow-web:1"));
        let port = &c.ports.clone().unwrap()[0];
        assert_eq!(
            (port.name.as_deref(), port.container_port),
            (Some("http"), 8080)
        );
        for probe in [c.readiness_probe.clone(), c.liveness_probe.clone()] {
            let get = probe.unwrap().http_get.unwrap();
            assert_eq!(get.path.as_deref(), Some("/healthz"));
            assert_eq!(get.port, IntOrString::String("http".into()));
        }
        let sc = c.security_context.clone().unwrap();
        assert_eq!(sc.allow_privilege_escalation, Some(false));
        assert_eq!(sc.read_only_root_filesystem, Some(true));
        assert_eq!(sc.capabilities.unwrap().drop.unwrap(), ["ALL"]);
        assert_eq!(configured_greeting(&d).as_deref(), Some("Hello"));
    }

    #[test]
    fn default_image() {
        let lc = lolcow(30080, None);
        let owner = shared::apply::owner_reference(&lc).unwrap();
        let d = desired_deployment(&lc, owner, "");
        assert_eq!(
            d.spec.unwrap().template.spec.unwrap().containers[0]
                .image
                .as_deref(),
            Some(DEFAULT_IMAGE)
        );
    }

    #[test]
    fn service_is_node_port() {
        let lc = lolcow(31234, None);
        let owner = shared::apply::owner_reference(&lc).unwrap();
        let s = desired_service(&lc, owner);
        let spec = s.spec.clone().unwrap();
        assert_eq!(spec.type_.as_deref(), Some("NodePort"));
        assert_eq!(spec.selector.unwrap(), selector_labels(&lc));
        let p = &spec.ports.unwrap()[0];
        assert_eq!(p.port, 80);
        assert_eq!(p.target_port, Some(IntOrString::Int(8080)));
        assert_eq!(node_port(&s), Some(31234));
    }

    #[test]
    fn blank_greeting_is_a_stable_fortune() {
        let a = greeting(&lolcow(30080, None));
        assert!(lolcow_web::fortune::FORTUNES.contains(&a.as_str()));
        assert_eq!(greeting(&lolcow(30080, Some("  "))), a);
        assert_eq!(greeting(&lolcow(30080, Some(""))), a);
        let mut other = lolcow(30080, None);
        other.metadata.uid = Some("uid-2".into());
        // Deterministic per UID (another UID may or may not pick another fortune).
        assert_eq!(greeting(&other), greeting(&other.clone()));
        assert_eq!(greeting(&lolcow(30080, Some("Moo"))), "Moo");
    }

    #[test]
    fn rollout_progress() {
        let lc = lolcow(30080, None);
        let owner = shared::apply::owner_reference(&lc).unwrap();
        let d = desired_deployment(&lc, owner, "");
        assert!(rollout_pending(&d).is_some());
        let mut done = rolled_out(d);
        assert_eq!(rollout_pending(&done), None);
        done.metadata.generation = Some(5);
        assert!(rollout_pending(&done).unwrap().contains("observed"));
        done.metadata.generation = Some(4);
        if let Some(s) = done.status.as_mut() {
            s.replicas = Some(2);
        }
        assert!(rollout_pending(&done).unwrap().contains("old replicas"));
    }

    #[test]
    fn status_and_conditions() {
        let mut lc = lolcow(30080, Some("Hello"));
        let owner = shared::apply::owner_reference(&lc).unwrap();
        let dep = desired_deployment(&lc, owner.clone(), "");
        let svc = desired_service(&lc, owner);

        // Rolling out: not ready, no greeting served yet.
        let s = status(&lc, Some(&dep), Some(&svc), None, t(10));
        assert!(!is_true(&s.conditions, "Ready"));
        assert_eq!(
            find(&s.conditions, "Ready").unwrap().reason,
            REASON_ROLLING_OUT
        );
        assert_eq!(s.greeting, None);
        assert_eq!(s.port, Some(30080));
        assert_eq!(s.path.as_deref(), Some("/"));
        assert_eq!(s.observed_generation, Some(2));

        lc.status = Some(s);
        let dep = rolled_out(dep);
        let s = status(&lc, Some(&dep), Some(&svc), None, t(20));
        assert!(is_true(&s.conditions, "Ready"));
        assert_eq!(s.greeting.as_deref(), Some("Hello"));
        let ready = find(&s.conditions, "Ready").unwrap();
        assert_eq!(ready.last_transition_time, Time(t(20)));

        // Same observation later: identical status (no write).
        lc.status = Some(s.clone());
        assert_eq!(status(&lc, Some(&dep), Some(&svc), None, t(30)), s);

        // The port conflicts: Ready=False with the API server's message.
        lc.spec.port = 30081;
        let problem = ChildProblem::from_rejection(
            422,
            "Service \"moo\" is invalid: spec.ports[0].nodePort: Invalid value: 30081: provided port is already allocated",
        )
        .unwrap();
        assert_eq!(problem.reason, REASON_PORT_CONFLICT);
        let c = status(&lc, Some(&dep), Some(&svc), Some(&problem), t(40));
        let ready = find(&c.conditions, "Ready").unwrap();
        assert_eq!(
            (ready.status.as_str(), ready.reason.as_str()),
            ("False", REASON_PORT_CONFLICT)
        );
        assert!(ready.message.contains("already allocated"));
        // The old port is still what is served.
        assert_eq!(c.port, Some(30080));

        // Without a problem but the Service not yet updated: pending.
        let p = status(&lc, Some(&dep), Some(&svc), None, t(50));
        assert_eq!(
            find(&p.conditions, "Ready").unwrap().reason,
            REASON_SERVICE_PENDING
        );
    }

    #[test]
    fn rejections() {
        assert_eq!(ChildProblem::from_rejection(409, "conflict"), None);
        assert_eq!(
            ChildProblem::from_rejection(422, "provided port is not in the valid range")
                .unwrap()
                .reason,
            REASON_SERVICE_REJECTED
        );
    }

    #[test]
    fn name_conflicts_name_every_object_and_warn() {
        let conflict = |kind: &str| shared::ownership::NameConflict {
            kind: kind.into(),
            name: "moo".into(),
            owner_kind: "Lolcow".into(),
        };
        let p = ChildProblem::name_conflict(&[conflict("Deployment"), conflict("Service")]);
        assert_eq!(p.reason, REASON_NAME_CONFLICT);
        assert!(
            p.message.starts_with("Deployment moo exists"),
            "{}",
            p.message
        );
        assert!(p.message.contains("; Service moo exists"), "{}", p.message);

        // Ready=False/NameConflict whatever the children look like; one Warning on entry.
        let lc = lolcow(30080, Some("Hello"));
        let s = status(&lc, None, None, Some(&p), t(1));
        let ready = find(&s.conditions, "Ready").unwrap();
        assert_eq!(
            (ready.status.as_str(), ready.reason.as_str()),
            ("False", REASON_NAME_CONFLICT)
        );
        let rolling = vec![new_condition(
            "Ready",
            false,
            REASON_ROLLING_OUT,
            "1",
            Some(1),
            t(1),
        )];
        let a = announcement(&rolling, &s.conditions).unwrap();
        assert!(a.warning);
        assert_eq!(a.reason, REASON_NAME_CONFLICT);
        assert!(announcement(&s.conditions, &s.conditions).is_none());
    }

    #[test]
    fn announcements_only_on_transitions() {
        let c = |status: bool, reason: &str, msg: &str| {
            vec![new_condition("Ready", status, reason, msg, Some(1), t(1))]
        };
        let rolling = c(false, REASON_ROLLING_OUT, "1");
        let conflict = c(false, REASON_PORT_CONFLICT, "taken");
        let ready = c(true, REASON_SERVING, "ok");

        let first = announcement(&[], &rolling).unwrap();
        assert!(!first.warning);
        assert!(announcement(&rolling, &c(false, REASON_ROLLING_OUT, "2")).is_none());

        // Into a conflict: one Warning, also from another False reason.
        let w = announcement(&rolling, &conflict).unwrap();
        assert!(w.warning);
        assert_eq!(w.reason, REASON_PORT_CONFLICT);
        assert!(announcement(&[], &conflict).unwrap().warning);
        assert!(announcement(&ready, &conflict).unwrap().warning);
        // Staying in it: nothing.
        assert!(announcement(&conflict, &conflict).is_none());
        // Leaving it for another False reason: nothing; to True: Normal.
        assert!(announcement(&conflict, &rolling).is_none());
        let n = announcement(&rolling, &ready).unwrap();
        assert!(!n.warning);
        assert_eq!(n.note, "Ready is True: ok");
    }
}
