//! The tools the checks run that the machine does not provide: Helm (the charts under
//! `deploy/<operator>/chart/`) and oras (the SBOM referrers of the images), each built
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
};

/// oras, the OCI registry client (it reads and copies OCI 1.1 referrers, in a
/// registry or an OCI image layout), from `oras.land/oras/cmd/oras`.
pub const ORAS: Component = Component {
    folder: "tools",
    name: "oras",
    module: "oras.land/oras",
    packages: &["oras.land/oras/cmd/oras"],
    binaries: &["oras"],
};

/// Every tool, by name.
const ALL: [&Component; 2] = [&HELM, &ORAS];

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

/// Options of `cargo xtask tool`.
#[derive(clap::Args)]
pub struct ToolArgs {
    /// `helm` or `oras`.
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
