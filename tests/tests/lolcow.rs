//! The Lolcow operator on a real cluster, run with its own ServiceAccount.
//!
//! NodePorts are cluster-wide and tests run in parallel: every test picks its ports from a
//! hash of its namespace's name, skipping ports other Services hold, and moves to another
//! port if one was taken meanwhile (except where the conflict is the point of the test).

use anyhow::{Context as _, Result};
use e2e::kinds::{
    LOLCOW, assert_all_creates_rejected, free_node_port, named_bad, wait_lolcow_ready,
};
use e2e::operator::{OperatorOptions, OperatorProcess, touch_and_wait_reconcile};
use e2e::{
    TIMEOUT, TestNamespace, assert_never_reconciled, can_i, create_from_json, events_where,
    kubectl_ok, wait_for, wait_for_within, wait_gone, watching_one,
};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Pod, Service};
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use lolcow_operator::api::Lolcow;
use lolcow_operator::desired::configured_greeting;
use lolcow_operator::desired::fortune_for;
use serde_json::{Value, json};

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
    for probe in [&c.readiness_probe, &c.liveness_probe] {
        let get = probe.clone().and_then(|p| p.http_get).context("probe")?;
        assert_eq!(get.path.as_deref(), Some("/healthz"));
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
