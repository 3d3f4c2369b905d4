//! The tools `cargo xtask` builds from their Go modules (Helm, oras), for the tests that
//! run them: `E2E_HELM` / `E2E_ORAS` when `cargo xtask test` set them, else built (once)
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
