//! Running an operator as a process on this machine with its own ServiceAccount's
//! token, as the end-to-end tests and `cargo xtask bench operator` do.
//!
//! Pods on the local cluster are simulated, so the operator's Deployment from
//! `deploy/` never really runs: the same binary runs here instead, authenticated as
//! the operator's ServiceAccount, so everything it does goes through the RBAC rules
//! in `deploy/`.

use crate::say_err;
use crate::support::kubectl::Kubectl;
use crate::support::{http, kustomize, logged_requests, paths, process_group, simulated};
use anyhow::{Context, Result};
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::Duration;

/// The node name of the local cluster's real node (pods there really run).
const REAL_NODE: &str = "real-node";

/// Creates `namespace` if it is missing and decides where its pods go: to the
/// simulated nodes (`simulated`), or to the real node. Pods that already exist stay
/// where they are, except that a namespace placed on the simulated nodes loses its
/// pods on the real node (their controllers place them again).
///
/// # Errors
/// When kubectl fails to annotate it.
pub fn place_namespace(kubectl: &Kubectl, namespace: &str, simulated: bool) -> Result<()> {
    let exists = kubectl.succeeds(["get", "namespace", namespace]);
    if !exists {
        // Another test may create it at the same moment.
        let _ = kubectl.output(["create", "namespace", namespace]);
    }
    let mut args = vec![
        "annotate".to_owned(),
        "namespace".to_owned(),
        namespace.to_owned(),
        "--overwrite".to_owned(),
    ];
    for (key, value) in simulated::NAMESPACE_ANNOTATIONS {
        args.push(if simulated {
            format!("{key}={value}")
        } else {
            format!("{key}-")
        });
    }
    kubectl.output(args)?;
    if simulated && exists {
        // A pod placed on the real node before the namespace was marked simulated (by
        // `cargo xtask deploy`, or a bench on the same cluster) may never become ready
        // here: its controller places it again, on a simulated node.
        let _ = kubectl.output([
            "delete",
            "pods",
            "-n",
            namespace,
            &format!("--field-selector=spec.nodeName={REAL_NODE}"),
            "--wait=false",
        ]);
    }
    Ok(())
}

/// Installs `deploy/<operator>` (CRD, RBAC, Deployment...) as `field_manager`, with
/// `<operator>-system` on the simulated nodes (the tree's own Deployment is only
/// admitted there, never run beside the local process), and waits until the CRD is
/// served.
///
/// # Errors
/// When kubectl fails.
pub fn install(kubectl: &Kubectl, operator: &str, field_manager: &str) -> Result<()> {
    let dir = paths::repo_root().join("deploy").join(operator);
    install_tree(kubectl, operator, &dir, field_manager)
}

/// [`install`] of the tree `dir` (another checkout's `deploy/<operator>`, such as the
/// scratch copy the scaffolding test makes).
///
/// # Errors
/// When kubectl fails.
pub fn install_tree(
    kubectl: &Kubectl,
    operator: &str,
    dir: &Path,
    field_manager: &str,
) -> Result<()> {
    place_namespace(kubectl, &format!("{operator}-system"), true)?;
    kustomize::apply(kubectl, dir, Some(field_manager))?;
    // The CRD must be served before anyone creates objects of its kind.
    kubectl.output([
        "wait".as_ref(),
        "--for=condition=Established".as_ref(),
        "--timeout=60s".as_ref(),
        "-f".as_ref(),
        dir.join("crd.yaml").as_os_str(),
    ])?;
    Ok(())
}

/// Writes to `path` a kubeconfig for the cluster of `kubectl`'s kubeconfig that
/// authenticates as ServiceAccount `namespace/name` with a fresh token valid for
/// `duration` (`2h`), with `default_namespace` as its context's namespace when given.
///
/// # Errors
/// When kubectl has no kubeconfig or fails, or the file cannot be written.
pub fn service_account_kubeconfig(
    kubectl: &Kubectl,
    namespace: &str,
    name: &str,
    duration: &str,
    default_namespace: Option<&str>,
    path: &Path,
) -> Result<()> {
    let admin = kubectl
        .kubeconfig()
        .context("a ServiceAccount's kubeconfig needs the admin kubeconfig")?;
    let token = kubectl.output([
        "create",
        "token",
        name,
        "-n",
        namespace,
        &format!("--duration={duration}"),
    ])?;
    let config = crate::support::kubeconfig::for_service_account(
        admin,
        namespace,
        name,
        &token,
        default_namespace,
    )?;
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    crate::support::kubeconfig::write(&config, path)
}

/// A free TCP port on 127.0.0.1.
///
/// # Errors
/// When no port can be bound.
pub fn free_port() -> Result<u16> {
    // Not a port the kernel hands out (`bind` to port 0 gives one of the ephemeral range,
    // 32768-60999, which every outgoing connection takes from too: between this probe and
    // the child's own bind, kubectl or a client could take it). Below the NodePort range
    // (30000-32767), which kube-proxy forwards on this machine's addresses. Each call
    // starts after the last one, so a process hands out a port once per lap.
    const FIRST: u16 = 20000;
    const COUNT: u16 = 10000;
    static NEXT: std::sync::atomic::AtomicU16 = std::sync::atomic::AtomicU16::new(0);
    let seed = u16::try_from(std::process::id() % u32::from(COUNT)).unwrap_or(0);
    for _ in 0..COUNT {
        let step = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed) % COUNT;
        let port = FIRST + (seed + step) % COUNT;
        if TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return Ok(port);
        }
    }
    anyhow::bail!("no free port in 127.0.0.1:{FIRST}-{}", FIRST + COUNT - 1)
}

/// How to start an operator's binary.
#[derive(Debug, Clone, Copy)]
pub struct Launch<'a> {
    /// The operator's binary.
    pub binary: &'a Path,
    /// Its credentials (a ServiceAccount's kubeconfig).
    pub kubeconfig: &'a Path,
    /// `WATCH_NAMESPACE` (comma-separated; empty = all).
    pub watch_namespace: &'a str,
    /// Where its stdout and stderr go (created afresh).
    pub log_path: &'a Path,
    /// Extra command-line arguments after the standard ones.
    pub args: &'a [String],
    /// Extra environment variables.
    pub env: &'a [(String, String)],
}

/// An operator binary running on this machine (`run`, JSON logs with one debug line
/// per API request, metrics and probes on free ports of 127.0.0.1); SIGKILL when
/// dropped.
pub struct LocalOperator {
    child: Child,
    /// Where its stdout and stderr go.
    pub log_path: PathBuf,
    /// Port of `/metrics`.
    pub metrics_port: u16,
    /// Port of `/healthz` and `/readyz`.
    pub health_port: u16,
}

impl LocalOperator {
    /// Starts the operator as `launch` says.
    ///
    /// # Errors
    /// When the log cannot be created or the binary cannot start.
    pub fn spawn(launch: Launch<'_>) -> Result<Self> {
        Self::start(launch, false)
    }

    /// Like [`LocalOperator::spawn`], in a process group of its own: Ctrl-C in the
    /// terminal does not reach it, so whoever started it can still use it while cleaning
    /// up (the demo deletes its samples while their operators remove the finalizers).
    ///
    /// # Errors
    /// When the log cannot be created or the binary cannot start.
    pub fn spawn_own_group(launch: Launch<'_>) -> Result<Self> {
        Self::start(launch, true)
    }

    fn start(launch: Launch<'_>, own_group: bool) -> Result<Self> {
        let metrics_port = free_port()?;
        let health_port = free_port()?;
        let log = std::fs::File::create(launch.log_path)
            .with_context(|| format!("creating {}", launch.log_path.display()))?;
        let mut command = Command::new(launch.binary);
        command
            .arg("run")
            .arg(format!("--metrics-bind-address=127.0.0.1:{metrics_port}"))
            .arg(format!(
                "--health-probe-bind-address=127.0.0.1:{health_port}"
            ))
            // JSON lines, with one debug line per API request: the bench counts them,
            // the RBAC test derives what each operator needs from them.
            .arg("--log-format=json")
            .args(launch.args)
            .env("KUBECONFIG", launch.kubeconfig)
            .env("WATCH_NAMESPACE", launch.watch_namespace)
            .env("RUST_LOG", logged_requests::RUST_LOG)
            .envs(launch.env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log);
        let child = if own_group {
            process_group::spawn(&mut command)
        } else {
            command.spawn()
        }
        .with_context(|| format!("starting {}", launch.binary.display()))?;
        Ok(Self {
            child,
            log_path: launch.log_path.to_owned(),
            metrics_port,
            health_port,
        })
    }

    /// The process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// How it exited, if it did.
    pub fn exited(&mut self) -> Option<ExitStatus> {
        self.child.try_wait().ok().flatten()
    }

    /// Whether `/readyz` answers 200 now.
    pub fn ready(&self) -> bool {
        http::get(self.health_port, "/readyz").is_ok_and(|(code, _)| code == 200)
    }

    /// The `/metrics` answer: status code and text.
    ///
    /// # Errors
    /// When nothing answers.
    pub fn metrics(&self) -> Result<(u16, String)> {
        http::get(self.metrics_port, "/metrics")
    }

    /// Everything it logged so far.
    pub fn log(&self) -> String {
        String::from_utf8_lossy(&std::fs::read(&self.log_path).unwrap_or_default()).into_owned()
    }

    /// Sends SIGTERM and waits for the exit; returns whether it exited 0.
    ///
    /// # Errors
    /// When waiting fails.
    pub fn terminate(&mut self) -> Result<bool> {
        process_group::signal_process(self.pid(), "TERM");
        Ok(self.child.wait()?.success())
    }

    /// SIGTERM, up to `grace` to exit, then SIGKILL (nothing once it has exited).
    pub fn stop(&mut self, grace: Duration) {
        if let Err(e) = process_group::stop_child(&mut self.child, grace) {
            say_err!("{}: {e:#}", self.log_path.display());
        }
    }

    /// SIGKILL, at once (and reaps it).
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for LocalOperator {
    fn drop(&mut self) {
        self.kill();
    }
}
