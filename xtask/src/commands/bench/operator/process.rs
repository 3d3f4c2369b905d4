//! The operator under test, a local process: the Rust operator as `xtask::support::local_operator`
//! runs it (JSON logs at `info`), or the Go original; both behind the bench's counting
//! proxy (see `proxy.rs`), which counts their requests.

use super::procfs;
use super::proxy::CountingProxy;
use anyhow::{Context, Result, bail, ensure};
use std::collections::BTreeMap;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};
use xtask::support::local_operator::{Launch, LocalOperator, free_port};
use xtask::support::process_group;

/// The image the children's pods run (Lolcow, PulsarConsumer), and how each
/// implementation is told it: the same image for both.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct WorkloadImage {
    /// The image.
    pub(super) image: String,
    /// The Rust operator's variable (`LOLCOW_IMAGE`...).
    pub(super) env: &'static str,
    /// The Go original's flag (`lolcow-image`...).
    pub(super) go_flag: &'static str,
}

/// What runs, through which counting proxy.
#[derive(Clone)]
pub(super) enum Launcher {
    /// A Rust operator's binary, through `proxy`, which sends its requests on with the
    /// operator's ServiceAccount token.
    Rust {
        binary: PathBuf,
        proxy: Arc<CountingProxy>,
        /// The kubeconfig pointing at the proxy.
        kubeconfig: PathBuf,
        /// Its children's image (set in its environment), when they run an app of ours.
        workload: Option<WorkloadImage>,
    },
    /// The Go original (`-controller <controller>`), through `proxy`, which counts its
    /// requests and sends them on with the bench's (admin) credentials.
    Go {
        binary: PathBuf,
        controller: &'static str,
        proxy: Arc<CountingProxy>,
        /// The kubeconfig pointing at the proxy.
        kubeconfig: PathBuf,
        /// Its children's image (given as its flag), when they run an app of ours.
        workload: Option<WorkloadImage>,
    },
}

impl Launcher {
    /// `rust` or `go`, as the record names it.
    pub(super) fn implementation(&self) -> &'static str {
        match self {
            Launcher::Rust { .. } => "rust",
            Launcher::Go { .. } => "go",
        }
    }

    /// The image its children's pods run, when they run an app of ours.
    pub(super) fn workload(&self) -> Option<&WorkloadImage> {
        match self {
            Launcher::Rust { workload, .. } | Launcher::Go { workload, .. } => workload.as_ref(),
        }
    }

    /// The proxy its requests go through.
    fn proxy(&self) -> &Arc<CountingProxy> {
        match self {
            Launcher::Rust { proxy, .. } | Launcher::Go { proxy, .. } => proxy,
        }
    }
}

/// The running process, by kind.
enum Running {
    Rust(LocalOperator),
    Go {
        child: Child,
        log_path: PathBuf,
        metrics_port: u16,
        health_port: u16,
    },
}

/// The operator under test; SIGTERM (then SIGKILL) when dropped.
pub(super) struct OperatorProcess {
    running: Running,
    /// Counts its requests.
    proxy: Arc<CountingProxy>,
    /// Where its requests began in the request record (the proxy outlives a restart).
    first_request: usize,
}

impl OperatorProcess {
    /// Starts what `launcher` names, watching `namespace` (several: comma-separated).
    pub(super) fn start(
        launcher: &Launcher,
        namespace: &str,
        log_path: &Path,
        env: &[(String, String)],
    ) -> Result<Self> {
        let running = match launcher {
            Launcher::Rust {
                binary,
                kubeconfig,
                workload,
                ..
            } => {
                // Without the request lines `local_operator` asks for: the proxy counts.
                let mut env = env.to_vec();
                if !env.iter().any(|(k, _)| k == "RUST_LOG") {
                    env.insert(0, ("RUST_LOG".to_owned(), "info".to_owned()));
                }
                // Before `--env`'s, which it was read from when given there.
                if let Some(w) = workload {
                    env.insert(0, (w.env.to_owned(), w.image.clone()));
                }
                Running::Rust(LocalOperator::spawn(Launch {
                    binary,
                    kubeconfig,
                    watch_namespace: namespace,
                    log_path,
                    args: &[],
                    env: &env,
                })?)
            }
            Launcher::Go {
                binary,
                controller,
                kubeconfig,
                workload,
                ..
            } => {
                let (metrics_port, health_port) = (free_port()?, free_port()?);
                let log = File::create(log_path)
                    .with_context(|| format!("creating {}", log_path.display()))?;
                let child = Command::new(binary)
                    .arg(format!("-controller={controller}"))
                    .arg(format!("-metrics-bind-address=127.0.0.1:{metrics_port}"))
                    .arg(format!(
                        "-health-probe-bind-address=127.0.0.1:{health_port}"
                    ))
                    .args(
                        workload
                            .iter()
                            .map(|w| format!("-{}={}", w.go_flag, w.image)),
                    )
                    .env("KUBECONFIG", kubeconfig)
                    .env("WATCH_NAMESPACE", namespace)
                    .envs(env.iter().map(|(k, v)| (k, v)))
                    .stdin(Stdio::null())
                    .stdout(log.try_clone()?)
                    .stderr(log)
                    .spawn()
                    .with_context(|| format!("starting {}", binary.display()))?;
                Running::Go {
                    child,
                    log_path: log_path.to_owned(),
                    metrics_port,
                    health_port,
                }
            }
        };
        let mut process = Self {
            running,
            proxy: launcher.proxy().clone(),
            first_request: 0,
        };
        process.first_request = process.request_position();
        Ok(process)
    }

    fn pid(&self) -> u32 {
        match &self.running {
            Running::Rust(op) => op.pid(),
            Running::Go { child, .. } => child.id(),
        }
    }

    fn log_path(&self) -> &Path {
        match &self.running {
            Running::Rust(op) => &op.log_path,
            Running::Go { log_path, .. } => log_path,
        }
    }

    fn exited(&mut self) -> Option<std::process::ExitStatus> {
        match &mut self.running {
            Running::Rust(op) => op.exited(),
            Running::Go { child, .. } => child.try_wait().ok().flatten(),
        }
    }

    /// SIGTERM, up to 10 s to exit, then SIGKILL.
    pub(super) fn stop(&mut self) {
        let grace = Duration::from_secs(10);
        match &mut self.running {
            Running::Rust(op) => op.stop(grace),
            Running::Go { child, .. } => {
                if child.try_wait().ok().flatten().is_none() {
                    process_group::signal_process(child.id(), "TERM");
                    let deadline = Instant::now() + grace;
                    while Instant::now() < deadline && child.try_wait().ok().flatten().is_none() {
                        std::thread::sleep(Duration::from_millis(50));
                    }
                    let _ = child.kill();
                    let _ = child.wait();
                }
            }
        }
    }

    /// Its memory, threads and CPU time now.
    pub(super) fn sample(&self) -> Result<procfs::Sample> {
        procfs::sample(self.pid())
            .with_context(|| format!("the operator is gone; log: {}", self.log_path().display()))
    }

    fn ports(&self) -> (u16, u16) {
        match &self.running {
            Running::Rust(op) => (op.metrics_port, op.health_port),
            Running::Go {
                metrics_port,
                health_port,
                ..
            } => (*metrics_port, *health_port),
        }
    }

    /// Waits up to 60 s for `/readyz` to answer 200.
    pub(super) async fn wait_ready(&mut self) -> Result<()> {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            if let Some(status) = self.exited() {
                bail!(
                    "the operator exited ({status}); log: {}",
                    self.log_path().display()
                );
            }
            let (port, path) = (self.ports().1, self.log_path().to_owned());
            let ok = tokio::task::spawn_blocking(move || {
                xtask::support::http::get(port, "/readyz").is_ok_and(|(code, _)| code == 200)
            })
            .await?;
            if ok {
                return Ok(());
            }
            ensure!(
                Instant::now() < deadline,
                "the operator was not ready within 60 s; log: {}",
                path.display()
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Where its request record stands now (a phase boundary): requests through the proxy.
    pub(super) fn request_position(&self) -> usize {
        self.proxy.len()
    }

    /// The requests it made between two positions, by `"<verb> <resource>"`.
    pub(super) fn requests_between(&self, from: usize, to: usize) -> BTreeMap<String, u64> {
        self.proxy.count(from, to)
    }

    /// Where this process's requests begin in the record.
    pub(super) fn first_request(&self) -> usize {
        self.first_request
    }

    /// `controller_runtime_reconcile_total`, summed over results.
    pub(super) fn reconciles(&self) -> u64 {
        xtask::support::http::get(self.ports().0, "/metrics")
            .map(|(_, body)| {
                body.lines()
                    .filter(|l| l.starts_with("controller_runtime_reconcile_total"))
                    .filter_map(|l| l.rsplit_once(' ')?.1.trim().parse::<f64>().ok())
                    .sum::<f64>() as u64
            })
            .unwrap_or(0)
    }
}

impl Drop for OperatorProcess {
    fn drop(&mut self) {
        self.stop();
    }
}
