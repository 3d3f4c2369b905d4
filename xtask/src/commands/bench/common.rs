//! What every benchmark uses: `target/bench`, the report files, the release
//! build, rounding and the commit measured.

use super::machine::Machine;
use crate::commands::pulsar;
use anyhow::{Context, Result};
use serde::Serialize;
use serde_json::Value;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{SystemTime, UNIX_EPOCH};
use xtask::say;
use xtask::support::{cmd, paths};

/// `target/bench`, created.
pub(crate) fn out_dir() -> Result<PathBuf> {
    let dir = paths::target_dir().join("bench");
    fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    Ok(dir)
}

/// `cargo build --release --bins` of `packages`.
pub(crate) fn build_release(packages: &[&str]) -> Result<()> {
    let mut build = cmd::cargo();
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
    xtask::support::console::stdout(format_args!("{md}"));
    say!("wrote {} and {}", json_path.display(), md_path.display());
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

/// The JSON report of a benchmark against the Pulsar broker (release
/// builds): what it is, when, of which commit, on what, and its own fields.
#[derive(Serialize)]
pub(crate) struct PulsarReport<T> {
    benchmark: &'static str,
    unix_time: u64,
    git_commit: Option<String>,
    pulsar_version: &'static str,
    build: &'static str,
    machine: Machine,
    #[serde(flatten)]
    fields: T,
}

impl<T: Serialize> PulsarReport<T> {
    /// The report of `benchmark`, measured now on `machine`.
    pub(crate) fn new(benchmark: &'static str, machine: &Machine, fields: T) -> Self {
        Self {
            benchmark,
            unix_time: SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map_or(0, |d| d.as_secs()),
            git_commit: git_commit(),
            pulsar_version: pulsar::PULSAR_VERSION,
            build: "release",
            machine: machine.clone(),
            fields,
        }
    }

    /// As JSON (its keys sorted, as [`write_report`] writes them).
    pub(crate) fn json(&self) -> Result<Value> {
        Ok(serde_json::to_value(self)?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_pulsar_report_has_the_head_and_its_fields_side_by_side() -> Result<()> {
        let report =
            PulsarReport::new("consumer", &Machine::probe(), json!({"messages": 3})).json()?;
        let keys: Vec<&str> = report
            .as_object()
            .map(|m| m.keys().map(String::as_str).collect())
            .unwrap_or_default();
        assert_eq!(
            keys,
            [
                "benchmark",
                "build",
                "git_commit",
                "machine",
                "messages",
                "pulsar_version",
                "unix_time"
            ]
        );
        assert_eq!(report["machine"]["nproc"], json!(Machine::probe().nproc));
        Ok(())
    }

    #[test]
    fn tables() {
        let mut md = String::new();
        table(
            &mut md,
            "| a | b |",
            "| --- | ---: |",
            ["| x | 1 |".to_owned()],
        );
        assert_eq!(md, "| a | b |\n| --- | ---: |\n| x | 1 |\n");
    }
}
