//! The `Lolcow` API (`my.domain/v1alpha1`), compatible with the Go lolcow operator:
//! manifests written for it apply unchanged.

// Several `printcolumn(type_ = ...)` entries read to clippy as a repeated attribute.
#![allow(clippy::duplicated_attributes)]

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::{CustomResource, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// The lowest NodePort of the default Kubernetes NodePort range.
pub const MIN_NODE_PORT: i32 = 30000;
/// The highest NodePort of the default Kubernetes NodePort range.
pub const MAX_NODE_PORT: i32 = 32767;
/// The longest greeting accepted (the cow's bubble wraps at 40 characters per line).
pub const MAX_GREETING_LENGTH: usize = 256;
/// The lolcow web image used when the operator's `LOLCOW_IMAGE` is not set.
pub const DEFAULT_IMAGE: &str = "lolcow-web:latest";

/// A Lolcow serves a web page of a cow saying a greeting, on a NodePort of every node.
#[derive(CustomResource, Deserialize, Serialize, Clone, Debug, PartialEq, KubeSchema)]
#[kube(
    group = "my.domain",
    version = "v1alpha1",
    kind = "Lolcow",
    plural = "lolcows",
    namespaced,
    shortname = "lc",
    category = "rust-operators",
    status = "LolcowStatus",
    validation = Rule::new("self.metadata.name.size() <= 63 && self.metadata.name.matches('^[a-z]([-a-z0-9]*[a-z0-9])?$')")
        .message("metadata.name must be a DNS-1035 label (at most 63 lowercase letters, digits and '-', starting with a letter): the Service is named after it"),
    derive = "PartialEq",
    doc = "A Lolcow runs the lolcow web app (a cow saying `spec.greeting`) and exposes it on NodePort `spec.port` of every node.",
    printcolumn(
        name = "Greeting",
        type_ = "string",
        json_path = ".status.greeting",
        description = "What the cow says"
    ),
    printcolumn(
        name = "Port",
        type_ = "integer",
        json_path = ".status.port",
        description = "The NodePort serving the page"
    ),
    printcolumn(
        name = "Ready",
        type_ = "string",
        json_path = ".status.conditions[?(@.type==\"Ready\")].status",
        description = "Whether the page is served"
    ),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[serde(rename_all = "camelCase")]
pub struct LolcowSpec {
    /// The NodePort the page is served on, on every node (30000-32767).
    /// No other Service of the cluster may use it. Open `http://<node-ip>:<port>/`.
    #[schemars(range(min = 30000, max = 32767))]
    pub port: i32,

    /// What the cow says, at most 256 characters.
    /// Empty or unset: a fortune, picked once for this object (see `status.greeting`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 256))]
    pub greeting: Option<String>,
}

/// What the operator last observed being served.
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct LolcowStatus {
    /// The greeting the running web app serves (the picked fortune when `spec.greeting` is empty).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub greeting: Option<String>,

    /// The NodePort the Service currently serves the page on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub port: Option<i32>,

    /// The URL path to open on `http://<node-ip>:<port>`, e.g. `/`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path: Option<String>,

    /// The `metadata.generation` this status describes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,

    /// `Ready`: the web app runs with the wanted greeting and the Service serves `spec.port`.
    /// It is `False` with reason `PortConflict` while another Service holds the port.
    #[serde(default)]
    pub conditions: Vec<Condition>,
}
