//! The GitHub Actions workflows (`.github/workflows/`) cannot run here; `cargo xtask test`
//! checks them with actionlint (expressions, contexts, permissions, action inputs, the
//! `run:` scripts through shellcheck), built once from its Go module
//! (`github.com/rhysd/actionlint/cmd/actionlint`, version pinned in
//! `xtask/cluster/actionlint/go.mod`) into the cache, exactly as the local cluster's
//! components are built (`cluster::build`), never downloaded as a binary. shellcheck is
//! Debian's package, installed when missing; pyflakes is not used (no Python in the
//! workflows).

use crate::commands::cluster::build::Component;
use anyhow::{Context, Result, bail};
use std::process::Command;
use xtask::say;
use xtask::support::cmd;
use xtask::support::machine_packages;
use xtask::support::paths;

/// actionlint, from `github.com/rhysd/actionlint/cmd/actionlint`.
pub const ACTIONLINT: Component = Component {
    folder: "cluster",
    name: "actionlint",
    module: "github.com/rhysd/actionlint",
    packages: &["github.com/rhysd/actionlint/cmd/actionlint"],
    binaries: &["actionlint"],
    tags: &[],
};

/// Lints every workflow under `.github/workflows/`.
///
/// # Errors
/// When a workflow has a problem (actionlint prints each with its file and line), or
/// actionlint or shellcheck cannot be had.
pub fn run() -> Result<()> {
    ACTIONLINT.ensure_built()?;
    let actionlint = ACTIONLINT.binary("actionlint")?;
    machine_packages::ensure_debian(&[("shellcheck", "shellcheck")])?;
    let shellcheck = cmd::which("shellcheck").context("shellcheck is not on PATH")?;
    let root = paths::repo_root();
    let dir = root.join(".github").join("workflows");
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .with_context(|| format!("reading {}", dir.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|e| e == "yml" || e == "yaml"))
        .collect();
    files.sort();
    if files.is_empty() {
        bail!("no workflow under {}", dir.display());
    }
    let mut lint = Command::new(actionlint);
    lint.current_dir(&root)
        .arg("-no-color")
        .arg(format!("-shellcheck={}", shellcheck.display()))
        .arg("-pyflakes=");
    for file in &files {
        lint.arg(file.strip_prefix(&root).unwrap_or(file));
    }
    cmd::run(&mut lint)?;
    say!("actionlint: {} workflows are clean", files.len());
    Ok(())
}
