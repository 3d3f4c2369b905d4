//! A real Apache Pulsar broker and the `pulsar-consumer` app as local
//! processes, for the consumer's end-to-end tests.
//!
//! The broker is the standalone one of `cargo xtask pulsar up`, started on
//! demand once per test binary and shared by its tests; each test uses its own
//! topic and subscription. A test that restarts the broker takes
//! [`exclusive_broker`], every other one [`shared_broker`], so a restart never
//! happens under a test that does not expect it.

use crate::operator::{free_port, http_get, metric_sum, signal};
use crate::{poll, repo_root, target_dir, unique_suffix};
use anyhow::{Context, Result, anyhow, bail};
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::{Child, Stdio};
use std::time::Duration;
use tokio::sync::{RwLock, RwLockReadGuard, RwLockWriteGuard};

/// Guards the shared broker: readers use it, the writer restarts it.
static BROKER_LOCK: RwLock<()> = RwLock::const_new(());

/// The log line the consumer writes for every message, before acknowledging it.
const RECEIVED: &str = "message received";

/// Runs `cargo xtask pulsar <action>` and returns the service URL it prints
/// (`export PULSAR_SERVER=...`).
async fn xtask_pulsar(action: &str) -> Result<String> {
    let out = tokio::process::Command::from(xtask::support::cmd::cargo())
        .current_dir(repo_root())
        .args(["run", "--quiet", "-p", "xtask", "--", "pulsar", action])
        .stdin(Stdio::null())
        .output()
        .await
        .with_context(|| format!("could not run `cargo xtask pulsar {action}`"))?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    stdout
        .lines()
        .rev()
        .find_map(|l| l.strip_prefix("export PULSAR_SERVER="))
        .map(str::to_owned)
        .filter(|_| out.status.success())
        .ok_or_else(|| {
            anyhow!(
                "`cargo xtask pulsar {action}` failed ({}):\n{stdout}\n{}",
                out.status,
                String::from_utf8_lossy(&out.stderr)
            )
        })
}

/// The broker's service URL (`pulsar://127.0.0.1:6650`), starting the broker
/// with `cargo xtask pulsar up` the first time it is asked for (once per test
/// binary; `up` does nothing when the broker already runs).
pub async fn service_url() -> Result<String> {
    static URL: tokio::sync::OnceCell<std::result::Result<String, String>> =
        tokio::sync::OnceCell::const_new();
    URL.get_or_init(|| async { xtask_pulsar("up").await.map_err(|e| format!("{e:#}")) })
        .await
        .clone()
        .map_err(|e| anyhow!(e))
}

/// The broker, for a test that does not restart it: its service URL and a
/// guard to hold for the whole test.
pub async fn shared_broker() -> Result<(String, RwLockReadGuard<'static, ()>)> {
    let guard = BROKER_LOCK.read().await;
    Ok((service_url().await?, guard))
}

/// The broker, for a test that restarts it: no other broker test runs while
/// the guard is held.
pub async fn exclusive_broker() -> Result<(String, RwLockWriteGuard<'static, ()>)> {
    let guard = BROKER_LOCK.write().await;
    Ok((service_url().await?, guard))
}

/// Restarts the broker keeping its data (`cargo xtask pulsar restart`); hold
/// the guard of [`exclusive_broker`]. Returns the service URL.
pub async fn restart_broker(_guard: &RwLockWriteGuard<'static, ()>) -> Result<String> {
    xtask_pulsar("restart").await
}

/// The addresses of the shared broker's Service `pulsar/pulsar-broker` (headless: its
/// name resolves to them), comma-separated as `PULSAR_ADMIN_ALLOWED_CIDRS` takes them:
/// an administrator grants an operator a broker every tenant shares by listing them.
pub async fn broker_addresses(client: &kube::Client) -> Result<String> {
    use k8s_openapi::api::discovery::v1::EndpointSlice;
    use kube::api::{Api, ListParams};
    let slices: Api<EndpointSlice> = Api::namespaced(client.clone(), "pulsar");
    let addresses: std::collections::BTreeSet<String> = slices
        .list(&ListParams::default().labels("kubernetes.io/service-name=pulsar-broker"))
        .await?
        .items
        .iter()
        .flat_map(|s| s.endpoints.iter().flatten())
        .flat_map(|e| e.addresses.iter().cloned())
        .collect();
    anyhow::ensure!(
        !addresses.is_empty(),
        "no address of the Service pulsar/pulsar-broker"
    );
    Ok(addresses.into_iter().collect::<Vec<_>>().join(","))
}

/// The port of a `pulsar://host:port` URL.
pub fn broker_port(service_url: &str) -> Result<u16> {
    service_url
        .rsplit_once(':')
        .and_then(|(_, p)| p.trim_end_matches('/').parse().ok())
        .with_context(|| format!("no port in {service_url}"))
}

/// Whether something accepts connections on 127.0.0.1:`port`.
pub fn port_open(port: u16) -> bool {
    std::net::TcpStream::connect_timeout(
        &std::net::SocketAddr::from(([127, 0, 0, 1], port)),
        Duration::from_millis(500),
    )
    .is_ok()
}

/// A topic name of its own for one test.
pub fn unique_topic(label: &str) -> String {
    format!("e2e-{label}-{}", unique_suffix())
}

/// The build of the app (debug unless `E2E_PROFILE` says otherwise).
pub fn consumer_binary() -> Result<PathBuf> {
    let binary = crate::binary_dir().join("pulsar-consumer");
    if !binary.exists() {
        bail!(
            "{} is not built: run `cargo build --bins -p pulsar-consumer` (cargo xtask test does)",
            binary.display()
        );
    }
    Ok(binary)
}

/// The payloads `pulsar-consumer produce --message <message> --count <count>`
/// sends (count > 1): `"<message> #1"` ... `"<message> #<count>"`.
pub fn expected_payloads(message: &str, count: u64) -> Vec<String> {
    (1..=count).map(|i| format!("{message} #{i}")).collect()
}

/// Sends `count` messages with `pulsar-consumer produce` and checks that it
/// reports all of them confirmed by the broker.
pub async fn produce(server: &str, topic: &str, message: &str, count: u64) -> Result<()> {
    let out = tokio::process::Command::new(consumer_binary()?)
        .arg("produce")
        .args(["--count", &count.to_string(), "--message", message])
        .env("PULSAR_SERVER", server)
        .env("PULSAR_TOPIC", topic)
        .env("RUST_LOG", "warn")
        .stdin(Stdio::null())
        .output()
        .await
        .context("running pulsar-consumer produce")?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    let want = format!("sent {count} messages to ");
    if !out.status.success() || !stdout.contains(&want) {
        bail!(
            "pulsar-consumer produce failed ({}): {stdout}\n{}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(())
}

/// The counters of a consumer's `/metrics`.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Counters {
    /// `pulsar_consumer_messages_received_total`.
    pub received: u64,
    /// `pulsar_consumer_messages_acked_total`.
    pub acked: u64,
    /// `pulsar_consumer_message_errors_total`.
    pub errors: u64,
    /// `pulsar_consumer_reconnects_total`.
    pub reconnects: u64,
    /// `pulsar_consumer_connected` (0 or 1).
    pub connected: u64,
}

impl Counters {
    /// Reads the counters from a metrics text.
    pub fn parse(text: &str) -> Counters {
        let get = |name: &str| metric_sum(text, name, &[]) as u64;
        Counters {
            received: get("pulsar_consumer_messages_received_total"),
            acked: get("pulsar_consumer_messages_acked_total"),
            errors: get("pulsar_consumer_message_errors_total"),
            reconnects: get("pulsar_consumer_reconnects_total"),
            connected: get("pulsar_consumer_connected"),
        }
    }
}

/// One `message received` line of a consumer's JSON log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Received {
    /// The message payload.
    pub payload: String,
    /// The message id, `ledger:entry:partition:batch`.
    pub id: String,
}

/// The `message received` events of a JSON log (other lines are skipped).
pub fn parse_received(log: &str) -> Vec<Received> {
    log.lines()
        .filter(|l| l.contains(RECEIVED))
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|v| v["message"] == RECEIVED)
        .filter_map(|v| {
            Some(Received {
                payload: v["payload"].as_str()?.to_owned(),
                id: v["id"].as_str()?.to_owned(),
            })
        })
        .collect()
}

/// How often each payload occurs in the given logs.
pub fn payload_counts<'a>(
    logs: impl IntoIterator<Item = &'a [Received]>,
) -> BTreeMap<String, usize> {
    let mut counts = BTreeMap::new();
    for log in logs {
        for r in log {
            *counts.entry(r.payload.clone()).or_insert(0) += 1;
        }
    }
    counts
}

/// A `pulsar-consumer` (consume) process with JSON logs; killed when dropped.
pub struct ConsumerProcess {
    child: Child,
    /// A name for messages (also its `HOSTNAME`, the consumer name at the broker).
    pub name: String,
    /// Its stdout (the JSON log) and stderr.
    pub log_path: PathBuf,
    /// Port of `/healthz` and `/metrics` on 127.0.0.1.
    pub http_port: u16,
}

impl ConsumerProcess {
    /// Starts a consumer of `topic` on the Shared subscription `subscription`.
    pub fn start(
        server: &str,
        topic: &str,
        subscription: &str,
        name: &str,
    ) -> Result<ConsumerProcess> {
        let binary = consumer_binary()?;
        let http_port = free_port()?;
        let logs = target_dir().join("e2e-logs");
        std::fs::create_dir_all(&logs)?;
        let name = format!("{name}-{}", unique_suffix());
        let log_path = logs.join(format!("pulsar-{topic}-{name}.log"));
        let child =
            xtask::support::local_consumer::spawn(&xtask::support::local_consumer::Launch {
                binary: &binary,
                server,
                topic,
                subscription,
                http_port,
                hostname: &name,
                log_path: &log_path,
            })?;
        Ok(ConsumerProcess {
            child,
            name,
            log_path,
            http_port,
        })
    }

    /// The process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Fails if the process has exited.
    pub fn check_running(&mut self) -> Result<()> {
        if let Some(status) = self.child.try_wait()? {
            bail!(
                "consumer {} exited ({status}); log:\n{}",
                self.name,
                self.log_tail(40)
            );
        }
        Ok(())
    }

    /// The status code of `GET /healthz`, or `None` when it does not answer.
    pub fn healthz(&self) -> Option<u16> {
        http_get(self.http_port, "/healthz").ok().map(|(c, _)| c)
    }

    /// The `/metrics` counters.
    pub fn counters(&self) -> Result<Counters> {
        let (code, body) = http_get(self.http_port, "/metrics")
            .with_context(|| format!("GET /metrics of consumer {}", self.name))?;
        if code != 200 {
            bail!("/metrics of consumer {} answered {code}", self.name);
        }
        Ok(Counters::parse(&body))
    }

    /// Waits until `/healthz` says it is connected (subscribed).
    pub async fn wait_connected(&mut self, timeout: Duration) -> Result<()> {
        let what = format!("consumer {} to subscribe", self.name);
        self.wait_healthz(&what, 200, timeout).await
    }

    /// Waits (`what`, for the error) until `/healthz` answers `code`, failing at once if
    /// the process exits; the error carries the end of its log.
    pub async fn wait_healthz(&mut self, what: &str, code: u16, timeout: Duration) -> Result<()> {
        let result = poll(what, timeout, || {
            let running = self.check_running();
            let now = self.healthz();
            async move {
                running?;
                Ok((now == Some(code)).then_some(()))
            }
        })
        .await;
        result.with_context(|| format!("log:\n{}", self.log_tail(40)))
    }

    /// Everything it logged so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log_path).unwrap_or_default()
    }

    /// The last `n` lines of its log.
    pub fn log_tail(&self, n: usize) -> String {
        let log = self.log();
        let lines: Vec<&str> = log.lines().collect();
        lines[lines.len().saturating_sub(n)..].join("\n")
    }

    /// The messages it logged as received so far.
    pub fn received(&self) -> Vec<Received> {
        parse_received(&self.log())
    }

    /// SIGKILL (`kill -9`), then reaps the process.
    pub fn kill_9(&mut self) -> Result<()> {
        signal(self.child.id(), "KILL");
        let status = self.child.wait()?;
        if status.success() {
            bail!("consumer {} exited 0 instead of being killed", self.name);
        }
        Ok(())
    }

    /// SIGSTOP: freezes the process (its sockets stay open).
    pub fn pause(&self) {
        signal(self.child.id(), "STOP");
    }

    /// SIGCONT after [`ConsumerProcess::pause`].
    pub fn resume(&self) {
        signal(self.child.id(), "CONT");
    }

    /// SIGTERM and waits for the exit; returns whether it exited 0.
    pub fn terminate(&mut self) -> Result<bool> {
        signal(self.child.id(), "TERM");
        Ok(self.child.wait()?.success())
    }
}

impl Drop for ConsumerProcess {
    fn drop(&mut self) {
        // A paused process must be continued to die of SIGTERM; SIGKILL works
        // either way.
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_received_lines() {
        let log = concat!(
            "{\"message\":\"serving /healthz and /metrics\"}\n",
            "{\"timestamp\":\"t\",\"level\":\"INFO\",\"message\":\"message received\",",
            "\"topic\":\"persistent://public/default/x\",\"id\":\"1:2:-1:-1\",",
            "\"payload\":\"m #1\",\"target\":\"pulsar_consumer::consume\"}\n",
            "not json, message received\n",
        );
        assert_eq!(
            parse_received(log),
            vec![Received {
                payload: "m #1".into(),
                id: "1:2:-1:-1".into()
            }]
        );
    }

    #[test]
    fn counters_from_metrics() {
        let text = "# TYPE pulsar_consumer_messages_acked counter\n\
                    pulsar_consumer_messages_acked_total 7\n\
                    pulsar_consumer_messages_received_total 8\n\
                    pulsar_consumer_reconnects_total 2\n\
                    pulsar_consumer_connected 1\n";
        let c = Counters::parse(text);
        assert_eq!(
            (c.acked, c.received, c.reconnects, c.connected),
            (7, 8, 2, 1)
        );
        assert_eq!(broker_port("pulsar://127.0.0.1:6650").ok(), Some(6650));
        assert_eq!(expected_payloads("m", 2), vec!["m #1", "m #2"]);
    }
}
