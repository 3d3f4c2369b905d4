//! Helpers shared by the integration tests: start the real binary on a free
//! loopback port and talk HTTP/1.1 to it with nothing but `std`.

#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use std::fs::File;
use std::io::{Read, Write};
use std::net::{Ipv4Addr, TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

/// How long the server gets to answer `/healthz` after it starts.
const STARTUP_DEADLINE: Duration = Duration::from_secs(30);

/// A running `lolcow-web`; killed when dropped.
pub struct Server {
    child: Child,
    /// The port it listens on (on 127.0.0.1).
    pub port: u16,
    /// The port of its probe listener (`PROBE_PORT`).
    pub probe_port: u16,
    log: PathBuf,
}

impl Server {
    /// Starts the binary with `greeting` in `GREETING` (or no greeting when
    /// `None`) and waits until `/healthz` answers.
    pub fn start(greeting: Option<&str>) -> Server {
        Server::start_with_env(greeting, &[])
    }

    /// Like [`Server::start`], with extra environment variables (e.g. limits).
    pub fn start_with_env(greeting: Option<&str>, env: &[(&str, &str)]) -> Server {
        // A few tries in case another process grabs the port between us
        // releasing it and the server binding it.
        let mut last_log = String::new();
        for _ in 0..3 {
            let port = free_port();
            let probe_port = free_port();
            let log = temp_path(&format!("lolcow-web-{port}.log"));
            let log_file = File::create(&log).expect("create server log");
            let mut command = Command::new(env!("CARGO_BIN_EXE_lolcow-web"));
            command
                .args(["--listen", "127.0.0.1"])
                .env("PORT", port.to_string())
                .env("PROBE_PORT", probe_port.to_string())
                .env_remove("BIND_ADDRESS")
                .env("RUST_LOG", "info")
                .envs(env.iter().copied())
                .stdin(Stdio::null())
                .stdout(log_file.try_clone().expect("clone log handle"))
                .stderr(log_file);
            match greeting {
                Some(g) => command.env("GREETING", g),
                None => command.env_remove("GREETING"),
            };
            let child = command.spawn().expect("start lolcow-web");
            let mut server = Server {
                child,
                port,
                probe_port,
                log,
            };
            match server.wait_healthy() {
                Ok(()) => return server,
                Err(log) => last_log = log,
            }
        }
        panic!("lolcow-web never became healthy; last log:\n{last_log}");
    }

    /// Polls `/healthz` on both listeners until it answers 200 or the
    /// deadline passes; on failure returns the server's log.
    fn wait_healthy(&mut self) -> Result<(), String> {
        let deadline = Instant::now() + STARTUP_DEADLINE;
        while Instant::now() < deadline {
            if let Ok(Some(status)) = self.child.try_wait() {
                return Err(format!("exited early with {status}\n{}", self.log()));
            }
            let healthy = |port| try_get(port, "/healthz", &[]).is_ok_and(|r| r.status == 200);
            if healthy(self.port) && healthy(self.probe_port) {
                return Ok(());
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        Err(format!(
            "no answer within {STARTUP_DEADLINE:?}\n{}",
            self.log()
        ))
    }

    /// What the server has logged so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// `GET path` with extra request headers.
    pub fn get(&self, path: &str, headers: &[(&str, &str)]) -> HttpResponse {
        try_get(self.port, path, headers)
            .unwrap_or_else(|e| panic!("GET {path} failed: {e}\n{}", self.log()))
    }

    /// `GET path` on the probe listener.
    pub fn get_probe(&self, path: &str) -> HttpResponse {
        try_get(self.probe_port, path, &[])
            .unwrap_or_else(|e| panic!("GET {path} (probes) failed: {e}\n{}", self.log()))
    }

    /// The server's base URL.
    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}/", self.port)
    }

    /// Sends SIGTERM and waits (with a deadline) for the process to exit.
    pub fn terminate(&mut self, deadline: Duration) -> Option<ExitStatus> {
        let status = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status()
            .expect("run kill");
        assert!(status.success(), "kill -TERM failed");
        let end = Instant::now() + deadline;
        while Instant::now() < end {
            if let Some(status) = self.child.try_wait().expect("wait for server") {
                return Some(status);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        None
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_file(&self.log);
    }
}

/// A parsed HTTP response.
#[derive(Debug)]
pub struct HttpResponse {
    /// Status code.
    pub status: u16,
    /// Headers, names lowercased.
    pub headers: Vec<(String, String)>,
    /// Body as text.
    pub body: String,
}

impl HttpResponse {
    /// The first header called `name` (lowercase).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }
}

/// A port that was free a moment ago.
pub fn free_port() -> u16 {
    TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
        .and_then(|l| l.local_addr())
        .expect("find a free port")
        .port()
}

/// A fresh path under cargo's temporary directory for this package's tests.
pub fn temp_path(name: &str) -> PathBuf {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or_default();
    PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("{}-{nanos}-{name}", std::process::id()))
}

/// A minimal HTTP/1.1 GET with `Connection: close`.
fn try_get(port: u16, path: &str, headers: &[(&str, &str)]) -> std::io::Result<HttpResponse> {
    let mut stream = TcpStream::connect((Ipv4Addr::LOCALHOST, port))?;
    stream.set_read_timeout(Some(Duration::from_secs(10)))?;
    stream.set_write_timeout(Some(Duration::from_secs(10)))?;
    let mut request =
        format!("GET {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nConnection: close\r\n");
    for (name, value) in headers {
        request.push_str(&format!("{name}: {value}\r\n"));
    }
    request.push_str("\r\n");
    stream.write_all(request.as_bytes())?;
    let mut raw = Vec::new();
    stream.read_to_end(&mut raw)?;
    let raw = String::from_utf8(raw)
        .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e))?;
    let bad = |what: &str| std::io::Error::new(std::io::ErrorKind::InvalidData, what.to_owned());
    let (head, body) = raw
        .split_once("\r\n\r\n")
        .ok_or_else(|| bad("no header end"))?;
    let mut lines = head.split("\r\n");
    let status = lines
        .next()
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| bad("bad status line"))?;
    let headers: Vec<(String, String)> = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(n, v)| (n.trim().to_ascii_lowercase(), v.trim().to_owned()))
        .collect();
    let chunked = headers
        .iter()
        .any(|(n, v)| n == "transfer-encoding" && v.eq_ignore_ascii_case("chunked"));
    let body = if chunked {
        dechunk(body).ok_or_else(|| bad("bad chunked body"))?
    } else {
        body.to_owned()
    };
    Ok(HttpResponse {
        status,
        headers,
        body,
    })
}

/// Decodes a chunked body.
fn dechunk(mut body: &str) -> Option<String> {
    let mut out = String::new();
    loop {
        let (size, rest) = body.split_once("\r\n")?;
        let size = usize::from_str_radix(size.split(';').next()?.trim(), 16).ok()?;
        if size == 0 {
            return Some(out);
        }
        out.push_str(rest.get(..size)?);
        body = rest.get(size + 2..)?;
    }
}
