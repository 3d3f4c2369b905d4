//! The `openssl` command, where a test wants certificates made (or checked)
//! by the tool everyone else uses rather than by this project's own code.

use anyhow::{Context, Result, ensure};
use std::path::Path;
use std::process::Command;

/// Runs `openssl <args>` in `dir`; its standard output.
///
/// # Errors
/// When `openssl` cannot run or fails (with its standard error).
pub fn run(dir: &Path, args: &[&str]) -> Result<String> {
    let out = Command::new("openssl")
        .current_dir(dir)
        .args(args)
        .output()
        .context("running openssl")?;
    ensure!(
        out.status.success(),
        "openssl {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// A new P-256 key (`key`) and a certificate for it signed by itself
/// (`cert`), both in `dir`: `subject`, valid for `days` days, with `extra`
/// arguments of `openssl req` (`-addext ...`).
///
/// # Errors
/// As [`run`].
pub fn self_signed_ec(
    dir: &Path,
    key: &str,
    cert: &str,
    subject: &str,
    days: u32,
    extra: &[&str],
) -> Result<()> {
    let days = days.to_string();
    let mut args = vec![
        "req",
        "-x509",
        "-newkey",
        "ec",
        "-pkeyopt",
        "ec_paramgen_curve:prime256v1",
        "-nodes",
        "-days",
        &days,
        "-subj",
        subject,
        "-keyout",
        key,
        "-out",
        cert,
    ];
    args.extend_from_slice(extra);
    run(dir, &args).map(drop)
}
