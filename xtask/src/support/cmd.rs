//! Small helpers around `std::process::Command`.

use crate::support::console;
use anyhow::{Context, Result, bail};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// Runs a command with inherited stdio (copied through this process once the output may
/// be gone: [`console::status`]) and fails when it exits non-zero.
pub fn run(cmd: &mut Command) -> Result<()> {
    let shown = show(cmd);
    let status = console::status(cmd).with_context(|| format!("could not start `{shown}`"))?;
    if !status.success() {
        bail!("`{shown}` failed ({status})");
    }
    Ok(())
}

/// Runs a command and returns its stdout; stderr is included in the error.
pub fn output(cmd: &mut Command) -> Result<String> {
    let shown = show(cmd);
    let out = cmd
        .stdin(Stdio::null())
        .output()
        .with_context(|| format!("could not start `{shown}`"))?;
    if !out.status.success() {
        bail!(
            "`{shown}` failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Runs a command quietly and tells whether it succeeded.
pub fn succeeds(cmd: &mut Command) -> bool {
    cmd.stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// A command line as a user would type it, for messages.
pub fn show(cmd: &Command) -> String {
    let mut parts = vec![cmd.get_program().to_string_lossy().into_owned()];
    parts.extend(cmd.get_args().map(|a| a.to_string_lossy().into_owned()));
    parts.join(" ")
}

/// Whether an executable is on PATH.
pub fn on_path(program: &str) -> bool {
    which(program).is_some()
}

/// The path of an executable on PATH (also the usual `sbin` folders, which
/// a non-login root shell may lack).
pub fn which(program: &str) -> Option<std::path::PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain(["/usr/local/sbin", "/usr/sbin", "/sbin"].map(std::path::PathBuf::from))
        .map(|dir| dir.join(program))
        .find(|p| is_executable(p))
}

/// Whether a file exists and is executable.
pub fn is_executable(path: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(path).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

/// Polls `check` until it returns true or `timeout` passes.
pub fn wait_until(timeout: Duration, mut check: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + timeout;
    loop {
        if check() {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(250));
    }
}

/// `1m05s`-style elapsed time.
pub fn elapsed(since: Instant) -> String {
    let secs = since.elapsed().as_secs();
    if secs >= 60 {
        format!("{}m{:02}s", secs / 60, secs % 60)
    } else {
        format!("{secs}s")
    }
}

/// The `cargo metadata` entry of the workspace package `name` (read offline, without
/// dependencies): its version, description, repository and manifest path.
///
/// # Errors
/// When `cargo metadata` fails or the workspace has no such package.
pub fn workspace_package(name: &str) -> Result<serde_json::Value> {
    let out = output(
        cargo()
            .current_dir(crate::support::paths::repo_root())
            .args([
                "metadata",
                "--no-deps",
                "--format-version",
                "1",
                "--offline",
            ]),
    )?;
    let mut meta: serde_json::Value =
        serde_json::from_str(&out).context("parsing `cargo metadata`")?;
    let packages = meta["packages"].as_array_mut();
    packages
        .and_then(|all| {
            let at = all.iter().position(|p| p["name"] == name)?;
            Some(all.swap_remove(at))
        })
        .with_context(|| format!("no package {name} in the workspace"))
}

/// Today's date (UTC), `YYYY-MM-DD`.
#[must_use]
pub fn today() -> String {
    let date = time::OffsetDateTime::now_utc().date();
    format!(
        "{:04}-{:02}-{:02}",
        date.year(),
        u8::from(date.month()),
        date.day()
    )
}

/// The variables Cargo sets for a crate it builds or runs (`CARGO_MANIFEST_*`,
/// `CARGO_PKG_*`, `CARGO_CRATE_NAME`, `CARGO_BIN_*`, ...) that this process has: a nested
/// cargo inherits them from `cargo run` or `cargo test`, and build scripts such as ring's
/// rerun when one changes (`rerun-if-env-changed`), so `cargo xtask image` started by a
/// test and by hand would otherwise rebuild each other's release binaries.
/// `CARGO_TARGET_DIR`, `CARGO_HOME` and the like are not among them.
#[must_use]
fn crate_env_vars() -> Vec<String> {
    const PREFIXES: [&str; 4] = [
        "CARGO_MANIFEST_",
        "CARGO_PKG_",
        "CARGO_CRATE_",
        "CARGO_BIN_",
    ];
    const NAMES: [&str; 2] = ["CARGO_PRIMARY_PACKAGE", "CARGO_TARGET_TMPDIR"];
    std::env::vars_os()
        .filter_map(|(name, _)| name.into_string().ok())
        .filter(|name| {
            PREFIXES.iter().any(|p| name.starts_with(p)) || NAMES.contains(&name.as_str())
        })
        .collect()
}

/// The cargo that built this crate, for every nested cargo: without the variables Cargo
/// set for the crate this process runs as (`CARGO_MANIFEST_*`, `CARGO_PKG_*`, ...), which
/// would make a nested build and a build by hand rebuild each other's build scripts.
#[must_use]
pub fn cargo() -> Command {
    let mut cargo = Command::new(env!("CARGO"));
    for name in crate_env_vars() {
        cargo.env_remove(name);
    }
    cargo
}

/// `command` run through `nice -n 19`: the same program, arguments, environment and
/// directory, at the lowest CPU priority, so that it takes only the time the cores
/// would otherwise idle.
#[must_use]
pub fn at_lowest_priority(command: &Command) -> Command {
    let mut nice = Command::new("nice");
    nice.args(["-n", "19"])
        .arg(command.get_program())
        .args(command.get_args());
    for (name, value) in command.get_envs() {
        match value {
            Some(value) => nice.env(name, value),
            None => nice.env_remove(name),
        };
    }
    if let Some(dir) = command.get_current_dir() {
        nice.current_dir(dir);
    }
    nice
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn at_lowest_priority_keeps_the_program_arguments_environment_and_directory() {
        let mut command = Command::new("cargo");
        command
            .args(["build", "--release"])
            .env("RUSTFLAGS", "-C target-feature=+crt-static")
            .env_remove("CARGO_PKG_NAME")
            .current_dir("/");
        let nice = at_lowest_priority(&command);
        assert_eq!(nice.get_program(), "nice");
        let args: Vec<_> = nice.get_args().collect();
        assert_eq!(args, ["-n", "19", "cargo", "build", "--release"]);
        let envs: Vec<_> = nice.get_envs().collect();
        assert!(envs.contains(&(
            std::ffi::OsStr::new("RUSTFLAGS"),
            Some(std::ffi::OsStr::new("-C target-feature=+crt-static"))
        )));
        assert!(envs.contains(&(std::ffi::OsStr::new("CARGO_PKG_NAME"), None)));
        assert_eq!(nice.get_current_dir(), Some(Path::new("/")));
    }

    #[test]
    fn at_lowest_priority_really_lowers_the_priority() {
        let out = at_lowest_priority(Command::new("nice").env("LC_ALL", "C"))
            .output()
            .expect("nice runs");
        let niceness: i32 = String::from_utf8_lossy(&out.stdout)
            .trim()
            .parse()
            .expect("nice prints the niceness");
        assert_eq!(niceness, 19);
    }
}
