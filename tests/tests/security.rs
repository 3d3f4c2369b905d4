//! Least privilege and the restricted Pod Security Standard, checked against the real API
//! server: every operator's ServiceAccount may do exactly what its code needs and nothing
//! more; every Deployment in `deploy/` and every pod an operator creates passes the
//! `restricted` standard, with the hardening the contract asks for.

use anyhow::{Context, Result, ensure};
use e2e::kinds::{self, OPERATORS, free_node_port};
use e2e::manifests::{
    kubectl_capture, kustomize, manifest_file, of_kind, resource_key, write_json,
};
use e2e::operator::{OperatorProcess, install};
use e2e::rbac::{
    LOCK_GRANT_LABEL, apply_leader_for_life_rbac, leader_for_life_rbac, operator_user,
    permissions_beyond_baseline,
};
use e2e::{TestNamespace, can_i, create_from_json, repo_root, target_dir};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Container, Pod, PodSpec, ServiceAccount};
use kube::api::{ListParams, PostParams};
use lolcow_operator::api::Lolcow;
use memcached_operator::api::Memcached;
use podset_operator::api::PodSet;
use pulsar_consumer_operator::api::PulsarConsumer;
use serde_json::{Value, json};
use std::collections::BTreeSet;

/// What each operator's code calls, as (`resource[.group][/subresource]`, verbs): the
/// ClusterRole must grant exactly this, and the ServiceAccount must be able to do exactly
/// this in a namespace it watches (beyond what every ServiceAccount may).
fn needed(operator: &str) -> BTreeSet<(String, String)> {
    let rules: &[(&str, &[&str])] = match operator {
        "podset-operator" => &[
            ("podsets.batch.tutorial.kubebuilder.io", &["list", "watch"]),
            ("podsets.batch.tutorial.kubebuilder.io/status", &["patch"]),
            (
                "podsets.batch.tutorial.kubebuilder.io/finalizers",
                &["update"],
            ),
            (
                "pods",
                &["get", "list", "watch", "create", "delete", "patch"],
            ),
            ("events.events.k8s.io", &["create", "patch"]),
        ],
        "memcached-operator" => &[
            (
                "memcacheds.cache.example.com",
                &["get", "list", "watch", "patch"],
            ),
            ("memcacheds.cache.example.com/status", &["patch"]),
            ("memcacheds.cache.example.com/finalizers", &["update"]),
            (
                "deployments.apps",
                &["get", "list", "watch", "create", "patch"],
            ),
            ("deployments.apps/scale", &["patch"]),
            // No delete: the rule kept for replacing a Service of a build never released
            // (one with a virtual IP) let it delete every Service of the cluster.
            ("services", &["get", "list", "watch", "create", "patch"]),
            ("pods", &["list", "watch"]),
            (
                "networkpolicies.networking.k8s.io",
                &["get", "list", "watch", "create", "patch", "delete"],
            ),
            ("events.events.k8s.io", &["create", "patch"]),
        ],
        "lolcow-operator" => &[
            ("lolcows.my.domain", &["list", "watch"]),
            ("lolcows.my.domain/status", &["patch"]),
            ("lolcows.my.domain/finalizers", &["update"]),
            (
                "deployments.apps",
                &["get", "list", "watch", "create", "patch"],
            ),
            ("services", &["get", "list", "watch", "create", "patch"]),
            ("events.events.k8s.io", &["create", "patch"]),
        ],
        "pulsar-consumer-operator" => &[
            (
                "pulsarconsumers.pulsar.pulsarconsumer.krvarma.com",
                &["list", "watch"],
            ),
            (
                "pulsarconsumers.pulsar.pulsarconsumer.krvarma.com/status",
                &["patch"],
            ),
            (
                "pulsarconsumers.pulsar.pulsarconsumer.krvarma.com/finalizers",
                &["update"],
            ),
            (
                "deployments.apps",
                &["get", "list", "watch", "create", "patch"],
            ),
            ("events.events.k8s.io", &["create", "patch"]),
        ],
        _ => &[],
    };
    expand(rules)
}

/// The name of the operator's Lease and of its leader-for-life lock: the default
/// `--leader-election-id`, which `deploy/` keeps.
fn lock_name(operator: &str) -> String {
    format!("{operator}-leader")
}

/// The leader-election Role in `<operator>-system`: the Lease of the default mode, and
/// nothing else: `get` and `update` of that one Lease (keyed `resource[name]`, as
/// `kubectl auth can-i --list` shows a rule limited to names), `create` of any (RBAC cannot
/// limit a create to a name).
fn needed_for_leader_election(operator: &str) -> BTreeSet<(String, String)> {
    let lease = format!("leases.coordination.k8s.io[{}]", lock_name(operator));
    expand(&[
        (&lease, &["get", "update"]),
        ("leases.coordination.k8s.io", &["create"]),
    ])
}

/// The leader-for-life Role in `<operator>-system` (`leader-for-life/`, applied by those
/// who choose that mode): the ConfigMap lock (`get` and `delete` of that one, `create` of
/// any), and the Pods that own it (named by their Deployment: any Pod).
fn needed_for_leader_for_life(operator: &str) -> BTreeSet<(String, String)> {
    let lock = format!("configmaps[{}]", lock_name(operator));
    expand(&[
        (&lock, &["get", "delete"]),
        ("configmaps", &["create"]),
        ("pods", &["get"]),
    ])
}

/// What `role` grants, as (`resource[.group][/subresource]`, verb); a rule limited to
/// resource names keys its resources `resource[name,...]`, as `kubectl auth can-i --list`
/// does.
fn granted(role: &Value) -> BTreeSet<(String, String)> {
    let mut out = BTreeSet::new();
    let strings = |rule: &Value, key: &str| -> Vec<String> {
        rule[key]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|v| v.as_str().map(str::to_owned))
            .collect()
    };
    for rule in role["rules"].as_array().into_iter().flatten() {
        let names = strings(rule, "resourceNames");
        for group in strings(rule, "apiGroups") {
            for resource in strings(rule, "resources") {
                let mut key = resource_key(&group, &resource);
                if !names.is_empty() {
                    key = format!("{key}[{}]", names.join(","));
                }
                for verb in strings(rule, "verbs") {
                    out.insert((key.clone(), verb));
                }
            }
        }
    }
    out
}

/// The Roles in `namespace` that grant an operator process a lock of its test's own.
fn lock_grants(namespace: &str) -> Result<Vec<Value>> {
    let out = kubectl_capture([
        "get",
        "roles",
        "-n",
        namespace,
        "-l",
        LOCK_GRANT_LABEL,
        "-o",
        "json",
    ])?;
    ensure!(
        out.success,
        "kubectl get roles failed: {}",
        out.stderr.trim()
    );
    let list: Value = serde_json::from_str(&out.stdout)?;
    Ok(list["items"].as_array().cloned().unwrap_or_default())
}

/// `permissions` without resource names (`leases.coordination.k8s.io[x]` becomes
/// `leases.coordination.k8s.io`), to compare with recorded requests, which carry no
/// object name (and the suite runs the operators with Lease names of its own).
fn without_names(permissions: &BTreeSet<(String, String)>) -> BTreeSet<(String, String)> {
    permissions
        .iter()
        .map(|(key, verb)| {
            let kind = key.split_once('[').map_or(key.as_str(), |(kind, _)| kind);
            (kind.to_owned(), verb.clone())
        })
        .collect()
}

/// The leader-for-life ClusterRole: the Node of the Pod that leads (NotReady or deleted).
fn needed_for_leader_for_life_nodes() -> BTreeSet<(String, String)> {
    expand(&[("nodes", &["get"])])
}

/// The metrics-auth ClusterRole (`base/metrics-auth-rbac.yaml`), bound cluster-wide:
/// `--metrics-secure` reviews each scraper's bearer token (TokenReview) and its right to
/// `get /metrics` (SubjectAccessReview), as a kubebuilder v4 manager does.
fn needed_for_metrics_auth() -> BTreeSet<(String, String)> {
    expand(&[
        ("tokenreviews.authentication.k8s.io", &["create"]),
        ("subjectaccessreviews.authorization.k8s.io", &["create"]),
    ])
}

/// Permissions granted that no request of the suite shows, and why each is needed anyway.
fn used_without_a_request(operator: &str) -> BTreeSet<(String, String)> {
    // Creating a child whose owner reference blocks the owner's deletion
    // (`blockOwnerDeletion`) needs `update` on the owner's finalizers subresource: the API
    // server checks it on the child's create.
    let mut implicit = expand(&[(&format!("{}/finalizers", own_plural(operator)), &["update"])]);
    // A repeated event becomes a series, which the recorder patches; the suite may not
    // repeat an event.
    implicit.extend(expand(&[("events.events.k8s.io", &["patch"])]));
    // Server-side apply that creates a child is a PATCH, which the API server also checks
    // against `create`.
    match operator {
        "memcached-operator" | "lolcow-operator" => {
            implicit.extend(expand(&[
                ("deployments.apps", &["create"]),
                ("services", &["create"]),
            ]));
        }
        "pulsar-consumer-operator" => {
            implicit.extend(expand(&[("deployments.apps", &["create"])]));
        }
        _ => {}
    }
    if operator == "memcached-operator" {
        implicit.extend(expand(&[(
            "networkpolicies.networking.k8s.io",
            &["create"],
        )]));
    }
    // Leader-for-life deletes a lock whose owner Pod is gone; the garbage collector
    // usually deletes it first.
    implicit.extend(expand(&[("configmaps", &["delete"])]));
    if operator != "podset-operator" {
        // Leader election (lease and for-life) and the metrics authentication are the
        // common crate's; the suite runs them with the PodSet operator.
        implicit.extend(without_names(&needed_for_leader_election(operator)));
        implicit.extend(without_names(&needed_for_leader_for_life(operator)));
        implicit.extend(needed_for_leader_for_life_nodes());
        implicit.extend(needed_for_metrics_auth());
    }
    implicit
}

/// Every API request the operator's processes logged during this run of the suite
/// (`target/e2e-logs/<namespace>-<operator>-<suffix>.log`, JSON lines; `cargo xtask test`
/// empties the directory first), as (`resource[.group][/subresource]`, verb).
fn recorded_requests(operator: &str) -> Result<BTreeSet<(String, String)>> {
    let mut recorded = BTreeSet::new();
    let Ok(entries) = std::fs::read_dir(target_dir().join("e2e-logs")) else {
        return Ok(recorded);
    };
    let marker = format!("-{operator}-");
    for entry in entries {
        let path = entry?.path();
        if !path
            .file_name()
            .is_some_and(|n| n.to_string_lossy().contains(&marker))
        {
            continue;
        }
        let log = std::fs::read_to_string(&path).unwrap_or_default();
        recorded.extend(
            log.lines()
                .filter_map(xtask::support::logged_requests::parse_line)
                .map(|r| (r.rbac_resource(), r.verb.to_owned())),
        );
    }
    Ok(recorded)
}

fn expand(rules: &[(&str, &[&str])]) -> BTreeSet<(String, String)> {
    rules
        .iter()
        .flat_map(|(resource, verbs)| {
            verbs
                .iter()
                .map(|v| ((*resource).to_owned(), (*v).to_owned()))
        })
        .collect()
}

/// The resource name `kubectl auth can-i` takes for a `resource.group/sub` key.
fn can_i_args<'a>(verb: &'a str, key: &'a str) -> Vec<&'a str> {
    match key.split_once('/') {
        Some((resource, sub)) => vec![verb, resource, "--subresource", sub],
        None => vec![verb, key],
    }
}

/// `plural.group` of the operator's own kind.
fn own_plural(operator: &str) -> String {
    kinds::by_operator(operator).map_or_else(String::new, |k| k.resource())
}

async fn rbac_matrix(operator: &str) -> Result<()> {
    install(operator)?;
    let ns = TestNamespace::new(&format!("rbac-{}", &operator[..6])).await?;
    let tree = repo_root().join("deploy").join(operator);
    let sa = operator_user(operator);
    let system = format!("{operator}-system");

    // The manifests grant exactly what the code needs.
    let cluster_role = manifest_file(&tree.join("cluster-rbac/cluster-role.yaml"))?
        .into_iter()
        .find(|o| o["kind"] == "ClusterRole")
        .context("no ClusterRole")?;
    assert_eq!(
        granted(&cluster_role),
        needed(operator),
        "{operator} ClusterRole"
    );
    let leader = manifest_file(&tree.join("base/leader-election-rbac.yaml"))?
        .into_iter()
        .find(|o| o["kind"] == "Role")
        .context("no leader-election Role")?;
    assert_eq!(
        granted(&leader),
        needed_for_leader_election(operator),
        "{operator} leader-election Role"
    );
    let for_life = manifest_file(&leader_for_life_rbac(operator))?;
    let for_life_role = for_life
        .iter()
        .find(|o| o["kind"] == "Role")
        .context("no leader-for-life Role")?;
    assert_eq!(
        granted(for_life_role),
        needed_for_leader_for_life(operator),
        "{operator} leader-for-life Role"
    );
    let for_life_nodes = for_life
        .iter()
        .find(|o| o["kind"] == "ClusterRole")
        .context("no leader-for-life ClusterRole")?;
    assert_eq!(
        granted(for_life_nodes),
        needed_for_leader_for_life_nodes(),
        "{operator} leader-for-life ClusterRole"
    );
    let metrics_auth_rbac = manifest_file(&tree.join("base/metrics-auth-rbac.yaml"))?;
    let metrics_auth = metrics_auth_rbac
        .iter()
        .find(|o| {
            o["kind"] == "ClusterRole"
                && o["metadata"]["name"] == format!("{operator}-metrics-auth-role")
        })
        .context("no metrics-auth ClusterRole")?;
    assert_eq!(
        granted(metrics_auth),
        needed_for_metrics_auth(),
        "{operator} metrics-auth ClusterRole"
    );
    // The metrics-reader ClusterRole is for scrapers: `get` on /metrics and nothing else.
    let reader = metrics_auth_rbac
        .iter()
        .find(|o| {
            o["kind"] == "ClusterRole"
                && o["metadata"]["name"] == format!("{operator}-metrics-reader")
        })
        .context("no metrics-reader ClusterRole")?;
    assert_eq!(
        reader["rules"],
        json!([{"nonResourceURLs": ["/metrics"], "verbs": ["get"]}]),
        "{operator} metrics-reader ClusterRole"
    );

    // The API server agrees: in a watched namespace exactly the ClusterRole (and the
    // cluster-scoped metrics-auth and Node rules), in its own namespace also the
    // leader-election Roles, and nothing else. The leader-for-life rights are applied here
    // as its users apply them (the leader-election tests run that mode too), so the
    // answer does not depend on which test ran first.
    apply_leader_for_life_rbac(operator)?;
    let mut in_watched = needed(operator);
    in_watched.extend(needed_for_metrics_auth());
    in_watched.extend(needed_for_leader_for_life_nodes());
    assert_eq!(
        permissions_beyond_baseline(&sa, &ns.name, &ns.name)?,
        in_watched,
        "what {sa} may do in a watched namespace"
    );
    let mut in_system = in_watched.clone();
    in_system.extend(needed_for_leader_election(operator));
    in_system.extend(needed_for_leader_for_life(operator));
    // Less the locks of the tests' own names granted to their operator processes
    // (`e2e::rbac::grant_lock`; a test killed before its end leaves its grant behind).
    let mut in_system_now = permissions_beyond_baseline(&sa, &system, &ns.name)?;
    for grant in lock_grants(&system)? {
        in_system_now = in_system_now
            .difference(&granted(&grant))
            .cloned()
            .collect();
    }
    assert_eq!(in_system_now, in_system, "what {sa} may do in {system}");

    // What the operator really did: every API request its processes made during the
    // suite (counted at the client) is allowed, and after a full run every permission was
    // used, save the few the API server checks without a request of their own.
    let recorded = recorded_requests(operator)?;
    eprintln!(
        "{operator}: {} distinct requests recorded: {recorded:?}",
        recorded.len()
    );
    // Requests are recorded without the object's name: compared with the rules' kinds.
    let in_system_kinds = without_names(&in_system);
    let not_allowed: Vec<_> = recorded.difference(&in_system_kinds).collect();
    ensure!(
        not_allowed.is_empty(),
        "{operator} made requests its RBAC does not allow: {not_allowed:?}"
    );
    if std::env::var_os("E2E_FULL_SUITE").is_some() {
        let mut implicit = used_without_a_request(operator);
        // The caches fill with streaming lists (a `watch` with `sendInitialEvents`);
        // `--streaming-lists=false`, for API servers without them, lists instead.
        implicit.extend(
            in_system_kinds
                .iter()
                .filter(|(_, verb)| verb == "watch")
                .map(|(resource, _)| (resource.clone(), "list".to_owned())),
        );
        let unused: Vec<_> = in_system_kinds
            .difference(&recorded)
            .filter(|p| !implicit.contains(*p))
            .collect();
        ensure!(
            unused.is_empty(),
            "{operator} may do what it never did during the suite: {unused:?}"
        );
    }

    // Each needed verb, one by one, here and (for reads) across namespaces.
    for (key, verb) in in_watched {
        let mut args = can_i_args(&verb, &key);
        args.extend(["-n", ns.name.as_str()]);
        ensure!(can_i(&sa, &args)?, "{operator} may not {args:?}");
        if matches!(verb.as_str(), "list" | "watch") {
            let mut args = can_i_args(&verb, &key);
            args.push("--all-namespaces");
            ensure!(can_i(&sa, &args)?, "{operator} may not {args:?}");
        }
    }

    // In its own namespace: its Lease and lock by name, a create of either.
    let lease = format!("leases.coordination.k8s.io/{}", lock_name(operator));
    let lock = format!("configmaps/{}", lock_name(operator));
    let in_own_namespace: [[&str; 2]; 6] = [
        ["get", &lease],
        ["update", &lease],
        ["create", "leases.coordination.k8s.io"],
        ["get", &lock],
        ["delete", &lock],
        ["create", "configmaps"],
    ];
    for allowed in in_own_namespace {
        let mut args = allowed.to_vec();
        args.extend(["-n", system.as_str()]);
        ensure!(can_i(&sa, &args)?, "{operator} may not {args:?}");
    }

    // And nothing more.
    let own = own_plural(operator);
    let own = own.as_str();
    let namespaced_denied: Vec<Vec<&str>> = vec![
        vec!["get", "secrets"],
        vec!["list", "secrets"],
        vec!["watch", "secrets"],
        vec!["create", own],
        vec!["update", own],
        vec!["delete", own],
        vec!["deletecollection", own],
        vec!["deletecollection", "pods"],
        vec!["update", "pods"],
        vec!["create", "pods", "--subresource", "exec"],
        vec!["create", "serviceaccounts", "--subresource", "token"],
        vec!["create", "roles"],
        vec!["create", "rolebindings"],
        vec!["escalate", "roles"],
        vec!["bind", "roles"],
        vec!["delete", "leases.coordination.k8s.io"],
        // Only its own Lease and lock: not any other Lease or ConfigMap.
        vec!["get", "leases.coordination.k8s.io"],
        vec!["update", "leases.coordination.k8s.io"],
        vec![
            "update",
            "leases.coordination.k8s.io/kube-controller-manager",
        ],
        vec!["get", "configmaps"],
        vec!["delete", "configmaps"],
        vec!["get", "configmaps/kube-root-ca.crt"],
        // Services are created and patched, never deleted (Memcached's rule to delete
        // any Service is gone).
        vec!["delete", "services"],
        vec!["*", "*"],
    ];
    for denied in &namespaced_denied {
        for namespace in [ns.name.as_str(), system.as_str()] {
            let mut args = denied.clone();
            args.extend(["-n", namespace]);
            ensure!(!can_i(&sa, &args)?, "{operator} may {args:?}");
        }
    }
    let cluster_denied: &[&[&str]] = &[
        &["list", "secrets", "--all-namespaces"],
        &["create", "namespaces"],
        &["delete", "namespaces"],
        &["update", "namespaces"],
        &["list", "nodes"],
        &["watch", "nodes"],
        &["create", "nodes"],
        &["delete", "nodes"],
        &["patch", "nodes"],
        &["create", "clusterroles"],
        &["update", "clusterroles"],
        &["delete", "clusterroles"],
        &["escalate", "clusterroles"],
        &["bind", "clusterroles"],
        &["create", "clusterrolebindings"],
        &["delete", "clusterrolebindings"],
        &["create", "validatingwebhookconfigurations"],
        &["create", "mutatingwebhookconfigurations"],
        &["create", "customresourcedefinitions"],
        &["update", "customresourcedefinitions"],
        &["delete", "customresourcedefinitions"],
        &["create", "persistentvolumes"],
        &["impersonate", "users"],
        &["impersonate", "groups"],
        &["impersonate", "serviceaccounts"],
        &["create", "certificatesigningrequests"],
        // It reviews scrapers; it does not scrape.
        &["get", "/metrics"],
    ];
    for denied in cluster_denied {
        ensure!(!can_i(&sa, denied)?, "{operator} may {denied:?}");
    }
    Ok(())
}

#[tokio::test]
async fn rbac_podset_operator_may_do_exactly_what_it_needs() -> Result<()> {
    rbac_matrix("podset-operator").await
}

#[tokio::test]
async fn rbac_memcached_operator_may_do_exactly_what_it_needs() -> Result<()> {
    rbac_matrix("memcached-operator").await
}

#[tokio::test]
async fn rbac_lolcow_operator_may_do_exactly_what_it_needs() -> Result<()> {
    rbac_matrix("lolcow-operator").await
}

#[tokio::test]
async fn rbac_pulsar_consumer_operator_may_do_exactly_what_it_needs() -> Result<()> {
    rbac_matrix("pulsar-consumer-operator").await
}

/// The operator Deployment's hardening beyond admission: read-only root filesystem,
/// non-root, requests and limits, probes.
fn assert_operator_deployment_hardened(operator: &str, d: &Value) -> Result<()> {
    let d: Deployment = serde_json::from_value(d.clone())?;
    let pod = d
        .spec
        .and_then(|s| s.template.spec)
        .context("no pod template")?;
    let psc = pod.security_context.clone().unwrap_or_default();
    ensure!(
        psc.run_as_non_root == Some(true),
        "{operator}: runAsNonRoot"
    );
    ensure!(
        psc.seccomp_profile.map(|s| s.type_).as_deref() == Some("RuntimeDefault"),
        "{operator}: seccompProfile RuntimeDefault"
    );
    for c in &pod.containers {
        let sc = c.security_context.clone().unwrap_or_default();
        ensure!(
            sc.read_only_root_filesystem == Some(true),
            "{operator}: readOnlyRootFilesystem"
        );
        ensure!(
            sc.allow_privilege_escalation == Some(false),
            "{operator}: allowPrivilegeEscalation"
        );
        ensure!(
            sc.capabilities.and_then(|c| c.drop) == Some(vec!["ALL".to_owned()]),
            "{operator}: capabilities drop ALL"
        );
        let resources = c.resources.clone().unwrap_or_default();
        for (what, list) in [
            ("requests", resources.requests),
            ("limits", resources.limits),
        ] {
            let list = list.unwrap_or_default();
            ensure!(
                list.contains_key("cpu") && list.contains_key("memory"),
                "{operator}: {what} of cpu and memory: {list:?}"
            );
        }
        ensure!(
            c.liveness_probe.is_some() && c.readiness_probe.is_some(),
            "{operator}: liveness and readiness probes"
        );
    }
    Ok(())
}

#[tokio::test]
async fn every_deployment_in_deploy_passes_the_restricted_standard() -> Result<()> {
    let ns = TestNamespace::restricted("pss-deploy").await?;
    let mut checked = 0;
    for operator in OPERATORS {
        // The pods name their ServiceAccount, which admission looks up.
        let sa: ServiceAccount = serde_json::from_value(json!({"metadata": {"name": operator}}))?;
        ns.api::<ServiceAccount>()
            .create(&PostParams::default(), &sa)
            .await?;
        let tree = repo_root().join("deploy").join(operator);
        for dir in [tree.clone(), tree.join("namespaced")] {
            let objects = kustomize(&dir)?;
            for deployment in of_kind(&objects, "Deployment") {
                assert_operator_deployment_hardened(operator, deployment)?;
                // The Deployment, into a namespace that enforces and warns `restricted`:
                // Pod Security checks its template (warnings), and a Pod made of the
                // template is admitted (enforcement).
                let mut d = deployment.clone();
                d["metadata"]["namespace"] = json!(ns.name);
                let template = d["spec"]["template"].clone();
                let pod = json!({
                    "apiVersion": "v1",
                    "kind": "Pod",
                    "metadata": {"name": format!("{operator}-template"), "namespace": ns.name,
                                 "labels": template["metadata"]["labels"]},
                    "spec": template["spec"],
                });
                for object in [d, pod] {
                    let file = write_json(&format!("{}-{operator}", ns.name), &object)?;
                    kubectl_capture([
                        "apply".as_ref(),
                        "--dry-run=server".as_ref(),
                        "-f".as_ref(),
                        file.as_os_str(),
                    ])?
                    .clean(&format!(
                        "a server-side dry run of the {} of {}",
                        object["kind"],
                        dir.display()
                    ))?;
                    let _ = std::fs::remove_file(file);
                }
                checked += 1;
            }
        }
    }
    assert_eq!(
        checked,
        2 * OPERATORS.len(),
        "one Deployment per tree and per namespaced overlay"
    );
    Ok(())
}

/// The restricted standard and the contract's hardening, on a pod spec an operator wrote.
fn assert_workload_pod_restricted(what: &str, pod: &PodSpec) -> Result<()> {
    ensure!(
        pod.automount_service_account_token == Some(false),
        "{what}: automountServiceAccountToken false"
    );
    ensure!(
        pod.host_network != Some(true) && pod.host_pid != Some(true) && pod.host_ipc != Some(true),
        "{what}: no host namespaces"
    );
    let psc = pod.security_context.clone().unwrap_or_default();
    let containers: Vec<&Container> = pod
        .containers
        .iter()
        .chain(pod.init_containers.iter().flatten())
        .collect();
    ensure!(!containers.is_empty(), "{what}: no containers");
    for c in containers {
        let sc = c.security_context.clone().unwrap_or_default();
        ensure!(
            sc.run_as_non_root.or(psc.run_as_non_root) == Some(true),
            "{what}/{}: runAsNonRoot",
            c.name
        );
        ensure!(
            sc.run_as_user.or(psc.run_as_user) != Some(0),
            "{what}/{}: runAsUser 0",
            c.name
        );
        ensure!(
            sc.allow_privilege_escalation == Some(false),
            "{what}/{}: allowPrivilegeEscalation false",
            c.name
        );
        ensure!(sc.privileged != Some(true), "{what}/{}: privileged", c.name);
        let caps = sc.capabilities.clone().unwrap_or_default();
        ensure!(
            caps.drop == Some(vec!["ALL".to_owned()]) && caps.add.unwrap_or_default().is_empty(),
            "{what}/{}: capabilities drop ALL, add none",
            c.name
        );
        ensure!(
            sc.seccomp_profile
                .or(psc.seccomp_profile.clone())
                .map(|s| s.type_)
                .as_deref()
                == Some("RuntimeDefault"),
            "{what}/{}: seccompProfile RuntimeDefault",
            c.name
        );
        ensure!(
            sc.read_only_root_filesystem == Some(true),
            "{what}/{}: readOnlyRootFilesystem true",
            c.name
        );
    }
    Ok(())
}

#[tokio::test]
async fn every_pod_an_operator_creates_is_restricted() -> Result<()> {
    // The namespace enforces `restricted`: that the pods exist proves admission; the
    // assertions below check the hardening on top of it.
    let ns = TestNamespace::restricted("pss-pods").await?;
    let mut ops = Vec::new();
    for operator in OPERATORS {
        ops.push(OperatorProcess::start(operator, &[&ns.name]).await?);
    }
    create_from_json::<PodSet>(&ns, kinds::podset("ps", 2)).await?;
    create_from_json::<Memcached>(&ns, kinds::memcached("mc", 1)).await?;
    let port = free_node_port(&ns, "lc", &[]).await?;
    create_from_json::<Lolcow>(&ns, kinds::lolcow("lc", port, "secure moo")).await?;
    create_from_json::<PulsarConsumer>(&ns, kinds::pulsar_consumer("pc", 1)).await?;
    kinds::wait_podset_ready(&ns, "ps").await?;
    kinds::wait_memcached_ready(&ns, "mc").await?;
    kinds::wait_lolcow_ready(&ns, "lc").await?;
    kinds::wait_pulsar_consumer_ready(&ns, "pc").await?;

    // The Deployments' pod templates (Memcached, Lolcow, PulsarConsumer).
    let deployments = ns.api::<Deployment>().list(&ListParams::default()).await?;
    ensure!(deployments.items.len() == 3, "{:?}", deployments.items);
    for d in &deployments.items {
        let name = d.metadata.name.clone().unwrap_or_default();
        let pod = d
            .spec
            .as_ref()
            .and_then(|s| s.template.spec.clone())
            .context("no template")?;
        assert_workload_pod_restricted(&format!("Deployment {name}"), &pod)?;
    }
    // Every pod in the namespace: the PodSet's own and those of the Deployments.
    let pods = ns.api::<Pod>().list(&ListParams::default()).await?;
    ensure!(
        pods.items.len() >= 5, // 2 of the PodSet, 1 each of the three Deployments
        "{} pods",
        pods.items.len()
    );
    for p in &pods.items {
        let name = p.metadata.name.clone().unwrap_or_default();
        let spec = p.spec.clone().context("no pod spec")?;
        assert_workload_pod_restricted(&format!("Pod {name}"), &spec)?;
    }
    // The Memcached finalizer needs its operator: delete it while it runs.
    e2e::delete_and_wait(&ns.api::<Memcached>(), "mc").await?;
    drop(ops);
    Ok(())
}
