//! Every `spec` of every CRD under `deploy/` is bounded in its schema: a tenant with `edit`
//! in one namespace may create these objects, and one unbounded string, list or map lets a
//! single object grow to the API server's request limit. Walked recursively over the
//! committed CRDs (the CRD drift check keeps them equal to what the code generates), so a
//! field added later without a bound fails here.

use anyhow::{Context, Result};
use serde_json::Value;
use xtask::support::operators::OPERATORS;
use xtask::support::paths::repo_root;

/// String formats the API server validates, and which therefore bound a string's length.
const BOUNDING_FORMATS: [&str; 2] = ["date-time", "date"];

/// The unbounded places of `schema` (at `path`), one line each, appended to `out`.
fn unbounded(schema: &Value, path: &str, out: &mut Vec<String>) {
    let has = |key: &str| schema.get(key).is_some();
    let type_ = schema.get("type").and_then(Value::as_str);
    if schema["x-kubernetes-preserve-unknown-fields"] == Value::Bool(true) {
        out.push(format!(
            "{path}: x-kubernetes-preserve-unknown-fields (no bound)"
        ));
    }
    let int_or_string = schema["x-kubernetes-int-or-string"] == Value::Bool(true);
    let bounded_format = schema
        .get("format")
        .and_then(Value::as_str)
        .is_some_and(|f| BOUNDING_FORMATS.contains(&f));
    if (type_ == Some("string") || int_or_string)
        && !has("maxLength")
        && !has("enum")
        && !bounded_format
    {
        out.push(format!("{path}: string without maxLength"));
    }
    if type_ == Some("array") && !has("maxItems") {
        out.push(format!("{path}: array without maxItems"));
    }
    let additional = schema.get("additionalProperties");
    if additional.is_some_and(|a| a != &Value::Bool(false)) && !has("maxProperties") {
        out.push(format!("{path}: map without maxProperties"));
    }
    if type_.is_none() && !int_or_string && !has("properties") && !has("anyOf") {
        out.push(format!("{path}: no type"));
    }
    if let Some(properties) = schema.get("properties").and_then(Value::as_object) {
        for (name, property) in properties {
            unbounded(property, &format!("{path}.{name}"), out);
        }
    }
    if let Some(items) = schema.get("items") {
        unbounded(items, &format!("{path}[]"), out);
    }
    if let Some(values) = additional.filter(|a| a.is_object()) {
        unbounded(values, &format!("{path}{{}}"), out);
    }
    for key in ["anyOf", "oneOf", "allOf"] {
        for (i, branch) in schema
            .get(key)
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .enumerate()
        {
            // A branch only narrows its parent: it needs no type of its own.
            let mut found = Vec::new();
            unbounded(branch, &format!("{path}({key}[{i}])"), &mut found);
            out.extend(found.into_iter().filter(|f| !f.ends_with(": no type")));
        }
    }
}

/// The unbounded places of the `spec` of every version of the CRD `crd`.
fn unbounded_in_spec(crd: &Value) -> Result<Vec<String>> {
    let mut out = Vec::new();
    let versions = crd["spec"]["versions"]
        .as_array()
        .context("spec.versions")?;
    for version in versions {
        let name = version["name"].as_str().unwrap_or("?");
        let spec = &version["schema"]["openAPIV3Schema"]["properties"]["spec"];
        anyhow::ensure!(spec.is_object(), "version {name} has no spec schema");
        unbounded(spec, &format!("{name}: spec"), &mut out);
    }
    Ok(out)
}

#[test]
fn every_spec_string_list_and_map_is_bounded() -> Result<()> {
    let mut problems = Vec::new();
    for operator in OPERATORS {
        let path = repo_root().join("deploy").join(operator).join("crd.yaml");
        let text = std::fs::read_to_string(&path)
            .with_context(|| format!("reading {}", path.display()))?;
        let crd: Value =
            serde_saphyr::from_str(&text).with_context(|| format!("parsing {}", path.display()))?;
        problems.extend(
            unbounded_in_spec(&crd)?
                .into_iter()
                .map(|p| format!("{operator}: {p}")),
        );
    }
    assert!(
        problems.is_empty(),
        "unbounded in a spec (add maxLength, maxItems or maxProperties, then `cargo xtask crds`):\n{}",
        problems.join("\n")
    );
    Ok(())
}

#[test]
fn the_walk_finds_what_is_unbounded_at_any_depth() -> Result<()> {
    let crd = serde_json::json!({"spec": {"versions": [{"name": "v1", "schema": {"openAPIV3Schema": {
        "type": "object",
        "properties": {"spec": {"type": "object", "properties": {
            "bounded": {"type": "string", "maxLength": 10},
            "choice": {"type": "string", "enum": ["a", "b"]},
            "when": {"type": "string", "format": "date-time"},
            "name": {"type": "string"},
            "list": {"type": "array", "maxItems": 3, "items": {"type": "string"}},
            "open": {"type": "array", "items": {"type": "integer"}},
            "labels": {"type": "object", "additionalProperties": {"type": "string", "maxLength": 5}},
            "nested": {"type": "object", "properties": {
                "deep": {"type": "object", "maxProperties": 2,
                         "additionalProperties": {"type": "array", "maxItems": 1,
                                                  "items": {"type": "string"}}}
            }},
            "anything": {"type": "object", "x-kubernetes-preserve-unknown-fields": true},
            "port": {"x-kubernetes-int-or-string": true, "anyOf": [{"type": "integer"}, {"type": "string"}]},
            "untyped": {}
        }}}
    }}}]}});
    let mut found = unbounded_in_spec(&crd)?;
    found.sort();
    assert_eq!(
        found,
        [
            "v1: spec.anything: x-kubernetes-preserve-unknown-fields (no bound)",
            "v1: spec.labels: map without maxProperties",
            "v1: spec.list[]: string without maxLength",
            "v1: spec.name: string without maxLength",
            "v1: spec.nested.deep{}[]: string without maxLength",
            "v1: spec.open: array without maxItems",
            "v1: spec.port(anyOf[1]): string without maxLength",
            "v1: spec.port: string without maxLength",
            "v1: spec.untyped: no type",
        ]
    );
    Ok(())
}
