//! A status field that stops applying is removed from the stored status, on the real API
//! server (the status patch sends `null` for it), not only in the struct the operator
//! computes.

use anyhow::Result;
use e2e::kinds::{free_node_port, lolcow};
use e2e::operator::{OperatorOptions, OperatorProcess};
use e2e::{TestNamespace, create_from_json, delete_and_wait, wait_for};
use k8s_openapi::api::core::v1::{Service, ServicePort, ServiceSpec};
use kube::api::PostParams;
use lolcow_operator::api::Lolcow;

const OPERATOR: &str = "lolcow-operator";

fn options() -> OperatorOptions {
    OperatorOptions {
        env: vec![(
            "LOLCOW_IMAGE".into(),
            "registry.example/lolcow-web:e2e".into(),
        )],
        ..OperatorOptions::default()
    }
}

fn reason(lc: &Lolcow) -> Option<&str> {
    let status = lc.status.as_ref()?;
    (status.observed_generation == lc.metadata.generation).then_some(())?;
    status
        .conditions
        .iter()
        .find(|c| c.type_ == "Ready")
        .map(|c| c.reason.as_str())
}

/// A Lolcow that served a NodePort, whose Service name is then taken by someone else's
/// Service: the status no longer reports a port (it used to keep the old one forever,
/// because the merge patch left the absent field out).
#[tokio::test]
async fn a_port_no_longer_served_leaves_the_stored_status() -> Result<()> {
    let ns = TestNamespace::new("status-fields").await?;
    let mut op = OperatorProcess::start_with(OPERATOR, &[&ns.name], options()).await?;
    let port = free_node_port(&ns, "status-fields", &[]).await?;
    create_from_json::<Lolcow>(&ns, lolcow("moo", port, "Hello")).await?;
    let lolcows = ns.api::<Lolcow>();
    wait_for(&lolcows, "moo", |lc: Option<&Lolcow>| {
        lc.and_then(|lc| lc.status.as_ref())
            .is_some_and(|s| s.port == Some(port))
    })
    .await?;

    // With the operator stopped, someone else's Service takes the name.
    op.terminate()?;
    let services = ns.api::<Service>();
    delete_and_wait(&services, "moo").await?;
    let mut foreign = Service {
        spec: Some(ServiceSpec {
            ports: Some(vec![ServicePort {
                port: 80,
                ..ServicePort::default()
            }]),
            ..ServiceSpec::default()
        }),
        ..Service::default()
    };
    foreign.metadata.name = Some("moo".into());
    services.create(&PostParams::default(), &foreign).await?;

    let _op = OperatorProcess::start_with(OPERATOR, &[&ns.name], options()).await?;
    let lc = wait_for(&lolcows, "moo", |lc: Option<&Lolcow>| {
        lc.and_then(reason) == Some("NameConflict")
    })
    .await?;
    let status = lc.and_then(|lc| lc.status).unwrap_or_default();
    assert_eq!(
        status.port, None,
        "the stored status still reports the NodePort the Lolcow no longer serves"
    );
    // The raw object agrees (no `port: null` either: the key is gone).
    let raw = e2e::kubectl_ok([
        "get",
        "lolcow",
        "moo",
        "-n",
        &ns.name,
        "-o",
        "jsonpath={.status}",
    ])?;
    assert!(!raw.contains("\"port\""), "status still has a port: {raw}");
    Ok(())
}
