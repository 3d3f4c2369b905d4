//! The tools `cargo xtask` builds from their Go modules (Helm, oras, Prometheus, Jaeger), for the tests that
//! run them: `E2E_HELM` / `E2E_ORAS` / `E2E_PROMETHEUS` / `E2E_JAEGER` when `cargo xtask test` set them, else built (once)
//! with `cargo xtask tool --path <name>`.

use anyhow::{Result, anyhow};
use std::path::PathBuf;
use std::sync::OnceLock;

fn tool(
    env: &str,
    name: &str,
    cell: &'static OnceLock<Result<PathBuf, String>>,
) -> Result<PathBuf> {
    cell.get_or_init(|| {
        if let Some(path) = std::env::var_os(env).filter(|p| !p.is_empty()) {
            return Ok(PathBuf::from(path));
        }
        crate::deployed::xtask(&["tool", "--path", name])
            .map(|out| PathBuf::from(out.trim()))
            .map_err(|e| format!("{e:#}"))
    })
    .clone()
    .map_err(|e| anyhow!(e))
}

/// The built `helm`.
pub fn helm() -> Result<PathBuf> {
    static CELL: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    tool("E2E_HELM", "helm", &CELL)
}

/// The built `oras`.
pub fn oras() -> Result<PathBuf> {
    static CELL: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    tool("E2E_ORAS", "oras", &CELL)
}

/// The built `prometheus` (`promtool` is beside it).
pub fn prometheus() -> Result<PathBuf> {
    static CELL: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    tool("E2E_PROMETHEUS", "prometheus", &CELL)
}

/// The built `jaeger` (v2). In the whole suite `cargo xtask test` builds it in the
/// background while the tests run (`E2E_JAEGER` names it before it exists): this waits
/// for it, or for the build's error in `E2E_JAEGER_FAILED`.
pub async fn jaeger() -> Result<PathBuf> {
    static CELL: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    let path = tool("E2E_JAEGER", "jaeger", &CELL)?;
    if !path.exists() {
        eprintln!(
            "waiting for cargo xtask test's background build of {}",
            path.display()
        );
        let failed = std::env::var_os("E2E_JAEGER_FAILED").map(PathBuf::from);
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60 * 60);
        while !path.exists() {
            if let Some(error) = failed
                .as_ref()
                .and_then(|f| std::fs::read_to_string(f).ok())
            {
                return Err(anyhow!("building jaeger failed: {error}"));
            }
            if std::time::Instant::now() >= deadline {
                return Err(anyhow!("jaeger was not built within an hour"));
            }
            tokio::time::sleep(std::time::Duration::from_secs(2)).await;
        }
    }
    Ok(path)
}
