//! The kustomization `deploy` generates under `target/deploy/<operator>/`:
//! the committed `deploy/<operator>` tree with the image set and, installed
//! namespace-scoped, a Role per watched namespace.

use super::push_images::ImageRef;
use super::{generated_dir, target_kubectl};
use anyhow::{Context, Result};
use serde_json::{Value, json};
use std::path::{Component, Path, PathBuf};
use xtask::support::kustomize;

/// `to` relative to `from` (both absolute), for kustomize's `resources:`.
pub(crate) fn relative(from: &Path, to: &Path) -> PathBuf {
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

/// The objects kustomize builds from `dir`.
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

    let patch = env_patch(
        deploy_dir,
        operator,
        "WATCH_NAMESPACE",
        &namespaces.join(","),
    )?;
    Ok((roles, patch))
}

/// A patch of the operator's Deployment (as `base/` describes it) that sets
/// the environment variable `name` of its container to `value`.
pub(crate) fn env_patch(
    deploy_dir: &Path,
    operator: &str,
    name: &str,
    value: &str,
) -> Result<String> {
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
            "env": [{"name": name, "value": value}],
        }]}}},
    });
    Ok(serde_saphyr::to_string(&patch)?)
}

/// The namespaced overlay's file of cluster-wide RBAC on the operator's own kind, if any.
const FINALIZER_RBAC: &str = "finalizer-rbac.yaml";

/// Writes `target/deploy/<operator>/kustomization.yaml` (and its parts).
pub(super) fn write_kustomization(
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
            let mut resources = vec![
                json!(relative(&out, &deploy_dir.join("base"))),
                json!("watched-namespaces.yaml"),
            ];
            // The overlay's cluster-wide grant on the operator's own kind (Memcached's
            // finalizer, which must come off after a watched namespace lost its Role),
            // copied: kustomize loads no file from outside the kustomization's folder.
            let finalizer = deploy_dir.join("namespaced").join(FINALIZER_RBAC);
            if finalizer.exists() {
                std::fs::copy(&finalizer, out.join(FINALIZER_RBAC))?;
                resources.push(json!(FINALIZER_RBAC));
            }
            kustomization["resources"] = json!(resources);
            kustomization["patches"] = json!([{"path": "deployment-patch.yaml"}]);
        }
    }
    if let Some((env, reference)) = workload {
        std::fs::write(
            out.join("workload-image.yaml"),
            env_patch(deploy_dir, operator, env, reference)?,
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn relative_paths() {
        assert_eq!(
            relative(Path::new("/r/target/deploy/op"), Path::new("/r/deploy/op")),
            PathBuf::from("../../../deploy/op")
        );
    }
}
