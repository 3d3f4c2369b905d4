//! `cargo xtask crds [--check]`: the CRDs under `deploy/` are generated from
//! the Rust types (each operator's `crd` subcommand) and must not drift.

use anyhow::{Context, Result, bail};
use std::path::PathBuf;
use std::process::Command;
use xtask::say;
use xtask::support::cmd;
use xtask::support::paths;

use xtask::support::operators::OPERATORS;

/// Operators that already have a deploy tree (and so a committed CRD).
pub fn deployed_operators() -> Vec<&'static str> {
    OPERATORS
        .into_iter()
        .filter(|op| paths::repo_root().join("deploy").join(op).exists())
        .collect()
}

/// The operators named on a command line (each must have a `deploy/` tree), or all of
/// them when none is named.
///
/// # Errors
/// When a name is not one of them (the message names the `operators` argument).
pub fn selected(named: &[String]) -> Result<Vec<&'static str>> {
    let all = deployed_operators();
    if named.is_empty() {
        return Ok(all);
    }
    named
        .iter()
        .map(|name| {
            all.iter().copied().find(|op| op == name).with_context(|| {
                format!(
                    "unknown operator {name:?} (the operators argument); one of: {}",
                    all.join(", ")
                )
            })
        })
        .collect()
}

fn crd_path(operator: &str) -> PathBuf {
    paths::repo_root()
        .join("deploy")
        .join(operator)
        .join("crd.yaml")
}

/// Builds the operators' debug binaries.
pub fn build_operators(operators: &[&str]) -> Result<()> {
    if operators.is_empty() {
        return Ok(());
    }
    let mut cargo = cmd::cargo();
    cargo
        .current_dir(paths::repo_root())
        .args(["build", "--quiet"]);
    for op in operators {
        cargo.args(["-p", op]);
    }
    cmd::run(&mut cargo)
}

/// The CRD as the operator's code generates it.
fn generated(operator: &str) -> Result<String> {
    let binary = paths::target_dir().join("debug").join(operator);
    cmd::output(Command::new(binary).arg("crd"))
}

/// Writes (or with `check`, compares) every operator's CRD.
pub fn run(check: bool) -> Result<()> {
    run_for(check, &deployed_operators())
}

/// Writes (or with `check`, compares) the CRDs of `operators`.
pub fn run_for(check: bool, operators: &[&str]) -> Result<()> {
    build_operators(operators)?;
    let mut drifted = Vec::new();
    for op in operators {
        let want = generated(op)?;
        let path = crd_path(op);
        let have = std::fs::read_to_string(&path).unwrap_or_default();
        if have == want {
            say!("crds: {} is up to date", path.display());
        } else if check {
            drifted.push(path.display().to_string());
        } else {
            std::fs::write(&path, want)?;
            say!("crds: wrote {}", path.display());
        }
    }
    if !drifted.is_empty() {
        bail!(
            "these CRDs differ from what the code generates: {}\nrun `cargo xtask crds` and commit the result",
            drifted.join(", ")
        );
    }
    Ok(())
}
