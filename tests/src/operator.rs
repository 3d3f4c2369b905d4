//! Installing an operator's `deploy/` tree and running its binary as a local
//! process with its own ServiceAccount's credentials.
//!
//! Pods on the local cluster are simulated (kwok runs no containers), so the
//! operator's Deployment from `deploy/` never really runs: the tests run the
//! same binary on this machine instead, authenticated with a token of the
//! operator's ServiceAccount. Everything the operator does therefore goes
//! through the RBAC rules in `deploy/`, which proves they are sufficient.

use crate::{TIMEOUT, kubeconfig_path, kubectl_ok, poll, repo_root, target_dir, unique_suffix};
use anyhow::{Context, Result, bail};
use kube::Resource;
use kube::api::{Api, Patch, PatchParams};
use serde::de::DeserializeOwned;
use serde_json::json;
use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::{Mutex, OnceLock};
use std::time::Duration;

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
    let dir = repo_root().join("deploy").join(operator);
    // The operators under test run as local processes: the tree's own
    // Deployment is only admitted and simulated, never run beside them.
    crate::place_namespace(&format!("{operator}-system"), true)?;
    kubectl_ok([
        "apply".as_ref(),
        "--server-side".as_ref(),
        "--force-conflicts".as_ref(),
        "--field-manager=e2e".as_ref(),
        "-k".as_ref(),
        dir.as_os_str(),
    ])?;
    // The CRD must be served before anyone creates objects of its kind.
    kubectl_ok([
        "wait",
        "--for=condition=Established",
        "--timeout=60s",
        "-f",
        &repo_root()
            .join("deploy")
            .join(operator)
            .join("crd.yaml")
            .display()
            .to_string(),
    ])?;
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
    let token = kubectl_ok(["create", "token", name, "-n", namespace, "--duration=2h"])?;
    let config =
        xtask::kubeconfig::for_service_account(&kubeconfig_path()?, namespace, name, &token, None)?;
    let dir = target_dir().join("e2e");
    std::fs::create_dir_all(&dir)?;
    let path = dir.join(format!("{namespace}-{name}-{}.kubeconfig", unique_suffix()));
    xtask::kubeconfig::write(&config, &path)?;
    Ok(path)
}

/// A free TCP port on 127.0.0.1.
pub fn free_port() -> Result<u16> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

/// A plain HTTP GET on 127.0.0.1; returns the status code and body.
pub fn http_get(port: u16, path: &str) -> Result<(u16, String)> {
    let mut stream = TcpStream::connect(("127.0.0.1", port))?;
    stream.set_read_timeout(Some(Duration::from_secs(5)))?;
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"
    )?;
    let mut response = String::new();
    stream.read_to_string(&mut response)?;
    let code = response
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .context("malformed HTTP response")?;
    let body = response
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_owned())
        .unwrap_or_default();
    Ok((code, body))
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
    child: Child,
    /// Where its stdout and stderr go.
    pub log_path: PathBuf,
    /// Port of `/metrics`.
    pub metrics_port: u16,
    /// Port of `/healthz` and `/readyz`.
    pub health_port: u16,
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
        let metrics_port = free_port()?;
        let health_port = free_port()?;
        let logs = target_dir().join("e2e-logs");
        std::fs::create_dir_all(&logs)?;
        let label = namespaces.first().copied().unwrap_or("all");
        let log_path = logs.join(format!("{label}-{operator}-{}.log", unique_suffix()));
        let log = std::fs::File::create(&log_path)?;
        let mut command = Command::new(&binary);
        command
            .arg("run")
            .arg(format!("--metrics-bind-address=127.0.0.1:{metrics_port}"))
            .arg(format!(
                "--health-probe-bind-address=127.0.0.1:{health_port}"
            ))
            // JSON lines, with one debug line per API request: the RBAC test derives what
            // each operator needs from the requests it made during the suite.
            .arg("--log-format=json")
            .args(&options.args)
            .env("KUBECONFIG", &kubeconfig)
            .env("WATCH_NAMESPACE", namespaces.join(","))
            .env("RUST_LOG", xtask::requests::RUST_LOG)
            .envs(options.env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log);
        let child = command
            .spawn()
            .with_context(|| format!("starting {}", binary.display()))?;
        let mut process = OperatorProcess {
            child,
            log_path,
            metrics_port,
            health_port,
        };
        if options.wait_ready {
            process.wait_ready().await?;
        }
        Ok(process)
    }

    /// Waits until `/readyz` answers 200.
    pub async fn wait_ready(&mut self) -> Result<()> {
        let port = self.health_port;
        let result = poll("operator /readyz", Duration::from_secs(60), || {
            let exited = self.child.try_wait().ok().flatten();
            async move {
                if let Some(status) = exited {
                    bail!("the operator exited ({status})");
                }
                Ok(http_get(port, "/readyz").ok().filter(|(c, _)| *c == 200))
            }
        })
        .await;
        result.with_context(|| format!("operator log:\n{}", self.log()))?;
        Ok(())
    }

    /// The process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Everything the operator logged so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log_path).unwrap_or_default()
    }

    /// The `/metrics` text.
    pub fn metrics(&self) -> Result<String> {
        let (code, body) = http_get(self.metrics_port, "/metrics")?;
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
        signal(self.child.id(), "TERM");
        let status = self.child.wait()?;
        Ok(status.success())
    }

    /// SIGKILL, at once.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Whether it still runs.
    pub fn is_running(&mut self) -> bool {
        self.child.try_wait().ok().flatten().is_none()
    }
}

impl Drop for OperatorProcess {
    fn drop(&mut self) {
        self.kill();
    }
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
    let _ = Command::new("kill")
        .args([format!("-{name}"), pid.to_string()])
        .status();
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
