//! What an identity may do, as `kubectl auth can-i` reports it.

use crate::{TestNamespace, kubectl_runner};
use anyhow::{Context, Result, bail};
use k8s_openapi::api::core::v1::ServiceAccount;
use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
use kube::api::PostParams;
use serde_json::{Value, json};
use std::collections::BTreeSet;

/// The user name of an operator's ServiceAccount (`<operator>` in `<operator>-system`).
pub fn operator_user(operator: &str) -> String {
    format!("system:serviceaccount:{operator}-system:{operator}")
}

/// Creates the ServiceAccount `sa_name` in `home` and, in each of `namespaces`, a Role
/// named `operator` with `rules`, bound to that ServiceAccount: the identity of an
/// operator installed for those namespaces only.
pub async fn grant_roles(
    operator: &str,
    sa_name: &str,
    rules: &Value,
    home: &TestNamespace,
    namespaces: &[&TestNamespace],
) -> Result<()> {
    let sa: ServiceAccount = serde_json::from_value(json!({"metadata": {"name": sa_name}}))?;
    home.api::<ServiceAccount>()
        .create(&PostParams::default(), &sa)
        .await?;
    for ns in namespaces {
        let role: Role = serde_json::from_value(json!({
            "metadata": {"name": operator},
            "rules": rules,
        }))?;
        ns.api::<Role>()
            .create(&PostParams::default(), &role)
            .await?;
        let binding: RoleBinding = serde_json::from_value(json!({
            "metadata": {"name": operator},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": operator},
            "subjects": [{"kind": "ServiceAccount", "name": sa_name, "namespace": home.name}],
        }))?;
        ns.api::<RoleBinding>()
            .create(&PostParams::default(), &binding)
            .await?;
    }
    Ok(())
}

/// Every (`resource[.group][/subresource]`, verb) `user` may use in `namespace`, from
/// `kubectl auth can-i --list` (resource rows only; rows limited to resource names are
/// reported as `resource[name,...]`).
pub fn permissions(user: &str, namespace: &str) -> Result<BTreeSet<(String, String)>> {
    let out = kubectl_runner()
        .capture([
            "auth",
            "can-i",
            "--list",
            "-n",
            namespace,
            &format!("--as={user}"),
        ])
        .context("running kubectl auth can-i --list")?;
    if !out.success {
        bail!("kubectl auth can-i --list failed: {}", out.stderr.trim());
    }
    let text = out.stdout;
    let mut result = BTreeSet::new();
    for line in text.lines().skip(1) {
        // Non-resource URL rows start with blanks (no resource).
        if line.starts_with(char::is_whitespace) || line.trim().is_empty() {
            continue;
        }
        let resource = line.split_whitespace().next().unwrap_or_default();
        let groups: Vec<&str> = line
            .split('[')
            .skip(1)
            .filter_map(|s| s.split_once(']').map(|(inside, _)| inside))
            .collect();
        let [.., names, verbs] = groups[..] else {
            bail!("unexpected kubectl auth can-i --list row: {line:?}");
        };
        let key = if names.is_empty() {
            resource.to_owned()
        } else {
            format!(
                "{resource}[{}]",
                names.split_whitespace().collect::<Vec<_>>().join(",")
            )
        };
        for verb in verbs.split_whitespace() {
            result.insert((key.clone(), verb.to_owned()));
        }
    }
    Ok(result)
}

/// What `user` may do in `namespace` beyond what every ServiceAccount may (the
/// `default` ServiceAccount of `baseline_namespace`, which nothing binds, is the baseline).
pub fn permissions_beyond_baseline(
    user: &str,
    namespace: &str,
    baseline_namespace: &str,
) -> Result<BTreeSet<(String, String)>> {
    let baseline = permissions(
        &format!("system:serviceaccount:{baseline_namespace}:default"),
        namespace,
    )?;
    Ok(permissions(user, namespace)?
        .difference(&baseline)
        .cloned()
        .collect())
}

/// `deploy/<operator>/leader-for-life/leader-for-life-rbac.yaml`: what
/// `--leader-election-mode=for-life` needs beyond the default install (a Role and binding in
/// `<operator>-system`, and a ClusterRole and binding to read Nodes).
pub fn leader_for_life_rbac(operator: &str) -> std::path::PathBuf {
    crate::repo_root()
        .join("deploy")
        .join(operator)
        .join("leader-for-life")
        .join("leader-for-life-rbac.yaml")
}

/// Applies [`leader_for_life_rbac`] (idempotent), as a user who chooses leader-for-life
/// does on top of the default install. Tests that run the operator in that mode, and the
/// least-privilege test (so what it finds does not depend on which test ran first), apply it.
pub fn apply_leader_for_life_rbac(operator: &str) -> Result<()> {
    let path = leader_for_life_rbac(operator);
    kubectl_runner()
        .output(["apply".as_ref(), "-f".as_ref(), path.as_os_str()])
        .with_context(|| format!("applying {}", path.display()))?;
    Ok(())
}

/// Label of the Roles and RoleBindings [`grant_lock`] makes.
pub const LOCK_GRANT_LABEL: &str = "e2e.rust-operators.dev/lock-grant";

/// Rights over a leader-election lock of a test's own name ([`grant_lock`]), taken back
/// (deleted, without waiting) when dropped.
pub struct LockGrant {
    name: String,
    namespaces: Vec<String>,
}

impl Drop for LockGrant {
    fn drop(&mut self) {
        for namespace in &self.namespaces {
            let _ = kubectl_runner().capture([
                "delete",
                "role,rolebinding",
                &self.name,
                "-n",
                namespace,
                "--ignore-not-found",
                "--wait=false",
            ]);
        }
    }
}

/// What a user who passes `--leader-election-id=<lock>` adds to the Roles of `deploy/`,
/// which name only the default lock `<operator>-leader`: `get` and `update` of the Lease
/// `lock`, `get` and `delete` of the ConfigMap `lock` (leader-for-life), for the operator's
/// ServiceAccount in each of `namespaces` (`create` is unnamed there already). Each call
/// makes Roles of its own (each replica of a test holds one), labelled
/// [`LOCK_GRANT_LABEL`].
pub fn grant_lock(operator: &str, lock: &str, namespaces: &[String]) -> Result<LockGrant> {
    let grant = LockGrant {
        name: format!("e2e-lock-{}", crate::unique_suffix()),
        namespaces: namespaces.to_vec(),
    };
    let metadata = |namespace: &str| json!({"name": grant.name, "namespace": namespace, "labels": {LOCK_GRANT_LABEL: "true"}});
    let mut items = Vec::new();
    for namespace in namespaces {
        items.push(json!({
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
            "metadata": metadata(namespace),
            "rules": [
                {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"],
                 "resourceNames": [lock], "verbs": ["get", "update"]},
                {"apiGroups": [""], "resources": ["configmaps"],
                 "resourceNames": [lock], "verbs": ["get", "delete"]},
            ],
        }));
        items.push(json!({
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
            "metadata": metadata(namespace),
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": grant.name},
            "subjects": [{"kind": "ServiceAccount", "name": operator,
                          "namespace": format!("{operator}-system")}],
        }));
    }
    let path = crate::manifests::write_json(
        "lock-grant",
        &json!({"apiVersion": "v1", "kind": "List", "items": items}),
    )?;
    kubectl_runner()
        .output(["apply".as_ref(), "-f".as_ref(), path.as_os_str()])
        .with_context(|| format!("granting the lock {lock} to {operator}"))?;
    Ok(grant)
}

/// A ClusterRoleBinding made by a test; deleted when dropped (namespaces are cleaned up
/// by [`TestNamespace`], cluster-scoped objects are not).
pub struct ClusterRoleBinding(String);

impl ClusterRoleBinding {
    /// Binds ServiceAccount `namespace/sa` to ClusterRole `role` (one binding per role:
    /// its name holds all three).
    pub fn create(role: &str, namespace: &str, sa: &str) -> Result<Self> {
        let name = format!("e2e-{namespace}-{sa}-{role}");
        crate::kubectl_ok([
            "create",
            "clusterrolebinding",
            &name,
            &format!("--clusterrole={role}"),
            &format!("--serviceaccount={namespace}:{sa}"),
        ])?;
        Ok(Self(name))
    }
}

impl Drop for ClusterRoleBinding {
    fn drop(&mut self) {
        let _ = kubectl_runner().succeeds([
            "delete",
            "clusterrolebinding",
            &self.0,
            "--ignore-not-found",
        ]);
    }
}
