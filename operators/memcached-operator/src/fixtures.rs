//! Objects the unit tests share.

#![allow(clippy::unwrap_used)]

use std::{collections::BTreeMap, sync::Arc};

use k8s_openapi::{
    api::{
        apps::v1::{Deployment, DeploymentStatus},
        core::v1::Pod,
    },
    apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference, Time},
};
use kube::runtime::controller::Action;

use shared::slim::SlimPod;
use shared_testing::{pod_status, stored};

use crate::{
    api::{Memcached, MemcachedSpec},
    desired::desired_deployment,
    error::Error,
    reconcile::{Context, reconcile},
    status::{NamedPod, PodState},
};

/// A Memcached `cache` in namespace `ns`, generation 2.
pub(crate) fn memcached(size: i32, port: Option<i32>) -> Memcached {
    let port = port.unwrap_or(crate::api::DEFAULT_PORT);
    stored(
        Memcached::new(
            "cache",
            MemcachedSpec {
                size,
                container_port: port,
                network_policy: None,
            },
        ),
        2,
    )
}

/// The controller owner reference to the Memcached of [`memcached`].
pub(crate) fn owner() -> OwnerReference {
    OwnerReference {
        api_version: "cache.example.com/v1alpha1".into(),
        kind: "Memcached".into(),
        name: "cache".into(),
        uid: "uid-1".into(),
        controller: Some(true),
        block_owner_deletion: Some(true),
    }
}

/// A memcached pod of the Deployment `cache` as the status reads it.
pub(crate) fn pod(name: &str, ready: bool, terminating: bool) -> NamedPod {
    let state = PodState {
        current: !terminating,
        ready,
    };
    (name.to_owned(), state)
}

/// A running memcached pod of the Deployment `cache`, as its watch delivers it.
pub(crate) fn slim_pod(name: &str, ready: bool, terminating: bool) -> SlimPod {
    Pod {
        metadata: ObjectMeta {
            name: Some(name.into()),
            labels: Some(BTreeMap::from([(
                "pod-template-hash".to_owned(),
                "abc".to_owned(),
            )])),
            owner_references: Some(vec![OwnerReference {
                kind: "ReplicaSet".into(),
                name: "cache-abc".into(),
                controller: Some(true),
                ..OwnerReference::default()
            }]),
            deletion_timestamp: terminating.then_some(Time(jiff::Timestamp::UNIX_EPOCH)),
            ..ObjectMeta::default()
        },
        spec: None,
        status: Some(pod_status("Running", ready)),
    }
    .into()
}

/// The Deployment of `mc` as the Deployment controller reports it.
pub(crate) fn deployment(mc: &Memcached, replicas: i32, available: i32) -> Deployment {
    let mut d = desired_deployment(mc, owner(), "img");
    d.metadata.generation = Some(4);
    d.status = Some(DeploymentStatus {
        observed_generation: Some(4),
        replicas: Some(replicas),
        updated_replicas: Some(replicas),
        ready_replicas: Some(available),
        available_replicas: Some(available),
        ..DeploymentStatus::default()
    });
    d
}

/// A client answered by `api`.
pub(crate) fn mocked_client(api: &shared_testing::Scripted) -> kube::Client {
    api.client()
}

/// The requests of a reconcile of [`memcached`], as the scripted API server lists them:
/// the apply of the Deployment.
pub(crate) const APPLY_DEPLOYMENT: &str = "PATCH /apis/apps/v1/namespaces/ns/deployments/cache";
/// The read of the Service (a create refused: its name is taken).
pub(crate) const GET_SERVICE: &str = "GET /api/v1/namespaces/ns/services/cache";
/// The apply of the Service.
pub(crate) const APPLY_SERVICE: &str = "PATCH /api/v1/namespaces/ns/services/cache";
/// The Memcached itself (the status and finalizer patches add to it).
pub(crate) const MEMCACHED: &str =
    "/apis/cache.example.com/v1alpha1/namespaces/ns/memcacheds/cache";
/// An event.
pub(crate) const EVENT: &str = "POST /apis/events.k8s.io/v1/namespaces/ns/events";

/// A Memcached of size 1 that carries the finalizer.
pub(crate) fn with_finalizer() -> Memcached {
    let mut mc = memcached(1, None);
    mc.metadata.finalizers = Some(vec![crate::FINALIZER.to_owned()]);
    mc
}

/// Reconciles `mc` against `replies` (nothing cached); returns the result and the
/// scripted server.
pub(crate) async fn run(
    mc: Memcached,
    replies: Vec<shared_testing::Reply>,
) -> (Result<Action, Error>, shared_testing::Scripted) {
    let api = shared_testing::Scripted::new(replies);
    let toolkit = shared_testing::toolkit(mocked_client(&api), crate::OPERATOR);
    let ctx = Arc::new(Context::new(toolkit, None));
    let result = tokio::time::timeout(
        std::time::Duration::from_secs(10),
        reconcile(Arc::new(mc), ctx),
    )
    .await
    .unwrap();
    (result, api)
}

/// The children are created (nothing cached: applies that may only create; the API
/// server echoes the applied object).
pub(crate) fn children_created() -> Vec<shared_testing::Reply> {
    use shared_testing::Reply;
    vec![Reply::Echo, Reply::Echo]
}
