//! What one PodSet costs the operator's caches once it has converged: the PodSet as the
//! primary cache keeps it (its labels, annotations, owner references and managed fields
//! dropped, as `shared`'s scope trims a primary) and each of its pods as the pod index
//! keeps it (its name and `PodFacts`), measured with a counting allocator on the JSON the
//! API server sends. These are the floor of the memory per object the bench measures
//! (`cargo xtask bench operator`, docs/performance.md "How the cost grows with N"); the
//! bounds catch a field that starts being kept by mistake. One test, so that no other test
//! allocates while it measures.

#![allow(clippy::expect_used, clippy::unwrap_used)]

use std::{alloc::System, sync::Arc};

use podset_operator::{PodSet, pods::PodFacts};
use serde_json::json;
use shared::slim::SlimPod;
use stats_alloc::{INSTRUMENTED_SYSTEM, Region, StatsAlloc};

#[global_allocator]
static GLOBAL: &StatsAlloc<System> = &INSTRUMENTED_SYSTEM;

/// `make()` and the bytes it keeps allocated (transient allocations freed again while it
/// ran are not counted).
fn kept_by<T>(make: impl FnOnce() -> T) -> (T, isize) {
    let region = Region::new(GLOBAL);
    let value = make();
    let change = region.change();
    let kept = change.bytes_allocated.cast_signed() - change.bytes_deallocated.cast_signed()
        + change.bytes_reallocated;
    (value, kept)
}

/// A PodSet of `replicas` as the API server sends it once the operator has converged it:
/// the fields a `kubectl apply` and the operator's status writes leave.
fn converged_podset(replicas: usize) -> String {
    let pods: Vec<String> = (0..replicas)
        .map(|i| format!("ps-00042-pod-{i:05}x"))
        .collect();
    let condition = |type_: &str, status: &str, reason: &str, message: &str| {
        json!({"type": type_, "status": status, "reason": reason, "message": message,
               "lastTransitionTime": "2026-11-29T04:20:00Z", "observedGeneration": 1})
    };
    serde_json::to_string(&json!({
        "apiVersion": "batch.tutorial.kubebuilder.io/v1",
        "kind": "PodSet",
        "metadata": {
            "name": "ps-00042", "namespace": "bench-podset-1a2b3c",
            "uid": "0b6f7c7e-3c1d-4f5e-9a3b-8c2d1e0f4a5b", "resourceVersion": "1234567",
            "generation": 1, "creationTimestamp": "2026-11-29T04:19:58Z",
            "labels": {"app": "bench"},
            "annotations": {"kubectl.kubernetes.io/last-applied-configuration": "{\"apiVersion\":\"batch.tutorial.kubebuilder.io/v1\",\"kind\":\"PodSet\",\"metadata\":{\"name\":\"ps-00042\"},\"spec\":{\"replicas\":1}}"},
            "managedFields": [
                {"manager": "bench", "operation": "Update", "apiVersion": "batch.tutorial.kubebuilder.io/v1",
                 "time": "2026-11-29T04:19:58Z", "fieldsType": "FieldsV1",
                 "fieldsV1": {"f:spec": {".": {}, "f:replicas": {}}}},
                {"manager": "podset-operator", "operation": "Apply", "apiVersion": "batch.tutorial.kubebuilder.io/v1",
                 "time": "2026-11-29T04:20:00Z", "fieldsType": "FieldsV1", "subresource": "status",
                 "fieldsV1": {"f:status": {"f:conditions": {}, "f:observedGeneration": {}, "f:podNames": {},
                                           "f:readyReplicas": {}, "f:replicas": {}, "f:selector": {}}}}
            ]
        },
        "spec": {"replicas": replicas},
        "status": {
            "replicas": replicas, "readyReplicas": replicas, "podNames": pods,
            "selector": "app=ps-00042,app.kubernetes.io/instance=ps-00042,app.kubernetes.io/managed-by=podset-operator",
            "observedGeneration": 1,
            "conditions": [
                condition("Ready", "True", "AllPodsReady", &format!("{replicas}/{replicas} pods ready")),
                condition("Progressing", "False", "ScalingComplete", &format!("{replicas} pods running and ready")),
                condition("Degraded", "False", "AsExpected", "pods can be created")
            ]
        }
    }))
    .unwrap()
}

/// One of its busybox pods, running and Ready on a node, as the API server sends it.
fn running_pod() -> String {
    serde_json::to_string(&json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {
            "name": "ps-00042-pod-00000x", "namespace": "bench-podset-1a2b3c",
            "uid": "5d1c2b3a-4e5f-4a6b-8c7d-9e0f1a2b3c4d", "resourceVersion": "1234568",
            "creationTimestamp": "2026-11-29T04:19:59Z",
            "labels": {"app": "ps-00042", "app.kubernetes.io/instance": "ps-00042",
                       "app.kubernetes.io/managed-by": "podset-operator"},
            "ownerReferences": [{"apiVersion": "batch.tutorial.kubebuilder.io/v1", "kind": "PodSet",
                                 "name": "ps-00042", "uid": "0b6f7c7e-3c1d-4f5e-9a3b-8c2d1e0f4a5b",
                                 "controller": true, "blockOwnerDeletion": true}],
            "managedFields": [{"manager": "podset-operator", "operation": "Apply", "apiVersion": "v1",
                               "time": "2026-11-29T04:19:59Z", "fieldsType": "FieldsV1",
                               "fieldsV1": {"f:metadata": {"f:labels": {}}, "f:spec": {"f:containers": {}}}}]
        },
        "spec": {
            "containers": [{"name": "busybox", "image": "busybox:1.36", "command": ["sleep", "3600"],
                            "resources": {}, "terminationMessagePath": "/dev/termination-log",
                            "imagePullPolicy": "IfNotPresent",
                            "securityContext": {"allowPrivilegeEscalation": false, "runAsNonRoot": true,
                                                "capabilities": {"drop": ["ALL"]}}}],
            "restartPolicy": "Always", "nodeName": "kwok-node-0", "schedulerName": "default-scheduler",
            "securityContext": {"seccompProfile": {"type": "RuntimeDefault"}},
            "tolerations": [{"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 300}]
        },
        "status": {
            "phase": "Running", "hostIP": "10.0.0.1", "podIP": "10.244.0.7",
            "podIPs": [{"ip": "10.244.0.7"}], "startTime": "2026-11-29T04:19:59Z", "qosClass": "BestEffort",
            "conditions": [
                {"type": "Initialized", "status": "True", "lastTransitionTime": "2026-11-29T04:19:59Z"},
                {"type": "Ready", "status": "True", "lastTransitionTime": "2026-11-29T04:20:00Z"},
                {"type": "ContainersReady", "status": "True", "lastTransitionTime": "2026-11-29T04:20:00Z"},
                {"type": "PodScheduled", "status": "True", "lastTransitionTime": "2026-11-29T04:19:59Z"}
            ],
            "containerStatuses": [{"name": "busybox", "ready": true, "restartCount": 0, "image": "busybox:1.36",
                                   "imageID": "docker.io/library/busybox@sha256:0000", "started": true,
                                   "state": {"running": {"startedAt": "2026-11-29T04:20:00Z"}}}]
        }
    }))
    .unwrap()
}

/// The PodSet in `text` as the primary cache keeps it.
fn as_cached(text: &str) -> Arc<PodSet> {
    let mut ps: PodSet = serde_json::from_str(text).unwrap();
    let meta = &mut ps.metadata;
    meta.managed_fields = None;
    meta.labels = None;
    meta.annotations = None;
    meta.owner_references = None;
    Arc::new(ps)
}

#[test]
fn what_one_converged_podset_costs_the_caches() {
    // Once first: what the first parse allocates for good (time zone data, say) is no
    // object's.
    let (x1, x3) = (converged_podset(1), converged_podset(3));
    drop(as_cached(&x1));
    let (podset, one) = kept_by(|| as_cached(&x1));
    assert_eq!(podset.status.as_ref().map(|s| s.pod_names.len()), Some(1));
    let (_, three) = kept_by(|| as_cached(&x3));
    let text = running_pod();
    // The watch parses the pod; the index keeps its name and facts (the entry's own
    // bookkeeping, its name again and its PodSet's UID, comes on top: see the module).
    let slim = serde_json::from_str::<SlimPod>(&text).unwrap();
    drop(PodFacts::of(&slim)); // what the first call keeps for good (the label keys)
    let (entry, pod_kept) = kept_by(|| {
        let name: Box<str> = slim.metadata.name.as_deref().unwrap_or_default().into();
        vec![(name, PodFacts::of(&slim))].into_boxed_slice()
    });
    assert!(entry[0].1.ready, "the pod reads as Ready");
    println!(
        "a converged PodSet x 1 keeps {one} bytes, x 3 {three} bytes; each pod's name and facts {pod_kept} bytes"
    );
    // The PodSet: its ObjectMeta, spec, and a status of three conditions, the selector
    // and the pods' names. Each pod: its name, UID, and a few flags.
    assert!(one < 2048, "a PodSet x 1 keeps {one} bytes");
    assert!(
        three < one + 3 * 96,
        "each pod name costs a PodSet x 3 little more"
    );
    assert!(pod_kept < 160, "a pod's entry keeps {pod_kept} bytes");
}
