//! Pure builders: the Deployment and Service a Lolcow wants, and what the observed
//! children are configured with. No client here; unit-tested below. The status is
//! described in [`crate::status`].

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
        apis::meta::v1::{ObjectMeta, OwnerReference},
        util::intstr::IntOrString,
    },
};
use kube::ResourceExt;
use shared::pod_security::{restricted_container_security_context, restricted_deployment};

use crate::{
    OPERATOR,
    api::{DEFAULT_IMAGE, Lolcow},
};

/// The `app.kubernetes.io/name` of every child.
pub const APP: &str = "lolcow";
/// The name of the web app's container.
pub const CONTAINER: &str = "lolcow";
/// The port the web app listens on in its container (the image's `PORT`).
pub const CONTAINER_PORT: i32 = 8080;
/// The name of that port.
pub const PORT_NAME: &str = "http";
/// The port of the web app's probe listener (the image's `PROBE_PORT`): `/healthz` for the
/// kubelet only. No Service targets it, so clients of the page, however many, cannot keep
/// the probes from being answered (and the pod from being restarted).
pub const PROBE_PORT: i32 = 8081;
/// The name of that port (the probes refer to it).
pub const PROBE_PORT_NAME: &str = "probes";
/// The environment variable the web app reads its probe port from.
pub const PROBE_PORT_ENV: &str = "PROBE_PORT";
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
            port: IntOrString::String(PROBE_PORT_NAME.to_owned()),
            ..HTTPGetAction::default()
        }),
        period_seconds: Some(period_seconds),
        ..Probe::default()
    }
}

/// The web app's Deployment: named like the Lolcow, one replica of `image` with the
/// greeting in `GREETING`, the page on port 8080 named `http`, probes on `/healthz` of
/// port 8081 named `probes` (a listener of its own), under the `restricted` Pod Security
/// Standard with a read-only root filesystem.
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
            EnvVar {
                name: PROBE_PORT_ENV.to_owned(),
                value: Some(PROBE_PORT.to_string()),
                ..EnvVar::default()
            },
        ]),
        ports: Some(vec![
            ContainerPort {
                name: Some(PORT_NAME.to_owned()),
                container_port: CONTAINER_PORT,
                protocol: Some("TCP".to_owned()),
                ..ContainerPort::default()
            },
            ContainerPort {
                name: Some(PROBE_PORT_NAME.to_owned()),
                container_port: PROBE_PORT,
                protocol: Some("TCP".to_owned()),
                ..ContainerPort::default()
            },
        ]),
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

/// How the Service routes traffic arriving at a node: `Local`, to the page's pod on that
/// node only, so the client's address is kept (no SNAT) and the page's per-client limits
/// count real clients, not the node that masqueraded them all (`Cluster`, the default). The
/// price: the NodePort answers on the node that runs the pod (the one real node of the local
/// cluster; on a cluster of several, open the page on the pod's node, or put a load
/// balancer that checks the nodes in front).
pub const EXTERNAL_TRAFFIC_POLICY: &str = "Local";

/// The Service: named like the Lolcow, type NodePort, port 80 to the container's 8080,
/// `nodePort = spec.port`, [`EXTERNAL_TRAFFIC_POLICY`]. The page only: never the probe port.
#[must_use]
pub fn desired_service(lc: &Lolcow, owner: OwnerReference) -> Service {
    Service {
        metadata: child_meta(lc, owner),
        spec: Some(ServiceSpec {
            type_: Some("NodePort".to_owned()),
            external_traffic_policy: Some(EXTERNAL_TRAFFIC_POLICY.to_owned()),
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

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::fixtures::lolcow;
    use shared_testing::{assert_restricted_pod, selected_pod_spec};

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
        let pod = selected_pod_spec(&d);
        assert_restricted_pod(pod);
        let c = &pod.containers[0];
        assert_eq!(c.image.as_deref(), Some("registry.local/lolcow-web:1"));
        let ports: Vec<_> = c
            .ports
            .clone()
            .unwrap()
            .into_iter()
            .map(|p| (p.name.unwrap(), p.container_port))
            .collect();
        assert_eq!(
            ports,
            [("http".to_owned(), 8080), ("probes".to_owned(), 8081)]
        );
        let env = |name: &str| {
            c.env
                .iter()
                .flatten()
                .find(|e| e.name == name)
                .and_then(|e| e.value.clone())
        };
        assert_eq!(env("PORT").as_deref(), Some("8080"));
        assert_eq!(env("PROBE_PORT").as_deref(), Some("8081"));
        // Both probes on the probe listener, which no Service exposes.
        for probe in [c.readiness_probe.clone(), c.liveness_probe.clone()] {
            let get = probe.unwrap().http_get.unwrap();
            assert_eq!(get.path.as_deref(), Some("/healthz"));
            assert_eq!(get.port, IntOrString::String("probes".into()));
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
        // Clients keep their own address (no SNAT by the node), so the page's per-client
        // limits count them apart.
        assert_eq!(spec.external_traffic_policy.as_deref(), Some("Local"));
        assert_eq!(spec.selector.unwrap(), selector_labels(&lc));
        let ports = spec.ports.unwrap();
        assert_eq!(ports.len(), 1, "the Service exposes the page alone");
        let p = &ports[0];
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
}
