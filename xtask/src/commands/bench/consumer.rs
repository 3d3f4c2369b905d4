//! `cargo xtask bench consumer`: throughput of the Pulsar consumer app with 1 and 2
//! consumers against the real broker (see the module doc of `bench`).

use super::common::{PulsarReport, build_release, out_dir, round3, table, write_report};
use super::machine::Machine;
use crate::commands::pulsar;
use anyhow::{Context, Result, bail, ensure};
use clap::Args;
use serde_json::{Value, json};
use std::collections::HashSet;
use std::fmt::Write as _;
use std::fs;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::thread::sleep;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};
use xtask::say;
use xtask::support::{cmd, paths};

/// Options of `cargo xtask bench consumer`.
#[derive(Args)]
pub(crate) struct ConsumerArgs {
    /// Messages produced to (and consumed from) each topic.
    #[arg(long, default_value_t = 20_000, value_parser = clap::value_parser!(u64).range(1..))]
    messages: u64,
    /// Use `target/release/pulsar-consumer` as it is instead of building it
    /// first (on a busy machine the release build takes long).
    #[arg(long)]
    no_build: bool,
}

impl Default for ConsumerArgs {
    fn default() -> Self {
        Self {
            messages: 20_000,
            no_build: false,
        }
    }
}

// ---------------------------------------------------------------------------
// bench consumer
// ---------------------------------------------------------------------------

/// The outcome of one consumer scenario.
struct Scenario {
    consumers: usize,
    /// Messages logged by each consumer.
    per_consumer: Vec<u64>,
    duplicates: u64,
    /// First to last `message received` log line.
    log_seconds: f64,
    /// First `/metrics` sample with an ack to the first with all acked.
    metrics_seconds: f64,
}

impl Scenario {
    fn received(&self) -> u64 {
        self.per_consumer.iter().sum()
    }

    /// Messages per second over the log span (N - 1 intervals between the
    /// first and the last message).
    fn rate(&self) -> f64 {
        rate(self.received().saturating_sub(1), self.log_seconds)
    }

    fn metrics_rate(&self) -> f64 {
        rate(self.received(), self.metrics_seconds)
    }
}

fn rate(messages: u64, seconds: f64) -> f64 {
    if seconds > 0.0 {
        messages as f64 / seconds
    } else {
        0.0
    }
}

pub(crate) fn run(args: &ConsumerArgs) -> Result<()> {
    let n = args.messages;
    if !args.no_build {
        say!("==> bench consumer: building pulsar-consumer (release)");
        build_release(&["pulsar-consumer"])?;
    }
    let binary = paths::target_dir().join("release/pulsar-consumer");
    ensure!(binary.is_file(), "{} was not built", binary.display());

    let was_running = pulsar::is_running();
    let info = pulsar::up(&pulsar::PulsarOptions::default())?;
    let result = consumer_scenarios(&binary, &info.service_url, n);
    if !was_running {
        pulsar::down()?;
    }
    let (produce_seconds, scenarios) = result?;

    let machine = Machine::probe();
    let dir = out_dir()?;
    let scenario_json: Vec<Value> = scenarios
        .iter()
        .map(|s| {
            json!({
                "consumers": s.consumers,
                "messages": n,
                "received_per_consumer": s.per_consumer,
                "duplicates": s.duplicates,
                "seconds": round3(s.log_seconds),
                "messages_per_second": s.rate().round(),
                "metrics_seconds": round3(s.metrics_seconds),
                "metrics_messages_per_second": s.metrics_rate().round(),
            })
        })
        .collect();
    let fields = json!({
        "messages": n,
        "produce": {
            "seconds": round3(produce_seconds),
            "messages_per_second": rate(n, produce_seconds).round(),
        },
        "scenarios": scenario_json,
    });
    let report = PulsarReport::new("consumer", &machine, fields).json()?;

    let mut md = String::new();
    let _ = writeln!(md, "# Benchmark: pulsar-consumer throughput\n");
    let _ = writeln!(
        md,
        "{n} messages per run, release build, Apache Pulsar {} standalone broker on the same \
         machine (`cargo xtask bench consumer --messages {n}`).\n",
        pulsar::PULSAR_VERSION
    );
    let _ = writeln!(md, "{}\n", machine.markdown());
    table(
        &mut md,
        "| consumers | messages | seconds | msgs/s | msgs/s (/metrics, 100 ms) | split |",
        "| ---: | ---: | ---: | ---: | ---: | --- |",
        scenarios.iter().map(|s| {
            let split: Vec<String> = s.per_consumer.iter().map(u64::to_string).collect();
            format!(
                "| {} | {} | {:.3} | {:.0} | {:.0} | {} |",
                s.consumers,
                s.received(),
                s.log_seconds,
                s.rate(),
                s.metrics_rate(),
                split.join(" / ")
            )
        }),
    );
    let _ = writeln!(
        md,
        "\nProducing the {n} messages (`pulsar-consumer produce`, one process, connection \
         included) took {produce_seconds:.3} s ({:.0} msgs/s).\n\n\
         Seconds: first to last `message received` log line (each message is logged, then \
         acknowledged), over all consumers. The consumers start after the messages were \
         produced, so they work through a backlog. The broker, the consumers and whatever \
         else runs share the CPUs.",
        rate(n, produce_seconds)
    );
    write_report(&dir, "consumer", &report, &md)
}

/// Runs the 1- and 2-consumer scenarios; returns the time the first
/// production took and the scenarios.
fn consumer_scenarios(binary: &Path, server: &str, n: u64) -> Result<(f64, Vec<Scenario>)> {
    let logs = out_dir()?.join("logs");
    fs::create_dir_all(&logs).with_context(|| format!("creating {}", logs.display()))?;
    let run_id = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis());
    let mut produce_seconds = None;
    let mut scenarios = Vec::new();
    for consumers in [1usize, 2] {
        let topic = format!("bench-consumer-{run_id}-{consumers}");
        say!("==> bench consumer: producing {n} messages to {topic}");
        let started = Instant::now();
        let out = cmd::output(
            Command::new(binary)
                .args(["produce", "--count", &n.to_string(), "--message", "bench"])
                .env("PULSAR_SERVER", server)
                .env("PULSAR_TOPIC", &topic)
                .env("RUST_LOG", "warn"),
        )?;
        let seconds = started.elapsed().as_secs_f64();
        ensure!(
            out.contains(&format!("sent {n} ")),
            "produce did not confirm {n} messages: {out}"
        );
        produce_seconds.get_or_insert(seconds);
        say!("==> bench consumer: consuming with {consumers} consumer(s)");
        let scenario = consume(binary, server, &topic, consumers, n, &logs)?;
        say!(
            "    {} messages in {:.3}s: {:.0} msgs/s",
            scenario.received(),
            scenario.log_seconds,
            scenario.rate()
        );
        scenarios.push(scenario);
    }
    Ok((produce_seconds.unwrap_or_default(), scenarios))
}

/// Consumer processes, stopped (SIGTERM, then SIGKILL) when dropped.
struct Consumers(Vec<(Child, u16, PathBuf)>);

impl Drop for Consumers {
    fn drop(&mut self) {
        for (child, _, _) in &mut self.0 {
            let _ = Command::new("kill")
                .args(["-TERM", &child.id().to_string()])
                .stderr(Stdio::null())
                .status();
        }
        for (child, _, _) in &mut self.0 {
            let deadline = Instant::now() + Duration::from_secs(10);
            while Instant::now() < deadline && matches!(child.try_wait(), Ok(None)) {
                sleep(Duration::from_millis(50));
            }
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

fn acked(port: u16) -> Option<u64> {
    let (code, body) = xtask::support::http::get(port, "/metrics").ok()?;
    if code != 200 {
        return None;
    }
    body.lines()
        .find_map(|l| l.strip_prefix("pulsar_consumer_messages_acked_total "))
        .and_then(|v| v.trim().parse::<f64>().ok())
        .map(|v| v as u64)
}

fn consume(
    binary: &Path,
    server: &str,
    topic: &str,
    consumers: usize,
    n: u64,
    logs: &Path,
) -> Result<Scenario> {
    let mut procs = Consumers(Vec::new());
    for i in 0..consumers {
        let port = TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
        let log_path = logs.join(format!("{topic}-{i}.log"));
        let child =
            xtask::support::local_consumer::spawn(&xtask::support::local_consumer::Launch {
                binary,
                server,
                topic,
                subscription: &format!("{topic}-sub"),
                http_port: port,
                hostname: &format!("bench-{i}"),
                log_path: &log_path,
            })?;
        procs.0.push((child, port, log_path));
    }

    // Generous: even 500 msgs/s finishes in time.
    let timeout = Duration::from_secs(60 + n / 500);
    let started = Instant::now();
    let mut first_ack: Option<Instant> = None;
    let all_acked = loop {
        let mut sum = 0;
        for (child, port, log) in &mut procs.0 {
            if let Some(status) = child.try_wait()? {
                bail!("a consumer exited ({status}); log: {}", log.display());
            }
            sum += acked(*port).unwrap_or(0);
        }
        let now = Instant::now();
        if sum > 0 && first_ack.is_none() {
            first_ack = Some(now);
        }
        if sum >= n {
            break now;
        }
        if started.elapsed() > timeout {
            bail!(
                "only {sum} of {n} messages acknowledged after {}s",
                timeout.as_secs()
            );
        }
        sleep(Duration::from_millis(100));
    };
    let metrics_seconds = first_ack.map_or(0.0, |t| (all_acked - t).as_secs_f64());
    let log_paths: Vec<PathBuf> = procs.0.iter().map(|(_, _, p)| p.clone()).collect();
    drop(procs);

    let mut per_consumer = Vec::new();
    let mut payloads = HashSet::new();
    let mut first = f64::INFINITY;
    let mut last = f64::NEG_INFINITY;
    let mut total = 0u64;
    for path in &log_paths {
        let text =
            fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
        let mut count = 0u64;
        for line in text.lines().filter(|l| l.contains("\"message received\"")) {
            let Ok(v) = serde_json::from_str::<Value>(line) else {
                continue;
            };
            if v["message"] != "message received" {
                continue;
            }
            count += 1;
            if let Some(p) = v["payload"].as_str() {
                payloads.insert(p.to_owned());
            }
            if let Some(t) = v["timestamp"].as_str().and_then(parse_timestamp) {
                first = first.min(t);
                last = last.max(t);
            }
        }
        total += count;
        per_consumer.push(count);
    }
    ensure!(
        payloads.len() as u64 == n,
        "{} distinct payloads logged, {n} produced",
        payloads.len()
    );
    Ok(Scenario {
        consumers,
        per_consumer,
        duplicates: total - n,
        log_seconds: if last > first { last - first } else { 0.0 },
        metrics_seconds,
    })
}

/// Seconds since the Unix epoch of an RFC 3339 UTC timestamp as the tracing
/// JSON formatter writes it (`2026-01-02T03:04:05.123456Z`).
fn parse_timestamp(ts: &str) -> Option<f64> {
    let ts = ts.strip_suffix('Z')?;
    let (date, time) = ts.split_once('T')?;
    let mut d = date.splitn(3, '-').map(|p| p.parse::<i64>().ok());
    let (y, m, day) = (d.next()??, d.next()??, d.next()??);
    let mut t = time.splitn(3, ':');
    let h: f64 = t.next()?.parse().ok()?;
    let min: f64 = t.next()?.parse().ok()?;
    let s: f64 = t.next()?.parse().ok()?;
    // Days from the civil date (proleptic Gregorian), March-based years.
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    Some(days as f64 * 86_400.0 + h * 3600.0 + min * 60.0 + s)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timestamps() {
        assert_eq!(parse_timestamp("1970-01-01T00:00:00Z"), Some(0.0));
        assert_eq!(parse_timestamp("2000-03-01T00:00:00Z"), Some(951_868_800.0));
        let t = parse_timestamp("2026-11-22T00:17:50.766945Z").unwrap_or_default();
        assert!((t - 1_795_306_670.766_945).abs() < 1e-4, "{t}");
        assert_eq!(parse_timestamp("2026-11-22 00:17:50Z"), None);
        assert_eq!(parse_timestamp("garbage"), None);
    }

    #[test]
    fn rates() {
        assert_eq!(rate(100, 2.0), 50.0);
        assert_eq!(rate(100, 0.0), 0.0);
    }
}
