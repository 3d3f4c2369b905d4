//! The finalizer `cache.example.com/finalizer` (as in the Go original): added by the
//! reconcile that first sees a Memcached ([`add_finalizer`]), and on deletion its clean-up
//! step ([`cleanup`]) marks the Memcached `Degraded` (`Finalizing`) with one Normal event.
//! The children need no work: garbage collection removes them through their owner
//! references once the finalizer is gone. Finalizers of Memcacheds the operator can no
//! longer reconcile are released by [`crate::release`].

use std::sync::Arc;

use kube::{
    Api, ResourceExt,
    api::{Patch, PatchParams},
    runtime::controller::Action,
};

use crate::{
    FINALIZER,
    api::Memcached,
    error::Error,
    reconcile::{Context, update_status},
    status::{self, Problem},
};

/// Adds the finalizer to `mc` when it lacks it and is not being deleted; returns the
/// Memcached as it now is.
///
/// # Errors
/// [`Error::Kube`] when the patch fails (`409`/`422`: the Memcached changed meanwhile).
///
/// kube's `finalizer` would add it and return, leaving the children to the reconcile the
/// finalizer's own watch event triggers, and the debounce defers that one: a new Memcached
/// waited 500 ms for its Deployment. Added here, the same reconcile goes on to the
/// children. The patch appends to the list (the cache keeps only its first entries, so it
/// never writes the list whole) and carries the `resourceVersion` it was computed from, so
/// it applies only if nobody changed the object meanwhile (else 409 or 422, retried with
/// backoff).
pub async fn add_finalizer(
    api: &Api<Memcached>,
    mc: Arc<Memcached>,
) -> Result<Arc<Memcached>, Error> {
    if mc.metadata.deletion_timestamp.is_some() || mc.finalizers().iter().any(|f| f == FINALIZER) {
        return Ok(mc);
    }
    let patch = finalizer_patch(mc.resource_version(), mc.finalizers().is_empty());
    let patched = api
        .patch(
            &mc.name_any(),
            &PatchParams::default(),
            &Patch::<()>::Json(patch),
        )
        .await?;
    Ok(Arc::new(patched))
}

/// The JSON patch that adds [`FINALIZER`] to a Memcached at `version`: the list created
/// when it has `none`, else the finalizer appended to it.
fn finalizer_patch(version: Option<String>, none: bool) -> json_patch::Patch {
    let mut ops = Vec::new();
    if let Some(version) = version {
        ops.push(serde_json::json!({"op": "test", "path": "/metadata/resourceVersion", "value": version}));
    }
    ops.push(if none {
        serde_json::json!({"op": "add", "path": "/metadata/finalizers", "value": [FINALIZER]})
    } else {
        serde_json::json!({"op": "add", "path": "/metadata/finalizers/-", "value": FINALIZER})
    });
    // Each operation above is a valid JSON patch operation.
    serde_json::from_value(serde_json::Value::Array(ops)).unwrap_or_default()
}

/// The clean-up step of the finalizer: marks the Memcached `Degraded` (reason
/// `Finalizing`), which emits one Normal event. The Deployment and Service need no work:
/// garbage collection removes them through their owner references once the finalizer is gone.
///
/// # Errors
/// [`Error`] when the read or the status write fails; the runner retries with backoff.
pub async fn cleanup(mc: &Memcached, ctx: &Context) -> Result<Action, Error> {
    let Some(ns) = mc.namespace() else {
        return Ok(Action::await_change());
    };
    let name = mc.name_any();
    // The cache may still show a Memcached whose finalizer an earlier reconcile removed:
    // read it afresh so the event is not emitted twice.
    let api: Api<Memcached> = Api::namespaced(ctx.toolkit.client.clone(), &ns);
    let Some(fresh) = api.get_opt(&name).await? else {
        return Ok(Action::await_change());
    };
    if !fresh.finalizers().iter().any(|f| f == FINALIZER) {
        return Ok(Action::await_change());
    }
    let mc = &fresh;
    let deployment = ctx
        .deployments
        .find(&ns, &name)
        .map(|d| d.full())
        .transpose()?;
    let service = status::service_state(mc, ctx.services.find(&ns, &name).as_deref());
    update_status(
        mc,
        ctx,
        deployment.as_ref(),
        service,
        Some(&Problem::Finalizing),
        &ns,
        &status::ANNOUNCED_FINALIZING,
    )
    .await?;
    tracing::info!(
        "finalizing: the Deployment and Service are removed by garbage collection; removing the finalizer"
    );
    Ok(Action::await_change())
}

#[cfg(test)]
mod tests {
    //! The finalizer added and run, through the reconcile, against a scripted API server.
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::fixtures::{
        APPLY_DEPLOYMENT, APPLY_SERVICE, EVENT, MEMCACHED, children_created, memcached, run,
        with_finalizer,
    };
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
    use shared_testing::{Reply, assert_events};

    #[tokio::test]
    async fn a_new_memcached_gets_its_finalizer_and_its_children_in_one_reconcile() {
        let mut mc = memcached(1, None);
        mc.metadata.resource_version = Some("1".into());
        let stored = Reply::Object(serde_json::to_value(with_finalizer()).unwrap());
        let mut replies = vec![stored.clone()];
        replies.extend(children_created());
        replies.extend([stored, Reply::Echo]);
        let (result, api) = run(mc, replies).await;
        assert_eq!(result.unwrap(), Action::await_change());
        let status = format!("PATCH {MEMCACHED}/status");
        let finalizer = format!("PATCH {MEMCACHED}");
        assert_eq!(
            api.lines(),
            [&finalizer, APPLY_DEPLOYMENT, APPLY_SERVICE, &status, EVENT]
        );
        let seen = api.seen();
        assert_eq!(
            seen[0].body,
            serde_json::json!([
                {"op": "test", "path": "/metadata/resourceVersion", "value": "1"},
                {"op": "add", "path": "/metadata/finalizers", "value": [FINALIZER]}
            ]),
            "the list, only if nobody changed the object meanwhile"
        );
    }

    #[test]
    fn the_finalizer_is_appended_to_a_list_the_cache_may_hold_in_part() {
        assert_eq!(
            serde_json::to_value(finalizer_patch(Some("9".into()), false)).unwrap(),
            serde_json::json!([
                {"op": "test", "path": "/metadata/resourceVersion", "value": "9"},
                {"op": "add", "path": "/metadata/finalizers/-", "value": FINALIZER}
            ])
        );
    }

    #[tokio::test]
    async fn finalizing_is_one_normal_event_and_a_finalizer_already_gone_is_fine() {
        let mut mc = with_finalizer();
        mc.metadata.deletion_timestamp = Some(Time(jiff::Timestamp::UNIX_EPOCH));
        let replies = vec![
            Reply::Object(serde_json::to_value(&mc).unwrap()),
            Reply::Object(serde_json::to_value(&mc).unwrap()),
            Reply::Echo,
            // The finalizer was removed meanwhile (an earlier reconcile).
            Reply::error(404, "not found"),
        ];
        let (result, api) = run(mc, replies).await;
        assert_eq!(result.unwrap(), Action::await_change());
        let (get, status, remove) = (
            format!("GET {MEMCACHED}"),
            format!("PATCH {MEMCACHED}/status"),
            format!("PATCH {MEMCACHED}"),
        );
        assert_eq!(api.lines(), [get.as_str(), &status, EVENT, &remove]);
        assert_events(&api, &[("Normal", "Finalizing")]);
    }
}
