//! The `PulsarConsumer` API (`pulsar.pulsarconsumer.krvarma.com/v1`), compatible with the Go
//! PulsarConsumer operator: manifests written for it apply unchanged.

// Several `printcolumn(type_ = ...)` entries read to clippy as a repeated attribute.
#![allow(clippy::duplicated_attributes)]

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::{CustomResource, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// The most consumers one PulsarConsumer may ask for: a guard against typos such as
/// `replicas: 10000`.
pub const MAX_REPLICAS: i32 = 1000;

/// The longest `metadata.name`: it becomes the value of the consumers' label
/// `app.kubernetes.io/instance`, and label values are at most 63 characters.
pub const MAX_NAME_LENGTH: usize = 63;

/// `spec.serverAddress`: `pulsar://` or `pulsar+ssl://`, one host (name, IPv4 or bracketed
/// IPv6) and a port from 1 to 99999 (the API server rejects anything else; the consumer
/// checks the port range).
pub const SERVER_ADDRESS_PATTERN: &str = r"^pulsar(\+ssl)?://(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9]([A-Za-z0-9.-]*[A-Za-z0-9])?):[1-9][0-9]{0,4}$";

/// `spec.topic`: a short name (`my-topic`), `tenant/namespace/topic`, or the same with a
/// `persistent://` or `non-persistent://` domain.
pub const TOPIC_PATTERN: &str =
    r"^(((persistent|non-persistent)://)?[A-Za-z0-9_=:.-]+/[A-Za-z0-9_=:.-]+/[^\s/]+|[^\s/:]+)$";

/// `spec.subscriptionName`: no whitespace and no `/`.
pub const SUBSCRIPTION_PATTERN: &str = r"^[^\s/]+$";

/// The consumers wanted: which topic, from which broker, under which subscription, how many.
#[derive(CustomResource, KubeSchema, Deserialize, Serialize, Clone, Debug, PartialEq)]
#[kube(
    group = "pulsar.pulsarconsumer.krvarma.com",
    version = "v1",
    kind = "PulsarConsumer",
    plural = "pulsarconsumers",
    namespaced,
    shortname = "pcon",
    category = "rust-operators",
    status = "PulsarConsumerStatus",
    derive = "PartialEq",
    doc = "A PulsarConsumer runs `spec.replicas` consumers of one Apache Pulsar topic (a Deployment of the pulsar-consumer app), all sharing one subscription.",
    validation = Rule::new("size(self.metadata.name) <= 63").message(
        "metadata.name must be at most 63 characters: it is the value of the consumers' label app.kubernetes.io/instance"
    ),
    scale(
        spec_replicas_path = ".spec.replicas",
        status_replicas_path = ".status.currentReplicas",
        label_selector_path = ".status.selector"
    ),
    printcolumn(
        name = "Server",
        type_ = "string",
        json_path = ".status.server",
        description = "Broker the consumers are deployed with"
    ),
    printcolumn(
        name = "Topic",
        type_ = "string",
        json_path = ".status.topic",
        description = "Topic the consumers are deployed with"
    ),
    printcolumn(
        name = "Subscription",
        type_ = "string",
        json_path = ".status.subscription",
        description = "Subscription the consumers are deployed with"
    ),
    printcolumn(
        name = "Replicas",
        type_ = "integer",
        json_path = ".status.replicas",
        description = "Consumers that are ready"
    ),
    printcolumn(
        name = "Ready",
        type_ = "string",
        json_path = ".status.conditions[?(@.type==\"Ready\")].status",
        description = "Whether every wanted consumer runs the current spec and is ready"
    ),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[serde(rename_all = "camelCase")]
pub struct PulsarConsumerSpec {
    /// Broker service URL: `pulsar://host:port` or `pulsar+ssl://host:port`.
    /// Example: `pulsar://pulsar-broker.pulsar:6650`.
    /// Given to the consumers as `PULSAR_SERVER`.
    #[schemars(length(min = 1, max = 256), pattern(SERVER_ADDRESS_PATTERN))]
    pub server_address: String,

    /// Topic to consume, in one of these forms:
    /// `my-topic` (short: in tenant `public`, namespace `default`),
    /// `tenant/namespace/topic`,
    /// `persistent://tenant/namespace/topic`,
    /// `non-persistent://tenant/namespace/topic`.
    /// Given to the consumers as `PULSAR_TOPIC`.
    #[schemars(length(min = 1, max = 512), pattern(TOPIC_PATTERN))]
    pub topic: String,

    /// Name of the Shared subscription: the consumers split the topic's messages.
    /// No whitespace and no `/`.
    /// Given to the consumers as `PULSAR_SUBSCRIPTION_NAME`.
    #[schemars(length(min = 1, max = 256), pattern(SUBSCRIPTION_PATTERN))]
    pub subscription_name: String,

    /// Number of consumers to run, from 0 to 1000.
    #[schemars(range(min = 0, max = 1000))]
    pub replicas: i32,
}

/// What is deployed: the settings of the consumers' Deployment and how many are ready.
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PulsarConsumerStatus {
    /// Broker service URL the consumers' Deployment runs with.
    #[serde(default)]
    pub server: String,

    /// Topic the consumers' Deployment runs with.
    #[serde(default)]
    pub topic: String,

    /// Subscription the consumers' Deployment runs with.
    #[serde(default)]
    pub subscription: String,

    /// Number of consumers that are ready (connected to the broker).
    #[serde(default)]
    pub replicas: i32,

    /// Number of consumer pods that exist, ready or not (old and new during a rollout).
    /// The scale subresource reports it.
    #[serde(default)]
    pub current_replicas: i32,

    /// Label selector of the consumer pods, for the scale subresource (`kubectl scale`, HPA).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub selector: String,

    /// The `metadata.generation` this status describes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,

    /// `Ready`: every wanted consumer runs the current spec and is ready.
    /// `Progressing`: a rollout or scaling is under way.
    #[serde(default)]
    pub conditions: Vec<Condition>,
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use kube::CustomResourceExt;
    use regex::Regex;

    fn check(pattern: &str, good: &[&str], bad: &[&str]) {
        let re = Regex::new(pattern).unwrap();
        for g in good {
            assert!(re.is_match(g), "{g:?} must match {pattern}");
        }
        for b in bad {
            assert!(!re.is_match(b), "{b:?} must not match {pattern}");
        }
    }

    #[test]
    fn server_address_pattern() {
        check(
            SERVER_ADDRESS_PATTERN,
            &[
                "pulsar://localhost:6650",
                "pulsar+ssl://broker.pulsar.svc.cluster.local:6651",
                "pulsar://10.0.0.7:6650",
                "pulsar://[::1]:6650",
            ],
            &[
                "http://x:1",
                "pulsar://localhost",
                "pulsar://localhost:",
                "pulsar://localhost:0",
                "pulsar://localhost:123456",
                "pulsar://a,b:6650",
                "pulsar://user@host:6650",
                "pulsar://host:6650/path",
                "PULSAR://host:6650",
                " pulsar://host:6650",
                "",
            ],
        );
    }

    #[test]
    fn topic_pattern() {
        check(
            TOPIC_PATTERN,
            &[
                "my-topic",
                "acme/orders/in",
                "persistent://public/default/my-topic",
                "non-persistent://public/default/t-partition-0",
            ],
            &[
                "",
                "persistent://only-tenant",
                "persistent://tenant/topic",
                "persistent://tenant/ns/topic/extra",
                "persistent://tenant//topic",
                "persistent:///ns/topic",
                "persistent://tenant/ns/",
                "http://tenant/ns/topic",
                "tenant/topic",
                "my topic",
                "persistent://ten ant/ns/topic",
            ],
        );
    }

    #[test]
    fn subscription_pattern() {
        check(
            SUBSCRIPTION_PATTERN,
            &["first-subscription", "sub_1.a"],
            &["", "a b", "a/b", "tab\there"],
        );
    }

    #[test]
    fn crd_keeps_the_original_api() {
        let crd = PulsarConsumer::crd();
        assert_eq!(
            crd.metadata.name.as_deref(),
            Some("pulsarconsumers.pulsar.pulsarconsumer.krvarma.com")
        );
        let version = &crd.spec.versions[0];
        assert_eq!(version.name, "v1");
        let columns: Vec<_> = version
            .additional_printer_columns
            .iter()
            .flatten()
            .map(|c| c.name.as_str())
            .collect();
        assert_eq!(
            columns,
            [
                "Server",
                "Topic",
                "Subscription",
                "Replicas",
                "Ready",
                "Age"
            ]
        );
        let scale = version
            .subresources
            .as_ref()
            .and_then(|s| s.scale.as_ref())
            .unwrap();
        assert_eq!(scale.spec_replicas_path, ".spec.replicas");
        assert_eq!(scale.status_replicas_path, ".status.currentReplicas");
    }
}
