//! `cargo xtask bench autoscale`: drain time of a 20,000-message backlog, a fixed
//! single consumer against autoscaling 1..4 (see the module doc of `bench`).

use super::common::{PulsarReport, build_release, out_dir, table, write_report};
use super::machine::Machine;
use crate::commands::pulsar;
use anyhow::{Context, Result};
use serde::{Deserialize, Serialize};
use serde_json::json;
use std::fmt::Write as _;
use std::fs;
use std::path::Path;
use xtask::say;
use xtask::support::{cmd, paths};

// ---------------------------------------------------------------------------
// bench autoscale
// ---------------------------------------------------------------------------

pub(crate) fn run() -> Result<()> {
    say!("==> bench autoscale: building the operator and the consumer (release)");
    build_release(&["pulsar-consumer", "pulsar-consumer-operator"])?;
    let started_cluster =
        !crate::commands::cluster::is_up(&crate::commands::cluster::Layout::new());
    let pulsar_was_running = pulsar::is_running();
    let kubeconfig = crate::commands::cluster::up()?;
    let dir = out_dir()?;
    let raw = dir.join("autoscale.runs.json");
    let _ = fs::remove_file(&raw);
    let mut test = crate::commands::test::e2e_cargo(&kubeconfig, false)?;
    test.current_dir(paths::repo_root())
        .env("E2E_PROFILE", "release")
        .env("E2E_BENCH_OUT", &raw)
        .args([
            "test",
            "-p",
            "e2e",
            "--test",
            "pulsar_autoscale",
            "--",
            "--ignored",
            "--exact",
            "bench_autoscale_drain",
        ]);
    let result = cmd::run(&mut test);
    if !pulsar_was_running && pulsar::is_running() {
        pulsar::down()?;
    }
    if started_cluster {
        crate::commands::cluster::down()?;
    }
    result?;
    let runs: Runs = serde_json::from_str(
        &fs::read_to_string(&raw).with_context(|| format!("reading {}", raw.display()))?,
    )
    .with_context(|| format!("reading the runs of {}", raw.display()))?;
    let _ = fs::remove_file(&raw);
    write_autoscale_report(&runs.runs, &Machine::probe(), &dir)
}

/// What the test `bench_autoscale_drain` writes.
#[derive(Deserialize)]
struct Runs {
    runs: Vec<Drain>,
}

/// One drain of the backlog, as the test records it.
#[derive(Serialize, Deserialize)]
struct Drain {
    /// What drained it (`fixed single consumer`, `autoscaling 1..4`).
    label: String,
    /// The backlog.
    messages: u64,
    /// Distinct messages received.
    received: u64,
    /// From the PulsarConsumer's creation to a backlog of 0.
    seconds: f64,
    /// `messages / seconds`, rounded.
    messages_per_second: f64,
    /// The most consumers running at once.
    max_consumers: u64,
    /// Messages received more than once.
    duplicates: u64,
}

/// `target/bench/autoscale.{json,md}` from the test's runs.
fn write_autoscale_report(runs: &[Drain], machine: &Machine, dir: &Path) -> Result<()> {
    let report = PulsarReport::new("autoscale", machine, json!({ "runs": runs })).json()?;
    let mut md = String::new();
    let _ = writeln!(md, "# Benchmark: draining a backlog, autoscaled or not\n");
    let _ = writeln!(
        md,
        "20,000 messages wait on a subscription before any consumer runs; a PulsarConsumer is \
         created, and local consumer processes (release build) follow its Deployment's \
         replicas. Time: from the PulsarConsumer's creation to a backlog of 0 on the broker's \
         admin API (Apache Pulsar {} standalone on the same machine; `cargo xtask bench \
         autoscale`).\n",
        pulsar::PULSAR_VERSION
    );
    let _ = writeln!(md, "{}\n", machine.markdown());
    table(
        &mut md,
        "| consumers | messages | seconds to drained | msgs/s | most consumers at once | duplicates |",
        "| --- | ---: | ---: | ---: | ---: | ---: |",
        runs.iter().map(|run| {
            format!(
                "| {} | {} | {:.1} | {:.0} | {} | {} |",
                run.label,
                run.messages,
                run.seconds,
                run.messages_per_second,
                run.max_consumers,
                run.duplicates,
            )
        }),
    );
    let _ = writeln!(
        md,
        "\nThe autoscaled run reads the backlog every second and asks for \
         ceil(backlog / 2000) consumers, at most 4. The broker, the operator and the \
         consumers share the machine's CPUs, so more consumers help only as far as the \
         CPUs allow (see `consumer.md` for one against two consumers)."
    );
    write_report(dir, "autoscale", &report, &md)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_tests_runs_read_and_write_back() -> Result<()> {
        let text = r#"{"runs": [{"duplicates": 0, "label": "autoscaling 1..4", "max_consumers": 4,
            "messages": 20000, "messages_per_second": 4606.0, "received": 20000, "seconds": 4.342}]}"#;
        let runs: Runs = serde_json::from_str(text)?;
        assert_eq!(runs.runs.len(), 1);
        assert_eq!(runs.runs[0].label, "autoscaling 1..4");
        let back = json!({ "runs": runs.runs });
        assert_eq!(back, serde_json::from_str::<serde_json::Value>(text)?);
        Ok(())
    }
}
