//! The tools the checks run that the machine does not provide: Helm (the charts under
//! `deploy/<operator>/chart/`), oras (the SBOM referrers of the images), Prometheus with
//! promtool and Jaeger (the operators' metrics, alerts and traces), each built
//! once from its Go module under `xtask/tools/<name>/` into the cache, exactly as the
//! cluster's components are (`cluster::build`), never downloaded as a binary.
//!
//! `cargo xtask tool <name> [-- args]` runs one (`--path` prints where it is), so a
//! newcomer without Helm can still `cargo xtask tool helm -- install ...`.

use crate::commands::cluster::build::Component;
use anyhow::{Result, bail};
use std::path::PathBuf;
use std::process::Command;
use xtask::say;
use xtask::support::cmd;

/// Helm 3, from `helm.sh/helm/v3/cmd/helm`.
pub const HELM: Component = Component {
    folder: "tools",
    name: "helm",
    module: "helm.sh/helm/v3",
    packages: &["helm.sh/helm/v3/cmd/helm"],
    binaries: &["helm"],
    tags: &[],
};

/// oras, the OCI registry client (it reads and copies OCI 1.1 referrers, in a
/// registry or an OCI image layout), from `oras.land/oras/cmd/oras`.
pub const ORAS: Component = Component {
    folder: "tools",
    name: "oras",
    module: "oras.land/oras",
    packages: &["oras.land/oras/cmd/oras"],
    binaries: &["oras"],
    tags: &[],
};

/// Prometheus and promtool, from `github.com/prometheus/prometheus/cmd/{prometheus,promtool}`:
/// the end-to-end tests scrape the operators as their ServiceMonitors say and evaluate
/// the dashboards' queries; `cargo xtask lint-alerts` checks and unit-tests the alerts.
pub const PROMETHEUS: Component = Component {
    folder: "tools",
    name: "prometheus",
    module: "github.com/prometheus/prometheus",
    packages: &[
        "github.com/prometheus/prometheus/cmd/prometheus",
        "github.com/prometheus/prometheus/cmd/promtool",
    ],
    binaries: &["prometheus", "promtool"],
    // Of the service discoveries only Kubernetes' (the ServiceMonitors' role): the
    // cloud providers' SDKs stay out, which halves the build.
    tags: &["remove_all_sd", "enable_kubernetes_sd"],
};

/// Jaeger v2 (an OpenTelemetry Collector with Jaeger's storage and query API), from
/// `github.com/jaegertracing/jaeger/cmd/jaeger`: the end-to-end tests find the operators'
/// traces in it.
pub const JAEGER: Component = Component {
    folder: "tools",
    name: "jaeger",
    module: "github.com/jaegertracing/jaeger",
    packages: &["github.com/jaegertracing/jaeger/cmd/jaeger"],
    binaries: &["jaeger"],
    tags: &[],
};

/// Every tool, by name.
const ALL: [&Component; 4] = [&HELM, &ORAS, &PROMETHEUS, &JAEGER];

/// The tool's binary, built first when the cache lacks it.
pub fn binary(tool: &Component) -> Result<PathBuf> {
    tool.ensure_built()?;
    tool.binary(tool.binaries[0])
}

/// The built `helm`.
pub fn helm() -> Result<PathBuf> {
    binary(&HELM)
}

/// The built `oras`.
pub fn oras() -> Result<PathBuf> {
    binary(&ORAS)
}

/// The built `prometheus` (`promtool` is built beside it).
pub fn prometheus() -> Result<PathBuf> {
    binary(&PROMETHEUS)
}

/// Options of `cargo xtask tool`.
#[derive(clap::Args)]
pub struct ToolArgs {
    /// `helm`, `oras`, `prometheus` (also builds promtool) or `jaeger`.
    pub name: String,
    /// Print the binary's path (after building it) instead of running it.
    #[arg(long)]
    pub path: bool,
    /// Arguments for the tool (after `--`).
    #[arg(last = true)]
    pub args: Vec<String>,
}

/// `cargo xtask tool <name> [--path] [-- args]`.
pub fn run(args: &ToolArgs) -> Result<()> {
    let Some(tool) = ALL.into_iter().find(|t| t.name == args.name) else {
        bail!(
            "unknown tool {:?}; one of: {}",
            args.name,
            ALL.map(|t| t.name).join(", ")
        );
    };
    let path = binary(tool)?;
    if args.path {
        say!("{}", path.display());
        return Ok(());
    }
    cmd::run(Command::new(path).args(&args.args))
}
