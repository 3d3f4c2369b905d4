//! Security contexts that meet the `restricted` Pod Security Standard, for every pod an
//! operator creates: non-root, no privilege escalation, no capabilities, the runtime's
//! default seccomp profile, and a read-only root filesystem.

use std::collections::BTreeMap;

use k8s_openapi::{
    api::{
        apps::v1::{Deployment, DeploymentSpec},
        core::v1::{
            Capabilities, Container, PodSecurityContext, PodSpec, PodTemplateSpec, SeccompProfile,
            SecurityContext,
        },
    },
    apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta},
};

/// The pod-level context: run as `user` (and group `user`), never as root, with the
/// runtime's default seccomp profile.
#[must_use]
pub fn restricted_pod_security_context(user: i64) -> PodSecurityContext {
    PodSecurityContext {
        run_as_non_root: Some(true),
        run_as_user: Some(user),
        run_as_group: Some(user),
        seccomp_profile: Some(SeccompProfile {
            type_: "RuntimeDefault".to_owned(),
            ..SeccompProfile::default()
        }),
        ..PodSecurityContext::default()
    }
}

/// The container-level context: no privilege escalation, all capabilities dropped, a
/// read-only root filesystem.
#[must_use]
pub fn restricted_container_security_context() -> SecurityContext {
    SecurityContext {
        allow_privilege_escalation: Some(false),
        read_only_root_filesystem: Some(true),
        run_as_non_root: Some(true),
        capabilities: Some(Capabilities {
            drop: Some(vec!["ALL".to_owned()]),
            ..Capabilities::default()
        }),
        ..SecurityContext::default()
    }
}

/// A Deployment of `replicas` pods that each run `container` as `user` under the
/// restricted standard, without a service-account token (the workloads never call the
/// API). Pods are selected by `selector` and labelled `pod_labels` (which should include
/// `selector`: the API server rejects a template its selector does not match).
#[must_use]
pub fn restricted_deployment(
    metadata: ObjectMeta,
    replicas: i32,
    selector: BTreeMap<String, String>,
    pod_labels: BTreeMap<String, String>,
    user: i64,
    container: Container,
) -> Deployment {
    Deployment {
        metadata,
        spec: Some(DeploymentSpec {
            replicas: Some(replicas),
            selector: LabelSelector {
                match_labels: Some(selector),
                ..LabelSelector::default()
            },
            template: PodTemplateSpec {
                metadata: Some(ObjectMeta {
                    labels: Some(pod_labels),
                    ..ObjectMeta::default()
                }),
                spec: Some(PodSpec {
                    automount_service_account_token: Some(false),
                    security_context: Some(restricted_pod_security_context(user)),
                    containers: vec![container],
                    ..PodSpec::default()
                }),
            },
            ..DeploymentSpec::default()
        }),
        status: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn contexts_are_restricted() {
        let pod = restricted_pod_security_context(1001);
        assert_eq!(pod.run_as_non_root, Some(true));
        assert_eq!(pod.run_as_user, Some(1001));
        assert_eq!(
            pod.seccomp_profile.map(|s| s.type_),
            Some("RuntimeDefault".to_owned())
        );
        let c = restricted_container_security_context();
        assert_eq!(c.allow_privilege_escalation, Some(false));
        assert_eq!(c.read_only_root_filesystem, Some(true));
        assert_eq!(
            c.capabilities.and_then(|c| c.drop),
            Some(vec!["ALL".to_owned()])
        );
    }

    #[test]
    fn deployment_runs_one_restricted_container_without_token() {
        let selector = BTreeMap::from([("app".to_owned(), "x".to_owned())]);
        let mut pod_labels = selector.clone();
        pod_labels.insert("extra".to_owned(), "y".to_owned());
        let container = Container {
            name: "c".to_owned(),
            ..Container::default()
        };
        let d = restricted_deployment(
            ObjectMeta::default(),
            2,
            selector.clone(),
            pod_labels.clone(),
            1001,
            container,
        );
        let spec = d.spec.unwrap_or_default();
        assert_eq!(spec.replicas, Some(2));
        assert_eq!(spec.selector.match_labels, Some(selector));
        assert_eq!(
            spec.template.metadata.and_then(|m| m.labels),
            Some(pod_labels)
        );
        let pod = spec.template.spec.unwrap_or_default();
        assert_eq!(pod.automount_service_account_token, Some(false));
        assert_eq!(pod.security_context.and_then(|c| c.run_as_user), Some(1001));
        assert_eq!(pod.containers.len(), 1);
    }
}
