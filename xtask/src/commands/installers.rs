//! `cargo xtask installers [--check] [--registry R] [--tag T] [--out-dir D] [operator...]`:
//! one file per operator that installs it, `deploy/<operator>/install.yaml` (what
//! kubebuilder's `make build-installer` writes to `dist/install.yaml`):
//!
//! ```sh
//! kubectl apply -f deploy/podset-operator/install.yaml
//! ```
//!
//! Each is `kubectl kustomize deploy/<operator>` (CRD, namespace, RBAC, Deployment,
//! metrics Service: the tree's default install) with the operator's image pinned to
//! `<registry>/<operator>:<version>` and, for the operators that run an app of this
//! project, that app's image (`LOLCOW_IMAGE`, `PULSAR_CONSUMER_IMAGE`) pinned to
//! `<registry>/<app>:<version>`. The registry defaults to [`DEFAULT_REGISTRY`]
//! (`ghcr.io/rust-operators`, where the release workflow pushes the images) and the
//! version to the workspace's; `--registry` points the files at another registry (your
//! mirror, or the local cluster's) and is written with `--out-dir` beside the committed
//! ones, never over them.
//!
//! The same run also makes the kustomize trees carry the workspace version (the
//! `newTag` of `deploy/<operator>/kustomization.yaml` and `namespaced/`, the image and
//! workload image tags of `base/deployment.yaml`), so `kubectl apply -k` and the
//! installer name one release.
//! `--check` (a step of `cargo xtask test`) fails instead of writing when either differs.
//!
//! `--digests` (with `--out-dir`) pins every image by digest as well
//! (`<registry>/<image>:<tag>@sha256:...`): the digest of the image `cargo xtask image
//! <image> --tag <tag>` wrote under `target/images/`, which is the digest it pushes. The
//! release workflow builds and pushes the images first, then writes the installers it
//! attaches this way; the committed ones cannot carry digests, as they are generated
//! before the release's images exist.
//!
//! kustomize is the cluster's own kubectl (built with the local cluster): a kubectl of
//! another version may format its output differently, which would read as drift.

use crate::commands::cluster;
use crate::commands::crds;
use crate::commands::deploy;
use anyhow::{Context, Result, bail};
use serde_json::json;
use std::path::{Path, PathBuf};
use xtask::say;
use xtask::support::kubectl::Kubectl;
use xtask::support::kustomize;
use xtask::support::paths;
use xtask::support::workspace_version::{self, Version};

/// Where the release workflow pushes the images, and so what the committed installers
/// pull: `ghcr.io/<GitHub organisation>`. A fork or a mirror passes `--registry`.
pub const DEFAULT_REGISTRY: &str = "ghcr.io/rust-operators";

/// The file name of an installer in its operator's `deploy/` folder.
pub const FILE: &str = "install.yaml";

/// Options of `cargo xtask installers`.
#[derive(clap::Args, Debug)]
pub struct InstallersArgs {
    /// Fail instead of writing when an installer or a tree's image tag differs from
    /// what would be generated (a step of `cargo xtask test`).
    #[arg(long, conflicts_with_all = ["registry", "tag", "out_dir"])]
    pub check: bool,
    /// Pull the images from this registry prefix instead of ghcr.io/rust-operators
    /// (e.g. `registry.example.com/team`, or the local cluster's `127.0.0.1:15000`);
    /// needs --out-dir.
    #[arg(long, value_name = "PREFIX")]
    pub registry: Option<String>,
    /// The image tag (default: the workspace version); needs --out-dir.
    #[arg(long)]
    pub tag: Option<String>,
    /// Write `<DIR>/<operator>-install.yaml` instead of `deploy/<operator>/install.yaml`
    /// (the kustomize trees are left as they are).
    #[arg(long, value_name = "DIR")]
    pub out_dir: Option<PathBuf>,
    /// Pin each image by the digest of the image built for this tag under
    /// `target/images/` (`cargo xtask image <image> --tag <tag>` first); needs --out-dir.
    #[arg(long, requires = "out_dir")]
    pub digests: bool,
    /// The operators (default: every operator with a `deploy/` tree).
    pub operators: Vec<String>,
}

/// `cargo xtask installers ...`.
pub fn run(args: &InstallersArgs) -> Result<()> {
    let operators = crds::selected(&args.operators)?;
    let version = workspace_version::workspace_version()?;
    let registry = args
        .registry
        .as_deref()
        .map(check_registry)
        .transpose()?
        .unwrap_or(DEFAULT_REGISTRY);
    let tag = args.tag.clone().unwrap_or_else(|| version.to_string());
    crate::commands::image::check_tag(&tag).map_err(|e| e.context("the --tag option"))?;
    let custom = registry != DEFAULT_REGISTRY || tag != version.to_string();
    match &args.out_dir {
        Some(dir) => {
            std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
            for op in &operators {
                let path = dir.join(format!("{op}-{FILE}"));
                let digests = if args.digests {
                    Some(Digests::built(op, &tag)?)
                } else {
                    None
                };
                std::fs::write(&path, render(op, registry, &tag, digests.as_ref())?)
                    .with_context(|| format!("writing {}", path.display()))?;
                say!("installers: wrote {}", path.display());
            }
            Ok(())
        }
        None if custom => bail!(
            "--registry and --tag need --out-dir: deploy/<operator>/{FILE} pins the release's \
             images ({DEFAULT_REGISTRY}/<operator>:{version}); write yours elsewhere"
        ),
        None => sync(&operators, &version, args.check),
    }
}

/// Writes (or with `check`, compares) the committed installers of `operators` and their
/// trees' image tags, for `version` and the default registry.
///
/// # Errors
/// With `check`, when anything differs (naming every file); else when kustomize fails.
pub fn sync(operators: &[&str], version: &Version, check: bool) -> Result<()> {
    let mut drifted = Vec::new();
    let tag = version.to_string();
    for op in operators {
        let dir = deploy_dir(op);
        for (path, want) in tree_files(&dir, op, &tag)? {
            let have = read(&path)?;
            write_or_compare(&path, &have, &want, check, &mut drifted)?;
        }
        // After the trees, as it is built from them (with --check, from the trees as
        // they are: one run names every file that differs).
        let path = dir.join(FILE);
        let have = std::fs::read_to_string(&path).unwrap_or_default();
        let want = render(op, DEFAULT_REGISTRY, &tag, None)?;
        write_or_compare(&path, &have, &want, check, &mut drifted)?;
    }
    if !drifted.is_empty() {
        bail!(
            "these files differ from what `cargo xtask installers` generates for version {version}: {}\n\
             run `cargo xtask installers` and commit the result",
            drifted.join(", ")
        );
    }
    Ok(())
}

/// The files of the tree of `op` that name an image of this project, each with its text
/// as it should be for `tag`: the `newTag` of the default install and of the namespaced
/// overlay, and the base Deployment's image and workload image.
fn tree_files(dir: &Path, op: &str, tag: &str) -> Result<Vec<(PathBuf, String)>> {
    let mut files = Vec::new();
    for kustomization in [
        dir.join("kustomization.yaml"),
        dir.join("namespaced").join("kustomization.yaml"),
    ] {
        let text = read(&kustomization)?;
        let want = workspace_version::set_kustomization_tag(&text, op, tag)
            .with_context(|| kustomization.display().to_string())?;
        files.push((kustomization, want));
    }
    let deployment = dir.join("base").join("deployment.yaml");
    let mut want = workspace_version::set_reference_tag(&read(&deployment)?, "image", op, tag)
        .with_context(|| deployment.display().to_string())?;
    if let Some((app, _)) = deploy::workload_image(op) {
        want = workspace_version::set_reference_tag(&want, "value", app, tag)
            .with_context(|| deployment.display().to_string())?;
    }
    files.push((deployment, want));
    Ok(files)
}

fn read(path: &Path) -> Result<String> {
    std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))
}

fn write_or_compare(
    path: &Path,
    have: &str,
    want: &str,
    check: bool,
    drifted: &mut Vec<String>,
) -> Result<()> {
    let shown = path
        .strip_prefix(paths::repo_root())
        .unwrap_or(path)
        .display()
        .to_string();
    if have == want {
        say!("installers: {shown} is up to date");
    } else if check {
        drifted.push(shown);
    } else {
        std::fs::write(path, want).with_context(|| format!("writing {}", path.display()))?;
        say!("installers: wrote {shown}");
    }
    Ok(())
}

/// A registry prefix as `--registry` takes it: `host[:port][/path]`, no scheme, no tag.
fn check_registry(registry: &str) -> Result<&str> {
    let trimmed = registry.trim_end_matches('/');
    let ok = !trimmed.is_empty()
        && !trimmed.contains("://")
        && !trimmed.contains('@')
        && trimmed
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_' | '/' | ':'))
        && trimmed.split('/').all(|part| !part.is_empty());
    if !ok {
        bail!(
            "--registry {registry:?} is not a registry prefix: give host[:port][/path], e.g. \
             ghcr.io/my-org or 127.0.0.1:15000 (no scheme, tag or digest)"
        );
    }
    Ok(trimmed)
}

fn deploy_dir(operator: &str) -> PathBuf {
    paths::repo_root().join("deploy").join(operator)
}

/// The kubectl whose kustomize builds the installers: the local cluster's, built from
/// its Go module when missing, so every machine renders byte for byte the same.
fn kustomize_kubectl() -> Result<Kubectl> {
    cluster::build::KUBERNETES.ensure_built()?;
    Ok(Kubectl::new(cluster::build::kubectl()?))
}

/// The digests an installer pins: the operator's image's and its workload image's.
pub struct Digests {
    /// `sha256:...` of the operator's image.
    pub operator: String,
    /// `sha256:...` of the workload app's image, for the operators that run one.
    pub workload: Option<String>,
}

impl Digests {
    /// The digests of the images of `operator` (and its workload app) built for `tag`
    /// under `target/images/`.
    ///
    /// # Errors
    /// When an image was not built, or was built for another tag.
    pub fn built(operator: &str, tag: &str) -> Result<Digests> {
        let of = |image: &str| {
            layout_digest(&crate::commands::image::images_dir().join(image), tag).with_context(
                || {
                    format!(
                        "--digests: build the image first: cargo xtask image {image} --tag {tag}"
                    )
                },
            )
        };
        Ok(Digests {
            operator: of(operator)?,
            workload: deploy::workload_image(operator)
                .map(|(app, _)| of(app))
                .transpose()?,
        })
    }
}

/// The digest of the image tagged `tag` in the OCI image layout `dir` (its `index.json`).
fn layout_digest(dir: &Path, tag: &str) -> Result<String> {
    let path = dir.join("index.json");
    let index: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?,
    )
    .with_context(|| format!("parsing {}", path.display()))?;
    index["manifests"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|m| m["annotations"]["org.opencontainers.image.ref.name"] == tag)
        .and_then(|m| m["digest"].as_str())
        .filter(|d| d.starts_with("sha256:"))
        .map(str::to_owned)
        .with_context(|| format!("{} has no image tagged {tag}", path.display()))
}

/// The installer of `operator` with its images under `registry`, tagged `tag` (and
/// pinned by `digests`).
///
/// # Errors
/// When kustomize fails.
pub fn render(
    operator: &str,
    registry: &str,
    tag: &str,
    digests: Option<&Digests>,
) -> Result<String> {
    let tree = deploy_dir(operator);
    let dir = paths::target_dir().join("installers").join(operator);
    if dir.exists() {
        std::fs::remove_dir_all(&dir)?;
    }
    std::fs::create_dir_all(&dir)?;
    let mut kustomization = json!({
        "apiVersion": "kustomize.config.k8s.io/v1beta1",
        "kind": "Kustomization",
        "resources": [deploy::relative(&dir, &tree)],
        "images": [{"name": operator, "newName": format!("{registry}/{operator}"), "newTag": tag}],
    });
    let pin = |digest: Option<&String>| digest.map(|d| format!("@{d}")).unwrap_or_default();
    if let Some(digests) = digests {
        kustomization["images"][0]["digest"] = json!(digests.operator);
    }
    let workload = deploy::workload_image(operator);
    let workload_ref = |app: &str| {
        format!(
            "{registry}/{app}:{tag}{}",
            pin(digests.and_then(|d| d.workload.as_ref()))
        )
    };
    if let Some((app, env)) = workload {
        let patch = deploy::env_patch(&tree, operator, env, &workload_ref(app))?;
        std::fs::write(dir.join("workload-image.yaml"), patch)?;
        kustomization["patches"] = json!([{"path": "workload-image.yaml"}]);
    }
    kustomize::write(
        &dir,
        &format!("Generated by `cargo xtask installers` for {operator}."),
        &kustomization,
    )?;
    let objects = kustomize_kubectl()?.output(["kustomize".as_ref(), dir.as_os_str()])?;
    let image = format!(
        "{registry}/{operator}:{tag}{}",
        pin(digests.map(|d| &d.operator))
    );
    let mut header = format!(
        "# {operator} {tag}: everything a cluster-wide install needs (CRD, namespace, RBAC,\n\
         # Deployment, metrics Service), in one file:\n\
         #   kubectl apply -f {FILE}\n\
         # The operator runs {image}"
    );
    if let Some((app, env)) = workload {
        header.push_str(&format!(";\n# it runs {} ({env})", workload_ref(app)));
    }
    header.push_str(&format!(
        ".\n# Generated from deploy/{operator} (kubectl kustomize) by `cargo xtask installers`; do\n\
         # not edit: change the tree and run it again. Another registry: `cargo xtask installers\n\
         # --registry <host[/path]> --out-dir <dir>`.\n"
    ));
    Ok(format!("{header}{objects}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn digests_are_read_from_the_image_layout() {
        let dir = paths::target_dir()
            .join("tmp")
            .join("installers-layout-digest");
        std::fs::create_dir_all(&dir).unwrap();
        let digest = format!("sha256:{}", "a".repeat(64));
        std::fs::write(
            dir.join("index.json"),
            json!({"manifests": [
                {"digest": format!("sha256:{}", "b".repeat(64)), "artifactType": "application/spdx+json"},
                {"digest": digest, "annotations": {"org.opencontainers.image.ref.name": "1.2.3"}},
            ]})
            .to_string(),
        )
        .unwrap();
        assert_eq!(layout_digest(&dir, "1.2.3").unwrap(), digest);
        let err = layout_digest(&dir, "1.2.4").unwrap_err().to_string();
        assert!(err.contains("no image tagged 1.2.4"), "{err}");
        assert!(layout_digest(&dir.join("missing"), "1.2.3").is_err());
    }

    #[test]
    fn registry_prefixes() {
        assert_eq!(check_registry("ghcr.io/me/").ok(), Some("ghcr.io/me"));
        assert_eq!(
            check_registry("127.0.0.1:15000").ok(),
            Some("127.0.0.1:15000")
        );
        for bad in [
            "",
            "https://ghcr.io/me",
            "ghcr.io//me",
            "ghcr.io/me@sha256:x",
            "a b",
        ] {
            let err = check_registry(bad).map(drop).unwrap_err().to_string();
            assert!(err.starts_with("--registry"), "{err}");
        }
    }

    #[test]
    fn unknown_operators_are_named() {
        let err = crds::selected(&["nope".to_owned()])
            .map(drop)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("\"nope\"") && err.contains("podset-operator"),
            "{err}"
        );
        assert_eq!(
            crds::selected(&[]).map(|all| all.len()).ok(),
            Some(xtask::support::operators::OPERATORS.len())
        );
    }
}
