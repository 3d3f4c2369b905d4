//! Security contexts that meet the `restricted` Pod Security Standard, for every pod an
//! operator creates: non-root, no privilege escalation, no capabilities, the runtime's
//! default seccomp profile, and a read-only root filesystem.

use k8s_openapi::api::core::v1::{
    Capabilities, PodSecurityContext, SeccompProfile, SecurityContext,
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
}
