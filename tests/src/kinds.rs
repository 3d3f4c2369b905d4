//! The four kinds under test: manifests as users write them, and "is it Ready for its
//! current spec" checks shared by the tests that use several operators at once.

use crate::{
    TIMEOUT, TestNamespace, assert_create_rejected, dynamic_api, poll, wait_for_within, wait_until,
};
use anyhow::{Context, Result, ensure};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::api::{Api, ListParams, Patch, PatchParams};
use kube::core::DynamicObject;
use lolcow_operator::api::Lolcow;
use memcached_operator::api::Memcached;
use podset_operator::api::PodSet;
use pulsar_consumer_operator::api::PulsarConsumer;
use serde_json::{Value, json};
use std::collections::BTreeSet;
use std::time::Duration;

/// The four operators and their kinds: the workspace's one list (`xtask::support::operators`).
pub use xtask::support::operators::{
    Kind, LOLCOW, MEMCACHED, OPERATORS, PODSET, PULSAR_CONSUMER, by_operator,
};

/// An untyped API of a kind in a test's namespace.
pub trait KindApi {
    /// The API of this kind in `ns`.
    fn api(&self, ns: &TestNamespace) -> Api<DynamicObject>;
}

impl KindApi for Kind {
    fn api(&self, ns: &TestNamespace) -> Api<DynamicObject> {
        dynamic_api(ns, self.group, self.version, self.kind, self.plural)
    }
}

/// Creating an object of `kind` of each case's name and spec must be rejected with a
/// message naming the case's field; afterwards there is no object of `kind` in `ns`.
pub async fn assert_all_creates_rejected<'a>(
    ns: &TestNamespace,
    kind: &Kind,
    cases: impl IntoIterator<Item = (String, Value, &'a str)>,
) -> Result<()> {
    let api = kind.api(ns);
    for (name, spec, field) in cases {
        assert_create_rejected(&api, kind.manifest(&name, spec), field).await?;
    }
    let left = api.list(&ListParams::default()).await?.items;
    ensure!(left.is_empty(), "{} stored: {left:?}", kind.plural);
    Ok(())
}

/// Cases for [`assert_all_creates_rejected`] of a spec and the field its error must name,
/// the objects named `bad-0`, `bad-1`, ...
pub fn named_bad<'a>(
    cases: impl IntoIterator<Item = (Value, &'a str)>,
) -> Vec<(String, Value, &'a str)> {
    cases
        .into_iter()
        .enumerate()
        .map(|(i, (spec, field))| (format!("bad-{i}"), spec, field))
        .collect()
}

fn is_true(conditions: &[Condition], type_: &str) -> bool {
    conditions
        .iter()
        .any(|c| c.type_ == type_ && c.status == "True")
}

/// A PodSet manifest.
pub fn podset(name: &str, replicas: i64) -> Value {
    json!({
        "apiVersion": "batch.tutorial.kubebuilder.io/v1",
        "kind": "PodSet",
        "metadata": {"name": name},
        "spec": {"replicas": replicas}
    })
}

/// A Memcached manifest, as the operator-sdk tutorial writes it.
pub fn memcached(name: &str, size: i64) -> Value {
    json!({
        "apiVersion": "cache.example.com/v1alpha1",
        "kind": "Memcached",
        "metadata": {"name": name},
        "spec": {"size": size}
    })
}

/// A Lolcow manifest.
pub fn lolcow(name: &str, port: i32, greeting: &str) -> Value {
    json!({
        "apiVersion": "my.domain/v1alpha1",
        "kind": "Lolcow",
        "metadata": {"name": name},
        "spec": {"port": port, "greeting": greeting}
    })
}

/// A PulsarConsumer manifest.
pub fn pulsar_consumer(name: &str, replicas: i64) -> Value {
    json!({
        "apiVersion": "pulsar.pulsarconsumer.krvarma.com/v1",
        "kind": "PulsarConsumer",
        "metadata": {"name": name},
        "spec": {
            "serverAddress": "pulsar://localhost:6650",
            "topic": format!("{name}-topic"),
            "subscriptionName": format!("{name}-subscription"),
            "replicas": replicas,
        }
    })
}

/// Whether the PodSet reports all its replicas ready for its current generation.
pub fn podset_ready(ps: &PodSet) -> bool {
    ps.status.as_ref().is_some_and(|s| {
        s.observed_generation == ps.metadata.generation
            && s.replicas == ps.spec.replicas
            && s.ready_replicas == ps.spec.replicas
            && is_true(&s.conditions, "Ready")
    })
}

/// Whether the Memcached is Available (and Ready) with `spec.size` ready pods for its
/// current generation.
pub fn memcached_ready(mc: &Memcached) -> bool {
    mc.status.as_ref().is_some_and(|s| {
        s.observed_generation == mc.metadata.generation
            && s.replicas == mc.spec.size
            && s.ready_replicas == mc.spec.size
            && is_true(&s.conditions, "Available")
            && is_true(&s.conditions, "Ready")
    })
}

/// Whether the Lolcow is Ready and serves `spec.port` for its current generation.
pub fn lolcow_ready(lc: &Lolcow) -> bool {
    lc.status.as_ref().is_some_and(|s| {
        s.observed_generation == lc.metadata.generation
            && s.port == Some(lc.spec.port)
            && is_true(&s.conditions, "Ready")
    })
}

/// Whether the PulsarConsumer's status describes its current spec, all consumers ready.
pub fn pulsar_consumer_ready(pc: &PulsarConsumer) -> bool {
    pc.status.as_ref().is_some_and(|s| {
        s.observed_generation == pc.metadata.generation
            && s.server == pc.spec.server_address
            && s.topic == pc.spec.topic
            && s.subscription == pc.spec.subscription_name
            && s.replicas == pc.spec.replicas
            && s.current_replicas == pc.spec.replicas
            && is_true(&s.conditions, "Ready")
    })
}

/// Waits until the PodSet `name` is Ready ([`podset_ready`]) and returns it.
pub async fn wait_podset_ready(ns: &TestNamespace, name: &str) -> Result<PodSet> {
    wait_until(&ns.api(), name, podset_ready).await
}

/// Waits until the Memcached `name` is Ready ([`memcached_ready`]) and returns it.
pub async fn wait_memcached_ready(ns: &TestNamespace, name: &str) -> Result<Memcached> {
    wait_until(&ns.api(), name, memcached_ready).await
}

/// Waits until the PulsarConsumer `name` is Ready ([`pulsar_consumer_ready`]) and
/// returns it.
pub async fn wait_pulsar_consumer_ready(ns: &TestNamespace, name: &str) -> Result<PulsarConsumer> {
    wait_until(&ns.api(), name, pulsar_consumer_ready).await
}

/// Waits up to `within` until the PodSet `name` has `replicas` ready pods for its current
/// generation (whatever its conditions say).
pub async fn wait_podset_replicas_ready(
    ns: &TestNamespace,
    name: &str,
    replicas: i32,
    within: Duration,
) -> Result<()> {
    wait_for_within(
        &ns.api::<PodSet>(),
        name,
        within,
        move |ps: Option<&PodSet>| {
            ps.and_then(|p| p.status.as_ref().map(|s| (p, s)))
                .is_some_and(|(p, s)| {
                    s.ready_replicas == replicas && s.observed_generation == p.metadata.generation
                })
        },
    )
    .await?;
    Ok(())
}

fn fnv(s: &str) -> u64 {
    s.bytes().fold(0xcbf2_9ce4_8422_2325_u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// The NodePorts the Services of the whole cluster hold now.
pub async fn node_ports_in_use(ns: &TestNamespace) -> Result<BTreeSet<i32>> {
    xtask::support::node_ports::in_use(&ns.client).await
}

/// A NodePort that no Service of the cluster holds, starting from a hash of the
/// namespace's name and `salt` (so parallel tests start far apart), not one of `avoid`.
pub async fn free_node_port(ns: &TestNamespace, salt: &str, avoid: &[i32]) -> Result<i32> {
    let mut used = node_ports_in_use(ns).await?;
    used.extend(avoid);
    let span = 32767 - 30000 + 1;
    let start = i32::try_from(fnv(&format!("{}/{salt}", ns.name)) % span as u64)?;
    (0..span)
        .map(|i| 30000 + (start + i) % span)
        .find(|p| !used.contains(p))
        .context("every NodePort is taken")
}

/// Waits until the Lolcow `name` is Ready; a NodePort another test took meanwhile
/// (`PortConflict`) is not the point of the callers: it moves to a free port.
pub async fn wait_lolcow_ready(ns: &TestNamespace, name: &str) -> Result<Lolcow> {
    let api: Api<Lolcow> = ns.api();
    poll(&format!("Lolcow {name} Ready"), TIMEOUT, || async {
        let lc = api.get(name).await?;
        if lolcow_ready(&lc) {
            return Ok(Some(lc));
        }
        let current = lc
            .status
            .as_ref()
            .is_some_and(|s| s.observed_generation == lc.metadata.generation);
        let conflict = lc
            .status
            .iter()
            .flat_map(|s| &s.conditions)
            .any(|c| c.type_ == "Ready" && c.reason == "PortConflict");
        if current && conflict {
            let port = free_node_port(ns, &format!("{name}-retry"), &[lc.spec.port]).await?;
            api.patch(
                name,
                &PatchParams::default(),
                &Patch::Merge(json!({"spec": {"port": port}})),
            )
            .await?;
        }
        Ok(None)
    })
    .await
}
