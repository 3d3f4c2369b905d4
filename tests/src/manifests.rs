//! Reading the manifests of `deploy/` as JSON objects (through kubectl, so kustomize
//! builds them exactly as `kubectl apply -k` would) and running kubectl with its
//! warnings captured.

use crate::{kubectl_runner, target_dir, unique_suffix};
use anyhow::{Context, Result, bail};
use serde_json::Value;
use std::collections::BTreeSet;
use std::ffi::OsStr;
use std::path::{Path, PathBuf};

pub use xtask::kubectl::KubectlOutput;

/// Runs kubectl with `args`, capturing stdout and stderr whatever the exit status.
pub fn kubectl_capture<I, S>(args: I) -> Result<KubectlOutput>
where
    I: IntoIterator<Item = S>,
    S: AsRef<OsStr>,
{
    kubectl_runner().capture(args)
}

/// Parses a stream of JSON documents (`kubectl create -o json` prints one per object),
/// flattening `List`s.
pub fn parse_objects(text: &str) -> Result<Vec<Value>> {
    let mut objects = Vec::new();
    for doc in serde_json::Deserializer::from_str(text).into_iter::<Value>() {
        let doc = doc.context("kubectl printed something that is not JSON")?;
        match doc.get("items").and_then(Value::as_array) {
            Some(items) if doc["kind"].as_str().is_some_and(|k| k.ends_with("List")) => {
                objects.extend(items.iter().cloned());
            }
            _ => objects.push(doc),
        }
    }
    Ok(objects)
}

/// The objects a kustomization directory builds (`kubectl create -k <dir>
/// --dry-run=client -o json`: nothing is sent to the cluster).
pub fn kustomize(dir: &Path) -> Result<Vec<Value>> {
    objects_of(["-k".as_ref(), dir.as_os_str()])
}

/// The objects of one manifest file.
pub fn manifest_file(path: &Path) -> Result<Vec<Value>> {
    objects_of(["-f".as_ref(), path.as_os_str()])
}

fn objects_of<const N: usize>(source: [&OsStr; N]) -> Result<Vec<Value>> {
    let mut args: Vec<&OsStr> = vec!["create".as_ref(), "--dry-run=client".as_ref()];
    args.extend(["-o".as_ref(), "json".as_ref() as &OsStr]);
    args.extend(source);
    let out = kubectl_capture(&args)?;
    if !out.success {
        bail!("kubectl {args:?} failed: {}", out.stderr.trim());
    }
    parse_objects(&out.stdout)
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
