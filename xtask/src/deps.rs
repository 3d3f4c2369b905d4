//! What the commands need from the machine, installed by the commands
//! themselves: a fresh clone works with `cargo xtask demo` and `cargo xtask
//! test` alone.
//!
//! Debian packages are installed with `apt-get` when running as root (the
//! package lists are refreshed once per run); otherwise the error names the
//! exact command to run.

use crate::cmd;
use anyhow::{Result, bail};
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};

static APT_UPDATED: AtomicBool = AtomicBool::new(false);

/// Makes sure every `(program, Debian package)` pair's program is there,
/// installing the missing packages. A program given as an absolute path is
/// checked as a file (for packages that ship no command).
pub fn ensure_debian(needs: &[(&str, &str)]) -> Result<()> {
    let mut missing: Vec<&str> = needs
        .iter()
        .filter(|(program, _)| {
            if program.starts_with('/') {
                !std::path::Path::new(program).exists()
            } else {
                !cmd::on_path(program)
            }
        })
        .map(|(_, package)| *package)
        .collect();
    missing.sort_unstable();
    missing.dedup();
    if missing.is_empty() {
        return Ok(());
    }
    let command = format!(
        "apt-get install -y --no-install-recommends {}",
        missing.join(" ")
    );
    if !is_root() || !cmd::on_path("apt-get") {
        bail!(
            "this needs Debian packages that are not installed; run as root:\n  apt-get update && {command}"
        );
    }
    println!("deps: installing {} (Debian packages)", missing.join(", "));
    if !APT_UPDATED.swap(true, Ordering::SeqCst) {
        cmd::run(
            Command::new("apt-get")
                .args(["update", "-q"])
                .env("DEBIAN_FRONTEND", "noninteractive"),
        )?;
    }
    cmd::run(
        Command::new("apt-get")
            .args(["install", "-y", "-q", "--no-install-recommends"])
            .args(&missing)
            .env("DEBIAN_FRONTEND", "noninteractive"),
    )
}

/// Whether this process runs as root.
pub fn is_root() -> bool {
    std::fs::read_to_string("/proc/self/status").is_ok_and(|s| {
        s.lines()
            .find(|l| l.starts_with("Uid:"))
            .and_then(|l| l.split_whitespace().nth(1))
            .is_some_and(|uid| uid == "0")
    })
}
