//! `cargo xtask charts [--check]`: a Helm chart per operator under
//! `deploy/<operator>/chart/`, generated from its kustomize tree (the source of truth),
//! as kubebuilder's helm/v2-alpha plugin generates its chart from `make build-installer`.
//!
//! kustomize builds each part of the tree (the default install, `namespaced/`,
//! `prometheus/`, `network-policy/`) with origin annotations, so every object is known
//! with the file it came from; `objects` turns each into its template (the few fields
//! values set are filled in, the rest is copied), `files` writes `Chart.yaml`, the
//! values, their schema and the helpers. The templates mirror the tree's files.
//!
//! Both modes then check the charts with a real Helm (built from its Go module):
//! `helm lint --strict`, and `helm template` compared object by object with `kubectl
//! kustomize` for the defaults and for each optional part (`check`). `--check` also
//! fails when a committed file differs from what the tree generates.

mod check;
mod files;
mod holes;
mod objects;

use crate::commands::{cluster, crds};
use anyhow::{Context, Result, bail};
use objects::{Part, Source};
use serde_json::Value;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use xtask::say;
use xtask::support::kubectl::Kubectl;
use xtask::support::kustomize;
use xtask::support::{cmd, paths};

/// The chart folder of an operator.
pub fn chart_dir(op: &str) -> PathBuf {
    paths::repo_root().join("deploy").join(op).join("chart")
}

/// Writes (or with `check`, compares) every operator's chart, then lints each and
/// compares its renderings with kustomize's.
pub fn run(check: bool) -> Result<()> {
    run_for(check, &crds::deployed_operators())
}

/// [`run`] for `operators` only.
pub fn run_for(check: bool, operators: &[&str]) -> Result<()> {
    let kubectl = kubectl()?;
    let mut drifted = Vec::new();
    for &op in operators {
        let want = generate(&kubectl, op)?;
        let dir = chart_dir(op);
        let have = read_tree(&dir)?;
        if have == want {
            say!("charts: {} is up to date", dir.display());
            continue;
        }
        if check {
            for path in want.keys().chain(have.keys()) {
                if want.get(path) != have.get(path) && !drifted.contains(path) {
                    drifted.push(format!("deploy/{op}/chart/{path}"));
                }
            }
            continue;
        }
        if dir.exists() {
            std::fs::remove_dir_all(&dir)?;
        }
        for (path, text) in &want {
            let file = dir.join(path);
            if let Some(parent) = file.parent() {
                std::fs::create_dir_all(parent)?;
            }
            std::fs::write(&file, text).with_context(|| format!("writing {}", file.display()))?;
        }
        say!("charts: wrote {}", dir.display());
    }
    if !drifted.is_empty() {
        drifted.sort();
        drifted.dedup();
        bail!(
            "these chart files differ from what the kustomize trees generate: {}\n\
             run `cargo xtask charts` and commit the result",
            drifted.join(", ")
        );
    }
    let helm = crate::commands::tool::helm()?;
    for &op in operators {
        check::lint(&helm, op)?;
        check::renders_like_kustomize(&helm, &kubectl, op)?;
    }
    Ok(())
}

/// kubectl for `kustomize`: the cluster's own when built, else the one on PATH, else
/// the cluster's built now.
fn kubectl() -> Result<Kubectl> {
    let built = cluster::build::kubectl()?;
    if !cmd::is_executable(&built) && !cmd::on_path("kubectl") {
        cluster::build::KUBERNETES.ensure_built()?;
    }
    Ok(Kubectl::new(cluster::build::kubectl_or_path()))
}

/// Every file of the chart of `op`, by path under the chart folder.
fn generate(kubectl: &Kubectl, op: &str) -> Result<BTreeMap<String, String>> {
    let kind = xtask::support::operators::by_operator(op)
        .with_context(|| format!("{op} is not in xtask::support::operators"))?;
    let mut sources = Vec::new();
    for part in [
        Part::Default,
        Part::Namespaced,
        Part::Prometheus,
        Part::NetworkPolicy,
    ] {
        sources.extend(build_with_origins(kubectl, op, part)?);
    }
    let (pieces, defaults) = objects::templates(op, sources)?;
    let package = package(op)?;
    let meta = files::Meta {
        op,
        description: &package.description,
        version: &package.version,
    };
    let mut out = BTreeMap::new();
    out.insert("Chart.yaml".to_owned(), files::chart_yaml(&meta));
    out.insert(
        "values.yaml".to_owned(),
        files::values_yaml(&meta, &defaults)?,
    );
    out.insert("values.schema.json".to_owned(), files::values_schema()?);
    out.insert("templates/_helpers.tpl".to_owned(), files::helpers(op));
    out.insert(
        "templates/NOTES.txt".to_owned(),
        files::notes(op, kind.kind),
    );
    for (path, text) in files::template_files(op, &pieces) {
        out.insert(format!("templates/{path}"), text);
    }
    Ok(out)
}

/// The folder of a part of the tree, relative to `deploy/<op>`.
fn part_dir(part: Part) -> &'static str {
    match part {
        Part::Default => "",
        Part::Namespaced => "namespaced",
        Part::Prometheus => "prometheus",
        Part::NetworkPolicy => "network-policy",
    }
}

/// The objects kustomize builds from one part of `deploy/<op>`, each with the file it
/// came from (kustomize's origin annotations, through a kustomization under `target/`).
fn build_with_origins(kubectl: &Kubectl, op: &str, part: Part) -> Result<Vec<Source>> {
    let tree = paths::repo_root().join("deploy").join(op);
    let source = tree.join(part_dir(part));
    if !source.join(kustomize::FILE).exists() {
        bail!("{} has no {}", source.display(), kustomize::FILE);
    }
    let dir = paths::target_dir()
        .join("charts")
        .join(op)
        .join(match part_dir(part) {
            "" => "default",
            other => other,
        });
    std::fs::create_dir_all(&dir)?;
    let kustomization = serde_json::json!({
        "apiVersion": "kustomize.config.k8s.io/v1beta1",
        "kind": "Kustomization",
        "resources": [relative(&dir, &source)],
        "buildMetadata": ["originAnnotations"],
    });
    kustomize::write(&dir, "Generated by `cargo xtask charts`.", &kustomization)?;
    let marker = format!("deploy/{op}/");
    let mut out = Vec::new();
    for mut object in kustomize::build(kubectl, &dir)? {
        let origin = take_annotation(&mut object, "config.kubernetes.io/origin");
        let path = origin
            .lines()
            .find_map(|l| l.trim().strip_prefix("path:"))
            .and_then(|p| {
                p.split_once(&marker)
                    .map(|(_, rest)| rest.trim().to_owned())
            })
            .with_context(|| {
                format!(
                    "kustomize gave no origin under deploy/{op} for {}",
                    describe(&object)
                )
            })?;
        out.push(Source { part, path, object });
    }
    Ok(out)
}

/// Removes an annotation (and the annotations map when it is left empty); returns it.
fn take_annotation(object: &mut Value, key: &str) -> String {
    let Some(annotations) = object["metadata"]
        .get_mut("annotations")
        .and_then(Value::as_object_mut)
    else {
        return String::new();
    };
    let value = annotations
        .remove(key)
        .and_then(|v| v.as_str().map(str::to_owned))
        .unwrap_or_default();
    if annotations.is_empty()
        && let Some(metadata) = object["metadata"].as_object_mut()
    {
        metadata.remove("annotations");
    }
    value
}

/// `Kind namespace/name`, for messages.
fn describe(object: &Value) -> String {
    let ns = object["metadata"]["namespace"].as_str().unwrap_or_default();
    format!(
        "{} {}{}{}",
        object["kind"].as_str().unwrap_or("?"),
        ns,
        if ns.is_empty() { "" } else { "/" },
        object["metadata"]["name"].as_str().unwrap_or("?")
    )
}

/// `to` relative to `from` (both under the repository), for a kustomization's resources.
fn relative(from: &Path, to: &Path) -> String {
    let from: Vec<_> = from.components().collect();
    let to: Vec<_> = to.components().collect();
    let common = from.iter().zip(&to).take_while(|(a, b)| a == b).count();
    let mut parts: Vec<String> = vec!["..".to_owned(); from.len() - common];
    parts.extend(
        to[common..]
            .iter()
            .map(|c| c.as_os_str().to_string_lossy().into_owned()),
    );
    parts.join("/")
}

/// Every file under `dir` (none when it does not exist), by relative path.
fn read_tree(dir: &Path) -> Result<BTreeMap<String, String>> {
    fn walk(root: &Path, dir: &Path, out: &mut BTreeMap<String, String>) -> Result<()> {
        for entry in std::fs::read_dir(dir)? {
            let path = entry?.path();
            if path.is_dir() {
                walk(root, &path, out)?;
            } else {
                let rel = path
                    .strip_prefix(root)
                    .unwrap_or(&path)
                    .to_string_lossy()
                    .into_owned();
                out.insert(rel, std::fs::read_to_string(&path).unwrap_or_default());
            }
        }
        Ok(())
    }
    let mut out = BTreeMap::new();
    if dir.exists() {
        walk(dir, dir, &mut out)?;
    }
    Ok(out)
}

/// What the chart takes from the operator's crate.
struct Package {
    version: String,
    description: String,
}

fn package(op: &str) -> Result<Package> {
    let pkg = cmd::workspace_package(op)?;
    Ok(Package {
        version: pkg["version"].as_str().unwrap_or("0.0.0").to_owned(),
        description: pkg["description"].as_str().unwrap_or_default().to_owned(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn relative_paths_climb_out_of_target() {
        assert_eq!(
            relative(
                Path::new("/r/target/charts/op/default"),
                Path::new("/r/deploy/op/")
            ),
            "../../../../deploy/op"
        );
    }

    #[test]
    fn origin_annotations_come_off() {
        let mut object =
            json!({"metadata": {"annotations": {"config.kubernetes.io/origin": "path: x\n"}}});
        assert_eq!(
            take_annotation(&mut object, "config.kubernetes.io/origin"),
            "path: x\n"
        );
        assert_eq!(object, json!({"metadata": {}}));
    }
}
