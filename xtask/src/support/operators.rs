//! The operators of the workspace, in one place: each one's crate (also its binary, image
//! and `deploy/` folder), the short name the bench takes, the group, version, kind and
//! plural of the custom resource it serves, and the workload image it runs, if it is an
//! app of this workspace. `crds`, `deploy`, `run`, `demo`, `image`, `installers`,
//! `charts`, the bench and the end-to-end tests all read this list; a fifth operator is
//! one more entry, which `cargo xtask new` writes.

use kube::core::{ApiResource, GroupVersionKind};
use serde_json::{Value, json};

/// One operator and the kind it serves.
#[derive(Debug, PartialEq, Eq)]
pub struct Kind {
    /// The crate, binary, image and `deploy/` folder: `podset-operator`.
    pub operator: &'static str,
    /// The short name on the command line and in bench files: `podset`.
    pub short: &'static str,
    /// The API group.
    pub group: &'static str,
    /// The API version.
    pub version: &'static str,
    /// The kind.
    pub kind: &'static str,
    /// The plural: the resource name.
    pub plural: &'static str,
    /// The workload image it runs when that is an app of this workspace (built and
    /// pushed beside the operator's own image); `None` when it runs a public image or none.
    pub workload: Option<Workload>,
}

/// An app of this workspace that an operator runs in the pods it creates.
#[derive(Debug, PartialEq, Eq)]
pub struct Workload {
    /// The app's binary, package and image name: `lolcow-web`.
    pub app: &'static str,
    /// The operator's environment variable that names the image: `LOLCOW_IMAGE`.
    pub env: &'static str,
}

/// PodSet (`podset-operator`).
pub const PODSET: Kind = Kind {
    operator: "podset-operator",
    short: "podset",
    group: "batch.tutorial.kubebuilder.io",
    version: "v1",
    kind: "PodSet",
    plural: "podsets",
    workload: None,
};

/// Memcached (`memcached-operator`).
pub const MEMCACHED: Kind = Kind {
    operator: "memcached-operator",
    short: "memcached",
    group: "cache.example.com",
    version: "v1alpha1",
    kind: "Memcached",
    plural: "memcacheds",
    workload: None,
};

/// Lolcow (`lolcow-operator`).
pub const LOLCOW: Kind = Kind {
    operator: "lolcow-operator",
    short: "lolcow",
    group: "my.domain",
    version: "v1alpha1",
    kind: "Lolcow",
    plural: "lolcows",
    workload: Some(Workload {
        app: "lolcow-web",
        env: "LOLCOW_IMAGE",
    }),
};

/// PulsarConsumer (`pulsar-consumer-operator`).
pub const PULSAR_CONSUMER: Kind = Kind {
    operator: "pulsar-consumer-operator",
    short: "pulsar-consumer",
    group: "pulsar.pulsarconsumer.krvarma.com",
    version: "v1",
    kind: "PulsarConsumer",
    plural: "pulsarconsumers",
    workload: Some(Workload {
        app: "pulsar-consumer",
        env: "PULSAR_CONSUMER_IMAGE",
    }),
};

/// Every operator, in a fixed order: the one list (`cargo xtask new` appends to it).
pub const KINDS: [&Kind; 4] = [&PODSET, &MEMCACHED, &LOLCOW, &PULSAR_CONSUMER];

/// Every operator's crate name, in the order of [`KINDS`].
pub const OPERATORS: [&str; KINDS.len()] = {
    let mut names = [""; KINDS.len()];
    let mut i = 0;
    while i < KINDS.len() {
        names[i] = KINDS[i].operator;
        i += 1;
    }
    names
};

/// The operator whose crate is `operator`.
#[must_use]
pub fn by_operator(operator: &str) -> Option<&'static Kind> {
    KINDS.into_iter().find(|k| k.operator == operator)
}

/// Every kind as one kubectl resource list (`podsets.batch...,memcacheds.cache...`), for
/// `kubectl get|wait|delete` over all of them.
#[must_use]
pub fn all_resources() -> String {
    KINDS.map(Kind::resource).join(",")
}

/// The workload apps of this workspace that ship as images (`lolcow-web`...).
#[must_use]
pub fn workload_apps() -> Vec<&'static str> {
    KINDS
        .iter()
        .filter_map(|k| k.workload.as_ref().map(|w| w.app))
        .collect()
}

impl Kind {
    /// `group/version`.
    #[must_use]
    pub fn api_version(&self) -> String {
        format!("{}/{}", self.group, self.version)
    }

    /// The resource as RBAC and `kubectl auth can-i` name it: `plural.group`.
    #[must_use]
    pub fn resource(&self) -> String {
        format!("{}.{}", self.plural, self.group)
    }

    /// The dynamic API resource, for untyped clients.
    #[must_use]
    pub fn api_resource(&self) -> ApiResource {
        ApiResource::from_gvk_with_plural(
            &GroupVersionKind::gvk(self.group, self.version, self.kind),
            self.plural,
        )
    }

    /// A manifest of this kind named `name` with `spec` as it is, valid or not.
    #[must_use]
    pub fn manifest(&self, name: &str, spec: Value) -> Value {
        json!({
            "apiVersion": self.api_version(),
            "kind": self.kind,
            "metadata": {"name": name},
            "spec": spec,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_entry_per_operator_crate() {
        assert_eq!(KINDS.len(), OPERATORS.len());
        for kind in KINDS {
            assert_eq!(by_operator(kind.operator), Some(kind));
            assert!(kind.operator.starts_with(kind.short));
            assert!(kind.operator.ends_with("-operator"));
        }
        assert_eq!(PODSET.resource(), "podsets.batch.tutorial.kubebuilder.io");
        assert_eq!(MEMCACHED.api_version(), "cache.example.com/v1alpha1");
        assert_eq!(by_operator("nope"), None);
        assert_eq!(OPERATORS[1], "memcached-operator");
        assert!(all_resources().starts_with("podsets.batch.tutorial.kubebuilder.io,memcacheds."));
        assert_eq!(workload_apps(), ["lolcow-web", "pulsar-consumer"]);
    }
}
