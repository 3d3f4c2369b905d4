//! No operator adopts what it did not create: a Service or Deployment that already holds a
//! child's name, without the custom resource's controller owner reference, stays exactly as
//! it was (same resourceVersion, same bytes, no owner reference added); the custom resource
//! reports it (`NameConflict`, naming the object) with exactly one Warning event, does not
//! spin, and converges once the stranger is deleted.

use std::time::Duration;

use anyhow::{Context, Result, ensure};
use e2e::kinds::{
    free_node_port, lolcow, memcached, pulsar_consumer, wait_lolcow_ready, wait_memcached_ready,
    wait_pulsar_consumer_ready,
};
use e2e::operator::OperatorProcess;
use e2e::{
    TIMEOUT, TestNamespace, controlled_by, create_from_json, delete_and_wait, events_where, poll,
    regards_uid, wait_until,
};
use k8s_openapi::NamespaceResourceScope;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::api::networking::v1::NetworkPolicy;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::api::{Api, PostParams};
use kube::{Resource, ResourceExt};
use lolcow_operator::api::Lolcow;
use memcached_operator::api::Memcached;
use pulsar_consumer_operator::api::PulsarConsumer;
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::json;
use std::fmt::Debug;

/// A Service nobody's operator made: ClusterIP, its own selector and port.
fn stranger_service(name: &str) -> Result<Service> {
    Ok(serde_json::from_value(json!({
        "metadata": {"name": name, "labels": {"owner": "a-user"}},
        "spec": {
            "selector": {"app": "users-own-app"},
            "ports": [{"name": "web", "port": 8000, "targetPort": 8000}]
        }
    }))?)
}

/// A Deployment nobody's operator made.
fn stranger_deployment(name: &str) -> Result<Deployment> {
    Ok(serde_json::from_value(json!({
        "metadata": {"name": name, "labels": {"owner": "a-user"}},
        "spec": {
            "replicas": 0,
            "selector": {"matchLabels": {"app": "users-own-app"}},
            "template": {
                "metadata": {"labels": {"app": "users-own-app"}},
                "spec": {"containers": [{"name": "c", "image": "busybox:1.37"}]}
            }
        }
    }))?)
}

/// A NetworkPolicy nobody's operator made.
fn stranger_network_policy(name: &str) -> Result<NetworkPolicy> {
    Ok(serde_json::from_value(json!({
        "metadata": {"name": name, "labels": {"owner": "a-user"}},
        "spec": {
            "podSelector": {"matchLabels": {"app": "users-own-app"}},
            "policyTypes": ["Ingress"]
        }
    }))?)
}

/// Creates `object` in `ns` and returns it as stored.
async fn create<K>(ns: &TestNamespace, object: &K) -> Result<K>
where
    K: Resource<Scope = NamespaceResourceScope> + Clone + Debug + DeserializeOwned + Serialize,
    K::DynamicType: Default,
{
    Ok(ns.api::<K>().create(&PostParams::default(), object).await?)
}

/// The condition `type_` of `conditions`.
fn condition<'a>(conditions: &'a [Condition], type_: &str) -> Option<&'a Condition> {
    conditions.iter().find(|c| c.type_ == type_)
}

/// Whether `c` reports the name conflict with `kind name`.
fn reports_conflict(c: Option<&Condition>, status: &str, kind: &str, name: &str) -> bool {
    c.is_some_and(|c| {
        c.status == status
            && c.reason == "NameConflict"
            && c.message.contains(&format!("{kind} {name} "))
    })
}

/// The Warning events about the object with `uid`, with reason `NameConflict`.
async fn conflict_warnings(ns: &TestNamespace, uid: &str) -> Result<Vec<Event>> {
    events_where(ns, |e| {
        regards_uid(e, uid)
            && e.type_.as_deref() == Some("Warning")
            && e.reason.as_deref() == Some("NameConflict")
    })
    .await
}

/// The least time over which the reconciles of a conflicting object are counted.
const HOT_LOOP_WINDOW: Duration = Duration::from_secs(5);

/// Waits for the operator to reconcile at least `n` more times (it looks at the conflict
/// again with backoff), so that the checks after it see what repeated reconciles did.
async fn wait_more_reconciles(op: &OperatorProcess, n: f64) -> Result<()> {
    let before = op.reconciles(&[])?;
    poll(
        "more reconciles of the conflicting object",
        TIMEOUT,
        || async { Ok((op.reconciles(&[])? >= before + n).then_some(())) },
    )
    .await
}

/// The stranger is exactly as created (same resourceVersion, same bytes, no owner
/// reference), there is exactly one `NameConflict` Warning about the custom resource, and
/// the operator is not in a hot loop (few reconciles over a few seconds).
async fn assert_stranger_untouched<K>(
    ns: &TestNamespace,
    op: &OperatorProcess,
    stranger: &K,
    owner_uid: &str,
) -> Result<()>
where
    K: Resource<Scope = NamespaceResourceScope> + Clone + Debug + DeserializeOwned + Serialize,
    K::DynamicType: Default,
{
    let name = stranger.name_any();
    // One Warning, once the condition is there (events are written just after the status).
    poll("the NameConflict Warning event", TIMEOUT, || async {
        Ok((!conflict_warnings(ns, owner_uid).await?.is_empty()).then_some(()))
    })
    .await?;
    // The rate is taken over at least HOT_LOOP_WINDOW: the owner's other children (its
    // Deployment rolling out, its own status) trigger a few reconciles close together,
    // which is no loop; a loop keeps going and fills any window.
    let start = op.reconciles(&[])?;
    let started = tokio::time::Instant::now();
    poll(
        "two more reconciles of the conflicting object, over the hot-loop window",
        TIMEOUT,
        || async {
            let more = op.reconciles(&[])? - start;
            Ok((more >= 2.0 && started.elapsed() >= HOT_LOOP_WINDOW).then_some(()))
        },
    )
    .await?;
    let per_second = (op.reconciles(&[])? - start) / started.elapsed().as_secs_f64();
    ensure!(
        per_second < 2.0,
        "{per_second:.1} reconciles per second while the name is taken: a hot loop"
    );
    let now = ns.api::<K>().get(&name).await?;
    // A stranger Deployment is rolled out by its own controller (the
    // controller manager), which writes its status and its revision
    // annotation: everything else must be exactly as created, and every write
    // since must be the controller manager's.
    const ROLLOUT_ANNOTATION: &str = "deployment.kubernetes.io/revision";
    let (mut before, mut after) = (serde_json::to_value(stranger)?, serde_json::to_value(&now)?);
    for v in [&mut before, &mut after] {
        if let Some(obj) = v.as_object_mut() {
            obj.remove("status");
        }
        if let Some(meta) = v["metadata"].as_object_mut() {
            if let Some(serde_json::Value::Object(annotations)) = meta.get_mut("annotations") {
                annotations.remove(ROLLOUT_ANNOTATION);
            }
            let empty = meta
                .get("annotations")
                .is_some_and(|a| a.is_null() || a.as_object().is_some_and(|o| o.is_empty()));
            if empty {
                meta.remove("annotations");
            }
        }
        if let Some(meta) = v["metadata"].as_object_mut() {
            for volatile in ["resourceVersion", "managedFields", "generation"] {
                meta.remove(volatile);
            }
        }
    }
    ensure!(
        before == after,
        "the stranger {name} changed: {before:#} -> {after:#}"
    );
    ensure!(
        now.meta().generation == stranger.meta().generation,
        "the stranger {name}'s spec was written (generation {:?} -> {:?})",
        stranger.meta().generation,
        now.meta().generation
    );
    let created: Vec<_> = stranger.meta().managed_fields.clone().unwrap_or_default();
    for entry in now.meta().managed_fields.iter().flatten() {
        ensure!(
            created.contains(entry) || entry.manager.as_deref() == Some("kube-controller-manager"),
            "the stranger {name} was written by {:?}: {entry:?}",
            entry.manager
        );
    }
    ensure!(
        now.owner_references().is_empty(),
        "an owner reference was added to {name}: {:?}",
        now.owner_references()
    );
    let warnings = conflict_warnings(ns, owner_uid).await?;
    ensure!(
        warnings.len() == 1,
        "exactly one NameConflict Warning, got {}: {warnings:#?}",
        warnings.len()
    );
    Ok(())
}

#[tokio::test]
async fn memcached_never_adopts_a_strangers_service() -> Result<()> {
    let ns = TestNamespace::restricted("adopt-mc").await?;
    let op = OperatorProcess::start("memcached-operator", &[&ns.name]).await?;
    let stranger = create(&ns, &stranger_service("cache")?).await?;
    let mc: Memcached = create_from_json(&ns, memcached("cache", 1)).await?;
    let uid = mc.uid().context("uid")?;

    // The conflict reported, and the Deployment's pod ready beside it, but not `Available`
    // nor `Ready`: the Service clients would reach is not the Memcached's
    // (`ServiceNotOwned`, naming it). From then on only the retries of the conflict
    // reconcile it, which the hot-loop check counts (the reconcile that sees the pod ready
    // may come within a second of a retry).
    let api: Api<Memcached> = ns.api();
    wait_until(&api, "cache", |mc: &Memcached| {
        mc.status.as_ref().is_some_and(|s| {
            let not_owned = |type_: &str| {
                condition(&s.conditions, type_).is_some_and(|c| {
                    c.status == "False"
                        && c.reason == "ServiceNotOwned"
                        && c.message.contains("Service cache ")
                })
            };
            reports_conflict(
                condition(&s.conditions, "Degraded"),
                "True",
                "Service",
                "cache",
            ) && s.ready_replicas == 1
                && not_owned("Available")
                && not_owned("Ready")
        })
    })
    .await?;
    assert_stranger_untouched(&ns, &op, &stranger, &uid).await?;

    // The stranger goes: the operator creates its own Service and converges.
    delete_and_wait(&ns.api::<Service>(), "cache").await?;
    wait_memcached_ready(&ns, "cache").await?;
    let svc = wait_until(&ns.api::<Service>(), "cache", |svc: &Service| {
        svc.owner_references().iter().any(|r| r.uid == uid)
    })
    .await?;
    ensure!(
        controlled_by(&svc, &uid),
        "the new Service is the Memcached's: {:?}",
        svc.owner_references()
    );
    Ok(())
}

/// The create of a Memcached's NetworkPolicy (`spec.networkPolicy`) is refused where a
/// stranger's holds the name; the name is then read (the `get` the operator's Role grants
/// for this), reported, and never written.
#[tokio::test]
async fn memcached_never_adopts_a_strangers_network_policy() -> Result<()> {
    let ns = TestNamespace::restricted("adopt-np").await?;
    let op = OperatorProcess::start("memcached-operator", &[&ns.name]).await?;
    let stranger = create(&ns, &stranger_network_policy("cache")?).await?;
    let mut manifest = memcached("cache", 1);
    manifest["spec"]["networkPolicy"] = json!({"enabled": true});
    let mc: Memcached = create_from_json(&ns, manifest).await?;
    let uid = mc.uid().context("uid")?;
    wait_until(&ns.api::<Memcached>(), "cache", |mc: &Memcached| {
        mc.status.as_ref().is_some_and(|s| {
            reports_conflict(
                condition(&s.conditions, "Degraded"),
                "True",
                "NetworkPolicy",
                "cache",
            )
        })
    })
    .await?;
    assert_stranger_untouched(&ns, &op, &stranger, &uid).await?;
    Ok(())
}

#[tokio::test]
async fn lolcow_never_adopts_a_strangers_service() -> Result<()> {
    let ns = TestNamespace::restricted("adopt-lc").await?;
    let op = OperatorProcess::start("lolcow-operator", &[&ns.name]).await?;
    let stranger = create(&ns, &stranger_service("moo")?).await?;
    let port = free_node_port(&ns, "moo", &[]).await?;
    let lc: Lolcow = create_from_json(&ns, lolcow("moo", port, "Not your Service")).await?;
    let uid = lc.uid().context("uid")?;

    let api: Api<Lolcow> = ns.api();
    wait_until(&api, "moo", |lc: &Lolcow| {
        lc.status.as_ref().is_some_and(|s| {
            reports_conflict(condition(&s.conditions, "Ready"), "False", "Service", "moo")
        })
    })
    .await?;
    assert_stranger_untouched(&ns, &op, &stranger, &uid).await?;

    // The stranger goes: the operator creates its NodePort Service (it looks again with
    // backoff, as nothing it watches announces the deletion) and serves.
    delete_and_wait(&ns.api::<Service>(), "moo").await?;
    wait_lolcow_ready(&ns, "moo").await?;
    let svc = ns.api::<Service>().get("moo").await?;
    ensure!(
        controlled_by(&svc, &uid),
        "the new Service is the Lolcow's: {:?}",
        svc.owner_references()
    );
    Ok(())
}

#[tokio::test]
async fn lolcow_never_adopts_a_strangers_deployment() -> Result<()> {
    let ns = TestNamespace::restricted("adopt-lc-dep").await?;
    let op = OperatorProcess::start("lolcow-operator", &[&ns.name]).await?;
    let stranger = create(&ns, &stranger_deployment("moo")?).await?;
    let port = free_node_port(&ns, "moo", &[]).await?;
    let lc: Lolcow = create_from_json(&ns, lolcow("moo", port, "Not your Deployment")).await?;
    let uid = lc.uid().context("uid")?;

    let api: Api<Lolcow> = ns.api();
    wait_until(&api, "moo", |lc: &Lolcow| {
        lc.status.as_ref().is_some_and(|s| {
            reports_conflict(
                condition(&s.conditions, "Ready"),
                "False",
                "Deployment",
                "moo",
            )
        })
    })
    .await?;
    assert_stranger_untouched(&ns, &op, &stranger, &uid).await?;

    delete_and_wait(&ns.api::<Deployment>(), "moo").await?;
    wait_lolcow_ready(&ns, "moo").await?;
    Ok(())
}

#[tokio::test]
async fn pulsar_consumer_never_adopts_a_strangers_deployment() -> Result<()> {
    let ns = TestNamespace::restricted("adopt-pc").await?;
    let op = OperatorProcess::start("pulsar-consumer-operator", &[&ns.name]).await?;
    let stranger = create(&ns, &stranger_deployment("orders-deployment")?).await?;
    let pc: PulsarConsumer = create_from_json(&ns, pulsar_consumer("orders", 1)).await?;
    let uid = pc.uid().context("uid")?;

    let api: Api<PulsarConsumer> = ns.api();
    wait_until(&api, "orders", |pc: &PulsarConsumer| {
        pc.status.as_ref().is_some_and(|s| {
            reports_conflict(
                condition(&s.conditions, "Ready"),
                "False",
                "Deployment",
                "orders-deployment",
            )
        })
    })
    .await?;
    assert_stranger_untouched(&ns, &op, &stranger, &uid).await?;

    delete_and_wait(&ns.api::<Deployment>(), "orders-deployment").await?;
    wait_pulsar_consumer_ready(&ns, "orders").await?;
    let d = ns.api::<Deployment>().get("orders-deployment").await?;
    ensure!(
        controlled_by(&d, &uid),
        "the new Deployment is the PulsarConsumer's: {:?}",
        d.owner_references()
    );
    Ok(())
}

/// The Deployment and Service of a deleted Memcached, still there when a new Memcached of
/// the same name arrives (a finalizer holds them) and out of the operator's watch (their
/// managed-by label was removed): their deletion announces nothing, and the new Memcached
/// still converges once they are gone, because a leftover is looked at again
/// (`shared::ownership::LEFTOVER_RECHECK`).
#[tokio::test]
async fn memcached_converges_after_unlabelled_leftovers_go() -> Result<()> {
    let ns = TestNamespace::new("leftover").await?;
    let op = OperatorProcess::start("memcached-operator", &[&ns.name]).await?;
    // No pods: their events would trigger reconciles of their own.
    create_from_json::<Memcached>(&ns, memcached("mc", 0)).await?;
    wait_memcached_ready(&ns, "mc").await?;
    let deployments: Api<Deployment> = ns.api();
    let services: Api<Service> = ns.api();
    let hold = json!({"metadata": {"finalizers": ["e2e.rust-operators.dev/hold"]}});
    let unlabel = json!({"metadata": {"labels": {"app.kubernetes.io/managed-by": null}}});
    let release = json!({"metadata": {"finalizers": null}});
    let merge = |patch: &serde_json::Value| kube::api::Patch::Merge(patch.clone());
    let params = kube::api::PatchParams::default();
    deployments.patch("mc", &params, &merge(&hold)).await?;
    services.patch("mc", &params, &merge(&hold)).await?;
    let memcacheds: Api<Memcached> = ns.api();
    let old = memcacheds.get("mc").await?;
    delete_and_wait(&memcacheds, "mc").await?;
    // Garbage collection marks the old children deleted; the finalizer keeps them. Only
    // now are their labels removed (while their Memcached lived, the operator put them back).
    wait_until(&deployments, "mc", |d: &Deployment| {
        d.meta().deletion_timestamp.is_some()
    })
    .await?;
    wait_until(&services, "mc", |s: &Service| {
        s.meta().deletion_timestamp.is_some()
    })
    .await?;
    deployments.patch("mc", &params, &merge(&unlabel)).await?;
    services.patch("mc", &params, &merge(&unlabel)).await?;
    let new = create_from_json::<Memcached>(&ns, memcached("mc", 0)).await?;
    ensure!(new.uid() != old.uid(), "the new Memcached has the old UID");
    // The operator has looked at the new Memcached while the leftovers were there.
    wait_until(&memcacheds, "mc", |mc: &Memcached| {
        mc.status
            .as_ref()
            .is_some_and(|s| s.observed_generation == mc.metadata.generation)
    })
    .await?;
    let new_uid = new.uid().unwrap_or_default();
    ensure!(
        !controlled_by(&deployments.get("mc").await?, &new_uid),
        "the leftover Deployment was adopted"
    );
    // Nothing it watches will announce the leftovers' deletion: it keeps looking.
    wait_more_reconciles(&op, 2.0).await?;
    deployments.patch("mc", &params, &merge(&release)).await?;
    services.patch("mc", &params, &merge(&release)).await?;
    wait_memcached_ready(&ns, "mc").await?;
    ensure!(
        controlled_by(&deployments.get("mc").await?, &new_uid)
            && controlled_by(&services.get("mc").await?, &new_uid),
        "the new children are not the new Memcached's"
    );
    Ok(())
}
