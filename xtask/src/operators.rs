//! The operators of the workspace, in one place: each one's crate (also its binary, image
//! and `deploy/` folder), the short name the bench takes, and the group, version, kind and
//! plural of the custom resource it serves. `crds`, `deploy`, `demo`, `image`, the bench
//! and the end-to-end tests all read this list; a fifth operator is one more entry.

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
}

/// PodSet (`podset-operator`).
pub const PODSET: Kind = Kind {
    operator: "podset-operator",
    short: "podset",
    group: "batch.tutorial.kubebuilder.io",
    version: "v1",
    kind: "PodSet",
    plural: "podsets",
};

/// Memcached (`memcached-operator`).
pub const MEMCACHED: Kind = Kind {
    operator: "memcached-operator",
    short: "memcached",
    group: "cache.example.com",
    version: "v1alpha1",
    kind: "Memcached",
    plural: "memcacheds",
};

/// Lolcow (`lolcow-operator`).
pub const LOLCOW: Kind = Kind {
    operator: "lolcow-operator",
    short: "lolcow",
    group: "my.domain",
    version: "v1alpha1",
    kind: "Lolcow",
    plural: "lolcows",
};

/// PulsarConsumer (`pulsar-consumer-operator`).
pub const PULSAR_CONSUMER: Kind = Kind {
    operator: "pulsar-consumer-operator",
    short: "pulsar-consumer",
    group: "pulsar.pulsarconsumer.krvarma.com",
    version: "v1",
    kind: "PulsarConsumer",
    plural: "pulsarconsumers",
};

/// Every operator, in a fixed order.
pub const KINDS: [&Kind; 4] = [&PODSET, &MEMCACHED, &LOLCOW, &PULSAR_CONSUMER];

/// Every operator's crate name, in the order of [`KINDS`].
pub const OPERATORS: [&str; 4] = [
    PODSET.operator,
    MEMCACHED.operator,
    LOLCOW.operator,
    PULSAR_CONSUMER.operator,
];

/// The operator whose crate is `operator`.
#[must_use]
pub fn by_operator(operator: &str) -> Option<&'static Kind> {
    KINDS.into_iter().find(|k| k.operator == operator)
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
    }
}
