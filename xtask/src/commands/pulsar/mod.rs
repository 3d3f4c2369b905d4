//! A real, local Apache Pulsar broker for the end-to-end tests of the Pulsar
//! consumer app: `up`, `down` and `status`.
//!
//! # Why it is assembled from Maven Central
//!
//! The machines this project is developed and tested on reach only package
//! registries (Maven Central among them); Pulsar's binary tarball and its
//! container images cannot be downloaded. But every jar of a Pulsar broker is
//! published on Maven Central, and `pulsar-broker` contains
//! `org.apache.pulsar.PulsarStandaloneStarter`, the entry point behind
//! `bin/pulsar standalone`. So the broker is assembled like this:
//!
//! * `xtask/pulsar/pom.xml` depends on `org.apache.pulsar:pulsar-broker` and
//!   imports Pulsar's own parent pom as a BOM, so that every third-party jar
//!   has the version the official distribution ships. Maven copies the
//!   runtime classpath (about 330 jars, 240 MB) once into
//!   `${XDG_CACHE_HOME:-$HOME/.cache}/rust-operators/pulsar/<version>/lib`.
//! * `xtask/pulsar/standalone.conf` is our own minimal configuration:
//!   loopback only, a single embedded bookie, metadata in a local RocksDB store
//!   (no ZooKeeper server), no functions worker, no stream storage, small
//!   caches. It is rendered with the requested ports into the state directory.
//! * `xtask/pulsar/log4j2.xml` sends the broker's log to stdout, which lands in
//!   the log file.
//!
//! The broker runs as a background `java` process in its own process group,
//! with its pid file, log file and data under
//! `${XDG_STATE_HOME:-$HOME/.local/state}/rust-operators/pulsar/`. Every `up`
//! that actually starts a broker starts from empty data; `down` stops the whole
//! process group and deletes the data; `restart` stops it and starts it again
//! on the same data (what a broker outage looks like to clients).
//!
//! Requirements: Java 17 or newer and Maven (`apt-get install -y
//! openjdk-17-jre-headless maven`); Maven is needed only for the first `up` of
//! a Pulsar version.
//!
//! Tunables (environment variables, all optional): `XTASK_PULSAR_BOOKIE_PORT`
//! (default 13181), `XTASK_PULSAR_JAVA_OPTS` (extra JVM options appended to the
//! defaults, e.g. `-Xmx1g`), `JAVA_HOME` (which `java` to use).

mod classpath;
mod state;
use classpath::*;
use state::*;
use xtask::{say, say_err};

use anyhow::{Context, Result, bail};
use std::fs::{self, File, OpenOptions};
use std::io::Write;
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::thread::sleep;
use std::time::{Duration, Instant};
use xtask::support::process_group;

/// The Pulsar release that is assembled and run. Keep it in step with
/// `pulsar.version` in `xtask/pulsar/pom.xml` (it is also passed to Maven
/// explicitly, so this constant wins).
pub const PULSAR_VERSION: &str = "4.2.4";

/// The Maven project that resolves the broker's classpath.
const POM: &str = include_str!("../../../pulsar/pom.xml");
/// Our standalone configuration; ports are substituted by [`render_conf`].
const CONF_TEMPLATE: &str = include_str!("../../../pulsar/standalone.conf");
/// Logging configuration for the broker process.
const LOG4J2: &str = include_str!("../../../pulsar/log4j2.xml");

/// Entry point of `bin/pulsar standalone`, part of `pulsar-broker`.
const MAIN_CLASS: &str = "org.apache.pulsar.PulsarStandaloneStarter";
/// Port of the embedded bookie unless `XTASK_PULSAR_BOOKIE_PORT` says otherwise.
const DEFAULT_BOOKIE_PORT: u16 = 13181;
/// How long `up` waits for a started broker to serve.
const READY_TIMEOUT: Duration = Duration::from_secs(180);
/// How long `down` waits after SIGTERM before it sends SIGKILL.
const STOP_TIMEOUT: Duration = Duration::from_secs(20);
/// The standard JVM options; `XTASK_PULSAR_JAVA_OPTS` is appended.
const JVM_OPTS: &[&str] = &[
    "-Xms64m",
    "-Xmx512m",
    "-XX:MaxDirectMemorySize=256m",
    // A short-lived test broker on a 2-core machine: the serial collector
    // and the C1-only JIT halve the startup time and use less memory.
    "-XX:+UseSerialGC",
    "-XX:TieredStopAtLevel=1",
    "-XX:+ExitOnOutOfMemoryError",
    "-Djava.net.preferIPv4Stack=true",
    "-Dio.netty.tryReflectionSetAccessible=true",
    // What Pulsar's own launcher opens on Java 17 (Netty direct memory,
    // container-aware CPU/memory metrics of the load manager).
    "--add-opens=java.base/java.nio=ALL-UNNAMED",
    "--add-opens=java.base/jdk.internal.misc=ALL-UNNAMED",
    "--add-opens=java.base/jdk.internal.platform=ALL-UNNAMED",
    "--add-opens=java.base/sun.net=ALL-UNNAMED",
    "--add-opens=java.management/sun.management=ALL-UNNAMED",
    "--add-opens=jdk.management/com.sun.management.internal=ALL-UNNAMED",
];
/// What to install when Java or Maven is missing.
const INSTALL_HINT: &str = "apt-get install -y openjdk-17-jre-headless maven";

/// Ports of the broker that [`up`] starts. All of them bind to 127.0.0.1.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PulsarOptions {
    /// Binary protocol port (`pulsar://127.0.0.1:<broker_port>`). Default 6650.
    pub broker_port: u16,
    /// HTTP port of the admin REST API (`http://127.0.0.1:<web_port>`).
    /// Default 18080, away from the usual 8080.
    pub web_port: u16,
}

impl Default for PulsarOptions {
    fn default() -> Self {
        Self {
            broker_port: 6650,
            web_port: 18080,
        }
    }
}

/// Where a running broker can be reached.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PulsarInfo {
    /// Service URL for Pulsar clients, e.g. `pulsar://127.0.0.1:6650`.
    pub service_url: String,
    /// Base URL of the admin REST API, e.g. `http://127.0.0.1:18080`.
    pub admin_url: String,
    /// The broker's log file (stdout and stderr of the Java process).
    pub log_path: PathBuf,
}

impl PulsarInfo {
    fn new(ports: &Ports, log_path: PathBuf) -> Self {
        Self {
            service_url: format!("pulsar://127.0.0.1:{}", ports.broker),
            admin_url: format!("http://127.0.0.1:{}", ports.web),
            log_path,
        }
    }
}

/// Makes sure a broker is running and serving, and says where.
///
/// If the broker started by an earlier `up` is still running and answers on
/// its ports, this returns at once and changes nothing (it fails if that broker
/// runs on other ports than `opts` asks for). Otherwise it assembles the
/// broker's classpath with Maven if this Pulsar version has not been assembled
/// yet (first time only, a minute or a few), deletes any old data, starts the
/// broker in the background and waits up to 180 s until the binary port
/// accepts connections and the admin API shows the `public/default`
/// namespace. If the broker does not get there, the tail of its log is
/// printed, the process is stopped and an error is returned.
pub fn up(opts: &PulsarOptions) -> Result<PulsarInfo> {
    let dirs = Dirs::new()?;
    fs::create_dir_all(&dirs.state)
        .with_context(|| format!("creating {}", dirs.state.display()))?;
    let _lock = Lock::acquire(&dirs.state.join("up.lock"))?;

    if let Some(state) = State::read(&dirs)? {
        if process_group::alive(state.pid) && is_our_broker(state.pid) {
            if state.ports.broker != opts.broker_port || state.ports.web != opts.web_port {
                bail!(
                    "a Pulsar broker started earlier is running with broker port {} and web port {} \
                     (pid {}), not the requested {} and {}; use it, or stop it first with \
                     `cargo xtask pulsar down`",
                    state.ports.broker,
                    state.ports.web,
                    state.pid,
                    opts.broker_port,
                    opts.web_port
                );
            }
            let info = PulsarInfo::new(&state.ports, dirs.log());
            let conf = fs::read_to_string(dirs.state.join("standalone.conf")).unwrap_or_default();
            let advertised = format!("\nadvertisedAddress={}\n", advertised_address());
            if serving(&state.ports) && !conf.contains(&advertised) {
                // Started before the local cluster's real node: pods could
                // not follow the broker's lookup answers.
                say!(
                    "pulsar: the local cluster's real node is up: restarting the broker (pid {}) \
                     so it advertises {} to pods",
                    state.pid,
                    advertised_address()
                );
                stop_group(state.pid)?;
                State::remove(&dirs);
                return start(&dirs, state.ports, true);
            }
            if serving(&state.ports) {
                return Ok(info);
            }
            // Alive but not (yet) serving: an `up` that was interrupted while
            // waiting (the broker lives on in its own process group), or a
            // broker in trouble. Give it the usual time rather than start a
            // second one; `wait_ready` fails with the log's tail otherwise.
            say!(
                "pulsar: broker (pid {}) is running but not serving yet; waiting",
                state.pid
            );
            wait_ready(&state.ports, state.pid, None, &dirs)?;
            return Ok(info);
        }
        // A stale record of a broker that is gone (its pid may have been
        // reused by an unrelated process, so nothing is signalled).
        State::remove(&dirs);
    }

    let ports = Ports {
        broker: opts.broker_port,
        web: opts.web_port,
        bookie: bookie_port()?,
    };
    for (what, port) in [
        ("broker", ports.broker),
        ("web", ports.web),
        ("bookie", ports.bookie),
    ] {
        if port_open(port) {
            bail!(
                "port {port} (Pulsar {what} port) on 127.0.0.1 is already in use by another \
                 process; free it or choose other ports"
            );
        }
    }

    start(&dirs, ports, true)
}

/// Starts the broker in the background with `ports` and waits until it
/// serves. With `fresh_data` the data directory is emptied first and the log
/// file truncated; without, the broker comes back on the data (topics,
/// subscriptions, unacknowledged messages) of its previous run and its log is
/// appended to. The caller holds the `up` lock and has checked that no broker
/// of ours runs.
fn start(dirs: &Dirs, ports: Ports, fresh_data: bool) -> Result<PulsarInfo> {
    let java = java_command();
    check_java(&java)?;
    let lib = ensure_classpath(dirs)?;

    // Fresh configuration for every start; empty data unless restarting.
    let conf = dirs.state.join("standalone.conf");
    fs::write(
        &conf,
        render_conf(CONF_TEMPLATE, &ports, advertised_address()),
    )
    .with_context(|| format!("writing {}", conf.display()))?;
    let log4j2 = dirs.state.join("log4j2.xml");
    fs::write(&log4j2, LOG4J2).with_context(|| format!("writing {}", log4j2.display()))?;
    if fresh_data {
        remove_dir_if_exists(&dirs.data())?;
    }
    fs::create_dir_all(dirs.data())
        .with_context(|| format!("creating {}", dirs.data().display()))?;

    let log_path = dirs.log();
    let log = OpenOptions::new()
        .create(true)
        .write(true)
        .append(!fresh_data)
        .truncate(fresh_data)
        .open(&log_path)
        .with_context(|| format!("opening {}", log_path.display()))?;
    let log_err = log.try_clone().context("duplicating the log file handle")?;

    let mut cmd = Command::new(&java);
    cmd.args(JVM_OPTS);
    if let Ok(extra) = std::env::var("XTASK_PULSAR_JAVA_OPTS") {
        cmd.args(extra.split_whitespace());
    }
    cmd.arg(format!("-Dlog4j2.configurationFile={}", log4j2.display()))
        .arg("-cp")
        .arg(format!("{}/*", lib.display()))
        .arg(MAIN_CLASS)
        .arg("--config")
        .arg(&conf)
        .args(["--no-functions-worker", "--no-stream-storage"])
        .arg("--metadata-dir")
        .arg(dirs.data().join("metadata"))
        .arg("--bookkeeper-dir")
        .arg(dirs.data().join("bookkeeper"))
        .arg("--bookkeeper-port")
        .arg(ports.bookie.to_string())
        // The starter looks for `data/standalone/zookeeper` relative to the
        // working directory to decide on ZooKeeper mode; in the state
        // directory it never exists, so RocksDB metadata is used.
        .current_dir(&dirs.state)
        .stdin(Stdio::null())
        .stdout(log)
        .stderr(log_err);
    say!(
        "pulsar: starting broker {PULSAR_VERSION} (log: {})",
        log_path.display()
    );
    let started = Instant::now();
    // Own process group: Ctrl-C on xtask does not reach it, and `down`
    // can signal everything it started at once.
    let mut child = process_group::spawn(&mut cmd)
        .with_context(|| format!("starting {java}; is Java installed? ({INSTALL_HINT})"))?;
    let pid = child.id();
    State { pid, ports }.write(dirs)?;

    if let Err(e) = wait_ready(&ports, pid, Some(&mut child), dirs) {
        let _ = stop_group(pid);
        let _ = child.try_wait();
        State::remove(dirs);
        return Err(e);
    }
    say!(
        "pulsar: broker ready in {:.1}s (pid {pid}): pulsar://127.0.0.1:{}, http://127.0.0.1:{}",
        started.elapsed().as_secs_f64(),
        ports.broker,
        ports.web
    );
    Ok(PulsarInfo::new(&ports, log_path))
}

/// Stops the broker started by [`up`] and starts it again on the same ports
/// and the same data: topics, subscriptions and unacknowledged messages
/// survive (unlike `down` + `up`). Clients see the connection drop and must
/// reconnect. When no broker of ours runs, this starts one on the data left
/// by the last run (empty data if `down` removed it), with the ports of the
/// last run or the defaults.
pub fn restart() -> Result<PulsarInfo> {
    let dirs = Dirs::new()?;
    fs::create_dir_all(&dirs.state)
        .with_context(|| format!("creating {}", dirs.state.display()))?;
    let _lock = Lock::acquire(&dirs.state.join("up.lock"))?;
    let ports = match State::read(&dirs)? {
        Some(state) => {
            if process_group::alive(state.pid) && is_our_broker(state.pid) {
                say!(
                    "pulsar: stopping broker (pid {}), keeping its data",
                    state.pid
                );
                stop_group(state.pid)?;
            }
            State::remove(&dirs);
            state.ports
        }
        None => {
            let defaults = PulsarOptions::default();
            Ports {
                broker: defaults.broker_port,
                web: defaults.web_port,
                bookie: bookie_port()?,
            }
        }
    };
    start(&dirs, ports, false)
}

/// Whether the broker started by [`up`] is running (serving or not).
pub fn is_running() -> bool {
    let Ok(dirs) = Dirs::new() else {
        return false;
    };
    matches!(State::read(&dirs), Ok(Some(state)) if process_group::alive(state.pid) && is_our_broker(state.pid))
}

/// Stops the broker started by [`up`] and deletes its data.
///
/// Sends SIGTERM to the broker's whole process group, waits up to 20 s, then
/// sends SIGKILL. Removes the data directory, the pid file and the rendered
/// configuration; the log file stays for inspection. Succeeds when nothing was
/// running.
pub fn down() -> Result<()> {
    let dirs = Dirs::new()?;
    match State::read(&dirs)? {
        Some(state) if process_group::alive(state.pid) && is_our_broker(state.pid) => {
            say!("pulsar: stopping broker (pid {})", state.pid);
            stop_group(state.pid)?;
        }
        // Gone, or the pid now belongs to an unrelated process: signal nothing.
        Some(_) | None => say!("pulsar: broker was not running"),
    }
    State::remove(&dirs);
    remove_dir_if_exists(&dirs.data())?;
    for f in ["standalone.conf", "log4j2.xml"] {
        let _ = fs::remove_file(dirs.state.join(f));
    }
    Ok(())
}

/// Prints whether the broker runs, its pid, URLs and log file.
pub fn status() -> Result<()> {
    let dirs = Dirs::new()?;
    let log = dirs.log();
    match State::read(&dirs)? {
        Some(state) if process_group::alive(state.pid) && is_our_broker(state.pid) => {
            let info = PulsarInfo::new(&state.ports, log);
            let serving = if serving(&state.ports) {
                "serving"
            } else {
                "not serving (yet?)"
            };
            say!("pulsar {PULSAR_VERSION}: running, {serving}");
            say!("  pid:         {}", state.pid);
            say!("  service URL: {}", info.service_url);
            say!("  admin URL:   {}", info.admin_url);
            say!("  bookie port: {}", state.ports.bookie);
            say!("  log:         {}", info.log_path.display());
        }
        _ => {
            say!("pulsar {PULSAR_VERSION}: not running");
            if log.exists() {
                say!("  last log:    {}", log.display());
            }
        }
    }
    say!("  classpath:   {}", dirs.lib().display());
    Ok(())
}

// ---------------------------------------------------------------------------
// Readiness
// ---------------------------------------------------------------------------

/// Waits until the broker serves: the binary port accepts connections and the
/// admin API lists the `public/default` namespace (which the standalone
/// starter creates last). Fails early when the process exits, and after
/// [`READY_TIMEOUT`] with the tail of the log.
fn wait_ready(ports: &Ports, pid: u32, mut child: Option<&mut Child>, dirs: &Dirs) -> Result<()> {
    let started = Instant::now();
    let mut next_note = Duration::from_secs(15);
    let mut stage = "binary port";
    loop {
        let exited = match child.as_deref_mut() {
            Some(c) => c
                .try_wait()
                .context("checking the broker process")?
                .map(|s| s.to_string()),
            None => (!process_group::alive(pid)).then(|| "exited".to_string()),
        };
        if let Some(how) = exited {
            say_err!("{}", tail(&dirs.log(), 60));
            bail!(
                "the Pulsar broker exited during startup ({how}); log: {}",
                dirs.log().display()
            );
        }
        if port_open(ports.broker) {
            stage = "admin API";
            // Poll the tenant first: asking for its namespaces before it
            // exists fills the log with errors.
            let tenant = xtask::support::http::get(ports.web, "/admin/v2/tenants")
                .ok()
                .is_some_and(|(code, body)| code == 200 && body.contains("\"public\""));
            if tenant {
                stage = "namespace public/default";
                if xtask::support::http::get(ports.web, "/admin/v2/namespaces/public")
                    .ok()
                    .is_some_and(|(code, body)| code == 200 && body.contains("public/default"))
                {
                    return Ok(());
                }
            }
        }
        let elapsed = started.elapsed();
        if elapsed > READY_TIMEOUT {
            say_err!("{}", tail(&dirs.log(), 60));
            bail!(
                "the Pulsar broker (pid {pid}) did not serve within {}s (waiting for the {stage}); \
                 log: {}",
                READY_TIMEOUT.as_secs(),
                dirs.log().display()
            );
        }
        if elapsed >= next_note {
            say!(
                "pulsar: waiting for the {stage} ({}s)...",
                elapsed.as_secs()
            );
            next_note += Duration::from_secs(15);
        }
        sleep(Duration::from_millis(500));
    }
}

/// Both ports answer, the admin API with a 200 for the cluster list.
fn serving(ports: &Ports) -> bool {
    port_open(ports.broker)
        && xtask::support::http::get(ports.web, "/admin/v2/clusters")
            .ok()
            .is_some_and(|(code, _)| code == 200)
}

fn port_open(port: u16) -> bool {
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    TcpStream::connect_timeout(&addr, Duration::from_millis(500)).is_ok()
}

// ---------------------------------------------------------------------------
// Processes
// ---------------------------------------------------------------------------

/// Guards against a recycled pid: the process must be our standalone broker.
fn is_our_broker(pid: u32) -> bool {
    match fs::read(format!("/proc/{pid}/cmdline")) {
        Ok(cmdline) => String::from_utf8_lossy(&cmdline).contains(MAIN_CLASS),
        Err(_) => !Path::new("/proc/self").exists(),
    }
}

/// SIGTERM to process group `pgid`, up to [`STOP_TIMEOUT`] to exit, then
/// SIGKILL. The group was created by `up` with the broker as its leader, so
/// its id is the broker's pid.
fn stop_group(pgid: u32) -> Result<()> {
    let grace = process_group::Grace {
        term: STOP_TIMEOUT,
        kill: Duration::from_secs(10),
    };
    process_group::stop(
        pgid,
        grace,
        || process_group::group_alive(pgid),
        || {
            say!(
                "pulsar: broker did not stop within {}s; killing it",
                STOP_TIMEOUT.as_secs()
            );
        },
    )
}

// ---------------------------------------------------------------------------
// Small helpers
// ---------------------------------------------------------------------------

fn remove_dir_if_exists(dir: &Path) -> Result<()> {
    match fs::remove_dir_all(dir) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(e).with_context(|| format!("removing {}", dir.display())),
    }
}

/// The last `n` lines of a file, framed for printing.
fn tail(path: &Path, n: usize) -> String {
    let text = fs::read(path)
        .map(|b| String::from_utf8_lossy(&b).into_owned())
        .unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    let start = lines.len().saturating_sub(n);
    format!(
        "----- last {} lines of {} -----\n{}\n-----",
        lines.len() - start,
        path.display(),
        lines[start..].join("\n")
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn render_conf_replaces_managed_ports() {
        let ports = Ports {
            broker: 16650,
            web: 28080,
            bookie: 13181,
        };
        let out = render_conf(
            "# webServicePort=1\nbrokerServicePort=6650\nclusterName=x\n",
            &ports,
            "10.88.0.1",
        );
        assert_eq!(
            out,
            "# webServicePort=1\nbrokerServicePort=16650\nclusterName=x\nwebServicePort=28080\nadvertisedAddress=10.88.0.1\n"
        );
        let real = render_conf(CONF_TEMPLATE, &ports, "127.0.0.1");
        assert!(real.contains("\nwebServicePort=28080\n"));
        assert!(real.contains("\nbrokerServicePort=16650\n"));
        assert!(!real.contains("=6650\n"));
    }

    #[test]
    fn fingerprint_is_stable() {
        assert_eq!(
            fingerprint(""),
            format!("{PULSAR_VERSION}-cbf29ce484222325")
        );
    }
}
