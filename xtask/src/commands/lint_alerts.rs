//! `cargo xtask lint-alerts` (a static step of `cargo xtask test`): the operators' alerts,
//! each `deploy/<operator>/prometheus/rules.yaml` (a Prometheus Operator PrometheusRule),
//! checked and unit-tested with promtool.
//!
//! For each operator, the PrometheusRule's `spec` (its rule groups) is written as a plain
//! rules file, `target/lint-alerts/<operator>.rules.yaml`, beside a copy of its unit tests
//! `xtask/alerts/<operator>.test.yaml` (kept out of the kustomize folder, which must not
//! read them; their `rule_files` name that file), and then:
//!
//! - `promtool check rules` on the rules file, `promtool test rules` on the tests;
//! - every alert has a `severity` label (`critical`, `warning` or `info`), a `summary`, a
//!   `description` and a `runbook_url` pointing at a heading of docs/observability.md;
//! - every alert is tested at least once firing and once quiet (an `alert_rule_test` with
//!   its name and expected alerts, and one with none);
//! - the chart renders the same rules (`helm template` with `prometheus.enabled=true`,
//!   another release name and namespace): its selectors and texts name the release's
//!   metrics Service and namespace, and nothing else differs.
//!
//! promtool is built once from the Prometheus Go module (`xtask/tools/prometheus/go.mod`
//! pins it) into the cache, as Helm is.

use crate::commands::tool::{self, PROMETHEUS};
use crate::commands::{charts, check_docs, crds};
use anyhow::{Context, Result, bail};
use serde_json::Value;
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;
use xtask::say;
use xtask::support::{cmd, kustomize, paths};

/// Where each runbook is: a heading of this file per alert.
const RUNBOOKS: &str = "docs/observability.md";
/// What every `runbook_url` starts with (the file above on the main branch).
const RUNBOOK_URL: &str =
    "https://github.com/rust-operators/rust-operators/blob/main/docs/observability.md#";
/// The severities an alert may carry.
const SEVERITIES: [&str; 3] = ["critical", "warning", "info"];
/// The release and namespace the chart is rendered with for the comparison.
const RELEASE: &str = "alerts-check";
const RELEASE_NAMESPACE: &str = "alerts-check-ns";

/// `cargo xtask lint-alerts`.
///
/// # Errors
/// When promtool rejects a rules file or a test fails, an alert lacks a label, an
/// annotation, a runbook or a test, or the chart renders other rules (each is printed,
/// naming its file and alert), or promtool or Helm cannot be built.
pub fn run() -> Result<()> {
    let start = Instant::now();
    PROMETHEUS.ensure_built()?;
    let promtool = PROMETHEUS.binary("promtool")?;
    let helm = tool::helm()?;
    let work = paths::target_dir().join("lint-alerts");
    if work.exists() {
        std::fs::remove_dir_all(&work)?;
    }
    std::fs::create_dir_all(&work)?;
    let runbooks = paths::repo_root().join(RUNBOOKS);
    let anchors: BTreeSet<String> = check_docs::heading_anchors(
        &std::fs::read_to_string(&runbooks)
            .with_context(|| format!("reading {}", runbooks.display()))?,
    )
    .into_iter()
    .collect();
    let mut problems = Vec::new();
    let mut alerts = 0;
    let operators = crds::deployed_operators();
    for &op in &operators {
        match lint(op, &promtool, &helm, &work, &anchors, &mut problems) {
            Ok(count) => alerts += count,
            Err(e) => problems.push(format!("{op}: {e:#}")),
        }
    }
    for stray in stray_tests(&operators)? {
        problems.push(format!(
            "{stray}: tests no operator's rules (xtask/alerts/<operator>.test.yaml)"
        ));
    }
    if !problems.is_empty() {
        bail!(
            "the alerts have {} problem(s):\n  {}",
            problems.len(),
            problems.join("\n  ")
        );
    }
    say!(
        "lint-alerts: promtool {} checked and tested {alerts} alerts of {} operators (the charts \
         render the same) in {}",
        PROMETHEUS.version()?,
        operators.len(),
        cmd::elapsed(start)
    );
    Ok(())
}

/// The rules of `op`: checked, tested, compared with its chart's; returns how many alerts.
fn lint(
    op: &str,
    promtool: &Path,
    helm: &Path,
    work: &Path,
    anchors: &BTreeSet<String>,
    problems: &mut Vec<String>,
) -> Result<usize> {
    let shown = format!("deploy/{op}/prometheus/rules.yaml");
    let spec = rule_spec(&paths::repo_root().join(&shown)).with_context(|| shown.clone())?;
    let names = alert_names(&spec);
    if names.is_empty() {
        problems.push(format!("{shown}: no alert"));
    }
    for problem in alert_problems(&spec, anchors) {
        problems.push(format!("{shown}: {problem}"));
    }
    let rules_file = format!("{op}.rules.yaml");
    std::fs::write(work.join(&rules_file), serde_saphyr::to_string(&spec)?)?;
    if let Err(e) = promtool_run(promtool, work, &["check", "rules", &rules_file]) {
        problems.push(format!("{shown}: promtool check rules: {e:#}"));
    }

    let tests_shown = format!("xtask/alerts/{op}.test.yaml");
    let tests_path = paths::repo_root().join(&tests_shown);
    let text = std::fs::read_to_string(&tests_path).with_context(|| {
        format!("reading {tests_shown} (the unit tests of {shown}): write it, every alert firing once and quiet once")
    })?;
    let tests: Value = serde_saphyr::from_str(&text).with_context(|| tests_shown.clone())?;
    if tests["rule_files"] != serde_json::json!([rules_file]) {
        problems.push(format!(
            "{tests_shown}: rule_files must be [{rules_file}] (the rules extracted beside it)"
        ));
    }
    for problem in coverage_problems(&names, &tests) {
        problems.push(format!("{tests_shown}: {problem}"));
    }
    let tests_file = format!("{op}.test.yaml");
    std::fs::write(work.join(&tests_file), &text)?;
    if let Err(e) = promtool_run(promtool, work, &["test", "rules", &tests_file]) {
        problems.push(format!("{tests_shown}: promtool test rules: {e:#}"));
    }

    let chart = chart_spec(helm, op).with_context(|| format!("rendering deploy/{op}/chart"))?;
    let want = released(&spec, op);
    if chart != want {
        problems.push(format!(
            "deploy/{op}/chart renders other rules than {shown} (release {RELEASE} in \
             {RELEASE_NAMESPACE}): {}; run `cargo xtask charts`",
            differences(&want, &chart)
        ));
    }
    Ok(names.len())
}

/// The `spec` of the one PrometheusRule in `path`.
fn rule_spec(path: &Path) -> Result<Value> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let rules: Vec<Value> = kustomize::documents(&text)?
        .into_iter()
        .filter(|d| d["kind"] == "PrometheusRule")
        .collect();
    match rules.as_slice() {
        [rule] if rule["spec"]["groups"].is_array() => Ok(rule["spec"].clone()),
        [_] => bail!("the PrometheusRule has no spec.groups"),
        _ => bail!("{} PrometheusRules; one is expected", rules.len()),
    }
}

/// Every alerting rule of `spec`, in order.
fn alert_rules(spec: &Value) -> impl Iterator<Item = &Value> {
    spec["groups"]
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|g| g["rules"].as_array().into_iter().flatten())
        .filter(|r| r.get("alert").is_some())
}

/// The alerts' names, each once.
fn alert_names(spec: &Value) -> BTreeSet<String> {
    alert_rules(spec)
        .filter_map(|r| r["alert"].as_str().map(str::to_owned))
        .collect()
}

/// What an alert lacks: its severity, its texts, its runbook.
fn alert_problems(spec: &Value, anchors: &BTreeSet<String>) -> Vec<String> {
    let mut out = Vec::new();
    for rule in alert_rules(spec) {
        let name = rule["alert"].as_str().unwrap_or("?");
        let severity = rule["labels"]["severity"].as_str().unwrap_or_default();
        if !SEVERITIES.contains(&severity) {
            out.push(format!(
                "{name}: labels.severity is {severity:?}; one of {SEVERITIES:?}"
            ));
        }
        for key in ["summary", "description", "runbook_url"] {
            if rule["annotations"][key]
                .as_str()
                .is_none_or(|t| t.trim().is_empty())
            {
                out.push(format!("{name}: no annotations.{key}"));
            }
        }
        if let Some(url) = rule["annotations"]["runbook_url"].as_str() {
            match url.strip_prefix(RUNBOOK_URL) {
                Some(anchor) if anchors.contains(anchor) => {}
                Some(anchor) => out.push(format!(
                    "{name}: runbook_url names #{anchor}, which is no heading of {RUNBOOKS}: \
                     add its runbook there"
                )),
                None => out.push(format!(
                    "{name}: runbook_url {url:?} does not start with {RUNBOOK_URL}"
                )),
            }
        }
    }
    out
}

/// Alerts not tested firing, or not tested quiet, and tests of alerts that do not exist.
fn coverage_problems(names: &BTreeSet<String>, tests: &Value) -> Vec<String> {
    let mut firing = BTreeSet::new();
    let mut quiet = BTreeSet::new();
    for case in tests["tests"].as_array().into_iter().flatten() {
        for check in case["alert_rule_test"].as_array().into_iter().flatten() {
            let name = check["alertname"].as_str().unwrap_or_default().to_owned();
            if check["exp_alerts"]
                .as_array()
                .is_some_and(|a| !a.is_empty())
            {
                firing.insert(name);
            } else {
                quiet.insert(name);
            }
        }
    }
    let mut out = Vec::new();
    for name in names {
        if !firing.contains(name) {
            out.push(format!("{name} is never tested firing"));
        }
        if !quiet.contains(name) {
            out.push(format!(
                "{name} is never tested quiet (exp_alerts: [] in a healthy case)"
            ));
        }
    }
    for name in firing.union(&quiet) {
        if !names.contains(name) {
            out.push(format!("tests {name}, which is no alert of the rules"));
        }
    }
    out
}

/// Runs promtool in `dir` (where the rules and tests files are); its output is the error.
fn promtool_run(promtool: &Path, dir: &Path, args: &[&str]) -> Result<()> {
    let out = Command::new(promtool)
        .current_dir(dir)
        .args(args)
        .output()
        .with_context(|| format!("could not start {}", promtool.display()))?;
    if out.status.success() {
        return Ok(());
    }
    bail!(
        "{}\n{}",
        String::from_utf8_lossy(&out.stdout).trim(),
        String::from_utf8_lossy(&out.stderr).trim()
    )
}

/// The spec of the PrometheusRule the chart of `op` renders with `prometheus.enabled=true`
/// as the release [`RELEASE`] in [`RELEASE_NAMESPACE`].
fn chart_spec(helm: &Path, op: &str) -> Result<Value> {
    let text = cmd::output(
        Command::new(helm)
            .args(["template", RELEASE])
            .arg(charts::chart_dir(op))
            .args(["--namespace", RELEASE_NAMESPACE])
            .args(["--set", "prometheus.enabled=true"]),
    )?;
    let rules: Vec<Value> = kustomize::documents(&text)?
        .into_iter()
        .filter(|d| d["kind"] == "PrometheusRule")
        .collect();
    match rules.as_slice() {
        [rule] => Ok(rule["spec"].clone()),
        _ => bail!(
            "{} PrometheusRules with prometheus.enabled=true; one is expected",
            rules.len()
        ),
    }
}

/// `spec` as the chart should render it for [`RELEASE`] in [`RELEASE_NAMESPACE`]: the
/// metrics Service and the namespace are the release's.
fn released(spec: &Value, op: &str) -> Value {
    let service = format!("{op}-metrics");
    let namespace = format!("{op}-system");
    match spec {
        Value::String(text) => Value::String(
            text.replace(&service, &format!("{RELEASE}-{service}"))
                .replace(&namespace, RELEASE_NAMESPACE),
        ),
        Value::Array(items) => Value::Array(items.iter().map(|v| released(v, op)).collect()),
        Value::Object(map) => Value::Object(
            map.iter()
                .map(|(k, v)| (k.clone(), released(v, op)))
                .collect(),
        ),
        other => other.clone(),
    }
}

/// Which rules differ between two specs, by name (the first one's two versions shown).
fn differences(want: &Value, got: &Value) -> String {
    let rules = |spec: &Value| -> Vec<Value> {
        spec["groups"]
            .as_array()
            .into_iter()
            .flatten()
            .flat_map(|g| g["rules"].as_array().cloned().unwrap_or_default())
            .collect()
    };
    let name = |rule: &Value| {
        rule["alert"]
            .as_str()
            .or(rule["record"].as_str())
            .unwrap_or("?")
            .to_owned()
    };
    let (want, got) = (rules(want), rules(got));
    let differing: Vec<(&Value, Option<&Value>)> = want
        .iter()
        .filter_map(|w| {
            let g = got.iter().find(|g| name(g) == name(w));
            (g != Some(w)).then_some((w, g))
        })
        .collect();
    let mut out: Vec<String> = differing.iter().map(|(w, _)| name(w)).collect();
    out.extend(
        got.iter()
            .filter(|g| !want.iter().any(|w| name(w) == name(g)))
            .map(|g| format!("{} (only in the chart)", name(g))),
    );
    if out.is_empty() {
        // Same rules, other groups or order.
        return "the groups differ".to_owned();
    }
    let verb = if out.len() == 1 { "differs" } else { "differ" };
    let mut text = format!("{} {verb}", out.join(", "));
    if let Some((w, g)) = differing.first() {
        text.push_str(&format!(
            "; {} wanted {}, the chart has {}",
            name(w),
            serde_json::to_string(w).unwrap_or_default(),
            g.map_or_else(
                || "none".to_owned(),
                |g| serde_json::to_string(g).unwrap_or_default()
            )
        ));
    }
    text
}

/// Test files under `xtask/alerts/` of no operator.
fn stray_tests(operators: &[&str]) -> Result<Vec<String>> {
    let dir: PathBuf = paths::repo_root().join("xtask").join("alerts");
    let mut out = Vec::new();
    for entry in std::fs::read_dir(&dir).with_context(|| format!("reading {}", dir.display()))? {
        let name = entry?.file_name().to_string_lossy().into_owned();
        let op = name.strip_suffix(".test.yaml");
        if !op.is_some_and(|op| operators.contains(&op)) {
            out.push(format!("xtask/alerts/{name}"));
        }
    }
    out.sort();
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn spec(rule: Value) -> Value {
        json!({"groups": [{"name": "g", "rules": [{"record": "r", "expr": "1"}, rule]}]})
    }

    #[test]
    fn every_alert_needs_severity_texts_and_a_runbook() {
        let anchors: BTreeSet<String> = ["a".to_owned()].into();
        let good = json!({"alert": "A", "expr": "1", "labels": {"severity": "warning"},
            "annotations": {"summary": "s", "description": "d", "runbook_url": format!("{RUNBOOK_URL}a")}});
        assert!(alert_problems(&spec(good), &anchors).is_empty());
        let bad = json!({"alert": "B", "expr": "1", "labels": {"severity": "page"},
            "annotations": {"summary": " ", "runbook_url": format!("{RUNBOOK_URL}b")}});
        let problems = alert_problems(&spec(bad), &anchors).join("\n");
        for wanted in [
            "B: labels.severity is \"page\"",
            "B: no annotations.summary",
            "B: no annotations.description",
            "B: runbook_url names #b, which is no heading",
        ] {
            assert!(problems.contains(wanted), "{wanted}: {problems}");
        }
    }

    #[test]
    fn every_alert_is_tested_firing_and_quiet() {
        let names: BTreeSet<String> = ["A".to_owned(), "B".to_owned()].into();
        let tests = json!({"tests": [
            {"alert_rule_test": [
                {"alertname": "A", "exp_alerts": [{"exp_labels": {}}]},
                {"alertname": "A", "exp_alerts": []},
                {"alertname": "B"},
                {"alertname": "C", "exp_alerts": []},
            ]},
        ]});
        assert_eq!(
            coverage_problems(&names, &tests),
            [
                "B is never tested firing",
                "tests C, which is no alert of the rules"
            ]
        );
    }

    #[test]
    fn the_chart_renders_the_release_service_and_namespace() {
        let spec = json!({"groups": [{"rules": [{"expr":
            "up{job=\"op-metrics\", namespace=\"op-system\"}", "labels": {"operator": "op"}}]}]});
        assert_eq!(
            released(&spec, "op"),
            json!({"groups": [{"rules": [{"expr":
                format!("up{{job=\"{RELEASE}-op-metrics\", namespace=\"{RELEASE_NAMESPACE}\"}}"),
                "labels": {"operator": "op"}}]}]})
        );
    }

    #[test]
    fn the_committed_rules_name_their_runbooks_and_tests() {
        let runbooks = std::fs::read_to_string(paths::repo_root().join(RUNBOOKS)).unwrap();
        let anchors: BTreeSet<String> =
            check_docs::heading_anchors(&runbooks).into_iter().collect();
        for op in crds::deployed_operators() {
            let spec = rule_spec(
                &paths::repo_root()
                    .join("deploy")
                    .join(op)
                    .join("prometheus")
                    .join("rules.yaml"),
            )
            .unwrap();
            assert_eq!(
                alert_problems(&spec, &anchors),
                Vec::<String>::new(),
                "{op}"
            );
            let tests: Value = serde_saphyr::from_str(
                &std::fs::read_to_string(
                    paths::repo_root()
                        .join("xtask")
                        .join("alerts")
                        .join(format!("{op}.test.yaml")),
                )
                .unwrap(),
            )
            .unwrap();
            assert_eq!(
                coverage_problems(&alert_names(&spec), &tests),
                Vec::<String>::new(),
                "{op}"
            );
        }
    }
}
