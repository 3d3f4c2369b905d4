//! The compatibility run: `cargo xtask test --kubernetes <version> --compat`.
//!
//! A subset of the end-to-end tests that still covers, for each operator, what a user
//! needs from a Kubernetes version ([`SUBSET`]), preceded by checks of the cluster itself:
//! the API server is the version asked for, it accepts each operator's CRD exactly as
//! committed (every CEL rule with its message, message expression, field path and reason
//! stored, nothing dropped), and what it answers a streaming list (WatchList), which the
//! operators detect by themselves (`--streaming-lists=auto`). The run leaves its record in
//! `target/compat/<version>.json` and prints the row of the table in
//! `docs/kubernetes-versions.md`.

use crate::commands::crds::deployed_operators;
use anyhow::{Context, Result, bail};
use serde_json::{Value, json};
use std::path::PathBuf;
use xtask::say;
use xtask::support::kubectl::Kubectl;
use xtask::support::paths;

use super::Kubernetes;

/// What the run proves, and the end-to-end tests (by exact name) that prove it.
pub const SUBSET: &[(&str, &[&str])] = &[
    (
        "the seed sample converges, installed from deploy/<operator> (CRD included, server-side, no warning)",
        &[
            "deploy_podset_operator_installs_cleanly_and_runs_its_sample",
            "deploy_memcached_operator_installs_cleanly_and_runs_its_sample",
            "deploy_lolcow_operator_installs_cleanly_and_runs_its_sample",
            "deploy_pulsar_consumer_operator_installs_cleanly_and_runs_its_sample",
        ],
    ),
    (
        "the operator runs from its image on the real node and its workload really serves",
        &[
            "podset_operator_image_runs_busybox_pods_for_real",
            "memcached_operator_image_runs_memcached_that_answers_at_its_service_name",
            "lolcow_operator_image_serves_the_cow_page_on_its_node_port",
            "pulsar_consumer_operator_image_consumes_from_the_real_broker",
        ],
    ),
    (
        "a deleted and an edited child are repaired; deleting the object removes its children",
        &[
            "podset_converges_scales_and_repairs",
            "memcached_converges_scales_and_repairs",
            "memcached_finalizer_flow_and_garbage_collection",
            "lolcow_converges_changes_and_repairs",
            "pulsar_consumer_converges_updates_and_repairs",
        ],
    ),
    (
        "bad input is rejected by the CRD's rules, naming the field",
        &[
            "podset_invalid_objects_are_rejected_naming_the_field",
            "memcached_invalid_objects_are_rejected_naming_the_field",
            "lolcow_invalid_objects_are_rejected_naming_the_field",
            "pulsar_consumer_invalid_objects_are_rejected_naming_the_field",
            "pulsar_autoscaling_invalid_settings_are_rejected_naming_the_field",
            "podset_bad_updates_leave_it_untouched_and_edges_converge",
            "memcached_bad_input_is_rejected_and_edges_converge",
            "lolcow_bad_input_is_rejected_and_edges_converge",
            "pulsar_consumer_bad_input_is_rejected_and_edges_converge",
        ],
    ),
    (
        "least-privilege RBAC: the ServiceAccount may do exactly what the code needs",
        &[
            "rbac_podset_operator_may_do_exactly_what_it_needs",
            "rbac_memcached_operator_may_do_exactly_what_it_needs",
            "rbac_lolcow_operator_may_do_exactly_what_it_needs",
            "rbac_pulsar_consumer_operator_may_do_exactly_what_it_needs",
        ],
    ),
    (
        "leader election hands over (Lease), as processes and as pods on the real node",
        &[
            "a_killed_leader_is_replaced_and_only_one_replica_reconciles",
            "a_terminated_leader_hands_over_at_once",
            "podset_leader_holds_the_lease_and_releases_it_on_sigterm",
        ],
    ),
    (
        "a restart, and a reconcile of objects in sync, write nothing",
        &[
            "a_restarted_podset_operator_writes_nothing",
            "a_restarted_memcached_operator_writes_nothing",
            "podset_at_rest_writes_nothing",
            "memcached_at_rest_writes_nothing",
            "lolcow_at_rest_writes_nothing",
            "pulsar_consumer_at_rest_writes_nothing",
        ],
    ),
    (
        "the caches fill with streaming lists and with paged lists",
        &["podset_converges_with_streaming_and_with_paginated_lists"],
    ),
];

/// Every test of the subset, in [`SUBSET`]'s order.
pub fn tests() -> Vec<&'static str> {
    SUBSET
        .iter()
        .flat_map(|(_, tests)| tests.iter().copied())
        .collect()
}

/// What the checks before the tests found.
#[derive(Debug, Clone, Default)]
pub struct Facts {
    /// The API server's `gitVersion`.
    pub server_version: String,
    /// What it answered a streaming list: `served` or `refused: <why>`.
    pub streaming_lists: String,
}

/// The checks before the tests: the server runs `kubernetes`, accepts every CRD as it is
/// committed, and answers a streaming list one way or the other.
pub fn check_cluster(kubectl: &Kubectl, kubernetes: &Kubernetes) -> Result<Facts> {
    let version: Value = serde_json::from_str(&kubectl.output(["version", "-o", "json"])?)
        .context("reading `kubectl version -o json`")?;
    let server_version = version["serverVersion"]["gitVersion"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    if server_version != kubernetes.version() {
        bail!(
            "the API server says it is {server_version:?}, not {kubernetes}: is KUBECONFIG pointing at another cluster?"
        );
    }
    for operator in deployed_operators() {
        crd_accepted_as_committed(kubectl, operator)
            .with_context(|| format!("Kubernetes {kubernetes} and the CRD of {operator}"))?;
    }
    say!(
        "compat: Kubernetes {kubernetes} accepts every CRD as committed (rules, messages, field paths, reasons)"
    );
    let streaming_lists = streaming_lists(kubectl)?;
    say!("compat: Kubernetes {kubernetes} and streaming lists (WatchList): {streaming_lists}");
    Ok(Facts {
        server_version,
        streaming_lists,
    })
}

/// Every `x-kubernetes-validations` list under `value`, in document order.
fn validations(value: &Value, out: &mut Vec<Value>) {
    match value {
        Value::Object(map) => {
            for (key, inner) in map {
                if key == "x-kubernetes-validations" {
                    out.push(inner.clone());
                } else {
                    validations(inner, out);
                }
            }
        }
        Value::Array(items) => items.iter().for_each(|i| validations(i, out)),
        _ => {}
    }
}

/// Server-side apply of the committed CRD (strict field validation: a field this API server
/// does not know fails the apply instead of being dropped), with no warning, until it is
/// Established; then the stored validation rules must equal the committed ones.
fn crd_accepted_as_committed(kubectl: &Kubectl, operator: &str) -> Result<()> {
    let path = paths::repo_root()
        .join("deploy")
        .join(operator)
        .join("crd.yaml");
    let committed: Value = serde_saphyr::from_str(&std::fs::read_to_string(&path)?)
        .with_context(|| format!("reading {}", path.display()))?;
    let name = committed["metadata"]["name"]
        .as_str()
        .with_context(|| format!("{} has no metadata.name", path.display()))?;
    // The tests install with the field manager `e2e`: the same one, so no conflict later.
    kubectl
        .capture([
            "apply".as_ref(),
            "--server-side".as_ref(),
            "--field-manager=e2e".as_ref(),
            "--validate=strict".as_ref(),
            "-f".as_ref(),
            path.as_os_str(),
        ])?
        .clean(&format!("applying {}", path.display()))?;
    kubectl.output([
        "wait",
        "--for=condition=Established",
        "--timeout=60s",
        &format!("crd/{name}"),
    ])?;
    let stored: Value =
        serde_json::from_str(&kubectl.output(["get", &format!("crd/{name}"), "-o", "json"])?)
            .with_context(|| format!("reading the stored CRD {name}"))?;
    let (mut want, mut got) = (Vec::new(), Vec::new());
    validations(&committed["spec"], &mut want);
    validations(&stored["spec"], &mut got);
    if want.is_empty() {
        bail!(
            "{} has no validation rules: nothing to prove",
            path.display()
        );
    }
    if want != got {
        bail!(
            "the API server stored other validation rules than {} holds:\ncommitted: {}\nstored:    {}",
            path.display(),
            serde_json::to_string(&want).unwrap_or_default(),
            serde_json::to_string(&got).unwrap_or_default()
        );
    }
    Ok(())
}

/// What the API server answers the request kube's watcher makes for a streaming list (of
/// ConfigMaps in `default`, selecting none): `served` when the bookmark ending the initial
/// events comes, else `refused: <the server's answer>`.
fn streaming_lists(kubectl: &Kubectl) -> Result<String> {
    let out = kubectl.capture([
        "get",
        "--raw",
        "/api/v1/namespaces/default/configmaps?watch=true&sendInitialEvents=true\
         &resourceVersionMatch=NotOlderThan&resourceVersion=0&allowWatchBookmarks=true\
         &fieldSelector=metadata.name%3Dcompat~probe&timeoutSeconds=3",
    ])?;
    if out.stdout.contains("k8s.io/initial-events-end") {
        return Ok("served".into());
    }
    let why = if out.stderr.trim().is_empty() {
        "the watch ended without the bookmark that ends a streaming list".to_owned()
    } else {
        out.stderr.trim().to_owned()
    };
    Ok(format!("refused: {why}"))
}

/// What the operators the tests ran decided by themselves (`--streaming-lists=auto`), from
/// their logs of this run (`target/e2e-logs/`): how many processes found streaming lists
/// served, and how many found them refused.
pub fn operators_decided() -> (usize, usize) {
    let Ok(entries) = std::fs::read_dir(paths::target_dir().join("e2e-logs")) else {
        return (0, 0);
    };
    let mut counts = (0, 0);
    for entry in entries.flatten() {
        let log = std::fs::read_to_string(entry.path()).unwrap_or_default();
        if log.contains("the API server serves streaming lists") {
            counts.0 += 1;
        }
        if log.contains("the API server does not serve streaming lists") {
            counts.1 += 1;
        }
    }
    counts
}

/// The outcome of one compatibility run.
#[derive(Debug, Clone)]
pub struct Outcome {
    /// The version the run asked for.
    pub kubernetes: String,
    /// What the checks before the tests found (default when they did not get that far).
    pub facts: Facts,
    /// `None`: everything passed; else the first failure.
    pub failure: Option<String>,
    /// Wall time of the whole run, `12m34s`.
    pub duration: String,
    /// Tests passed and failed.
    pub passed: u64,
    /// Tests failed.
    pub failed: u64,
    /// Tests that could not run here and said so.
    pub skipped: u64,
}

/// The short commit of the checkout, `+dirty` with uncommitted changes.
fn commit() -> String {
    let git = |args: &[&str]| {
        std::process::Command::new("git")
            .current_dir(paths::repo_root())
            .args(args)
            .output()
            .ok()
            .filter(|o| o.status.success())
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
    };
    let head = git(&["rev-parse", "--short=12", "HEAD"]).unwrap_or_else(|| "unknown".into());
    let dirty =
        git(&["status", "--porcelain", "--untracked-files=no"]).is_some_and(|s| !s.is_empty());
    if dirty { format!("{head}+dirty") } else { head }
}

/// Writes `target/compat/<version>.json` and prints the table row; returns the file.
pub fn record(outcome: &Outcome) -> Result<PathBuf> {
    let (served, refused) = operators_decided();
    let result = match &outcome.failure {
        None => format!(
            "pass ({} tests, {} skipped)",
            outcome.passed, outcome.skipped
        ),
        Some(_) => format!(
            "FAIL ({} failed, {} passed)",
            outcome.failed, outcome.passed
        ),
    };
    let streaming = if outcome.facts.streaming_lists.is_empty() {
        "not checked".to_owned()
    } else {
        format!(
            "{}; operators chose streaming {served}x, paged {refused}x",
            outcome.facts.streaming_lists
        )
    };
    let record = json!({
        "kubernetes": outcome.kubernetes,
        "server_version": outcome.facts.server_version,
        "date": xtask::support::cmd::today(),
        "commit": commit(),
        "result": result,
        "failure": outcome.failure,
        "duration": outcome.duration,
        "passed": outcome.passed,
        "failed": outcome.failed,
        "skipped": outcome.skipped,
        "streaming_lists": streaming,
        "tests": tests(),
    });
    let dir = paths::target_dir().join("compat");
    std::fs::create_dir_all(&dir)?;
    let file = dir.join(format!("{}.json", outcome.kubernetes));
    std::fs::write(&file, serde_json::to_string_pretty(&record)?)?;
    say!(
        "compat: record in {}; the row of docs/kubernetes-versions.md:",
        file.display()
    );
    say!(
        "| {} | {} | {} | {} | {} | {} |",
        outcome.kubernetes,
        record["date"].as_str().unwrap_or_default(),
        record["commit"].as_str().unwrap_or_default(),
        result,
        outcome.duration,
        streaming
    );
    Ok(file)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every name in the subset is a test of `tests/tests/`, once: a renamed test would
    /// otherwise silently drop out of the run (an exact filter that matches nothing).
    #[test]
    fn every_test_of_the_subset_exists_once() -> Result<()> {
        let dir = paths::repo_root().join("tests").join("tests");
        let mut sources = String::new();
        for entry in std::fs::read_dir(&dir)? {
            sources.push_str(&std::fs::read_to_string(entry?.path())?);
        }
        let mut seen = std::collections::BTreeSet::new();
        for test in tests() {
            assert!(seen.insert(test), "{test} twice in the subset");
            assert_eq!(
                sources.matches(&format!("async fn {test}()")).count(),
                1,
                "{test} is not one test of {}",
                dir.display()
            );
        }
        Ok(())
    }

    /// Each operator has a test for each point, where the point is per operator.
    #[test]
    fn each_point_covers_every_operator_that_has_it() {
        let short = ["podset", "memcached", "lolcow", "pulsar_consumer"];
        for (point, tests) in SUBSET {
            if point.starts_with("leader election") || point.starts_with("the caches fill") {
                // Shared code (`shared::runner::leader`, `shared::namespaces`), the same in all four.
                continue;
            }
            for op in short {
                assert!(
                    tests.iter().any(|t| t.contains(op)),
                    "{point}: no test of {op}"
                );
            }
        }
    }

    #[test]
    fn validation_rules_are_found_wherever_they_are() {
        let crd = json!({"a": {"x-kubernetes-validations": [{"rule": "r1"}],
            "b": [{"x-kubernetes-validations": [{"rule": "r2", "fieldPath": ".f", "reason": "FieldValueInvalid"}]}]}});
        let mut found = Vec::new();
        validations(&crd, &mut found);
        assert_eq!(found.len(), 2);
        assert!(found.iter().any(|v| v[0]["fieldPath"] == ".f"), "{found:?}");
    }
}
