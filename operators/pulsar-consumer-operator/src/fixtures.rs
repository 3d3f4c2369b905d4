//! Objects the unit tests share.

#![allow(clippy::unwrap_used)]

use std::collections::BTreeMap;

use k8s_openapi::api::apps::v1::{Deployment, DeploymentStatus};

use shared_testing::stored;

use crate::{
    api::{PulsarConsumer, PulsarConsumerSpec},
    desired::desired_deployment,
};

/// A PulsarConsumer `orders` in namespace `ns`, generation 2, without autoscaling.
pub(crate) fn consumer(replicas: i32) -> PulsarConsumer {
    let mut pc = stored(
        PulsarConsumer::new(
            "orders",
            PulsarConsumerSpec {
                server_address: "pulsar://broker:6650".into(),
                topic: "my-topic".into(),
                subscription_name: "first-subscription".into(),
                replicas,
                autoscaling: None,
            },
        ),
        2,
    );
    pc.metadata.labels = Some(BTreeMap::from([("app".into(), "mine".into())]));
    pc
}

/// The Deployment of `pc` (generation 5) with `status`.
pub(crate) fn deployment(pc: &PulsarConsumer, status: DeploymentStatus) -> Deployment {
    let owner = shared::apply::owner_reference(pc).unwrap();
    let mut d = desired_deployment(pc, owner, "", pc.spec.replicas);
    d.metadata.generation = Some(5);
    d.status = Some(status);
    d
}

/// A Deployment status: observed generation and replica counts.
pub(crate) fn counts(observed: i64, replicas: i32, updated: i32, ready: i32) -> DeploymentStatus {
    DeploymentStatus {
        observed_generation: Some(observed),
        replicas: Some(replicas),
        updated_replicas: Some(updated),
        ready_replicas: Some(ready),
        ..DeploymentStatus::default()
    }
}

/// The time `s` seconds after the epoch.
pub(crate) fn t(s: i64) -> jiff::Timestamp {
    jiff::Timestamp::from_second(s).unwrap()
}
