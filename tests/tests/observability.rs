//! What a platform team wires in, against the real tools: the four operators, each
//! deployed from its image, export their traces over OTLP to a real Jaeger, and a real
//! Prometheus scrapes each exactly as its shipped ServiceMonitor says (the metrics
//! Service over HTTPS, with the token of a ServiceAccount bound to
//! `<operator>-metrics-reader`). After a sample of each kind converges (the
//! PulsarConsumer autoscaled against the real broker):
//! - every PromQL expression of every dashboard under `deploy/dashboards/` returns data
//!   for each operator it shows, evaluated by that Prometheus;
//! - Jaeger holds each sample's reconcile: a `reconcile` span with the object's
//!   controller, namespace, name, generation and result, and a child span per API
//!   request;
//! - each operator's log lines inside a reconcile carry that trace's id.
//!
//! Jaeger and Prometheus are built from their Go modules (`cargo xtask tool jaeger`,
//! `cargo xtask tool prometheus`) and run on 127.0.0.1 (`e2e::observability`).

use anyhow::{Context, Result, ensure};
use e2e::deployed::{Deployed, NO_REAL_NODE, has_real_node};
use e2e::kinds;
use e2e::observability::{Jaeger, OTLP_ENDPOINT_FOR_PODS, Prometheus};
use e2e::rbac::ClusterRoleBinding;
use e2e::{TestNamespace, create_from_json, kubectl_ok, poll, pulsar, repo_root};
use lolcow_operator::api::Lolcow;
use memcached_operator::api::Memcached;
use podset_operator::api::PodSet;
use pulsar_consumer_operator::api::PulsarConsumer;
use serde_json::{Value, json};
use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;
use xtask::support::promql::dashboard_queries;
use xtask::support::service_monitor::{ScrapeFiles, scrape_configs};

/// One operator under observation: its name, its controller and its sample's name.
struct Observed {
    operator: &'static str,
    controller: &'static str,
    sample: &'static str,
}

const OBSERVED: [Observed; 4] = [
    Observed {
        operator: "podset-operator",
        controller: "podset",
        sample: "observed-podset",
    },
    Observed {
        operator: "memcached-operator",
        controller: "memcached",
        sample: "observed-memcached",
    },
    Observed {
        operator: "lolcow-operator",
        controller: "lolcow",
        sample: "observed-lolcow",
    },
    Observed {
        operator: "pulsar-consumer-operator",
        controller: "pulsarconsumer",
        sample: "observed-pc",
    },
];

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
fn dashboard_expressions(
    variables: &BTreeMap<&str, String>,
    only: impl Fn(&str) -> bool,
) -> Result<Vec<(String, String)>> {
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
        if !only(&file) {
            continue;
        }
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
    ensure!(
        !out.is_empty(),
        "no dashboard for this under {}",
        dir.display()
    );
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

/// The reconcile spans of the object `namespace/name` among `traces`, each with the
/// request spans that are its children: (trace id, reconcile span, children).
fn reconciles(traces: &[Value], namespace: &str, name: &str) -> Vec<(String, Value, Vec<Value>)> {
    let mut out = Vec::new();
    for trace in traces {
        let spans = trace["spans"].as_array().cloned().unwrap_or_default();
        for span in &spans {
            if span["operationName"] != "reconcile"
                || tag(span, "namespace").as_deref() != Some(namespace)
                || tag(span, "object.name").as_deref() != Some(name)
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

/// Creates each kind's sample in `ns`.
async fn create_samples(ns: &TestNamespace) -> Result<()> {
    create_from_json::<PodSet>(ns, kinds::podset(OBSERVED[0].sample, 1)).await?;
    create_from_json::<Memcached>(ns, kinds::memcached(OBSERVED[1].sample, 1)).await?;
    let port = kinds::free_node_port(ns, "observed", &[]).await?;
    create_from_json::<Lolcow>(ns, kinds::lolcow(OBSERVED[2].sample, port, "observed")).await?;
    // Autoscaled on the real broker's backlog, so its own dashboard has every series.
    let topic = pulsar::unique_topic("observed");
    create_from_json::<PulsarConsumer>(
        ns,
        json!({
            "apiVersion": "pulsar.pulsarconsumer.krvarma.com/v1",
            "kind": "PulsarConsumer",
            "metadata": {"name": OBSERVED[3].sample},
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
        }),
    )
    .await?;
    kinds::wait_podset_ready(ns, OBSERVED[0].sample).await?;
    kinds::wait_memcached_ready(ns, OBSERVED[1].sample).await?;
    kinds::wait_lolcow_ready(ns, OBSERVED[2].sample).await?;
    kinds::wait_pulsar_consumer_ready(ns, OBSERVED[3].sample).await?;
    Ok(())
}

/// Every dashboard query, for each operator it shows, returns data from `prometheus`.
async fn every_dashboard_query_has_data(
    prometheus: &mut Prometheus,
    ns: &TestNamespace,
) -> Result<()> {
    let mut expressions = Vec::new();
    for observed in &OBSERVED {
        let variables: BTreeMap<&str, String> = [
            ("__rate_interval", "1m".to_owned()),
            ("namespace", format!("{}-system", observed.operator)),
            ("controller", observed.controller.to_owned()),
            ("pc_namespace", ns.name.clone()),
            ("pulsarconsumer", ".+".to_owned()),
        ]
        .into_iter()
        .collect();
        // The PulsarConsumer dashboard is its operator's alone.
        let pulsar = observed.controller == "pulsarconsumer";
        expressions.extend(dashboard_expressions(&variables, |file| {
            pulsar || file != "pulsarconsumer.json"
        })?);
    }
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
        "all {} dashboard queries (each dashboard for each operator it shows) returned data",
        expressions.len()
    );
    Ok(())
}

/// Jaeger holds a reconcile of `observed`'s sample with its API requests as children, and
/// the operator's log lines about it carry the id of one of its traces.
async fn traced(jaeger: &mut Jaeger, observed: &Observed, ns: &TestNamespace) -> Result<()> {
    let (operator, name) = (observed.operator, observed.sample);
    let (trace_id, span, children) = poll(
        &format!("a reconcile trace of {name} from {operator} in Jaeger"),
        Duration::from_secs(60),
        || {
            let traces = jaeger.traces(operator, 200);
            let ns = ns.name.clone();
            async move {
                Ok(reconciles(&traces?, &ns, name)
                    .into_iter()
                    .find(|(_, _, children)| {
                        children.iter().any(|c| tag(c, "http.method").is_some())
                    }))
            }
        },
    )
    .await?;
    ensure!(
        tag(&span, "controller").as_deref() == Some(observed.controller),
        "the reconcile span's controller: {span}"
    );
    ensure!(
        tag(&span, "generation").is_some_and(|g| g.parse::<i64>().is_ok_and(|g| g >= 1)),
        "the reconcile span's generation: {span}"
    );
    ensure!(
        tag(&span, "result").is_some(),
        "the reconcile span has no result: {span}"
    );
    eprintln!(
        "{operator}: trace {trace_id}, a reconcile with {} request spans ({})",
        children.len(),
        children
            .iter()
            .map(|c| c["operationName"].as_str().unwrap_or_default())
            .collect::<Vec<_>>()
            .join(", ")
    );
    let traces = jaeger.traces(operator, 1000)?;
    let ids: BTreeSet<String> = reconciles(&traces, &ns.name, name)
        .into_iter()
        .map(|(id, _, _)| id)
        .collect();
    let logs = kubectl_ok([
        "logs",
        "-n",
        &format!("{operator}-system"),
        &format!("deployment/{operator}"),
        "--tail=-1",
    ])?;
    let lines: Vec<Value> = logs
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|l| {
            log_field(l, "object.name").as_deref() == Some(name)
                && log_field(l, "namespace").as_deref() == Some(ns.name.as_str())
        })
        .collect();
    ensure!(
        !lines.is_empty(),
        "no log line of {operator} names {}/{name}:\n{logs}",
        ns.name
    );
    ensure!(
        lines
            .iter()
            .any(|l| log_field(l, "trace_id").is_some_and(|id| ids.contains(&id))),
        "no log line of {operator} about {}/{name} carries the id of one of its reconciles' traces {ids:?}:\n{}",
        ns.name,
        lines
            .iter()
            .map(Value::to_string)
            .collect::<Vec<_>>()
            .join("\n")
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn prometheus_and_jaeger_see_every_operator_deployed_from_its_image() -> Result<()> {
    let client = e2e::admin_client().await?;
    if !has_real_node(&client).await? {
        return e2e::skip(
            "prometheus_and_jaeger_see_every_operator_deployed_from_its_image",
            NO_REAL_NODE,
        );
    }
    let mut jaeger = Jaeger::start().await?;
    let (_host_url, _broker) = pulsar::shared_broker().await?;
    let cidrs = pulsar::broker_addresses(&client).await?;
    let mut deployed = Vec::new();
    for observed in &OBSERVED {
        let operator = Deployed::new(observed.operator)?;
        // As the docs tell a user to: the collector's endpoint (and, for the
        // PulsarConsumer operator, the shared broker granted).
        let mut env = vec![format!(
            "OTEL_EXPORTER_OTLP_ENDPOINT={OTLP_ENDPOINT_FOR_PODS}"
        )];
        if observed.controller == "pulsarconsumer" {
            env.push(format!("PULSAR_ADMIN_ALLOWED_CIDRS={cidrs}"));
        }
        operator.set_env(&env)?;
        deployed.push(operator);
    }

    // Prometheus' identity, as the ServiceMonitors' comment says to make it.
    let ns = TestNamespace::real("observed").await?;
    kubectl_ok(["create", "serviceaccount", "prometheus", "-n", &ns.name])?;
    let mut bindings = Vec::new();
    for observed in &OBSERVED {
        bindings.push(ClusterRoleBinding::create(
            &format!("{}-metrics-reader", observed.operator),
            &ns.name,
            "prometheus",
        )?);
    }
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
    for observed in &OBSERVED {
        for monitor in monitors(observed.operator)? {
            configs.extend(scrape_configs(&monitor, &files)?);
        }
    }
    let mut prometheus = Prometheus::start(configs, "2s").await?;

    create_samples(&ns).await?;

    // Prometheus found each operator's pod through its Service and scrapes it.
    for observed in &OBSERVED {
        let system = format!("{}-system", observed.operator);
        let target = poll(
            &format!("Prometheus scraping {} (health up)", observed.operator),
            Duration::from_secs(120),
            || {
                let targets = prometheus.targets();
                let system = system.clone();
                async move {
                    Ok(targets?.into_iter().find(|t| {
                        t["labels"]["namespace"] == system.as_str() && t["health"] == "up"
                    }))
                }
            },
        )
        .await?;
        eprintln!("{}: scraping {}", observed.operator, target["scrapeUrl"]);
    }
    every_dashboard_query_has_data(&mut prometheus, &ns).await?;
    for observed in &OBSERVED {
        traced(&mut jaeger, observed, &ns).await?;
    }
    drop(bindings);
    drop(deployed);
    Ok(())
}
