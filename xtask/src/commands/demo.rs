//! `cargo xtask demo`: one command that shows all four operators at work.
//!
//! With nothing configured it uses the embedded local cluster (starting it,
//! and building it the first time) and its real node: it starts the Pulsar
//! broker, deploys the four operators from their images (`cargo xtask
//! deploy`, which also builds and pushes the lolcow and consumer images),
//! applies the samples (the PulsarConsumer's pointed at the local broker),
//! waits until all are Ready, shows them, and leaves the lolcow page served
//! by its pod on its NodePort until Ctrl-C. Then it deletes the samples while
//! the operators still run (so finalizers are honoured and the `demo`
//! namespace really goes), undeploys the operators and stops what it started.
//!
//! Without a real node (not root) the operators run as local processes with
//! their ServiceAccounts' tokens and the page is served by a local lolcow-web.
//! With a real cluster in KUBECONFIG it deploys the operators there.

use crate::commands::cluster;
use crate::commands::deploy;
use anyhow::{Context, Result, bail};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;
use xtask::support::kubectl::Kubectl;
use xtask::support::local_operator::{self, Launch, LocalOperator};
use xtask::support::operators::OPERATORS;
use xtask::support::operators::{LOLCOW, PULSAR_CONSUMER, all_resources};
use xtask::support::paths;
use xtask::support::process_group;
use xtask::support::{cmd, console};
use xtask::{say, say_err};

/// The namespace the samples go to.
const NAMESPACE: &str = "demo";
/// Where the lolcow page is served on this machine.
const LOLCOW_PORT: u16 = 8088;

/// Options of `cargo xtask demo`.
#[derive(clap::Args)]
pub struct DemoArgs {
    /// Exit once everything is Ready (non-interactive; used by `cargo xtask test`).
    #[arg(long)]
    pub exit_when_ready: bool,
    /// Use the local cluster even when KUBECONFIG names another one.
    #[arg(long)]
    pub local: bool,
    /// Rehearses the stop and the cleanup without a cluster, for xtask's own test
    /// (`tests/demo_interrupt.rs`): see [`rehearse_cleanup`].
    #[arg(long, value_name = "DIR", hide = true)]
    pub rehearse_cleanup: Option<PathBuf>,
}

/// How long a process the demo started has to exit after SIGTERM, before SIGKILL.
const GRACE: Duration = Duration::from_secs(10);

/// What the demo runs on this machine without a real node: the operators and the page's
/// web app, stopped (SIGTERM, then SIGKILL after [`GRACE`]) when dropped.
#[derive(Default)]
struct Processes {
    operators: Vec<(String, LocalOperator)>,
    web: Option<Child>,
}

impl Drop for Processes {
    fn drop(&mut self) {
        for (name, operator) in &mut self.operators {
            operator.stop(GRACE);
            say!("demo: stopped {name}");
        }
        if let Some(web) = &mut self.web {
            if let Err(e) = process_group::stop_child(web, GRACE) {
                say_err!("demo: lolcow-web: {e:#}");
            }
            say!("demo: stopped lolcow-web");
        }
    }
}

/// kubectl (the cluster's own when built) with `kubeconfig`, else the environment's.
fn kubectl_with(kubeconfig: Option<&Path>) -> Kubectl {
    let kubectl = Kubectl::new(cluster::build::kubectl_or_path());
    match kubeconfig {
        Some(path) => kubectl.with_kubeconfig(path),
        None => kubectl,
    }
}

/// Whether KUBECONFIG (or ~/.kube/config) names a cluster other than the local one.
fn real_cluster() -> bool {
    let local = cluster::Layout::new().kubeconfig();
    match std::env::var_os("KUBECONFIG").filter(|v| !v.is_empty()) {
        Some(path) => path != local.as_os_str(),
        None => std::env::var_os("HOME")
            .is_some_and(|home| Path::new(&home).join(".kube/config").exists()),
    }
}

/// Runs the demo.
pub fn run(args: &DemoArgs) -> Result<()> {
    if let Some(dir) = &args.rehearse_cleanup {
        return rehearse_cleanup(args, dir);
    }
    xtask::support::machine_packages::ensure_debian(&xtask::support::machine_packages::BUILD)?;
    xtask::support::machine_packages::ensure_debian(&xtask::support::machine_packages::DEMO)?;
    if !args.local && real_cluster() {
        return run_on_real_cluster(args);
    }
    let layout = cluster::Layout::new();
    let started_cluster = !cluster::is_up(&layout);
    let kubeconfig = cluster::up()?;
    let result = run_locally(args, &kubeconfig);
    if started_cluster && args.exit_when_ready {
        // A non-interactive run leaves the machine as it found it.
        cluster::down()?;
    } else if started_cluster {
        say!("demo: the local cluster keeps running; `cargo xtask cluster down` stops it");
    }
    result
}

/// Where pods reach the local Pulsar broker (see `cluster::node`).
const LOCAL_BROKER: &str = "pulsar://pulsar-broker.pulsar.svc:6650";

fn run_locally(args: &DemoArgs, kubeconfig: &Path) -> Result<()> {
    let kubectl = kubectl_with(Some(kubeconfig));
    if cluster::node::supported() {
        return run_with_images(args, kubeconfig);
    }
    say!("demo: building the operators and the lolcow web app");
    cmd::run(
        cmd::cargo()
            .current_dir(paths::repo_root())
            .args(["build", "--quiet", "--bins"]),
    )?;
    let state = paths::state_dir("demo");
    std::fs::create_dir_all(&state)?;
    let stop = stop_on_signals()?;

    kubectl
        .output([
            "create",
            "namespace",
            NAMESPACE,
            "--dry-run=client",
            "-o",
            "yaml",
        ])
        .and_then(|yaml| {
            let path = state.join("namespace.yaml");
            std::fs::write(&path, yaml)?;
            kubectl.output(["apply".as_ref(), "-f".as_ref(), path.as_os_str()])
        })?;

    let mut processes = Processes::default();
    for op in OPERATORS {
        say!("demo: installing deploy/{op} and starting {op} with its ServiceAccount's token");
        local_operator::install(&kubectl, op, "demo")?;
        let sa_config = state.join(format!("{op}.kubeconfig"));
        local_operator::service_account_kubeconfig(
            &kubectl,
            &format!("{op}-system"),
            op,
            "24h",
            Some(NAMESPACE),
            &sa_config,
        )?;
        let operator = LocalOperator::spawn_own_group(Launch {
            binary: &paths::target_dir().join("debug").join(op),
            kubeconfig: &sa_config,
            watch_namespace: NAMESPACE,
            log_path: &state.join(format!("{op}.log")),
            args: &[],
            env: &[],
        })
        .with_context(|| format!("starting {op}"))?;
        processes.operators.push((op.to_owned(), operator));
    }

    apply_samples(Some(kubeconfig))?;
    wait_ready(Some(kubeconfig))?;

    // The lolcow pod is simulated on the local cluster: serve the same page
    // with the same greeting here.
    let greeting = kubectl.output([
        "get",
        LOLCOW.plural,
        "-n",
        NAMESPACE,
        "-o",
        "jsonpath={.items[0].status.greeting}",
    ])?;
    let log = std::fs::File::create(state.join("lolcow-web.log"))?;
    let web = process_group::spawn(
        Command::new(paths::target_dir().join("debug").join("lolcow-web"))
            .args(["--listen", "127.0.0.1", "--port", &LOLCOW_PORT.to_string()])
            .env("GREETING", greeting.trim())
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log),
    )
    .context("starting lolcow-web")?;
    processes.web = Some(web);
    let url = format!("http://127.0.0.1:{LOLCOW_PORT}/");
    if !page_served(&url, Duration::from_secs(20)) {
        bail!(
            "the lolcow page did not come up; see {}",
            state.join("lolcow-web.log").display()
        );
    }
    say!("demo: the lolcow page is served at {url}");
    say!("demo: operator logs are in {}", state.display());

    until_stopped(args, &stop);
    // The samples go while their operators run (Memcached's finalizer).
    delete_samples(kubeconfig)?;
    drop(processes);
    Ok(())
}

/// Creates the `demo` namespace, waiting first for one that a previous run
/// is still deleting.
fn fresh_namespace(kubeconfig: &Path) -> Result<()> {
    let kubectl = kubectl_with(Some(kubeconfig));
    let gone = cmd::wait_until(Duration::from_secs(120), || {
        kubectl
            .output([
                "get",
                "namespace",
                NAMESPACE,
                "-o",
                "jsonpath={.status.phase}",
            ])
            .map_or(true, |phase| phase.trim() != "Terminating")
    });
    if !gone {
        bail!(
            "the namespace {NAMESPACE} is stuck Terminating (`kubectl get all -n {NAMESPACE}` \
             shows what is left)"
        );
    }
    let exists = kubectl.succeeds(["get", "namespace", NAMESPACE]);
    if !exists {
        kubectl.output(["create", "namespace", NAMESPACE])?;
    }
    Ok(())
}

/// Deletes the samples and waits for their finalizers, then the namespace.
fn delete_samples(kubeconfig: &Path) -> Result<()> {
    let kubectl = kubectl_with(Some(kubeconfig));
    say!("demo: deleting the samples (their operators still run) and the {NAMESPACE} namespace");
    kubectl.output([
        "delete",
        &all_resources(),
        "--all",
        "-n",
        NAMESPACE,
        "--wait=true",
        "--timeout=120s",
    ])?;
    kubectl.output([
        "delete",
        "namespace",
        NAMESPACE,
        "--wait=true",
        "--timeout=120s",
    ])?;
    Ok(())
}

/// The demo on the local cluster's real node: every operator and workload
/// from its image.
fn run_with_images(args: &DemoArgs, kubeconfig: &Path) -> Result<()> {
    let kubectl = kubectl_with(Some(kubeconfig));
    let stop = stop_on_signals()?;
    let pulsar_was_running = crate::commands::pulsar::is_running();
    say!("demo: starting the Pulsar broker (cargo xtask pulsar up)");
    crate::commands::pulsar::up(&crate::commands::pulsar::PulsarOptions::default())?;
    deploy::use_kubeconfig(kubeconfig);
    let result = (|| -> Result<()> {
        deploy_operators(Some(cluster::node::REGISTRY), true)?;
        fresh_namespace(kubeconfig)?;
        apply_samples(Some(kubeconfig))?;
        kubectl.output([
            "patch",
            PULSAR_CONSUMER.plural,
            "pulsarconsumer-sample-1",
            "-n",
            NAMESPACE,
            "--type=merge",
            "-p",
            &format!(r#"{{"spec":{{"serverAddress":"{LOCAL_BROKER}"}}}}"#),
        ])?;
        say!("demo: the PulsarConsumer sample consumes from the local broker ({LOCAL_BROKER})");
        wait_ready(Some(kubeconfig))?;
        xtask::support::console::stdout(format_args!(
            "{}",
            kubectl.output([
                "get",
                "pods",
                "-A",
                "-o",
                "wide",
                "--field-selector",
                "spec.nodeName=real-node"
            ])?
        ));
        let port = kubectl.output([
            "get",
            LOLCOW.plural,
            "-n",
            NAMESPACE,
            "-o",
            "jsonpath={.items[0].status.port}",
        ])?;
        let url = format!("http://127.0.0.1:{}/", port.trim());
        if !page_served(&url, Duration::from_secs(60)) {
            bail!("the lolcow page is not served at {url}");
        }
        say!(
            "demo: the lolcow page is served by its pod at {url} (the NodePort, through kube-proxy)"
        );
        until_stopped(args, &stop);
        Ok(())
    })();
    // Samples first (their operators remove the finalizers), then the operators.
    let cleanup = delete_samples(kubeconfig).and_then(|()| {
        for op in OPERATORS {
            deploy::undeploy(op)?;
        }
        Ok(())
    });
    if !pulsar_was_running {
        crate::commands::pulsar::down()?;
    }
    result.and(cleanup)
}

fn apply_samples(kubeconfig: Option<&Path>) -> Result<()> {
    let kubectl = kubectl_with(kubeconfig);
    for op in OPERATORS {
        cmd::output(
            kubectl
                .with_args(["apply", "-n", NAMESPACE, "-k"])
                .arg(paths::repo_root().join("deploy").join(op).join("samples")),
        )
        .with_context(|| format!("applying the samples of {op}"))?;
    }
    Ok(())
}

/// Waits until every sample is Ready, then shows them.
fn wait_ready(kubeconfig: Option<&Path>) -> Result<()> {
    let kubectl = kubectl_with(kubeconfig);
    say!("demo: waiting until every sample is Ready");
    let resources = all_resources();
    kubectl.output([
        "wait",
        "--for=condition=Ready",
        &resources,
        "--all",
        "-n",
        NAMESPACE,
        "--timeout=300s",
    ])?;
    xtask::support::console::stdout(format_args!(
        "{}",
        kubectl.output(["get", &resources, "-n", NAMESPACE])?
    ));
    Ok(())
}

fn run_on_real_cluster(args: &DemoArgs) -> Result<()> {
    let kubectl = kubectl_with(None);
    say!("demo: KUBECONFIG names a real cluster: deploying the operators for real");
    deploy_operators(std::env::var("DEMO_REGISTRY").ok().as_deref(), false)?;
    kubectl
        .output(["create", "namespace", NAMESPACE])
        .or_else(|e| {
            if e.to_string().contains("AlreadyExists") {
                Ok(String::new())
            } else {
                Err(e)
            }
        })?;
    apply_samples(None)?;
    wait_ready(None)?;
    say!(
        "demo: open the lolcow page at http://<node-ip>:<port>/ (port: `kubectl get {} -n {NAMESPACE}`)",
        LOLCOW.plural
    );
    if !args.exit_when_ready {
        say!(
            "demo: the operators keep running in the cluster; `cargo xtask undeploy <operator>` removes one"
        );
    }
    Ok(())
}

/// Returns at once with `--exit-when-ready`, else once `stop` is set (Ctrl-C).
fn until_stopped(args: &DemoArgs, stop: &AtomicBool) {
    if args.exit_when_ready {
        say!("demo: everything is Ready");
    } else {
        say!("demo: press Ctrl-C to stop");
        while !stop.load(Ordering::SeqCst) {
            std::thread::sleep(Duration::from_millis(200));
        }
        say!("demo: stopping");
    }
}

/// The demo's stop and cleanup without a cluster, recorded step by step in
/// `dir/cleanup.log`: a stand-in for lolcow-web (`sleep`, its pid in `dir/stand-in.pid`)
/// runs in [`Processes`] until Ctrl-C ([`until_stopped`]); then, as [`delete_samples`]
/// and `undeploy` do, a run of progress lines and a child printing what it "deleted"
/// ([`cmd::run`]); then the stand-in is stopped as the demo stops its processes.
/// `tests/demo_interrupt.rs` runs it with its output piped to a reader that goes away.
fn rehearse_cleanup(args: &DemoArgs, dir: &Path) -> Result<()> {
    std::fs::create_dir_all(dir)?;
    let record = |step: &str| -> Result<()> {
        use std::io::Write;
        let mut log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(dir.join("cleanup.log"))?;
        writeln!(log, "{step}")?;
        Ok(())
    };
    let stop = stop_on_signals()?;
    let mut processes = Processes::default();
    let stand_in = process_group::spawn(
        Command::new("sleep")
            .arg("600")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null()),
    )
    .context("starting the stand-in")?;
    std::fs::write(dir.join("stand-in.pid"), stand_in.id().to_string())?;
    processes.web = Some(stand_in);
    say!("demo: rehearsal: a stand-in for lolcow-web runs");
    until_stopped(args, &stop);
    for i in 1..=100 {
        say!("demo: rehearsal: deleting sample {i}");
        say_err!("demo: rehearsal: waiting for the finalizer of sample {i}");
    }
    record("progress lines written")?;
    cmd::run(Command::new("sh").args([
        "-c",
        "for i in $(seq 1 100); do echo \"sample-$i deleted\"; echo \"sample-$i gone\" >&2; done",
    ]))?;
    record("child that printed what it deleted succeeded")?;
    drop(processes);
    record("stand-in stopped")?;
    Ok(())
}

/// Whether `url` answers with a success within `timeout`.
fn page_served(url: &str, timeout: Duration) -> bool {
    cmd::wait_until(timeout, || {
        cmd::succeeds(Command::new("curl").args(["-sf", "-o", "/dev/null", url]))
    })
}

/// `cargo xtask deploy <op>` of every operator, pushing to `registry` when
/// given; `announce`: a line before each (`demo: deploying <op> ...`).
fn deploy_operators(registry: Option<&str>, announce: bool) -> Result<()> {
    for op in OPERATORS {
        if announce {
            say!("demo: deploying {op} from its image (cargo xtask deploy {op})");
        }
        deploy::deploy(&deploy::DeployArgs {
            operator: op.to_owned(),
            image: None,
            registry: registry.map(str::to_owned),
            namespaced: None,
            tag: None,
        })?;
    }
    Ok(())
}

/// A flag set once SIGINT (Ctrl-C) or SIGTERM arrives. The demo itself is synchronous:
/// a thread of its own runs a small tokio runtime that waits for the signals. The
/// handlers are registered before this returns, so no signal is missed, and from then
/// on those signals no longer end the process: the demo sees the flag and cleans up.
/// A signal also tells [`console::interrupted`] that a pipe's reader may be gone (Ctrl-C
/// reaches `tee` too), so the cleanup's children write through this process.
///
/// # Errors
/// When the runtime, the signal handlers or the thread cannot be made.
pub fn stop_on_signals() -> Result<Arc<AtomicBool>> {
    use tokio::signal::unix::{SignalKind, signal};
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_io()
        .build()
        .context("starting the signal-handling runtime")?;
    let (mut interrupt, mut terminate) = {
        let _context = runtime.enter();
        (
            signal(SignalKind::interrupt()).context("installing the SIGINT handler")?,
            signal(SignalKind::terminate()).context("installing the SIGTERM handler")?,
        )
    };
    let stop = Arc::new(AtomicBool::new(false));
    let flag = Arc::clone(&stop);
    std::thread::Builder::new()
        .name("demo-signals".to_owned())
        .spawn(move || {
            runtime.block_on(async move {
                loop {
                    let received = tokio::select! {
                        s = interrupt.recv() => s,
                        s = terminate.recv() => s,
                    };
                    if received.is_none() {
                        break;
                    }
                    // Before the flag: the cleanup that the flag starts already copies
                    // its children's output (the pipe's reader got the SIGINT too).
                    console::interrupted();
                    flag.store(true, Ordering::SeqCst);
                }
            });
        })
        .context("starting the signal-handling thread")?;
    Ok(stop)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Sends `signal` to this test process with the `kill` command.
    fn raise(signal: &str) {
        let status = Command::new("kill")
            .args([signal, &std::process::id().to_string()])
            .status()
            .unwrap();
        assert!(status.success(), "kill {signal} failed");
    }

    fn wait_set(flag: &AtomicBool) -> bool {
        for _ in 0..100 {
            if flag.load(Ordering::SeqCst) {
                return true;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        false
    }

    #[test]
    fn sigterm_and_sigint_set_the_stop_flag_and_do_not_end_the_process() {
        let stop = stop_on_signals().unwrap();
        assert!(!stop.load(Ordering::SeqCst), "set before any signal");
        // Without the handler, SIGTERM would end this test process (the test fails).
        raise("-TERM");
        assert!(wait_set(&stop), "SIGTERM did not set the flag");
        let stop = stop_on_signals().unwrap();
        assert!(!stop.load(Ordering::SeqCst), "a fresh flag starts unset");
        raise("-INT");
        assert!(wait_set(&stop), "SIGINT did not set the flag");
    }
}
