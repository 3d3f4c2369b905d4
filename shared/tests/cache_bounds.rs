//! What the caches keep of an object a tenant made large is bounded, whatever it holds:
//! measured with a counting allocator on objects of about 1.2 MB, as the API server sends
//! them. One test, so that no other test allocates while it measures.

#![allow(clippy::expect_used, clippy::unwrap_used)]

use std::alloc::System;

use k8s_openapi::api::{apps::v1::Deployment, core::v1::Service};
use serde_json::{Value, json};
use shared::slim::{Slim, SlimPod, projection};
use stats_alloc::{INSTRUMENTED_SYSTEM, Region, StatsAlloc};

#[global_allocator]
static GLOBAL: &StatsAlloc<System> = &INSTRUMENTED_SYSTEM;

/// The operator's field manager in these objects.
const OURS: &str = "memcached-operator";

/// `n` labels of about 130 bytes each, as a tenant sets them.
fn many_labels(n: usize) -> serde_json::Map<String, Value> {
    (0..n)
        .map(|i| {
            (
                format!("tenant.example.com/label-{i:05}-{}", "k".repeat(40)),
                Value::String("v".repeat(63)),
            )
        })
        .collect()
}

/// A Deployment of ours as a tenant with `edit` can leave it: 9,000 labels and a large
/// annotation beside ours, an environment variable of 1 MB in our container, another
/// container of its own; our field manager owns what we applied.
fn bloated_deployment() -> String {
    let mut labels = many_labels(9_000);
    labels.insert("app.kubernetes.io/managed-by".into(), json!(OURS));
    labels.insert("app.kubernetes.io/instance".into(), json!("m"));
    let object = json!({
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {
            "name": "m", "namespace": "a", "uid": "u-1", "resourceVersion": "7", "generation": 3,
            "labels": labels,
            "annotations": {"tenant.example.com/blob": "x".repeat(200_000)},
            "finalizers": (0..40).map(|i| format!("tenant.example.com/f{i}")).collect::<Vec<_>>(),
            "ownerReferences": [
                {"apiVersion": "cache.example.com/v1alpha1", "kind": "Memcached", "name": "m", "uid": "p-1", "controller": true},
                {"apiVersion": "v1", "kind": "ConfigMap", "name": "c", "uid": "c-1"}
            ],
            "managedFields": [
                {"manager": OURS, "operation": "Apply", "apiVersion": "apps/v1", "fieldsType": "FieldsV1",
                 "fieldsV1": {
                    "f:metadata": {"f:labels": {"f:app.kubernetes.io/managed-by": {}, "f:app.kubernetes.io/instance": {}},
                                   "f:ownerReferences": {"k:{\"uid\":\"p-1\"}": {}}},
                    "f:spec": {"f:replicas": {}, "f:selector": {},
                               "f:template": {"f:metadata": {"f:labels": {"f:app.kubernetes.io/instance": {}}},
                                              "f:spec": {"f:containers": {"k:{\"name\":\"memcached\"}": {
                                                  ".": {}, "f:name": {}, "f:image": {}, "f:args": {}}}}}}}},
                {"manager": "kubectl-edit", "operation": "Update", "apiVersion": "apps/v1", "fieldsType": "FieldsV1",
                 "fieldsV1": {"f:metadata": {"f:labels": {}}, "f:spec": {"f:template": {"f:spec": {"f:containers": {}}}}}}
            ]
        },
        "spec": {
            "replicas": 3,
            "selector": {"matchLabels": {"app.kubernetes.io/instance": "m"}},
            "template": {
                "metadata": {"labels": {"app.kubernetes.io/instance": "m"}},
                "spec": {"containers": [
                    {"name": "memcached", "image": "memcached:1.6", "args": ["-m", "64"],
                     "env": [{"name": "BLOB", "value": "y".repeat(1_000_000)}]},
                    {"name": "tenant", "image": "busybox", "args": ["z".repeat(50_000)]}
                ]}
            }
        },
        "status": {"replicas": 3, "readyReplicas": 3, "availableReplicas": 3, "observedGeneration": 3}
    });
    serde_json::to_string(&object).unwrap()
}

/// A pod labelled as the operator's, with 9,000 more labels and a 300 KB annotation.
fn bloated_pod() -> String {
    let mut labels = many_labels(9_000);
    labels.insert(
        "app.kubernetes.io/managed-by".into(),
        json!("podset-operator"),
    );
    serde_json::to_string(&json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "p", "namespace": "a", "uid": "u-2", "labels": labels,
                     "annotations": {"a": "x".repeat(300_000)},
                     "finalizers": (0..5_000).map(|i| format!("tenant.example.com/f{i}")).collect::<Vec<_>>()},
        "spec": {"containers": [{"name": "c", "image": "busybox", "args": ["y".repeat(200_000)]}]},
        "status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}
    }))
    .unwrap()
}

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

#[test]
fn what_a_cache_keeps_of_a_large_object_is_bounded() {
    projection::set_field_manager(OURS);

    let text = bloated_deployment();
    assert!(text.len() > 1_200_000, "the object is {} bytes", text.len());
    let (slim, kept) = kept_by(|| serde_json::from_str::<Slim<Deployment>>(&text).unwrap());
    println!("a Deployment of {} bytes: {kept} bytes kept", text.len());
    assert!(kept < 4 * 1024, "kept {kept} bytes of a Deployment");
    // What it kept is what we applied: our labels, our container's fields, our controller.
    let full = slim.full().unwrap();
    assert_eq!(full.metadata.labels.as_ref().map(|l| l.len()), Some(2));
    assert_eq!(full.metadata.annotations, None);
    assert_eq!(
        full.metadata.owner_references.as_ref().map(Vec::len),
        Some(1)
    );
    assert_eq!(
        full.metadata.finalizers.as_ref().map(Vec::len),
        Some(projection::MAX_KEPT_FINALIZERS)
    );
    let containers = full.spec.unwrap().template.spec.unwrap().containers;
    assert_eq!(containers.len(), 1);
    assert_eq!(containers[0].image.as_deref(), Some("memcached:1.6"));
    assert_eq!(
        containers[0].env, None,
        "the tenant's environment variable is not ours"
    );
    assert_eq!(full.status.unwrap().ready_replicas, Some(3));

    // Without a field of ours (someone took them all): metadata only, still bounded.
    let service = text.replace(OURS, "someone-else");
    let (slim, kept) = kept_by(|| serde_json::from_str::<Slim<Service>>(&service).unwrap());
    assert!(
        kept < 4 * 1024,
        "kept {kept} bytes of an object with no field of ours"
    );
    let spec = slim.full().unwrap().spec.unwrap_or_default();
    assert!(
        spec.ports.is_none() && spec.selector.is_none(),
        "only small scalars: {spec:?}"
    );

    let pod = bloated_pod();
    assert!(pod.len() > 1_200_000, "the pod is {} bytes", pod.len());
    let (slim, kept) = kept_by(|| serde_json::from_str::<SlimPod>(&pod).unwrap());
    println!("a pod of {} bytes: {kept} bytes kept", pod.len());
    assert!(kept < 2 * 1024, "kept {kept} bytes of a pod");
    assert_eq!(slim.labels().len(), 1);
    assert!(slim.ready());
}
