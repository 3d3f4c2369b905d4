//! Test fixtures shared by the unit tests of several modules.
#![allow(clippy::unwrap_used)]

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use shared_testing::{pod_status, stored};

use crate::{
    api::{PodSet, PodSetSpec},
    pods::OurPod,
};

/// A pod named `name` in `phase` whose `Ready` condition is `ready`, as the index holds it.
pub(crate) fn pod(name: &str, phase: &str, ready: bool) -> OurPod {
    OurPod::from_pod(Pod {
        metadata: ObjectMeta {
            name: Some(name.into()),
            ..ObjectMeta::default()
        },
        spec: None,
        status: Some(pod_status(phase, ready)),
    })
}

/// [`pod`], created at second `created` of the epoch.
pub(crate) fn pod_created(name: &str, phase: &str, ready: bool, created: i64) -> OurPod {
    let mut pod = pod(name, phase, ready);
    pod.facts.created = created;
    pod
}

/// Second `s` of the epoch.
pub(crate) fn t(s: i64) -> jiff::Timestamp {
    jiff::Timestamp::from_second(s).unwrap()
}

/// The PodSet `ns/demo` (UID `uid-1`, generation 3) asking for `replicas` pods.
pub(crate) fn podset(replicas: i32) -> PodSet {
    stored(
        PodSet::new(
            "demo",
            PodSetSpec {
                replicas,
                image: None,
            },
        ),
        3,
    )
}
