//! kustomize, through kubectl: writing a kustomization, building one into its
//! objects, applying one. `cargo xtask deploy`, `demo` and `bench` and the
//! end-to-end tests all go through here.

use crate::support::kubectl::Kubectl;
use anyhow::{Context, Result, bail};
use serde_json::Value;
use std::ffi::OsStr;
use std::path::Path;

/// The file kustomize reads in a directory.
pub const FILE: &str = "kustomization.yaml";

/// Writes `kustomization` (a `Kustomization` object) as `dir/kustomization.yaml`,
/// after the comment line `header`.
///
/// # Errors
/// When it cannot be serialized or written.
pub fn write(dir: &Path, header: &str, kustomization: &Value) -> Result<()> {
    let text = format!("# {header}\n{}", serde_saphyr::to_string(kustomization)?);
    let path = dir.join(FILE);
    std::fs::write(&path, text).with_context(|| format!("writing {}", path.display()))
}

/// The objects `dir` builds (`kubectl kustomize`, parsed; nothing is sent to the
/// cluster, none needs to run).
///
/// # Errors
/// When kubectl fails or prints something that is not YAML.
pub fn build(kubectl: &Kubectl, dir: &Path) -> Result<Vec<Value>> {
    documents(&kubectl.output(["kustomize".as_ref(), dir.as_os_str()])?)
}

/// The objects `dir` builds as the cluster's kubectl would create them (`kubectl
/// create -k <dir> --dry-run=client -o json`: nothing is sent to the cluster).
///
/// # Errors
/// When kubectl fails or prints something that is not JSON.
pub fn objects(kubectl: &Kubectl, dir: &Path) -> Result<Vec<Value>> {
    dry_run_objects(kubectl, ["-k".as_ref(), dir.as_os_str()])
}

/// The objects of a manifest file, as [`objects`] reads them.
///
/// # Errors
/// When kubectl fails or prints something that is not JSON.
pub fn manifest_file(kubectl: &Kubectl, path: &Path) -> Result<Vec<Value>> {
    dry_run_objects(kubectl, ["-f".as_ref(), path.as_os_str()])
}

fn dry_run_objects<const N: usize>(kubectl: &Kubectl, source: [&OsStr; N]) -> Result<Vec<Value>> {
    let mut args: Vec<&OsStr> = vec!["create".as_ref(), "--dry-run=client".as_ref()];
    args.extend(["-o".as_ref(), "json".as_ref() as &OsStr]);
    args.extend(source);
    let out = kubectl.capture(&args)?;
    if !out.success {
        bail!("kubectl {args:?} failed: {}", out.stderr.trim());
    }
    parse_objects(&out.stdout)
}

/// `kubectl apply --server-side --force-conflicts [--field-manager=<m>] -k <dir>`;
/// returns what it printed.
///
/// # Errors
/// When kubectl fails.
pub fn apply(kubectl: &Kubectl, dir: &Path, field_manager: Option<&str>) -> Result<String> {
    let mut args = vec![
        "apply".into(),
        "--server-side".into(),
        "--force-conflicts".into(),
    ];
    if let Some(manager) = field_manager {
        args.push(format!("--field-manager={manager}").into());
    }
    args.extend(["-k".into(), dir.as_os_str().to_owned()]);
    kubectl.output::<_, std::ffi::OsString>(args)
}

/// Splits a stream of YAML documents (`kubectl kustomize` output) into its documents.
///
/// # Errors
/// When a document is not YAML.
pub fn documents(yaml: &str) -> Result<Vec<Value>> {
    let mut docs = Vec::new();
    let mut current = String::new();
    for line in yaml.lines().chain(std::iter::once("---")) {
        if line == "---" {
            if !current.trim().is_empty() {
                docs.push(serde_saphyr::from_str(&current).context("parsing kustomize output")?);
            }
            current.clear();
        } else {
            current.push_str(line);
            current.push('\n');
        }
    }
    Ok(docs)
}

/// Parses a stream of JSON documents (`kubectl create -o json` prints one per object),
/// flattening `List`s.
///
/// # Errors
/// When a document is not JSON.
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

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn yaml_documents() -> Result<()> {
        let docs = documents("a: 1\n---\nb: 2\n")?;
        assert_eq!(docs, vec![json!({"a": 1}), json!({"b": 2})]);
        Ok(())
    }

    #[test]
    fn json_objects_flatten_lists() -> Result<()> {
        let text = r#"{"kind":"ConfigMapList","items":[{"a":1},{"b":2}]} {"c":3}"#;
        assert_eq!(
            parse_objects(text)?,
            vec![json!({"a": 1}), json!({"b": 2}), json!({"c": 3})]
        );
        Ok(())
    }

    #[test]
    fn written_kustomizations_read_back() -> Result<()> {
        let dir = std::env::temp_dir().join(format!("xtask-kustomize-{}", std::process::id()));
        std::fs::create_dir_all(&dir)?;
        let k = json!({"kind": "Kustomization", "resources": ["../base"]});
        write(&dir, "generated", &k)?;
        let text = std::fs::read_to_string(dir.join(FILE))?;
        std::fs::remove_dir_all(&dir)?;
        assert!(text.starts_with("# generated\n"), "{text}");
        assert_eq!(documents(&text)?, vec![k]);
        Ok(())
    }
}
