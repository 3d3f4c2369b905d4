//! `cargo xtask deploy|undeploy|run <operator>`: what `make deploy`,
//! `make undeploy` and `make install run` do for the Go originals.
//!
//! `deploy` regenerates the CRD, builds the image (Docker where a daemon
//! answers, else `cargo xtask image`), makes it reachable by the cluster
//! (a registry push, or loading into kind), applies the operator's
//! kustomization and waits for the rollout. The kustomization it applies is
//! generated under `target/deploy/<operator>/`: it refers to the committed
//! `deploy/<operator>` tree and only sets the image (and, namespace-scoped,
//! the watched namespaces), so no tracked file is ever edited. `undeploy`
//! deletes what that kustomization describes.

mod kustomization;
mod push_images;

use crate::commands::cluster;
use crate::commands::crds;
use anyhow::{Context, Result, bail};
use kustomization::write_kustomization;
pub(crate) use kustomization::{env_patch, relative};
pub use push_images::workload_image;
use push_images::{local_registry, provide_image, provide_workload_image};
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::Command;
use xtask::say;
use xtask::support::cmd;
use xtask::support::kubectl::Kubectl;
use xtask::support::kustomize;
use xtask::support::operators::OPERATORS;
use xtask::support::paths;

/// Options of `cargo xtask deploy`.
#[derive(clap::Args)]
pub struct DeployArgs {
    /// The operator (e.g. `podset-operator`).
    pub operator: String,
    /// Deploy this image reference as it is (no build, no push).
    #[arg(long, conflicts_with = "registry")]
    pub image: Option<String>,
    /// Push the image to this registry (`host:port`) and deploy it by digest.
    #[arg(long, value_name = "HOST:PORT")]
    pub registry: Option<String>,
    /// Install namespace-scoped, watching these namespaces (`a,b`).
    #[arg(long, value_name = "NS,...", value_delimiter = ',')]
    pub namespaced: Option<Vec<String>>,
    /// The image tag (default: the workspace version).
    #[arg(long)]
    pub tag: Option<String>,
}

/// Options of `cargo xtask run`.
#[derive(clap::Args)]
pub struct RunArgs {
    /// The operator (e.g. `podset-operator`).
    pub operator: String,
    /// Push the operator's workload image (lolcow-web, pulsar-consumer) to this registry
    /// (`host:port`) and point the operator at it; default: the local cluster's registry
    /// when kubectl talks to the local cluster.
    #[arg(long, value_name = "HOST:PORT")]
    pub registry: Option<String>,
    /// Arguments after `run` (e.g. `-- --watch-namespace=a`).
    #[arg(last = true)]
    pub args: Vec<String>,
}

/// Fails unless `operator` is one of the workspace's operators.
fn known_operator(operator: &str) -> Result<()> {
    if !OPERATORS.contains(&operator) {
        bail!(
            "unknown operator {operator:?}; one of: {}",
            OPERATORS.join(", ")
        );
    }
    Ok(())
}

/// The operator's `deploy/` folder, which must hold a kustomization.
fn check_operator(operator: &str) -> Result<PathBuf> {
    known_operator(operator)?;
    let dir = paths::repo_root().join("deploy").join(operator);
    if !dir.join("kustomization.yaml").exists() {
        bail!("{} has no kustomization.yaml yet", dir.display());
    }
    Ok(dir)
}

/// A kubeconfig every later `deploy`/`undeploy` of this process uses.
static KUBECONFIG: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();

/// Makes `deploy` and `undeploy` use `path` (the demo's local cluster)
/// whatever KUBECONFIG says.
pub fn use_kubeconfig(path: &Path) {
    let _ = KUBECONFIG.set(path.to_path_buf());
}

/// The cluster's own kubectl when it was built, else `kubectl` on PATH; with
/// no kubeconfig anywhere, the local cluster's.
fn target_kubectl() -> Kubectl {
    let kubectl = Kubectl::new(cluster::build::kubectl_or_path());
    if let Some(path) = KUBECONFIG.get() {
        return kubectl.with_kubeconfig(path);
    }
    let has_env = std::env::var_os("KUBECONFIG").is_some_and(|v| !v.is_empty());
    let default = std::env::var_os("HOME").map(|h| Path::new(&h).join(".kube/config"));
    if !has_env && !default.is_some_and(|d| d.exists()) {
        let layout = cluster::Layout::new();
        if cluster::is_up(&layout) {
            return kubectl.with_kubeconfig(layout.kubeconfig());
        }
    }
    kubectl
}

fn current_context() -> Result<String> {
    Ok(target_kubectl()
        .output(["config", "current-context"])?
        .trim()
        .to_owned())
}

fn generated_dir(operator: &str) -> PathBuf {
    paths::target_dir().join("deploy").join(operator)
}

/// `kubectl apply --server-side --force-conflicts -f <path>` on the target cluster.
fn apply_file(path: &Path) -> Result<()> {
    cmd::run(
        target_kubectl()
            // As the kustomize tree is applied: one field manager, taking over fields an
            // earlier install (or a test harness) applied, so a changed CRD is upgraded.
            .with_args([
                "apply",
                "--server-side",
                "--force-conflicts",
                "--field-manager=xtask-deploy",
                "-f",
            ])
            .arg(path),
    )
}

/// `cargo xtask deploy ...`.
pub fn deploy(args: &DeployArgs) -> Result<()> {
    let operator = args.operator.as_str();
    let deploy_dir = check_operator(operator)?;
    crds::run_for(false, &[operator])?;
    let args_local;
    let mut args = args;
    if args.image.is_none()
        && args.registry.is_none()
        && let Some(registry) = local_registry()
    {
        say!("deploy: the local cluster: pushing to its registry {registry}");
        args_local = DeployArgs {
            operator: args.operator.clone(),
            image: None,
            registry: Some(registry.to_owned()),
            namespaced: args.namespaced.clone(),
            tag: args.tag.clone(),
        };
        args = &args_local;
    }
    if args.registry.as_deref() == Some(cluster::node::REGISTRY) {
        // The end-to-end tests may have sent this namespace's pods to the
        // simulated nodes: this deployment runs for real.
        let system = format!("{operator}-system");
        if target_kubectl().succeeds(["get", "namespace", &system]) {
            let mut annotate =
                target_kubectl().with_args(["annotate", "namespace", &system, "--overwrite"]);
            for (key, _) in xtask::support::simulated::NAMESPACE_ANNOTATIONS {
                annotate.arg(format!("{key}-"));
            }
            cmd::output(&mut annotate)?;
        }
    }
    let image = provide_image(operator, args)?;
    let workload = match &args.registry {
        Some(registry) => provide_workload_image(operator, registry, args.tag.as_deref())?,
        None => {
            if let Some((app, env)) = workload_image(operator) {
                say!(
                    "deploy: {operator} runs the {app} image (its {env}); without --registry it is not \
                     built here: build and push it with `cargo xtask image {app} --push <registry>`"
                );
            }
            None
        }
    };
    let dir = write_kustomization(
        operator,
        &deploy_dir,
        &image,
        args.namespaced.as_deref(),
        workload.as_ref(),
    )?;
    say!("deploy: applying {}", dir.display());
    if let Some(namespaces) = &args.namespaced {
        // The CRD is cluster-scoped: not part of the namespaced install.
        apply_file(&deploy_dir.join("crd.yaml"))?;
        // Watched namespaces are the user's: created when missing, never deleted.
        for ns in namespaces {
            if !target_kubectl().succeeds(["get", "namespace", ns]) {
                target_kubectl().run(["create", "namespace", ns])?;
            }
        }
    }
    xtask::support::console::stdout(format_args!(
        "{}",
        kustomize::apply(&target_kubectl(), &dir, Some("xtask-deploy"))?
    ));
    target_kubectl().run([
        "rollout",
        "status",
        &format!("deployment/{operator}"),
        "-n",
        &format!("{operator}-system"),
        "--timeout=180s",
    ])?;
    say!("deploy: {operator} is rolled out");
    Ok(())
}

/// `cargo xtask undeploy <operator>`.
pub fn undeploy(operator: &str) -> Result<()> {
    let deploy_dir = check_operator(operator)?;
    let generated = generated_dir(operator);
    let dir = if generated.join("kustomization.yaml").exists() {
        generated
    } else {
        deploy_dir.clone()
    };
    // The custom resources go first, while the operator still runs to remove
    // their finalizers; deleting the CRD and the operator together would leave
    // them (and their namespaces) stuck Terminating.
    let crd: Value = serde_saphyr::from_str(&std::fs::read_to_string(deploy_dir.join("crd.yaml"))?)
        .context("parsing the CRD")?;
    let resource = format!(
        "{}.{}",
        crd["spec"]["names"]["plural"].as_str().unwrap_or_default(),
        crd["spec"]["group"].as_str().unwrap_or_default()
    );
    if target_kubectl().succeeds(["get", "crd", &resource]) {
        say!("undeploy: deleting every {resource} and waiting for their finalizers");
        target_kubectl().run([
            "delete",
            &resource,
            "--all",
            "--all-namespaces",
            "--wait=true",
            "--timeout=120s",
        ])?;
    }
    say!("undeploy: deleting what {} describes", dir.display());
    cmd::run(
        target_kubectl()
            .with_args(["delete", "--ignore-not-found", "-k"])
            .arg(&dir),
    )?;
    Ok(())
}

/// `cargo xtask run <operator> [-- args]`: installs the CRD and runs the operator on this
/// machine against the current kubeconfig. An operator whose pods run an app of this
/// workspace gets that image as `deploy` gives it: built, pushed to `--registry` (or the
/// local cluster's registry) and named in the operator's environment variable, unless
/// that variable is set already. The process then becomes the operator (`exec`), so
/// Ctrl-C or SIGTERM reach it directly and it shuts down gracefully.
pub fn run(args: &RunArgs) -> Result<()> {
    let operator = args.operator.as_str();
    known_operator(operator)?;
    let crd = paths::repo_root()
        .join("deploy")
        .join(operator)
        .join("crd.yaml");
    if crd.exists() {
        apply_file(&crd)?;
    } else {
        // No deploy tree yet: install what the code generates.
        crds::build_operators(&[operator])?;
        let binary = paths::target_dir().join("debug").join(operator);
        let generated = cmd::output(Command::new(binary).arg("crd"))?;
        let file = generated_dir(operator).join("crd.yaml");
        std::fs::create_dir_all(generated_dir(operator))?;
        std::fs::write(&file, generated)?;
        apply_file(&file)?;
    }
    let mut cargo = cmd::cargo();
    cargo
        .current_dir(paths::repo_root())
        .args(["run", "-p", operator, "--", "run"])
        .args(&args.args);
    if let Some((env, image)) = run_workload_image(operator, args.registry.as_deref())? {
        say!("run: {operator} runs {image} ({env})");
        cargo.env(env, image);
    }
    let kubectl = target_kubectl();
    if let Some(kubeconfig) = kubectl.kubeconfig() {
        cargo.env("KUBECONFIG", kubeconfig);
    }
    // `cargo run` execs the operator in turn: one process from here on.
    let error = std::os::unix::process::CommandExt::exec(&mut cargo);
    Err(error).with_context(|| format!("could not start `{}`", cmd::show(&cargo)))
}

/// The workload image `run` points `operator` at: `(environment variable, reference)`, or
/// `None` when it runs no app of this workspace, the variable is set already, or there is
/// no registry to push to (then it says that the pods need another image).
fn run_workload_image(operator: &str, registry: Option<&str>) -> Result<Option<(String, String)>> {
    let Some((app, env)) = workload_image(operator) else {
        return Ok(None);
    };
    if std::env::var_os(env).is_some_and(|v| !v.is_empty()) {
        say!("run: {env} is set: {operator} runs that image");
        return Ok(None);
    }
    let local = local_registry();
    let Some(registry) = registry.or(local) else {
        say!(
            "run: warning: {operator}'s pods run the {app} image, which is built here only \
             with a registry to push it to: pass --registry <host:port>, or set {env}"
        );
        return Ok(None);
    };
    say!("run: building {app} and pushing it to {registry}");
    provide_workload_image(operator, registry, None)
}
