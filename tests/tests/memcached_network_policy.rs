//! `spec.networkPolicy` of a Memcached on a real cluster: set, the operator writes a
//! NetworkPolicy admitting the memcached port from the Memcached's own namespace and the
//! named ones; changed, it follows; disabled or unset, the policy goes; never set, there
//! is none.

use anyhow::{Context, Result, ensure};
use e2e::kinds::{memcached, wait_memcached_ready};
use e2e::operator::OperatorProcess;
use e2e::{TestNamespace, controlled_by, create_from_json, delete_and_wait, wait_gone, wait_until};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::networking::v1::NetworkPolicy;
use kube::api::{Api, Patch, PatchParams};
use memcached_operator::api::Memcached;
use serde_json::{Value, json};

const OPERATOR: &str = "memcached-operator";

/// The ingress rule of `np` as JSON (ports and peers), for comparison.
fn ingress(np: &NetworkPolicy) -> Value {
    np.spec
        .as_ref()
        .and_then(|s| s.ingress.as_ref())
        .map(|i| serde_json::to_value(i).unwrap_or_default())
        .unwrap_or_default()
}

/// The one ingress rule the operator writes: `port` from the own namespace's pods and
/// from the namespaces `allowed` (sorted).
fn expected_ingress(port: i32, allowed: &[&str]) -> Value {
    let mut from = vec![json!({"podSelector": {}})];
    if !allowed.is_empty() {
        from.push(json!({"namespaceSelector": {"matchExpressions": [
            {"key": "kubernetes.io/metadata.name", "operator": "In", "values": allowed}
        ]}}));
    }
    json!([{"from": from, "ports": [{"port": port, "protocol": "TCP"}]}])
}

async fn patch_spec(api: &Api<Memcached>, spec: Value) -> Result<()> {
    api.patch(
        "cache",
        &PatchParams::default(),
        &Patch::Merge(json!({ "spec": spec })),
    )
    .await?;
    Ok(())
}

#[tokio::test]
async fn memcached_network_policy_follows_the_spec() -> Result<()> {
    let ns = TestNamespace::restricted("mc-netpol").await?;
    let op = OperatorProcess::start(OPERATOR, &[&ns.name]).await?;
    let memcacheds: Api<Memcached> = ns.api();
    let policies: Api<NetworkPolicy> = ns.api();

    // Without the field: no NetworkPolicy, as before it existed.
    let mc: Memcached = create_from_json(&ns, memcached("cache", 1)).await?;
    let uid = mc.metadata.uid.clone().context("uid")?;
    wait_memcached_ready(&ns, "cache")
        .await
        .with_context(|| format!("operator log:\n{}", op.log()))?;
    ensure!(
        policies.get_opt("cache").await?.is_none(),
        "a NetworkPolicy without spec.networkPolicy"
    );

    // Set: the policy appears, the Memcached's own, selecting its pods.
    patch_spec(
        &memcacheds,
        json!({"networkPolicy": {"allowedNamespaces": ["web", "batch"]}}),
    )
    .await?;
    let want = expected_ingress(11211, &["batch", "web"]);
    let np = wait_until(&policies, "cache", |np: &NetworkPolicy| ingress(np) == want)
        .await
        .with_context(|| format!("operator log:\n{}", op.log()))?;
    ensure!(
        controlled_by(&np, &uid),
        "{:?}",
        np.metadata.owner_references
    );
    let labels = np.metadata.labels.clone().unwrap_or_default();
    ensure!(
        labels
            .get("app.kubernetes.io/managed-by")
            .map(String::as_str)
            == Some(OPERATOR)
            && labels.get("app.kubernetes.io/instance").map(String::as_str) == Some("cache"),
        "{labels:?}"
    );
    let spec = np.spec.clone().context("spec")?;
    let deployment = ns.api::<Deployment>().get("cache").await?;
    ensure!(
        spec.pod_selector.and_then(|s| s.match_labels)
            == deployment
                .spec
                .map(|s| s.selector)
                .and_then(|s| s.match_labels),
        "the policy selects the Deployment's pods"
    );
    ensure!(spec.policy_types == Some(vec!["Ingress".to_owned()]));
    // The API server took `enabled`'s default.
    let stored = memcacheds.get("cache").await?;
    ensure!(
        stored
            .spec
            .network_policy
            .as_ref()
            .is_some_and(|p| p.enabled),
        "{:?}",
        stored.spec.network_policy
    );
    wait_memcached_ready(&ns, "cache").await?;

    // Changed: the namespaces and the port follow.
    patch_spec(
        &memcacheds,
        json!({"containerPort": 11311, "networkPolicy": {"allowedNamespaces": ["web"]}}),
    )
    .await?;
    let want = expected_ingress(11311, &["web"]);
    wait_until(&policies, "cache", |np: &NetworkPolicy| ingress(np) == want).await?;

    // Disabled: it goes. Enabled again, with the own namespace only: back.
    patch_spec(&memcacheds, json!({"networkPolicy": {"enabled": false}})).await?;
    wait_gone(&policies, "cache").await?;
    patch_spec(
        &memcacheds,
        json!({"networkPolicy": {"enabled": true, "allowedNamespaces": null}}),
    )
    .await?;
    let want = expected_ingress(11311, &[]);
    wait_until(&policies, "cache", |np: &NetworkPolicy| ingress(np) == want).await?;

    // Unset: it goes, and the Memcached stays Ready.
    patch_spec(&memcacheds, json!({"networkPolicy": null})).await?;
    wait_gone(&policies, "cache").await?;
    wait_memcached_ready(&ns, "cache").await?;

    // The finalizer needs the operator: delete it while it runs.
    delete_and_wait(&memcacheds, "cache").await?;
    Ok(())
}
