//! What a kubebuilder v4 project ships beside the manager, in each `deploy/<operator>`:
//! `prometheus/` (a ServiceMonitor scraping the HTTPS metrics Service with the scraper's
//! ServiceAccount token, and a PrometheusRule of the operator's alerts), `network-policy/` (the metrics port open only to namespaces
//! labelled `metrics: enabled`) and `user-rbac/` (admin, editor and viewer ClusterRoles per
//! kind, aggregated into the built-in `admin`, `edit` and `view`). The first two are
//! optional and apply on top of an install; the roles are part of the default install.
//! Checked against the real API server: server-side dry run and apply without a warning,
//! and `kubectl auth can-i` for people bound to `view`, `edit` or `admin`.

use anyhow::{Context, Result, ensure};
use e2e::kinds::{Kind, OPERATORS, PODSET, by_operator};
use e2e::manifests::{granted, kubectl_capture, kustomize, of_kind};
use e2e::operator::install;
use e2e::{TIMEOUT, TestNamespace, can_i, kubectl_ok, poll, repo_root, unique_suffix};
use k8s_openapi::api::rbac::v1::RoleBinding;
use kube::api::PostParams;
use serde_json::{Value, json};
use std::collections::BTreeSet;
use std::path::PathBuf;
use std::sync::Mutex;

const SERVICE_MONITOR_CRD: &str = "servicemonitors.monitoring.coreos.com";
/// The label of the test's own minimal ServiceMonitor CRD (`tests/fixtures/`).
const FIXTURE_LABEL: &str = "e2e.rust-operators.dev/fixture";

fn tree(operator: &str) -> PathBuf {
    repo_root().join("deploy").join(operator)
}

/// The operator's entry in the workspace's list.
fn kind_of(operator: &str) -> &'static Kind {
    by_operator(operator).unwrap_or(&PODSET)
}

/// `plural.group`, as `kubectl auth can-i` takes it.
fn resource(operator: &str) -> String {
    kind_of(operator).resource()
}

fn pairs(resource: &str, verbs: &[&str]) -> BTreeSet<(String, String)> {
    verbs
        .iter()
        .map(|v| (resource.to_owned(), (*v).to_owned()))
        .collect()
}

/// Installs the ServiceMonitor and PrometheusRule CRDs unless the cluster serves the
/// ServiceMonitor one: a real Prometheus Operator's CRDs are used as they are, never
/// replaced by the minimal fixtures.
fn ensure_service_monitor_crd() -> Result<()> {
    static LOCK: Mutex<()> = Mutex::new(());
    let _guard = LOCK
        .lock()
        .map_err(|_| anyhow::anyhow!("CRD lock poisoned"))?;
    let existing = kubectl_capture(["get", "crd", SERVICE_MONITOR_CRD, "-o", "json"])?;
    let ours = if existing.success {
        let crd: Value = serde_json::from_str(&existing.stdout)?;
        crd["metadata"]["labels"][FIXTURE_LABEL].is_string()
    } else {
        true
    };
    if ours {
        let fixture = repo_root().join("tests/fixtures/servicemonitor-crd.yaml");
        kubectl_capture([
            "apply".as_ref(),
            "--server-side".as_ref(),
            "--field-manager=e2e-kubebuilder-fit".as_ref(),
            "-f".as_ref(),
            fixture.as_os_str(),
        ])?
        .clean("applying the ServiceMonitor CRD fixture")?;
    }
    kubectl_ok([
        "wait",
        "--for=condition=Established",
        "--timeout=60s",
        &format!("crd/{SERVICE_MONITOR_CRD}"),
        "crd/prometheusrules.monitoring.coreos.com",
    ])?;
    Ok(())
}

/// `kubectl apply --server-side -k <dir>`, a server-side dry run first: both must succeed
/// without a single warning.
fn apply_clean(dir: &std::path::Path) -> Result<()> {
    let common = [
        "apply".as_ref(),
        "--server-side".as_ref(),
        "--field-manager=e2e-kubebuilder-fit".as_ref(),
        "-k".as_ref(),
        dir.as_os_str(),
    ];
    let mut dry_run: Vec<&std::ffi::OsStr> = common.to_vec();
    dry_run.push("--dry-run=server".as_ref());
    kubectl_capture(&dry_run)?.clean(&format!("the server-side dry run of {}", dir.display()))?;
    kubectl_capture(common)?.clean(&format!("kubectl apply -k {}", dir.display()))?;
    Ok(())
}

/// Every label of `selector` is on `labels`.
fn selects(selector: &Value, labels: &Value) -> bool {
    selector
        .as_object()
        .is_some_and(|s| !s.is_empty() && s.iter().all(|(k, v)| &labels[k] == v))
}

/// The ServiceMonitor and NetworkPolicy point at what the install really has: the metrics
/// Service (its `https` port, 8443) and the operator's pods (their `metrics` port).
fn check_targets(operator: &str) -> Result<()> {
    let base = kustomize(&tree(operator).join("base"))?;
    let service = of_kind(&base, "Service")
        .into_iter()
        .find(|s| s["metadata"]["name"] == format!("{operator}-metrics"))
        .context("no metrics Service in base/")?;
    let deployment = of_kind(&base, "Deployment")
        .first()
        .copied()
        .context("no Deployment in base/")?;
    let container = &deployment["spec"]["template"]["spec"]["containers"][0];
    let args: Vec<&str> = container["args"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .collect();
    ensure!(
        args.contains(&"--metrics-secure") && args.contains(&"--metrics-bind-address=:8443"),
        "{operator}: the Deployment serves metrics securely on :8443: {args:?}"
    );

    let monitors = kustomize(&tree(operator).join("prometheus"))?;
    let [monitor] = of_kind(&monitors, "ServiceMonitor")[..] else {
        anyhow::bail!("{operator}: prometheus/ must hold exactly one ServiceMonitor");
    };
    ensure!(
        monitor["apiVersion"] == "monitoring.coreos.com/v1"
            && monitor["metadata"]["namespace"] == format!("{operator}-system"),
        "{operator}: {monitor}"
    );
    ensure!(
        selects(
            &monitor["spec"]["selector"]["matchLabels"],
            &service["metadata"]["labels"]
        ),
        "{operator}: the ServiceMonitor does not select the metrics Service"
    );
    let endpoints = monitor["spec"]["endpoints"]
        .as_array()
        .context("no endpoints")?;
    ensure!(endpoints.len() == 1, "{operator}: {endpoints:?}");
    let endpoint = &endpoints[0];
    let port = service["spec"]["ports"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|p| p["name"] == endpoint["port"])
        .with_context(|| format!("{operator}: no Service port named {}", endpoint["port"]))?;
    ensure!(port["port"] == 8443, "{operator}: scrapes {port}, not 8443");
    ensure!(
        endpoint["scheme"] == "https"
            && endpoint["path"] == "/metrics"
            && endpoint["bearerTokenFile"] == "/var/run/secrets/kubernetes.io/serviceaccount/token",
        "{operator}: HTTPS with the ServiceAccount token: {endpoint}"
    );

    let policies = kustomize(&tree(operator).join("network-policy"))?;
    let [policy] = of_kind(&policies, "NetworkPolicy")[..] else {
        anyhow::bail!("{operator}: network-policy/ must hold exactly one NetworkPolicy");
    };
    ensure!(
        policy["metadata"]["namespace"] == format!("{operator}-system"),
        "{operator}: {policy}"
    );
    ensure!(
        selects(
            &policy["spec"]["podSelector"]["matchLabels"],
            &deployment["spec"]["template"]["metadata"]["labels"]
        ),
        "{operator}: the NetworkPolicy does not select the operator's pods"
    );
    ensure!(
        policy["spec"]["policyTypes"] == json!(["Ingress"]),
        "{operator}: {policy}"
    );
    let metrics_port = container["ports"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|p| p["name"] == "metrics")
        .map(|p| p["containerPort"].clone())
        .context("no container port named metrics")?;
    ensure!(
        policy["spec"]["ingress"]
            == json!([{
                "from": [{"namespaceSelector": {"matchLabels": {"metrics": "enabled"}}}],
                "ports": [{"port": metrics_port, "protocol": "TCP"}],
            }]),
        "{operator}: the metrics port only, only from namespaces labelled metrics=enabled: {}",
        policy["spec"]["ingress"]
    );
    Ok(())
}

async fn prometheus_and_network_policy_apply(operator: &str) -> Result<()> {
    // kubectl maps a ServiceMonitor only once its CRD is served, even for a client dry run.
    ensure_service_monitor_crd()?;
    check_targets(operator)?;
    install(operator)?;
    let system = format!("{operator}-system");
    for (dir, kind, name) in [
        (
            "prometheus",
            "servicemonitors.monitoring.coreos.com",
            format!("{operator}-metrics-monitor"),
        ),
        (
            "prometheus",
            "prometheusrules.monitoring.coreos.com",
            format!("{operator}-alerts"),
        ),
        (
            "network-policy",
            "networkpolicies.networking.k8s.io",
            format!("{operator}-allow-metrics-traffic"),
        ),
    ] {
        let dir = tree(operator).join(dir);
        apply_clean(&dir)?;
        // Stored as written (the fixtures keep the specs unchanged).
        let stored: Value = serde_json::from_str(&kubectl_ok([
            "get", kind, &name, "-n", &system, "-o", "json",
        ])?)?;
        let written = kustomize(&dir)?
            .into_iter()
            .find(|o| o["metadata"]["name"] == name.as_str())
            .with_context(|| format!("{} has no {name}", dir.display()))?;
        ensure!(
            stored["spec"] == written["spec"],
            "{operator}: {kind} {name} stored as {}, written as {}",
            stored["spec"],
            written["spec"]
        );
        // Removed again: other tests scrape the operators' metrics.
        kubectl_ok([
            "delete".as_ref(),
            "--ignore-not-found".as_ref(),
            "-k".as_ref(),
            dir.as_os_str(),
        ])?;
    }
    Ok(())
}

#[tokio::test]
async fn kubebuilder_fit_podset_prometheus_and_network_policy_apply_cleanly() -> Result<()> {
    prometheus_and_network_policy_apply("podset-operator").await
}

#[tokio::test]
async fn kubebuilder_fit_memcached_prometheus_and_network_policy_apply_cleanly() -> Result<()> {
    prometheus_and_network_policy_apply("memcached-operator").await
}

#[tokio::test]
async fn kubebuilder_fit_lolcow_prometheus_and_network_policy_apply_cleanly() -> Result<()> {
    prometheus_and_network_policy_apply("lolcow-operator").await
}

#[tokio::test]
async fn kubebuilder_fit_pulsar_consumer_prometheus_and_network_policy_apply_cleanly() -> Result<()>
{
    prometheus_and_network_policy_apply("pulsar-consumer-operator").await
}

/// The default install has the three user roles per kind, each granting what kubebuilder's
/// scaffold grants and labelled for aggregation, bound to nobody; it has no ServiceMonitor
/// (it must install without the Prometheus Operator) and no NetworkPolicy.
#[tokio::test]
async fn kubebuilder_fit_default_install_has_user_roles_and_leaves_monitoring_optional()
-> Result<()> {
    for operator in OPERATORS {
        let objects = kustomize(&tree(operator))?;
        for kind in ["ServiceMonitor", "NetworkPolicy"] {
            ensure!(
                of_kind(&objects, kind).is_empty(),
                "{operator}: the default install has a {kind}"
            );
        }
        let plural = kind_of(operator).plural;
        let main = resource(operator);
        let status = format!("{main}/status");
        let editor_verbs = [
            "create", "delete", "get", "list", "patch", "update", "watch",
        ];
        for (suffix, aggregate_to, verbs) in [
            ("admin", "admin", &["*"][..]),
            ("editor", "edit", &editor_verbs[..]),
            ("viewer", "view", &["get", "list", "watch"][..]),
        ] {
            let name = format!("{plural}-{suffix}-role");
            let role = of_kind(&objects, "ClusterRole")
                .into_iter()
                .find(|r| r["metadata"]["name"] == name)
                .with_context(|| format!("{operator}: no ClusterRole {name}"))?;
            let mut expected = pairs(&main, verbs);
            expected.extend(pairs(&status, &["get"]));
            assert_eq!(granted(role), expected, "{operator}: {name}");
            let labels = role["metadata"]["labels"]
                .as_object()
                .context("no labels")?;
            let aggregation: Vec<&String> = labels
                .keys()
                .filter(|k| k.starts_with("rbac.authorization.k8s.io/aggregate-to-"))
                .collect();
            ensure!(
                aggregation
                    == [&format!(
                        "rbac.authorization.k8s.io/aggregate-to-{aggregate_to}"
                    )]
                    && labels[aggregation[0].as_str()] == "true",
                "{operator}: {name} aggregates to {aggregation:?}, not only {aggregate_to}"
            );
            let bindings: Vec<&Value> = of_kind(&objects, "ClusterRoleBinding")
                .into_iter()
                .chain(of_kind(&objects, "RoleBinding"))
                .filter(|b| b["roleRef"]["name"] == name)
                .collect();
            ensure!(
                bindings.is_empty(),
                "{operator}: {name} is for people, yet bound: {bindings:?}"
            );
        }
    }
    Ok(())
}

/// Binds the built-in ClusterRole `role` to a fresh user in `ns`; returns the user.
async fn bind(ns: &TestNamespace, role: &str) -> Result<String> {
    let user = format!("e2e-{role}-{}", unique_suffix());
    let binding: RoleBinding = serde_json::from_value(json!({
        "metadata": {"name": user},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": user}],
    }))?;
    ns.api::<RoleBinding>()
        .create(&PostParams::default(), &binding)
        .await?;
    Ok(user)
}

/// `kubectl auth can-i` for `user` in `namespace` must answer `allowed`.
fn expect(user: &str, allowed: bool, args: &[&str], namespace: &str) -> Result<()> {
    let mut args = args.to_vec();
    args.extend(["-n", namespace]);
    ensure!(
        can_i(user, &args)? == allowed,
        "`kubectl auth can-i {} --as={user}` must answer {}",
        args.join(" "),
        if allowed { "yes" } else { "no" }
    );
    Ok(())
}

/// People bound to the built-in `view`, `edit` or `admin` in a namespace get the four
/// kinds through aggregation (no binding to our roles): view reads, edit also writes,
/// admin also deletes collections; none of them writes status (the operators' job), and
/// nobody gets anything in a namespace where they are not bound.
#[tokio::test]
async fn kubebuilder_fit_view_edit_admin_aggregate_the_four_kinds() -> Result<()> {
    for operator in OPERATORS {
        install(operator)?;
        // The roles apply cleanly on their own too (also without the rest of the tree).
        apply_clean(&tree(operator).join("user-rbac"))?;
    }
    let ns = TestNamespace::new("agg").await?;
    let elsewhere = TestNamespace::new("agg-other").await?;
    let viewer = bind(&ns, "view").await?;
    let editor = bind(&ns, "edit").await?;
    let admin = bind(&ns, "admin").await?;

    // The aggregation controller fills the built-in roles in the background.
    poll(
        "the built-in roles to aggregate the four kinds",
        TIMEOUT,
        || async {
            for operator in OPERATORS {
                let r = resource(operator);
                for (user, verb) in [(&viewer, "watch"), (&editor, "create"), (&admin, "*")] {
                    if !can_i(user, &[verb, &r, "-n", &ns.name])? {
                        return Ok(None);
                    }
                }
            }
            Ok(Some(()))
        },
    )
    .await?;

    for operator in OPERATORS {
        let r = resource(operator);
        let r = r.as_str();
        let status = [r, "--subresource", "status"];
        let n = ns.name.as_str();
        for verb in ["get", "list", "watch"] {
            for user in [&viewer, &editor, &admin] {
                expect(user, true, &[verb, r], n)?;
            }
        }
        for user in [&viewer, &editor, &admin] {
            expect(user, true, &[&["get"], &status[..]].concat(), n)?;
            for verb in ["update", "patch"] {
                expect(user, false, &[&[verb], &status[..]].concat(), n)?;
            }
            expect(user, false, &["get", r], &elsewhere.name)?;
            expect(user, false, &["list", r], &elsewhere.name)?;
        }
        for verb in ["create", "update", "patch", "delete"] {
            expect(&viewer, false, &[verb, r], n)?;
            expect(&editor, true, &[verb, r], n)?;
            expect(&admin, true, &[verb, r], n)?;
        }
        for user in [&viewer, &editor] {
            expect(user, false, &["deletecollection", r], n)?;
        }
        expect(&admin, true, &["deletecollection", r], n)?;
    }
    Ok(())
}
