//! Pure builders: the Deployment a PulsarConsumer wants, and what a Deployment runs with.
//! No client here; unit-tested below. The status is described in [`crate::status`].

use std::collections::BTreeMap;

use k8s_openapi::{
    api::{
        apps::v1::Deployment,
        core::v1::{Container, ContainerPort, EnvVar, HTTPGetAction, Probe, ResourceRequirements},
    },
    apimachinery::pkg::{
        api::resource::Quantity,
        apis::meta::v1::{ObjectMeta, OwnerReference},
        util::intstr::IntOrString,
    },
};
use kube::ResourceExt;
use shared::pod_security::{restricted_container_security_context, restricted_deployment};

use crate::{OPERATOR, api::PulsarConsumer};

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

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::fixtures::consumer;
    use shared_testing::{assert_restricted_pod, selected_pod_spec};

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
        let pod = selected_pod_spec(&d);
        assert_restricted_pod(pod);
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
}
