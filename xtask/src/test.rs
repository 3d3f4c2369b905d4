//! `cargo xtask test`: the one command CI runs.
//!
//! Static checks first (they are quick and fail fast), then unit tests, then
//! the end-to-end tests on the local cluster, which is started on demand and
//! stopped afterwards when this command started it.

use crate::cluster;
use crate::cmd;
use crate::crds;
use crate::paths;
use anyhow::{Context, Result};
use std::process::Command;
use std::time::Instant;

/// Options of `cargo xtask test`.
#[derive(clap::Args)]
pub struct TestArgs {
    /// Skip the end-to-end tests (static checks and unit tests only).
    #[arg(long)]
    no_e2e: bool,
    /// Leave the local cluster running afterwards even if this run started it.
    #[arg(long)]
    keep_cluster: bool,
    /// Only run end-to-end tests whose name contains this filter.
    #[arg(long)]
    e2e_filter: Option<String>,
}

fn cargo() -> Command {
    let mut c = Command::new(env!("CARGO"));
    c.current_dir(paths::repo_root());
    c
}

fn step(name: &str, f: impl FnOnce() -> Result<()>) -> Result<()> {
    let start = Instant::now();
    println!("==> {name}");
    f().with_context(|| format!("step failed: {name}"))?;
    println!("==> {name}: ok ({})", cmd::elapsed(start));
    Ok(())
}

/// Runs every check and test.
pub fn run(args: &TestArgs) -> Result<()> {
    let start = Instant::now();
    step("cargo fmt --check", || {
        cmd::run(cargo().args(["fmt", "--all", "--", "--check"]))
    })?;
    step("cargo clippy (warnings are errors)", || {
        cmd::run(cargo().args([
            "clippy",
            "--workspace",
            "--all-targets",
            "--quiet",
            "--",
            "-D",
            "warnings",
        ]))
    })?;
    step("CRD drift check", || crds::run(true))?;
    step("unit tests", || {
        cmd::run(cargo().args(["test", "--workspace", "--exclude", "e2e"]))
    })?;
    if !args.no_e2e {
        step("end-to-end tests", || e2e(args))?;
    }
    println!("all checks passed in {}", cmd::elapsed(start));
    Ok(())
}

fn e2e(args: &TestArgs) -> Result<()> {
    // The tests run the operators as local processes: build them first.
    cmd::run(cargo().args(["build", "--quiet", "--bins"]))?;
    let external = std::env::var_os("E2E_KUBECONFIG").filter(|v| !v.is_empty());
    let layout = cluster::Layout::new();
    let started_here = external.is_none() && !cluster::is_up(&layout);
    let kubeconfig = match &external {
        Some(path) => path.into(),
        None => cluster::up()?,
    };
    let mut test = cargo();
    test.args(["test", "-p", "e2e"])
        .env("E2E_KUBECONFIG", &kubeconfig)
        .env("E2E_KUBECTL", kubectl_for_tests(external.is_some())?);
    test.arg("--");
    if let Some(filter) = &args.e2e_filter {
        test.arg(filter);
    }
    let result = cmd::run(&mut test);
    if started_here && !args.keep_cluster {
        cluster::down()?;
    }
    result
}

fn kubectl_for_tests(external: bool) -> Result<std::path::PathBuf> {
    let built = cluster::build::kubectl()?;
    if external && !cmd::is_executable(&built) {
        return Ok("kubectl".into());
    }
    Ok(built)
}
