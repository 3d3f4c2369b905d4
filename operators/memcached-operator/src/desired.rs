//! Pure builders: the Deployment, Service and (optional) NetworkPolicy a Memcached wants,
//! and which pods are its own.
//! No client here; unit-tested below. The status is described in [`crate::status`].

use std::collections::BTreeMap;

use k8s_openapi::{
    api::{
        apps::v1::Deployment,
        core::v1::{
            Container, ContainerPort, Probe, ResourceRequirements, Service, ServicePort,
            ServiceSpec, TCPSocketAction,
        },
        networking::v1::{
            NetworkPolicy, NetworkPolicyIngressRule, NetworkPolicyPeer, NetworkPolicyPort,
            NetworkPolicySpec,
        },
    },
    apimachinery::pkg::{
        api::resource::Quantity,
        apis::meta::v1::{LabelSelector, LabelSelectorRequirement, ObjectMeta, OwnerReference},
        util::intstr::IntOrString,
    },
};
use kube::ResourceExt;
use shared::pod_security::{restricted_container_security_context, restricted_deployment};
use shared::slim::SlimPod;

use crate::{OPERATOR, api::Memcached};

/// The `app.kubernetes.io/name` of everything this operator creates.
pub const APP: &str = "memcached";
/// The label naming the Memcached a child belongs to.
pub const INSTANCE_LABEL: &str = "app.kubernetes.io/instance";
/// The label the Deployment controller gives a pod: the hash of its ReplicaSet's template.
const TEMPLATE_HASH_LABEL: &str = "pod-template-hash";
/// The label the API server sets on every namespace, to its name: what a NetworkPolicy
/// selects a namespace by.
pub const NAMESPACE_NAME_LABEL: &str = "kubernetes.io/metadata.name";
/// Name of the container and of its port (the Service targets the port by this name).
pub const CONTAINER: &str = "memcached";
/// `spec.clusterIP` of a headless Service.
pub const HEADLESS: &str = "None";
/// The non-root user memcached runs as (as in the Go original).
pub const POD_USER: i64 = 1001;
/// The memcached command line before its port (64 MB of item memory, modern defaults,
/// verbose), as in the Go original; [`command`] adds `-p <port>`.
/// `-m 64`, not the tutorial's `-m=64`: memcached parses the latter as 0 MB
/// and, before 1.6.2x, exits ("Cannot set item size limit higher than 1/2 of
/// memory max"), as Debian's 1.6.18 did when the pods first really ran.
pub const COMMAND: [&str; 6] = ["memcached", "-m", "64", "-o", "modern", "-v"];

/// The memcached command line of `mc`: [`COMMAND`] and `-p <spec.containerPort>`. The Go
/// original left out `-p`, so memcached listened on 11211 whatever the port: the Service
/// sent a non-default port to a port nothing listened on.
#[must_use]
pub fn command(mc: &Memcached) -> Vec<String> {
    let mut command: Vec<String> = COMMAND.iter().map(|s| (*s).to_owned()).collect();
    command.extend(["-p".to_owned(), mc.spec.port().to_string()]);
    command
}

/// The readiness probe of the memcached container: a TCP connect to its named port, every
/// 5 s. A pod is Ready (in the Service's endpoints, counted in the status) only once
/// memcached accepts connections on the port the Service sends to.
///
/// No liveness probe: memcached that exits is restarted by the kubelet anyway, and a probe
/// on the port every client of the Service reaches would let anyone who holds its
/// connections open (memcached accepts 1,024 by default) get it restarted, which
/// empties the cache. Readiness only takes it out of the endpoints meanwhile.
#[must_use]
pub fn readiness_probe() -> Probe {
    Probe {
        tcp_socket: Some(TCPSocketAction {
            port: IntOrString::String(CONTAINER.to_owned()),
            ..TCPSocketAction::default()
        }),
        period_seconds: Some(5),
        ..Probe::default()
    }
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
/// `memcached -m 64 -o modern -v -p <containerPort>` as user 1001 under the `restricted`
/// Pod Security Standard, with a read-only root filesystem, no service account token and
/// a TCP readiness probe on the port.
#[must_use]
pub fn desired_deployment(mc: &Memcached, owner: OwnerReference, image: &str) -> Deployment {
    let mut pod_labels = selector_labels(mc);
    pod_labels.extend(labels(mc));
    let container = Container {
        name: CONTAINER.to_owned(),
        image: Some(image.to_owned()),
        command: Some(command(mc)),
        ports: Some(vec![ContainerPort {
            name: Some(CONTAINER.to_owned()),
            container_port: mc.spec.port(),
            protocol: Some("TCP".to_owned()),
            ..ContainerPort::default()
        }]),
        readiness_probe: Some(readiness_probe()),
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

/// The Service of `mc`: named after it, `containerPort` to the pods' `memcached` port,
/// headless (`clusterIP: None`).
///
/// Headless because memcached servers do not share their keys: a client spreads keys over
/// the servers it knows, so it needs each pod's address (the name resolves to the ready
/// pods' IPs, and `_memcached._tcp.<name>` lists them as SRV records, which dnssrv
/// discovery reads). A virtual IP would send each connection to any pod, and a value set
/// through one connection would be missed through the next. It also costs the cluster
/// less: no address to allocate and no proxy rules on every node.
#[must_use]
pub fn desired_service(mc: &Memcached, owner: OwnerReference) -> Service {
    Service {
        metadata: metadata(mc, owner),
        spec: Some(ServiceSpec {
            cluster_ip: Some(HEADLESS.to_owned()),
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

/// The NetworkPolicy of `mc`, when `spec.networkPolicy` asks for one (set, `enabled`);
/// `None` otherwise. Named after the Memcached, it selects the memcached pods (the
/// Deployment's selector) and admits ingress only to `containerPort` (TCP), only from the
/// pods of the Memcached's own namespace and from every pod of the namespaces in
/// `allowedNamespaces` (selected by their `kubernetes.io/metadata.name` label, sorted and
/// without duplicates, so the object does not change with the list's order). Egress is
/// left alone: memcached opens no connections.
#[must_use]
pub fn desired_network_policy(mc: &Memcached, owner: OwnerReference) -> Option<NetworkPolicy> {
    let wanted = mc.spec.network_policy()?;
    // `podSelector: {}` alone in a peer: every pod of the policy's own namespace.
    let mut from = vec![NetworkPolicyPeer {
        pod_selector: Some(LabelSelector::default()),
        ..NetworkPolicyPeer::default()
    }];
    let namespaces: Vec<String> = wanted
        .allowed_namespaces
        .iter()
        .collect::<std::collections::BTreeSet<_>>()
        .into_iter()
        .cloned()
        .collect();
    if !namespaces.is_empty() {
        from.push(NetworkPolicyPeer {
            namespace_selector: Some(LabelSelector {
                match_expressions: Some(vec![LabelSelectorRequirement {
                    key: NAMESPACE_NAME_LABEL.to_owned(),
                    operator: "In".to_owned(),
                    values: Some(namespaces),
                }]),
                match_labels: None,
            }),
            ..NetworkPolicyPeer::default()
        });
    }
    Some(NetworkPolicy {
        metadata: metadata(mc, owner),
        spec: Some(NetworkPolicySpec {
            pod_selector: Some(LabelSelector {
                match_labels: Some(selector_labels(mc)),
                match_expressions: None,
            }),
            policy_types: Some(vec!["Ingress".to_owned()]),
            ingress: Some(vec![NetworkPolicyIngressRule {
                from: Some(from),
                ports: Some(vec![NetworkPolicyPort {
                    port: Some(IntOrString::Int(mc.spec.port())),
                    protocol: Some("TCP".to_owned()),
                    end_port: None,
                }]),
            }]),
            egress: None,
        }),
    })
}

/// Whether `pod` is a pod of the Deployment `deployment` (named after the Memcached): its
/// controller is a ReplicaSet `<deployment>-<pod-template-hash>`. Labels alone could be
/// copied by anyone; this also needs the owner the Deployment controller sets.
#[must_use]
pub fn is_pod_of(pod: &SlimPod, deployment: &str) -> bool {
    let Some(hash) = pod.labels().get(TEMPLATE_HASH_LABEL) else {
        return false;
    };
    let rs_name = format!("{deployment}-{hash}");
    pod.owner_references()
        .iter()
        .any(|r| r.controller == Some(true) && r.kind == "ReplicaSet" && r.name == rs_name)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::fixtures::{memcached, owner, slim_pod};

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
            ["memcached", "-m", "64", "-o", "modern", "-v", "-p", "11211"]
        );
        let port = &c.ports.as_ref().unwrap()[0];
        assert_eq!(port.container_port, 11211);
        assert_eq!(port.name.as_deref(), Some("memcached"));
        let probe = c.readiness_probe.as_ref().unwrap();
        assert_eq!(
            probe.tcp_socket.as_ref().unwrap().port,
            IntOrString::String("memcached".into())
        );
        assert!(c.liveness_probe.is_none());
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
        assert_eq!(spec.cluster_ip.as_deref(), Some(HEADLESS));
        let d = desired_deployment(&mc, owner(), "img");
        let c = &d.spec.unwrap().template.spec.unwrap().containers[0];
        assert_eq!(c.ports.as_ref().unwrap()[0].container_port, 12345);
    }

    #[test]
    fn memcached_listens_where_the_service_and_the_probe_point() {
        // The port the Service sends to, the port memcached is told to listen on and the
        // port the readiness probe checks are one: a pod is Ready only when the Service
        // reaches memcached.
        for port in [11211, 11311, 1, 65535] {
            let mc = memcached(1, Some(port));
            let d = desired_deployment(&mc, owner(), "img");
            let c = &d.spec.unwrap().template.spec.unwrap().containers[0];
            let command = c.command.clone().unwrap();
            let p = command.iter().position(|a| a == "-p").unwrap();
            assert_eq!(command[p + 1], port.to_string(), "{command:?}");
            let named = &c.ports.as_ref().unwrap()[0];
            assert_eq!(
                (named.name.as_deref(), named.container_port),
                (Some(CONTAINER), port)
            );
            let probe = c.readiness_probe.as_ref().unwrap().tcp_socket.clone();
            assert_eq!(probe.unwrap().port, IntOrString::String(CONTAINER.into()));
            let s = desired_service(&mc, owner()).spec.unwrap();
            let sp = &s.ports.unwrap()[0];
            assert_eq!(
                (sp.port, sp.target_port.clone()),
                (port, Some(IntOrString::String(CONTAINER.into())))
            );
        }
    }

    fn with_policy(enabled: bool, namespaces: &[&str]) -> Memcached {
        let mut mc = memcached(2, Some(11311));
        mc.spec.network_policy = Some(crate::api::MemcachedNetworkPolicy {
            enabled,
            allowed_namespaces: namespaces.iter().map(|n| (*n).to_owned()).collect(),
        });
        mc
    }

    #[test]
    fn no_network_policy_unless_asked_for() {
        assert_eq!(desired_network_policy(&memcached(1, None), owner()), None);
        assert_eq!(
            desired_network_policy(&with_policy(false, &["web"]), owner()),
            None
        );
        assert!(desired_network_policy(&with_policy(true, &[]), owner()).is_some());
    }

    #[test]
    fn network_policy_admits_the_port_from_its_namespace_and_the_allowed_ones() {
        let mc = with_policy(true, &["web", "batch", "web"]);
        let np = desired_network_policy(&mc, owner()).unwrap();
        // Named, labelled and owned as the other children.
        assert_eq!(np.metadata.name.as_deref(), Some("cache"));
        assert_eq!(np.metadata.namespace.as_deref(), Some("ns"));
        assert_eq!(np.metadata.labels.as_ref(), Some(&labels(&mc)));
        assert_eq!(np.metadata.owner_references, Some(vec![owner()]));
        let spec = np.spec.unwrap();
        // The memcached pods, exactly as the Deployment selects them.
        let d = desired_deployment(&mc, owner(), "img");
        assert_eq!(
            spec.pod_selector.unwrap().match_labels,
            d.spec.unwrap().selector.match_labels
        );
        assert_eq!(spec.policy_types, Some(vec!["Ingress".to_owned()]));
        assert_eq!(spec.egress, None);
        let rules = spec.ingress.unwrap();
        assert_eq!(rules.len(), 1, "one rule: these peers, this port");
        let ports = rules[0].ports.clone().unwrap();
        assert_eq!(
            ports,
            [NetworkPolicyPort {
                port: Some(IntOrString::Int(11311)),
                protocol: Some("TCP".into()),
                end_port: None,
            }]
        );
        let from = rules[0].from.clone().unwrap();
        assert_eq!(from.len(), 2);
        // Its own namespace: every pod there, nothing else.
        assert_eq!(
            from[0],
            NetworkPolicyPeer {
                pod_selector: Some(LabelSelector::default()),
                ..NetworkPolicyPeer::default()
            }
        );
        // The named namespaces, sorted, once each, by the label the API server sets.
        let selector = from[1].namespace_selector.clone().unwrap();
        assert_eq!(from[1].pod_selector, None);
        assert_eq!(from[1].ip_block, None);
        assert_eq!(selector.match_labels, None);
        assert_eq!(
            selector.match_expressions.unwrap(),
            [LabelSelectorRequirement {
                key: "kubernetes.io/metadata.name".into(),
                operator: "In".into(),
                values: Some(vec!["batch".into(), "web".into()]),
            }]
        );
        // The same namespaces in another order: the same object (no write).
        assert_eq!(
            desired_network_policy(&with_policy(true, &["batch", "web"]), owner()),
            desired_network_policy(&mc, owner())
        );
    }

    #[test]
    fn network_policy_of_its_own_namespace_only() {
        let np = desired_network_policy(&with_policy(true, &[]), owner()).unwrap();
        let from = np.spec.unwrap().ingress.unwrap()[0].from.clone().unwrap();
        assert_eq!(
            from,
            [NetworkPolicyPeer {
                pod_selector: Some(LabelSelector::default()),
                ..NetworkPolicyPeer::default()
            }]
        );
        // As the API server receives it: `podSelector: {}`, the empty selector, not absent.
        let json = serde_json::to_value(&from[0]).unwrap();
        assert_eq!(json, serde_json::json!({"podSelector": {}}));
    }

    #[test]
    fn pods_of_the_deployment_only() {
        let p = slim_pod("cache-abc-1", true, false);
        assert!(is_pod_of(&p, "cache"));
        assert!(!is_pod_of(&p, "other"));
        let mut stranger = p.clone();
        stranger.metadata.owner_references = None;
        assert!(!is_pod_of(&stranger, "cache"));
    }
}
