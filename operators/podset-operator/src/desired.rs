//! Pure builders: the pod a PodSet wants, and which pods to create or delete. No client
//! here; unit-tested below. The status is described in [`crate::status`].

use std::collections::BTreeMap;

use crate::{
    OPERATOR,
    api::{DEFAULT_IMAGE, PodSet},
    pods::{OurPod, Phase},
};
use k8s_openapi::{
    api::core::v1::{Container, Pod, PodSpec},
    apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference},
};
use kube::ResourceExt;
use shared::pod_security::{
    restricted_container_security_context, restricted_pod_security_context,
};

/// Label carrying the PodSet's name (as in the original operator).
pub const APP_LABEL: &str = "app";
/// Label carrying the pod template version (as in the original operator).
pub const VERSION_LABEL: &str = "version";
/// Value of [`VERSION_LABEL`].
pub const VERSION: &str = "v0.1";
/// The non-root user the pods run as (`nobody`).
pub const POD_USER: i64 = 65534;

/// Labels of every pod of `ps`: `app`, `version` and the `app.kubernetes.io/*` set.
#[must_use]
pub fn pod_labels(ps: &PodSet) -> BTreeMap<String, String> {
    pod_labels_named(&ps.name_any())
}

/// [`pod_labels`] of the PodSet named `name`.
#[must_use]
pub fn pod_labels_named(name: &str) -> BTreeMap<String, String> {
    let mut labels = shared::apply::standard_labels("podset", name, OPERATOR.name);
    labels.insert(APP_LABEL.to_owned(), name.to_owned());
    labels.insert(VERSION_LABEL.to_owned(), VERSION.to_owned());
    labels
}

/// The label selector of the pods of `ps` (for `status.selector` and the scale subresource).
#[must_use]
pub fn selector(ps: &PodSet) -> String {
    format!(
        "{APP_LABEL}={},app.kubernetes.io/instance={},app.kubernetes.io/managed-by={}",
        ps.name_any(),
        ps.name_any(),
        OPERATOR.name
    )
}

/// One pod of `ps`: named `<podset>-pod-<random>`, controlled by `ps`, running `sleep 3600`
/// under the `restricted` Pod Security Standard with a read-only root filesystem.
#[must_use]
pub fn desired_pod(ps: &PodSet, owner: OwnerReference, default_image: &str) -> Pod {
    let image = ps
        .spec
        .image
        .clone()
        .filter(|i| !i.is_empty())
        .unwrap_or_else(|| {
            if default_image.is_empty() {
                DEFAULT_IMAGE.to_owned()
            } else {
                default_image.to_owned()
            }
        });
    Pod {
        metadata: ObjectMeta {
            generate_name: Some(format!("{}-pod-", ps.name_any())),
            namespace: ps.namespace(),
            labels: Some(pod_labels(ps)),
            owner_references: Some(vec![owner]),
            ..ObjectMeta::default()
        },
        spec: Some(PodSpec {
            automount_service_account_token: Some(false),
            security_context: Some(restricted_pod_security_context(POD_USER)),
            containers: vec![Container {
                name: "busybox".to_owned(),
                image: Some(image),
                command: Some(vec!["sleep".to_owned(), "3600".to_owned()]),
                security_context: Some(restricted_container_security_context()),
                ..Container::default()
            }],
            ..PodSpec::default()
        }),
        status: None,
    }
}

/// Whether a pod counts as one of the replicas: not terminating, phase Pending or Running.
#[must_use]
pub fn is_active(pod: &OurPod) -> bool {
    !pod.facts.terminating && matches!(pod.facts.phase, Phase::Pending | Phase::Running)
}

fn is_pending(pod: &OurPod) -> bool {
    pod.facts.phase == Phase::Pending
}

/// What to do to reach `spec.replicas`.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Plan {
    /// Pods to create.
    pub create: usize,
    /// Names of the pods to delete, in order.
    pub delete: Vec<String>,
}

/// Decides creates/deletes from the active pods `ps` controls. Scale-down deletes Pending
/// pods before Running ones, then the newest first (the oldest have proven themselves).
#[must_use]
pub fn plan(ps: &PodSet, active: &[&OurPod]) -> Plan {
    let want = usize::try_from(ps.spec.replicas.max(0)).unwrap_or(0);
    let have = active.len();
    if have < want {
        return Plan {
            create: want - have,
            delete: Vec::new(),
        };
    }
    let mut victims: Vec<&OurPod> = active.to_vec();
    victims.sort_by(|a, b| {
        is_pending(b)
            .cmp(&is_pending(a))
            .then_with(|| b.facts.created.cmp(&a.facts.created))
            .then_with(|| b.name.cmp(&a.name))
    });
    Plan {
        create: 0,
        delete: victims
            .into_iter()
            .take(have - want)
            .map(|p| p.name.clone())
            .collect(),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::fixtures::{pod_created as pod, podset};
    use shared_testing::assert_restricted_pod;

    #[test]
    fn pod_is_restricted_and_owned() {
        let ps = podset(1);
        let owner = shared::apply::owner_reference(&ps).unwrap();
        let p = desired_pod(&ps, owner, "mirror.local/busybox:1");
        assert_eq!(p.metadata.generate_name.as_deref(), Some("demo-pod-"));
        let labels = p.metadata.labels.clone().unwrap();
        assert_eq!(labels["app"], "demo");
        assert_eq!(labels["version"], "v0.1");
        assert_eq!(labels["app.kubernetes.io/managed-by"], "podset-operator");
        let orefs = p.metadata.owner_references.clone().unwrap();
        assert_eq!(orefs[0].uid, "uid-1");
        assert_eq!(orefs[0].controller, Some(true));
        let spec = p.spec.unwrap();
        assert_restricted_pod(&spec);
        let c = &spec.containers[0];
        assert_eq!(c.image.as_deref(), Some("mirror.local/busybox:1"));
        assert_eq!(c.command.clone().unwrap(), ["sleep", "3600"]);
        let sc = c.security_context.clone().unwrap();
        assert_eq!(sc.allow_privilege_escalation, Some(false));
        assert_eq!(sc.read_only_root_filesystem, Some(true));
        assert_eq!(sc.capabilities.unwrap().drop.unwrap(), ["ALL"]);
    }

    #[test]
    fn image_precedence() {
        let mut ps = podset(1);
        let owner = shared::apply::owner_reference(&ps).unwrap();
        assert_eq!(
            desired_pod(&ps, owner.clone(), "").spec.unwrap().containers[0]
                .image
                .as_deref(),
            Some("busybox")
        );
        ps.spec.image = Some("custom:2".into());
        assert_eq!(
            desired_pod(&ps, owner, "other").spec.unwrap().containers[0]
                .image
                .as_deref(),
            Some("custom:2")
        );
    }

    #[test]
    fn plan_scales_up_and_down() {
        let a = pod("a", "Running", true, 1);
        let b = pod("b", "Running", true, 3);
        let c = pod("c", "Pending", false, 2);
        assert_eq!(
            plan(&podset(5), &[&a, &b]),
            Plan {
                create: 3,
                delete: vec![]
            }
        );
        assert_eq!(plan(&podset(2), &[&a, &b]), Plan::default());
        // Pending first, then newest first.
        assert_eq!(plan(&podset(1), &[&a, &b, &c]).delete, ["c", "b"]);
        assert_eq!(plan(&podset(0), &[&a, &b, &c]).delete, ["c", "b", "a"]);
    }

    #[test]
    fn active_pods() {
        let mut gone = pod("x", "Running", true, 1);
        gone.facts.terminating = true;
        assert!(!is_active(&gone));
        assert!(!is_active(&pod("y", "Succeeded", false, 1)));
        assert!(!is_active(&pod("y", "Failed", false, 1)));
        assert!(is_active(&pod("z", "Pending", false, 1)));
    }
}
