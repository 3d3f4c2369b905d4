//! Writing children and status: server-side apply under one field manager per operator,
//! skipped when the cached object already holds every field we manage (level-based: an
//! object in sync costs no write), and status patches only when the status changed.
//!
//! An operator writes its children through the `children` kit, which calls the apply of
//! this module; what it uses here is the labels and the owner reference of a child.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::{
    Api, Resource, ResourceExt,
    api::{Patch, PatchParams},
};
use serde::{Serialize, de::DeserializeOwned};
use serde_json::Value;

use crate::error::Error;

/// The `app.kubernetes.io/*` labels every child carries.
#[must_use]
pub fn standard_labels(app: &str, instance: &str, operator: &str) -> BTreeMap<String, String> {
    BTreeMap::from([
        ("app.kubernetes.io/name".to_owned(), app.to_owned()),
        ("app.kubernetes.io/instance".to_owned(), instance.to_owned()),
        (
            "app.kubernetes.io/managed-by".to_owned(),
            operator.to_owned(),
        ),
        ("app.kubernetes.io/part-of".to_owned(), app.to_owned()),
    ])
}

/// The controller owner reference pointing at `owner` (deleting it garbage-collects the child).
///
/// # Errors
/// [`Error::MissingMetadata`] when `owner` has no name or uid (it was not read from the API).
pub fn owner_reference<K: Resource<DynamicType = ()>>(owner: &K) -> Result<OwnerReference, Error> {
    owner
        .controller_owner_ref(&())
        .ok_or_else(|| Error::MissingMetadata(owner.name_any()))
}

/// Whether `child` has a controller owner reference with `owner_uid`.
#[must_use]
pub fn is_controlled_by<C: Resource>(child: &C, owner_uid: &str) -> bool {
    child
        .meta()
        .owner_references
        .iter()
        .flatten()
        .any(|r| r.controller == Some(true) && r.uid == owner_uid)
}

/// Whether every field set in `desired` has the same value in `actual`.
///
/// Objects: each key of `desired` must be in `actual` with a matching value (extra keys in
/// `actual` are fine: defaults and other managers' fields). Arrays: same length, matching
/// element by element. `null` in `desired` matches a missing key. Scalars: equal.
#[must_use]
pub(crate) fn is_subset(desired: &Value, actual: &Value) -> bool {
    match (desired, actual) {
        (Value::Object(d), Value::Object(a)) => d.iter().all(|(k, dv)| match a.get(k) {
            Some(av) => is_subset(dv, av),
            None => dv.is_null() || dv.as_object().is_some_and(serde_json::Map::is_empty),
        }),
        (Value::Array(d), Value::Array(a)) => {
            d.len() == a.len() && d.iter().zip(a).all(|(dv, av)| is_subset(dv, av))
        }
        (Value::Null, Value::Null) => true,
        (Value::Number(d), Value::Number(a)) => d.as_f64() == a.as_f64(),
        (d, a) => d == a,
    }
}

/// The `resourceVersion` of an apply that may only create ([`apply`] without a cached
/// object): the largest a resource version can be (etcd's revisions are positive 64-bit
/// integers, counted up from 1), so no stored object ever has it. On an object already
/// there it is a failed precondition (409 Conflict, even with `force`); for a name that
/// is free the API server creates the object and sets its own version.
pub(crate) const CREATE_ONLY: &str = "9223372036854775807";

/// Server-side applies `desired` under `field_manager` (forcing ownership of our fields),
/// unless `cached` already holds every field of `desired`. Returns the applied object, or
/// `None` when no write was needed.
///
/// When `cached` is given, the apply carries its UID as a precondition: the API server
/// refuses it (409, or 422 "field is immutable") if the object of that name is no longer
/// the one the caller decided to write to, so an object someone else created under the
/// name after ours was deleted is never taken over. A create (`cached` is `None`) cannot
/// carry a UID (the API server refuses an apply naming one for an object that does not
/// exist yet); it carries [`CREATE_ONLY`] as its `resourceVersion` instead, which the API
/// server ignores when it creates the object and holds against any object already there:
/// an apply meant to create is refused (409 Conflict) wherever the name is taken, by
/// whoever, so the caller need not read the name first.
///
/// # Errors
/// [`Error::Kube`] when the patch fails; [`Error::Serialize`]/[`Error::MissingMetadata`] for
/// a malformed `desired`.
pub(crate) async fn apply<K>(
    api: &Api<K>,
    field_manager: &str,
    desired: &K,
    cached: Option<&K>,
) -> Result<Option<K>, Error>
where
    K: Resource + Serialize + DeserializeOwned + Clone + std::fmt::Debug,
{
    write(api, field_manager, desired, cached, false).await
}

/// Like [`apply`], for a kind with a `scale` subresource over `spec.replicas` (a
/// Deployment, a StatefulSet): when all that `cached` lacks of `desired` is its replica
/// count (a `kubectl scale`, an autoscaler), the count alone is applied to that
/// subresource, under the same field manager (forced) and with the same UID
/// precondition. The API server answers that in about half the time of an apply of the
/// whole object (best 3.9 against 6.0 ms for a memcached Deployment on the local
/// cluster). The field manager needs `patch` on `<resource>/scale`.
///
/// After a scale it returns `cached` as it was: the subresource answers with a `Scale`,
/// not the object.
///
/// # Errors
/// As [`apply`].
pub(crate) async fn apply_scalable<K>(
    api: &Api<K>,
    field_manager: &str,
    desired: &K,
    cached: Option<&K>,
) -> Result<Option<K>, Error>
where
    K: Resource + Serialize + DeserializeOwned + Clone + std::fmt::Debug,
{
    write(api, field_manager, desired, cached, true).await
}

/// [`apply`], and with `scalable` [`apply_scalable`].
async fn write<K>(
    api: &Api<K>,
    field_manager: &str,
    desired: &K,
    cached: Option<&K>,
    scalable: bool,
) -> Result<Option<K>, Error>
where
    K: Resource + Serialize + DeserializeOwned + Clone + std::fmt::Debug,
{
    let name = desired
        .meta()
        .name
        .clone()
        .ok_or_else(|| Error::MissingMetadata("desired child".into()))?;
    let mut body = to_value(desired, &name)?;
    if let Some(cached) = cached {
        let actual = to_value(cached, &name)?;
        if is_subset(&body, &actual) {
            tracing::trace!(child = %name, "child in sync; no write");
            return Ok(None);
        }
        if scalable && let Some(replicas) = replicas_alone(&body, &actual) {
            apply_scale(api, field_manager, cached, replicas).await?;
            return Ok(Some(cached.clone()));
        }
        if let Some(uid) = cached.meta().uid.clone()
            && let Some(meta) = body.get_mut("metadata").and_then(Value::as_object_mut)
        {
            meta.insert("uid".to_owned(), Value::String(uid));
        }
    } else if let Some(meta) = body.get_mut("metadata").and_then(Value::as_object_mut) {
        meta.insert(
            "resourceVersion".to_owned(),
            Value::String(CREATE_ONLY.to_owned()),
        );
    }
    tracing::debug!(child = %name, "applying child");
    let applied = api
        .patch(
            &name,
            &PatchParams::apply(field_manager).force(),
            &Patch::Apply(&body),
        )
        .await?;
    Ok(Some(applied))
}

/// The `spec.replicas` of `desired` when it is all that `actual` lacks of it: the replica
/// counts differ, and every other field of `desired` is held.
fn replicas_alone(desired: &Value, actual: &Value) -> Option<i64> {
    let want = desired.pointer("/spec/replicas")?.as_i64()?;
    let have = actual.pointer("/spec/replicas")?;
    if have.as_i64() == Some(want) {
        return None;
    }
    let mut rest = desired.clone();
    *rest.pointer_mut("/spec/replicas")? = have.clone();
    is_subset(&rest, actual).then_some(want)
}

/// Server-side applies `replicas` to the `scale` subresource of `cached` under
/// `field_manager` (forced), with its UID as a precondition.
async fn apply_scale<K>(
    api: &Api<K>,
    field_manager: &str,
    cached: &K,
    replicas: i64,
) -> Result<(), Error>
where
    K: Resource + Clone + DeserializeOwned,
{
    let name = cached.name_any();
    let mut metadata = serde_json::json!({ "name": name });
    if let Some(uid) = cached.meta().uid.as_deref() {
        metadata["uid"] = uid.into();
    }
    let body = serde_json::json!({
        "apiVersion": "autoscaling/v1",
        "kind": "Scale",
        "metadata": metadata,
        "spec": { "replicas": replicas },
    });
    tracing::debug!(child = %name, replicas, "applying the child's scale");
    api.patch_scale(
        &name,
        &PatchParams::apply(field_manager).force(),
        &Patch::Apply(&body),
    )
    .await?;
    Ok(())
}

/// Patches the status subresource of `obj` with `new_status`, only if it differs from
/// `current_status`. Returns the object as the write left it, `None` when nothing was
/// sent.
///
/// The patch is a JSON merge patch that replaces the status: every field of
/// `current_status` that `new_status` no longer has is sent as `null`, so a field that
/// stops applying (`backlog` once autoscaling is switched off, say) is removed from the
/// stored status instead of staying there forever ([`replacing_merge_patch`]).
///
/// # Errors
/// [`Error::Kube`] when the patch fails.
pub(crate) async fn patch_status<K, S>(
    api: &Api<K>,
    obj: &K,
    current_status: Option<&S>,
    new_status: &S,
) -> Result<Option<K>, Error>
where
    K: Resource + DeserializeOwned + Clone + std::fmt::Debug,
    S: Serialize + PartialEq,
{
    if current_status == Some(new_status) {
        return Ok(None);
    }
    let name = obj.name_any();
    let new = to_value(new_status, &name)?;
    let status = match current_status {
        Some(current) => replacing_merge_patch(&to_value(current, &name)?, new),
        None => new,
    };
    let body = serde_json::json!({ "status": status });
    let written = api
        .patch_status(&name, &PatchParams::default(), &Patch::Merge(&body))
        .await?;
    Ok(Some(written))
}

/// The JSON merge patch (RFC 7386) that turns `current` into `new`: `new` itself, plus a
/// `null` for every object key of `current` that `new` lacks (recursively, where both
/// sides hold an object under the same key). Arrays and scalars are replaced whole, as a
/// merge patch always replaces them. A `null` in `new` stays `null`: removed either way.
#[must_use]
pub(crate) fn replacing_merge_patch(current: &Value, new: Value) -> Value {
    match (current, new) {
        (Value::Object(current), Value::Object(mut new)) => {
            for (key, value) in current {
                match new.remove(key) {
                    Some(next) => {
                        new.insert(key.clone(), replacing_merge_patch(value, next));
                    }
                    None => {
                        new.insert(key.clone(), Value::Null);
                    }
                }
            }
            Value::Object(new)
        }
        (_, new) => new,
    }
}

/// Whether `error` is the API server refusing a write because the namespace is being
/// deleted (`403 Forbidden`, "... because it is being terminated"): nothing more is to be
/// done there, and it is no failure.
#[must_use]
pub fn namespace_terminating(error: &kube::Error) -> bool {
    matches!(error, kube::Error::Api(s) if s.code == 403 && s.message.contains("being terminated"))
}

fn to_value<T: Serialize>(v: &T, what: &str) -> Result<Value, Error> {
    serde_json::to_value(v).map_err(|source| Error::Serialize {
        what: what.to_owned(),
        source,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn subset_comparison() {
        let actual = json!({
            "apiVersion": "v1", "kind": "Service",
            "metadata": {"name": "a", "labels": {"x": "1", "y": "2"}, "resourceVersion": "7"},
            "spec": {"ports": [{"port": 80, "protocol": "TCP"}], "clusterIP": "10.0.0.1"}
        });
        assert!(is_subset(
            &json!({"metadata": {"labels": {"x": "1"}}}),
            &actual
        ));
        assert!(is_subset(
            &json!({"spec": {"ports": [{"port": 80}]}}),
            &actual
        ));
        assert!(is_subset(
            &json!({"spec": {"ports": [{"port": 80.0}]}}),
            &actual
        ));
        assert!(is_subset(
            &json!({"spec": {"missing": null, "empty": {}}}),
            &actual
        ));
        assert!(!is_subset(
            &json!({"metadata": {"labels": {"x": "2"}}}),
            &actual
        ));
        assert!(!is_subset(
            &json!({"metadata": {"labels": {"z": "1"}}}),
            &actual
        ));
        assert!(!is_subset(
            &json!({"spec": {"ports": [{"port": 80}, {"port": 81}]}}),
            &actual
        ));
        assert!(!is_subset(&json!({"spec": {"ports": []}}), &actual));
        assert!(!is_subset(&json!({"spec": {"type": "NodePort"}}), &actual));
    }

    #[test]
    fn status_patch_removes_what_is_no_longer_set() {
        let current = json!({
            "replicas": 2, "backlog": 40, "lastScaleTime": "t",
            "nested": {"keep": 1, "gone": 2}, "conditions": [{"type": "Ready"}]
        });
        let new = json!({"replicas": 3, "nested": {"keep": 1}, "conditions": []});
        assert_eq!(
            replacing_merge_patch(&current, new),
            json!({
                "replicas": 3, "backlog": null, "lastScaleTime": null,
                "nested": {"keep": 1, "gone": null}, "conditions": []
            })
        );
        // A key that becomes an object, a scalar that becomes null, a new key.
        assert_eq!(
            replacing_merge_patch(
                &json!({"a": 1, "b": 2}),
                json!({"a": {"x": 1}, "b": null, "c": 3})
            ),
            json!({"a": {"x": 1}, "b": null, "c": 3})
        );
        // Nothing stored yet: the status itself.
        assert_eq!(
            replacing_merge_patch(&Value::Null, json!({"a": 1})),
            json!({"a": 1})
        );
    }

    #[test]
    fn terminating_namespaces() {
        let api = |code, message: &str| {
            kube::Error::Api(
                kube::core::Status::failure(message, "Forbidden")
                    .with_code(code)
                    .boxed(),
            )
        };
        assert!(namespace_terminating(&api(
            403,
            "pods \"a\" is forbidden: unable to create new content in namespace n because it is being terminated"
        )));
        assert!(!namespace_terminating(&api(
            403,
            "pods is forbidden: exceeded quota"
        )));
        assert!(!namespace_terminating(&api(409, "being terminated")));
    }

    #[test]
    fn a_change_of_replicas_alone_is_found() {
        use k8s_openapi::api::apps::v1::{Deployment, DeploymentSpec};
        let deployment = |replicas: i32, image: &str| {
            let mut d: Deployment = serde_json::from_value(json!({
                "metadata": {"name": "cache"},
                "spec": {
                    "selector": {"matchLabels": {"app": "cache"}},
                    "template": {"spec": {"containers": [{"name": "m", "image": image}]}}
                }
            }))
            .unwrap();
            d.spec.get_or_insert_with(DeploymentSpec::default).replicas = Some(replicas);
            serde_json::to_value(d).unwrap()
        };
        let cached = deployment(3, "memcached:1");
        // The count alone: the new count.
        assert_eq!(
            replicas_alone(&deployment(4, "memcached:1"), &cached),
            Some(4)
        );
        assert_eq!(
            replicas_alone(&deployment(0, "memcached:1"), &cached),
            Some(0)
        );
        // Nothing, or more than the count: a whole apply.
        assert_eq!(replicas_alone(&deployment(3, "memcached:1"), &cached), None);
        assert_eq!(replicas_alone(&deployment(4, "memcached:2"), &cached), None);
        assert_eq!(replicas_alone(&deployment(3, "memcached:2"), &cached), None);
        // No count on either side: a whole apply.
        let mut unset = cached.clone();
        unset["spec"].as_object_mut().unwrap().remove("replicas");
        assert_eq!(replicas_alone(&deployment(4, "memcached:1"), &unset), None);
        assert_eq!(replicas_alone(&unset, &cached), None);
    }

    #[test]
    fn labels() {
        let l = standard_labels("podset", "demo", "podset-operator");
        assert_eq!(l["app.kubernetes.io/instance"], "demo");
        assert_eq!(l["app.kubernetes.io/managed-by"], "podset-operator");
        assert_eq!(l.len(), 4);
    }
}
