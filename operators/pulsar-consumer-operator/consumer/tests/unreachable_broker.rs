//! Runs the real binary against a broker address nobody listens on: the
//! consumer must stay up, report 503 on `/healthz`, keep retrying, and exit 0
//! on SIGTERM. Also checks the configuration error path and that `produce`
//! fails (rather than hanging) without a broker.
//!
//! Everything polls with deadlines; nothing sleeps for a fixed time hoping
//! the process got somewhere.

#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_pulsar-consumer");

/// A loopback port that was free a moment ago (and, for the broker address,
/// that nothing listens on).
fn free_port() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    listener.local_addr().unwrap().port()
}

/// Kills the child if the test fails before it exited.
struct Guard(Child);

impl Drop for Guard {
    fn drop(&mut self) {
        if let Ok(None) = self.0.try_wait() {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
}

fn base_command() -> Command {
    let mut cmd = Command::new(BIN);
    for var in [
        "PULSAR_SERVER",
        "PULSAR_TOPIC",
        "PULSAR_SUBSCRIPTION_NAME",
        "PULSAR_INITIAL_POSITION",
        "PULSAR_TLS_CA_FILE",
        "PULSAR_MESSAGE",
        "PULSAR_MESSAGE_COUNT",
        "HTTP_BIND_ADDRESS",
        "LOG_FORMAT",
        "RUST_LOG",
    ] {
        cmd.env_remove(var);
    }
    cmd
}

/// Polls `f` every 50 ms until it returns `Some` or `limit` passes.
fn poll_until<T>(limit: Duration, what: &str, mut f: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + limit;
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        thread::sleep(Duration::from_millis(50));
    }
}

/// A minimal HTTP/1.1 GET; returns the status code and body.
fn http_get(port: u16, path: &str) -> Option<(u16, String)> {
    let mut stream = TcpStream::connect(("127.0.0.1", port)).ok()?;
    stream.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"
    )
    .ok()?;
    let mut response = String::new();
    stream.read_to_string(&mut response).ok()?;
    let status = response.split(' ').nth(1)?.parse().ok()?;
    let body = response.split_once("\r\n\r\n")?.1.to_owned();
    Some((status, body))
}

fn metric(body: &str, name: &str) -> Option<f64> {
    body.lines().find_map(|line| {
        let (n, v) = line.split_once(' ')?;
        (n == name).then(|| v.trim().parse().ok()).flatten()
    })
}

fn wait_exit(child: &mut Child, limit: Duration) -> ExitStatus {
    poll_until(limit, "the process to exit", || child.try_wait().unwrap())
}

#[test]
fn keeps_retrying_reports_unhealthy_and_exits_zero_on_sigterm() {
    let http_port = free_port();
    let broker_port = free_port();
    let child = base_command()
        .env("PULSAR_SERVER", format!("pulsar://127.0.0.1:{broker_port}"))
        .env("PULSAR_TOPIC", "my-topic")
        .env("PULSAR_SUBSCRIPTION_NAME", "test-sub")
        .env("HTTP_BIND_ADDRESS", format!("127.0.0.1:{http_port}"))
        .args(["--log-format", "json"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut child = Guard(child);

    // Collect JSON log lines from stdout on a thread.
    let stdout = child.0.stdout.take().unwrap();
    let (tx, rx) = mpsc::channel::<serde_json::Value>();
    thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            let value: serde_json::Value = serde_json::from_str(&line)
                .unwrap_or_else(|e| panic!("log line is not JSON ({e}): {line}"));
            if tx.send(value).is_err() {
                break;
            }
        }
    });
    let mut logs: Vec<serde_json::Value> = Vec::new();
    let saw = |logs: &mut Vec<serde_json::Value>, message: &str| {
        logs.extend(rx.try_iter());
        logs.iter().any(|l| l["message"] == message)
    };

    // Not connected: 503.
    let (status, body) = poll_until(Duration::from_secs(30), "/healthz", || {
        http_get(http_port, "/healthz")
    });
    assert_eq!(status, 503, "{body}");

    // A retry is logged, with its delay.
    poll_until(Duration::from_secs(30), "a retry log line", || {
        saw(&mut logs, "Pulsar unavailable, retrying").then_some(())
    });
    let retry = logs
        .iter()
        .find(|l| l["message"] == "Pulsar unavailable, retrying")
        .unwrap();
    assert_eq!(retry["level"], "WARN");
    assert!(retry["retry_in_ms"].as_u64().is_some(), "{retry}");
    assert!(
        retry["error"]
            .as_str()
            .unwrap()
            .starts_with("could not connect"),
        "{retry}"
    );

    // It keeps trying: the reconnect counter moves, and it stays unhealthy.
    let metrics = poll_until(Duration::from_secs(30), "a reconnect attempt", || {
        let (status, body) = http_get(http_port, "/metrics")?;
        assert_eq!(status, 200);
        (metric(&body, "pulsar_consumer_reconnects_total")? >= 1.0).then_some(body)
    });
    assert_eq!(metric(&metrics, "pulsar_consumer_connected"), Some(0.0));
    assert_eq!(
        metric(&metrics, "pulsar_consumer_messages_received_total"),
        Some(0.0)
    );
    assert_eq!(
        metric(&metrics, "pulsar_consumer_messages_acked_total"),
        Some(0.0)
    );
    assert_eq!(http_get(http_port, "/healthz").unwrap().0, 503);
    assert!(child.0.try_wait().unwrap().is_none(), "exited early");

    // SIGTERM: clean exit with status 0.
    let status = Command::new("kill")
        .args(["-TERM", &child.0.id().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    let status = wait_exit(&mut child.0, Duration::from_secs(20));
    assert!(status.success(), "exit status {status:?}");
    poll_until(Duration::from_secs(5), "the final log line", || {
        saw(&mut logs, "consumer stopped").then_some(())
    });
}

#[test]
fn configuration_errors_name_the_variable() {
    let output = base_command()
        .env("PULSAR_SERVER", "http://broker:8080")
        .env("PULSAR_TOPIC", "my-topic")
        .env("PULSAR_SUBSCRIPTION_NAME", "s")
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("invalid PULSAR_SERVER"), "{stderr}");

    let output = base_command()
        .env("PULSAR_SERVER", "pulsar://broker:6650")
        .env("PULSAR_TOPIC", "persistent://tenant/topic")
        .env("PULSAR_SUBSCRIPTION_NAME", "s")
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("invalid PULSAR_TOPIC"), "{stderr}");

    let output = base_command()
        .env("PULSAR_SERVER", "pulsar://broker:6650")
        .env("PULSAR_TOPIC", "t")
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("PULSAR_SUBSCRIPTION_NAME"), "{stderr}");
}

#[test]
fn produce_subcommand_ignores_consume_only_environment() {
    // The operator's environment (with a subscription name) must not make
    // `produce` fail to parse; with no broker it fails at connect time.
    let broker_port = free_port();
    let child = base_command()
        .env("PULSAR_SERVER", format!("pulsar://127.0.0.1:{broker_port}"))
        .env("PULSAR_TOPIC", "my-topic")
        .env("PULSAR_SUBSCRIPTION_NAME", "s")
        .args(["produce", "--count", "3"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut child = Guard(child);
    let status = wait_exit(&mut child.0, Duration::from_secs(90));
    assert_eq!(status.code(), Some(1));
    let mut stderr = String::new();
    child
        .0
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut stderr)
        .unwrap();
    assert!(stderr.contains("produce failed"), "{stderr}");
    assert!(stderr.contains("connecting to Pulsar"), "{stderr}");
    let mut stdout = String::new();
    child
        .0
        .stdout
        .take()
        .unwrap()
        .read_to_string(&mut stdout)
        .unwrap();
    assert!(!stdout.contains("sent"), "{stdout}");
}
