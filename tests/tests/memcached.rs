//! The Memcached operator on a real cluster, run with its own ServiceAccount.

use anyhow::Result;
use e2e::kinds::{MEMCACHED, assert_all_creates_rejected, memcached};
use e2e::operator::{OperatorProcess, touch_and_wait_reconcile};
use e2e::{
    TIMEOUT, TestNamespace, assert_never_reconciled, controller_ref, create_from_json,
    kubectl_scale, poll, regards_uid, wait_events, wait_for, wait_gone, wait_until, watching_one,
};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Pod, Service};
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams};
use memcached_operator::api::Memcached;
use serde_json::{Value, json};

const OPERATOR: &str = "memcached-operator";
const FINALIZER: &str = "cache.example.com/finalizer";

async fn create(ns: &TestNamespace, manifest: Value) -> Result<Memcached> {
    create_from_json(ns, manifest).await
}

fn condition(mc: &Memcached, type_: &str) -> Option<(String, String)> {
    mc.status.as_ref().and_then(|s| {
        s.conditions
            .iter()
            .find(|c| c.type_ == type_)
            .map(|c| (c.status.clone(), c.reason.clone()))
    })
}

/// Waits until the Memcached is Available with `size` ready pods for its current
/// generation and no longer Progressing.
async fn wait_available(ns: &TestNamespace, name: &str, size: i32) -> Result<Memcached> {
    wait_until(&ns.api(), name, move |mc: &Memcached| {
        let Some(status) = &mc.status else {
            return false;
        };
        status.observed_generation == mc.metadata.generation
            && status.ready_replicas == size
            && status.replicas == size
            && status.nodes.len() == size as usize
            && condition(mc, "Available").is_some_and(|(s, _)| s == "True")
            && condition(mc, "Progressing").is_some_and(|(s, _)| s == "False")
            && condition(mc, "Degraded").is_some_and(|(s, _)| s == "False")
    })
    .await
}

/// Names of the live (not terminating) pods of the Memcached's Deployment, sorted.
async fn pod_names(ns: &TestNamespace, name: &str) -> Result<Vec<String>> {
    let pods = ns
        .api::<Pod>()
        .list(&ListParams::default().labels(&format!("app.kubernetes.io/instance={name}")))
        .await?;
    let mut names: Vec<String> = pods
        .items
        .into_iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .filter_map(|p| p.metadata.name)
        .collect();
    names.sort();
    Ok(names)
}

/// Waits until `status.nodes` names exactly the live pods, `size` of them.
async fn wait_nodes_match_pods(ns: &TestNamespace, name: &str, size: usize) -> Result<Vec<String>> {
    poll("status.nodes to match the pods", TIMEOUT, || async {
        let mc = ns.api::<Memcached>().get(name).await?;
        let nodes = mc.status.map(|s| s.nodes).unwrap_or_default();
        let pods = pod_names(ns, name).await?;
        Ok((nodes == pods && pods.len() == size).then_some(nodes))
    })
    .await
}

fn container_port(d: &Deployment) -> Option<i32> {
    d.spec.as_ref()?.template.spec.as_ref()?.containers[0]
        .ports
        .as_ref()?
        .first()
        .map(|p| p.container_port)
}

fn image(d: &Deployment) -> Option<String> {
    d.spec.as_ref()?.template.spec.as_ref()?.containers[0]
        .image
        .clone()
}

fn replicas(d: &Deployment) -> Option<i32> {
    d.spec.as_ref()?.replicas
}

fn service_port(s: &Service) -> Option<i32> {
    s.spec.as_ref()?.ports.as_ref()?.first().map(|p| p.port)
}

#[tokio::test]
async fn memcached_converges_scales_and_repairs() -> Result<()> {
    let ns = TestNamespace::restricted("memcached").await?;
    let _op = OperatorProcess::start(OPERATOR, &[&ns.name]).await?;

    // Create converges to Available, with the tutorial's manifest.
    let created = create(&ns, memcached("cache", 2)).await?;
    let uid = created.metadata.uid.clone().unwrap_or_default();
    let mc = wait_available(&ns, "cache", 2).await?;
    assert!(
        mc.metadata
            .finalizers
            .iter()
            .flatten()
            .any(|f| f == FINALIZER),
        "the finalizer is added"
    );
    let status = mc.status.clone().unwrap_or_default();
    assert_eq!(
        status.selector,
        "app.kubernetes.io/instance=cache,app.kubernetes.io/managed-by=memcached-operator,app.kubernetes.io/name=memcached"
    );
    wait_nodes_match_pods(&ns, "cache", 2).await?;

    // The Deployment and Service, as the tutorial builds them.
    let deployments: Api<Deployment> = ns.api();
    let services: Api<Service> = ns.api();
    let d = deployments.get("cache").await?;
    let owner = controller_ref(&d)
        .cloned()
        .ok_or_else(|| anyhow::anyhow!("no controller owner"))?;
    assert_eq!(
        (owner.kind.as_str(), owner.uid.as_str()),
        ("Memcached", uid.as_str())
    );
    let labels = d.metadata.labels.clone().unwrap_or_default();
    for key in [
        "app.kubernetes.io/name",
        "app.kubernetes.io/instance",
        "app.kubernetes.io/managed-by",
        "app.kubernetes.io/part-of",
    ] {
        assert!(labels.contains_key(key), "Deployment label {key}");
    }
    assert_eq!(replicas(&d), Some(2));
    assert_eq!(image(&d).as_deref(), Some("memcached:1.6.38-alpine"));
    let pod_spec = d
        .spec
        .as_ref()
        .and_then(|s| s.template.spec.clone())
        .unwrap_or_default();
    let c = &pod_spec.containers[0];
    assert_eq!(
        c.command.clone().unwrap_or_default(),
        ["memcached", "-m", "64", "-o", "modern", "-v", "-p", "11211"]
    );
    // Ready only when memcached accepts connections on the port the Service targets.
    let probe = c
        .readiness_probe
        .as_ref()
        .and_then(|p| p.tcp_socket.as_ref())
        .map(|t| t.port.clone());
    assert_eq!(
        probe,
        Some(k8s_openapi::apimachinery::pkg::util::intstr::IntOrString::String("memcached".into()))
    );
    assert_eq!(
        c.ports.as_ref().and_then(|p| p[0].name.clone()).as_deref(),
        Some("memcached")
    );
    assert_eq!(container_port(&d), Some(11211));
    assert_eq!(
        pod_spec.security_context.and_then(|s| s.run_as_user),
        Some(1001)
    );
    let svc = services.get("cache").await?;
    assert_eq!(service_port(&svc), Some(11211));
    assert_eq!(
        svc.spec.as_ref().and_then(|s| s.selector.clone()),
        d.spec
            .as_ref()
            .and_then(|s| s.selector.match_labels.clone())
    );

    // `kubectl scale` works through the scale subresource; status.nodes follows the pods.
    kubectl_scale(&ns, "memcached", "cache", 3)?;
    wait_available(&ns, "cache", 3).await?;
    wait_nodes_match_pods(&ns, "cache", 3).await?;
    kubectl_scale(&ns, "memcached", "cache", 1)?;
    wait_available(&ns, "cache", 1).await?;
    wait_nodes_match_pods(&ns, "cache", 1).await?;
    assert_eq!(replicas(&deployments.get("cache").await?), Some(1));

    // A spec change converges: the port moves on the pods and the Service.
    ns.api::<Memcached>()
        .patch(
            "cache",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"containerPort": 12345}})),
        )
        .await?;
    wait_for(&deployments, "cache", |d: Option<&Deployment>| {
        d.is_some_and(|d| {
            container_port(d) == Some(12345)
                && d.spec
                    .as_ref()
                    .and_then(|s| s.template.spec.as_ref())
                    .and_then(|p| p.containers[0].command.as_ref())
                    .is_some_and(|c| c.ends_with(&["-p".to_owned(), "12345".to_owned()]))
        })
    })
    .await?;
    wait_for(&services, "cache", |s: Option<&Service>| {
        s.is_some_and(|s| service_port(s) == Some(12345))
    })
    .await?;
    wait_available(&ns, "cache", 1).await?;

    // Editing the Deployment by hand (replicas, image) is reverted.
    deployments
        .patch(
            "cache",
            &PatchParams::apply("e2e-editor").force(),
            &Patch::Apply(json!({
                "apiVersion": "apps/v1", "kind": "Deployment",
                "metadata": {"name": "cache"},
                "spec": {"replicas": 4, "template": {"spec": {"containers": [
                    {"name": "memcached", "image": "busybox:1.37"}
                ]}}}
            })),
        )
        .await?;
    wait_for(&deployments, "cache", |d: Option<&Deployment>| {
        d.is_some_and(|d| {
            replicas(d) == Some(1) && image(d).as_deref() == Some("memcached:1.6.38-alpine")
        })
    })
    .await?;
    deployments
        .patch(
            "cache",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"replicas": 5}})),
        )
        .await?;
    wait_for(&deployments, "cache", |d: Option<&Deployment>| {
        d.is_some_and(|d| replicas(d) == Some(1))
    })
    .await?;

    // Deleted children come back (as new objects).
    let old_deployment = deployments.get("cache").await?.metadata.uid;
    deployments
        .delete("cache", &DeleteParams::background())
        .await?;
    wait_for(&deployments, "cache", move |d: Option<&Deployment>| {
        d.is_some_and(|d| {
            d.metadata.uid != old_deployment && d.metadata.deletion_timestamp.is_none()
        })
    })
    .await?;
    let old_service = services.get("cache").await?.metadata.uid;
    services.delete("cache", &DeleteParams::default()).await?;
    wait_for(&services, "cache", move |s: Option<&Service>| {
        s.is_some_and(|s| s.metadata.uid != old_service)
    })
    .await?;
    wait_available(&ns, "cache", 1).await?;
    wait_nodes_match_pods(&ns, "cache", 1).await?;
    Ok(())
}

#[tokio::test]
async fn memcached_finalizer_flow_and_garbage_collection() -> Result<()> {
    let ns = TestNamespace::restricted("memcached-fin").await?;
    let _op = OperatorProcess::start(OPERATOR, &[&ns.name]).await?;
    let created = create(&ns, memcached("gone", 1)).await?;
    let uid = created.metadata.uid.clone().unwrap_or_default();
    wait_available(&ns, "gone", 1).await?;

    let api: Api<Memcached> = ns.api();
    api.delete("gone", &DeleteParams::background()).await?;
    wait_gone(&api, "gone").await?;

    // One Normal event (a deletion the user asked for is no problem), reason Finalizing,
    // about this Memcached.
    let finalizing = wait_events(&ns, "the Finalizing event", |e| {
        regards_uid(e, &uid) && e.reason.as_deref() == Some("Finalizing")
    })
    .await?;
    assert_eq!(finalizing.len(), 1, "{finalizing:#?}");
    assert_eq!(finalizing[0].type_.as_deref(), Some("Normal"));

    // Garbage collection removes the children.
    let deployments: Api<Deployment> = ns.api();
    let services: Api<Service> = ns.api();
    wait_gone(&deployments, "gone").await?;
    wait_gone(&services, "gone").await?;
    poll("the memcached pods gone", TIMEOUT, || async {
        Ok(pod_names(&ns, "gone").await?.is_empty().then_some(()))
    })
    .await?;
    Ok(())
}

#[tokio::test]
async fn memcached_deleted_while_operator_down_completes_on_restart() -> Result<()> {
    let ns = TestNamespace::restricted("memcached-down").await?;
    let mut op = OperatorProcess::start(OPERATOR, &[&ns.name]).await?;
    create(&ns, memcached("later", 1)).await?;
    wait_available(&ns, "later", 1).await?;
    op.kill();

    let api: Api<Memcached> = ns.api();
    api.delete("later", &DeleteParams::background()).await?;
    // The finalizer holds it while no operator runs.
    let held = api.get("later").await?;
    assert!(held.metadata.deletion_timestamp.is_some());
    assert!(
        held.metadata
            .finalizers
            .iter()
            .flatten()
            .any(|f| f == FINALIZER)
    );

    let _op = OperatorProcess::start(OPERATOR, &[&ns.name]).await?;
    wait_gone(&api, "later").await?;
    wait_gone(&ns.api::<Deployment>(), "later").await?;
    Ok(())
}

#[tokio::test]
async fn memcached_at_rest_writes_nothing() -> Result<()> {
    let ns = TestNamespace::new("memcached-idle").await?;
    let op = OperatorProcess::start(OPERATOR, &[&ns.name]).await?;
    create(&ns, memcached("idle", 2)).await?;
    let mc = wait_available(&ns, "idle", 2).await?;
    wait_nodes_match_pods(&ns, "idle", 2).await?;
    let deployments: Api<Deployment> = ns.api();
    let services: Api<Service> = ns.api();
    let rv = |m: &kube::api::ObjectMeta| m.resource_version.clone().unwrap_or_default();
    let before = (
        rv(&deployments.get("idle").await?.metadata),
        rv(&services.get("idle").await?.metadata),
    );

    // Trigger a reconcile without changing the spec: touch an annotation, then wait
    // until the operator has reconciled it (its counter moves).
    touch_and_wait_reconcile(&ns.api::<Memcached>(), &op, "idle", "1", &[]).await?;

    let after = ns.api::<Memcached>().get("idle").await?;
    assert_eq!(after.status, mc.status, "status must not be rewritten");
    assert_eq!(after.metadata.finalizers, mc.metadata.finalizers);
    let after_rv = (
        rv(&deployments.get("idle").await?.metadata),
        rv(&services.get("idle").await?.metadata),
    );
    assert_eq!(before, after_rv, "children must not be written");
    Ok(())
}

#[tokio::test]
async fn memcached_invalid_objects_are_rejected_naming_the_field() -> Result<()> {
    let ns = TestNamespace::new("memcached-invalid").await?;
    e2e::operator::install(OPERATOR)?;
    let cases = [
        ("bad", json!({"size": -1}), "spec.size"),
        ("bad", json!({"size": 101}), "spec.size"),
        ("bad", json!({"size": "three"}), "spec.size"),
        ("bad", json!({}), "spec.size"),
        (
            "bad",
            json!({"size": 1, "containerPort": 0}),
            "spec.containerPort",
        ),
        (
            "bad",
            json!({"size": 1, "containerPort": 65536}),
            "spec.containerPort",
        ),
        (
            "bad",
            json!({"size": 1, "containerPort": "http"}),
            "spec.containerPort",
        ),
        ("bad.name", json!({"size": 1}), "metadata.name"),
        ("9lives", json!({"size": 1}), "metadata.name"),
    ];
    let cases = cases.map(|(name, spec, field)| (name.to_owned(), spec, field));
    assert_all_creates_rejected(&ns, &MEMCACHED, cases).await?;
    Ok(())
}

#[tokio::test]
async fn memcached_outside_watch_namespace_is_untouched() -> Result<()> {
    let (watched, other, _op) = watching_one(OPERATOR, "memcached").await?;
    create(&other, memcached("ignored", 1)).await?;
    create(&watched, memcached("seen", 1)).await?;
    // Once the watched one converged, the operator has been running and listening; the
    // other namespace's object must have no status, no finalizer and no children.
    wait_available(&watched, "seen", 1).await?;
    assert_never_reconciled::<Memcached, Deployment>(&other, "ignored").await?;
    assert!(other.api::<Service>().get_opt("ignored").await?.is_none());
    Ok(())
}
