//! Installing an operator's `deploy/` tree and running its binary as a local
//! process with its own ServiceAccount's credentials.
//!
//! Pods on the local cluster are simulated (kwok runs no containers), so the
//! operator's Deployment from `deploy/` never really runs: the tests run the
//! same binary on this machine instead, authenticated with a token of the
//! operator's ServiceAccount. Everything the operator does therefore goes
//! through the RBAC rules in `deploy/`, which proves they are sufficient.

use crate::{TIMEOUT, TestNamespace, kubectl_runner, poll, target_dir, unique_suffix};
use anyhow::{Context, Result, bail};
use kube::Resource;
use kube::api::{Api, Patch, PatchParams};
use serde::de::DeserializeOwned;
use serde_json::json;
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Mutex, OnceLock};
use std::time::Duration;
use xtask::support::local_operator::{self, Launch, LocalOperator};

/// Applies `deploy/<operator>` (CRD, RBAC, Deployment...) once per test binary.
pub fn install(operator: &str) -> Result<()> {
    static DONE: OnceLock<Mutex<HashMap<String, bool>>> = OnceLock::new();
    let done = DONE.get_or_init(|| Mutex::new(HashMap::new()));
    let mut done = done
        .lock()
        .map_err(|_| anyhow::anyhow!("install lock poisoned"))?;
    if done.get(operator).copied().unwrap_or(false) {
        return Ok(());
    }
    local_operator::install(&kubectl_runner(), operator, "e2e")?;
    done.insert(operator.to_owned(), true);
    Ok(())
}

/// A kubeconfig that authenticates as the operator's ServiceAccount
/// (`<operator>` in `<operator>-system`), with a fresh token.
pub fn service_account_kubeconfig(operator: &str) -> Result<PathBuf> {
    service_account_kubeconfig_for(&format!("{operator}-system"), operator)
}

/// A kubeconfig that authenticates as ServiceAccount `namespace/name`.
pub fn service_account_kubeconfig_for(namespace: &str, name: &str) -> Result<PathBuf> {
    let path = target_dir()
        .join("e2e")
        .join(format!("{namespace}-{name}-{}.kubeconfig", unique_suffix()));
    local_operator::service_account_kubeconfig(
        &kubectl_runner(),
        namespace,
        name,
        "2h",
        None,
        &path,
    )?;
    Ok(path)
}

/// A free TCP port on 127.0.0.1.
pub fn free_port() -> Result<u16> {
    local_operator::free_port()
}

/// A plain HTTP GET on 127.0.0.1; returns the status code and body.
pub fn http_get(port: u16, path: &str) -> Result<(u16, String)> {
    xtask::support::http::get(port, path)
}

/// How to start an operator process.
pub struct OperatorOptions {
    /// Extra command-line arguments after `run`.
    pub args: Vec<String>,
    /// Extra environment variables.
    pub env: Vec<(String, String)>,
    /// Credentials; default: the operator's own ServiceAccount.
    pub kubeconfig: Option<PathBuf>,
    /// Wait for `/readyz` before returning.
    pub wait_ready: bool,
}

impl Default for OperatorOptions {
    fn default() -> Self {
        OperatorOptions {
            args: Vec::new(),
            env: Vec::new(),
            kubeconfig: None,
            wait_ready: true,
        }
    }
}

/// An operator binary running on this machine; killed when dropped.
pub struct OperatorProcess {
    process: LocalOperator,
    /// Where its stdout and stderr go.
    pub log_path: PathBuf,
    /// Port of `/metrics`.
    pub metrics_port: u16,
    /// Port of `/healthz` and `/readyz`.
    pub health_port: u16,
    /// Its rights over a leader-election lock of its own name, if it has one.
    _lock_grant: Option<crate::rbac::LockGrant>,
}

/// The leader-election lock `options` name other than the default one `deploy/` grants
/// (`--leader-election-id=<lock>`, not `<operator>-leader`), and the namespaces it may live
/// in: `--leader-election-namespace`, `POD_NAMESPACE` (leader-for-life), else
/// `<operator>-system`.
fn lock_of_its_own(operator: &str, options: &OperatorOptions) -> Option<(String, Vec<String>)> {
    let flag = |name: &str| {
        options
            .args
            .iter()
            .find_map(|a| a.strip_prefix(name)?.strip_prefix('='))
            .filter(|v| !v.is_empty())
            .map(str::to_owned)
    };
    let lock = flag("--leader-election-id").filter(|id| *id != format!("{operator}-leader"))?;
    let mut namespaces: Vec<String> = flag("--leader-election-namespace").into_iter().collect();
    if let Some((_, ns)) = options
        .env
        .iter()
        .find(|(k, v)| k == "POD_NAMESPACE" && !v.is_empty())
        && !namespaces.contains(ns)
    {
        namespaces.push(ns.clone());
    }
    if namespaces.is_empty() {
        namespaces.push(format!("{operator}-system"));
    }
    Some((lock, namespaces))
}

impl OperatorProcess {
    /// Installs `deploy/<operator>` and starts the operator watching
    /// `namespaces` (comma-joined into WATCH_NAMESPACE; empty = all).
    pub async fn start(operator: &str, namespaces: &[&str]) -> Result<OperatorProcess> {
        OperatorProcess::start_with(operator, namespaces, OperatorOptions::default()).await
    }

    /// Like [`OperatorProcess::start`], with options.
    pub async fn start_with(
        operator: &str,
        namespaces: &[&str],
        options: OperatorOptions,
    ) -> Result<OperatorProcess> {
        install(operator)?;
        // deploy/'s Roles name only the default lock: one of the test's own is granted to
        // the operator's ServiceAccount (whose token the process uses, also through a
        // kubeconfig of the test's) as a user who passes another --leader-election-id
        // grants it.
        let lock_grant = match lock_of_its_own(operator, &options) {
            Some((lock, namespaces)) => {
                Some(crate::rbac::grant_lock(operator, &lock, &namespaces)?)
            }
            None => None,
        };
        let kubeconfig = match options.kubeconfig {
            Some(path) => path,
            None => service_account_kubeconfig(operator)?,
        };
        let binary = crate::binary_dir().join(operator);
        if !binary.exists() {
            bail!(
                "{} is not built: run `cargo build --bins` (cargo xtask test does)",
                binary.display()
            );
        }
        let logs = target_dir().join("e2e-logs");
        std::fs::create_dir_all(&logs)?;
        let label = namespaces.first().copied().unwrap_or("all");
        let log_path = logs.join(format!("{label}-{operator}-{}.log", unique_suffix()));
        let process = LocalOperator::spawn(Launch {
            binary: &binary,
            kubeconfig: &kubeconfig,
            watch_namespace: &namespaces.join(","),
            log_path: &log_path,
            args: &options.args,
            env: &options.env,
        })?;
        let mut process = OperatorProcess {
            log_path,
            metrics_port: process.metrics_port,
            health_port: process.health_port,
            process,
            _lock_grant: lock_grant,
        };
        if options.wait_ready {
            process.wait_ready().await?;
        }
        Ok(process)
    }

    /// Waits until `/readyz` answers 200.
    pub async fn wait_ready(&mut self) -> Result<()> {
        let result = poll("operator /readyz", Duration::from_secs(60), || {
            let exited = self.process.exited();
            let ready = exited.is_none() && self.process.ready();
            async move {
                if let Some(status) = exited {
                    bail!("the operator exited ({status})");
                }
                Ok(ready.then_some(()))
            }
        })
        .await;
        result.with_context(|| format!("operator log:\n{}", self.log()))?;
        Ok(())
    }

    /// The process id.
    pub fn pid(&self) -> u32 {
        self.process.pid()
    }

    /// Everything the operator logged so far.
    pub fn log(&self) -> String {
        self.process.log()
    }

    /// The `/metrics` text.
    pub fn metrics(&self) -> Result<String> {
        let (code, body) = self.process.metrics()?;
        if code != 200 {
            bail!("/metrics answered {code}");
        }
        Ok(body)
    }

    /// How many reconciles it counted so far (`controller_runtime_reconcile_total`), in
    /// the series with all of `labels` (none = all).
    pub fn reconciles(&self, labels: &[(&str, &str)]) -> Result<f64> {
        Ok(metric_sum(
            &self.metrics()?,
            "controller_runtime_reconcile_total",
            labels,
        ))
    }

    /// Sends SIGTERM and waits for the exit; returns whether it exited 0.
    pub fn terminate(&mut self) -> Result<bool> {
        self.process.terminate()
    }

    /// SIGKILL, at once.
    pub fn kill(&mut self) {
        self.process.kill();
    }

    /// Whether it still runs.
    pub fn is_running(&mut self) -> bool {
        self.process.exited().is_none()
    }

    /// The TCP connections it holds open to the API server, from `/proc`: its sockets
    /// (`/proc/<pid>/fd`) that `/proc/<pid>/net/tcp{,6}` lists as established to the
    /// port of the server in the tests' kubeconfig.
    pub fn api_server_connections(&self) -> Result<usize> {
        connections_to(self.pid(), server_port(&crate::kubeconfig_path()?)?)
    }
}

/// The port of the cluster's server URL in a kubeconfig.
pub fn server_port(kubeconfig: &std::path::Path) -> Result<u16> {
    let config = kube::config::Kubeconfig::read_from(kubeconfig)?;
    config
        .clusters
        .first()
        .and_then(|c| c.cluster.as_ref()?.server.as_deref())
        .and_then(|url| url.rsplit_once(':'))
        .and_then(|(_, port)| port.trim_end_matches('/').parse().ok())
        .with_context(|| format!("no server port in {}", kubeconfig.display()))
}

/// The established TCP connections of process `pid` to remote port `port`.
fn connections_to(pid: u32, port: u16) -> Result<usize> {
    let mut sockets = std::collections::HashSet::new();
    for fd in std::fs::read_dir(format!("/proc/{pid}/fd"))? {
        let target = std::fs::read_link(fd?.path()).unwrap_or_default();
        if let Some(inode) = target
            .to_string_lossy()
            .strip_prefix("socket:[")
            .and_then(|rest| rest.strip_suffix(']'))
        {
            sockets.insert(inode.to_owned());
        }
    }
    let remote_port = format!(":{port:04X}");
    let mut count = 0;
    for table in ["tcp", "tcp6"] {
        let text = std::fs::read_to_string(format!("/proc/{pid}/net/{table}"))?;
        for line in text.lines().skip(1) {
            // sl local_address rem_address st tx:rx tr:when retrnsmt uid timeout inode
            let fields: Vec<&str> = line.split_whitespace().collect();
            let (Some(remote), Some(state), Some(inode)) =
                (fields.get(2), fields.get(3), fields.get(9))
            else {
                continue;
            };
            if remote.ends_with(&remote_port) && *state == "01" && sockets.contains(*inode) {
                count += 1;
            }
        }
    }
    Ok(count)
}

/// Sets the annotation `e2e/touch` of the object `name` to `value` (its metadata, not its
/// spec: no new generation) and waits until `op` has reconciled since (its reconciles in
/// the series with `labels` went up). Returns the object as the patch left it.
pub async fn touch_and_wait_reconcile<K>(
    api: &Api<K>,
    op: &OperatorProcess,
    name: &str,
    value: &str,
    labels: &[(&str, &str)],
) -> Result<K>
where
    K: Resource + Clone + DeserializeOwned + std::fmt::Debug,
{
    let before = op.reconciles(labels)?;
    let touched = api
        .patch(
            name,
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"annotations": {"e2e/touch": value}}})),
        )
        .await?;
    poll("a reconcile after the touch", TIMEOUT, || async {
        Ok((op.reconciles(labels)? > before).then_some(()))
    })
    .await?;
    Ok(touched)
}

/// Sends a signal (by name, e.g. `TERM`) to a process.
pub fn signal(pid: u32, name: &str) {
    xtask::support::process_group::signal_process(pid, name);
}

/// Sum of a Prometheus counter's samples whose labels contain all of `labels`
/// (`name{a="b"}`-style lines; no labels given = every sample of `name`).
pub fn metric_sum(text: &str, name: &str, labels: &[(&str, &str)]) -> f64 {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| {
            let (series, value) = l.rsplit_once(' ')?;
            let (metric, rest) = series.split_once('{').unwrap_or((series, ""));
            (metric == name
                && labels
                    .iter()
                    .all(|(k, v)| rest.contains(&format!("{k}=\"{v}\""))))
            .then(|| value.parse::<f64>().ok())
            .flatten()
        })
        .sum()
}

/// Two namespaces, `<prefix>-watched` and `<prefix>-other`, and `operator` running with
/// only the first as its watched namespace: the setup of every "outside the watched
/// namespace" test.
pub async fn watching_one(
    operator: &str,
    prefix: &str,
) -> Result<(TestNamespace, TestNamespace, OperatorProcess)> {
    let watched = TestNamespace::new(&format!("{prefix}-watched")).await?;
    let other = TestNamespace::new(&format!("{prefix}-other")).await?;
    let op = OperatorProcess::start(operator, &[&watched.name]).await?;
    Ok((watched, other, op))
}
