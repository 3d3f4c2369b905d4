//! `cargo xtask cluster up | down | status | env`: a real, local Kubernetes
//! cluster for the end-to-end tests.
//!
//! etcd, kube-apiserver, kube-controller-manager, kube-scheduler and kwok run
//! as plain processes on 127.0.0.1 only. RBAC is on and service-account tokens
//! work, so the operators can be tested with their own least-privilege
//! identities. One real node (containerd, kubelet, kube-proxy, CoreDNS and an
//! image registry; see [`node`]) runs the project's images as real Pods;
//! kwok plays the kubelet of a few simulated nodes, tainted, for scale tests
//! that need pods scheduled and Ready but nothing running.

pub mod build;
pub mod compat;
pub mod kubernetes;
pub mod node;
mod pki;
mod process;

pub use kubernetes::Kubernetes;
pub use process::{Process, stop_process};

use anyhow::{Context, Result, bail, ensure};
use process::{
    api_ready, is_our_process, runs_binary, start_process, stray_processes, wait_started,
};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};
use xtask::support::cmd;
use xtask::support::kubectl::Kubectl;
use xtask::support::paths;
use xtask::support::process_group;
use xtask::{say, say_err};

/// The API server's URL.
pub const API_SERVER: &str = "https://127.0.0.1:16443";
/// The API server's port (on 127.0.0.1).
pub const API_SERVER_PORT: u16 = 16443;
const ETCD_CLIENT: &str = "http://127.0.0.1:12379";
const ETCD_PEER: &str = "http://127.0.0.1:12380";
/// How many simulated nodes `up` registers. kwok gives each room for
/// [`PODS_PER_SIMULATED_NODE`] pods: five hold the benches up to PodSet 10,000 x 1,
/// which grows to 20,000 pods when its change phase adds a replica; a larger bench
/// registers more ([`ensure_simulated_nodes`]).
const NODES: usize = 5;
/// The pods kwok lets one simulated node hold (its default `pods` capacity).
const PODS_PER_SIMULATED_NODE: u64 = 5_000;

/// Files of a running (or stopped) cluster.
pub struct Layout {
    root: PathBuf,
}

impl Layout {
    /// The layout under the user's state directory.
    pub fn new() -> Layout {
        Layout {
            root: paths::state_dir("cluster"),
        }
    }
    fn pki(&self) -> PathBuf {
        self.root.join("pki")
    }
    fn pid_file(&self, p: Process) -> PathBuf {
        self.root.join("pids").join(format!("{}.pid", p.name()))
    }
    /// The log file of a process.
    pub fn log(&self, p: Process) -> PathBuf {
        self.root.join("logs").join(format!("{}.log", p.name()))
    }
    /// The admin kubeconfig.
    pub fn kubeconfig(&self) -> PathBuf {
        self.root.join("admin.kubeconfig")
    }
    /// The cluster's own kubectl (its Kubernetes version's) with the admin kubeconfig.
    pub fn kubectl(&self) -> Result<Kubectl> {
        Ok(Kubectl::new(self.kubectl_binary()?).with_kubeconfig(self.kubeconfig()))
    }
    /// The kubectl of the cluster's Kubernetes version (the default's when there is no cluster).
    pub fn kubectl_binary(&self) -> Result<PathBuf> {
        Ok(self.kubernetes()?.binary("kubectl"))
    }
    /// The Kubernetes version of the cluster whose state this is (the default's when there
    /// is none).
    pub fn kubernetes(&self) -> Result<Kubernetes> {
        match kubernetes::of_cluster(&self.root)? {
            Some(k) => Ok(k),
            None => Kubernetes::default_version(),
        }
    }
    fn config(&self, name: &str) -> PathBuf {
        self.root.join("config").join(name)
    }

    /// Writes `manifest` to the configuration file `name` and applies it
    /// server-side as the cluster's own field manager; `force`: taking over
    /// fields another manager set.
    fn apply(&self, name: &str, manifest: &str, force: bool) -> Result<()> {
        let path = self.config(name);
        std::fs::write(&path, manifest)?;
        let mut apply = self.kubectl()?.with_args(["apply", "--server-side"]);
        if force {
            apply.arg("--force-conflicts");
        }
        cmd::output(
            apply
                .args(["--field-manager=xtask-cluster", "-f"])
                .arg(&path),
        )?;
        Ok(())
    }

    /// The pid of `p` if it runs (and really is our binary).
    pub fn running_pid(&self, p: Process) -> Option<u32> {
        let pid = process_group::read_pid(&self.pid_file(p))?;
        (is_our_process(pid) || runs_binary(self, pid, p)).then_some(pid)
    }
}

impl Default for Layout {
    fn default() -> Self {
        Layout::new()
    }
}

/// The API server's URL as the cluster's own components reach it.
pub fn api_server_url() -> String {
    API_SERVER.to_owned()
}

/// `export KUBECONFIG=...`, the line `up` ends with and `env` prints.
pub fn env_line(layout: &Layout) -> String {
    format!("export KUBECONFIG={}", layout.kubeconfig().display())
}

/// Whether every process runs and the API server is ready.
pub fn is_up(layout: &Layout) -> bool {
    // Written by the last `up` that finished: an `up` that failed half-way
    // leaves processes running but not this.
    layout.root.join("up-complete").exists()
        && Process::expected()
            .iter()
            .all(|p| layout.running_pid(*p).is_some())
        && api_ready(layout)
}

/// Builds what is missing, starts what is not running, waits until the
/// cluster serves, and returns the admin kubeconfig: the existing cluster's
/// Kubernetes version, else the default.
pub fn up() -> Result<PathBuf> {
    up_with(None)
}

/// Builds every component at `kubernetes` that the cache lacks, starting nothing.
///
/// # Errors
/// When a build fails.
pub fn build_only(kubernetes: &Kubernetes) -> Result<()> {
    let start = Instant::now();
    // The version's own binaries first: the other components are the same for every
    // version, and usually cached already.
    kubernetes.ensure_built()?;
    build::ensure_all(kubernetes)?;
    say!(
        "cluster: Kubernetes {kubernetes} built ({}); `cargo xtask cluster up --kubernetes {}` starts it",
        cmd::elapsed(start),
        kubernetes.version()
    );
    Ok(())
}

/// [`up`] at the Kubernetes version `requested` (`--kubernetes`), which must be
/// the existing cluster's if there is one (`down` removes it first).
pub fn up_with(requested: Option<&Kubernetes>) -> Result<PathBuf> {
    let start = Instant::now();
    let layout = Layout::new();
    let kubernetes = kubernetes::for_up(&layout.root, requested)?;
    if is_up(&layout) {
        say!(
            "cluster: Kubernetes {kubernetes} already running{} (`cargo xtask cluster status` shows where)",
            not_the_default(&kubernetes)
        );
        // A cluster started by an older checkout may have fewer simulated nodes.
        register_nodes(&layout, node::supported())?;
        say!("{}", env_line(&layout));
        return Ok(layout.kubeconfig());
    }
    if !cmd::on_path("curl") {
        bail!("the local cluster needs `curl` to check health: apt-get install -y curl");
    }
    let _ = std::fs::remove_file(layout.root.join("up-complete"));
    let real_node = node::supported();
    if real_node {
        node::ensure_packages()?;
    } else {
        say!(
            "cluster: not running as root, so no real node (containers need namespaces, cgroups and mounts); \
             pods run on simulated nodes only"
        );
    }
    build::ensure_all(&kubernetes)?;
    for dir in ["pids", "logs", "config", "data"] {
        std::fs::create_dir_all(layout.root.join(dir))?;
    }
    // Before anything starts: later commands run this version's binaries on this data.
    kubernetes::record(&layout.root, &kubernetes)?;
    pki::ensure(&layout.pki())?;
    write_configs(&layout)?;
    if real_node {
        node::write_configs(&layout)?;
        node::setup_network()?;
    }
    // An API server that outlived an etcd restart reconnects only when its
    // gRPC backoff (up to two minutes) next fires.
    let etcd_restarted_under_api = layout.running_pid(Process::Etcd).is_none()
        && layout.running_pid(Process::ApiServer).is_some();
    for p in Process::expected() {
        if p == Process::CoreDns {
            // What CoreDNS may read, before it starts reading.
            node::apply_cluster_objects(&layout)?;
        }
        if layout.running_pid(p).is_some() {
            continue;
        }
        start_process(&layout, p)?;
        wait_started(&layout, p)?;
    }
    if etcd_restarted_under_api && !wait_api_serves(&layout, Duration::from_secs(20)) {
        say!("cluster: the API server has not reconnected to etcd after 20 s; restarting it");
        stop_process(&layout, Process::ApiServer)?;
        start_process(&layout, Process::ApiServer)?;
        wait_started(&layout, Process::ApiServer)?;
    }
    register_nodes(&layout, real_node)?;
    if real_node {
        node::ensure_system_images()?;
    }
    wait_cluster_ready(&layout)?;
    if real_node {
        node::wait_ready(&layout)?;
    }
    std::fs::write(layout.root.join("up-complete"), "")?;
    say!(
        "cluster: Kubernetes {kubernetes}{} is up on {API_SERVER} with {}{NODES} simulated nodes ({} elapsed)",
        not_the_default(&kubernetes),
        if real_node {
            format!("a real node ({}) and ", node::NODE_NAME)
        } else {
            String::new()
        },
        cmd::elapsed(start)
    );
    say!("{}", env_line(&layout));
    Ok(layout.kubeconfig())
}

/// `" (not the default, v1.36.3)"` for a version other than the default.
fn not_the_default(kubernetes: &Kubernetes) -> String {
    match Kubernetes::default_version() {
        Ok(default) if default != *kubernetes => format!(" (not the default, {default})"),
        _ => String::new(),
    }
}

fn write_configs(layout: &Layout) -> Result<()> {
    let pki = layout.pki();
    let config = layout.root.join("config");
    for id in &pki::IDENTITIES {
        let path = pki::kubeconfig(&pki, &config, id, API_SERVER)?;
        if id.file == "admin" {
            std::fs::copy(&path, layout.kubeconfig())?;
        }
    }
    write_component_config(
        layout,
        "scheduler.yaml",
        (
            "kubescheduler.config.k8s.io/v1",
            "KubeSchedulerConfiguration",
        ),
        &layout.config("scheduler.kubeconfig"),
        "  qps: 500
  burst: 1000
leaderElection:
  leaderElect: false
",
    )?;
    Ok(())
}

/// Writes the configuration file `file` of a component: its `apiVersion`
/// and `kind`, `clientConnection` with the kubeconfig it connects with, then
/// `rest` (which may go on with `clientConnection`, indented).
fn write_component_config(
    layout: &Layout,
    file: &str,
    (api_version, kind): (&str, &str),
    kubeconfig: &Path,
    rest: &str,
) -> Result<()> {
    let text = format!(
        "apiVersion: {api_version}
kind: {kind}
clientConnection:
  kubeconfig: {}
{rest}",
        kubeconfig.display()
    );
    std::fs::write(layout.config(file), text)
        .with_context(|| format!("writing the configuration {file}"))
}

/// Whether the API server answers a read that goes through to etcd
/// (`/readyz` alone can pass while its storage client is still backing off).
fn wait_api_serves(layout: &Layout, timeout: Duration) -> bool {
    cmd::wait_until(timeout, || {
        layout.kubectl().is_ok_and(|k| {
            k.succeeds([
                "get",
                "--raw",
                "/api/v1/namespaces/default",
                "--request-timeout=3s",
            ])
        })
    })
}

/// Registers simulated nodes beside [`NODES`] until they have room for `pods` pods and a
/// tenth more (what a bench of 30,000 objects runs); returns how many there are. The
/// extra nodes stay until `cluster down`.
///
/// # Errors
/// When the cluster is not up, or the API server refuses the nodes.
pub fn ensure_simulated_nodes(pods: u64) -> Result<usize> {
    let layout = Layout::new();
    ensure!(
        is_up(&layout),
        "the local cluster is not up: `cargo xtask cluster up`"
    );
    let count = simulated_nodes_for(pods);
    if count > NODES {
        say!("cluster: {count} simulated nodes, room for {pods} pods");
        register_node_count(&layout, node::supported(), count)?;
    }
    Ok(count)
}

/// The simulated nodes that hold `pods` pods and a tenth more, at least [`NODES`].
fn simulated_nodes_for(pods: u64) -> usize {
    let wanted = (pods + pods / 10).div_ceil(PODS_PER_SIMULATED_NODE);
    usize::try_from(wanted).unwrap_or(usize::MAX).max(NODES)
}

fn register_nodes(layout: &Layout, real_node: bool) -> Result<()> {
    register_node_count(layout, real_node, NODES)
}

/// Registers the simulated nodes `kwok-node-0` to `kwok-node-<count - 1>`.
fn register_node_count(layout: &Layout, real_node: bool, count: usize) -> Result<()> {
    // Beside a real node, ordinary pods stay off the simulated ones.
    let taints = if real_node {
        format!(
            "spec:\n  taints:\n  - key: {}\n    value: fake\n    effect: NoSchedule\n",
            node::KWOK_TAINT
        )
    } else {
        String::new()
    };
    let mut manifest = String::new();
    for i in 0..count {
        manifest.push_str(&format!(
            "---
apiVersion: v1
kind: Node
metadata:
  name: kwok-node-{i}
  labels:
    type: kwok
    kubernetes.io/hostname: kwok-node-{i}
    kubernetes.io/os: linux
    kubernetes.io/arch: amd64
    node-role.kubernetes.io/agent: \"\"
  annotations:
    kwok.x-k8s.io/node: fake
    node.alpha.kubernetes.io/ttl: \"0\"
{taints}"
        ));
    }
    layout
        .apply("nodes.yaml", &manifest, false)
        .context("registering the simulated nodes")
}

fn wait_cluster_ready(layout: &Layout) -> Result<()> {
    layout
        .kubectl()?
        .output([
            "wait",
            "--for=condition=Ready",
            "node",
            "-l",
            "type=kwok",
            "--timeout=120s",
        ])
        .with_context(|| {
            format!(
                "the simulated nodes did not become Ready; see {}",
                layout.log(Process::Kwok).display()
            )
        })?;
    // Pods need their namespace's `default` ServiceAccount, which the
    // controller manager creates: wait for it so tests can start at once.
    let ok = cmd::wait_until(Duration::from_secs(60), || {
        layout
            .kubectl()
            .is_ok_and(|k| k.succeeds(["get", "serviceaccount", "default", "-n", "default"]))
    });
    if !ok {
        bail!(
            "the controller manager did not create the default ServiceAccount; see {}",
            layout.log(Process::ControllerManager).display()
        );
    }
    Ok(())
}

/// Stops every process `up` started and removes the cluster's data.
pub fn down() -> Result<()> {
    let layout = Layout::new();
    for p in Process::ALL.into_iter().rev() {
        if stop_process(&layout, p)? {
            say!("cluster: stopped {}", p.name());
        }
    }
    for pid in stray_processes(&layout) {
        say!("cluster: stopping leftover process {pid}");
        process_group::signal_process(pid, "KILL");
    }
    if node::supported() {
        node::tear_down(&layout);
    }
    if layout.root.exists() {
        std::fs::remove_dir_all(&layout.root)
            .with_context(|| format!("removing {}", layout.root.display()))?;
    }
    say!("cluster: down; its data is removed (the built binaries stay cached)");
    Ok(())
}

/// Prints what runs, where the logs are, and how to reach the cluster.
pub fn status() -> Result<()> {
    let layout = Layout::new();
    for p in Process::expected() {
        match layout.running_pid(p) {
            Some(pid) => say!(
                "{:<24} running (pid {pid})  log: {}",
                p.name(),
                layout.log(p).display()
            ),
            None => say!("{:<24} stopped", p.name()),
        }
    }
    if is_up(&layout) {
        let kubernetes = layout.kubernetes()?;
        say!("API server: {API_SERVER} (ready)");
        say!("Kubernetes: {kubernetes}{}", not_the_default(&kubernetes));
        say!("kubectl:    {}", layout.kubectl_binary()?.display());
        say!("{}", env_line(&layout));
    } else {
        say!("The cluster is not (fully) running: `cargo xtask cluster up` starts it.");
    }
    Ok(())
}

/// Prints the `export KUBECONFIG=...` line.
pub fn env() -> Result<()> {
    let layout = Layout::new();
    if !is_up(&layout) {
        say_err!("cluster: not running; `cargo xtask cluster up` starts it");
    }
    say!("{}", env_line(&layout));
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn enough_simulated_nodes_for_a_bench_and_a_tenth_more() {
        assert_eq!(simulated_nodes_for(0), NODES);
        assert_eq!(simulated_nodes_for(20_000), NODES);
        // 30,000 pods and a tenth: 33,000, on seven nodes of 5,000.
        assert_eq!(simulated_nodes_for(30_000), 7);
        assert_eq!(simulated_nodes_for(60_000), 14);
    }
}
