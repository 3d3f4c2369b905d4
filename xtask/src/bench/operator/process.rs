//! The operator under test, a local process (see `xtask::local_operator`).

use super::procfs;
use anyhow::{Context, Result, bail, ensure};
use std::path::Path;
use std::time::{Duration, Instant};
use xtask::local_operator::{Launch, LocalOperator};

/// The operator under test; SIGTERM (then SIGKILL) when dropped.
pub(super) struct OperatorProcess(pub(super) LocalOperator);

impl OperatorProcess {
    /// Starts `binary` as the ServiceAccount of `kubeconfig`, watching `namespace`.
    pub(super) fn start(
        binary: &Path,
        kubeconfig: &Path,
        namespace: &str,
        log_path: &Path,
        env: &[(String, String)],
    ) -> Result<Self> {
        Ok(Self(LocalOperator::spawn(Launch {
            binary,
            kubeconfig,
            watch_namespace: namespace,
            log_path,
            args: &[],
            env,
        })?))
    }

    /// SIGTERM, up to 10 s to exit, then SIGKILL.
    pub(super) fn stop(&mut self) {
        self.0.stop(Duration::from_secs(10));
    }

    /// Its memory, threads and CPU time now.
    pub(super) fn sample(&self) -> Result<procfs::Sample> {
        procfs::sample(self.0.pid())
            .with_context(|| format!("the operator is gone; log: {}", self.0.log_path.display()))
    }

    /// Waits up to 60 s for `/readyz` to answer 200.
    pub(super) async fn wait_ready(&mut self) -> Result<()> {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            if let Some(status) = self.0.exited() {
                bail!(
                    "the operator exited ({status}); log: {}",
                    self.0.log_path.display()
                );
            }
            let (port, path) = (self.0.health_port, self.0.log_path.clone());
            let ok = tokio::task::spawn_blocking(move || {
                xtask::http::get(port, "/readyz").is_ok_and(|(code, _)| code == 200)
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

    /// The operator's log so far, from byte `from`.
    pub(super) fn log_from(&self, from: usize) -> String {
        self.0.log_from(from)
    }

    /// The operator's log from byte `from` to byte `to` (empty when those are
    /// not character boundaries).
    pub(super) fn log_between(&self, from: usize, to: usize) -> String {
        let log = self.log_from(0);
        log.get(from..to.min(log.len()))
            .unwrap_or_default()
            .to_owned()
    }

    /// Bytes logged so far (a phase boundary).
    pub(super) fn log_len(&self) -> usize {
        self.0.log_len()
    }

    /// `controller_runtime_reconcile_total`, summed over results.
    pub(super) fn reconciles(&self) -> u64 {
        self.0
            .metrics()
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
