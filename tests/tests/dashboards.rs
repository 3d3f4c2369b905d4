//! The Grafana dashboards under `deploy/dashboards/` show data: every metric their
//! queries name (panels and variables) is on a running operator's `/metrics`.
//!
//! The controller dashboard against podset-operator, and both dashboards against
//! pulsar-consumer-operator, each run as a local process with leader election (so
//! `leader_election_master_status` is there) and an object to reconcile. The PulsarConsumer
//! is autoscaled against a stand-in for the Pulsar admin API (a local HTTP server answering
//! a stats document with a backlog of [`BACKLOG`]), so its backlog and desired-replica
//! gauges have series, and their values are checked against the status too.
//!
//! Names are compared as Prometheus stores them (`xtask::support::promql`): a counter's series end
//! in `_total`, a histogram's in `_bucket`/`_sum`/`_count`.

use anyhow::{Context, Result, ensure};
use e2e::operator::{OperatorOptions, OperatorProcess, metric_sum};
use e2e::{TestNamespace, create_from_json, kinds, poll, repo_root, unique_suffix};
use k8s_openapi::api::coordination::v1::Lease;
use kube::api::{Api, DeleteParams};
use podset_operator::api::PodSet;
use pulsar_consumer_operator::api::PulsarConsumer;
use serde_json::{Value, json};
use std::collections::BTreeSet;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use xtask::support::promql::{dashboard_queries, exposed_names, metric_names};

/// The backlog the stand-in admin API reports.
const BACKLOG: u64 = 2500;
/// `targetBacklogPerReplica` of the test object: 2,500 messages want 3 consumers.
const TARGET: u64 = 1000;

/// A dashboard of `deploy/dashboards/` and the metric names its queries read.
fn dashboard_metrics(file: &str) -> Result<BTreeSet<String>> {
    let path = repo_root().join("deploy").join("dashboards").join(file);
    let dashboard: Value = serde_json::from_str(&std::fs::read_to_string(&path)?)
        .with_context(|| format!("parsing {}", path.display()))?;
    let queries = dashboard_queries(&dashboard);
    ensure!(!queries.is_empty(), "{file} has no query");
    let mut names = BTreeSet::new();
    for query in &queries {
        let found = metric_names(query);
        ensure!(!found.is_empty(), "{file}: no metric in {query:?}");
        names.extend(found);
    }
    Ok(names)
}

/// Fails naming every metric of the dashboard `file` that `/metrics` of `who` lacks.
fn assert_all_exposed(file: &str, text: &str, who: &str) -> Result<()> {
    let exposed = exposed_names(text);
    let used = dashboard_metrics(file)?;
    let missing: Vec<&String> = used.difference(&exposed).collect();
    ensure!(
        missing.is_empty(),
        "{file} reads metrics that {who}'s /metrics does not have: {missing:?}\n/metrics:\n{text}"
    );
    eprintln!("{file}: all {} metrics are on {who}'s /metrics", used.len());
    Ok(())
}

/// `operator` watching `ns`, with leader election on a Lease of its own in
/// `<operator>-system` (the namespace its leader-election Role covers).
async fn start_leading(operator: &str, ns: &TestNamespace) -> Result<(OperatorProcess, String)> {
    let system = format!("{operator}-system");
    let lease = format!("e2e-dashboards-{}", unique_suffix());
    let op = OperatorProcess::start_with(
        operator,
        &[&ns.name],
        OperatorOptions {
            args: vec![
                "--leader-elect".to_owned(),
                format!("--leader-election-namespace={system}"),
                format!("--leader-election-id={lease}"),
            ],
            env: vec![
                ("POD_NAME".into(), format!("dashboards-{}", unique_suffix())),
                ("POD_NAMESPACE".into(), system.clone()),
                // The stand-in admin API listens on loopback, which the PulsarConsumer
                // operator refuses unless its administrator allows it.
                (
                    "PULSAR_ADMIN_ALLOWED_CIDRS".into(),
                    "127.0.0.0/8,::1".into(),
                ),
                ("PULSAR_ADMIN_MIN_POLL_SECONDS".into(), "1".into()),
            ],
            ..OperatorOptions::default()
        },
    )
    .await?;
    poll("leadership", Duration::from_secs(60), || async {
        let text = op.metrics()?;
        Ok((metric_sum(&text, "leader_election_master_status", &[]) == 1.0).then_some(()))
    })
    .await?;
    Ok((op, lease))
}

async fn delete_lease(ns: &TestNamespace, operator: &str, lease: &str) {
    let leases: Api<Lease> = Api::namespaced(ns.client.clone(), &format!("{operator}-system"));
    let _ = leases.delete(lease, &DeleteParams::default()).await;
}

#[tokio::test]
async fn the_controller_dashboard_reads_only_what_podset_operator_exposes() -> Result<()> {
    let ns = TestNamespace::new("dashboards-podset").await?;
    let (mut op, lease) = start_leading("podset-operator", &ns).await?;
    create_from_json::<PodSet>(&ns, kinds::podset("shown", 2)).await?;
    kinds::wait_podset_ready(&ns, "shown").await?;
    let text = op.metrics()?;
    let result = assert_all_exposed("controllers.json", &text, "podset-operator");
    op.terminate()?;
    delete_lease(&ns, "podset-operator", &lease).await;
    result
}

/// A stand-in for the Pulsar admin API: every request gets a stats document in which the
/// subscription `subscription` has a backlog of [`BACKLOG`].
async fn admin_api(subscription: &str) -> Result<(u16, tokio::task::JoinHandle<()>)> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let port = listener.local_addr()?.port();
    let body = json!({"subscriptions": {subscription: {"msgBacklog": BACKLOG}}}).to_string();
    let task = tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            let body = body.clone();
            tokio::spawn(async move {
                let mut request = Vec::new();
                let mut buf = [0u8; 1024];
                while !request.windows(4).any(|w| w == b"\r\n\r\n") {
                    match stream.read(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => request.extend_from_slice(&buf[..n]),
                    }
                }
                let response = format!(
                    "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                    body.len()
                );
                let _ = stream.write_all(response.as_bytes()).await;
            });
        }
    });
    Ok((port, task))
}

#[tokio::test]
async fn both_dashboards_read_only_what_pulsar_consumer_operator_exposes() -> Result<()> {
    let operator = "pulsar-consumer-operator";
    let ns = TestNamespace::new("dashboards-pulsar").await?;
    let (port, admin) = admin_api("dash-sub").await?;
    let (mut op, lease) = start_leading(operator, &ns).await?;
    create_from_json::<PulsarConsumer>(
        &ns,
        json!({
            "apiVersion": "pulsar.pulsarconsumer.krvarma.com/v1",
            "kind": "PulsarConsumer",
            "metadata": {"name": "shown"},
            "spec": {
                "serverAddress": "pulsar://localhost:6650",
                "topic": "dash-topic",
                "subscriptionName": "dash-sub",
                "replicas": 1,
                "autoscaling": {
                    "minReplicas": 0, "maxReplicas": 5, "targetBacklogPerReplica": TARGET,
                    "adminUrl": format!("http://127.0.0.1:{port}"), "pollIntervalSeconds": 1
                }
            }
        }),
    )
    .await?;
    let want = BACKLOG.div_ceil(TARGET);
    let pcs: Api<PulsarConsumer> = ns.api();
    poll(
        "status.backlog and desiredReplicas from the admin API",
        Duration::from_secs(60),
        || async {
            let pc = pcs.get("shown").await?;
            let status = pc.status.unwrap_or_default();
            Ok((status.backlog == Some(BACKLOG as i64)
                && status.desired_replicas == Some(want as i32))
            .then_some(()))
        },
    )
    .await?;
    // The gauges follow the status at the next scrape.
    let labels = [
        ("pulsarconsumer_namespace", ns.name.as_str()),
        ("pulsarconsumer", "shown"),
    ];
    let text = poll(
        "the gauges on /metrics",
        Duration::from_secs(30),
        || async {
            let text = op.metrics()?;
            let backlog = metric_sum(&text, "pulsarconsumer_backlog_messages", &labels);
            let desired = metric_sum(&text, "pulsarconsumer_desired_replicas", &labels);
            Ok((backlog == BACKLOG as f64 && desired == want as f64).then_some(text))
        },
    )
    .await?;
    let result = assert_all_exposed("controllers.json", &text, operator)
        .and_then(|()| assert_all_exposed("pulsarconsumer.json", &text, operator));
    op.terminate()?;
    admin.abort();
    delete_lease(&ns, operator, &lease).await;
    result
}
