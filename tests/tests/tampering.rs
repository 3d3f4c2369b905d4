//! All four operators under a minute of someone tampering with their children: pods
//! deleted, Deployments scaled and edited, Services deleted, managed labels removed, a few
//! times per second. When it stops, everything is back as specified within 10 s, and the
//! operators go idle (no hot loop).
//!
//! Slow by design (about 90 s): filter it with `slow_`.

use anyhow::{Context, Result, bail};
use e2e::kinds::{self, OPERATORS, free_node_port};
use e2e::operator::{OperatorProcess, metric_sum};
use e2e::{TIMEOUT, TestNamespace, create_from_json, live_pods_controlled_by, poll, wait_for};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Pod, Service};
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams};
use lolcow_operator::api::Lolcow;
use memcached_operator::api::Memcached;
use podset_operator::api::PodSet;
use pulsar_consumer_operator::api::PulsarConsumer;
use serde_json::{Value, json};
use std::collections::BTreeMap;
use std::time::Duration;
use tokio::time::Instant;

/// How long the tampering goes on.
const TAMPERING: Duration = Duration::from_secs(60);
/// The pause between two tampering actions (a few per second).
const PACE: Duration = Duration::from_millis(250);
/// The requirement: once the tampering stops, everything is back as specified within
/// 10 s. (kwok needs a moment to make re-created pods Ready; the Deployment and ReplicaSet
/// controllers are the real ones.)
const REPAIR_DEADLINE: Duration = Duration::from_secs(10);
/// Idle means: no reconcile at all during this long a window...
const QUIET_WINDOW: Duration = Duration::from_secs(5);
/// ...which must begin within this long after the repair (children's status updates from
/// the Deployment controller and kwok still trigger a few legitimate reconciles).
const QUIET_DEADLINE: Duration = Duration::from_secs(30);
/// The seed of the tampering; `E2E_TAMPER_SEED` replays another one.
const DEFAULT_SEED: u64 = 0x7a3d_91c4_5e0f_b268;

/// xorshift64*: deterministic, no dependency.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn below(&mut self, n: usize) -> usize {
        usize::try_from(self.next() % n as u64).unwrap_or(0)
    }

    fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[self.below(items.len())]
    }

    fn name(&mut self, names: &[&'static str]) -> &'static str {
        names[self.below(names.len())]
    }
}

const PODSETS: [&str; 2] = ["ps-0", "ps-1"];
const MEMCACHEDS: [&str; 2] = ["mc-0", "mc-1"];
const LOLCOWS: [&str; 2] = ["lc-0", "lc-1"];
const CONSUMERS: [&str; 2] = ["pc-0", "pc-1"];
/// The Deployments the operators own (Memcached, Lolcow: the object's name; PulsarConsumer:
/// `<name>-deployment`).
const DEPLOYMENTS: [&str; 6] = [
    "mc-0",
    "mc-1",
    "lc-0",
    "lc-1",
    "pc-0-deployment",
    "pc-1-deployment",
];
/// The Services the operators own.
const SERVICES: [&str; 4] = ["mc-0", "mc-1", "lc-0", "lc-1"];

fn managed_labels(meta: &kube::api::ObjectMeta) -> BTreeMap<String, String> {
    meta.labels
        .clone()
        .unwrap_or_default()
        .into_iter()
        .filter(|(k, _)| k.starts_with("app.kubernetes.io/") || k == "app" || k == "version")
        .collect()
}

/// What the operator specifies of a Deployment (and nobody else writes).
fn deployment_fingerprint(d: &Deployment) -> Value {
    let spec = d.spec.clone().unwrap_or_default();
    let pod = spec.template.spec.clone().unwrap_or_default();
    json!({
        "labels": managed_labels(&d.metadata),
        "replicas": spec.replicas,
        "selector": spec.selector,
        "templateLabels": spec.template.metadata.and_then(|m| m.labels),
        "containers": pod.containers.iter().map(|c| json!({
            "name": c.name, "image": c.image, "command": c.command, "args": c.args,
            "env": c.env, "ports": c.ports,
        })).collect::<Vec<_>>(),
    })
}

/// What the operator specifies of a Service.
fn service_fingerprint(s: &Service) -> Value {
    let spec = s.spec.clone().unwrap_or_default();
    json!({
        "labels": managed_labels(&s.metadata),
        "type": spec.type_,
        "selector": spec.selector,
        "ports": spec.ports.unwrap_or_default().iter().map(|p| json!({
            "port": p.port, "targetPort": p.target_port, "nodePort": p.node_port,
            "protocol": p.protocol, "name": p.name,
        })).collect::<Vec<_>>(),
    })
}

/// The live pods a PodSet controls, by name, with their managed labels.
async fn podset_pods(
    ns: &TestNamespace,
    uid: &str,
) -> Result<BTreeMap<String, BTreeMap<String, String>>> {
    Ok(live_pods_controlled_by(ns, uid)
        .await?
        .into_iter()
        .map(|p| {
            let labels = managed_labels(&p.metadata);
            (p.metadata.name.unwrap_or_default(), labels)
        })
        .collect())
}

/// Everything as specified: the snapshot taken when all was Ready.
#[derive(Debug, PartialEq)]
struct State {
    deployments: BTreeMap<String, Value>,
    services: BTreeMap<String, Value>,
    /// Per PodSet: how many live pods, and the label sets they carry.
    podset_pods: BTreeMap<String, (usize, Vec<BTreeMap<String, String>>)>,
}

async fn observe(ns: &TestNamespace, podset_uids: &BTreeMap<String, String>) -> Result<State> {
    let deployments = ns
        .api::<Deployment>()
        .list(&ListParams::default())
        .await?
        .items
        .iter()
        .filter(|d| d.metadata.deletion_timestamp.is_none())
        .map(|d| {
            (
                d.metadata.name.clone().unwrap_or_default(),
                deployment_fingerprint(d),
            )
        })
        .collect();
    let services = ns
        .api::<Service>()
        .list(&ListParams::default())
        .await?
        .items
        .iter()
        .filter(|s| s.metadata.deletion_timestamp.is_none())
        .map(|s| {
            (
                s.metadata.name.clone().unwrap_or_default(),
                service_fingerprint(s),
            )
        })
        .collect();
    let mut pods = BTreeMap::new();
    for (name, uid) in podset_uids {
        let owned = podset_pods(ns, uid).await?;
        let mut labels: Vec<_> = owned
            .values() // pod names differ per pod; their labels are the same for all
            .cloned()
            .collect();
        labels.sort();
        labels.dedup();
        pods.insert(name.clone(), (owned.len(), labels));
    }
    Ok(State {
        deployments,
        services,
        podset_pods: pods,
    })
}

/// Every custom resource Ready for its current spec.
async fn all_ready(ns: &TestNamespace) -> Result<bool> {
    for name in PODSETS {
        if !kinds::podset_ready(&ns.api::<PodSet>().get(name).await?) {
            return Ok(false);
        }
    }
    for name in MEMCACHEDS {
        if !kinds::memcached_ready(&ns.api::<Memcached>().get(name).await?) {
            return Ok(false);
        }
    }
    for name in LOLCOWS {
        if !kinds::lolcow_ready(&ns.api::<Lolcow>().get(name).await?) {
            return Ok(false);
        }
    }
    for name in CONSUMERS {
        if !kinds::pulsar_consumer_ready(&ns.api::<PulsarConsumer>().get(name).await?) {
            return Ok(false);
        }
    }
    Ok(true)
}

fn reconciles(ops: &[OperatorProcess]) -> Result<f64> {
    let mut total = 0.0;
    for op in ops {
        total += metric_sum(&op.metrics()?, "controller_runtime_reconcile_total", &[]);
    }
    Ok(total)
}

/// The first container's name of a Deployment.
async fn container_of(deployments: &Api<Deployment>, name: &str) -> Result<String> {
    let d = deployments.get(name).await?;
    d.spec
        .and_then(|s| s.template.spec)
        .and_then(|p| p.containers.first().map(|c| c.name.clone()))
        .context("no container")
}

/// One tampering action; returns what it did. Errors (the object was just deleted, a
/// conflict) are part of the game and reported, not fatal.
async fn tamper(
    ns: &TestNamespace,
    rng: &mut Rng,
    podset_uids: &BTreeMap<String, String>,
    step: usize,
) -> Result<&'static str> {
    let deployments: Api<Deployment> = ns.api();
    let services: Api<Service> = ns.api();
    let pods: Api<Pod> = ns.api();
    let editor = PatchParams::default();
    match rng.below(13) {
        // Delete a pod of a PodSet (twice as likely: the PodSet's only child kind).
        0 | 1 => {
            let uid = &podset_uids[rng.name(&PODSETS)];
            let owned: Vec<String> = podset_pods(ns, uid).await?.into_keys().collect();
            if owned.is_empty() {
                return Ok("delete pod (none)");
            }
            pods.delete(
                rng.pick(owned.as_slice()).as_str(),
                &DeleteParams::default(),
            )
            .await?;
            Ok("delete pod")
        }
        // Scale a Deployment by hand.
        2 | 3 => {
            let replicas = rng.below(6);
            deployments
                .patch(
                    rng.name(&DEPLOYMENTS),
                    &editor,
                    &Patch::Merge(json!({"spec": {"replicas": replicas}})),
                )
                .await?;
            Ok("scale deployment")
        }
        // Change a Deployment's image.
        4 | 5 => {
            let name = rng.name(&DEPLOYMENTS);
            let container = container_of(&deployments, name).await?;
            deployments
                .patch(
                    name,
                    &editor,
                    &Patch::Strategic(json!({"spec": {"template": {"spec": {"containers": [
                        {"name": container, "image": format!("busybox:tampered-{step}")}
                    ]}}}})),
                )
                .await?;
            Ok("edit image")
        }
        // Change what a Deployment's container is told: an env var the operator sets
        // (Lolcow, PulsarConsumer) or the command (Memcached).
        6 | 7 => {
            let name = rng.name(&DEPLOYMENTS);
            let container = container_of(&deployments, name).await?;
            let edit = if name.starts_with("lc-") {
                json!({"name": container, "env": [{"name": "GREETING", "value": format!("hacked {step}")}]})
            } else if name.starts_with("pc-") {
                json!({"name": container, "env": [{"name": "PULSAR_TOPIC", "value": format!("hijacked-{step}")}]})
            } else {
                json!({"name": container, "command": ["memcached", "-m=1"]})
            };
            deployments
                .patch(
                    name,
                    &editor,
                    &Patch::Strategic(
                        json!({"spec": {"template": {"spec": {"containers": [edit]}}}}),
                    ),
                )
                .await?;
            Ok("edit env/command")
        }
        // Delete a Service.
        8 | 9 => {
            services
                .delete(rng.name(&SERVICES), &DeleteParams::default())
                .await?;
            Ok("delete service")
        }
        // Remove a managed label from a Deployment, a Service or a PodSet's pod.
        10 | 11 => {
            let label = rng.name(&[
                "app.kubernetes.io/managed-by",
                "app.kubernetes.io/instance",
                "app.kubernetes.io/name",
            ]);
            let remove = Patch::Merge(json!({"metadata": {"labels": {label: null}}}));
            match rng.below(3) {
                0 => {
                    deployments
                        .patch(rng.name(&DEPLOYMENTS), &editor, &remove)
                        .await?;
                }
                1 => {
                    services
                        .patch(rng.name(&SERVICES), &editor, &remove)
                        .await?;
                }
                _ => {
                    let uid = &podset_uids[rng.name(&PODSETS)];
                    let owned: Vec<String> = podset_pods(ns, uid).await?.into_keys().collect();
                    if let Some(pod) = owned.first() {
                        pods.patch(pod, &editor, &remove).await?;
                    }
                }
            }
            Ok("remove label")
        }
        // Now and then, delete a whole Deployment.
        _ => {
            deployments
                .delete(rng.name(&DEPLOYMENTS), &DeleteParams::background())
                .await?;
            Ok("delete deployment")
        }
    }
}

#[tokio::test]
async fn slow_tampering_with_children_is_repaired_within_ten_seconds_then_idle() -> Result<()> {
    let ns = TestNamespace::restricted("tamper").await?;
    let mut ops = Vec::new();
    for operator in OPERATORS {
        ops.push(OperatorProcess::start(operator, &[&ns.name]).await?);
    }
    let logs = |ops: &[OperatorProcess]| {
        ops.iter()
            .map(|o| format!("== {}\n{}", o.log_path.display(), o.log()))
            .collect::<Vec<_>>()
            .join("\n")
    };

    // Two objects of each kind, all Ready.
    let mut podset_uids = BTreeMap::new();
    for name in PODSETS {
        let ps: PodSet = create_from_json(&ns, kinds::podset(name, 3)).await?;
        podset_uids.insert(name.to_owned(), ps.metadata.uid.unwrap_or_default());
    }
    for name in MEMCACHEDS {
        create_from_json::<Memcached>(&ns, kinds::memcached(name, 2)).await?;
    }
    let mut ports = Vec::new();
    for name in LOLCOWS {
        let port = free_node_port(&ns, name, &ports).await?;
        ports.push(port);
        create_from_json::<Lolcow>(&ns, kinds::lolcow(name, port, &format!("I am {name}"))).await?;
    }
    for name in CONSUMERS {
        create_from_json::<PulsarConsumer>(&ns, kinds::pulsar_consumer(name, 2)).await?;
    }
    for name in LOLCOWS {
        kinds::wait_lolcow_ready(&ns, name).await?;
    }
    poll("every object Ready", TIMEOUT, || async {
        Ok(all_ready(&ns).await?.then_some(()))
    })
    .await
    .with_context(|| logs(&ops))?;
    let specified = observe(&ns, &podset_uids).await?;
    assert_eq!(
        specified.deployments.len(),
        DEPLOYMENTS.len(),
        "{specified:#?}"
    );
    assert_eq!(specified.services.len(), SERVICES.len(), "{specified:#?}");
    for (name, (count, labels)) in &specified.podset_pods {
        assert_eq!((*count, labels.len()), (3, 1), "{name}: {specified:#?}");
    }

    // A minute of tampering, a few actions per second; it stops by itself.
    let seed = std::env::var("E2E_TAMPER_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(DEFAULT_SEED);
    println!("tampering with seed {seed} (E2E_TAMPER_SEED replays it)");
    let mut rng = Rng(seed.max(1));
    let mut done: BTreeMap<String, usize> = BTreeMap::new();
    let end = Instant::now() + TAMPERING;
    let mut step = 0;
    while Instant::now() < end {
        let what = match tamper(&ns, &mut rng, &podset_uids, step).await {
            Ok(what) => what.to_owned(),
            Err(e) => format!(
                "refused: {}",
                e.to_string().chars().take(60).collect::<String>()
            ),
        };
        *done.entry(what).or_default() += 1;
        step += 1;
        tokio::time::sleep(PACE).await; // the pace of the tampering, not a wait for a result
    }
    println!("{step} tampering actions: {done:#?}");
    assert!(step >= 100, "only {step} actions in {TAMPERING:?}");

    // Back as specified within the deadline.
    let stopped = Instant::now();
    let repaired = poll("everything back as specified", REPAIR_DEADLINE, || async {
        let now = observe(&ns, &podset_uids).await?;
        Ok((now == specified && all_ready(&ns).await?).then_some(()))
    })
    .await;
    if let Err(e) = repaired {
        let now = observe(&ns, &podset_uids).await?;
        bail!(
            "{e:#}\nspecified: {specified:#?}\nnow: {now:#?}\nall ready: {:?}\n{}",
            all_ready(&ns).await,
            logs(&ops)
        );
    }
    println!(
        "repaired {:?} after the tampering stopped",
        stopped.elapsed()
    );

    // Idle: a window of QUIET_WINDOW without a single reconcile, soon.
    let quiet = std::cell::Cell::new((reconciles(&ops)?, Instant::now()));
    let started = Instant::now();
    poll(
        "the operators idle (no reconcile for 5 s)",
        QUIET_DEADLINE,
        || async {
            let count = reconciles(&ops)?;
            let (last, since) = quiet.get();
            if count != last {
                quiet.set((count, Instant::now()));
                return Ok(None);
            }
            Ok((since.elapsed() >= QUIET_WINDOW).then_some(()))
        },
    )
    .await
    .with_context(|| logs(&ops))?;
    println!("idle {:?} after the repair", started.elapsed());
    // Still as specified after the quiet window.
    assert_eq!(observe(&ns, &podset_uids).await?, specified);

    // Memcached's finalizer needs its operator: delete them while it runs.
    for name in MEMCACHEDS {
        e2e::delete_and_wait(&ns.api::<Memcached>(), name).await?;
    }
    wait_for(&ns.api::<Memcached>(), "mc-0", |o: Option<&Memcached>| {
        o.is_none()
    })
    .await?;
    Ok(())
}
