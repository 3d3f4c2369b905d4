//! `cargo xtask ...`: everything this project automates, in Rust.
//!
//! - `cluster up|down|status|env|stop`: the local Kubernetes control plane.
//! - `crds [--check] [operator...]`: regenerate the CRDs under `deploy/`, or fail on drift.
//! - `new <name> --group <g> --version <v> --kind <K>`: scaffold a new operator.
//! - `installers [--check] [--registry R]`: the single-file installers
//!   `deploy/<operator>/install.yaml`.
//! - `actionlint`: lint the GitHub Actions workflows.
//! - `release <version>`: bump the workspace version, regenerate, date the
//!   changelog; prints the commands that commit and tag it.
//! - `test`: the one command CI runs (format, lints, unit tests, CRD drift,
//!   end-to-end tests on the local cluster).
//! - `pulsar up|down|restart|status`: a real Apache Pulsar standalone broker
//!   on 127.0.0.1, for the consumer app's tests.
//! - `bench consumer [--messages N]`, `bench operator [--operator <op>
//!   --objects N --replicas R | --standard]` (or `bench --all`): benchmarks,
//!   results under `target/bench/`.
//! - `image <name> [--push <registry>]`: a static binary in a minimal OCI image.
//! - `deploy|undeploy <operator>`, `run <operator>`: install an operator on
//!   the current cluster, or run it locally against it.
//! - `charts [--check] [operator...]`: regenerate the Helm charts under `deploy/<operator>/chart/`
//!   from the kustomize trees, or fail on drift (and lint and compare them).
//! - `tool helm|oras [--path] [-- args]`: a tool built from its Go module.
//! - `check-docs`: every relative link and `cargo xtask` command in the docs exists.
//! - `lint-manifests`: kube-score and checkov over the installers and the default charts.
//! - `lint-alerts`: promtool checks and unit-tests the operators' alerts (PrometheusRules).

mod commands;

use commands::{
    actionlint, bench, charts, check_docs, cluster, crds, demo, deploy, image, installers,
    lint_alerts, lint_manifests, new, pulsar, release, test, tool,
};
use xtask::say;

use anyhow::Result;
use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "cargo xtask",
    about = "Project automation for the Rust operators"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Show all four operators at work: local cluster (or the real one in
    /// KUBECONFIG), operators, samples, the lolcow page; Ctrl-C stops it.
    Demo(demo::DemoArgs),
    /// The local Kubernetes control plane used by the tests.
    Cluster {
        #[command(subcommand)]
        action: ClusterAction,
    },
    /// Regenerate each operator's CRD under `deploy/<operator>/crd.yaml`.
    Crds {
        /// Fail instead of writing when a committed CRD differs from the code.
        #[arg(long)]
        check: bool,
        /// The operators (default: every operator with a `deploy/` tree).
        operators: Vec<String>,
    },
    /// Regenerate each operator's Helm chart under `deploy/<operator>/chart/`.
    Charts {
        /// Fail instead of writing when a committed chart differs from what the
        /// kustomize tree generates; also lint the charts and compare their
        /// renderings with kustomize's, object by object.
        #[arg(long)]
        check: bool,
        /// The operators (default: every operator with a `deploy/` tree).
        operators: Vec<String>,
    },
    /// Scaffold a new operator: its crate, its `deploy/` tree and its entry in the list.
    New(new::NewArgs),
    /// Run a tool built from its Go module (`helm`, `oras`).
    Tool(tool::ToolArgs),
    /// Write the single-file installers `deploy/<operator>/install.yaml`.
    ///
    /// Each is `kubectl kustomize deploy/<operator>` with the images pinned to
    /// `ghcr.io/rust-operators/<image>:<workspace version>` (install with `kubectl apply -f`);
    /// `--registry <prefix> --out-dir <dir>` writes them for another registry. The same
    /// run sets the kustomize trees' image tags to the workspace version; `--check` fails
    /// on any difference instead.
    Installers(installers::InstallersArgs),
    /// Cut a release in the working tree, ready to tag.
    ///
    /// Sets the workspace version (Cargo.toml, Cargo.lock), regenerates the CRDs,
    /// installers and charts, moves CHANGELOG.md's Unreleased section under the version
    /// with today's date, and prints the `git commit`/`git tag` commands (it commits
    /// nothing).
    Release(release::ReleaseArgs),
    /// Lint `.github/workflows/` with actionlint (built from its Go module).
    Actionlint,
    /// Check the docs (README.md, CHANGELOG.md, docs/, operators' READMEs): every
    /// relative link and heading anchor, and every `cargo xtask` command they name.
    CheckDocs,
    /// Lint every `deploy/<operator>/install.yaml` and every chart rendered with its
    /// defaults with kube-score and checkov (built and installed into the cache on first
    /// use); fails on any finding not suppressed on its object with a reason.
    LintManifests,
    /// Check each `deploy/<operator>/prometheus/rules.yaml` with `promtool check rules`,
    /// run its unit tests (`xtask/alerts/<operator>.test.yaml`) with `promtool test rules`
    /// (promtool built into the cache on first use), and compare the charts' rules.
    LintAlerts,
    /// Run everything CI runs.
    Test(test::TestArgs),
    /// Build an OCI image of one binary under `target/images/` (and push it).
    Image(image::ImageArgs),
    /// Build, push or load, and install an operator on the current cluster.
    Deploy(deploy::DeployArgs),
    /// Delete what `deploy` installed.
    Undeploy {
        /// The operator (e.g. `podset-operator`).
        operator: String,
    },
    /// Install the CRD and run the operator locally against the current cluster.
    Run(deploy::RunArgs),
    /// A real Apache Pulsar standalone broker on 127.0.0.1.
    Pulsar {
        #[command(subcommand)]
        action: PulsarAction,
    },
    /// Benchmarks; results under `target/bench/`.
    Bench(bench::BenchArgs),
}

#[derive(Subcommand)]
enum PulsarAction {
    /// Assemble (once) and start the broker; waits until it serves.
    Up {
        /// The binary protocol port.
        #[arg(long, default_value_t = pulsar::PulsarOptions::default().broker_port)]
        broker_port: u16,
        /// The admin (HTTP) port.
        #[arg(long, default_value_t = pulsar::PulsarOptions::default().web_port)]
        web_port: u16,
    },
    /// Stop the broker and remove its data.
    Down,
    /// Stop the broker and start it again, keeping its data.
    Restart,
    /// Say whether it runs and how to reach it.
    Status,
}

#[derive(Subcommand)]
enum ClusterAction {
    /// Build (once) and start the cluster; prints `export KUBECONFIG=...` last.
    Up {
        /// The Kubernetes version (`1.34`, `v1.34.4`; see docs/kubernetes-versions.md).
        /// Without it: the existing cluster's version, else the default.
        #[arg(long, value_name = "VERSION")]
        kubernetes: Option<String>,
    },
    /// Build a version's binaries into the cache (once) without starting anything: a
    /// version can be built while a cluster of another version runs.
    Build {
        /// The Kubernetes version (`1.34`, `v1.34.4`); without it, the default.
        #[arg(long, value_name = "VERSION")]
        kubernetes: Option<String>,
    },
    /// Stop every process `up` started and remove the cluster's data.
    Down,
    /// Say what runs and where the logs are.
    Status,
    /// Print the `export KUBECONFIG=...` line.
    Env,
    /// Stop one process, keeping the data (`up` starts it again).
    Stop {
        /// etcd, apiserver, controller-manager, scheduler or kwok.
        process: String,
    },
}

fn main() -> Result<()> {
    let cli = Cli::parse();
    match cli.command {
        Command::Cluster { action } => match action {
            ClusterAction::Up { kubernetes } => match kubernetes {
                Some(requested) => cluster::up_with(Some(&cluster::Kubernetes::find(&requested)?)),
                None => cluster::up(),
            }
            .map(drop),
            ClusterAction::Build { kubernetes } => cluster::build_only(
                &kubernetes.map_or_else(cluster::Kubernetes::default_version, |requested| {
                    cluster::Kubernetes::find(&requested)
                })?,
            ),
            ClusterAction::Down => cluster::down(),
            ClusterAction::Status => cluster::status(),
            ClusterAction::Env => cluster::env(),
            ClusterAction::Stop { process } => {
                let p = cluster::Process::parse(&process)?;
                let layout = cluster::Layout::new();
                if cluster::stop_process(&layout, p)? {
                    say!("cluster: stopped {}", p.name());
                } else {
                    say!("cluster: {} was not running", p.name());
                }
                Ok(())
            }
        },
        Command::Demo(args) => demo::run(&args),
        Command::Crds { check, operators } => crds::run_for(check, &crds::selected(&operators)?),
        Command::Charts { check, operators } => {
            charts::run_for(check, &crds::selected(&operators)?)
        }
        Command::New(args) => new::run(&args),
        Command::Tool(args) => tool::run(&args),
        Command::Installers(args) => installers::run(&args),
        Command::Release(args) => release::run(&args),
        Command::Actionlint => actionlint::run(),
        Command::LintManifests => lint_manifests::run(),
        Command::LintAlerts => lint_alerts::run(),
        Command::CheckDocs => check_docs::run(<Cli as clap::CommandFactory>::command()),
        Command::Test(args) => test::run(&args),
        Command::Image(args) => image::run(&args),
        Command::Deploy(args) => deploy::deploy(&args),
        Command::Undeploy { operator } => deploy::undeploy(&operator),
        Command::Run(args) => deploy::run(&args),
        Command::Pulsar { action } => match action {
            PulsarAction::Up {
                broker_port,
                web_port,
            } => {
                let info = pulsar::up(&pulsar::PulsarOptions {
                    broker_port,
                    web_port,
                })?;
                say!("pulsar: log {}", info.log_path.display());
                say!("pulsar: admin {}", info.admin_url);
                say!("export PULSAR_SERVER={}", info.service_url);
                Ok(())
            }
            PulsarAction::Down => pulsar::down(),
            PulsarAction::Restart => {
                let info = pulsar::restart()?;
                say!("export PULSAR_SERVER={}", info.service_url);
                Ok(())
            }
            PulsarAction::Status => pulsar::status(),
        },
        Command::Bench(args) => bench::run(&args),
    }
}
