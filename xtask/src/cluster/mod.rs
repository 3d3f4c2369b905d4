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
pub mod node;
mod pki;

use crate::cmd;
use crate::paths;
use anyhow::{Context, Result, bail};
use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};
use xtask::kubectl::Kubectl;
use xtask::process_group;

/// The API server's URL.
pub const API_SERVER: &str = "https://127.0.0.1:16443";
/// The API server's port (on 127.0.0.1).
pub const API_SERVER_PORT: u16 = 16443;
const ETCD_CLIENT: &str = "http://127.0.0.1:12379";
const ETCD_PEER: &str = "http://127.0.0.1:12380";
/// How many simulated nodes `up` registers. kwok gives each room for 5,000
/// pods: five hold the largest bench (PodSet 10,000 x 1, which grows to
/// 20,000 pods when its change phase adds a replica).
const NODES: usize = 5;

/// The processes of the cluster, in start order.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Process {
    /// The key-value store.
    Etcd,
    /// The API server.
    ApiServer,
    /// Garbage collection, Deployments, ReplicaSets, service accounts...
    ControllerManager,
    /// Binds pods to nodes.
    Scheduler,
    /// Simulates the kubelets of the nodes.
    Kwok,
    /// The image registry of the real node (Debian's `docker-registry`).
    Registry,
    /// The real node's container runtime.
    Containerd,
    /// The real node's kubelet.
    Kubelet,
    /// Services and NodePorts on the real node.
    KubeProxy,
    /// Cluster DNS.
    CoreDns,
}

impl Process {
    /// Every process, in start order.
    pub const ALL: [Process; 10] = [
        Process::Etcd,
        Process::ApiServer,
        Process::ControllerManager,
        Process::Scheduler,
        Process::Kwok,
        Process::Registry,
        Process::Containerd,
        Process::Kubelet,
        Process::KubeProxy,
        Process::CoreDns,
    ];

    /// Whether this process belongs to the real node.
    pub fn is_node(self) -> bool {
        matches!(
            self,
            Process::Registry
                | Process::Containerd
                | Process::Kubelet
                | Process::KubeProxy
                | Process::CoreDns
        )
    }

    /// The processes this machine runs: the real node's only where it can
    /// run (as root).
    pub fn expected() -> Vec<Process> {
        let node = node::supported();
        Process::ALL
            .into_iter()
            .filter(|p| node || !p.is_node())
            .collect()
    }

    /// The name used for its binary, log and pid file.
    pub fn name(self) -> &'static str {
        match self {
            Process::Etcd => "etcd",
            Process::ApiServer => "kube-apiserver",
            Process::ControllerManager => "kube-controller-manager",
            Process::Scheduler => "kube-scheduler",
            Process::Kwok => "kwok",
            Process::Registry => "registry",
            Process::Containerd => "containerd",
            Process::Kubelet => "kubelet",
            Process::KubeProxy => "kube-proxy",
            Process::CoreDns => "coredns",
        }
    }

    /// Parses a process name as the command line gives it.
    pub fn parse(name: &str) -> Result<Process> {
        Process::ALL
            .into_iter()
            .find(|p| p.name() == name || p.name().trim_start_matches("kube-") == name)
            .with_context(|| {
                format!(
                    "unknown cluster process `{name}`; expected one of: {}",
                    Process::ALL.map(Process::name).join(", ")
                )
            })
    }

    fn binary(self) -> Result<PathBuf> {
        match self {
            Process::Etcd => build::ETCD.binary("etcd"),
            Process::Kwok => build::KWOK.binary("kwok"),
            Process::Registry => cmd::which("docker-registry")
                .context("docker-registry is not installed (apt-get install docker-registry)"),
            Process::Containerd => build::CONTAINERD.binary("containerd"),
            Process::CoreDns => build::COREDNS.binary("coredns"),
            other => build::KUBERNETES.binary(other.name()),
        }
    }
}

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
    /// The cluster's own kubectl with the admin kubeconfig.
    pub fn kubectl(&self) -> Result<Kubectl> {
        Ok(Kubectl::new(build::kubectl()?).with_kubeconfig(self.kubeconfig()))
    }
    fn config(&self, name: &str) -> PathBuf {
        self.root.join("config").join(name)
    }

    /// The pid of `p` if it runs (and really is our binary).
    pub fn running_pid(&self, p: Process) -> Option<u32> {
        let pid = process_group::read_pid(&self.pid_file(p))?;
        (is_our_process(pid) || runs_binary(pid, p)).then_some(pid)
    }
}

impl Default for Layout {
    fn default() -> Self {
        Layout::new()
    }
}

/// Whether `pid` runs one of the cached cluster binaries.
fn is_our_process(pid: u32) -> bool {
    let Ok(exe) = std::fs::read_link(format!("/proc/{pid}/exe")) else {
        return false;
    };
    // A zombie or exiting process has no usable state.
    let state = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let zombie = state
        .rsplit_once(')')
        .is_some_and(|(_, rest)| rest.trim_start().starts_with('Z'));
    !zombie && build::is_cached_binary(&exe)
}

/// Whether `pid` is alive and runs `p`'s binary (for processes whose binary
/// is not in the cache, such as Debian's registry).
fn runs_binary(pid: u32, p: Process) -> bool {
    let (Ok(exe), Ok(binary)) = (std::fs::read_link(format!("/proc/{pid}/exe")), p.binary()) else {
        return false;
    };
    let state = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let zombie = state
        .rsplit_once(')')
        .is_some_and(|(_, rest)| rest.trim_start().starts_with('Z'));
    !zombie && std::fs::canonicalize(binary).is_ok_and(|b| b == exe)
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

fn api_ready(layout: &Layout) -> bool {
    let pki = layout.pki();
    let out = Command::new("curl")
        .args(["-sS", "--max-time", "3", "--cacert"])
        .arg(pki.join("ca.crt"))
        .arg("--cert")
        .arg(pki.join("admin.crt"))
        .arg("--key")
        .arg(pki.join("admin.key"))
        .arg(format!("{API_SERVER}/readyz"))
        .stdin(Stdio::null())
        .stderr(Stdio::null())
        .output();
    out.is_ok_and(|o| o.status.success() && o.stdout.starts_with(b"ok"))
}

fn etcd_ready() -> bool {
    Command::new("curl")
        .args(["-sS", "--max-time", "3", &format!("{ETCD_CLIENT}/health")])
        .stdin(Stdio::null())
        .stderr(Stdio::null())
        .output()
        .is_ok_and(|o| o.status.success() && String::from_utf8_lossy(&o.stdout).contains("true"))
}

/// Builds what is missing, starts what is not running, waits until the
/// cluster serves, and returns the admin kubeconfig.
pub fn up() -> Result<PathBuf> {
    let start = Instant::now();
    let layout = Layout::new();
    if is_up(&layout) {
        println!("cluster: already running (`cargo xtask cluster status` shows where)");
        // A cluster started by an older checkout may have fewer simulated nodes.
        register_nodes(&layout, node::supported())?;
        println!("{}", env_line(&layout));
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
        println!(
            "cluster: not running as root, so no real node (containers need namespaces, cgroups and mounts); \
             pods run on simulated nodes only"
        );
    }
    build::ensure_all()?;
    for dir in ["pids", "logs", "config", "data"] {
        std::fs::create_dir_all(layout.root.join(dir))?;
    }
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
        println!("cluster: the API server has not reconnected to etcd after 20 s; restarting it");
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
    println!(
        "cluster: Kubernetes {} is up on {API_SERVER} with {}{NODES} simulated nodes ({} elapsed)",
        build::KUBERNETES.version()?,
        if real_node {
            format!("a real node ({}) and ", node::NODE_NAME)
        } else {
            String::new()
        },
        cmd::elapsed(start)
    );
    println!("{}", env_line(&layout));
    Ok(layout.kubeconfig())
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
    std::fs::write(
        layout.config("scheduler.yaml"),
        format!(
            "apiVersion: kubescheduler.config.k8s.io/v1
kind: KubeSchedulerConfiguration
clientConnection:
  kubeconfig: {}
  qps: 500
  burst: 1000
leaderElection:
  leaderElect: false
",
            layout.config("scheduler.kubeconfig").display()
        ),
    )?;
    Ok(())
}

fn process_args(layout: &Layout, p: Process) -> Result<Vec<String>> {
    let pki = layout.pki();
    let pki = |f: &str| pki.join(f).display().to_string();
    let cfg = |f: &str| layout.config(f).display().to_string();
    let data = layout.root.join("data").join("etcd").display().to_string();
    let args: Vec<String> = match p {
        Process::Etcd => vec![
            "--name=local".into(),
            format!("--data-dir={data}"),
            format!("--listen-client-urls={ETCD_CLIENT}"),
            format!("--advertise-client-urls={ETCD_CLIENT}"),
            format!("--listen-peer-urls={ETCD_PEER}"),
            format!("--initial-advertise-peer-urls={ETCD_PEER}"),
            format!("--initial-cluster=local={ETCD_PEER}"),
            "--listen-metrics-urls=http://127.0.0.1:12381".into(),
            // Test data only: durability across power loss is not needed.
            "--unsafe-no-fsync=true".into(),
            "--quota-backend-bytes=8589934592".into(),
            "--log-level=warn".into(),
        ],
        Process::ApiServer => vec![
            format!("--etcd-servers={ETCD_CLIENT}"),
            "--bind-address=127.0.0.1".into(),
            // The address pods reach it at (see `node`): the `kubernetes`
            // Service's endpoint must not be a loopback address.
            format!(
                "--advertise-address={}",
                if node::supported() {
                    node::NODE_IP
                } else {
                    "127.0.0.1"
                }
            ),
            format!("--secure-port={API_SERVER_PORT}"),
            format!("--kubelet-client-certificate={}", pki("admin.crt")),
            format!("--kubelet-client-key={}", pki("admin.key")),
            "--kubelet-preferred-address-types=InternalIP".into(),
            format!("--client-ca-file={}", pki("ca.crt")),
            format!("--tls-cert-file={}", pki("apiserver.crt")),
            format!("--tls-private-key-file={}", pki("apiserver.key")),
            "--service-account-issuer=https://kubernetes.default.svc.cluster.local".into(),
            format!("--service-account-key-file={}", pki("sa.pub")),
            format!("--service-account-signing-key-file={}", pki("sa.key")),
            "--service-cluster-ip-range=10.96.0.0/16".into(),
            "--service-node-port-range=30000-32767".into(),
            "--authorization-mode=Node,RBAC".into(),
            // PodNodeSelector and PodTolerationRestriction let a namespace
            // send its pods to the simulated nodes (`node::SIMULATED_NAMESPACE_ANNOTATIONS`).
            "--enable-admission-plugins=NodeRestriction,PodNodeSelector,PodTolerationRestriction"
                .into(),
            "--allow-privileged=false".into(),
            "--profiling=false".into(),
            "--max-requests-inflight=1000".into(),
            "--max-mutating-requests-inflight=500".into(),
        ],
        Process::ControllerManager => vec![
            format!("--kubeconfig={}", cfg("controller-manager.kubeconfig")),
            format!(
                "--authentication-kubeconfig={}",
                cfg("controller-manager.kubeconfig")
            ),
            format!(
                "--authorization-kubeconfig={}",
                cfg("controller-manager.kubeconfig")
            ),
            "--bind-address=127.0.0.1".into(),
            "--secure-port=10257".into(),
            "--leader-elect=false".into(),
            "--use-service-account-credentials=true".into(),
            format!("--service-account-private-key-file={}", pki("sa.key")),
            format!("--root-ca-file={}", pki("ca.crt")),
            format!("--cluster-signing-cert-file={}", pki("ca.crt")),
            format!("--cluster-signing-key-file={}", pki("ca.key")),
            "--controllers=*,-nodeipam".into(),
            "--kube-api-qps=500".into(),
            "--kube-api-burst=1000".into(),
            "--concurrent-deployment-syncs=10".into(),
            "--concurrent-replicaset-syncs=10".into(),
            "--concurrent-gc-syncs=40".into(),
        ],
        Process::Scheduler => vec![
            format!("--config={}", cfg("scheduler.yaml")),
            format!(
                "--authentication-kubeconfig={}",
                cfg("scheduler.kubeconfig")
            ),
            format!("--authorization-kubeconfig={}", cfg("scheduler.kubeconfig")),
            "--bind-address=127.0.0.1".into(),
            "--secure-port=10259".into(),
        ],
        Process::Kwok => vec![
            format!("--kubeconfig={}", cfg("kwok.kubeconfig")),
            format!(
                "--config={}",
                build::KWOK.module_dir().join("stages.yaml").display()
            ),
            "--manage-nodes-with-label-selector=type=kwok".into(),
            "--cidr=10.244.0.0/16".into(),
            "--node-ip=10.0.0.1".into(),
            "--server-address=127.0.0.1:10247".into(),
            "--node-lease-duration-seconds=40".into(),
        ],
        node_process => node::process_args(layout, node_process)?,
    };
    Ok(args)
}

fn start_process(layout: &Layout, p: Process) -> Result<()> {
    let binary = p.binary()?;
    let log_path = layout.log(p);
    let log = File::options()
        .create(true)
        .append(true)
        .open(&log_path)
        .with_context(|| format!("opening {}", log_path.display()))?;
    let mut command = Command::new(&binary);
    command
        .args(process_args(layout, p)?)
        .stdin(Stdio::null())
        .stdout(log.try_clone()?)
        .stderr(log);
    // Its own process group: it outlives this command and `down` can stop
    // it (and anything it spawned) as one.
    let child = process_group::spawn(&mut command)
        .with_context(|| format!("starting {}", binary.display()))?;
    process_group::write_pid(&layout.pid_file(p), child.id())?;
    println!(
        "cluster: started {} (pid {}, log {})",
        p.name(),
        child.id(),
        log_path.display()
    );
    Ok(())
}

fn log_tail(path: &Path, lines: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

fn wait_started(layout: &Layout, p: Process) -> Result<()> {
    let (timeout, ready): (Duration, Box<dyn Fn() -> bool>) = match p {
        Process::Etcd => (Duration::from_secs(60), Box::new(etcd_ready)),
        Process::ApiServer => (Duration::from_secs(120), Box::new(|| api_ready(layout))),
        Process::Registry => (Duration::from_secs(20), Box::new(node::registry_ready)),
        Process::Containerd => (
            Duration::from_secs(30),
            Box::new(|| node::containerd_ready(layout)),
        ),
        Process::CoreDns => (Duration::from_secs(30), Box::new(node::coredns_ready)),
        _ => (Duration::from_secs(2), Box::new(|| false)),
    };
    let ok = cmd::wait_until(timeout, || layout.running_pid(p).is_none() || ready());
    let must_be_ready = matches!(
        p,
        Process::Etcd
            | Process::ApiServer
            | Process::Registry
            | Process::Containerd
            | Process::CoreDns
    );
    if layout.running_pid(p).is_none() || (!ok && must_be_ready) {
        bail!(
            "{} did not start; the end of {}:\n{}",
            p.name(),
            layout.log(p).display(),
            log_tail(&layout.log(p), 30)
        );
    }
    Ok(())
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

fn register_nodes(layout: &Layout, real_node: bool) -> Result<()> {
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
    for i in 0..NODES {
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
    let path = layout.config("nodes.yaml");
    std::fs::write(&path, manifest)?;
    cmd::output(
        layout
            .kubectl()?
            .with_args([
                "apply",
                "--server-side",
                "--field-manager=xtask-cluster",
                "-f",
            ])
            .arg(&path),
    )
    .context("registering the simulated nodes")?;
    Ok(())
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

/// Stops one process (used by fault-injection tests), keeping the data.
pub fn stop_process(layout: &Layout, p: Process) -> Result<bool> {
    let Some(pid) = layout.running_pid(p) else {
        return Ok(false);
    };
    let grace = process_group::Grace {
        term: Duration::from_secs(15),
        kill: Duration::from_secs(5),
    };
    let _ = process_group::stop(pid, grace, || is_our_process(pid), || {});
    let _ = std::fs::remove_file(layout.pid_file(p));
    Ok(true)
}

/// Every process on this machine running one of the cached cluster binaries.
fn stray_processes() -> Vec<u32> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| *pid != std::process::id() && is_our_process(*pid))
        .collect()
}

/// Stops every process `up` started and removes the cluster's data.
pub fn down() -> Result<()> {
    let layout = Layout::new();
    for p in Process::ALL.into_iter().rev() {
        if stop_process(&layout, p)? {
            println!("cluster: stopped {}", p.name());
        }
    }
    for pid in stray_processes() {
        println!("cluster: stopping leftover process {pid}");
        process_group::signal_process(pid, "KILL");
    }
    if node::supported() {
        node::tear_down(&layout);
    }
    if layout.root.exists() {
        std::fs::remove_dir_all(&layout.root)
            .with_context(|| format!("removing {}", layout.root.display()))?;
    }
    println!("cluster: down; its data is removed (the built binaries stay cached)");
    Ok(())
}

/// Prints what runs, where the logs are, and how to reach the cluster.
pub fn status() -> Result<()> {
    let layout = Layout::new();
    for p in Process::expected() {
        match layout.running_pid(p) {
            Some(pid) => println!(
                "{:<24} running (pid {pid})  log: {}",
                p.name(),
                layout.log(p).display()
            ),
            None => println!("{:<24} stopped", p.name()),
        }
    }
    if is_up(&layout) {
        println!("API server: {API_SERVER} (ready)");
        println!("kubectl:    {}", build::kubectl()?.display());
        println!("{}", env_line(&layout));
    } else {
        println!("The cluster is not (fully) running: `cargo xtask cluster up` starts it.");
    }
    Ok(())
}

/// Prints the `export KUBECONFIG=...` line.
pub fn env() -> Result<()> {
    let layout = Layout::new();
    if !is_up(&layout) {
        eprintln!("cluster: not running; `cargo xtask cluster up` starts it");
    }
    println!("{}", env_line(&layout));
    Ok(())
}
