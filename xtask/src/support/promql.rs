//! The metric names a Grafana dashboard's queries read, and the names an operator's
//! `/metrics` text exposes, so a test can check that every panel has data to show.
//!
//! [`metric_names`] is a small PromQL lexer, not a parser: it drops what cannot name a
//! metric (string literals, label matchers `{...}`, ranges and subqueries `[...]`, the
//! label lists of `by`/`without`/`on`/`ignoring`/`group_left`/`group_right`, Grafana
//! variables, numbers and durations, keywords), then keeps each identifier that is not
//! called as a function. [`exposed_names`] reads the text format the way Prometheus
//! stores it: a counter family `x` is the series `x_total`, a histogram `h` is
//! `h_bucket`, `h_sum` and `h_count` (never `h` itself), so a query of a histogram's bare
//! name or a counter without `_total` is reported missing, as it would show nothing.

use serde_json::Value;
use std::collections::BTreeSet;

/// Words of PromQL that are not metric names where they stand alone.
const KEYWORDS: [&str; 13] = [
    "by",
    "without",
    "on",
    "ignoring",
    "group_left",
    "group_right",
    "bool",
    "and",
    "or",
    "unless",
    "offset",
    "inf",
    "nan",
];

/// Keywords followed by a parenthesised list of label names.
const LABEL_LISTS: [&str; 6] = [
    "by",
    "without",
    "on",
    "ignoring",
    "group_left",
    "group_right",
];

fn is_ident_start(c: char) -> bool {
    c.is_ascii_alphabetic() || c == '_' || c == ':'
}

fn is_ident(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_' || c == ':'
}

/// The metric names `expr` (PromQL, with Grafana's `$variables`) reads.
pub fn metric_names(expr: &str) -> BTreeSet<String> {
    let chars: Vec<char> = expr.chars().collect();
    let mut names = BTreeSet::new();
    let mut i = 0;
    // An identifier waits here until what follows it is known (a `(` makes it a function).
    let mut pending: Option<String> = None;
    while i < chars.len() {
        let c = chars[i];
        match c {
            '"' | '\'' | '`' => {
                take_pending(&mut pending, &mut names);
                i = skip_string(&chars, i);
            }
            '{' => {
                // A label matcher belongs to the metric before it: the name stays pending
                // (a function is never followed by `{`).
                i = skip_block(&chars, i, '{', '}');
            }
            '[' => {
                i = skip_block(&chars, i, '[', ']');
            }
            '(' => {
                // The pending identifier is a function or aggregation: not a metric.
                pending = None;
                i += 1;
            }
            '$' => {
                take_pending(&mut pending, &mut names);
                i += 1;
                if chars.get(i) == Some(&'{') {
                    i = skip_block(&chars, i, '{', '}');
                } else {
                    while i < chars.len() && is_ident(chars[i]) {
                        i += 1;
                    }
                }
            }
            '#' => {
                // A comment runs to the end of the line.
                take_pending(&mut pending, &mut names);
                while i < chars.len() && chars[i] != '\n' {
                    i += 1;
                }
            }
            c if c.is_ascii_digit()
                || (c == '.' && chars.get(i + 1).is_some_and(char::is_ascii_digit)) =>
            {
                take_pending(&mut pending, &mut names);
                // A number or a duration (1e3, 0x1F, 5m30s): letters included.
                while i < chars.len() && (chars[i].is_ascii_alphanumeric() || chars[i] == '.') {
                    i += 1;
                }
            }
            c if is_ident_start(c) => {
                let start = i;
                while i < chars.len() && is_ident(chars[i]) {
                    i += 1;
                }
                let word: String = chars[start..i].iter().collect();
                if LABEL_LISTS.contains(&word.to_ascii_lowercase().as_str()) {
                    // Its label list, if any, names labels, not metrics; what is pending
                    // stays so (`sum by (le) (...)`: `sum` is still followed by `(`).
                    let mut j = i;
                    while j < chars.len() && chars[j].is_whitespace() {
                        j += 1;
                    }
                    if chars.get(j) == Some(&'(') {
                        i = skip_block(&chars, j, '(', ')');
                    }
                } else {
                    take_pending(&mut pending, &mut names);
                    pending = Some(word);
                }
            }
            c if c.is_whitespace() => i += 1,
            _ => {
                take_pending(&mut pending, &mut names);
                i += 1;
            }
        }
    }
    take_pending(&mut pending, &mut names);
    names
}

/// Keeps the identifier waiting in `pending` as a metric name, unless it is a keyword.
fn take_pending(pending: &mut Option<String>, names: &mut BTreeSet<String>) {
    if let Some(word) = pending.take()
        && !KEYWORDS.contains(&word.to_ascii_lowercase().as_str())
    {
        names.insert(word);
    }
}

/// The index after the string literal starting at `start` (backslash escapes, except in
/// raw back-quoted strings).
fn skip_string(chars: &[char], start: usize) -> usize {
    let quote = chars[start];
    let mut i = start + 1;
    while i < chars.len() {
        if chars[i] == '\\' && quote != '`' {
            i += 2;
            continue;
        }
        if chars[i] == quote {
            return i + 1;
        }
        i += 1;
    }
    i
}

/// The index after the block opened at `start`, nested blocks and strings included.
fn skip_block(chars: &[char], start: usize, open: char, close: char) -> usize {
    let mut depth = 0;
    let mut i = start;
    while i < chars.len() {
        let c = chars[i];
        if c == '"' || c == '\'' || c == '`' {
            i = skip_string(chars, i);
            continue;
        }
        if c == open {
            depth += 1;
        } else if c == close {
            depth -= 1;
            if depth == 0 {
                return i + 1;
            }
        }
        i += 1;
    }
    i
}

/// Every query of a Grafana dashboard: each panel's (and nested row's) `targets[].expr`,
/// and each query variable's PromQL (`label_values(<selector>, label)` gives its
/// selector; `query_result(<expr>)` its expression).
pub fn dashboard_queries(dashboard: &Value) -> Vec<String> {
    let mut out = Vec::new();
    fn panels(panel: &Value, out: &mut Vec<String>) {
        for target in panel["targets"].as_array().into_iter().flatten() {
            if let Some(expr) = target["expr"].as_str() {
                out.push(expr.to_owned());
            }
        }
        for inner in panel["panels"].as_array().into_iter().flatten() {
            panels(inner, out);
        }
    }
    for panel in dashboard["panels"].as_array().into_iter().flatten() {
        panels(panel, &mut out);
    }
    for variable in dashboard["templating"]["list"]
        .as_array()
        .into_iter()
        .flatten()
    {
        if variable["type"] != "query" {
            continue;
        }
        let query = match &variable["query"] {
            Value::String(q) => q.clone(),
            object => object["query"].as_str().unwrap_or_default().to_owned(),
        };
        if let Some(expr) = variable_expr(&query) {
            out.push(expr);
        }
    }
    out
}

/// The PromQL inside a Grafana query variable: `label_values(<selector>, <label>)` gives
/// `<selector>` (none with only a label), `query_result(<expr>)` gives `<expr>`.
fn variable_expr(query: &str) -> Option<String> {
    let query = query.trim();
    if let Some(inner) = query
        .strip_prefix("label_values(")
        .and_then(|r| r.strip_suffix(')'))
    {
        let chars: Vec<char> = inner.chars().collect();
        // The last top-level comma separates the label.
        let mut depth = 0;
        let mut i = 0;
        let mut last_comma = None;
        while i < chars.len() {
            match chars[i] {
                '"' | '\'' | '`' => {
                    i = skip_string(&chars, i);
                    continue;
                }
                '{' | '(' | '[' => depth += 1,
                '}' | ')' | ']' => depth -= 1,
                ',' if depth == 0 => last_comma = Some(i),
                _ => {}
            }
            i += 1;
        }
        return last_comma.map(|at| chars[..at].iter().collect());
    }
    query
        .strip_prefix("query_result(")
        .and_then(|r| r.strip_suffix(')'))
        .map(str::to_owned)
}

/// The series names a `/metrics` text (Prometheus or OpenMetrics format) exposes: each
/// sample's name, and each declared family's series names even without a sample (a
/// counter `x`: `x_total`; a histogram or summary `h`: `h_bucket`/`h_sum`/`h_count`,
/// `h` as a summary's quantiles; anything else: its own name).
pub fn exposed_names(text: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let mut words = rest.split_whitespace();
            let (Some(name), Some(kind)) = (words.next(), words.next()) else {
                continue;
            };
            match kind {
                "counter" => {
                    let base = name.strip_suffix("_total").unwrap_or(name);
                    names.insert(format!("{base}_total"));
                }
                "histogram" | "gaugehistogram" => {
                    for suffix in ["_bucket", "_sum", "_count"] {
                        names.insert(format!("{name}{suffix}"));
                    }
                }
                "summary" => {
                    names.insert(name.to_owned());
                    for suffix in ["_sum", "_count"] {
                        names.insert(format!("{name}{suffix}"));
                    }
                }
                _ => {
                    names.insert(name.to_owned());
                }
            }
        } else if !line.starts_with('#') && !line.trim().is_empty() {
            let end = line
                .find(|c: char| c == '{' || c.is_whitespace())
                .unwrap_or(line.len());
            names.insert(line[..end].to_owned());
        }
    }
    names
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn names(expr: &str) -> Vec<String> {
        metric_names(expr).into_iter().collect()
    }

    #[test]
    fn functions_matchers_and_clauses_are_not_metrics() {
        assert_eq!(
            names(
                r#"histogram_quantile(0.99, sum by (controller, le) (rate(controller_runtime_reconcile_time_seconds_bucket{namespace=~"$namespace", controller=~"$controller"}[$__rate_interval])))"#
            ),
            ["controller_runtime_reconcile_time_seconds_bucket"]
        );
        assert_eq!(
            names(
                "sum(rate(a_sum[5m])) without (pod) / ignoring(le) group_left(x) sum(rate(a_count[5m] offset 1h))"
            ),
            ["a_count", "a_sum"]
        );
        assert_eq!(
            names(
                r#"label_replace(up{job="x"}, "dst", "$1", "src", "(.*)") > bool 0 and on(instance) process_open_fds"#
            ),
            ["process_open_fds", "up"]
        );
        assert_eq!(
            names("max_over_time(workqueue_depth[1h:5m]) * 1e3 + .5 or vector(0)"),
            ["workqueue_depth"]
        );
        // Aggregations whose clause comes first, and Grafana's ${var} form.
        assert_eq!(
            names(r#"sum without (instance) (rate(x_total{a="${v}"}[${__interval}]))"#),
            ["x_total"]
        );
        assert_eq!(
            names("leader_election_master_status"),
            ["leader_election_master_status"]
        );
        assert_eq!(names(r#"count_values("v", build_info)"#), ["build_info"]);
    }

    #[test]
    fn dashboards_give_panel_and_variable_queries() {
        let dashboard = json!({
            "panels": [
                {"type": "row", "panels": [{"targets": [{"expr": "a"}]}]},
                {"targets": [{"expr": "b"}, {"refId": "no expr"}]}
            ],
            "templating": {"list": [
                {"type": "datasource", "query": "prometheus"},
                {"type": "query", "query": {"query": "label_values(c{x=\"a,b\"}, namespace)"}},
                {"type": "query", "query": "label_values(namespace)"},
                {"type": "query", "query": "query_result(topk(3, d))"}
            ]}
        });
        assert_eq!(
            dashboard_queries(&dashboard),
            ["a", "b", "c{x=\"a,b\"}", "topk(3, d)"]
        );
    }

    #[test]
    fn exposed_names_follow_the_series_prometheus_stores() {
        let text = "# HELP r Reconciles.\n# TYPE r counter\nr_total{c=\"x\"} 1\n\
                    # TYPE h histogram\n\
                    # TYPE g gauge\n\
                    # TYPE empty gauge\n\
                    g 3\nplain 1 1700000000\n# EOF\n";
        let exposed = exposed_names(text);
        for name in [
            "r_total", "h_bucket", "h_sum", "h_count", "g", "empty", "plain",
        ] {
            assert!(exposed.contains(name), "{name} in {exposed:?}");
        }
        for name in ["r", "h"] {
            assert!(!exposed.contains(name), "{name} in {exposed:?}");
        }
    }

    /// The committed dashboards: each parses, has its own uid, reads a Prometheus data
    /// source chosen by the `datasource` variable, every panel has queries and every query
    /// names a metric; the kustomization that makes them ConfigMaps lists every one. (That
    /// the metrics exist is the end-to-end test `dashboards.rs`.)
    #[test]
    fn the_committed_dashboards_are_well_formed() {
        let dir = crate::support::paths::repo_root()
            .join("deploy")
            .join("dashboards");
        let kustomization = std::fs::read_to_string(dir.join("kustomization.yaml")).unwrap();
        let mut uids = BTreeSet::new();
        let mut files: Vec<_> = std::fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| p.extension().is_some_and(|e| e == "json"))
            .collect();
        files.sort();
        assert!(files.len() >= 2, "{files:?}");
        for path in files {
            let file = path.file_name().unwrap().to_string_lossy().into_owned();
            let d: Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap())
                .unwrap_or_else(|e| panic!("{file}: {e}"));
            assert!(
                kustomization.contains(&format!("- {file}")),
                "{file} not in kustomization.yaml"
            );
            assert!(
                uids.insert(d["uid"].as_str().unwrap().to_owned()),
                "{file}: uid taken"
            );
            let vars = d["templating"]["list"].as_array().unwrap();
            assert!(
                vars.iter().any(|v| v["name"] == "datasource"
                    && v["type"] == "datasource"
                    && v["query"] == "prometheus"),
                "{file}: no Prometheus datasource variable"
            );
            let mut ids = BTreeSet::new();
            for panel in d["panels"].as_array().unwrap() {
                assert!(
                    ids.insert(panel["id"].as_u64().unwrap()),
                    "{file}: panel id taken"
                );
                if panel["type"] == "row" {
                    continue;
                }
                let title = panel["title"].as_str().unwrap();
                assert_eq!(
                    panel["datasource"]["uid"], "${datasource}",
                    "{file}: {title}"
                );
                let targets = panel["targets"].as_array().unwrap();
                assert!(!targets.is_empty(), "{file}: {title} has no query");
                for t in targets {
                    let expr = t["expr"].as_str().unwrap();
                    assert!(!metric_names(expr).is_empty(), "{file}: {title}: {expr}");
                }
            }
            for query in dashboard_queries(&d) {
                assert!(!metric_names(&query).is_empty(), "{file}: {query}");
            }
        }
    }
}
