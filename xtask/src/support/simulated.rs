//! Which pods run for real and which are simulated on the local cluster.
//!
//! The cluster has one real node (containers run) and a few kwok nodes
//! (pods are scheduled and reported Running, nothing runs). The kwok nodes
//! carry a taint, so ordinary pods, such as those of an operator deployed
//! from its image and the workloads it creates, run on the real node. A
//! namespace annotated with [`NAMESPACE_ANNOTATIONS`] sends every pod to the
//! simulated nodes instead (the API server's PodNodeSelector and
//! PodTolerationRestriction admission plugins read the annotations): scale
//! tests and benchmarks, which need thousands of pods but nothing running.

/// The taint key of the simulated nodes.
pub const TAINT_KEY: &str = "kwok.x-k8s.io/node";

/// Namespace annotations that send every pod of the namespace to the
/// simulated nodes.
pub const NAMESPACE_ANNOTATIONS: [(&str, &str); 2] = [
    ("scheduler.alpha.kubernetes.io/node-selector", "type=kwok"),
    (
        "scheduler.alpha.kubernetes.io/defaultTolerations",
        r#"[{"key":"kwok.x-k8s.io/node","operator":"Exists","effect":"NoSchedule"}]"#,
    ),
];

/// [`NAMESPACE_ANNOTATIONS`] as a JSON object, for a namespace manifest.
pub fn annotations_json() -> serde_json::Value {
    NAMESPACE_ANNOTATIONS
        .iter()
        .map(|(k, v)| ((*k).to_owned(), serde_json::Value::String((*v).to_owned())))
        .collect::<serde_json::Map<_, _>>()
        .into()
}
