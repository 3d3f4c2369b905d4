//! `cargo xtask bench <benchmark>` (or `--all`): benchmarks, each writing
//! `target/bench/<benchmark>.json` (machine-readable) and
//! `target/bench/<benchmark>.md` (a table with the machine it ran on).
//!
//! Benchmarks are subcommands of `bench`; add a new one as a variant of
//! [`Benchmark`] with its own options, and to [`run_all`].
//!
//! - `consumer [--messages N] [--no-build]`: throughput of the Pulsar consumer app (release
//!   build) against the real standalone broker of `cargo xtask pulsar up`:
//!   N messages (default 20000) are produced to a fresh topic, then consumed
//!   by one consumer, and again (another topic) by two consumers sharing a
//!   Shared subscription. Throughput is messages per second from the first
//!   to the last `message received` log line (each message is logged just
//!   before it is acknowledged); completion is watched on `/metrics`
//!   (`pulsar_consumer_messages_acked_total`, polled every 100 ms), which
//!   also gives a coarser second figure. The broker is stopped afterwards if
//!   this command started it.
//! - `autoscale`: time from a 20,000-message backlog to drained, by consumers that
//!   follow a PulsarConsumer's Deployment: a fixed single consumer, then autoscaling
//!   1..4 on the backlog. Runs the ignored test `bench_autoscale_drain` of
//!   `tests/tests/pulsar_autoscale.rs` with release builds against the local cluster
//!   and the real broker (both started when needed, stopped if started here).
//! - `operator [--operator <op> --objects N --replicas R | --standard]`:
//!   scale, speed and memory of the operators on the local cluster; see
//!   `operator/mod.rs`. `--all` runs its standard set.

mod autoscale;
mod consumer;
mod machine;
pub(crate) mod operator;

pub(crate) use machine::Machine;

use crate::cmd;
use crate::paths;
use anyhow::{Context, Result, bail};
use clap::{Args, Subcommand};
use serde_json::Value;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

/// Options of `cargo xtask bench`.
#[derive(Args)]
#[command(args_conflicts_with_subcommands = true)]
pub struct BenchArgs {
    /// The benchmark to run.
    #[command(subcommand)]
    benchmark: Option<Benchmark>,
    /// Run every benchmark with its default options.
    #[arg(long)]
    all: bool,
}

/// The benchmarks.
#[derive(Subcommand)]
enum Benchmark {
    /// Throughput of the Pulsar consumer app with 1 and 2 consumers.
    Consumer(consumer::ConsumerArgs),
    /// Drain time of a 20,000-message backlog: autoscaling 1..4 against one consumer.
    Autoscale,
    /// Scale, speed and memory of an operator (or `--standard`: all of them).
    Operator(operator::OperatorArgs),
    /// Rewrite `target/bench/operators.md` and the chart from the recorded
    /// `target/bench/*.json`, without running anything.
    Report,
}

/// Runs the chosen benchmark, or all of them.
pub fn run(args: &BenchArgs) -> Result<()> {
    match (&args.benchmark, args.all) {
        (Some(Benchmark::Consumer(a)), _) => consumer::run(a),
        (Some(Benchmark::Autoscale), _) => autoscale::run(),
        (Some(Benchmark::Operator(a)), _) => operator::run(a),
        (Some(Benchmark::Report), _) => operator::report::write_summary().map(drop),
        (None, true) => run_all(),
        (None, false) => bail!(
            "name a benchmark (`cargo xtask bench consumer|operator`) or pass --all; see `cargo xtask bench --help`"
        ),
    }
}

fn run_all() -> Result<()> {
    // Every benchmark runs even when an earlier one fails.
    let operators = operator::run_all();
    let consumer = consumer::run(&consumer::ConsumerArgs::default());
    let autoscale = autoscale::run();
    operators.and(consumer).and(autoscale)
}

/// `target/bench`, created.
pub(crate) fn out_dir() -> Result<PathBuf> {
    let dir = paths::target_dir().join("bench");
    fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    Ok(dir)
}

fn build_release(packages: &[&str]) -> Result<()> {
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
fn write_report(dir: &Path, name: &str, report: &Value, md: &str) -> Result<()> {
    let json_path = dir.join(format!("{name}.json"));
    fs::write(&json_path, serde_json::to_string_pretty(report)? + "\n")
        .with_context(|| format!("writing {}", json_path.display()))?;
    let md_path = dir.join(format!("{name}.md"));
    fs::write(&md_path, md).with_context(|| format!("writing {}", md_path.display()))?;
    print!("{md}");
    println!("wrote {} and {}", json_path.display(), md_path.display());
    Ok(())
}

pub(crate) fn round3(x: f64) -> f64 {
    (x * 1000.0).round() / 1000.0
}

pub(crate) fn git_commit() -> Option<String> {
    cmd::output(Command::new("git").current_dir(paths::repo_root()).args([
        "rev-parse",
        "--short",
        "HEAD",
    ]))
    .ok()
    .map(|s| s.trim().to_owned())
}
