//! The cluster's processes: what each is, its command line, starting it,
//! waiting until it serves, telling it from other processes, stopping it.

use super::{API_SERVER, API_SERVER_PORT, ETCD_CLIENT, ETCD_PEER, Layout, build, node};
use anyhow::{Context, Result, bail};
use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;
use xtask::say;
use xtask::support::cmd;
use xtask::support::process_group;

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

    /// Its binary: Kubernetes's at the version of the cluster in `layout`.
    fn binary(self, layout: &Layout) -> Result<PathBuf> {
        match self {
            Process::Etcd => build::ETCD.binary("etcd"),
            Process::Kwok => build::KWOK.binary("kwok"),
            Process::Registry => cmd::which("docker-registry")
                .context("docker-registry is not installed (apt-get install docker-registry)"),
            Process::Containerd => build::CONTAINERD.binary("containerd"),
            Process::CoreDns => build::COREDNS.binary("coredns"),
            other => Ok(layout.kubernetes()?.binary(other.name())),
        }
    }
}

/// The executable `pid` runs, unless it is gone or a zombie (a zombie or
/// exiting process has no usable state).
fn live_exe(pid: u32) -> Option<PathBuf> {
    let exe = std::fs::read_link(format!("/proc/{pid}/exe")).ok()?;
    let state = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let zombie = state
        .rsplit_once(')')
        .is_some_and(|(_, rest)| rest.trim_start().starts_with('Z'));
    (!zombie).then_some(exe)
}

/// Whether `pid` runs one of the cached cluster binaries.
pub(super) fn is_our_process(pid: u32) -> bool {
    live_exe(pid).is_some_and(|exe| build::is_cached_binary(&exe))
}

/// Whether `pid` is alive and runs `p`'s binary (for processes whose binary
/// is not in the cache, such as Debian's registry).
pub(super) fn runs_binary(layout: &Layout, pid: u32, p: Process) -> bool {
    let (Some(exe), Ok(binary)) = (live_exe(pid), p.binary(layout)) else {
        return false;
    };
    std::fs::canonicalize(binary).is_ok_and(|b| b == exe)
}

/// Whether the API server answers `/readyz` with `ok`.
pub(super) fn api_ready(layout: &Layout) -> bool {
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

/// Whether etcd reports itself healthy.
fn etcd_ready() -> bool {
    Command::new("curl")
        .args(["-sS", "--max-time", "3", &format!("{ETCD_CLIENT}/health")])
        .stdin(Stdio::null())
        .stderr(Stdio::null())
        .output()
        .is_ok_and(|o| o.status.success() && String::from_utf8_lossy(&o.stdout).contains("true"))
}

/// The command-line arguments of `p`.
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
        Process::ControllerManager => [
            vec![format!(
                "--kubeconfig={}",
                cfg("controller-manager.kubeconfig")
            )],
            secure_serving(&cfg("controller-manager.kubeconfig"), 10257),
            vec![
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
        ]
        .concat(),
        Process::Scheduler => [
            vec![format!("--config={}", cfg("scheduler.yaml"))],
            secure_serving(&cfg("scheduler.kubeconfig"), 10259),
        ]
        .concat(),
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

/// How a controller serves on 127.0.0.1:`port`, delegating who may call it
/// to the API server with `kubeconfig`.
fn secure_serving(kubeconfig: &str, port: u16) -> Vec<String> {
    vec![
        format!("--authentication-kubeconfig={kubeconfig}"),
        format!("--authorization-kubeconfig={kubeconfig}"),
        "--bind-address=127.0.0.1".into(),
        format!("--secure-port={port}"),
    ]
}

/// Starts `p` in its own process group, logging to its log file.
pub(super) fn start_process(layout: &Layout, p: Process) -> Result<()> {
    let binary = p.binary(layout)?;
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
    say!(
        "cluster: started {} (pid {}, log {})",
        p.name(),
        child.id(),
        log_path.display()
    );
    Ok(())
}

/// The last `lines` lines of a file.
fn log_tail(path: &Path, lines: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

/// Waits until `p` runs (and, for those that can say, is ready); fails with
/// the end of its log.
pub(super) fn wait_started(layout: &Layout, p: Process) -> Result<()> {
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

/// Stops one process (used by fault-injection tests), keeping the data.
pub fn stop_process(layout: &Layout, p: Process) -> Result<bool> {
    let Some(pid) = layout.running_pid(p) else {
        return Ok(false);
    };
    let grace = process_group::Grace {
        term: Duration::from_secs(15),
        kill: Duration::from_secs(5),
    };
    // Debian's registry is not a cached binary: recognise it as `running_pid` does, or it
    // would never be signalled and outlive `down`, holding its port.
    let ours = || is_our_process(pid) || runs_binary(layout, pid, p);
    let _ = process_group::stop(pid, grace, ours, || {});
    let _ = std::fs::remove_file(layout.pid_file(p));
    Ok(true)
}

/// Every process on this machine running one of the cached cluster binaries, or serving
/// this cluster's registry (a registry an older `down` left running keeps the port, and
/// the next `up`'s registry cannot start).
pub(super) fn stray_processes(layout: &Layout) -> Vec<u32> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    let registry_config = layout.config("registry.yaml").display().to_string();
    let serves_our_registry = |pid: u32| {
        std::fs::read(format!("/proc/{pid}/cmdline")).is_ok_and(|cmdline| {
            cmdline
                .split(|b| *b == 0)
                .any(|arg| arg == registry_config.as_bytes())
        }) && runs_binary(layout, pid, Process::Registry)
    };
    entries
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            *pid != std::process::id() && (is_our_process(*pid) || serves_our_registry(*pid))
        })
        .collect()
}
