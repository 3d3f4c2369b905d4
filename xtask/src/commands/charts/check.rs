//! The charts checked with a real Helm: `helm lint --strict`, and `helm template`
//! compared object by object with what `kubectl kustomize` builds, for the defaults and
//! for each optional part. Only what must differ is set aside: the Namespace kustomize
//! creates (Helm installs into the release's), `app.kubernetes.io/managed-by`, the
//! CRD's `helm.sh/resource-policy`, and the order of a container's environment (a
//! kustomize patch moves the variable it sets first), unless one variable refers to
//! another (`$(NAME)`), where the order counts.

use super::{chart_dir, describe, take_annotation};
use anyhow::{Context, Result, bail};
use serde_json::Value;
use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;
use xtask::say;
use xtask::support::kubectl::Kubectl;
use xtask::support::kustomize;
use xtask::support::{cmd, paths};

/// One rendering compared: the values set, and the kustomize folders (under
/// `deploy/<op>`) whose objects it must equal.
struct Case {
    name: &'static str,
    values: Vec<String>,
    kustomize: Vec<&'static str>,
}

/// The watched namespaces of the `namespaced/` overlay (its WATCH_NAMESPACE).
fn overlay_namespaces(objects: &[Value]) -> Result<Vec<String>> {
    objects
        .iter()
        .filter(|o| o["kind"] == "Deployment")
        .flat_map(|d| {
            d["spec"]["template"]["spec"]["containers"]
                .as_array()
                .into_iter()
                .flatten()
        })
        .flat_map(|c| c["env"].as_array().into_iter().flatten())
        .find(|e| e["name"] == "WATCH_NAMESPACE")
        .and_then(|e| e["value"].as_str())
        .map(|v| v.split(',').map(str::to_owned).collect())
        .context("namespaced/ sets no WATCH_NAMESPACE")
}

fn cases(kubectl: &Kubectl, op: &str) -> Result<Vec<Case>> {
    let overlay = kustomize::build(kubectl, &tree(op).join("namespaced"))?;
    let watched = serde_json::to_string(&overlay_namespaces(&overlay)?)?;
    Ok(vec![
        Case {
            name: "defaults",
            values: vec![],
            kustomize: vec![""],
        },
        Case {
            name: "prometheus.enabled",
            values: vec!["prometheus.enabled=true".into()],
            kustomize: vec!["", "prometheus"],
        },
        Case {
            name: "networkPolicy.enabled",
            values: vec!["networkPolicy.enabled=true".into()],
            kustomize: vec!["", "network-policy"],
        },
        // The overlay installs neither the CRD nor the people's roles.
        Case {
            name: "rbac.namespaced",
            values: vec![
                "rbac.namespaced=true".into(),
                format!("rbac.watchNamespaces={watched}"),
                "crd.enabled=false".into(),
                "rbacHelpers.enabled=false".into(),
            ],
            kustomize: vec!["namespaced"],
        },
    ])
}

fn tree(op: &str) -> std::path::PathBuf {
    paths::repo_root().join("deploy").join(op)
}

/// `helm lint --strict`, with the defaults and namespace-scoped.
pub fn lint(helm: &Path, op: &str) -> Result<()> {
    let chart = chart_dir(op);
    for values in [
        &[][..],
        &[
            "rbac.namespaced=true",
            "rbac.watchNamespaces=[\"a\",\"b\"]",
            "prometheus.enabled=true",
            "networkPolicy.enabled=true",
        ][..],
    ] {
        let mut lint = Command::new(helm);
        lint.arg("lint").arg("--strict").arg(&chart);
        for v in values {
            lint.args(["--set-json", v]);
        }
        cmd::output(&mut lint)
            .with_context(|| format!("helm lint --strict deploy/{op}/chart {values:?}"))?;
    }
    say!("charts: helm lint --strict deploy/{op}/chart: ok");
    Ok(())
}

/// `helm template <op> deploy/<op>/chart -n <op>-system` with `values` (`--set-json`).
pub fn template(helm: &Path, op: &str, values: &[String]) -> Result<Vec<Value>> {
    let mut template = Command::new(helm);
    template
        .args(["template", op])
        .arg(chart_dir(op))
        .args(["--namespace", &format!("{op}-system")]);
    for v in values {
        template.args(["--set-json", v]);
    }
    let text = cmd::output(&mut template)?;
    Ok(kustomize::documents(&text)?
        .into_iter()
        .filter(|d| !d.is_null())
        .collect())
}

/// Every case's `helm template` equals what kustomize builds, object by object.
pub fn renders_like_kustomize(helm: &Path, kubectl: &Kubectl, op: &str) -> Result<()> {
    let mut failures = Vec::new();
    for case in cases(kubectl, op)? {
        let mut want = Vec::new();
        for dir in &case.kustomize {
            want.extend(kustomize::build(kubectl, &tree(op).join(dir))?);
        }
        let have = template(helm, op, &case.values)?;
        let problems = compare(want, have);
        if problems.is_empty() {
            say!(
                "charts: {op} ({}): helm template = kubectl kustomize",
                case.name
            );
        } else {
            failures.push(format!(
                "{op} with {}:\n  {}",
                case.name,
                problems.join("\n  ")
            ));
        }
    }
    if !failures.is_empty() {
        bail!(
            "the chart renders other objects than kustomize builds:\n{}",
            failures.join("\n")
        );
    }
    Ok(())
}

/// The differences between kustomize's objects and Helm's, after setting aside what
/// must differ.
fn compare(kustomize: Vec<Value>, helm: Vec<Value>) -> Vec<String> {
    let key = |o: &Value| {
        format!(
            "{} {}",
            o["apiVersion"].as_str().unwrap_or_default(),
            describe(o)
        )
    };
    let index = |objects: Vec<Value>, from_helm: bool| -> BTreeMap<String, Value> {
        objects
            .into_iter()
            .filter(|o| o["kind"] != "Namespace" || from_helm)
            .map(|mut o| {
                normalise(&mut o);
                (key(&o), o)
            })
            .collect()
    };
    let want = index(kustomize, false);
    let have = index(helm, true);
    let mut problems = Vec::new();
    for (k, w) in &want {
        match have.get(k) {
            None => problems.push(format!("missing from the chart: {k}")),
            Some(h) => {
                let mut paths = Vec::new();
                differences("", w, h, &mut paths);
                if !paths.is_empty() {
                    problems.push(format!("{k} differs at {}", paths.join(", ")));
                }
            }
        }
    }
    for k in have.keys().filter(|k| !want.contains_key(*k)) {
        problems.push(format!("only in the chart: {k}"));
    }
    problems
}

/// Sets aside what Helm and kustomize must differ in.
fn normalise(object: &mut Value) {
    if let Some(labels) = object["metadata"]
        .get_mut("labels")
        .and_then(Value::as_object_mut)
    {
        labels.remove("app.kubernetes.io/managed-by");
    }
    take_annotation(object, "helm.sh/resource-policy");
    let containers = object
        .pointer_mut("/spec/template/spec/containers")
        .and_then(Value::as_array_mut);
    for container in containers.into_iter().flatten() {
        if let Some(env) = container.get_mut("env").and_then(Value::as_array_mut)
            && !env.iter().any(|e| e.to_string().contains("$("))
        {
            env.sort_by(|a, b| a["name"].to_string().cmp(&b["name"].to_string()));
        }
    }
}

/// The JSON paths where `a` and `b` differ (with both values), depth first.
fn differences(path: &str, a: &Value, b: &Value, out: &mut Vec<String>) {
    match (a, b) {
        (Value::Object(x), Value::Object(y)) => {
            let keys: std::collections::BTreeSet<&String> = x.keys().chain(y.keys()).collect();
            for k in keys {
                let at = format!("{path}/{k}");
                match (x.get(k), y.get(k)) {
                    (Some(p), Some(q)) => differences(&at, p, q, out),
                    (Some(p), None) => out.push(format!("{at} (kustomize {p}, not in the chart)")),
                    (None, Some(q)) => out.push(format!("{at} (not in kustomize, chart {q})")),
                    (None, None) => {}
                }
            }
        }
        (Value::Array(x), Value::Array(y)) if x.len() == y.len() => {
            for (i, (p, q)) in x.iter().zip(y).enumerate() {
                differences(&format!("{path}/{i}"), p, q, out);
            }
        }
        _ if a != b => out.push(format!("{path} (kustomize {a}, chart {b})")),
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn object(kind: &str, name: &str, extra: Value) -> Value {
        let mut o = json!({"apiVersion": "v1", "kind": kind, "metadata": {"name": name}});
        if let (Some(o), Some(extra)) = (o.as_object_mut(), extra.as_object()) {
            o.extend(extra.clone());
        }
        o
    }

    #[test]
    fn the_same_objects_in_another_order_compare_equal() {
        let a = object("ConfigMap", "a", json!({"data": {"x": "1"}}));
        let b = object("ConfigMap", "b", json!({}));
        assert!(compare(vec![a.clone(), b.clone()], vec![b, a]).is_empty());
    }

    #[test]
    fn what_must_differ_is_set_aside_and_nothing_else() {
        let ns = object("Namespace", "op-system", json!({}));
        let mut kustomized = object("ConfigMap", "a", json!({}));
        kustomized["metadata"]["labels"] =
            json!({"app.kubernetes.io/managed-by": "kustomize", "x": "y"});
        let mut helmed = kustomized.clone();
        helmed["metadata"]["labels"]["app.kubernetes.io/managed-by"] = json!("Helm");
        helmed["metadata"]["annotations"] = json!({"helm.sh/resource-policy": "keep"});
        assert!(compare(vec![ns, kustomized.clone()], vec![helmed.clone()]).is_empty());

        helmed["metadata"]["labels"]["x"] = json!("z");
        let problems = compare(vec![kustomized.clone()], vec![helmed]);
        assert_eq!(problems.len(), 1, "{problems:?}");
        assert!(problems[0].contains("/metadata/labels/x"), "{problems:?}");

        let extra = object("Secret", "s", json!({}));
        let problems = compare(vec![kustomized.clone()], vec![kustomized, extra]);
        assert_eq!(problems, ["only in the chart: v1 Secret s"]);
    }

    #[test]
    fn environment_order_counts_only_with_references() {
        let env = |names: &[&str], value: &str| {
            let env: Vec<Value> = names
                .iter()
                .map(|n| json!({"name": n, "value": value}))
                .collect();
            object(
                "Deployment",
                "d",
                json!({"spec": {"template": {"spec": {"containers": [{"env": env}]}}}}),
            )
        };
        assert!(compare(vec![env(&["A", "B"], "x")], vec![env(&["B", "A"], "x")]).is_empty());
        assert!(
            !compare(
                vec![env(&["A", "B"], "$(A)")],
                vec![env(&["B", "A"], "$(A)")]
            )
            .is_empty()
        );
    }

    #[test]
    fn lists_differ_by_item_and_a_null_is_not_a_missing_field() {
        let mut out = Vec::new();
        differences("", &json!({"a": [1, 2]}), &json!({"a": [1, 3]}), &mut out);
        assert_eq!(out, ["/a/1 (kustomize 2, chart 3)"]);
        out.clear();
        differences("", &json!({"a": 1}), &json!({"a": 1, "b": null}), &mut out);
        assert_eq!(out, ["/b (not in kustomize, chart null)"]);
    }
}
