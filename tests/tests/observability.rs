//! What a platform team wires in, against the real tools: an operator deployed from its
//! image (pulsar-consumer-operator, whose dashboard has the most to show) exports its
//! traces over OTLP to a real Jaeger, and a real Prometheus scrapes it exactly as the
//! shipped ServiceMonitor says (the metrics Service over HTTPS, with the token of a
//! ServiceAccount bound to `<operator>-metrics-reader`). After an autoscaled
//! PulsarConsumer converges against the real broker:
//! - every PromQL expression of every dashboard under `deploy/dashboards/` returns data,
//!   evaluated by that Prometheus;
//! - Jaeger holds the reconcile's trace: a `reconcile` span with the object's controller,
//!   namespace, name, generation and result, and a child span per API request;
//! - the operator's log lines inside a reconcile carry that trace's id.
//!
//! Jaeger and Prometheus are built from their Go modules (`cargo xtask tool jaeger`,
//! `cargo xtask tool prometheus`) and run on 127.0.0.1 (`e2e::observability`).

use anyhow::{Context, Result, ensure};
use e2e::deployed::{Deployed, NO_REAL_NODE, has_real_node};
use e2e::observability::{Jaeger, OTLP_ENDPOINT_FOR_PODS, Prometheus};
use e2e::rbac::ClusterRoleBinding;
use e2e::{TestNamespace, create_from_json, kubectl_ok, poll, pulsar, repo_root};
use pulsar_consumer_operator::api::PulsarConsumer;
use serde_json::{Value, json};
use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;
use xtask::support::promql::dashboard_queries;
use xtask::support::service_monitor::{ScrapeFiles, scrape_configs};

const OPERATOR: &str = "pulsar-consumer-operator";
/// The name of the PulsarConsumer.
const NAME: &str = "observed";

/// The shipped ServiceMonitor(s) of `operator`, rendered by kustomize (so with the
/// install's namespace).
fn monitors(operator: &str) -> Result<Vec<Value>> {
    let dir = repo_root().join("deploy").join(operator).join("prometheus");
    let objects = xtask::support::kustomize::build(&e2e::kubectl_runner(), &dir)?;
    let monitors: Vec<Value> = objects
        .into_iter()
        .filter(|o| o["kind"] == "ServiceMonitor")
        .collect();
    ensure!(
        !monitors.is_empty(),
        "{} has no ServiceMonitor",
        dir.display()
    );
    Ok(monitors)
}

/// Every query of every dashboard, its Grafana variables replaced as a user who picked
/// "All" (and the operator's namespace) would have them.
fn dashboard_expressions(variables: &BTreeMap<&str, String>) -> Result<Vec<(String, String)>> {
    let dir = repo_root().join("deploy").join("dashboards");
    let mut out = Vec::new();
    for entry in std::fs::read_dir(&dir)? {
        let path = entry?.path();
        if path.extension().is_none_or(|e| e != "json") {
            continue;
        }
        let file = path
            .file_name()
            .map(|f| f.to_string_lossy().into_owned())
            .unwrap_or_default();
        let dashboard: Value = serde_json::from_str(&std::fs::read_to_string(&path)?)
            .with_context(|| format!("parsing {}", path.display()))?;
        let queries = dashboard_queries(&dashboard);
        ensure!(!queries.is_empty(), "{file} has no query");
        for query in queries {
            let mut expr = query.clone();
            // Longest names first: `$pc_namespace` before `$namespace`.
            let mut names: Vec<&&str> = variables.keys().collect();
            names.sort_by_key(|n| std::cmp::Reverse(n.len()));
            for name in names {
                expr = expr.replace(&format!("${name}"), &variables[*name]);
            }
            ensure!(
                !expr.contains('$'),
                "{file}: a variable this test does not know in {query:?}"
            );
            out.push((file.clone(), expr));
        }
    }
    ensure!(!out.is_empty(), "no dashboard under {}", dir.display());
    Ok(out)
}

/// A span's tag value, as text.
fn tag(span: &Value, key: &str) -> Option<String> {
    span["tags"]
        .as_array()?
        .iter()
        .find(|t| t["key"] == key)
        .map(|t| match &t["value"] {
            Value::String(s) => s.clone(),
            other => other.to_string(),
        })
}

/// A field of a JSON log line: the event's own, or its span's (`span`).
fn log_field(line: &Value, key: &str) -> Option<String> {
    [&line[key], &line["span"][key]]
        .into_iter()
        .find_map(|v| v.as_str().map(str::to_owned))
}

/// The reconcile spans of the PulsarConsumer `namespace/NAME` among `traces`, each with
/// the request spans that are its children: (trace id, reconcile span, children).
fn reconciles(traces: &[Value], namespace: &str) -> Vec<(String, Value, Vec<Value>)> {
    let mut out = Vec::new();
    for trace in traces {
        let spans = trace["spans"].as_array().cloned().unwrap_or_default();
        for span in &spans {
            if span["operationName"] != "reconcile"
                || tag(span, "namespace").as_deref() != Some(namespace)
                || tag(span, "object.name").as_deref() != Some(NAME)
            {
                continue;
            }
            let id = &span["spanID"];
            let children: Vec<Value> = spans
                .iter()
                .filter(|s| {
                    s["references"].as_array().is_some_and(|refs| {
                        refs.iter()
                            .any(|r| r["refType"] == "CHILD_OF" && &r["spanID"] == id)
                    })
                })
                .cloned()
                .collect();
            out.push((
                span["traceID"].as_str().unwrap_or_default().to_owned(),
                span.clone(),
                children,
            ));
        }
    }
    out
}

#[tokio::test(flavor = "multi_thread")]
async fn prometheus_and_jaeger_see_an_operator_deployed_from_its_image() -> Result<()> {
    let client = e2e::admin_client().await?;
    if !has_real_node(&client).await? {
        return e2e::skip(
            "prometheus_and_jaeger_see_an_operator_deployed_from_its_image",
            NO_REAL_NODE,
        );
    }
    let mut jaeger = Jaeger::start().await?;
    let (_host_url, _broker) = pulsar::shared_broker().await?;
    let deployed = Deployed::new(OPERATOR)?;
    let system = deployed.namespace();
    // As the docs tell a user to: the collector's endpoint, and the shared broker granted.
    let cidrs = pulsar::broker_addresses(&client).await?;
    deployed.set_env(&[
        format!("OTEL_EXPORTER_OTLP_ENDPOINT={OTLP_ENDPOINT_FOR_PODS}"),
        format!("PULSAR_ADMIN_ALLOWED_CIDRS={cidrs}"),
    ])?;

    // Prometheus' identity, as the ServiceMonitor's comment says to make it.
    let ns = TestNamespace::real("observed").await?;
    kubectl_ok(["create", "serviceaccount", "prometheus", "-n", &ns.name])?;
    let _binding = ClusterRoleBinding::create(
        &format!("{OPERATOR}-metrics-reader"),
        &ns.name,
        "prometheus",
    )?;
    let token = kubectl_ok([
        "create",
        "token",
        "prometheus",
        "-n",
        &ns.name,
        "--duration=1h",
    ])?;
    let work = e2e::target_dir().join("e2e-observability");
    std::fs::create_dir_all(&work)?;
    let token_file = work.join(format!("token-{}", ns.name));
    std::fs::write(&token_file, token.trim())?;
    let kubeconfig = e2e::kubeconfig_path()?;
    let files = ScrapeFiles {
        kubeconfig: &kubeconfig.to_string_lossy(),
        token: &token_file.to_string_lossy(),
    };
    let mut configs = Vec::new();
    for monitor in monitors(OPERATOR)? {
        configs.extend(scrape_configs(&monitor, &files)?);
    }
    let mut prometheus = Prometheus::start(configs, "2s").await?;

    // A PulsarConsumer autoscaled on the real broker's backlog.
    let topic = pulsar::unique_topic("observed");
    let manifest = json!({
        "apiVersion": "pulsar.pulsarconsumer.krvarma.com/v1",
        "kind": "PulsarConsumer",
        "metadata": {"name": NAME},
        "spec": {
            "serverAddress": "pulsar://pulsar-broker.pulsar.svc:6650",
            "topic": topic,
            "subscriptionName": "observed",
            "replicas": 1,
            "autoscaling": {
                "minReplicas": 1,
                "maxReplicas": 2,
                "targetBacklogPerReplica": 1000,
                "adminUrl": "http://pulsar-broker.pulsar.svc:18080",
                "pollIntervalSeconds": 2
            }
        }
    });
    create_from_json::<PulsarConsumer>(&ns, manifest).await?;
    let pc = e2e::kinds::wait_pulsar_consumer_ready(&ns, NAME).await?;
    let generation = pc.metadata.generation.context("no generation")?;

    // Prometheus found the operator's pod through the Service and scrapes it.
    let target = poll(
        "Prometheus scraping the operator (health up)",
        Duration::from_secs(120),
        || {
            let targets = prometheus.targets();
            let system = system.clone();
            async move {
                Ok(targets?
                    .into_iter()
                    .find(|t| t["labels"]["namespace"] == system.as_str() && t["health"] == "up"))
            }
        },
    )
    .await?;
    eprintln!("scraping {}", target["scrapeUrl"]);

    // Every dashboard query returns data.
    let variables: BTreeMap<&str, String> = [
        ("__rate_interval", "1m".to_owned()),
        ("namespace", deployed.namespace()),
        ("controller", ".+".to_owned()),
        ("pc_namespace", ns.name.clone()),
        ("pulsarconsumer", ".+".to_owned()),
    ]
    .into_iter()
    .collect();
    let expressions = dashboard_expressions(&variables)?;
    let mut without_data = BTreeSet::new();
    let outcome = poll(
        "every dashboard query returning data",
        Duration::from_secs(120),
        || {
            let mut missing = BTreeSet::new();
            let mut failed = None;
            for (file, expr) in &expressions {
                match prometheus.query(expr) {
                    Ok(result) if !result.is_empty() => {}
                    Ok(_) => {
                        missing.insert(format!("{file}: {expr}"));
                    }
                    Err(e) => failed = Some(e),
                }
            }
            without_data = missing.clone();
            async move {
                if let Some(e) = failed {
                    return Err(e);
                }
                Ok(missing.is_empty().then_some(()))
            }
        },
    )
    .await;
    ensure!(
        outcome.is_ok(),
        "{outcome:?}\nqueries without data:\n  {}",
        without_data.into_iter().collect::<Vec<_>>().join("\n  ")
    );
    eprintln!(
        "all {} dashboard queries returned data from Prometheus",
        expressions.len()
    );

    // Jaeger holds a reconcile of the object with its API requests as children.
    let found = poll(
        "a reconcile trace of the PulsarConsumer in Jaeger",
        Duration::from_secs(60),
        || {
            let traces = jaeger.traces(OPERATOR, 200);
            let ns = ns.name.clone();
            async move {
                let traces = traces?;
                Ok(reconciles(&traces, &ns)
                    .into_iter()
                    .find(|(_, _, children)| {
                        children.iter().any(|c| tag(c, "http.method").is_some())
                    }))
            }
        },
    )
    .await?;
    let (trace_id, span, children) = found;
    ensure!(
        tag(&span, "controller").as_deref() == Some("pulsarconsumer"),
        "the reconcile span's controller: {span}"
    );
    ensure!(
        tag(&span, "generation")
            .is_some_and(|g| g.parse::<i64>().is_ok_and(|g| g >= 1 && g <= generation)),
        "the reconcile span's generation (the object is at {generation}): {span}"
    );
    ensure!(
        tag(&span, "result").is_some(),
        "the reconcile span has no result: {span}"
    );
    eprintln!(
        "trace {trace_id}: reconcile with {} request spans ({})",
        children.len(),
        children
            .iter()
            .map(|c| c["operationName"].as_str().unwrap_or_default())
            .collect::<Vec<_>>()
            .join(", ")
    );

    // The operator's log lines inside a reconcile carry its trace id.
    let traces = jaeger.traces(OPERATOR, 1000)?;
    let ids: BTreeSet<String> = reconciles(&traces, &ns.name)
        .into_iter()
        .map(|(id, _, _)| id)
        .collect();
    let logs = kubectl_ok([
        "logs",
        "-n",
        &deployed.namespace(),
        &format!("deployment/{OPERATOR}"),
        "--tail=-1",
    ])?;
    let traced: Vec<Value> = logs
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|l| {
            log_field(l, "object.name").as_deref() == Some(NAME)
                && log_field(l, "namespace").as_deref() == Some(ns.name.as_str())
        })
        .collect();
    ensure!(
        !traced.is_empty(),
        "no log line of the operator names {}/{NAME}:\n{logs}",
        ns.name
    );
    ensure!(
        traced
            .iter()
            .any(|l| log_field(l, "trace_id").is_some_and(|id| ids.contains(&id))),
        "no log line about {}/{NAME} carries the id of one of its reconciles' traces {ids:?}:\n{}",
        ns.name,
        traced
            .iter()
            .map(Value::to_string)
            .collect::<Vec<_>>()
            .join("\n")
    );
    drop(deployed);
    Ok(())
}
