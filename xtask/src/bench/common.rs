//! What every benchmark uses: `target/bench`, the report files, the release
//! build, rounding and the commit measured.

use crate::{cmd, paths};
use anyhow::{Context, Result};
use serde_json::Value;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

/// `target/bench`, created.
pub(crate) fn out_dir() -> Result<PathBuf> {
    let dir = paths::target_dir().join("bench");
    fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    Ok(dir)
}

/// `cargo build --release --bins` of `packages`.
pub(crate) fn build_release(packages: &[&str]) -> Result<()> {
    let mut build = Command::new(env!("CARGO"));
    build
        .current_dir(paths::repo_root())
        .args(["build", "--quiet", "--release", "--bins"]);
    for p in packages {
        build.args(["-p", p]);
    }
    cmd::run(&mut build)
}

/// Writes `target/bench/<name>.json` and `<name>.md`, prints the Markdown and where both went.
pub(crate) fn write_report(dir: &Path, name: &str, report: &Value, md: &str) -> Result<()> {
    let json_path = dir.join(format!("{name}.json"));
    fs::write(&json_path, serde_json::to_string_pretty(report)? + "\n")
        .with_context(|| format!("writing {}", json_path.display()))?;
    let md_path = dir.join(format!("{name}.md"));
    fs::write(&md_path, md).with_context(|| format!("writing {}", md_path.display()))?;
    print!("{md}");
    println!("wrote {} and {}", json_path.display(), md_path.display());
    Ok(())
}

/// `x` to three decimals.
/// Appends a Markdown table to `md`: the `header` row, the `align` row, then
/// `rows` (each a `| ... |` line).
pub(crate) fn table(
    md: &mut String,
    header: &str,
    align: &str,
    rows: impl IntoIterator<Item = String>,
) {
    for line in [header.to_owned(), align.to_owned()]
        .into_iter()
        .chain(rows)
    {
        md.push_str(&line);
        md.push('\n');
    }
}

pub(crate) fn round3(x: f64) -> f64 {
    (x * 1000.0).round() / 1000.0
}

/// The commit measured (`git rev-parse --short HEAD`), when git knows it.
pub(crate) fn git_commit() -> Option<String> {
    cmd::output(Command::new("git").current_dir(paths::repo_root()).args([
        "rev-parse",
        "--short",
        "HEAD",
    ]))
    .ok()
    .map(|s| s.trim().to_owned())
}
