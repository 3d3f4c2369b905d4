//! A real Jaeger and a real Prometheus, built from their Go modules (`cargo xtask tool`)
//! and run on this machine on 127.0.0.1 for one test, stopped when dropped.
//!
//! - Jaeger v2 keeps traces in memory; it receives OTLP/HTTP on 127.0.0.1:4318, which the
//!   pods of the local cluster reach as `http://jaeger-collector.observability:4318` (the
//!   node forwards the bridge address to it), and answers its query API on
//!   [`Jaeger::query_port`].
//! - Prometheus scrapes what the shipped ServiceMonitors say
//!   (`xtask::support::service_monitor`) and answers PromQL on [`Prometheus::port`].

use anyhow::{Context, Result, bail};
use serde_json::{Value, json};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;
use xtask::support::process_group;

use crate::operator::http_get as get;
use crate::{poll, target_dir, unique_suffix};

/// The OTLP/HTTP port Jaeger receives on (fixed: the node forwards it to pods).
pub const OTLP_PORT: u16 = 4318;
/// What pods set `OTEL_EXPORTER_OTLP_ENDPOINT` to.
pub const OTLP_ENDPOINT_FOR_PODS: &str = "http://jaeger-collector.observability:4318";

/// A process of this test, stopped (its group) when dropped; its output in `log`.
struct Server {
    child: Child,
    name: &'static str,
    log: PathBuf,
}

impl Server {
    fn start(name: &'static str, command: &mut Command, dir: &Path) -> Result<Server> {
        let log = dir.join(format!("{name}.log"));
        let out = std::fs::File::create(&log)?;
        let child = process_group::spawn(
            command
                .current_dir(dir)
                .stdin(Stdio::null())
                .stdout(out.try_clone()?)
                .stderr(out),
        )
        .with_context(|| format!("starting {name}"))?;
        Ok(Server { child, name, log })
    }

    /// Fails with its log when it has exited.
    fn running(&mut self) -> Result<()> {
        if let Some(status) = self.child.try_wait()? {
            bail!(
                "{} exited ({status}):\n{}",
                self.name,
                std::fs::read_to_string(&self.log).unwrap_or_default()
            );
        }
        Ok(())
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = process_group::stop_child(&mut self.child, Duration::from_secs(5));
    }
}

/// A folder of its own under `target/e2e-observability/`.
fn work_dir(what: &str) -> Result<PathBuf> {
    let dir = target_dir()
        .join("e2e-observability")
        .join(format!("{what}-{}", unique_suffix()));
    std::fs::create_dir_all(&dir)?;
    Ok(dir)
}

/// Waits until `GET 127.0.0.1:<port><path>` answers 200.
async fn wait_ready(server: &mut Server, port: u16, path: &str) -> Result<()> {
    poll(
        &format!("{} answering {path}", server.name),
        Duration::from_secs(90),
        || {
            let answer = server.running().map(|()| get(port, path));
            async move {
                match answer? {
                    Ok((200, _)) => Ok(Some(())),
                    _ => Ok(None),
                }
            }
        },
    )
    .await
}

/// `text` percent-encoded for a query string.
pub fn encode(text: &str) -> String {
    let mut out = String::with_capacity(text.len() * 3);
    for b in text.bytes() {
        if b.is_ascii_alphanumeric() || b"-_.~".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

use xtask::support::local_operator::free_port;

/// Jaeger v2 with in-memory storage.
pub struct Jaeger {
    server: Server,
    /// Its query API's port (`/api/traces`, `/api/services`).
    pub query_port: u16,
}

impl Jaeger {
    /// Starts it and waits for its query API. Fails when 127.0.0.1:4318 is taken.
    pub async fn start() -> Result<Jaeger> {
        if std::net::TcpStream::connect(("127.0.0.1", OTLP_PORT)).is_ok() {
            bail!("127.0.0.1:{OTLP_PORT} is already in use: another Jaeger or collector runs");
        }
        let binary = crate::tools::jaeger().await?;
        let dir = work_dir("jaeger")?;
        let query_port = free_port()?;
        let grpc_port = free_port()?;
        // JSON is YAML: the collector reads it as its configuration. Only what the test
        // needs listens, on 127.0.0.1: OTLP/HTTP in, traces in memory, the query API out.
        let config = json!({
            "service": {
                "extensions": ["jaeger_storage", "jaeger_query"],
                "pipelines": {"traces": {
                    "receivers": ["otlp"],
                    "processors": ["batch"],
                    "exporters": ["jaeger_storage_exporter"]
                }},
                "telemetry": {"metrics": {"level": "none"}, "logs": {"level": "info"}}
            },
            "extensions": {
                "jaeger_storage": {"backends": {"memory": {"memory": {"max_traces": 100000}}}},
                "jaeger_query": {
                    "storage": {"traces": "memory"},
                    "http": {"endpoint": format!("127.0.0.1:{query_port}")},
                    "grpc": {"endpoint": format!("127.0.0.1:{grpc_port}")}
                }
            },
            "receivers": {"otlp": {"protocols": {
                "http": {"endpoint": format!("127.0.0.1:{OTLP_PORT}")}
            }}},
            "processors": {"batch": {"timeout": "200ms"}},
            "exporters": {"jaeger_storage_exporter": {"trace_storage": "memory"}}
        });
        let file = dir.join("config.yaml");
        std::fs::write(&file, serde_json::to_string_pretty(&config)?)?;
        let mut server = Server::start(
            "jaeger",
            Command::new(binary).arg("--config").arg(&file),
            &dir,
        )?;
        wait_ready(&mut server, query_port, "/api/services").await?;
        Ok(Jaeger { server, query_port })
    }

    /// The traces of `service` (Jaeger's JSON `data`), newest first, up to `limit`.
    pub fn traces(&mut self, service: &str, limit: usize) -> Result<Vec<Value>> {
        self.server.running()?;
        let (code, body) = get(
            self.query_port,
            &format!(
                "/api/traces?service={}&limit={limit}&lookback=1h",
                encode(service)
            ),
        )?;
        if code != 200 {
            bail!("Jaeger's /api/traces answered {code}: {body}");
        }
        let answer: Value = serde_json::from_str(&body).context("Jaeger's /api/traces")?;
        Ok(answer["data"].as_array().cloned().unwrap_or_default())
    }
}

/// Prometheus with a configuration of scrape jobs.
pub struct Prometheus {
    server: Server,
    /// Its HTTP API's port.
    pub port: u16,
}

impl Prometheus {
    /// Starts it with `scrape_configs`, scraping every `interval`, and waits until it is
    /// ready.
    pub async fn start(scrape_configs: Vec<Value>, interval: &str) -> Result<Prometheus> {
        let binary = crate::tools::prometheus()?;
        let dir = work_dir("prometheus")?;
        let port = free_port()?;
        let config = json!({
            "global": {"scrape_interval": interval, "evaluation_interval": interval},
            "scrape_configs": scrape_configs,
        });
        let file = dir.join("prometheus.yml");
        std::fs::write(&file, serde_json::to_string_pretty(&config)?)?;
        // Check it first: a bad configuration is named as such, not as a timeout.
        let promtool = binary.with_file_name("promtool");
        let check = Command::new(&promtool)
            .args(["check", "config", "--syntax-only"])
            .arg(&file)
            .output()
            .with_context(|| format!("running {}", promtool.display()))?;
        if !check.status.success() {
            bail!(
                "promtool check config: {}{}",
                String::from_utf8_lossy(&check.stdout),
                String::from_utf8_lossy(&check.stderr)
            );
        }
        let mut server = Server::start(
            "prometheus",
            Command::new(binary)
                .arg(format!("--config.file={}", file.display()))
                .arg(format!(
                    "--storage.tsdb.path={}",
                    dir.join("data").display()
                ))
                .arg(format!("--web.listen-address=127.0.0.1:{port}")),
            &dir,
        )?;
        wait_ready(&mut server, port, "/-/ready").await?;
        Ok(Prometheus { server, port })
    }

    /// An instant query's result (`data.result`), or an error with Prometheus' answer.
    pub fn query(&mut self, promql: &str) -> Result<Vec<Value>> {
        self.server.running()?;
        let (code, body) = get(
            self.port,
            &format!("/api/v1/query?query={}", encode(promql)),
        )?;
        let answer: Value = serde_json::from_str(&body)
            .with_context(|| format!("Prometheus answered {code}: {body}"))?;
        if answer["status"] != "success" {
            bail!("{promql}: Prometheus answered {code}: {body}");
        }
        Ok(answer["data"]["result"]
            .as_array()
            .cloned()
            .unwrap_or_default())
    }

    /// The scrape targets (`/api/v1/targets`, active ones).
    pub fn targets(&mut self) -> Result<Vec<Value>> {
        self.server.running()?;
        let (_, body) = get(self.port, "/api/v1/targets?state=active")?;
        let answer: Value = serde_json::from_str(&body).context("/api/v1/targets")?;
        Ok(answer["data"]["activeTargets"]
            .as_array()
            .cloned()
            .unwrap_or_default())
    }
}
