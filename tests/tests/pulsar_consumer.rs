//! The PulsarConsumer operator on a real cluster, run with its own ServiceAccount.
//!
//! Pods are simulated (kwok): the consumers never connect to a broker, the tests check what
//! the API server stores (the Deployment, its pods, the custom resource's status).

use anyhow::{Context, Result};
use e2e::kinds::wait_pulsar_consumer_ready;
use e2e::operator::{OperatorProcess, metric_sum, touch_and_wait_reconcile};
use e2e::{
    TIMEOUT, TestNamespace, assert_never_reconciled, controller_ref, create_from_json, dynamic_api,
    kubectl_ok, kubectl_scale, poll, repo_root, target_dir, wait_events, wait_for, wait_gone,
    watching_one,
};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::core::DynamicObject;
use pulsar_consumer_operator::api::PulsarConsumer;
use serde_json::{Value, json};
use std::collections::BTreeMap;

const OPERATOR: &str = "pulsar-consumer-operator";
const GROUP: &str = "pulsar.pulsarconsumer.krvarma.com";
const API_VERSION: &str = "pulsar.pulsarconsumer.krvarma.com/v1";
const CONTAINER: &str = "pulsarconsumer";

fn spec(server: &str, topic: &str, subscription: &str, replicas: i64) -> Value {
    json!({
        "serverAddress": server,
        "topic": topic,
        "subscriptionName": subscription,
        "replicas": replicas,
    })
}

fn consumer(name: &str, spec: Value) -> Value {
    json!({
        "apiVersion": API_VERSION,
        "kind": "PulsarConsumer",
        "metadata": {"name": name, "labels": {"app": "pulsarconsumer"}},
        "spec": spec,
    })
}

fn sample_spec(replicas: i64) -> Value {
    spec(
        "pulsar://localhost:6650",
        "my-topic",
        "first-subscription",
        replicas,
    )
}

async fn create(ns: &TestNamespace, manifest: Value) -> Result<PulsarConsumer> {
    create_from_json(ns, manifest).await
}

fn deployment_name(name: &str) -> String {
    format!("{name}-deployment")
}

fn env_of(d: &Deployment) -> BTreeMap<String, String> {
    d.spec
        .as_ref()
        .and_then(|s| s.template.spec.as_ref())
        .and_then(|s| s.containers.iter().find(|c| c.name == CONTAINER))
        .and_then(|c| c.env.clone())
        .unwrap_or_default()
        .into_iter()
        .map(|e| (e.name, e.value.unwrap_or_default()))
        .collect()
}

fn expected_env(server: &str, topic: &str, subscription: &str) -> BTreeMap<String, String> {
    BTreeMap::from([
        ("PULSAR_SERVER".to_owned(), server.to_owned()),
        ("PULSAR_TOPIC".to_owned(), topic.to_owned()),
        (
            "PULSAR_SUBSCRIPTION_NAME".to_owned(),
            subscription.to_owned(),
        ),
    ])
}

fn selector_of(d: &Deployment) -> BTreeMap<String, String> {
    d.spec
        .as_ref()
        .and_then(|s| s.selector.match_labels.clone())
        .unwrap_or_default()
}

fn replicas_of(d: &Deployment) -> Option<i32> {
    d.spec.as_ref().and_then(|s| s.replicas)
}

/// Polls until the Deployment `name` satisfies `check`.
async fn wait_deployment(
    ns: &TestNamespace,
    name: &str,
    what: &str,
    check: impl Fn(&Deployment) -> bool,
) -> Result<Deployment> {
    let api: Api<Deployment> = ns.api();
    let check = &check;
    poll(what, TIMEOUT, || async {
        Ok(api.get_opt(name).await?.filter(|d| check(d)))
    })
    .await
}

/// The operator's reconcile counter (`controller_runtime_reconcile_total`).
fn reconciles(op: &OperatorProcess) -> Result<f64> {
    op.reconciles(&[])
}

/// Waits for at least one more reconcile than `before`.
async fn wait_reconciled(op: &OperatorProcess, before: f64) -> Result<()> {
    poll("a reconcile", TIMEOUT, || async {
        Ok((reconciles(op)? > before).then_some(()))
    })
    .await
}

fn reconcile_errors(op: &OperatorProcess) -> Result<f64> {
    Ok(metric_sum(
        &op.metrics()?,
        "controller_runtime_reconcile_errors_total",
        &[],
    ))
}

#[tokio::test]
async fn pulsar_consumer_converges_updates_and_repairs() -> Result<()> {
    let ns = TestNamespace::restricted("pulsar").await?;
    let op = OperatorProcess::start(OPERATOR, &[&ns.name]).await?;

    // Create converges to Ready, with the original operator's manifest.
    create(&ns, consumer("orders", sample_spec(2))).await?;
    let pc = wait_pulsar_consumer_ready(&ns, "orders").await?;
    let uid = pc.metadata.uid.clone().unwrap_or_default();
    let deployments: Api<Deployment> = ns.api();
    let d = deployments.get(&deployment_name("orders")).await?;
    let owner = controller_ref(&d).context("the Deployment has a controller owner")?;
    assert_eq!(owner.uid, uid);
    assert_eq!(owner.kind, "PulsarConsumer");
    let labels = d.metadata.labels.clone().unwrap_or_default();
    for (key, value) in [
        ("app.kubernetes.io/name", "pulsar-consumer"),
        ("app.kubernetes.io/instance", "orders"),
        ("app.kubernetes.io/managed-by", OPERATOR),
        ("app.kubernetes.io/part-of", "pulsar-consumer"),
    ] {
        assert_eq!(labels.get(key).map(String::as_str), Some(value), "{key}");
    }
    assert!(
        !selector_of(&d).contains_key("app"),
        "the selector must not copy the custom resource's labels: {:?}",
        selector_of(&d)
    );
    assert_eq!(
        env_of(&d),
        expected_env("pulsar://localhost:6650", "my-topic", "first-subscription")
    );
    let pod_spec = d
        .spec
        .clone()
        .and_then(|s| s.template.spec)
        .context("pod template")?;
    assert_eq!(pod_spec.automount_service_account_token, Some(false));
    let container = &pod_spec.containers[0];
    let probe = container
        .readiness_probe
        .clone()
        .and_then(|p| p.http_get)
        .context("readiness probe")?;
    assert_eq!(probe.path.as_deref(), Some("/healthz"));
    assert_eq!(
        container.ports.clone().unwrap_or_default()[0].container_port,
        8080
    );
    // The namespace enforces the restricted Pod Security Standard: the ready pods prove the
    // template meets it.
    let selector = pc.status.clone().unwrap_or_default().selector;
    let pods = ns
        .api::<Pod>()
        .list(&ListParams::default().labels(&selector))
        .await?;
    assert_eq!(pods.items.len(), 2, "status.selector selects the consumers");

    // Every spec field converges (the original compared specs by hand and missed changes).
    let new_spec = spec(
        "pulsar+ssl://broker.example:6651",
        "persistent://acme/orders/in",
        "second-subscription",
        3,
    );
    ns.api::<PulsarConsumer>()
        .patch(
            "orders",
            &PatchParams::default(),
            &Patch::Merge(json!({ "spec": new_spec })),
        )
        .await?;
    let pc = wait_pulsar_consumer_ready(&ns, "orders").await?;
    let status = pc.status.clone().unwrap_or_default();
    assert_eq!(status.server, "pulsar+ssl://broker.example:6651");
    assert_eq!(status.topic, "persistent://acme/orders/in");
    assert_eq!(status.subscription, "second-subscription");
    assert_eq!(status.replicas, 3);
    let d = deployments.get(&deployment_name("orders")).await?;
    assert_eq!(
        env_of(&d),
        expected_env(
            "pulsar+ssl://broker.example:6651",
            "persistent://acme/orders/in",
            "second-subscription"
        )
    );
    assert_eq!(replicas_of(&d), Some(3));

    // The scale subresource: `kubectl scale` works.
    kubectl_scale(&ns, "pulsarconsumer", "orders", 1)?;
    wait_pulsar_consumer_ready(&ns, "orders").await?;
    assert_eq!(
        replicas_of(&deployments.get(&deployment_name("orders")).await?),
        Some(1)
    );

    // An edited Deployment is reverted: environment, replicas, and the operator's label
    // (which takes it out of the operator's label-selected cache).
    deployments
        .patch(
            &deployment_name("orders"),
            &PatchParams::default(),
            &Patch::Strategic(json!({
                "metadata": {"labels": {"app.kubernetes.io/managed-by": "someone-else"}},
                "spec": {
                    "replicas": 4,
                    "template": {"spec": {"containers": [{
                        "name": CONTAINER,
                        "env": [{"name": "PULSAR_TOPIC", "value": "hijacked"}]
                    }]}}
                }
            })),
        )
        .await?;
    let repaired = wait_deployment(&ns, &deployment_name("orders"), "the edits reverted", |d| {
        env_of(d).get("PULSAR_TOPIC").map(String::as_str) == Some("persistent://acme/orders/in")
            && replicas_of(d) == Some(1)
            && d.metadata
                .labels
                .as_ref()
                .and_then(|l| l.get("app.kubernetes.io/managed-by"))
                .map(String::as_str)
                == Some(OPERATOR)
    })
    .await?;
    wait_pulsar_consumer_ready(&ns, "orders").await?;

    // A deleted Deployment comes back.
    let old_uid = repaired.metadata.uid.clone().unwrap_or_default();
    deployments
        .delete(&deployment_name("orders"), &DeleteParams::background())
        .await?;
    wait_deployment(
        &ns,
        &deployment_name("orders"),
        "the Deployment recreated",
        |d| {
            d.metadata.uid.as_deref() != Some(old_uid.as_str())
                && d.metadata.deletion_timestamp.is_none()
        },
    )
    .await?;
    wait_pulsar_consumer_ready(&ns, "orders").await?;
    assert_eq!(reconcile_errors(&op)?, 0.0, "log:\n{}", op.log());

    // Deleting the PulsarConsumer garbage-collects its Deployment.
    ns.api::<PulsarConsumer>()
        .delete("orders", &DeleteParams::background())
        .await?;
    wait_gone(&deployments, &deployment_name("orders")).await?;
    Ok(())
}

#[tokio::test]
async fn pulsar_consumer_relabel_keeps_converging() -> Result<()> {
    let ns = TestNamespace::restricted("pulsar-relabel").await?;
    let op = OperatorProcess::start(OPERATOR, &[&ns.name]).await?;
    create(&ns, consumer("relabel", sample_spec(1))).await?;
    wait_pulsar_consumer_ready(&ns, "relabel").await?;
    let deployments: Api<Deployment> = ns.api();
    let before = deployments.get(&deployment_name("relabel")).await?;

    // Change, add and remove the custom resource's labels (the original copied them into the
    // Deployment's immutable selector, so this broke it).
    let count = reconciles(&op)?;
    ns.api::<PulsarConsumer>()
        .patch(
            "relabel",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {"app": "renamed", "team": "payments"}}})),
        )
        .await?;
    wait_reconciled(&op, count).await?;
    let count = reconciles(&op)?;
    ns.api::<PulsarConsumer>()
        .patch(
            "relabel",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {"app": null}}})),
        )
        .await?;
    wait_reconciled(&op, count).await?;

    // Still converging: a spec change after the relabel rolls out.
    ns.api::<PulsarConsumer>()
        .patch(
            "relabel",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"replicas": 2, "topic": "other-topic"}})),
        )
        .await?;
    let pc = wait_pulsar_consumer_ready(&ns, "relabel").await?;
    assert_eq!(pc.status.unwrap_or_default().topic, "other-topic");
    let after = deployments.get(&deployment_name("relabel")).await?;
    assert_eq!(after.metadata.uid, before.metadata.uid, "not recreated");
    assert_eq!(selector_of(&after), selector_of(&before));
    assert_eq!(replicas_of(&after), Some(2));
    assert_eq!(reconcile_errors(&op)?, 0.0, "log:\n{}", op.log());
    assert!(!op.log().contains("reconcile failed"), "log:\n{}", op.log());
    Ok(())
}

#[tokio::test]
async fn pulsar_consumer_at_rest_writes_nothing() -> Result<()> {
    let ns = TestNamespace::restricted("pulsar-idle").await?;
    let op = OperatorProcess::start(OPERATOR, &[&ns.name]).await?;
    create(&ns, consumer("idle", sample_spec(2))).await?;
    let pc = wait_pulsar_consumer_ready(&ns, "idle").await?;
    // The Deployment controller finishes its own status writes (Available, then Progressing
    // with NewReplicaSetAvailable) a little after the consumers are ready.
    let d = wait_deployment(&ns, &deployment_name("idle"), "the rollout settled", |d| {
        let status = d.status.clone().unwrap_or_default();
        status.available_replicas == Some(2)
            && status.conditions.iter().flatten().any(|c| {
                c.type_ == "Progressing" && c.reason.as_deref() == Some("NewReplicaSetAvailable")
            })
    })
    .await?;

    // Trigger a reconcile without changing the spec: touch an annotation, then wait until
    // the operator has reconciled (its counter moves).
    let touched =
        touch_and_wait_reconcile(&ns.api::<PulsarConsumer>(), &op, "idle", "1", &[]).await?;

    let after = ns.api::<PulsarConsumer>().get("idle").await?;
    assert_eq!(after.status, pc.status, "status must not be rewritten");
    assert_eq!(
        after.metadata.resource_version, touched.metadata.resource_version,
        "the PulsarConsumer must not be written"
    );
    let d_after = ns.api::<Deployment>().get(&deployment_name("idle")).await?;
    assert_eq!(
        d_after.metadata.resource_version, d.metadata.resource_version,
        "the Deployment must not be written"
    );
    Ok(())
}

#[tokio::test]
async fn pulsar_consumer_invalid_objects_are_rejected_naming_the_field() -> Result<()> {
    let ns = TestNamespace::new("pulsar-invalid").await?;
    let api: Api<DynamicObject> =
        dynamic_api(&ns, GROUP, "v1", "PulsarConsumer", "pulsarconsumers");
    e2e::operator::install(OPERATOR)?;
    let good = sample_spec(1);
    let with = |field: &str, value: Value| {
        let mut s = good.clone();
        s[field] = value;
        s
    };
    let without = |field: &str| {
        let mut s = good.clone();
        if let Some(o) = s.as_object_mut() {
            o.remove(field);
        }
        s
    };
    let cases = [
        (
            with("serverAddress", json!("http://x:1")),
            "spec.serverAddress",
        ),
        (
            with("serverAddress", json!("pulsar://localhost")),
            "spec.serverAddress",
        ),
        (
            with(
                "serverAddress",
                json!(format!("pulsar://{}:6650", "a".repeat(300))),
            ),
            "spec.serverAddress",
        ),
        (without("serverAddress"), "spec.serverAddress"),
        (with("topic", json!("")), "spec.topic"),
        (
            with("topic", json!("persistent://only-tenant")),
            "spec.topic",
        ),
        (with("topic", json!("t".repeat(513))), "spec.topic"),
        (without("topic"), "spec.topic"),
        (with("subscriptionName", json!("")), "spec.subscriptionName"),
        (
            with("subscriptionName", json!("s".repeat(257))),
            "spec.subscriptionName",
        ),
        (with("replicas", json!(-1)), "spec.replicas"),
        (with("replicas", json!(1001)), "spec.replicas"),
        (with("replicas", json!("one")), "spec.replicas"),
        (without("replicas"), "spec.replicas"),
    ];
    for (i, (spec, field)) in cases.into_iter().enumerate() {
        e2e::assert_create_rejected(&api, consumer(&format!("bad-{i}"), spec), field).await?;
    }

    // A name too long for the consumers' instance label.
    let long: DynamicObject = serde_json::from_value(consumer(&"n".repeat(64), good.clone()))?;
    let message = api
        .create(&PostParams::default(), &long)
        .await
        .expect_err("a 64-character name must be rejected")
        .to_string();
    assert!(message.contains("metadata.name"), "{message}");

    // An unknown field, under strict field validation: with kubectl...
    let mut unknown = consumer("unknown-field", good.clone());
    unknown["spec"]["bogus"] = json!(true);
    let dir = target_dir().join("e2e");
    std::fs::create_dir_all(&dir)?;
    let file = dir.join(format!("{}-unknown-field.json", ns.name));
    std::fs::write(&file, serde_json::to_string(&unknown)?)?;
    let message = kubectl_ok([
        "apply".as_ref(),
        "--validate=strict".as_ref(),
        "-n".as_ref(),
        ns.name.as_ref(),
        "-f".as_ref(),
        file.as_os_str(),
    ])
    .expect_err("an unknown field must be rejected")
    .to_string();
    let _ = std::fs::remove_file(&file);
    assert!(message.contains("spec.bogus"), "{message}");
    // ...and with a server-side apply asking for strict validation.
    let message = api
        .patch(
            "unknown-field",
            &PatchParams::apply("e2e").validation_strict(),
            &Patch::Apply(&unknown),
        )
        .await
        .expect_err("an unknown field must be rejected")
        .to_string();
    assert!(message.contains("spec.bogus"), "{message}");

    assert!(api.list(&ListParams::default()).await?.items.is_empty());
    Ok(())
}

#[tokio::test]
async fn pulsar_consumer_outside_watch_namespace_is_untouched() -> Result<()> {
    let (watched, other, _op) = watching_one(OPERATOR, "pulsar").await?;
    create(&other, consumer("ignored", sample_spec(1))).await?;
    create(&watched, consumer("seen", sample_spec(1))).await?;
    // Once the watched one converged, the operator has been running and listening; the
    // other namespace's object must have no status and no Deployment.
    wait_pulsar_consumer_ready(&watched, "seen").await?;
    assert_never_reconciled::<PulsarConsumer, Deployment>(&other, "ignored").await?;
    Ok(())
}

#[tokio::test]
async fn pulsar_consumer_sample_converges_and_prints_its_columns() -> Result<()> {
    let ns = TestNamespace::restricted("pulsar-sample").await?;
    let _op = OperatorProcess::start(OPERATOR, &[&ns.name]).await?;
    let sample = repo_root()
        .join("deploy")
        .join(OPERATOR)
        .join("samples")
        .join("pulsarconsumer.yaml");
    kubectl_ok([
        "apply".as_ref(),
        "-n".as_ref(),
        ns.name.as_ref(),
        "-f".as_ref(),
        sample.as_os_str(),
    ])?;
    wait_pulsar_consumer_ready(&ns, "pulsarconsumer-sample-1").await?;
    let table = kubectl_ok(["get", "pulsarconsumers", "-n", &ns.name])?;
    let mut lines = table.lines();
    let header: Vec<&str> = lines
        .next()
        .unwrap_or_default()
        .split_whitespace()
        .collect();
    assert_eq!(
        header,
        [
            "NAME",
            "SERVER",
            "TOPIC",
            "SUBSCRIPTION",
            "REPLICAS",
            "READY",
            "AGE"
        ],
        "{table}"
    );
    let row: Vec<&str> = lines
        .next()
        .unwrap_or_default()
        .split_whitespace()
        .collect();
    assert_eq!(
        row.get(..6),
        Some(
            &[
                "pulsarconsumer-sample-1",
                "pulsar://localhost:6650",
                "my-topic",
                "first-subscription",
                "1",
                "True"
            ][..]
        ),
        "{table}"
    );
    // The short name and the shared category list it too.
    for resource in ["pcon", "rust-operators"] {
        let out = kubectl_ok(["get", resource, "-n", &ns.name, "-o", "name"])?;
        assert!(out.contains("pulsarconsumer-sample-1"), "{resource}: {out}");
    }
    Ok(())
}

#[tokio::test]
async fn pulsar_consumer_name_taken_by_another_deployment_is_reported() -> Result<()> {
    let ns = TestNamespace::restricted("pulsar-taken").await?;
    let _op = OperatorProcess::start(OPERATOR, &[&ns.name]).await?;
    // Someone else's Deployment already has the name the operator wants.
    let foreign: Deployment = serde_json::from_value(json!({
        "metadata": {"name": deployment_name("taken")},
        "spec": {
            "replicas": 0,
            "selector": {"matchLabels": {"app": "foreign"}},
            "template": {
                "metadata": {"labels": {"app": "foreign"}},
                "spec": {"containers": [{"name": "c", "image": "busybox"}]}
            }
        }
    }))?;
    ns.api::<Deployment>()
        .create(&PostParams::default(), &foreign)
        .await?;
    create(&ns, consumer("taken", sample_spec(1))).await?;
    let api: Api<PulsarConsumer> = ns.api();
    wait_for(&api, "taken", |pc: Option<&PulsarConsumer>| {
        pc.and_then(|pc| pc.status.as_ref()).is_some_and(|s| {
            s.conditions
                .iter()
                .any(|c| c.type_ == "Ready" && c.status == "False" && c.reason == "NameConflict")
        })
    })
    .await?;
    let warnings = wait_events(&ns, "a Warning event", |e| {
        e.type_.as_deref() == Some("Warning")
            && e.reason.as_deref() == Some("NameConflict")
            && e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some("taken")
    })
    .await?;
    assert_eq!(warnings.len(), 1, "one Warning event: {warnings:#?}");
    // The foreign Deployment is left as it was.
    let d = ns
        .api::<Deployment>()
        .get(&deployment_name("taken"))
        .await?;
    assert_eq!(
        selector_of(&d),
        BTreeMap::from([("app".to_owned(), "foreign".to_owned())])
    );
    Ok(())
}
