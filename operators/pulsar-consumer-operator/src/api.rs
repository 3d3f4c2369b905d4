//! The `PulsarConsumer` API (`pulsar.pulsarconsumer.krvarma.com/v1`), compatible with the Go
//! PulsarConsumer operator: manifests written for it apply unchanged.

// Several `printcolumn(type_ = ...)` entries read to clippy as a repeated attribute.
#![allow(clippy::duplicated_attributes)]

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::{CustomResource, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// The most consumers one PulsarConsumer may ask for: a guard against typos such as
/// `replicas: 10000`.
pub const MAX_REPLICAS: i32 = 1000;

/// The longest `metadata.name`: it becomes the value of the consumers' label
/// `app.kubernetes.io/instance`, and label values are at most 63 characters.
pub const MAX_NAME_LENGTH: usize = 63;

/// A TCP port, 1 to 65535, without leading zeros, as a pattern piece (a pattern cannot be
/// assembled from constants, only from literals: hence macros).
macro_rules! port_pattern {
    () => {
        "(6553[0-5]|655[0-2][0-9]|65[0-4][0-9]{2}|6[0-4][0-9]{3}|[1-5][0-9]{4}|[1-9][0-9]{0,3})"
    };
}

/// One host: a name, an IPv4 address or a bracketed IPv6 address.
macro_rules! host_pattern {
    () => {
        r"(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9]([A-Za-z0-9.-]*[A-Za-z0-9])?)"
    };
}

/// A TCP port, 1 to 65535 (part of [`SERVER_ADDRESS_PATTERN`] and [`ADMIN_URL_PATTERN`]).
/// Before, the patterns took 1 to 99999: an object stored with such a port stays readable,
/// and validation ratcheting lets it be updated as long as that field is left as it is.
pub const PORT_PATTERN: &str = port_pattern!();

/// `spec.serverAddress`: `pulsar://` or `pulsar+ssl://`, one host (name, IPv4 or bracketed
/// IPv6) and a port from 1 to 65535 ([`PORT_PATTERN`]; the API server rejects anything
/// else).
pub const SERVER_ADDRESS_PATTERN: &str = concat!(
    r"^pulsar(\+ssl)?://",
    host_pattern!(),
    ":",
    port_pattern!(),
    "$"
);

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

    /// Number of consumers to run, from 0 to 1000 (`kubectl scale` sets it).
    /// Ignored while `autoscaling` is set: the autoscaler then drives the Deployment,
    /// and `kubectl scale` of a PulsarConsumer changes nothing until autoscaling is removed
    /// (the value is kept and applies again then).
    #[schemars(range(min = 0, max = 1000))]
    pub replicas: i32,

    /// Optional. Scale the consumers on the subscription's backlog (the messages waiting
    /// for it, as the Pulsar admin REST API reports them): `ceil(backlog /
    /// targetBacklogPerReplica)` consumers, kept within `minReplicas`..`maxReplicas` and the
    /// `behavior` rules. When set, `replicas` is ignored. Do not point a
    /// HorizontalPodAutoscaler or KEDA at the same Deployment or PulsarConsumer: only one
    /// autoscaler may drive it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub autoscaling: Option<Autoscaling>,
}

/// `spec.autoscaling.adminUrl`: `http://` or `https://`, one host (name, IPv4 or bracketed
/// IPv6), a port from 1 to 65535 ([`PORT_PATTERN`]), and nothing after it but an optional
/// `/`.
pub const ADMIN_URL_PATTERN: &str =
    concat!(r"^https?://", host_pattern!(), ":", port_pattern!(), "/?$");

/// The `adminUrl` hosts the schema refuses outright: never a Pulsar broker, whatever the
/// operator's options. IPv4 `0.x.x.x` (unspecified), `169.254.x.x` (link-local: the cloud
/// metadata service), `224.x.x.x` and above (multicast, reserved, broadcast); IPv6 `[::]`
/// and its other all-zero forms, `[fe80:...]` to `[febf:...]` (link-local) and
/// `[ffxx:...]` (multicast); the API server's names (`kubernetes`, `kubernetes.default`,
/// `kubernetes.default.svc[.<domain>]`) and `metadata.google.internal`. Loopback is left to
/// the operator, whose administrator may allow it (a development broker on the node); the
/// operator also checks what names resolve to and the IPv4-mapped IPv6 forms.
macro_rules! unsafe_admin_host_pattern {
    () => {
        r"^https?://((0|22[4-9]|2[3-5][0-9])(\.[0-9]{1,3}){3}|169\.254(\.[0-9]{1,3}){2}|\[[0:]+\]|\[[fF][eE][89aAbB][0-9a-fA-F]:[0-9A-Fa-f:.]*\]|\[[fF][fF][0-9a-fA-F]{2}:[0-9A-Fa-f:.]*\]|(?i:kubernetes(\.default(\.svc(\.[a-z0-9.-]*)?)?)?|metadata\.google\.internal)):"
    };
}

/// The `adminUrl` values [`UNSAFE_ADMIN_HOST_RULE`] refuses (RE2, as CEL's `matches` runs
/// it).
pub const UNSAFE_ADMIN_HOST_PATTERN: &str = unsafe_admin_host_pattern!();

/// The CEL rule of `spec.autoscaling.adminUrl` refusing [`UNSAFE_ADMIN_HOST_PATTERN`] (a CEL
/// raw string: no escaping). A field-level rule, so validation ratcheting keeps an object
/// stored before it updatable while its `adminUrl` stays as it is.
pub const UNSAFE_ADMIN_HOST_RULE: &str =
    concat!("!self.matches(r'", unsafe_admin_host_pattern!(), "')");

/// The message of [`UNSAFE_ADMIN_HOST_RULE`].
pub const UNSAFE_ADMIN_HOST_MESSAGE: &str = "spec.autoscaling.adminUrl must not point at an unspecified, link-local (cloud metadata), multicast or broadcast address, nor at the Kubernetes API server";

/// Backlog-based autoscaling of the consumers.
#[derive(KubeSchema, Deserialize, Serialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
#[x_kube(
    validation = Rule::new("self.minReplicas <= self.maxReplicas")
        .message("spec.autoscaling.minReplicas must not be greater than spec.autoscaling.maxReplicas")
        .field_path(".minReplicas")
)]
pub struct Autoscaling {
    /// Fewest consumers, 0 to 1000 (default 1). With 0 the Deployment scales to zero once
    /// the backlog has been 0 for `behavior.scaleDownStabilizationSeconds`, and back to at
    /// least one consumer at the first poll that finds a message waiting.
    #[serde(default = "default_min_replicas")]
    #[schemars(range(min = 0, max = 1000))]
    pub min_replicas: i32,

    /// Most consumers, 1 to 1000.
    #[schemars(range(min = 1, max = 1000))]
    pub max_replicas: i32,

    /// Backlog (messages waiting on the subscription) one consumer is expected to handle,
    /// at least 1: the autoscaler wants `ceil(backlog / targetBacklogPerReplica)` consumers.
    #[schemars(range(min = 1))]
    pub target_backlog_per_replica: i64,

    /// Base URL of the broker's admin REST API: `http://host:port` or `https://host:port`.
    /// Default: the host of `serverAddress` with Pulsar's standard web service port,
    /// `http://<host>:8080` for `pulsar://` and `https://<host>:8443` for `pulsar+ssl://`.
    /// The operator reads `GET <adminUrl>/admin/v2/<persistent|non-persistent>/<tenant>/<namespace>/<topic>/stats`
    /// (`/partitioned-stats` for a partitioned topic) without credentials. It reads only a
    /// Service of the PulsarConsumer's own namespace, by name (`<service>.<namespace>`,
    /// `<service>.<namespace>.svc[.<cluster domain>]`, or a headless Service's pod), or an
    /// address its administrator allows every namespace (a shared broker's, say); any other
    /// host, another namespace's Service and every literal IP address included, gives
    /// `ScalingActive=False` with reason `AdminTargetNotAllowed` until the administrator
    /// lists its address. It never connects to loopback, link-local (cloud metadata),
    /// unspecified, multicast or broadcast addresses, nor to the Kubernetes API server,
    /// unless its administrator allows them; the link-local, unspecified, multicast and
    /// broadcast addresses and the API server's names are refused here already. Every read
    /// that fails otherwise (no connection, an HTTP error, not a topic's stats, too large,
    /// no such topic or subscription) gives the same reason, `AdminAPIUnavailable`, and the
    /// same message.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 256), pattern(ADMIN_URL_PATTERN))]
    #[x_kube(validation = Rule::new(UNSAFE_ADMIN_HOST_RULE).message(UNSAFE_ADMIN_HOST_MESSAGE))]
    pub admin_url: Option<String>,

    /// Seconds between two reads of the backlog, 1 to 3600 (default 15). The operator reads
    /// no more often than its floor (5 seconds unless its administrator set another). A
    /// failed read is retried with backoff (doubling up to 2 minutes) and leaves the
    /// replicas as they are.
    #[serde(default = "default_poll_interval_seconds")]
    #[schemars(range(min = 1, max = 3600))]
    pub poll_interval_seconds: i32,

    /// How fast to scale, as a HorizontalPodAutoscaler's `behavior`. Default: scale up at
    /// once, scale down once the lower count has been wanted for 300 seconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub behavior: Option<ScalingBehavior>,
}

/// How fast the autoscaler changes the number of consumers.
#[derive(KubeSchema, Deserialize, Serialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ScalingBehavior {
    /// Seconds a lower consumer count must have been wanted before scaling down to it,
    /// 0 to 3600 (default 300): the autoscaler scales down only to the highest count it
    /// wanted within this window, so a backlog that dips for a moment does not stop
    /// consumers. Scaling up is never delayed.
    #[serde(default = "default_stabilization_seconds")]
    #[schemars(range(min = 0, max = 3600))]
    pub scale_down_stabilization_seconds: i32,

    /// Optional. At most `maxStep` consumers added per `periodSeconds` (unset: no limit).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scale_up: Option<StepLimit>,

    /// Optional. At most `maxStep` consumers removed per `periodSeconds` (unset: no limit).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scale_down: Option<StepLimit>,
}

/// A limit on how many consumers one period may add or remove.
#[derive(KubeSchema, Deserialize, Serialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct StepLimit {
    /// Most consumers added (or removed) within any `periodSeconds`, 1 to 1000.
    #[schemars(range(min = 1, max = 1000))]
    pub max_step: i32,

    /// Length of the period in seconds, 1 to 1800 (default 15).
    #[serde(default = "default_period_seconds")]
    #[schemars(range(min = 1, max = 1800))]
    pub period_seconds: i32,
}

fn default_min_replicas() -> i32 {
    1
}

fn default_poll_interval_seconds() -> i32 {
    15
}

fn default_stabilization_seconds() -> i32 {
    300
}

fn default_period_seconds() -> i32 {
    15
}

impl Default for ScalingBehavior {
    /// The defaults of every field: a 300-second scale-down window, no step limits.
    fn default() -> Self {
        Self {
            scale_down_stabilization_seconds: default_stabilization_seconds(),
            scale_up: None,
            scale_down: None,
        }
    }
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

    /// With autoscaling: the subscription's backlog (messages waiting) at the last
    /// successful read of the admin API.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backlog: Option<i64>,

    /// With autoscaling: the number of consumers the autoscaler wants (what the
    /// Deployment is given).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub desired_replicas: Option<i32>,

    /// With autoscaling: when the autoscaler last changed the number of consumers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_scale_time: Option<Time>,

    /// `Ready`: every wanted consumer runs the current spec and is ready.
    /// `Progressing`: a rollout or scaling is under way.
    /// `NameConflict` (as reason of both): the Deployment's name is held by a Deployment
    /// this PulsarConsumer does not control; it is left untouched.
    /// With autoscaling, `ScalingActive`: the backlog can be read (`False`, with the reason,
    /// when the admin API cannot be read: the replicas are then left as they are) and
    /// `ScalingLimited`: the backlog asks for more than `maxReplicas` (`TooManyReplicas`) or
    /// fewer than `minReplicas` (`TooFewReplicas`).
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
                "pulsar://h:1",
                "pulsar://h:9",
                "pulsar://h:65535",
                "pulsar://h:65529",
                "pulsar://h:64999",
                "pulsar://h:59999",
            ],
            &[
                "http://x:1",
                "pulsar://localhost",
                "pulsar://localhost:",
                "pulsar://localhost:0",
                "pulsar://localhost:06650",
                "pulsar://localhost:65536",
                "pulsar://localhost:70000",
                "pulsar://localhost:99999",
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

    #[test]
    fn autoscaling_is_validated_in_the_schema() {
        let crd = serde_json::to_value(PulsarConsumer::crd()).unwrap();
        let autoscaling = &crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
            ["properties"]["autoscaling"];
        let rules = autoscaling["x-kubernetes-validations"].as_array().unwrap();
        assert_eq!(rules[0]["rule"], "self.minReplicas <= self.maxReplicas");
        assert_eq!(rules[0]["fieldPath"], ".minReplicas");
        let props = &autoscaling["properties"];
        assert_eq!(props["minReplicas"]["default"], 1);
        assert_eq!(props["minReplicas"]["minimum"], 0.0);
        assert_eq!(props["targetBacklogPerReplica"]["minimum"], 1.0);
        assert_eq!(props["pollIntervalSeconds"]["default"], 15);
        assert_eq!(
            props["behavior"]["properties"]["scaleDownStabilizationSeconds"]["default"],
            300
        );
        let required: Vec<&str> = autoscaling["required"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|v| v.as_str())
            .collect();
        assert_eq!(required, ["maxReplicas", "targetBacklogPerReplica"]);
        check(
            ADMIN_URL_PATTERN,
            &[
                "http://pulsar-broker.pulsar:8080",
                "https://10.0.0.7:8443/",
                "http://[::1]:18080",
                "http://broker:65535",
            ],
            &[
                "http://broker",
                "http://broker:0",
                "http://broker:65536",
                "http://broker:99999",
                "ftp://broker:21",
                "http://broker:8080/admin",
                "http://user@broker:8080",
                "",
            ],
        );
        // Hosts refused outright, and their neighbours that are not.
        check(
            UNSAFE_ADMIN_HOST_PATTERN,
            &[
                "http://0.0.0.0:8080",
                "http://169.254.169.254:80",
                "https://169.254.0.1:443/",
                "http://224.0.0.1:8080",
                "http://255.255.255.255:8080",
                "http://[::]:8080",
                "http://[0:0:0:0:0:0:0:0]:8080",
                "http://[fe80::1]:8080",
                "http://[FEBF::1]:8080",
                "http://[ff02::1]:8080",
                "http://kubernetes:443",
                "https://kubernetes.default:443",
                "https://Kubernetes.Default.svc:443",
                "https://kubernetes.default.svc.cluster.local:443",
                "http://metadata.google.internal:80",
            ],
            &[
                "http://127.0.0.1:18080",
                "http://[::1]:18080",
                "http://10.96.0.1:443",
                "http://100.64.0.1:8080",
                "http://223.255.0.1:8080",
                "http://169.25.0.1:8080",
                "http://0broker:8080",
                "http://kubernetes-broker:8080",
                "http://kubernetes.pulsar:8080",
                "http://pulsar-broker.pulsar.svc:8080",
                "http://[fd00::1]:8080",
                "http://[fe7f::1]:8080",
                "http://[ff2::1]:8080",
            ],
        );
        assert_eq!(
            UNSAFE_ADMIN_HOST_RULE,
            format!("!self.matches(r'{UNSAFE_ADMIN_HOST_PATTERN}')")
        );
        let admin_url = &props["adminUrl"];
        assert_eq!(
            admin_url["x-kubernetes-validations"][0]["rule"],
            UNSAFE_ADMIN_HOST_RULE
        );
        assert!(
            admin_url["x-kubernetes-validations"][0]["message"]
                .as_str()
                .unwrap()
                .starts_with("spec.autoscaling.adminUrl ")
        );
        // The defaults of a minimal spec, as the API server fills them in.
        let a: Autoscaling = serde_json::from_value(serde_json::json!({
            "maxReplicas": 2, "targetBacklogPerReplica": 5
        }))
        .unwrap();
        assert_eq!((a.min_replicas, a.poll_interval_seconds), (1, 15));
        assert_eq!(
            ScalingBehavior::default().scale_down_stabilization_seconds,
            300
        );
    }
}
