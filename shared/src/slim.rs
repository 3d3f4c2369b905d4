//! Slim views of Kubernetes kinds for the operators' caches: only the fields a reconcile
//! reads, as a type of their own, so a watch deserializes each object straight into the
//! small shape and never builds the full one.
//!
//! A `k8s_openapi` `Pod` takes about 2.4 KiB before any field is set (its spec is stored
//! inline) and 4.1 KiB with the metadata and status of a running pod, even with its spec
//! and the rest of its status dropped; a [`SlimPod`] with the same metadata 1.7 KiB
//! (measured on the pods of a Memcached bench). With thousands of pods in a watched
//! namespace, the pod cache was most of an operator's memory, and parsing each pod's spec
//! a good part of its watch's CPU.

use std::borrow::Cow;

use k8s_openapi::{
    NamespaceResourceScope,
    api::core::v1::Pod,
    apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time},
};
use kube::Resource;
use serde::Deserialize;

/// A Pod as the operators cache it: its metadata (`managedFields` are dropped by the
/// reflector), `status.phase` and the type and status of each condition. Watched and listed
/// as the `v1` `pods` resource; every other field of the API object is skipped while
/// parsing.
#[derive(Clone, Debug, Default, Deserialize, PartialEq)]
pub struct SlimPod {
    /// The pod's metadata.
    #[serde(default)]
    pub metadata: ObjectMeta,
    /// `status.phase` and `status.conditions`, when the pod has a status.
    #[serde(default)]
    pub status: Option<SlimPodStatus>,
}

/// The part of a pod's status the operators read.
#[derive(Clone, Debug, Default, Deserialize, PartialEq)]
pub struct SlimPodStatus {
    /// `Pending`, `Running`, `Succeeded`, `Failed` or `Unknown`.
    #[serde(default)]
    pub phase: Option<String>,
    /// The conditions' types and statuses.
    #[serde(default, deserialize_with = "null_as_empty")]
    pub conditions: Vec<SlimCondition>,
}

/// A pod condition's type and status (`True`, `False`, `Unknown`).
#[derive(Clone, Debug, Default, Deserialize, PartialEq, Eq)]
pub struct SlimCondition {
    /// `Ready`, `PodScheduled`, `ContainersReady`...
    #[serde(rename = "type")]
    pub type_: String,
    /// `True`, `False` or `Unknown`.
    pub status: String,
}

fn null_as_empty<'de, D, T>(d: D) -> Result<Vec<T>, D::Error>
where
    D: serde::Deserializer<'de>,
    T: Deserialize<'de>,
{
    Ok(Option::<Vec<T>>::deserialize(d)?.unwrap_or_default())
}

impl SlimPod {
    /// `status.phase`, if reported.
    #[must_use]
    pub fn phase(&self) -> Option<&str> {
        self.status.as_ref()?.phase.as_deref()
    }

    /// Whether the pod's `Ready` condition is `True`.
    #[must_use]
    pub fn ready(&self) -> bool {
        self.status.as_ref().is_some_and(|s| {
            s.conditions
                .iter()
                .any(|c| c.type_ == "Ready" && c.status == "True")
        })
    }

    /// `metadata.deletionTimestamp`: set once the pod is being deleted.
    #[must_use]
    pub fn deletion_timestamp(&self) -> Option<&Time> {
        self.metadata.deletion_timestamp.as_ref()
    }
}

impl From<Pod> for SlimPod {
    fn from(pod: Pod) -> Self {
        SlimPod {
            metadata: ObjectMeta {
                managed_fields: None,
                ..pod.metadata
            },
            status: pod.status.map(|s| SlimPodStatus {
                phase: s.phase,
                conditions: s
                    .conditions
                    .unwrap_or_default()
                    .into_iter()
                    .map(|c| SlimCondition {
                        type_: c.type_,
                        status: c.status,
                    })
                    .collect(),
            }),
        }
    }
}

impl Resource for SlimPod {
    type DynamicType = ();
    type Scope = NamespaceResourceScope;

    fn kind(_: &()) -> Cow<'_, str> {
        "Pod".into()
    }

    fn group(_: &()) -> Cow<'_, str> {
        "".into()
    }

    fn version(_: &()) -> Cow<'_, str> {
        "v1".into()
    }

    fn api_version(_: &()) -> Cow<'_, str> {
        "v1".into()
    }

    fn plural(_: &()) -> Cow<'_, str> {
        "pods".into()
    }

    fn meta(&self) -> &ObjectMeta {
        &self.metadata
    }

    fn meta_mut(&mut self) -> &mut ObjectMeta {
        &mut self.metadata
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use kube::ResourceExt;

    fn running_pod() -> serde_json::Value {
        serde_json::json!({
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": "p", "namespace": "ns", "uid": "u1",
                "labels": {"app": "x"},
                "ownerReferences": [{"apiVersion": "v1", "kind": "X", "name": "o", "uid": "o1", "controller": true}],
                "managedFields": [{"manager": "m", "operation": "Apply"}]
            },
            "spec": {"containers": [{"name": "c", "image": "busybox", "command": ["sleep", "3600"]}], "nodeName": "n"},
            "status": {
                "phase": "Running",
                "podIP": "10.0.0.1",
                "conditions": [
                    {"type": "PodScheduled", "status": "True", "lastTransitionTime": "2026-01-01T00:00:00Z"},
                    {"type": "Ready", "status": "True", "lastTransitionTime": "2026-01-01T00:00:01Z"}
                ],
                "containerStatuses": [{"name": "c", "ready": true, "restartCount": 0, "image": "busybox", "imageID": ""}]
            }
        })
    }

    #[test]
    fn parses_what_reconciles_read_and_skips_the_rest() {
        let pod: SlimPod = serde_json::from_value(running_pod()).unwrap();
        assert_eq!(pod.name_any(), "p");
        assert_eq!(pod.namespace().as_deref(), Some("ns"));
        assert_eq!(pod.labels().get("app").map(String::as_str), Some("x"));
        assert_eq!(pod.owner_references()[0].uid, "o1");
        assert_eq!(pod.phase(), Some("Running"));
        assert!(pod.ready());
        assert!(pod.deletion_timestamp().is_none());
    }

    #[test]
    fn matches_the_full_pod_it_comes_from() {
        let full: Pod = serde_json::from_value(running_pod()).unwrap();
        let mut parsed: SlimPod = serde_json::from_value(running_pod()).unwrap();
        parsed.metadata.managed_fields = None;
        assert_eq!(SlimPod::from(full), parsed);
    }

    #[test]
    fn a_pod_without_status_or_conditions_is_not_ready() {
        let bare: SlimPod =
            serde_json::from_value(serde_json::json!({"metadata": {"name": "p"}})).unwrap();
        assert!(!bare.ready());
        assert_eq!(bare.phase(), None);
        let pending: SlimPod = serde_json::from_value(
            serde_json::json!({"metadata": {"name": "p"}, "status": {"phase": "Pending", "conditions": null}}),
        )
        .unwrap();
        assert!(!pending.ready());
        assert_eq!(pending.phase(), Some("Pending"));
        let not_ready: SlimPod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "p"},
            "status": {"conditions": [{"type": "Ready", "status": "False"}]}
        }))
        .unwrap();
        assert!(!not_ready.ready());
    }

    #[test]
    fn is_the_v1_pods_resource() {
        assert_eq!(SlimPod::kind(&()), "Pod");
        assert_eq!(SlimPod::api_version(&()), "v1");
        assert_eq!(SlimPod::plural(&()), "pods");
        assert_eq!(
            SlimPod::url_path(&(), Some("ns")),
            "/api/v1/namespaces/ns/pods"
        );
    }
}
