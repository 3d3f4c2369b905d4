//! NodePorts: which the cluster's Services hold (so a test or the bench picks free ones).

use std::collections::BTreeSet;

use anyhow::Result;
use k8s_openapi::api::core::v1::Service;
use kube::{Api, Client, api::ListParams};

/// The NodePorts every Service of the cluster holds now.
///
/// # Errors
/// When the Services cannot be listed.
pub async fn in_use(client: &Client) -> Result<BTreeSet<i32>> {
    Ok(Api::<Service>::all(client.clone())
        .list(&ListParams::default())
        .await?
        .items
        .iter()
        .filter_map(|s| s.spec.as_ref()?.ports.as_ref())
        .flatten()
        .filter_map(|p| p.node_port)
        .collect())
}
