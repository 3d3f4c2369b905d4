//! The Lolcow operator on a real cluster, run with its own ServiceAccount.
//!
//! NodePorts are cluster-wide and tests run in parallel: every test picks its ports from a
//! hash of its namespace's name, skipping ports other Services hold, and moves to another
//! port if one was taken meanwhile (except where the conflict is the point of the test).
//!
//! The web app's pods go to the simulated nodes, except in
//! `lolcow_page_flood_leaves_the_pod_ready_on_the_real_node`, whose pod runs the
//! lolcow-web image (built and pushed to the real node's registry as `cargo xtask deploy`
//! does) on the real node, where the kubelet probes it.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail, ensure};
use e2e::kinds::{
    LOLCOW, assert_all_creates_rejected, free_node_port, named_bad, wait_lolcow_ready,
};
use e2e::operator::{OperatorOptions, OperatorProcess, touch_and_wait_reconcile};
use e2e::{
    TIMEOUT, TestNamespace, assert_never_reconciled, can_i, create_from_json, events_where,
    kubectl_ok, poll, repo_root, wait_for, wait_for_within, wait_gone, watching_one,
};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Node, Pod, Service};
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use lolcow_operator::api::Lolcow;
use lolcow_operator::desired::configured_greeting;
use lolcow_operator::desired::fortune_for;
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const OPERATOR: &str = "lolcow-operator";

fn lolcow(name: &str, port: i32, greeting: Option<&str>) -> Value {
    let mut spec = json!({ "port": port });
    if let Some(g) = greeting {
        spec["greeting"] = json!(g);
    }
    json!({
        "apiVersion": "my.domain/v1alpha1",
        "kind": "Lolcow",
        "metadata": {"name": name},
        "spec": spec,
    })
}

async fn create(ns: &TestNamespace, manifest: Value) -> Result<Lolcow> {
    create_from_json(ns, manifest).await
}

async fn patch_spec(ns: &TestNamespace, name: &str, spec: Value) -> Result<Lolcow> {
    Ok(ns
        .api::<Lolcow>()
        .patch(
            name,
            &PatchParams::default(),
            &Patch::Merge(json!({ "spec": spec })),
        )
        .await?)
}

fn ready(lc: &Lolcow) -> Option<&Condition> {
    lc.status
        .as_ref()?
        .conditions
        .iter()
        .find(|c| c.type_ == "Ready")
}

fn current(lc: &Lolcow) -> bool {
    lc.status
        .as_ref()
        .is_some_and(|s| s.observed_generation == lc.metadata.generation)
}

fn service_node_port(svc: &Service) -> Option<i32> {
    svc.spec.as_ref()?.ports.as_ref()?.first()?.node_port
}

/// The operator's reconciles of Lolcows.
const LOLCOW_RECONCILES: &[(&str, &str)] = &[("controller", "lolcow")];

fn reconciles(op: &OperatorProcess) -> Result<f64> {
    op.reconciles(LOLCOW_RECONCILES)
}

async fn events_about(ns: &TestNamespace, name: &str) -> Result<Vec<Event>> {
    events_where(ns, |e| {
        e.regarding
            .as_ref()
            .is_some_and(|r| r.kind.as_deref() == Some("Lolcow") && r.name.as_deref() == Some(name))
    })
    .await
}

fn warnings(events: &[Event]) -> Vec<&Event> {
    events
        .iter()
        .filter(|e| e.type_.as_deref() == Some("Warning"))
        .collect()
}

#[tokio::test]
async fn lolcow_converges_changes_and_repairs() -> Result<()> {
    let ns = TestNamespace::restricted("lolcow").await?;
    let _op = OperatorProcess::start_with(
        OPERATOR,
        &[&ns.name],
        OperatorOptions {
            env: vec![(
                "LOLCOW_IMAGE".into(),
                "registry.example/lolcow-web:e2e".into(),
            )],
            ..OperatorOptions::default()
        },
    )
    .await?;

    // Create converges to Ready, with a manifest as written for the Go operator.
    let port = free_node_port(&ns, "first", &[]).await?;
    create(&ns, lolcow("moo", port, Some("Hello, cluster!"))).await?;
    let lc = wait_lolcow_ready(&ns, "moo").await?;
    let status = lc.status.clone().unwrap_or_default();
    assert_eq!(status.greeting.as_deref(), Some("Hello, cluster!"));
    assert_eq!(status.path.as_deref(), Some("/"));
    let port = lc.spec.port;
    let uid = lc.metadata.uid.clone().unwrap_or_default();

    // The web app: one replica, restricted, probes, greeting, owned and labelled.
    let deployments: Api<Deployment> = ns.api();
    let dep = deployments.get("moo").await?;
    let owned = |refs: &Option<Vec<_>>| {
        refs.iter().flatten().any(
            |r: &k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference| {
                r.uid == uid && r.controller == Some(true)
            },
        )
    };
    assert!(owned(&dep.metadata.owner_references));
    let labels = dep.metadata.labels.clone().unwrap_or_default();
    for (k, v) in [
        ("app.kubernetes.io/name", "lolcow"),
        ("app.kubernetes.io/instance", "moo"),
        ("app.kubernetes.io/managed-by", OPERATOR),
        ("app.kubernetes.io/part-of", "lolcow"),
    ] {
        assert_eq!(labels.get(k).map(String::as_str), Some(v), "label {k}");
    }
    let spec = dep.spec.clone().unwrap_or_default();
    assert_eq!(spec.replicas, Some(1));
    let pod = spec.template.spec.clone().unwrap_or_default();
    assert_eq!(pod.automount_service_account_token, Some(false));
    let c = &pod.containers[0];
    assert_eq!(c.image.as_deref(), Some("registry.example/lolcow-web:e2e"));
    assert_eq!(
        configured_greeting(&dep).as_deref(),
        Some("Hello, cluster!")
    );
    let cport = &c.ports.clone().unwrap_or_default()[0];
    assert_eq!(
        (cport.name.as_deref(), cport.container_port),
        (Some("http"), 8080)
    );
    // The probes go to a listener of their own, which no Service exposes.
    let probe_port = &c.ports.clone().unwrap_or_default()[1];
    assert_eq!(
        (probe_port.name.as_deref(), probe_port.container_port),
        (Some("probes"), 8081)
    );
    for probe in [&c.readiness_probe, &c.liveness_probe] {
        let get = probe.clone().and_then(|p| p.http_get).context("probe")?;
        assert_eq!(get.path.as_deref(), Some("/healthz"));
        assert_eq!(get.port, IntOrString::String("probes".into()));
    }
    let sc = c.security_context.clone().unwrap_or_default();
    assert_eq!(sc.read_only_root_filesystem, Some(true));
    assert_eq!(sc.allow_privilege_escalation, Some(false));
    // The restricted namespace admitted its pod.
    let pods = ns
        .api::<Pod>()
        .list(&ListParams::default().labels("app.kubernetes.io/instance=moo"))
        .await?;
    assert!(!pods.items.is_empty(), "the web app's pod exists");

    // The Service: NodePort, 80 -> 8080, nodePort = spec.port.
    let services: Api<Service> = ns.api();
    let svc = services.get("moo").await?;
    assert!(owned(&svc.metadata.owner_references));
    let sspec = svc.spec.clone().unwrap_or_default();
    assert_eq!(sspec.type_.as_deref(), Some("NodePort"));
    assert_eq!(
        sspec.ports.as_ref().map(Vec::len),
        Some(1),
        "the page alone"
    );
    let sport = &sspec.ports.clone().unwrap_or_default()[0];
    assert_eq!(sport.port, 80);
    assert_eq!(sport.target_port, Some(IntOrString::Int(8080)));
    assert_eq!(sport.node_port, Some(port));

    // A port change updates the Service.
    let new_port = free_node_port(&ns, "second", &[port]).await?;
    patch_spec(&ns, "moo", json!({ "port": new_port })).await?;
    let lc = wait_lolcow_ready(&ns, "moo").await?;
    let port = lc.spec.port;
    assert_ne!(port, sport.node_port.unwrap_or_default());
    assert_eq!(
        service_node_port(&services.get("moo").await?),
        Some(port),
        "the Service follows spec.port"
    );

    // Deleted children come back.
    let old_svc_uid = services.get("moo").await?.metadata.uid;
    services.delete("moo", &DeleteParams::default()).await?;
    wait_for(&services, "moo", |s: Option<&Service>| {
        s.is_some_and(|s| s.metadata.uid != old_svc_uid && service_node_port(s) == Some(port))
    })
    .await?;
    let old_dep_uid = deployments.get("moo").await?.metadata.uid;
    deployments
        .delete("moo", &DeleteParams::background())
        .await?;
    wait_for(&deployments, "moo", |d: Option<&Deployment>| {
        d.is_some_and(|d| d.metadata.uid != old_dep_uid)
    })
    .await?;
    wait_lolcow_ready(&ns, "moo").await?;

    // Edited children are reverted: replicas, greeting, and labels the watch selects on.
    kubectl_ok(["scale", "deployment/moo", "--replicas=3", "-n", &ns.name])?;
    kubectl_ok([
        "set",
        "env",
        "deployment/moo",
        "GREETING=hacked",
        "-n",
        &ns.name,
    ])?;
    kubectl_ok([
        "label",
        "service/moo",
        "app.kubernetes.io/managed-by-",
        "-n",
        &ns.name,
    ])?;
    wait_for(&deployments, "moo", |d: Option<&Deployment>| {
        d.is_some_and(|d| {
            d.spec.as_ref().and_then(|s| s.replicas) == Some(1)
                && configured_greeting(d).as_deref() == Some("Hello, cluster!")
        })
    })
    .await?;
    wait_for(&services, "moo", |s: Option<&Service>| {
        s.and_then(|s| s.metadata.labels.as_ref())
            .and_then(|l| l.get("app.kubernetes.io/managed-by"))
            .is_some_and(|v| v == OPERATOR)
    })
    .await?;
    wait_lolcow_ready(&ns, "moo").await?;

    // Deleting the Lolcow garbage-collects its children.
    ns.api::<Lolcow>()
        .delete("moo", &DeleteParams::background())
        .await?;
    wait_gone(&deployments, "moo").await?;
    wait_gone(&services, "moo").await?;
    Ok(())
}

#[tokio::test]
async fn lolcow_greeting_change_rolls_and_logs() -> Result<()> {
    let ns = TestNamespace::restricted("lolcow-greet").await?;
    let op = OperatorProcess::start(OPERATOR, &[&ns.name]).await?;
    let port = free_node_port(&ns, "greet", &[]).await?;
    create(&ns, lolcow("talker", port, Some("Hello"))).await?;
    wait_lolcow_ready(&ns, "talker").await?;
    let deployments: Api<Deployment> = ns.api();
    let before = deployments.get("talker").await?;
    assert_eq!(configured_greeting(&before).as_deref(), Some("Hello"));

    // A greeting change rolls the Deployment and is logged with the old and new values.
    patch_spec(&ns, "talker", json!({ "greeting": "Howdy" })).await?;
    let lc = wait_lolcow_ready(&ns, "talker").await?;
    assert_eq!(
        lc.status.unwrap_or_default().greeting.as_deref(),
        Some("Howdy")
    );
    let after = deployments.get("talker").await?;
    assert_eq!(configured_greeting(&after).as_deref(), Some("Howdy"));
    assert!(after.metadata.generation > before.metadata.generation);
    let log = op.log();
    let line = log
        .lines()
        .find(|l| l.contains("new greeting"))
        .with_context(|| format!("no \"new greeting\" line in the log:\n{log}"))?;
    assert!(line.contains("Hello") && line.contains("Howdy"), "{line}");
    assert!(line.contains("INFO"), "logged at info: {line}");

    // An empty greeting: a fortune, stable for the object, reported in the status.
    patch_spec(&ns, "talker", json!({ "greeting": "" })).await?;
    let lc = wait_lolcow_ready(&ns, "talker").await?;
    let fortune = fortune_for(lc.metadata.uid.as_deref().unwrap_or_default());
    assert_eq!(
        lc.status.unwrap_or_default().greeting.as_deref(),
        Some(fortune)
    );
    assert_eq!(
        configured_greeting(&deployments.get("talker").await?).as_deref(),
        Some(fortune)
    );
    Ok(())
}

#[tokio::test]
async fn lolcow_at_rest_writes_nothing() -> Result<()> {
    let ns = TestNamespace::new("lolcow-idle").await?;
    let op = OperatorProcess::start(OPERATOR, &[&ns.name]).await?;
    let port = free_node_port(&ns, "idle", &[]).await?;
    create(&ns, lolcow("idle", port, None)).await?;
    let lc = wait_lolcow_ready(&ns, "idle").await?;
    let rvs = || async {
        let d = ns.api::<Deployment>().get("idle").await?;
        let s = ns.api::<Service>().get("idle").await?;
        anyhow::Ok((d.metadata.resource_version, s.metadata.resource_version))
    };
    let before = rvs().await?;
    let log_before = op.log().lines().count();

    touch_and_wait_reconcile(&ns.api::<Lolcow>(), &op, "idle", "1", LOLCOW_RECONCILES).await?;

    let after = ns.api::<Lolcow>().get("idle").await?;
    assert_eq!(after.status, lc.status, "status must not be rewritten");
    assert_eq!(rvs().await?, before, "children must not be written");
    // Nothing logged at info about an object in sync.
    let log = op.log();
    let new_lines: Vec<&str> = log
        .lines()
        .skip(log_before)
        // (API requests are logged at debug level for the RBAC test; none is info.)
        .filter(|l| l.contains("idle") && !l.contains("\"requesting\""))
        .collect();
    assert!(new_lines.is_empty(), "{new_lines:#?}");
    Ok(())
}

#[tokio::test]
async fn lolcow_port_conflict_is_reported_once_and_recovers() -> Result<()> {
    let ns = TestNamespace::new("lolcow-conflict").await?;
    let op = OperatorProcess::start(OPERATOR, &[&ns.name]).await?;
    let services: Api<Service> = ns.api();

    // A plain NodePort Service holds port P.
    let mut taken = None;
    for attempt in 0..5 {
        let p = free_node_port(&ns, &format!("squat-{attempt}"), &[]).await?;
        let squatter: Service = serde_json::from_value(json!({
            "metadata": {"name": "squatter"},
            "spec": {"type": "NodePort", "selector": {"app": "nothing"},
                     "ports": [{"port": 80, "nodePort": p}]}
        }))?;
        match services.create(&PostParams::default(), &squatter).await {
            Ok(_) => {
                taken = Some(p);
                break;
            }
            Err(kube::Error::Api(s)) if s.code == 422 => continue, // raced another test
            Err(e) => return Err(e.into()),
        }
    }
    let taken = taken.context("could not take a NodePort")?;

    // A Lolcow on P: Ready=False, PortConflict, the API server's message, one Warning.
    // The web app itself is deployed and rolls out (then the status settles); only the
    // Service waits for a port.
    create(&ns, lolcow("late", taken, Some("Too late"))).await?;
    let api: Api<Lolcow> = ns.api();
    let lc = wait_for(&api, "late", |lc: Option<&Lolcow>| {
        lc.is_some_and(|lc| {
            current(lc)
                && ready(lc).is_some_and(|c| c.reason == "PortConflict")
                && lc.status.as_ref().and_then(|s| s.greeting.as_deref()) == Some("Too late")
        })
    })
    .await?
    .context("Lolcow vanished")?;
    let cond = ready(&lc).cloned().context("no Ready condition")?;
    assert_eq!(cond.status, "False");
    assert!(
        cond.message.contains("already allocated") && cond.message.contains("nodePort"),
        "{}",
        cond.message
    );
    assert!(services.get_opt("late").await?.is_none());

    // Over several more reconciles (each retries the Service), no more events and no
    // status writes; no hot loop (the counter moves only as much as we poke it).
    let start = reconciles(&op)?;
    for i in 0..3 {
        let value = i.to_string();
        touch_and_wait_reconcile(&api, &op, "late", &value, LOLCOW_RECONCILES).await?;
    }
    let window = reconciles(&op)? - start;
    assert!(
        window <= 10.0,
        "{window} reconciles for 3 pokes: a hot loop"
    );
    let after = api.get("late").await?;
    assert_eq!(after.status, lc.status, "status unchanged while stuck");
    let events = events_about(&ns, "late").await?;
    let warns = warnings(&events);
    assert_eq!(warns.len(), 1, "exactly one Warning event: {events:#?}");
    assert_eq!(warns[0].reason.as_deref(), Some("PortConflict"));
    assert!(
        warns[0].series.as_ref().is_none_or(|s| s.count <= 1),
        "the Warning was emitted once: {:?}",
        warns[0].series
    );

    // Fixing the port recovers.
    let fixed = free_node_port(&ns, "fixed", &[taken]).await?;
    patch_spec(&ns, "late", json!({ "port": fixed })).await?;
    let lc = wait_lolcow_ready(&ns, "late").await?;
    assert_eq!(
        service_node_port(&services.get("late").await?),
        Some(lc.spec.port)
    );
    let events = events_about(&ns, "late").await?;
    assert_eq!(warnings(&events).len(), 1, "{events:#?}");
    assert!(
        events
            .iter()
            .any(|e| e.type_.as_deref() == Some("Normal") && e.reason.as_deref() == Some("Serving")),
        "a Normal event announces Ready: {events:#?}"
    );

    // Moving back onto the taken port conflicts again; freeing it recovers without any
    // change to the Lolcow (the operator looks again with backoff).
    patch_spec(&ns, "late", json!({ "port": taken })).await?;
    wait_for(&api, "late", |lc: Option<&Lolcow>| {
        lc.is_some_and(|lc| current(lc) && ready(lc).is_some_and(|c| c.reason == "PortConflict"))
    })
    .await?;
    services
        .delete("squatter", &DeleteParams::default())
        .await?;
    wait_for_within(&api, "late", TIMEOUT * 2, |lc: Option<&Lolcow>| {
        lc.is_some_and(|lc| {
            current(lc)
                && ready(lc).is_some_and(|c| c.status == "True")
                && lc.status.as_ref().and_then(|s| s.port) == Some(taken)
        })
    })
    .await?;
    Ok(())
}

#[tokio::test]
async fn lolcow_invalid_objects_are_rejected_naming_the_field() -> Result<()> {
    let ns = TestNamespace::new("lolcow-invalid").await?;
    e2e::operator::install(OPERATOR)?;
    let cases = [
        (json!({}), "spec.port"),
        (json!({"port": 29999}), "spec.port"),
        (json!({"port": 32768}), "spec.port"),
        (json!({"port": "30080"}), "spec.port"),
        (json!({"port": 30080.5}), "spec.port"),
        (
            json!({"port": 30080, "greeting": "m".repeat(257)}),
            "spec.greeting",
        ),
        (json!({"port": 30080, "greeting": 42}), "spec.greeting"),
    ];
    assert_all_creates_rejected(&ns, &LOLCOW, named_bad(cases)).await?;
    Ok(())
}

#[tokio::test]
async fn lolcow_outside_watch_namespace_is_untouched() -> Result<()> {
    let (watched, other, _op) = watching_one(OPERATOR, "lolcow").await?;
    let ignored_port = free_node_port(&other, "ignored", &[]).await?;
    create(&other, lolcow("ignored", ignored_port, None)).await?;
    let seen_port = free_node_port(&watched, "seen", &[ignored_port]).await?;
    create(&watched, lolcow("seen", seen_port, None)).await?;
    // Once the watched one converged, the operator has been running and listening; the
    // other namespace's object must have no status and no children.
    wait_lolcow_ready(&watched, "seen").await?;
    assert_never_reconciled::<Lolcow, Deployment>(&other, "ignored").await?;
    assert!(
        other
            .api::<Service>()
            .list(&ListParams::default())
            .await?
            .items
            .is_empty()
    );

    // Least privilege: what it writes, and no Secrets.
    let sa = format!("system:serviceaccount:{OPERATOR}-system:{OPERATOR}");
    assert!(can_i(&sa, &["patch", "deployments", "-n", &watched.name])?);
    assert!(can_i(&sa, &["patch", "services", "-n", &watched.name])?);
    assert!(!can_i(&sa, &["get", "secrets", "-n", &watched.name])?);
    assert!(!can_i(&sa, &["delete", "services", "-n", &watched.name])?);
    Ok(())
}

/// The node of the local cluster that runs containers.
const REAL_NODE: &str = "real-node";
/// Its registry, as `cargo xtask cluster up` starts it.
const REGISTRY: &str = "127.0.0.1:15000";

/// Builds the lolcow-web image for this machine's platform (as `cargo xtask deploy` does),
/// pushes it to the real node's registry and returns its reference pinned by digest.
fn push_lolcow_web_image() -> Result<String> {
    let platform = match std::env::consts::ARCH {
        "aarch64" => "linux/arm64",
        _ => "linux/amd64",
    };
    let tag = "e2e";
    let out = xtask::support::cmd::cargo()
        .current_dir(repo_root())
        .args(["run", "--quiet", "-p", "xtask", "--", "image", "lolcow-web"])
        .args(["--platform", platform, "--push", REGISTRY, "--tag", tag])
        .output()
        .context("running cargo xtask image lolcow-web")?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    ensure!(
        out.status.success(),
        "cargo xtask image lolcow-web failed ({}):\n{stdout}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    // "image: lolcow-web:e2e sha256:... (...)"
    let digest = stdout
        .lines()
        .find_map(|l| l.strip_prefix(&format!("image: lolcow-web:{tag} ")))
        .and_then(|rest| rest.split_whitespace().next())
        .filter(|d| d.starts_with("sha256:"))
        .with_context(|| format!("no digest in the output of cargo xtask image:\n{stdout}"))?;
    Ok(format!("{REGISTRY}/lolcow-web:{tag}@{digest}"))
}

/// Connections the flood keeps going at once, each trickling a request head.
const FLOOD_CONNECTIONS: usize = 1100;
/// How long the flood lasts: longer than the liveness probe takes to restart a pod whose
/// probes fail (3 failures 10 s apart) and the readiness probe to mark it not ready.
const FLOOD_FOR: Duration = Duration::from_secs(45);
/// At most this many connections are opened over the whole flood.
const FLOOD_MAX_OPENS: usize = 30_000;
/// A connection's next byte of its head comes this long after the previous one.
const TRICKLE_EVERY: Duration = Duration::from_secs(2);
/// The web app's header-read timeout (its default, `Limits::PUBLIC`).
const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);

/// What the flood saw.
#[derive(Default)]
struct FloodStats {
    /// Connections opened.
    opened: AtomicUsize,
    /// Connections the server closed (refused at once, or timed out).
    closed_by_server: AtomicUsize,
    /// Connections open now that the server kept for more than one trickle period.
    held: AtomicUsize,
    /// The longest life of a connection the server closed, in milliseconds.
    longest_ms: AtomicU64,
}

/// One of the flood's connections at a time, again and again until `until`: a request head
/// trickled a byte every [`TRICKLE_EVERY`], never finished.
async fn flood_slot(addr: std::net::SocketAddr, until: Instant, stats: Arc<FloodStats>) {
    while Instant::now() < until && stats.opened.fetch_add(1, Ordering::Relaxed) < FLOOD_MAX_OPENS {
        let Ok(Ok(mut s)) =
            tokio::time::timeout(Duration::from_secs(3), TcpStream::connect(addr)).await
        else {
            tokio::time::sleep(Duration::from_secs(1)).await;
            continue;
        };
        let opened = Instant::now();
        let mut held = false;
        let closed_by_server = 'conn: {
            if s.write_all(b"GET / HTTP/1.1\r\nHost: lolcow\r\nX-Slow: ")
                .await
                .is_err()
            {
                break 'conn true;
            }
            let mut buf = [0_u8; 512];
            loop {
                tokio::select! {
                    read = s.read(&mut buf) => {
                        if matches!(read, Ok(0) | Err(_)) {
                            break 'conn true;
                        }
                    }
                    () = tokio::time::sleep(TRICKLE_EVERY) => {
                        if !held {
                            held = true;
                            stats.held.fetch_add(1, Ordering::Relaxed);
                        }
                        if s.write_all(b"a").await.is_err() {
                            break 'conn true;
                        }
                    }
                    () = tokio::time::sleep_until(until.into()) => break 'conn false,
                }
            }
        };
        let lived = opened.elapsed();
        drop(s);
        if held {
            stats.held.fetch_sub(1, Ordering::Relaxed);
        }
        if closed_by_server {
            stats.closed_by_server.fetch_add(1, Ordering::Relaxed);
            let ms = u64::try_from(lived.as_millis()).unwrap_or(u64::MAX);
            stats.longest_ms.fetch_max(ms, Ordering::Relaxed);
        }
        // A refused connection tries again later, not in a tight loop.
        if lived < Duration::from_secs(1) {
            tokio::time::sleep(Duration::from_secs(2)).await;
        }
    }
}

/// How many times the kubelet saw what event `e` reports: its series' count, or the count
/// of the core event it was recorded as.
fn times_seen(e: &Event) -> i32 {
    e.series
        .as_ref()
        .map(|s| s.count)
        .or(e.deprecated_count)
        .unwrap_or(1)
}

/// The pod's readiness and restarts: `(uid, ready, restart count)`.
fn pod_health(pod: &Pod) -> (String, bool, i32) {
    let status = pod.status.clone().unwrap_or_default();
    let ready = status
        .conditions
        .iter()
        .flatten()
        .any(|c| c.type_ == "Ready" && c.status == "True");
    let restarts = status
        .container_statuses
        .iter()
        .flatten()
        .map(|c| c.restart_count)
        .sum();
    (
        pod.metadata.uid.clone().unwrap_or_default(),
        ready,
        restarts,
    )
}

/// A one-shot pod that fetches `url` with busybox's wget (from its own pod IP: another
/// client address than this machine's) under the `restricted` Pod Security Standard.
fn wget_pod(name: &str, url: &str) -> Value {
    json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "restartPolicy": "Never",
            "automountServiceAccountToken": false,
            "securityContext": {
                "runAsNonRoot": true, "runAsUser": 65534, "runAsGroup": 65534,
                "seccompProfile": {"type": "RuntimeDefault"}
            },
            "containers": [{
                "name": "wget",
                "image": "busybox:latest",
                "imagePullPolicy": "IfNotPresent",
                // (No -T: busybox-static's wget crashes with it; the test's deadline bounds it.)
                "command": ["wget", "-q", "-O", "-", url],
                "resources": {"limits": {"cpu": "100m", "memory": "16Mi"}},
                "securityContext": {
                    "allowPrivilegeEscalation": false,
                    "readOnlyRootFilesystem": true,
                    "capabilities": {"drop": ["ALL"]}
                }
            }]
        }
    })
}

/// The peak memory of the pod's cgroup (the real node runs on this machine, cgroup v1 or
/// v2), for the log; `None` where it cannot be read.
fn pod_memory_peak(uid: &str) -> Option<u64> {
    let underscored = uid.replace('-', "_");
    let roots = [
        "/sys/fs/cgroup/memory/kubepods/burstable",
        "/sys/fs/cgroup/memory/kubepods",
        "/sys/fs/cgroup/kubepods/burstable",
        "/sys/fs/cgroup/kubepods.slice/kubepods-burstable.slice",
    ];
    let dirs = roots.iter().flat_map(|root| {
        [
            format!("{root}/pod{uid}"),
            format!("{root}/kubepods-burstable-pod{underscored}.slice"),
        ]
    });
    dirs.flat_map(|dir| ["memory.max_usage_in_bytes", "memory.peak"].map(|f| format!("{dir}/{f}")))
        .find_map(|file| std::fs::read_to_string(file).ok()?.trim().parse().ok())
}

/// The hostile client of issue 26 against the page on the real node: 1,100 connections
/// through the NodePort, each trickling a request head and never finishing it, renewed as
/// the server closes them, for longer than failing probes take to restart the pod. The
/// kubelet probes a listener of its own, so the pod stays Ready and is never restarted;
/// the server holds at most one peer's cap (64) of the flood, whose newer connections
/// displace its older idle ones after their first second; a client from this machine (the
/// same peer as the flood) still gets the page through the NodePort, and so does a client
/// from another address (a pod).
#[tokio::test(flavor = "multi_thread")]
async fn lolcow_page_flood_leaves_the_pod_ready_on_the_real_node() -> Result<()> {
    let test = "lolcow_page_flood_leaves_the_pod_ready_on_the_real_node";
    let admin = e2e::admin_client().await?;
    if Api::<Node>::all(admin.clone())
        .get_opt(REAL_NODE)
        .await?
        .is_none()
    {
        return e2e::skip(
            test,
            "needs the local cluster's real node, which `cargo xtask cluster up` starts when run as root",
        );
    }
    let image = tokio::task::spawn_blocking(push_lolcow_web_image).await??;
    let ns = TestNamespace::real("lolcow-flood").await?;
    let _op = OperatorProcess::start_with(
        OPERATOR,
        &[&ns.name],
        OperatorOptions {
            env: vec![("LOLCOW_IMAGE".into(), image)],
            ..OperatorOptions::default()
        },
    )
    .await?;
    let port = free_node_port(&ns, "flood", &[]).await?;
    create(&ns, lolcow("flood", port, Some("Still grazing"))).await?;
    let lc = wait_lolcow_ready(&ns, "flood").await?;
    let port = u16::try_from(lc.spec.port)?;
    let page = || async move {
        tokio::task::spawn_blocking(move || e2e::operator::http_get(port, "/")).await?
    };
    poll("the page on the NodePort", TIMEOUT, || async {
        Ok(page()
            .await
            .ok()
            .filter(|(code, body)| *code == 200 && body.contains("Still grazing")))
    })
    .await?;
    let pods: Api<Pod> = ns.api();
    let selector = ListParams::default().labels("app.kubernetes.io/instance=flood");
    let the_pod = || async {
        let list = pods.list(&selector).await?;
        match list.items.as_slice() {
            [pod] => Ok(pod.clone()),
            other => bail!("{} web app pods, not one", other.len()),
        }
    };
    let pod = the_pod().await?;
    let pod_name = pod.metadata.name.clone().unwrap_or_default();
    let (uid, ready, restarts) = pod_health(&pod);
    ensure!(
        ready && restarts == 0,
        "the pod is not ready before the flood"
    );
    // The other client asks the pod itself: the local cluster's kube-proxy masquerades all
    // Service traffic (masqueradeAll), so through a Service every client would share this
    // machine's address with the flood.
    let pod_ip = pod
        .status
        .and_then(|s| s.pod_ip)
        .context("the web app's pod has no IP")?;

    // The probe failures the kubelet reported before the flood: a readiness probe may run
    // before the app listens, right at the container's start; those are not the flood's.
    let unhealthy = || async {
        let events = events_where(&ns, |e| {
            e.reason.as_deref() == Some("Unhealthy")
                && e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(pod_name.as_str())
        })
        .await?;
        anyhow::Ok(events)
    };
    let before_flood: std::collections::BTreeMap<String, i32> = unhealthy()
        .await?
        .iter()
        .map(|e| (e.metadata.name.clone().unwrap_or_default(), times_seen(e)))
        .collect();

    // The flood, from this machine through the NodePort.
    let stats = Arc::new(FloodStats::default());
    let started = Instant::now();
    let until = started + FLOOD_FOR;
    let target = std::net::SocketAddr::from(([127, 0, 0, 1], port));
    let mut flood = tokio::task::JoinSet::new();
    for _ in 0..FLOOD_CONNECTIONS {
        flood.spawn(flood_slot(target, until, stats.clone()));
    }
    // Meanwhile: the pod stays Ready and is never restarted, and a client from another
    // address gets the page.
    let mut most_held = 0;
    let mut fresh_client: Option<Instant> = None;
    let mut fresh_client_done = false;
    // Page requests from this machine through the NodePort during the flood: (tried, got).
    let (mut page_tries, mut page_during_flood) = (0_u32, false);
    while Instant::now() < until {
        tokio::time::sleep(Duration::from_secs(1)).await;
        most_held = most_held.max(stats.held.load(Ordering::Relaxed));
        let (now_uid, ready, restarts) = pod_health(&the_pod().await?);
        ensure!(
            now_uid == uid && ready && restarts == 0,
            "{:?} into the flood the pod is ready={ready}, restarted {restarts} times, uid {now_uid} (was {uid})",
            started.elapsed()
        );
        if !page_during_flood && started.elapsed() > HEADER_READ_TIMEOUT {
            // The flood has been full for a while; this client is the same peer as the
            // flood, whose idle connections it displaces.
            page_tries += 1;
            page_during_flood = page()
                .await
                .is_ok_and(|(code, body)| code == 200 && body.contains("Still grazing"));
        }
        if fresh_client.is_none() && started.elapsed() > HEADER_READ_TIMEOUT {
            // The flood has been full for a while: every slot it can get is taken.
            let url = format!("http://{pod_ip}:8080/");
            create_from_json::<Pod>(&ns, wget_pod("fresh-client", &url)).await?;
            fresh_client = Some(Instant::now());
        }
        if fresh_client.is_some() && !fresh_client_done {
            let pod = pods.get("fresh-client").await?;
            match pod.status.as_ref().and_then(|s| s.phase.as_deref()) {
                Some("Succeeded") => fresh_client_done = true,
                Some("Failed") => bail!(
                    "the client pod could not get the page during the flood: {:?}\n{}",
                    pod.status
                        .as_ref()
                        .and_then(|s| s.container_statuses.clone())
                        .unwrap_or_default()
                        .first()
                        .and_then(|c| c.state.clone()),
                    kubectl_ok(["logs", "fresh-client", "-n", &ns.name]).unwrap_or_default()
                ),
                _ => {}
            }
        }
    }
    // All connections end with the flood.
    tokio::time::timeout(Duration::from_secs(15), async {
        while flood.join_next().await.is_some() {}
    })
    .await
    .context("the flood's connections did not end")?;

    let opened = stats.opened.load(Ordering::Relaxed).min(FLOOD_MAX_OPENS);
    let closed = stats.closed_by_server.load(Ordering::Relaxed);
    let longest = Duration::from_millis(stats.longest_ms.load(Ordering::Relaxed));
    let peak = pod_memory_peak(&uid);
    eprintln!(
        "flood: {opened} connections opened, {closed} closed by the server, at most {most_held} \
         held at once, longest {longest:?}; the page through the NodePort after {page_tries} \
         tries: {page_during_flood}; pod memory peak {:?} MiB",
        peak.map(|b| b / (1024 * 1024))
    );
    ensure!(
        page_during_flood,
        "this machine did not get the page through the NodePort during the flood \
         ({page_tries} tries)"
    );
    ensure!(
        fresh_client_done,
        "the client pod did not get the page during the flood"
    );
    let fetched = kubectl_ok(["logs", "fresh-client", "-n", &ns.name])?;
    ensure!(
        fetched.contains("Still grazing"),
        "the client pod got: {fetched}"
    );
    // No probe failed during the flood, not even once (the kubelet reports each failure as
    // an event, and a repeat of one by its count).
    let during: Vec<_> = unhealthy()
        .await?
        .into_iter()
        .filter(|e| {
            let name = e.metadata.name.clone().unwrap_or_default();
            before_flood
                .get(&name)
                .is_none_or(|&seen| times_seen(e) > seen)
        })
        .collect();
    ensure!(
        during.is_empty(),
        "probes failed during the flood: {:?}",
        during.iter().map(|e| &e.note).collect::<Vec<_>>()
    );
    // The server holds no more of the flood than one client address may have: the NodePort
    // masquerades every connection from this machine to the node's address. (The flood's
    // newer connections displace its older idle ones after their first second, so how
    // many are held at a time, and for how long, depends on the churn: at most is all.)
    ensure!(
        most_held <= 64,
        "{most_held} flooding connections held at once"
    );
    // After the flood: the same pod, never restarted, and the page for this machine again.
    let (now_uid, ready, restarts) = pod_health(&the_pod().await?);
    ensure!(
        now_uid == uid && ready && restarts == 0,
        "after the flood: ready={ready}, {restarts} restarts"
    );
    poll("the page after the flood", TIMEOUT, || async {
        Ok(page().await.ok().filter(|(code, _)| *code == 200))
    })
    .await?;
    Ok(())
}
