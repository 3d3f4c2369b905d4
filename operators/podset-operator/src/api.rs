//! The `PodSet` API (`batch.tutorial.kubebuilder.io/v1`), compatible with the kubebuilder
//! tutorial operator: manifests written for it apply unchanged.

// Several `printcolumn(type_ = ...)` entries read to clippy as a repeated attribute.
#![allow(clippy::duplicated_attributes)]

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::{CustomResource, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// The most pods one PodSet may ask for: a guard against typos such as `replicas: 10000`.
pub const MAX_REPLICAS: i32 = 1000;

/// The image used when `spec.image` is unset (and `PODSET_IMAGE` is not set on the operator).
pub const DEFAULT_IMAGE: &str = "busybox";

/// A PodSet keeps a number of identical pods running; it can be scaled with `kubectl scale`.
#[derive(CustomResource, Deserialize, Serialize, Clone, Debug, PartialEq, KubeSchema)]
#[kube(
    group = "batch.tutorial.kubebuilder.io",
    version = "v1",
    kind = "PodSet",
    plural = "podsets",
    namespaced,
    shortname = "ps",
    category = "rust-operators",
    status = "PodSetStatus",
    validation = Rule::new("self.metadata.name.size() <= 63")
        .message("metadata.name must be at most 63 characters: the pods carry it as their `app` label"),
    derive = "PartialEq",
    doc = "A PodSet keeps `spec.replicas` pods running, each one container sleeping.",
    scale(
        spec_replicas_path = ".spec.replicas",
        status_replicas_path = ".status.replicas",
        label_selector_path = ".status.selector"
    ),
    printcolumn(
        name = "Replicas",
        type_ = "integer",
        json_path = ".spec.replicas",
        description = "Desired number of pods"
    ),
    printcolumn(
        name = "Ready",
        type_ = "integer",
        json_path = ".status.readyReplicas",
        description = "Pods that are Ready"
    ),
    printcolumn(
        name = "Status",
        type_ = "string",
        json_path = ".status.conditions[?(@.type==\"Ready\")].status",
        description = "Whether all pods are ready"
    ),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[serde(rename_all = "camelCase")]
pub struct PodSetSpec {
    /// Number of pods to keep running, from 0 to 1000.
    #[schemars(range(min = 0, max = 1000))]
    pub replicas: i32,

    /// Container image of the pods (default `busybox`, or the operator's `PODSET_IMAGE`).
    /// Set it to a mirror on air-gapped clusters. The image must provide `sleep`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 512))]
    pub image: Option<String>,
}

/// What the operator last observed of the PodSet's pods.
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PodSetStatus {
    /// Number of current pods (not terminating, phase Pending or Running).
    #[serde(default)]
    pub replicas: i32,

    /// Number of current pods whose Ready condition is True.
    #[serde(default)]
    pub ready_replicas: i32,

    /// Names of the current pods, sorted.
    #[serde(default)]
    pub pod_names: Vec<String>,

    /// Label selector of the pods, for the scale subresource (`kubectl scale`, HPA).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub selector: String,

    /// The `metadata.generation` this status describes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,

    /// `Ready` (all replicas ready), `Progressing` (pods being created, deleted or
    /// started) and `Degraded` (pods cannot be created).
    #[serde(default)]
    pub conditions: Vec<Condition>,
}
