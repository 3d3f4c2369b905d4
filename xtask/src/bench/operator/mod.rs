//! `cargo xtask bench operator`: scale, speed and memory of one operator on
//! the local cluster; `--standard` (and `cargo xtask bench --all`) runs the
//! standard set: every operator with 100 objects, PodSet and Memcached also
//! with 1,000, and PodSet with 100 beside 5,000 unrelated pods.
//!
//! One run: the operator's static release binary (the one its image ships)
//! runs on this machine as in the end-to-end tests (its ServiceAccount's
//! token, `WATCH_NAMESPACE` = one fresh bench namespace), and the bench, as a plain client with its own watches on
//! the custom resources and the pods:
//! 1. reads the idle memory once the operator is ready (no objects);
//! 2. creates N objects at once and times each one to `Ready` (the `Ready`
//!    condition `True` for the current generation), until every object is
//!    Ready and the namespace holds exactly the pods wanted;
//! 3. watches a quiet window (60 s, `--quick` 10 s): the operator must write
//!    nothing;
//! 4. changes the spec of every object (replicas - 1, or a new greeting) and
//!    times the re-convergence; 5. deletes them all and times until every
//!    child is gone.
//!
//! `--stranger-pods M` first fills the namespace with M pods that are nobody's
//! (what any busy namespace holds): an operator that watches only what can be its own
//! shows the same figures with and without them.
//!
//! Throughout: peak memory (`VmHWM`), CPU time, pods ever seen (extra pods
//! beyond the desired count must be 0) and every API request the operator
//! made, by verb and phase (counted at the client; see [`requests`]).
//! Results: `target/bench/<operator>-<N>.json`, and from every such file
//! `target/bench/operators.md` and `target/bench/ready-over-time.svg`.

mod process;
mod procfs;
pub(crate) mod report;
mod watch;
use process::*;
use watch::*;

use crate::bench::{Machine, git_commit, out_dir, round3};
use crate::cluster;
use anyhow::{Context, Result, bail, ensure};
use clap::{Args, ValueEnum};
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::apps::v1::{Deployment, ReplicaSet};
use k8s_openapi::api::core::v1::{Namespace, Pod, Service, ServiceAccount};
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::core::{ApiResource, DynamicObject, PartialObjectMeta};
use kube::runtime::watcher::{self, Event};
use kube::{Client, ResourceExt};
use serde_json::{Value, json};
use std::collections::{HashMap, HashSet};
use std::fs;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};
use xtask::kubectl::Kubectl;
use xtask::local_operator::{self, Launch, LocalOperator};
use xtask::requests;

/// Options of `cargo xtask bench operator`.
#[derive(Args, Clone)]
pub struct OperatorArgs {
    /// The operator to measure.
    #[arg(long, value_enum, default_value_t = Operator::Podset)]
    operator: Operator,
    /// Objects created at once (N).
    #[arg(long, default_value_t = 100, value_parser = clap::value_parser!(u32).range(1..=10_000))]
    objects: u32,
    /// Replicas of each object (PodSet, Memcached, PulsarConsumer; a Lolcow has one pod).
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(i32).range(1..=20))]
    replicas: i32,
    /// The quiet window after convergence, in seconds, during which the operator must not write.
    #[arg(long, default_value_t = 60)]
    settle_seconds: u64,
    /// Development mode: a 10 s quiet window.
    #[arg(long)]
    quick: bool,
    /// Run the standard set instead (every operator at N=100; PodSet and Memcached
    /// also at N=1000); `--quick` applies.
    #[arg(long)]
    standard: bool,
    /// Pods that belong to nobody, created in the namespace before the operator starts.
    #[arg(long, default_value_t = 0, value_parser = clap::value_parser!(u32).range(0..=20_000))]
    stranger_pods: u32,
    /// Extra environment of the operator process, e.g. `MALLOC_ARENA_MAX=2` (repeatable).
    #[arg(long = "env", value_name = "KEY=VALUE")]
    env: Vec<String>,
}

impl Default for OperatorArgs {
    fn default() -> Self {
        Self {
            operator: Operator::Podset,
            objects: 100,
            replicas: 3,
            settle_seconds: 60,
            quick: false,
            standard: false,
            stranger_pods: 0,
            env: Vec::new(),
        }
    }
}

impl OperatorArgs {
    fn settle(&self) -> Duration {
        Duration::from_secs(if self.quick { 10 } else { self.settle_seconds })
    }
}

/// The operators, as named on the command line.
#[derive(Clone, Copy, PartialEq, Eq, ValueEnum, Debug)]
pub enum Operator {
    /// `podset-operator` (PodSet: pods created by the operator).
    Podset,
    /// `memcached-operator` (Memcached: a Deployment and a Service).
    Memcached,
    /// `lolcow-operator` (Lolcow: a Deployment and a NodePort Service).
    Lolcow,
    /// `pulsar-consumer-operator` (PulsarConsumer: a Deployment).
    PulsarConsumer,
}

impl Operator {
    const ALL: [Operator; 4] = [
        Operator::Podset,
        Operator::Memcached,
        Operator::Lolcow,
        Operator::PulsarConsumer,
    ];

    /// Its entry in the workspace's list of operators.
    fn kind(self) -> &'static xtask::operators::Kind {
        use xtask::operators::{LOLCOW, MEMCACHED, PODSET, PULSAR_CONSUMER};
        match self {
            Operator::Podset => &PODSET,
            Operator::Memcached => &MEMCACHED,
            Operator::Lolcow => &LOLCOW,
            Operator::PulsarConsumer => &PULSAR_CONSUMER,
        }
    }

    /// The command-line name, used in file names.
    fn name(self) -> &'static str {
        self.kind().short
    }

    /// The crate, binary and `deploy/` folder.
    fn crate_name(self) -> &'static str {
        self.kind().operator
    }

    fn api_resource(self) -> ApiResource {
        self.kind().api_resource()
    }

    /// Pods one object runs with `replicas`.
    fn pods_per_object(self, replicas: i32) -> i32 {
        match self {
            Operator::Lolcow => 1,
            _ => replicas,
        }
    }

    /// The `i`-th object; `port` is the Lolcow's NodePort.
    fn object(self, name: &str, replicas: i32, port: i32) -> Value {
        let spec = match self {
            Operator::Podset => json!({ "replicas": replicas }),
            Operator::Memcached => json!({ "size": replicas, "containerPort": 11211 }),
            Operator::Lolcow => json!({ "port": port, "greeting": "Hello from the bench" }),
            Operator::PulsarConsumer => json!({
                "serverAddress": "pulsar://localhost:6650",
                "topic": format!("bench-{name}"),
                "subscriptionName": "bench",
                "replicas": replicas,
            }),
        };
        self.kind().manifest(name, spec)
    }

    /// The spec change of phase 4 (merge patch) and what it is, for the report.
    fn change(self, replicas: i32) -> (Value, String) {
        let to = self.changed_replicas(replicas);
        match self {
            Operator::Podset | Operator::PulsarConsumer => (
                json!({ "spec": { "replicas": to } }),
                format!("replicas {replicas} -> {to}"),
            ),
            Operator::Memcached => (
                json!({ "spec": { "size": to } }),
                format!("size {replicas} -> {to}"),
            ),
            Operator::Lolcow => (
                json!({ "spec": { "greeting": "Moo again from the bench" } }),
                "new greeting (rolls the Deployment)".to_owned(),
            ),
        }
    }

    /// Replicas after [`Operator::change`]: one fewer, or one more from a single replica.
    fn changed_replicas(self, replicas: i32) -> i32 {
        match self {
            Operator::Lolcow => replicas,
            _ if replicas > 1 => replicas - 1,
            _ => replicas + 1,
        }
    }

    /// Writes one object needs at least to become Ready: its children's
    /// creates or applies, the finalizer (Memcached), the two status changes
    /// every object goes through (created: `Progressing`; then `Ready`) and
    /// the two events the contract asks for on those condition transitions.
    fn minimum_writes(self, replicas: i32) -> u64 {
        let children = match self {
            Operator::Podset => u64::try_from(replicas).unwrap_or(0),
            Operator::Memcached => 2 + 1,
            Operator::Lolcow => 2,
            Operator::PulsarConsumer => 1,
        };
        children + 2 + 2
    }
}

/// The standard set: (operator, N, stranger pods).
fn standard_set() -> Vec<(Operator, u32, u32)> {
    let mut set: Vec<(Operator, u32, u32)> = Operator::ALL.iter().map(|o| (*o, 100, 0)).collect();
    set.push((Operator::Podset, 1000, 0));
    set.push((Operator::Memcached, 1000, 0));
    set.push((Operator::Podset, 100, 5000));
    set
}

/// The run's name, used for its file: `<operator>-<N>`, `-strangers-<M>` with them.
fn run_name(op: Operator, objects: u32, strangers: u32) -> String {
    if strangers == 0 {
        format!("{}-{objects}", op.name())
    } else {
        format!("{}-{objects}-strangers-{strangers}", op.name())
    }
}

/// `cargo xtask bench operator ...`.
pub fn run(args: &OperatorArgs) -> Result<()> {
    if args.standard {
        return run_standard(args);
    }
    let runtime = runtime()?;
    let result = bench_and_record(&runtime, args);
    report::write_summary()?;
    result
}

/// The standard set with default options (for `cargo xtask bench --all`).
pub fn run_all() -> Result<()> {
    run_standard(&OperatorArgs::default())
}

fn run_standard(base: &OperatorArgs) -> Result<()> {
    let runtime = runtime()?;
    let mut failed = Vec::new();
    for (operator, objects, stranger_pods) in standard_set() {
        let args = OperatorArgs {
            operator,
            objects,
            stranger_pods,
            standard: false,
            ..base.clone()
        };
        if let Err(e) = bench_and_record(&runtime, &args) {
            eprintln!(
                "bench operator: {} N={objects} failed: {e:#}",
                operator.name()
            );
            failed.push(format!(
                "{}: {e:#}",
                run_name(operator, objects, stranger_pods)
            ));
        }
    }
    let summary = report::write_summary()?;
    println!("{summary}");
    ensure!(
        failed.is_empty(),
        "some runs failed:\n{}",
        failed.join("\n")
    );
    Ok(())
}

fn runtime() -> Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("starting the tokio runtime")
}

fn bench_and_record(runtime: &tokio::runtime::Runtime, args: &OperatorArgs) -> Result<()> {
    let op = args.operator;
    println!(
        "==> bench operator: {} with {} objects ({} replicas){}",
        op.name(),
        args.objects,
        args.replicas,
        if args.stranger_pods > 0 {
            format!(", beside {} stranger pods", args.stranger_pods)
        } else {
            String::new()
        }
    );
    // The binary the image ships (static, release): what runs in a cluster, so what
    // is measured. It maps no shared libraries, which are 2 MiB of a dynamic build's RSS.
    let binary = crate::image::build_binary(op.crate_name())?;
    ensure!(binary.is_file(), "{} was not built", binary.display());
    let kubeconfig = cluster::up()?;
    // `kubectl apply -k deploy/<operator>` (CRD, RBAC...), as the tests do.
    local_operator::install(&admin_kubectl(&kubeconfig), op.crate_name(), "bench")?;
    let sa_kubeconfig = service_account_kubeconfig(op, &kubeconfig)?;
    let result = runtime.block_on(bench(args, &binary, &kubeconfig, &sa_kubeconfig));
    let _ = fs::remove_file(&sa_kubeconfig);
    let outcome = result?;
    let path = out_dir()?.join(format!(
        "{}.json",
        run_name(op, args.objects, args.stranger_pods)
    ));
    fs::write(&path, serde_json::to_string_pretty(&outcome)? + "\n")
        .with_context(|| format!("writing {}", path.display()))?;
    println!("{}", report::one_line(&outcome));
    println!("wrote {}", path.display());
    Ok(())
}

/// kubectl (the cluster's own when built) with the admin kubeconfig.
fn admin_kubectl(kubeconfig: &Path) -> Kubectl {
    Kubectl::new(cluster::build::kubectl_or_path()).with_kubeconfig(kubeconfig)
}

/// A kubeconfig with a fresh token of the operator's ServiceAccount.
fn service_account_kubeconfig(op: Operator, admin: &Path) -> Result<PathBuf> {
    let path =
        out_dir()?
            .join("logs")
            .join(format!("{}-{}.kubeconfig", op.name(), std::process::id()));
    local_operator::service_account_kubeconfig(
        &admin_kubectl(admin),
        &format!("{}-system", op.crate_name()),
        op.crate_name(),
        "2h",
        None,
        &path,
    )?;
    Ok(path)
}

// ---------------------------------------------------------------------------
// One run
// ---------------------------------------------------------------------------

/// Polls `done` every 50 ms; fails after `timeout` with `progress()`.
async fn wait_until(
    what: &str,
    timeout: Duration,
    mut done: impl FnMut() -> bool,
    progress: impl Fn() -> String,
) -> Result<Instant> {
    let deadline = Instant::now() + timeout;
    loop {
        if done() {
            return Ok(Instant::now());
        }
        ensure!(
            Instant::now() < deadline,
            "timed out after {}s waiting for {what} ({})",
            timeout.as_secs(),
            progress()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn seconds(from: Instant, to: Instant) -> f64 {
    round3(to.saturating_duration_since(from).as_secs_f64())
}

/// The q-quantile (nearest rank) of sorted values.
fn quantile(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let rank = (q * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

/// Per-object latencies (`from` -> Ready at the generation in `generations`), sorted.
fn latencies(
    objects: &Objects,
    names: &[String],
    from: &HashMap<String, Instant>,
    generations: &HashMap<String, i64>,
) -> Vec<f64> {
    let mut all: Vec<f64> = names
        .iter()
        .filter_map(|n| {
            let generation = objects.generation.get(n).copied()?;
            let want = generations.get(n).copied().unwrap_or(1);
            let ready = (want..=generation)
                .filter_map(|g| objects.ready_at.get(&(n.clone(), g)))
                .min()?;
            Some(seconds(*from.get(n)?, *ready))
        })
        .collect();
    all.sort_by(f64::total_cmp);
    all
}

/// Requests in a stretch of the operator's log, as JSON with totals.
fn requests_json(log: &str, objects: u32) -> (Value, u64, u64) {
    let counts = requests::count(log);
    let (all, writes) = requests::totals(&counts);
    let value = json!({
        "total": all,
        "writes": writes,
        "per_object": round3(all as f64 / f64::from(objects)),
        "writes_per_object": round3(writes as f64 / f64::from(objects)),
        "by_verb": counts,
    });
    (value, all, writes)
}

/// NodePorts not used by any Service of the cluster, `count` of them.
async fn free_node_ports(client: &Client, count: u32) -> Result<Vec<i32>> {
    let used = xtask::node_ports::in_use(client).await?;
    // Start away from the low end, which the tests' samples use.
    let free: Vec<i32> = (31000..=32767)
        .chain(30000..31000)
        .filter(|p| !used.contains(p))
        .take(count as usize)
        .collect();
    ensure!(
        free.len() == count as usize,
        "only {} free NodePorts for {count} Lolcows",
        free.len()
    );
    Ok(free)
}

async fn bench(
    args: &OperatorArgs,
    binary: &Path,
    admin_kubeconfig: &Path,
    sa_kubeconfig: &Path,
) -> Result<Value> {
    let op = args.operator;
    let n = args.objects;
    let client = xtask::kubeconfig::client_from(admin_kubeconfig).await?;
    let namespace = format!(
        "bench-{}-{n}-{}",
        op.name(),
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_secs() % 1_000_000)
    );
    let ns_api: Api<Namespace> = Api::all(client.clone());
    let ns: Namespace = serde_json::from_value(json!({
        "metadata": {
            "name": namespace,
            "labels": { "bench.rust-operators.dev/operator": op.name() },
            // Thousands of pods: on the simulated nodes.
            "annotations": xtask::simulated::annotations_json(),
        }
    }))?;
    ns_api.create(&PostParams::default(), &ns).await?;
    println!("    namespace {namespace}");
    let result = bench_in(args, binary, &client, &namespace, sa_kubeconfig).await;
    cleanup(&client, op, &namespace).await;
    result
}

/// Deletes the bench namespace. Objects with a finalizer whose operator has
/// stopped would keep it `Terminating` forever, so they lose their
/// finalizers first.
async fn cleanup(client: &Client, op: Operator, namespace: &str) {
    let api: Api<DynamicObject> =
        Api::namespaced_with(client.clone(), namespace, &op.api_resource());
    let _ = api
        .delete_collection(&DeleteParams::default(), &ListParams::default())
        .await;
    if let Ok(left) = api.list_metadata(&ListParams::default()).await {
        for obj in left.items {
            if !obj.finalizers().is_empty() {
                let _ = api
                    .patch(
                        &obj.name_any(),
                        &PatchParams::default(),
                        &Patch::Merge(json!({ "metadata": { "finalizers": null } })),
                    )
                    .await;
            }
        }
    }
    let ns_api: Api<Namespace> = Api::all(client.clone());
    let _ = ns_api.delete(namespace, &DeleteParams::default()).await;
}

#[allow(clippy::too_many_lines)] // one run, phase by phase
async fn bench_in(
    args: &OperatorArgs,
    binary: &Path,
    client: &Client,
    namespace: &str,
    sa_kubeconfig: &Path,
) -> Result<Value> {
    let op = args.operator;
    let n = args.objects;
    let replicas = args.replicas;
    let want_pods = (n as usize) * op.pods_per_object(replicas) as usize;
    let names: Vec<String> = (0..n).map(|i| format!("{}-{i:04}", op.name())).collect();

    // Pods need the namespace's default ServiceAccount.
    let sa_api: Api<ServiceAccount> = Api::namespaced(client.clone(), namespace);
    let deadline = Instant::now() + Duration::from_secs(30);
    while sa_api.get_opt("default").await?.is_none() {
        ensure!(
            Instant::now() < deadline,
            "no default ServiceAccount in {namespace}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    create_strangers(client, namespace, args.stranger_pods).await?;
    let (objects, pods) = spawn_watches(client, namespace, op);

    let env: Vec<(String, String)> = args
        .env
        .iter()
        .map(|kv| {
            kv.split_once('=')
                .map(|(k, v)| (k.to_owned(), v.to_owned()))
                .with_context(|| format!("--env {kv}: expected KEY=VALUE"))
        })
        .collect::<Result<_>>()?;
    let logs = out_dir()?.join("logs");
    fs::create_dir_all(&logs)?;
    let log_path = logs.join(format!("{}-{n}.log", op.name()));
    let started = Instant::now();
    let mut process = OperatorProcess::start(binary, sa_kubeconfig, namespace, &log_path, &env)?;
    process.wait_ready().await?;
    let ready_seconds = seconds(started, Instant::now());
    // Let startup allocations settle, then read the idle figures.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let idle = process.sample()?;
    let log_idle = process.log_len();
    println!(
        "    idle: RSS {} MiB (anonymous {} MiB, peak {} MiB), {} threads, ready after {ready_seconds}s",
        procfs::mib(idle.rss_kib),
        procfs::mib(idle.anon_kib),
        procfs::mib(idle.hwm_kib),
        idle.threads
    );

    // Create N at once.
    let cr_api: Api<DynamicObject> =
        Api::namespaced_with(client.clone(), namespace, &op.api_resource());
    let ports = if op == Operator::Lolcow {
        free_node_ports(client, n).await?
    } else {
        vec![0; n as usize]
    };
    let manifests: Vec<(String, DynamicObject)> = names
        .iter()
        .zip(&ports)
        .map(|(name, port)| {
            Ok((
                name.clone(),
                serde_json::from_value(op.object(name, replicas, *port))?,
            ))
        })
        .collect::<Result<_>>()?;
    let t_create = Instant::now();
    let created: Vec<(String, Instant, i64)> = futures::stream::iter(manifests)
        .map(|(name, obj)| {
            let api = cr_api.clone();
            async move {
                let sent = Instant::now();
                let created = api
                    .create(&PostParams::default(), &obj)
                    .await
                    .with_context(|| format!("creating {name}"))?;
                Ok::<_, anyhow::Error>((name, sent, created.metadata.generation.unwrap_or(1)))
            }
        })
        .buffer_unordered(32)
        .try_collect()
        .await?;
    let created_seconds = seconds(t_create, Instant::now());
    let sent_at: HashMap<String, Instant> =
        created.iter().map(|(n, t, _)| (n.clone(), *t)).collect();
    let generations: HashMap<String, i64> =
        created.iter().map(|(n, _, g)| (n.clone(), *g)).collect();
    let timeout = Duration::from_secs(180 + u64::from(n) / 2);
    let t_converged = wait_until(
        "every object Ready with its pods",
        timeout,
        || {
            let ready = objects.lock().map_or(0, |o| o.ready(&names, &generations));
            let active = pods.lock().map_or(0, |p| p.active.len());
            ready == n as usize && active == want_pods
        },
        || {
            format!(
                "{} of {n} Ready, {} of {want_pods} pods",
                objects.lock().map_or(0, |o| o.ready(&names, &generations)),
                pods.lock().map_or(0, |p| p.active.len())
            )
        },
    )
    .await?;
    let loaded = process.sample()?;
    let log_converged = process.log_len();
    let (create_lat, ready_curve) = {
        let o = objects
            .lock()
            .map_err(|_| anyhow::anyhow!("state lock poisoned"))?;
        let lat = latencies(&o, &names, &sent_at, &generations);
        let mut curve: Vec<f64> = names
            .iter()
            .filter_map(|name| {
                let g = generations.get(name)?;
                o.ready_at
                    .get(&(name.clone(), *g))
                    .map(|t| seconds(t_create, *t))
            })
            .collect();
        curve.sort_by(f64::total_cmp);
        (lat, curve)
    };
    let all_ready_seconds = seconds(t_create, t_converged);
    println!(
        "    create: {n} objects Ready in {all_ready_seconds}s (p50 {}s, p99 {}s), peak RSS {} MiB",
        quantile(&create_lat, 0.5),
        quantile(&create_lat, 0.99),
        procfs::mib(loaded.hwm_kib)
    );

    // The quiet window.
    let settle = args.settle();
    let before = (
        objects.lock().map_or(0, |o| o.changes),
        pods.lock().map_or(0, |p| p.changes),
        process.reconciles(),
    );
    tokio::time::sleep(settle).await;
    let after = (
        objects.lock().map_or(0, |o| o.changes),
        pods.lock().map_or(0, |p| p.changes),
        process.reconciles(),
    );
    let steady = process.sample()?;
    let log_settled = process.log_len();
    let pods_ever_before_change = pods.lock().map_or(0, |p| p.ever.len());
    let extra_pods = pods_ever_before_change.saturating_sub(want_pods);
    let settle_log = process.log_from(log_converged);
    let settle_log = settle_log
        .get(..log_settled.saturating_sub(log_converged))
        .unwrap_or(&settle_log);
    let (settle_requests, _, settle_writes) = requests_json(settle_log, n);
    println!(
        "    quiet {}s: {settle_writes} writes, {} reconciles; RSS {} MiB",
        settle.as_secs(),
        after.2.saturating_sub(before.2),
        procfs::mib(steady.rss_kib)
    );

    // Restart with everything in place: the operator stops (SIGTERM) and starts again;
    // until every object was reconciled once (`controller_runtime_reconcile_total` reaches
    // N) it must write nothing.
    let first_log = process.log_from(0);
    let before_restart = process.sample()?;
    process.stop();
    let t_restart = Instant::now();
    let restart_log = logs.join(format!(
        "{}-restart.log",
        run_name(op, n, args.stranger_pods)
    ));
    let mut process = OperatorProcess::start(binary, sa_kubeconfig, namespace, &restart_log, &env)?;
    process.wait_ready().await?;
    let restart_ready_seconds = seconds(t_restart, Instant::now());
    let t_reconciled = wait_until(
        "every object reconciled after the restart",
        timeout,
        || process.reconciles() >= u64::from(n),
        || format!("{} of {n} reconciles", process.reconciles()),
    )
    .await?;
    let restarted = process.sample()?;
    let log_restarted = process.log_len();
    let restart_text = process.log_from(0);
    let (restart_requests, _, restart_writes) = requests_json(
        restart_text.get(..log_restarted).unwrap_or(&restart_text),
        n,
    );
    let restart_seconds = seconds(t_restart, t_reconciled);
    println!(
        "    restart: every object reconciled {restart_seconds}s after the stop, {restart_writes} writes, peak RSS {} MiB",
        procfs::mib(restarted.hwm_kib)
    );

    // Change every spec.
    let (patch, change) = op.change(replicas);
    let want_pods_after = (n as usize) * op.pods_per_object(op.changed_replicas(replicas)) as usize;
    let t_change = Instant::now();
    let patched: Vec<(String, Instant, i64)> = futures::stream::iter(names.clone())
        .map(|name| {
            let (api, patch) = (cr_api.clone(), patch.clone());
            async move {
                let sent = Instant::now();
                let obj = api
                    .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
                    .await
                    .with_context(|| format!("changing {name}"))?;
                Ok::<_, anyhow::Error>((name, sent, obj.metadata.generation.unwrap_or(0)))
            }
        })
        .buffer_unordered(32)
        .try_collect()
        .await?;
    let changed_at: HashMap<String, Instant> =
        patched.iter().map(|(n, t, _)| (n.clone(), *t)).collect();
    let new_generations: HashMap<String, i64> =
        patched.iter().map(|(n, _, g)| (n.clone(), *g)).collect();
    let t_reconverged = wait_until(
        "every object Ready after the change",
        timeout,
        || {
            let ready = objects
                .lock()
                .map_or(0, |o| o.ready(&names, &new_generations));
            let active = pods.lock().map_or(0, |p| p.active.len());
            ready == n as usize && active == want_pods_after
        },
        || {
            format!(
                "{} of {n} Ready, {} of {want_pods_after} pods",
                objects
                    .lock()
                    .map_or(0, |o| o.ready(&names, &new_generations)),
                pods.lock().map_or(0, |p| p.active.len())
            )
        },
    )
    .await?;
    let changed = process.sample()?;
    let log_changed = process.log_len();
    let change_lat = {
        let o = objects
            .lock()
            .map_err(|_| anyhow::anyhow!("state lock poisoned"))?;
        latencies(&o, &names, &changed_at, &new_generations)
    };
    let pods_created_by_change = pods.lock().map_or(0, |p| p.ever.len()) - pods_ever_before_change;
    let change_seconds = seconds(t_change, t_reconverged);
    println!("    change ({change}): converged in {change_seconds}s");

    // Delete everything.
    let t_delete = Instant::now();
    // One collection delete of thousands of objects can outlast a request on a busy API
    // server (the client then sees the connection fail); what one attempt did not delete,
    // the next one does.
    for attempt in 1..=3 {
        match cr_api
            .delete_collection(&DeleteParams::default(), &ListParams::default())
            .await
        {
            Ok(_) => break,
            Err(e) if attempt < 3 => {
                println!("    delete: attempt {attempt} failed ({e}); again");
                tokio::time::sleep(Duration::from_secs(2)).await;
            }
            Err(e) => return Err(e.into()),
        }
    }
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), namespace);
    let replicasets: Api<ReplicaSet> = Api::namespaced(client.clone(), namespace);
    let services: Api<Service> = Api::namespaced(client.clone(), namespace);
    let t_objects_gone = wait_until(
        "every object deleted",
        timeout,
        || objects.lock().is_ok_and(|o| o.generation.is_empty()),
        || format!("{} left", objects.lock().map_or(0, |o| o.generation.len())),
    )
    .await?;
    let lp = ListParams::default();
    let deadline = Instant::now() + timeout;
    let t_children_gone = loop {
        let no_pods = pods.lock().is_ok_and(|p| p.present.is_empty());
        let left = if no_pods {
            deployments.list_metadata(&lp).await?.items.len()
                + replicasets.list_metadata(&lp).await?.items.len()
                + services.list_metadata(&lp).await?.items.len()
        } else {
            1
        };
        if left == 0 {
            break Instant::now();
        }
        ensure!(
            Instant::now() < deadline,
            "children still present {}s after deleting the objects",
            timeout.as_secs()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let delete_seconds = seconds(t_delete, t_children_gone);
    println!("    delete: children gone in {delete_seconds}s");
    let end = process.sample()?;
    let log_end = process.log_len();
    process.stop();

    // Requests by phase, from the operator's logs (before and after the restart).
    let log = process.log_from(0);
    let slice = |from: usize, to: usize| log.get(from..to.min(log.len())).unwrap_or_default();
    let first = |from: usize, to: usize| {
        first_log
            .get(from..to.min(first_log.len()))
            .unwrap_or_default()
    };
    let (startup_req, _, _) = requests_json(first(0, log_idle), n);
    let (create_req, _, create_writes) = requests_json(first(log_idle, log_converged), n);
    let (change_req, _, _) = requests_json(slice(log_restarted, log_changed), n);
    let (delete_req, _, _) = requests_json(slice(log_changed, log_end), n);
    let (total_req, _, _) = requests_json(&format!("{first_log}{}", slice(0, log_end)), n);

    let machine = Machine::probe();
    Ok(json!({
        "benchmark": "operator",
        "operator": op.name(),
        "binary": op.crate_name(),
        "build": "release, static (the image's binary)",
        "objects": n,
        "replicas": replicas,
        "stranger_pods": args.stranger_pods,
        "pods_per_object": op.pods_per_object(replicas),
        "unix_time": SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs()),
        "git_commit": git_commit(),
        "machine": machine.json(),
        "operator_env": args.env,
        "request_counting": "client side: kube-rs `requesting` debug events (RUST_LOG=info,kube_client::client::builder=debug)",
        "minimum_writes_per_object": op.minimum_writes(replicas),
        "startup": {
            "ready_seconds": ready_seconds,
            "idle_rss_kib": idle.rss_kib,
            "idle_hwm_kib": idle.hwm_kib,
            "idle_anon_kib": idle.anon_kib,
            "threads": idle.threads,
            "cpu_seconds": round3(idle.cpu_seconds),
            "requests": startup_req,
        },
        "create": {
            "submit_seconds": created_seconds,
            "all_ready_seconds": all_ready_seconds,
            "latency_p50_seconds": quantile(&create_lat, 0.5),
            "latency_p99_seconds": quantile(&create_lat, 0.99),
            "latency_max_seconds": quantile(&create_lat, 1.0),
            "ready_curve_seconds": ready_curve,
            "hwm_kib": loaded.hwm_kib,
            "rss_kib": loaded.rss_kib,
            "anon_kib": loaded.anon_kib,
            "threads": loaded.threads,
            "cpu_seconds": round3(loaded.cpu_seconds - idle.cpu_seconds),
            "writes": create_writes,
            "requests": create_req,
        },
        "pods": {
            "desired": want_pods,
            "ever_seen_before_change": pods_ever_before_change,
            "extra": extra_pods,
            "created_by_change": pods_created_by_change,
        },
        "steady": {
            "window_seconds": settle.as_secs(),
            "writes": settle_writes,
            "requests": settle_requests,
            "reconciles": after.2.saturating_sub(before.2),
            "object_changes_seen": after.0.saturating_sub(before.0),
            "pod_changes_seen": after.1.saturating_sub(before.1),
            "rss_kib": steady.rss_kib,
            "anon_kib": steady.anon_kib,
            "cpu_seconds": round3(steady.cpu_seconds - loaded.cpu_seconds),
        },
        "restart": {
            "ready_seconds": restart_ready_seconds,
            "all_reconciled_seconds": restart_seconds,
            "writes": restart_writes,
            "requests": restart_requests,
            "hwm_kib": restarted.hwm_kib,
            "rss_kib": restarted.rss_kib,
            "steady_rss_kib": steady.rss_kib,
            "cpu_seconds": round3(restarted.cpu_seconds),
        },
        "change": {
            "what": change,
            "all_ready_seconds": change_seconds,
            "latency_p50_seconds": quantile(&change_lat, 0.5),
            "latency_p99_seconds": quantile(&change_lat, 0.99),
            "cpu_seconds": round3(changed.cpu_seconds - restarted.cpu_seconds),
            "requests": change_req,
        },
        "delete": {
            "objects_gone_seconds": seconds(t_delete, t_objects_gone),
            "children_gone_seconds": delete_seconds,
            "requests": delete_req,
        },
        "end": {
            // The larger peak of the two processes (before and after the restart).
            "hwm_kib": end.hwm_kib.max(before_restart.hwm_kib),
            "rss_kib": end.rss_kib,
            "threads": end.threads,
            // Both processes.
            "cpu_seconds": round3(before_restart.cpu_seconds + end.cpu_seconds),
            "requests": total_req,
        },
        // What the objects cost: converged RSS above idle, per object.
        "kib_per_object": (steady.rss_kib.saturating_sub(idle.rss_kib)) as f64 / f64::from(n.max(1)),
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantiles() {
        let v: Vec<f64> = (1..=100).map(f64::from).collect();
        assert_eq!(quantile(&v, 0.5), 50.0);
        assert_eq!(quantile(&v, 0.99), 99.0);
        assert_eq!(quantile(&v, 1.0), 100.0);
        assert_eq!(quantile(&[], 0.5), 0.0);
        assert_eq!(quantile(&[3.0], 0.99), 3.0);
    }

    #[test]
    fn standard_set_covers_every_operator() {
        let set = standard_set();
        for op in Operator::ALL {
            assert!(set.contains(&(op, 100, 0)));
        }
        assert!(set.contains(&(Operator::Podset, 1000, 0)));
        assert!(set.contains(&(Operator::Memcached, 1000, 0)));
        assert!(set.contains(&(Operator::Podset, 100, 5000)));
        assert_eq!(run_name(Operator::Podset, 100, 0), "podset-100");
        assert_eq!(
            run_name(Operator::Podset, 100, 5000),
            "podset-100-strangers-5000"
        );
    }

    #[test]
    fn objects_parse() -> Result<()> {
        for op in Operator::ALL {
            let obj: DynamicObject = serde_json::from_value(op.object("x-0001", 3, 31000))?;
            assert_eq!(obj.name_any(), "x-0001");
            assert!(op.change(3).0["spec"].is_object());
        }
        Ok(())
    }
}
