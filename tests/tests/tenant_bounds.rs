//! One tenant cannot fill an operator's memory or its work queue: the four operators,
//! deployed from their images with their real limits on the real node (watching the
//! tenants' namespaces only, so that other tests' namespaces stay their own), while tenant `a`
//! (only the built-in `edit` role in its namespaces) fills them with large objects and
//! bursts, and tenant `b` creates one object of each kind, once with nobody else at work
//! and once right after `a`'s burst.
//!
//! Tenant `a`:
//! - big objects of every kind: [`BIG`] of each, about 1.2 MB each (9,000 labels); parsed
//!   whole (a map of 9,000 labels takes about 2.5 times its text), a cache keeping them
//!   would hold about 90 MiB of each;
//! - objects labelled as each operator's children that no operator controls, about 1 MB
//!   each: Deployments (a 1 MB environment variable), Services and pods (1 MB of labels);
//! - then a burst on the simulated nodes: [`BURST_PODSETS`] PodSets of [`BURST_REPLICAS`]
//!   pods and [`BURST_MEMCACHEDS`] Memcacheds of 3.
//!
//! Asserted: no operator container restarts; each operator's peak memory (its memory
//! cgroup's) stays at most [`PEAK_LIMIT`]; `b`'s objects are all reconciled (children
//! written, status for their generation) under the burst within twice their quiet time
//! plus a second. Their time to Ready is reported too: it also waits for the cluster's
//! scheduler and kubelets, which all tenants share and no operator orders. The figures go to
//! `target/e2e/tenant-bounds.json` and are printed.

use std::collections::BTreeMap;
use std::fmt::Debug;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, ensure};
use e2e::deployed::{Deployed, NO_REAL_NODE, container_peak_memory, has_real_node, restarts};
use e2e::kinds::{
    OPERATORS, free_node_port, lolcow_ready, memcached_ready, podset_ready, pulsar_consumer_ready,
};
use e2e::{TestNamespace, target_dir};
use futures::{StreamExt, TryFutureExt, TryStreamExt};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ConfigMap, Pod, Service};
use kube::api::{Api, ListParams, Patch, PatchParams};
use kube::{Client, Resource, ResourceExt};
use lolcow_operator::api::Lolcow;
use memcached_operator::api::Memcached;
use podset_operator::api::PodSet;
use pulsar_consumer_operator::api::PulsarConsumer;
use serde::de::DeserializeOwned;
use serde_json::{Map, Value, json};

/// Big objects of each kind, and labelled strangers of each child kind.
const BIG: usize = 30;
/// Labels on a big object (about 133 bytes each: about 1.2 MB).
const BIG_LABELS: usize = 9_000;
/// Labels on a labelled stranger (about 1 MB).
const STRANGER_LABELS: usize = 7_500;
/// The burst.
const BURST_PODSETS: usize = 100;
const BURST_REPLICAS: i64 = 50;
const BURST_MEMCACHEDS: usize = 300;
/// Each operator's peak memory under the whole attack, at most.
const PEAK_LIMIT: u64 = 32 * 1024 * 1024;
/// How long any one wait may take.
const DEADLINE: Duration = Duration::from_secs(600);

/// `n` labels of about 133 bytes each.
fn labels(n: usize, extra: &[(&str, &str)]) -> Map<String, Value> {
    let mut labels: Map<String, Value> = (0..n)
        .map(|i| {
            (
                format!("tenant-a.example.com/label-{i:05}-{}", "k".repeat(40)),
                Value::String("v".repeat(63)),
            )
        })
        .collect();
    for (k, v) in extra {
        labels.insert((*k).to_owned(), json!(v));
    }
    labels
}

/// `manifest` with [`BIG_LABELS`] labels.
fn big(mut manifest: Value) -> Value {
    manifest["metadata"]["labels"] = Value::Object(labels(BIG_LABELS, &[]));
    manifest
}

/// Polls `ns` until `ready` holds for the `K` named `name`; returns how long it took.
async fn ready_after<K>(
    admin: &Client,
    ns: &str,
    name: &str,
    ready: impl Fn(&K) -> bool + Send + Sync + 'static,
    since: Instant,
) -> Result<f64>
where
    K: Resource<Scope = k8s_openapi::NamespaceResourceScope, DynamicType = ()>
        + Clone
        + Debug
        + DeserializeOwned
        + Send
        + Sync
        + 'static,
{
    let api: Api<K> = Api::namespaced(admin.clone(), ns);
    e2e::wait_for_within(&api, name, DEADLINE, move |o: Option<&K>| {
        o.is_some_and(&ready)
    })
    .await?;
    Ok(since.elapsed().as_secs_f64())
}

/// When tenant `b`'s objects were reconciled (children written, status for their
/// generation) and Ready, each in seconds after its own create returned; and what the API
/// server took meanwhile for one reconcile's worth of round trips by a service account.
#[derive(Debug, Clone, Default, serde::Serialize)]
struct Times {
    reconciled: BTreeMap<&'static str, f64>,
    ready: BTreeMap<&'static str, f64>,
    /// The median of [`probe`]'s rounds while `b` waited for its objects to be reconciled.
    api_round_s: f64,
}

impl Times {
    fn all_reconciled(&self) -> f64 {
        self.reconciled.values().copied().fold(0.0, f64::max)
    }
    fn all_ready(&self) -> f64 {
        self.ready.values().copied().fold(0.0, f64::max)
    }
}

/// Round trips in one round of [`probe`]: as many as the longest of `b`'s reconciles waits
/// for in a row (a new Memcached: its watch event, the finalizer, a read and a write of
/// each of its two children, its status).
const PROBE_WRITES: usize = 7;

/// A client acting as the ServiceAccount `e2e-probe` of `ns`, bound to `edit` there: the API
/// server classifies its requests as it does the operators' (Priority and Fairness's
/// `service-accounts` flows), so that what it waits for is what any operator waits for.
async fn probe_client(admin: &Client, ns: &str) -> Result<Client> {
    let sa = "e2e-probe";
    e2e::create_as::<k8s_openapi::api::core::v1::ServiceAccount>(
        admin,
        ns,
        json!({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": sa}}),
    )
    .await?;
    e2e::create_as::<k8s_openapi::api::rbac::v1::RoleBinding>(
        admin,
        ns,
        json!({
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "RoleBinding",
            "metadata": {"name": "edit-e2e-probe"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "edit"},
            "subjects": [{"kind": "ServiceAccount", "name": sa, "namespace": ns}],
        }),
    )
    .await?;
    let kubeconfig = kube::config::Kubeconfig::read_from(e2e::kubeconfig_path()?)?;
    let mut config = kube::Config::from_custom_kubeconfig(
        kubeconfig,
        &kube::config::KubeConfigOptions::default(),
    )
    .await?;
    config.auth_info.impersonate = Some(format!("system:serviceaccount:{ns}:{sa}"));
    config.auth_info.impersonate_groups = Some(vec![
        "system:serviceaccounts".to_owned(),
        format!("system:serviceaccounts:{ns}"),
        "system:authenticated".to_owned(),
    ]);
    Ok(Client::try_from(config)?)
}

/// What the API server takes, at this moment, for one reconcile's worth of round trips by
/// a service account that no operator's queue stands in front of: [`probe_client`] applies
/// a ConfigMap [`PROBE_WRITES`] times in a row, in rounds until `stop` is set. The median
/// round, in seconds.
async fn probe(client: &Client, ns: &str, stop: &AtomicBool) -> Result<f64> {
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), ns);
    let name = "e2e-probe";
    let pp = PatchParams::apply("e2e-probe").force();
    let mut rounds = Vec::new();
    let mut n = 0u64;
    loop {
        let round = Instant::now();
        for _ in 0..PROBE_WRITES {
            n += 1;
            let cm = json!({
                "apiVersion": "v1", "kind": "ConfigMap",
                "metadata": {"name": name}, "data": {"n": n.to_string()},
            });
            api.patch(name, &pp, &Patch::Apply(&cm))
                .await
                .context("the probe's write")?;
        }
        rounds.push(round.elapsed().as_secs_f64());
        if stop.load(Ordering::Relaxed) {
            break;
        }
    }
    rounds.sort_by(f64::total_cmp);
    Ok(rounds[rounds.len() / 2])
}

/// Tenant `b` creates `manifest` and waits until the operator has reconciled its generation
/// (its status says so, written at the end of a reconcile, after the children): the seconds
/// after the create returned, and that moment.
async fn one<K>(
    b: &Client,
    admin: &Client,
    ns: &str,
    manifest: Value,
    observed: fn(&K) -> Option<i64>,
) -> Result<(f64, Instant)>
where
    K: Resource<Scope = k8s_openapi::NamespaceResourceScope, DynamicType = ()>
        + Clone
        + Debug
        + DeserializeOwned
        + serde::Serialize
        + Send
        + Sync
        + 'static,
{
    let created = e2e::create_as::<K>(b, ns, manifest).await?;
    let since = Instant::now();
    let reconciled = ready_after::<K>(
        admin,
        ns,
        &created.name_any(),
        move |o| {
            let seen = observed(o);
            seen.is_some() && seen == o.meta().generation
        },
        since,
    )
    .await?;
    Ok((reconciled, since))
}

/// Tenant `b` creates one object of each kind in `ns`, all at once, while [`probe`] times
/// the API server.
async fn one_of_each(admin: &Client, ns: &TestNamespace) -> Result<Times> {
    let b = e2e::tenant_client(admin, ns, "e2e-tenant-b").await?;
    let n = &ns.name;
    let port = free_node_port(ns, "tenant-b", &[]).await?;
    let prober = probe_client(admin, n).await?;
    let stop = AtomicBool::new(false);
    let reconciled = async {
        let out = tokio::try_join!(
            one::<PodSet>(&b, admin, n, e2e::kinds::podset("ps", 1), |o| {
                o.status.as_ref().and_then(|s| s.observed_generation)
            }),
            one::<Memcached>(&b, admin, n, e2e::kinds::memcached("mc", 1), |o| {
                o.status.as_ref().and_then(|s| s.observed_generation)
            }),
            one::<Lolcow>(
                &b,
                admin,
                n,
                e2e::kinds::lolcow("cow", port, "Hello from b"),
                |o| o.status.as_ref().and_then(|s| s.observed_generation)
            ),
            one::<PulsarConsumer>(&b, admin, n, e2e::kinds::pulsar_consumer("pc", 1), |o| {
                o.status.as_ref().and_then(|s| s.observed_generation)
            }),
        );
        stop.store(true, Ordering::Relaxed);
        out
    };
    let ((ps, mc, cow, pc), api_round_s) = tokio::try_join!(reconciled, probe(&prober, n, &stop))?;
    let reconciled = BTreeMap::from([
        ("PodSet", ps.0),
        ("Memcached", mc.0),
        ("Lolcow", cow.0),
        ("PulsarConsumer", pc.0),
    ]);
    let (ps, mc, cow, pc) = tokio::try_join!(
        ready_after::<PodSet>(admin, n, "ps", podset_ready, ps.1),
        ready_after::<Memcached>(admin, n, "mc", memcached_ready, mc.1),
        ready_after::<Lolcow>(admin, n, "cow", lolcow_ready, cow.1),
        ready_after::<PulsarConsumer>(admin, n, "pc", pulsar_consumer_ready, pc.1),
    )?;
    let ready = BTreeMap::from([
        ("PodSet", ps),
        ("Memcached", mc),
        ("Lolcow", cow),
        ("PulsarConsumer", pc),
    ]);
    Ok(Times {
        reconciled,
        ready,
        api_round_s,
    })
}

/// Tenant `a`'s big objects and labelled strangers, in `ns`.
async fn fill(admin: &Client, ns: &TestNamespace) -> Result<()> {
    let a = e2e::tenant_client(admin, ns, "e2e-tenant-a").await?;
    let n = &ns.name;
    let mut ports = Vec::new();
    for i in 0..BIG {
        ports.push(free_node_port(ns, &format!("big-{i}"), &ports).await?);
    }
    let mut creates: Vec<futures::future::BoxFuture<'_, Result<()>>> = Vec::new();
    for (i, port) in ports.iter().enumerate() {
        let name = format!("big-{i}");
        creates.push(Box::pin(
            e2e::create_as::<PodSet>(&a, n, big(e2e::kinds::podset(&name, 0))).map_ok(drop),
        ));
        creates.push(Box::pin(
            e2e::create_as::<Memcached>(&a, n, big(e2e::kinds::memcached(&name, 0))).map_ok(drop),
        ));
        creates.push(Box::pin(
            e2e::create_as::<PulsarConsumer>(&a, n, big(e2e::kinds::pulsar_consumer(&name, 0)))
                .map_ok(drop),
        ));
        creates.push(Box::pin(
            e2e::create_as::<Lolcow>(&a, n, big(e2e::kinds::lolcow(&name, *port, "moo")))
                .map_ok(drop),
        ));
    }
    for operator in OPERATORS {
        for i in 0..BIG {
            creates.push(Box::pin(stranger(&a, n, operator, i)));
        }
    }
    // A few at a time: each is about a megabyte for the API server to decode and store.
    futures::stream::iter(creates)
        .buffer_unordered(4)
        .try_collect::<Vec<()>>()
        .await?;
    Ok(())
}

/// An object labelled as `operator`'s child that no operator controls, about 1 MB: a pod
/// (1 MB of labels) for the PodSet operator, else a Deployment (a 1 MB environment
/// variable) and a Service (1 MB of labels).
async fn stranger(a: &Client, n: &str, operator: &'static str, i: usize) -> Result<()> {
    let managed = [("app.kubernetes.io/managed-by", operator)];
    let name = format!("{operator}-stranger-{i}");
    if operator == "podset-operator" {
        return e2e::create_as::<Pod>(
            a,
            n,
            json!({
                "apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": name, "labels": labels(STRANGER_LABELS, &managed)},
                "spec": {"containers": [{"name": "c", "image": "busybox"}]}
            }),
        )
        .await
        .map(drop);
    }
    e2e::create_as::<Deployment>(
        a,
        n,
        json!({
            "apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": name, "labels": {"app.kubernetes.io/managed-by": operator}},
            "spec": {
                "replicas": 0,
                "selector": {"matchLabels": {"app": name}},
                "template": {
                    "metadata": {"labels": {"app": name}},
                    "spec": {"containers": [{"name": "c", "image": "busybox",
                        "env": [{"name": "PAYLOAD", "value": "x".repeat(1_000_000)}]}]}
                }
            }
        }),
    )
    .await?;
    e2e::create_as::<Service>(
        a,
        n,
        json!({
            "apiVersion": "v1", "kind": "Service",
            "metadata": {"name": name, "labels": labels(STRANGER_LABELS, &managed)},
            "spec": {"ports": [{"port": 80}]}
        }),
    )
    .await
    .map(drop)
}

/// Tenant `a`'s burst, in `ns`: started, not waited for.
async fn burst(admin: &Client, ns: &TestNamespace) -> Result<()> {
    let a = e2e::tenant_client(admin, ns, "e2e-tenant-a").await?;
    let n = &ns.name;
    for i in 0..BURST_PODSETS {
        e2e::create_as::<PodSet>(
            &a,
            n,
            e2e::kinds::podset(&format!("burst-{i}"), BURST_REPLICAS),
        )
        .await?;
    }
    for i in 0..BURST_MEMCACHEDS {
        e2e::create_as::<Memcached>(&a, n, e2e::kinds::memcached(&format!("burst-{i}"), 3)).await?;
    }
    Ok(())
}

/// Waits until every PodSet of the burst reports all its pods ready.
async fn burst_done(admin: &Client, ns: &str) -> Result<f64> {
    let started = Instant::now();
    let api: Api<PodSet> = Api::namespaced(admin.clone(), ns);
    loop {
        let ready = api
            .list(&ListParams::default())
            .await?
            .items
            .iter()
            .filter(|ps| podset_ready(ps))
            .count();
        if ready == BURST_PODSETS {
            return Ok(started.elapsed().as_secs_f64());
        }
        ensure!(
            started.elapsed() < DEADLINE,
            "the burst's PodSets: {ready} of {BURST_PODSETS} ready after {DEADLINE:?}"
        );
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
}

/// The one running pod of each deployed operator.
async fn operator_pods(
    admin: &Client,
    deployed: &[Deployed],
) -> Result<BTreeMap<&'static str, Pod>> {
    let mut pods = BTreeMap::new();
    for d in deployed {
        let mut found = d.pods(admin).await?;
        ensure!(!found.is_empty(), "no pod of {}", d.operator);
        pods.insert(d.operator, found.remove(0));
    }
    Ok(pods)
}

#[tokio::test(flavor = "multi_thread")]
async fn slow_a_tenant_cannot_fill_an_operators_memory_or_its_queue() -> Result<()> {
    let admin = e2e::admin_client().await?;
    if !has_real_node(&admin).await? {
        return e2e::skip(
            "slow_a_tenant_cannot_fill_an_operators_memory_or_its_queue",
            NO_REAL_NODE,
        );
    }
    // The tenants' namespaces first: the operators are installed watching only them.
    let quiet_ns = TestNamespace::new("tenant-b-quiet").await?;
    let big_ns = TestNamespace::new("tenant-a-big").await?;
    let burst_ns = TestNamespace::new("tenant-a-burst").await?;
    let busy_ns = TestNamespace::new("tenant-b-busy").await?;
    let watched = [&quiet_ns, &big_ns, &burst_ns, &busy_ns].map(|ns| ns.name.as_str());
    let mut deployed = Vec::new();
    for operator in OPERATORS {
        deployed.push(Deployed::watching(operator, &watched)?);
        // A namespace-scoped install leaves the rights of people to the cluster's admin:
        // the roles aggregated into `edit` are applied as such an admin would.
        let user_rbac = e2e::repo_root()
            .join("deploy")
            .join(operator)
            .join("user-rbac");
        e2e::kubectl_ok(["apply", "--server-side", "-k", &user_rbac.to_string_lossy()])?;
    }
    let before = operator_pods(&admin, &deployed).await?;

    let quiet = one_of_each(&admin, &quiet_ns).await?;
    eprintln!("tenant b, quiet: {quiet:?}");

    let filling = Instant::now();
    fill(&admin, &big_ns).await?;
    eprintln!(
        "tenant a's big objects and strangers created in {:.1} s",
        filling.elapsed().as_secs_f64()
    );

    burst(&admin, &burst_ns).await?;
    let busy = one_of_each(&admin, &busy_ns).await?;
    eprintln!("tenant b, under the burst: {busy:?}");
    let burst_rest = burst_done(&admin, &burst_ns.name).await?;
    eprintln!("the burst's PodSets all Ready {burst_rest:.1} s after b's objects were");

    let after = operator_pods(&admin, &deployed).await?;
    let mut peaks = BTreeMap::new();
    for (operator, pod) in &after {
        let was = &before[operator];
        ensure!(
            pod.uid() == was.uid() && restarts(pod) == 0,
            "{operator} restarted under the attack ({} restarts)",
            restarts(pod)
        );
        let peak = container_peak_memory(pod)?;
        peaks.insert(*operator, peak as f64 / 1024.0 / 1024.0);
    }
    let report = json!({
        "peak_mib": peaks,
        "b_quiet": quiet, "b_under_burst": busy,
        "b_all_ready_s": {"quiet": quiet.all_ready(), "under_burst": busy.all_ready()},
        "b_all_reconciled_s": {"quiet": quiet.all_reconciled(), "under_burst": busy.all_reconciled()},
        "api_round_s": {"quiet": quiet.api_round_s, "under_burst": busy.api_round_s, "writes": PROBE_WRITES},
        "burst_rest_s": burst_rest,
        "big_objects_per_kind": BIG,
        "burst": {"podsets": BURST_PODSETS, "replicas": BURST_REPLICAS, "memcacheds": BURST_MEMCACHEDS},
    });
    let out = target_dir().join("e2e").join("tenant-bounds.json");
    std::fs::create_dir_all(out.parent().context("no parent")?)?;
    std::fs::write(&out, serde_json::to_string_pretty(&report)?)?;
    eprintln!("{}", serde_json::to_string_pretty(&report)?);
    for (operator, peak) in &peaks {
        ensure!(
            *peak <= PEAK_LIMIT as f64 / 1024.0 / 1024.0,
            "{operator} peaked at {peak:.1} MiB under the attack"
        );
    }
    // The operators' part: b's objects reconciled (children written, status for their
    // generation). Ready also waits for the cluster's scheduler and kubelets, which every
    // tenant shares and no operator orders: under the burst, b's pods queue behind a's
    // thousands there (b's four kinds, two of which have no burst of their own, were all
    // Ready within a second of each other as the burst's last pods were).
    // The API server, too, is every tenant's: what it takes longer under the burst for a
    // reconcile's worth of round trips by a service account (the probe, classified as the
    // operators are) is not the operators' queue.
    let (quiet_s, busy_s) = (quiet.all_reconciled(), busy.all_reconciled());
    let api_extra = (busy.api_round_s - quiet.api_round_s).max(0.0);
    ensure!(
        busy_s <= 2.0 * quiet_s + 1.0 + api_extra,
        "tenant b's objects were reconciled {busy_s:.2} s after creation under a's burst, \
         against {quiet_s:.2} s quiet (the API server's round of {PROBE_WRITES} writes: \
         {:.2} s under the burst, {:.2} s quiet)",
        busy.api_round_s,
        quiet.api_round_s
    );
    Ok(())
}
