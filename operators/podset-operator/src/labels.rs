//! Our labels on our pods: put back on a pod of ours that lost them (it left the
//! label-selected watch: [`Strays`]) or whose labels someone edited. Ownership is decided
//! by the controller owner reference's UID; the labels keep the pod in the operator's
//! watch, the scale selector and `kubectl get -l app=...` truthful.
//!
//! [`Strays`]: crate::strays::Strays

use k8s_openapi::api::core::v1::Pod;
use kube::{
    Api,
    api::{Patch, PatchParams},
};
use shared::apply::is_controlled_by;

use crate::{
    api::PodSet,
    desired,
    pods::{OurLabels, OurPod},
    reconcile::{Context, Error},
};

/// Reads each stray pod of the PodSet `uid` (it left the watch, see
/// [`Strays`](crate::strays::Strays)) and, when it is still ours and alive, re-applies our
/// labels, which brings it back into the watch. Returns those pods, to count them before
/// the watch shows them again.
pub(crate) async fn relabel_strays(
    ps: &PodSet,
    uid: &str,
    owned: &[OurPod],
    api: &Api<Pod>,
    ctx: &Context,
) -> Result<Vec<OurPod>, Error> {
    let mut returned = Vec::new();
    for name in ctx.strays.of(uid) {
        if owned.iter().any(|p| p.name == name) {
            ctx.strays.handled(uid, &name);
            continue;
        }
        if let Some(pod) = api.get_opt(&name).await?
            && is_controlled_by(&pod, uid)
            && pod.metadata.deletion_timestamp.is_none()
        {
            tracing::info!(pod = %name, "relabelling a pod of ours that lost its labels");
            if let Some(pod) = apply_labels(ps, &name, api, ctx.toolkit.operator.name).await? {
                returned.push(OurPod::from_pod(pod));
            }
        }
        ctx.strays.handled(uid, &name);
    }
    Ok(returned)
}

/// Server-side applies our labels (only `metadata.labels`) on pod `name`; `None` when the
/// pod is gone.
async fn apply_labels(
    ps: &PodSet,
    name: &str,
    api: &Api<Pod>,
    manager: &str,
) -> Result<Option<Pod>, Error> {
    let patch = serde_json::json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": { "name": name, "labels": desired::pod_labels(ps) },
    });
    match api
        .patch(
            name,
            &PatchParams::apply(manager).force(),
            &Patch::Apply(&patch),
        )
        .await
    {
        Ok(pod) => Ok(Some(pod)),
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(None),
        Err(e) => Err(e.into()),
    }
}

/// Re-applies our labels (server-side apply of `metadata.labels` only) on active pods
/// whose labels drifted.
pub(crate) async fn repair_labels(
    ps: &PodSet,
    active: &[&OurPod],
    api: &Api<Pod>,
    manager: &str,
) -> Result<(), Error> {
    let ours = OurLabels::of(ps);
    for pod in active {
        if pod.facts.has(ours) {
            continue;
        }
        tracing::info!(pod = %pod.name, "restoring edited pod labels");
        apply_labels(ps, &pod.name, api, manager).await?;
    }
    Ok(())
}
