//! The images `deploy` runs: the operator's (built with Docker or
//! `cargo xtask image`, then pushed or loaded into kind) and its workload's.

use super::{DeployArgs, current_context, target_kubectl};
use crate::commands::{cluster, image};
use anyhow::{Result, bail};
use serde_json::{Value, json};
use std::path::Path;
use std::process::Command;
use xtask::say;
use xtask::support::{cmd, paths};

/// An image reference split the way kustomize's `images:` wants it.
#[derive(Debug, PartialEq, Eq)]
pub(super) struct ImageRef {
    name: String,
    tag: Option<String>,
    digest: Option<String>,
}

impl ImageRef {
    /// Splits `name[:tag][@digest]`.
    pub(super) fn parse(reference: &str) -> ImageRef {
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

    /// Its entry in kustomize's `images:` for the image named `operator`.
    pub(super) fn kustomize(&self, operator: &str) -> Value {
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

/// Whether a Docker daemon answers.
fn docker_works() -> bool {
    cmd::on_path("docker") && cmd::succeeds(Command::new("docker").arg("info"))
}

/// The workload image an operator runs (an app of this project) and the
/// operator's environment variable that names it (`xtask::support::operators`).
pub fn workload_image(operator: &str) -> Option<(&'static str, &'static str)> {
    let workload = xtask::support::operators::by_operator(operator)?
        .workload
        .as_ref()?;
    Some((workload.app, workload.env))
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
pub(super) fn provide_workload_image(
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
pub(super) fn provide_image(operator: &str, args: &DeployArgs) -> Result<ImageRef> {
    if let Some(reference) = &args.image {
        say!("deploy: using the image {reference} as given");
        return Ok(ImageRef::parse(reference));
    }
    let dockerfile = Path::new("operators").join(operator).join("Dockerfile");
    let use_docker = docker_works() && paths::repo_root().join(&dockerfile).exists();
    let context = current_context().unwrap_or_default();
    let kind_cluster = context.strip_prefix("kind-").map(str::to_owned);

    if use_docker {
        let tag = match &args.tag {
            Some(tag) => tag.clone(),
            None => xtask::support::workspace_version::workspace_version()?.to_string(),
        };
        let local = format!("{operator}:{tag}");
        say!("deploy: docker build -f {} .", dockerfile.display());
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
            say!("deploy: pushed {}", pinned.trim());
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

/// Fails unless `program` is on PATH.
fn need(program: &str) -> Result<()> {
    if !cmd::on_path(program) {
        bail!("{program} is needed here but is not on PATH");
    }
    Ok(())
}

/// Says that `reference` may not be pullable from the nodes of `context`.
fn unreachable_warning(reference: &str, context: &str) {
    say!(
        "deploy: warning: the image {reference} was built locally only; the nodes of \
         context {context:?} must be able to pull it (pass --registry <host:port> to push it, \
         or load it into the nodes yourself)"
    );
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
}
