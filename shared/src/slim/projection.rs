//! What a cache keeps of a child: the fields this operator's field manager owns, read off
//! the object's `managedFields`, and nothing a tenant added beside them.
//!
//! Server-side apply records, for each manager, the set of fields it owns (`fieldsV1`).
//! Another manager that changes one of ours takes it over (an update moves the field to
//! it; an apply must force it), so the projection of a child onto our set holds exactly
//! what we last applied and still own: comparing it with the desired object finds both a
//! missing field and one someone else changed, and a tenant's own additions (a 1 MB label,
//! an environment variable of its own) never reach the cache. What a cache keeps of one
//! child is then bounded by what the operator applies, which its primary's schema bounds,
//! whatever the object holds; `MAX_KEPT_SPEC` and `MAX_KEPT_STATUS` bound it again
//! whatever the object is.

use std::sync::OnceLock;

use serde_json::{Map, Value};

/// At most this many bytes of a child's `spec` (as JSON text) are kept; a larger projection
/// is dropped, and the reconcile then sees the child as out of sync and applies it.
pub(crate) const MAX_KEPT_SPEC: usize = 64 * 1024;

/// At most this many bytes of a child's `status` (as JSON text) are kept; a larger one is
/// dropped (a status the operator reads is a few hundred bytes).
pub(crate) const MAX_KEPT_STATUS: usize = 16 * 1024;

/// At most this many bytes of a child's labels, and as many of its annotations, are kept
/// when the object carries no `managedFields` (objects an API server sends always do).
pub(crate) const MAX_KEPT_PAIRS: usize = 16 * 1024;

/// At most this many finalizers of any cached object are kept (the first ones).
pub const MAX_KEPT_FINALIZERS: usize = 16;

static FIELD_MANAGER: OnceLock<Box<str>> = OnceLock::new();

/// Sets the field manager whose fields the caches keep of every child: the operator's own
/// (its name), once, at start. The runner does; set it yourself only where no runner runs
/// (a test, a tool). Before it is set, no field of a child with `managedFields` is kept.
pub fn set_field_manager(manager: &str) {
    // Set once per process; a second call (tests, a second operator in one process) with
    // another name is ignored, and the first one stays.
    let _ = FIELD_MANAGER.set(manager.into());
}

/// The field manager set by [`set_field_manager`].
pub(crate) fn field_manager() -> Option<&'static str> {
    FIELD_MANAGER.get().map(|m| &**m)
}

/// The union of the `fieldsV1` sets of every `managedFields` entry of `manager` (its apply,
/// its apply of the `scale` subresource, any update of its own), or `None` when it has none.
pub(crate) fn owned_fields(managed_fields: &Value, manager: &str) -> Option<Value> {
    let mut owned: Option<Value> = None;
    for entry in managed_fields.as_array()?.iter() {
        if entry.get("manager").and_then(Value::as_str) != Some(manager) {
            continue;
        }
        let Some(fields) = entry.get("fieldsV1") else {
            continue;
        };
        match &mut owned {
            Some(all) => union(all, fields),
            None => owned = Some(fields.clone()),
        }
    }
    owned
}

/// Adds the field set `more` to `into`.
fn union(into: &mut Value, more: &Value) {
    let (Value::Object(into), Value::Object(more)) = (into, more) else {
        return;
    };
    for (key, sub) in more {
        match into.get_mut(key) {
            Some(have) => union(have, sub),
            None => {
                into.insert(key.clone(), sub.clone());
            }
        }
    }
}

/// `value` restricted to the field set `fields` (a `fieldsV1` tree): an empty set takes the
/// whole value (a leaf, or an atomic list or struct); `f:<name>` a field or map key;
/// `k:{...}` the list items whose fields match the key; `v:<json>` a set item equal to it;
/// `i:<n>` the item at that index. Items keep their order in `value`.
pub(crate) fn project(value: &Value, fields: &Value) -> Value {
    let Some(fields) = fields.as_object().filter(|f| !f.is_empty()) else {
        return value.clone();
    };
    match value {
        Value::Object(object) => {
            let mut out = Map::new();
            for (key, sub) in fields {
                if let Some(name) = key.strip_prefix("f:")
                    && let Some(v) = object.get(name)
                {
                    out.insert(name.to_owned(), project(v, sub));
                }
            }
            Value::Object(out)
        }
        Value::Array(items) => {
            let mut out = Vec::new();
            for (i, item) in items.iter().enumerate() {
                if let Some(sub) = fields
                    .iter()
                    .find_map(|(key, sub)| item_matches(key, i, item).then_some(sub))
                {
                    out.push(project(item, sub));
                }
            }
            Value::Array(out)
        }
        other => other.clone(),
    }
}

/// At most this many bytes (as JSON) of a scalar field of a child's `spec` that our field
/// manager does not own are kept beside the projection (top-level scalars only).
pub(crate) const MAX_KEPT_SCALAR: usize = 256;

/// Adds to `kept` (a projection of `spec`) the top-level scalar fields of `spec` it lacks,
/// each of at most [`MAX_KEPT_SCALAR`] bytes: fields the API server sets and a reconcile
/// reads (a Service's `clusterIP`, a Deployment's `replicas` after someone scaled it). A
/// value kept this way can only make a comparison find a difference, never hide one.
pub(crate) fn keep_small_scalars(spec: &Value, kept: &mut Value) {
    let (Value::Object(spec), Value::Object(kept)) = (spec, kept) else {
        return;
    };
    for (name, value) in spec {
        let small = match value {
            Value::String(s) => s.len() <= MAX_KEPT_SCALAR,
            Value::Number(_) | Value::Bool(_) => true,
            _ => false,
        };
        if small && !kept.contains_key(name) {
            kept.insert(name.clone(), value.clone());
        }
    }
}

/// Whether the list item `item` at `index` is the one the `fieldsV1` key `key` names.
fn item_matches(key: &str, index: usize, item: &Value) -> bool {
    if let Some(k) = key.strip_prefix("k:") {
        let Ok(Value::Object(want)) = serde_json::from_str::<Value>(k) else {
            return false;
        };
        want.iter()
            .all(|(f, v)| item.get(f).is_some_and(|have| same(have, v)))
    } else if let Some(v) = key.strip_prefix("v:") {
        serde_json::from_str::<Value>(v).is_ok_and(|want| same(item, &want))
    } else if let Some(i) = key.strip_prefix("i:") {
        i.parse::<usize>() == Ok(index)
    } else {
        false
    }
}

/// JSON equality with numbers compared by value (`80` and `80.0` alike).
fn same(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::Number(a), Value::Number(b)) => a.as_f64() == b.as_f64(),
        _ => a == b,
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use serde_json::json;

    #[test]
    fn projects_fields_keyed_items_sets_and_atomic_leaves() {
        let object = json!({
            "labels": {"ours": "a", "theirs": "x".repeat(100)},
            "containers": [
                {"name": "c", "image": "i", "args": ["-p", "1"], "env": [{"name": "BIG", "value": "y"}]},
                {"name": "sidecar", "image": "s"}
            ],
            "finalizers": ["a", "b"],
            "items": [10, 20]
        });
        let fields = json!({
            "f:labels": {"f:ours": {}},
            "f:containers": {"k:{\"name\":\"c\"}": {".": {}, "f:name": {}, "f:image": {}, "f:args": {}}},
            "f:finalizers": {"v:\"b\"": {}},
            "f:items": {"i:1": {}}
        });
        assert_eq!(
            project(&object, &fields),
            json!({
                "labels": {"ours": "a"},
                "containers": [{"name": "c", "image": "i", "args": ["-p", "1"]}],
                "finalizers": ["b"],
                "items": [20]
            })
        );
    }

    #[test]
    fn a_key_with_numbers_matches_its_item() {
        let ports = json!([{"containerPort": 11211, "protocol": "TCP", "name": "m"}]);
        let fields = json!({"k:{\"containerPort\":11211,\"protocol\":\"TCP\"}": {"f:name": {}}});
        assert_eq!(project(&ports, &fields), json!([{"name": "m"}]));
        let other = json!({"k:{\"containerPort\":80,\"protocol\":\"TCP\"}": {"f:name": {}}});
        assert_eq!(project(&ports, &other), json!([]));
    }

    #[test]
    fn small_top_level_scalars_are_kept_beside_the_projection() {
        let spec = json!({"clusterIP": "10.96.0.12", "type": "ClusterIP", "replicas": 7,
            "big": "x".repeat(MAX_KEPT_SCALAR + 1), "ports": [{"port": 1}], "selector": {"a": "b"}});
        let mut kept = json!({"replicas": 3});
        keep_small_scalars(&spec, &mut kept);
        assert_eq!(
            kept,
            json!({"clusterIP": "10.96.0.12", "type": "ClusterIP", "replicas": 3})
        );
    }

    #[test]
    fn owned_fields_are_the_union_of_the_managers_entries() {
        let managed = json!([
            {"manager": "op", "operation": "Apply", "fieldsType": "FieldsV1",
             "fieldsV1": {"f:spec": {"f:template": {}}}},
            {"manager": "op", "operation": "Apply", "subresource": "scale", "fieldsType": "FieldsV1",
             "fieldsV1": {"f:spec": {"f:replicas": {}}}},
            {"manager": "kubectl-edit", "operation": "Update", "fieldsType": "FieldsV1",
             "fieldsV1": {"f:spec": {"f:paused": {}}}}
        ]);
        assert_eq!(
            owned_fields(&managed, "op").unwrap(),
            json!({"f:spec": {"f:template": {}, "f:replicas": {}}})
        );
        assert!(owned_fields(&managed, "nobody").is_none());
    }
}
