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

use crate::cluster;
use crate::cmd;
use crate::crds;
use crate::image;
use crate::paths;
use anyhow::{Context, Result, bail};
use serde_json::{Value, json};
use std::path::{Component, Path, PathBuf};
use std::process::Command;
use xtask::kubectl::Kubectl;
use xtask::kustomize;

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
    /// The image tag (default: the package version).
    #[arg(long)]
    pub tag: Option<String>,
}

/// Options of `cargo xtask run`.
#[derive(clap::Args)]
pub struct RunArgs {
    /// The operator (e.g. `podset-operator`).
    pub operator: String,
    /// Arguments after `run` (e.g. `-- --watch-namespace=a`).
    #[arg(last = true)]
    pub args: Vec<String>,
}

fn check_operator(operator: &str) -> Result<PathBuf> {
    if !crds::OPERATORS.contains(&operator) {
        bail!(
            "unknown operator {operator:?}; one of: {}",
            crds::OPERATORS.join(", ")
        );
    }
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

/// `to` relative to `from` (both absolute), for kustomize's `resources:`.
fn relative(from: &Path, to: &Path) -> PathBuf {
    let from: Vec<Component> = from.components().collect();
    let to_parts: Vec<Component> = to.components().collect();
    let common = from
        .iter()
        .zip(&to_parts)
        .take_while(|(a, b)| a == b)
        .count();
    if common == 0 {
        return to.to_path_buf();
    }
    let mut rel = PathBuf::new();
    for _ in common..from.len() {
        rel.push("..");
    }
    for part in &to_parts[common..] {
        rel.push(part);
    }
    rel
}

/// An image reference split the way kustomize's `images:` wants it.
#[derive(Debug, PartialEq, Eq)]
struct ImageRef {
    name: String,
    tag: Option<String>,
    digest: Option<String>,
}

impl ImageRef {
    fn parse(reference: &str) -> ImageRef {
        let (rest, digest) = match reference.split_once('@') {
            Some((r, d)) => (r, Some(d.to_owned())),
            None => (reference, None),
        };
        let last_slash = rest.rfind('/').map_or(0, |i| i + 1);
        let (name, tag) = match rest[last_slash..].rfind(':') {
            Some(i) => (
                rest[..last_slash + i].to_owned(),
                Some(rest[last_slash + i + 1..].to_owned()),
            ),
            None => (rest.to_owned(), None),
        };
        ImageRef { name, tag, digest }
    }

    fn kustomize(&self, operator: &str) -> Value {
        let mut v = json!({"name": operator, "newName": self.name});
        if let Some(tag) = &self.tag {
            v["newTag"] = json!(tag);
        }
        if let Some(digest) = &self.digest {
            v["digest"] = json!(digest);
        }
        v
    }
}

fn docker_works() -> bool {
    cmd::on_path("docker") && cmd::succeeds(Command::new("docker").arg("info"))
}

/// The workload image an operator runs (an app of this project) and the
/// operator's environment variable that names it.
pub fn workload_image(operator: &str) -> Option<(&'static str, &'static str)> {
    match operator {
        "lolcow-operator" => Some(("lolcow-web", "LOLCOW_IMAGE")),
        "pulsar-consumer-operator" => Some(("pulsar-consumer", "PULSAR_CONSUMER_IMAGE")),
        _ => None,
    }
}

/// The local cluster's registry when kubectl talks to the local cluster and
/// its real node runs: images pushed there run on that node.
pub fn local_registry() -> Option<&'static str> {
    let server = target_kubectl()
        .output([
            "config",
            "view",
            "--minify",
            "-o",
            "jsonpath={.clusters[0].cluster.server}",
        ])
        .ok()?;
    (server.trim() == cluster::API_SERVER && cluster::node::registry_ready())
        .then_some(cluster::node::REGISTRY)
}

/// Builds the workload image of `operator` (if it has one), pushes it to
/// `registry` and returns `(environment variable, pinned reference)`.
fn provide_workload_image(
    operator: &str,
    registry: &str,
    tag: Option<&str>,
) -> Result<Option<(String, String)>> {
    let Some((app, env)) = workload_image(operator) else {
        return Ok(None);
    };
    let built = image::build(app, tag)?;
    let pushed = image::push(&built, registry)?;
    Ok(Some((env.to_owned(), pushed)))
}

/// Builds the image and makes it reachable; returns the reference to deploy.
fn provide_image(operator: &str, args: &DeployArgs) -> Result<ImageRef> {
    if let Some(reference) = &args.image {
        println!("deploy: using the image {reference} as given");
        return Ok(ImageRef::parse(reference));
    }
    let dockerfile = Path::new("operators").join(operator).join("Dockerfile");
    let use_docker = docker_works() && paths::repo_root().join(&dockerfile).exists();
    let context = current_context().unwrap_or_default();
    let kind_cluster = context.strip_prefix("kind-").map(str::to_owned);

    if use_docker {
        let tag = args.tag.clone().unwrap_or_else(|| "dev".into());
        let local = format!("{operator}:{tag}");
        println!("deploy: docker build -f {} .", dockerfile.display());
        cmd::run(
            Command::new("docker")
                .current_dir(paths::repo_root())
                .args(["build", "-f"])
                .arg(&dockerfile)
                .args(["-t", &local, "."]),
        )?;
        if let Some(registry) = &args.registry {
            let remote = format!("{}/{operator}:{tag}", registry.trim_end_matches('/'));
            cmd::run(Command::new("docker").args(["tag", &local, &remote]))?;
            cmd::run(Command::new("docker").args(["push", &remote]))?;
            let pinned = cmd::output(Command::new("docker").args([
                "inspect",
                "--format",
                "{{index .RepoDigests 0}}",
                &remote,
            ]))?;
            let mut reference = ImageRef::parse(pinned.trim());
            reference.tag = Some(tag);
            println!("deploy: pushed {}", pinned.trim());
            return Ok(reference);
        }
        if let Some(cluster) = &kind_cluster {
            need("kind")?;
            cmd::run(Command::new("kind").args([
                "load",
                "docker-image",
                &local,
                "--name",
                cluster,
            ]))?;
        } else {
            unreachable_warning(&local, &context);
        }
        return Ok(ImageRef::parse(&local));
    }

    let built = image::build(operator, args.tag.as_deref())?;
    if let Some(registry) = &args.registry {
        let pushed = image::push(&built, registry)?;
        let mut reference = ImageRef::parse(&pushed);
        reference.tag = Some(built.tag.clone());
        return Ok(reference);
    }
    // Without a registry the tag carries the digest, so a new build is a new
    // reference and the Deployment rolls.
    let short = built.digest.trim_start_matches("sha256:");
    let local = format!("{operator}:{}-{}", built.tag, &short[..12.min(short.len())]);
    if let Some(cluster) = &kind_cluster {
        need("kind")?;
        need("skopeo")?;
        let archive = image::images_dir().join(format!("{operator}.docker.tar"));
        let _ = std::fs::remove_file(&archive);
        cmd::run(Command::new("skopeo").args([
            "copy",
            "--quiet",
            &built.oci_ref(),
            &format!("docker-archive:{}:{local}", archive.display()),
        ]))?;
        cmd::run(
            Command::new("kind")
                .args(["load", "image-archive"])
                .arg(&archive)
                .args(["--name", cluster]),
        )?;
    } else {
        unreachable_warning(&local, &context);
    }
    Ok(ImageRef::parse(&local))
}

fn need(program: &str) -> Result<()> {
    if !cmd::on_path(program) {
        bail!("{program} is needed here but is not on PATH");
    }
    Ok(())
}

fn unreachable_warning(reference: &str, context: &str) {
    println!(
        "deploy: warning: the image {reference} was built locally only; the nodes of \
         context {context:?} must be able to pull it (pass --registry <host:port> to push it, \
         or load it into the nodes yourself)"
    );
}

fn kustomize(dir: &Path) -> Result<Vec<Value>> {
    kustomize::build(&target_kubectl(), dir)
}

/// The namespace-scoped resources: the operator's ClusterRole rules as a Role
/// (and its binding) in each watched namespace, and the Deployment patch
/// setting WATCH_NAMESPACE.
fn namespaced_resources(
    deploy_dir: &Path,
    operator: &str,
    namespaces: &[String],
) -> Result<(String, String)> {
    let rbac = kustomize(&deploy_dir.join("cluster-rbac"))?;
    let role = rbac
        .iter()
        .find(|d| d["kind"] == "ClusterRole")
        .context("cluster-rbac/ has no ClusterRole")?;
    let binding = rbac
        .iter()
        .find(|d| d["kind"] == "ClusterRoleBinding")
        .context("cluster-rbac/ has no ClusterRoleBinding")?;
    let name = role["metadata"]["name"].as_str().unwrap_or(operator);
    let mut out = Vec::new();
    for ns in namespaces {
        let labels = role["metadata"]["labels"].clone();
        out.push(json!({
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "Role",
            "metadata": {"name": name, "namespace": ns, "labels": labels},
            "rules": role["rules"],
        }));
        out.push(json!({
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "RoleBinding",
            "metadata": {"name": name, "namespace": ns, "labels": labels},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
            "subjects": binding["subjects"],
        }));
    }
    let roles = out
        .iter()
        .map(serde_saphyr::to_string)
        .collect::<Result<Vec<_>, _>>()?
        .join("---\n");

    let base = kustomize(&deploy_dir.join("base"))?;
    let deployment = base
        .iter()
        .find(|d| d["kind"] == "Deployment" && d["metadata"]["name"] == operator)
        .with_context(|| format!("base/ has no Deployment {operator}"))?;
    let container = deployment["spec"]["template"]["spec"]["containers"][0]["name"]
        .as_str()
        .context("the Deployment has no container")?;
    let patch = json!({
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": operator, "namespace": deployment["metadata"]["namespace"]},
        "spec": {"template": {"spec": {"containers": [{
            "name": container,
            "env": [{"name": "WATCH_NAMESPACE", "value": namespaces.join(",")}],
        }]}}},
    });
    Ok((roles, serde_saphyr::to_string(&patch)?))
}

/// A patch of the operator's Deployment that names its workload image.
fn workload_patch(deploy_dir: &Path, operator: &str, env: &str, reference: &str) -> Result<String> {
    let base = kustomize(&deploy_dir.join("base"))?;
    let deployment = base
        .iter()
        .find(|d| d["kind"] == "Deployment" && d["metadata"]["name"] == operator)
        .with_context(|| format!("base/ has no Deployment {operator}"))?;
    let container = deployment["spec"]["template"]["spec"]["containers"][0]["name"]
        .as_str()
        .context("the Deployment has no container")?;
    let patch = json!({
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": operator, "namespace": deployment["metadata"]["namespace"]},
        "spec": {"template": {"spec": {"containers": [{
            "name": container,
            "env": [{"name": env, "value": reference}],
        }]}}},
    });
    Ok(serde_saphyr::to_string(&patch)?)
}

/// Writes `target/deploy/<operator>/kustomization.yaml` (and its parts).
fn write_kustomization(
    operator: &str,
    deploy_dir: &Path,
    image: &ImageRef,
    namespaces: Option<&[String]>,
    workload: Option<&(String, String)>,
) -> Result<PathBuf> {
    let out = generated_dir(operator);
    if out.exists() {
        std::fs::remove_dir_all(&out)?;
    }
    std::fs::create_dir_all(&out)?;
    let mut kustomization = json!({
        "apiVersion": "kustomize.config.k8s.io/v1beta1",
        "kind": "Kustomization",
        "images": [image.kustomize(operator)],
    });
    match namespaces {
        None => {
            kustomization["resources"] = json!([relative(&out, deploy_dir)]);
        }
        Some(namespaces) => {
            let (roles, patch) = namespaced_resources(deploy_dir, operator, namespaces)?;
            std::fs::write(out.join("watched-namespaces.yaml"), roles)?;
            std::fs::write(out.join("deployment-patch.yaml"), patch)?;
            kustomization["resources"] = json!([
                relative(&out, &deploy_dir.join("base")),
                "watched-namespaces.yaml"
            ]);
            kustomization["patches"] = json!([{"path": "deployment-patch.yaml"}]);
        }
    }
    if let Some((env, reference)) = workload {
        std::fs::write(
            out.join("workload-image.yaml"),
            workload_patch(deploy_dir, operator, env, reference)?,
        )?;
        let patches = kustomization["patches"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        let mut patches = patches;
        patches.push(json!({"path": "workload-image.yaml"}));
        kustomization["patches"] = json!(patches);
    }
    kustomize::write(
        &out,
        &format!(
            "Generated by `cargo xtask deploy {operator}`; `cargo xtask undeploy {operator}` deletes it."
        ),
        &kustomization,
    )?;
    Ok(out)
}

/// `cargo xtask deploy ...`.
pub fn deploy(args: &DeployArgs) -> Result<()> {
    let operator = args.operator.as_str();
    let deploy_dir = check_operator(operator)?;
    crds::run(false)?;
    let args_local;
    let mut args = args;
    if args.image.is_none()
        && args.registry.is_none()
        && let Some(registry) = local_registry()
    {
        println!("deploy: the local cluster: pushing to its registry {registry}");
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
            for (key, _) in xtask::simulated::NAMESPACE_ANNOTATIONS {
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
                println!(
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
    println!("deploy: applying {}", dir.display());
    if let Some(namespaces) = &args.namespaced {
        // The CRD is cluster-scoped: not part of the namespaced install.
        cmd::run(
            target_kubectl()
                .with_args(["apply", "--server-side", "-f"])
                .arg(deploy_dir.join("crd.yaml")),
        )?;
        // Watched namespaces are the user's: created when missing, never deleted.
        for ns in namespaces {
            if !target_kubectl().succeeds(["get", "namespace", ns]) {
                target_kubectl().run(["create", "namespace", ns])?;
            }
        }
    }
    print!(
        "{}",
        kustomize::apply(&target_kubectl(), &dir, Some("xtask-deploy"))?
    );
    target_kubectl().run([
        "rollout",
        "status",
        &format!("deployment/{operator}"),
        "-n",
        &format!("{operator}-system"),
        "--timeout=180s",
    ])?;
    println!("deploy: {operator} is rolled out");
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
        println!("undeploy: deleting every {resource} and waiting for their finalizers");
        target_kubectl().run([
            "delete",
            &resource,
            "--all",
            "--all-namespaces",
            "--wait=true",
            "--timeout=120s",
        ])?;
    }
    println!("undeploy: deleting what {} describes", dir.display());
    cmd::run(
        target_kubectl()
            .with_args(["delete", "--ignore-not-found", "-k"])
            .arg(&dir),
    )?;
    Ok(())
}

/// `cargo xtask run <operator> [-- args]`: installs the CRD and runs the
/// operator on this machine against the current kubeconfig.
pub fn run(args: &RunArgs) -> Result<()> {
    let operator = args.operator.as_str();
    if !crds::OPERATORS.contains(&operator) {
        bail!(
            "unknown operator {operator:?}; one of: {}",
            crds::OPERATORS.join(", ")
        );
    }
    let crd = paths::repo_root()
        .join("deploy")
        .join(operator)
        .join("crd.yaml");
    if crd.exists() {
        cmd::run(
            target_kubectl()
                .with_args(["apply", "--server-side", "-f"])
                .arg(&crd),
        )?;
    } else {
        // No deploy tree yet: install what the code generates.
        crds::build_operators(&[operator])?;
        let binary = paths::target_dir().join("debug").join(operator);
        let generated = cmd::output(Command::new(binary).arg("crd"))?;
        let file = generated_dir(operator).join("crd.yaml");
        std::fs::create_dir_all(generated_dir(operator))?;
        std::fs::write(&file, generated)?;
        cmd::run(
            target_kubectl()
                .with_args(["apply", "--server-side", "-f"])
                .arg(&file),
        )?;
    }
    let mut cargo = Command::new(env!("CARGO"));
    cargo
        .current_dir(paths::repo_root())
        .args(["run", "-p", operator, "--", "run"])
        .args(&args.args);
    let kubectl = target_kubectl();
    if let Some(kubeconfig) = kubectl.kubeconfig() {
        cargo.env("KUBECONFIG", kubeconfig);
    }
    cmd::run(&mut cargo).context("the operator stopped")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn image_references() {
        assert_eq!(
            ImageRef::parse("127.0.0.1:5000/op:1.0@sha256:ab"),
            ImageRef {
                name: "127.0.0.1:5000/op".into(),
                tag: Some("1.0".into()),
                digest: Some("sha256:ab".into()),
            }
        );
        assert_eq!(
            ImageRef::parse("registry:5000/op"),
            ImageRef {
                name: "registry:5000/op".into(),
                tag: None,
                digest: None,
            }
        );
        assert_eq!(ImageRef::parse("op:dev").tag.as_deref(), Some("dev"));
    }

    #[test]
    fn relative_paths() {
        assert_eq!(
            relative(Path::new("/r/target/deploy/op"), Path::new("/r/deploy/op")),
            PathBuf::from("../../../deploy/op")
        );
    }
}
