//! The `Memcached` API (`cache.example.com/v1alpha1`), compatible with the operator-sdk
//! tutorial operator: manifests written for it apply unchanged.

// Several `printcolumn(type_ = ...)` entries read to clippy as a repeated attribute.
#![allow(clippy::duplicated_attributes)]

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::{CustomResource, KubeSchema};
use serde::{Deserialize, Serialize};

/// The most memcached pods one Memcached may ask for: a guard against typos such as `size: 1000`.
pub const MAX_SIZE: i32 = 100;

/// The port memcached listens on when `spec.containerPort` is unset.
pub const DEFAULT_PORT: i32 = 11211;

/// The image run when the operator's `MEMCACHED_IMAGE` is not set (pinned, not `latest`).
pub const DEFAULT_IMAGE: &str = "memcached:1.6.38-alpine";

/// The desired memcached: how many pods, on which port. `kubectl scale` sets `size`.
#[derive(CustomResource, Deserialize, Serialize, Clone, Debug, PartialEq, KubeSchema)]
#[kube(
    group = "cache.example.com",
    version = "v1alpha1",
    kind = "Memcached",
    plural = "memcacheds",
    namespaced,
    shortname = "mc",
    category = "rust-operators",
    status = "MemcachedStatus",
    derive = "PartialEq",
    doc = "A Memcached runs `spec.size` memcached pods (a Deployment) and a Service to reach them.",
    validation = Rule::new("self.metadata.name.size() <= 63 && self.metadata.name.matches('^[a-z]([-a-z0-9]*[a-z0-9])?$')")
        .message("metadata.name must be a DNS-1035 label (at most 63 lowercase letters, digits and '-', starting with a letter): the Service is named after it"),
    scale(
        spec_replicas_path = ".spec.size",
        status_replicas_path = ".status.replicas",
        label_selector_path = ".status.selector"
    ),
    printcolumn(
        name = "Size",
        type_ = "integer",
        json_path = ".spec.size",
        description = "Desired number of memcached pods"
    ),
    printcolumn(
        name = "Ready",
        type_ = "integer",
        json_path = ".status.readyReplicas",
        description = "Memcached pods that are Ready"
    ),
    printcolumn(
        name = "Available",
        type_ = "string",
        json_path = ".status.conditions[?(@.type==\"Available\")].status",
        description = "Whether all `size` pods are available"
    ),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[serde(rename_all = "camelCase")]
pub struct MemcachedSpec {
    /// Number of memcached pods, from 0 to 100. `kubectl scale memcached/<name>` sets it.
    #[schemars(range(min = 0, max = 100))]
    pub size: i32,

    /// Port memcached listens on, in the pods and on the Service (1-65535, default 11211).
    #[serde(default = "default_port")]
    #[schemars(range(min = 1, max = 65535))]
    pub container_port: i32,

    /// Optional. Who may connect to memcached, which has no authentication: a
    /// NetworkPolicy named after the Memcached admits connections to the memcached pods,
    /// on `containerPort` only, from the pods of the Memcached's own namespace and of the
    /// namespaces listed in `allowedNamespaces`, and from nowhere else. Unset (or
    /// `enabled: false`): no NetworkPolicy, and every pod of the cluster may connect (a
    /// NetworkPolicy the operator made earlier is deleted). Enforced only where the
    /// cluster's network plugin implements NetworkPolicies.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub network_policy: Option<MemcachedNetworkPolicy>,
}

fn default_port() -> i32 {
    DEFAULT_PORT
}

/// The most namespaces `spec.networkPolicy.allowedNamespaces` may list.
pub const MAX_ALLOWED_NAMESPACES: usize = 64;

/// A namespace name: a DNS-1123 label (lowercase letters, digits and `-`, starting and
/// ending with a letter or digit), at most 63 characters.
pub const NAMESPACE_PATTERN: &str = "^[a-z0-9]([-a-z0-9]*[a-z0-9])?$";

/// Which pods may connect to memcached: a NetworkPolicy the operator keeps beside the
/// Deployment and the Service.
#[derive(KubeSchema, Deserialize, Serialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct MemcachedNetworkPolicy {
    /// Whether the operator keeps the NetworkPolicy (default true: `networkPolicy: {}`
    /// admits the Memcached's own namespace only). `false` removes it, as leaving out
    /// `networkPolicy` does, and keeps `allowedNamespaces` for later.
    #[serde(default = "default_enabled")]
    pub enabled: bool,

    /// Names of the namespaces whose pods may connect too, besides the Memcached's own
    /// namespace (at most 64, each a namespace name of at most 63 characters, no
    /// duplicates). A namespace is matched by its `kubernetes.io/metadata.name` label,
    /// which the API server sets on every namespace.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(
        length(max = MAX_ALLOWED_NAMESPACES),
        inner(length(min = 1, max = 63), pattern(NAMESPACE_PATTERN))
    )]
    #[x_kube(merge_strategy = ListMerge::Set)]
    pub allowed_namespaces: Vec<String>,
}

fn default_enabled() -> bool {
    true
}

impl MemcachedSpec {
    /// The port memcached listens on.
    #[must_use]
    pub fn port(&self) -> i32 {
        self.container_port
    }

    /// The NetworkPolicy settings, when one is wanted (`networkPolicy` set and enabled).
    #[must_use]
    pub fn network_policy(&self) -> Option<&MemcachedNetworkPolicy> {
        self.network_policy.as_ref().filter(|p| p.enabled)
    }
}

/// What the operator last observed of the Memcached's Deployment and pods.
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct MemcachedStatus {
    /// Names of the current (not terminating) memcached pods, sorted.
    #[serde(default)]
    pub nodes: Vec<String>,

    /// Number of current memcached pods (the scale subresource's status replicas).
    #[serde(default)]
    pub replicas: i32,

    /// Number of current memcached pods whose Ready condition is True.
    #[serde(default)]
    pub ready_replicas: i32,

    /// Label selector of the memcached pods, for the scale subresource (`kubectl scale`, HPA).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub selector: String,

    /// The `metadata.generation` this status describes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,

    /// `Available` (all `size` pods available), `Progressing` (pods being added, removed or started) and `Degraded` (children cannot be written, pods cannot be created, or the Memcached is being deleted: reason `Finalizing`).
    #[serde(default)]
    pub conditions: Vec<Condition>,
}
