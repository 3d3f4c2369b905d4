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
pub(crate) mod common;
mod consumer;
pub(crate) mod machine;
pub(crate) mod operator;

use anyhow::{Result, bail};
use clap::{Args, Subcommand};

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
