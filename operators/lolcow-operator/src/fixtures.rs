//! Objects the unit tests share.

#![allow(clippy::unwrap_used)]

use k8s_openapi::api::apps::v1::{Deployment, DeploymentStatus};

use shared_testing::stored;

use crate::api::{Lolcow, LolcowSpec};

/// A Lolcow `moo` in namespace `ns`, generation 2.
pub(crate) fn lolcow(port: i32, greeting: Option<&str>) -> Lolcow {
    stored(
        Lolcow::new(
            "moo",
            LolcowSpec {
                port,
                greeting: greeting.map(str::to_owned),
            },
        ),
        2,
    )
}

/// The time `s` seconds after the epoch.
pub(crate) fn t(s: i64) -> jiff::Timestamp {
    jiff::Timestamp::from_second(s).unwrap()
}

/// `dep` as the Deployment controller reports it once rolled out.
pub(crate) fn rolled_out(mut dep: Deployment) -> Deployment {
    dep.metadata.generation = Some(4);
    dep.status = Some(DeploymentStatus {
        observed_generation: Some(4),
        replicas: Some(1),
        updated_replicas: Some(1),
        ready_replicas: Some(1),
        available_replicas: Some(1),
        ..DeploymentStatus::default()
    });
    dep
}
