//! Reading the manifests of `deploy/` as JSON objects (through kubectl, so kustomize
//! builds them exactly as `kubectl apply -k` would) and running kubectl with its
//! warnings captured.

use crate::{kubectl_runner, target_dir, unique_suffix};
use anyhow::Result;
use serde_json::Value;
use std::collections::BTreeSet;
use std::ffi::OsStr;
use std::path::{Path, PathBuf};

pub use xtask::support::kubectl::KubectlOutput;

/// Runs kubectl with `args`, capturing stdout and stderr whatever the exit status.
pub fn kubectl_capture<I, S>(args: I) -> Result<KubectlOutput>
where
    I: IntoIterator<Item = S>,
    S: AsRef<OsStr>,
{
    kubectl_runner().capture(args)
}

pub use xtask::support::kustomize::parse_objects;

/// The objects a kustomization directory builds (`kubectl create -k <dir>
/// --dry-run=client -o json`: nothing is sent to the cluster).
pub fn kustomize(dir: &Path) -> Result<Vec<Value>> {
    xtask::support::kustomize::objects(&kubectl_runner(), dir)
}

/// The objects of one manifest file.
pub fn manifest_file(path: &Path) -> Result<Vec<Value>> {
    xtask::support::kustomize::manifest_file(&kubectl_runner(), path)
}

/// The objects of `objects` of kind `kind`.
pub fn of_kind<'a>(objects: &'a [Value], kind: &str) -> Vec<&'a Value> {
    objects
        .iter()
        .filter(|o| o["kind"].as_str() == Some(kind))
        .collect()
}

/// Every (`resource[.group][/subresource]`, verb) a Role's or ClusterRole's rules grant,
/// spelled as `kubectl auth can-i --list` spells resources.
pub fn granted(role: &Value) -> BTreeSet<(String, String)> {
    let mut out = BTreeSet::new();
    for rule in role["rules"].as_array().into_iter().flatten() {
        let strings = |key: &str| -> Vec<String> {
            rule[key]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|v| v.as_str().map(str::to_owned))
                .collect()
        };
        for group in strings("apiGroups") {
            for resource in strings("resources") {
                for verb in strings("verbs") {
                    out.insert((resource_key(&group, &resource), verb));
                }
            }
        }
    }
    out
}

/// `pods`, `deployments.apps`, `podsets.batch.tutorial.kubebuilder.io/status`.
pub fn resource_key(group: &str, resource: &str) -> String {
    let (plural, sub) = resource
        .split_once('/')
        .map_or((resource, None), |(p, s)| (p, Some(s)));
    let mut key = plural.to_owned();
    if !group.is_empty() {
        key.push('.');
        key.push_str(group);
    }
    if let Some(sub) = sub {
        key.push('/');
        key.push_str(sub);
    }
    key
}

/// Writes `value` as JSON under the cargo target directory (`target/e2e/`) and returns
/// the path, for kubectl's `-f`.
pub fn write_json(stem: &str, value: &Value) -> Result<PathBuf> {
    let dir = target_dir().join("e2e");
    std::fs::create_dir_all(&dir)?;
    let path = dir.join(format!("{stem}-{}.json", unique_suffix()));
    std::fs::write(&path, serde_json::to_string_pretty(value)?)?;
    Ok(path)
}
