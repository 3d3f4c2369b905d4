//! API requests an operator made, counted at the client.
//!
//! The API server's `apiserver_request_total` has no label naming the client
//! (its labels are verb, group, version, resource, subresource, scope,
//! component and code; `component` is the API server's own), the local
//! cluster runs without an audit log, and other tests share the cluster. So
//! the operator reports its own requests: its client wraps every HTTP request
//! in a `DEBUG` span (`http.method`, `http.url`) and logs `requesting` inside
//! it (target `shared::runner::client`; `kube_client::client::builder` where kube's own
//! transport is used, through a proxy or with an `exec` plugin). The bench
//! enables just those targets, and reads one JSON log line per request.
//! Retries and watch re-connects each count as a request, as the API server
//! would count them.

use serde_json::Value;
use std::collections::BTreeMap;

/// The `RUST_LOG` that adds one line per API request to the usual `info`.
pub const RUST_LOG: &str = "info,shared::runner::client=debug,kube_client::client::builder=debug";

/// One API request: the Kubernetes verb and the resource (`pods`,
/// `podsets/status`, `events`...).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Request {
    /// get, list, watch, create, update, patch, delete or deletecollection.
    pub verb: &'static str,
    /// The resource, with `/<subresource>` when there is one.
    pub resource: String,
    /// The API group (`""` for the core group).
    pub group: String,
}

impl Request {
    /// The resource as RBAC and `kubectl auth can-i --list` name it:
    /// `resource[.group][/subresource]` (`pods`, `deployments.apps`,
    /// `podsets.batch.tutorial.kubebuilder.io/status`).
    #[must_use]
    pub fn rbac_resource(&self) -> String {
        let (resource, sub) = match self.resource.split_once('/') {
            Some((r, s)) => (r, Some(s)),
            None => (self.resource.as_str(), None),
        };
        let mut key = resource.to_owned();
        if !self.group.is_empty() {
            key = format!("{key}.{}", self.group);
        }
        if let Some(sub) = sub {
            key = format!("{key}/{sub}");
        }
        key
    }
}

/// Whether a verb writes.
pub fn is_write(verb: &str) -> bool {
    matches!(
        verb,
        "create" | "update" | "patch" | "delete" | "deletecollection"
    )
}

/// The request a log line records, if it records one.
pub fn parse_line(line: &str) -> Option<Request> {
    if !line.contains("\"requesting\"") {
        return None;
    }
    let v: Value = serde_json::from_str(line).ok()?;
    if v["message"] != "requesting" && v["fields"]["message"] != "requesting" {
        return None;
    }
    let span = &v["span"];
    classify(span["http.method"].as_str()?, span["http.url"].as_str()?)
}

/// Requests in a stretch of log, by `"<verb> <resource>"`.
pub fn count(log: &str) -> BTreeMap<String, u64> {
    let mut counts = BTreeMap::new();
    for request in log.lines().filter_map(parse_line) {
        *counts
            .entry(format!("{} {}", request.verb, request.resource))
            .or_insert(0) += 1;
    }
    counts
}

/// The total of a count, and of its writes.
pub fn totals(counts: &BTreeMap<String, u64>) -> (u64, u64) {
    let all = counts.values().sum();
    let writes = counts
        .iter()
        .filter(|(k, _)| k.split(' ').next().is_some_and(is_write))
        .map(|(_, v)| v)
        .sum();
    (all, writes)
}

/// The Kubernetes verb and resource of an HTTP method and URL (absolute or
/// just the path).
pub fn classify(method: &str, url: &str) -> Option<Request> {
    let path_start = url.find("/api")?;
    let (path, query) = url[path_start..]
        .split_once('?')
        .unwrap_or((&url[path_start..], ""));
    let segments: Vec<&str> = path.split('/').filter(|s| !s.is_empty()).collect();
    let (group, rest) = match *segments.first()? {
        "api" => ("", segments.get(2..)?),
        "apis" => (*segments.get(1)?, segments.get(3..)?),
        _ => return None,
    };
    // `namespaces/<ns>/<resource>...`, unless the namespace itself is the object.
    let rest = match rest {
        ["namespaces", _, resource, more @ ..] => {
            let mut r = vec![*resource];
            r.extend(more);
            r
        }
        other => other.to_vec(),
    };
    let resource = *rest.first()?;
    let named = rest.len() >= 2;
    let resource = match rest.get(2) {
        Some(sub) => format!("{resource}/{sub}"),
        None => resource.to_owned(),
    };
    let watch = query
        .split('&')
        .any(|kv| kv == "watch=true" || kv == "watch=1");
    let verb = match (method, named) {
        ("GET", _) if watch => "watch",
        ("GET", true) => "get",
        ("GET", false) => "list",
        ("POST", _) => "create",
        ("PUT", _) => "update",
        ("PATCH", _) => "patch",
        ("DELETE", true) => "delete",
        ("DELETE", false) => "deletecollection",
        _ => return None,
    };
    Some(Request {
        verb,
        resource,
        group: group.to_owned(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn c(method: &str, url: &str) -> Option<(&'static str, String)> {
        classify(method, url).map(|r| (r.verb, r.resource))
    }

    #[test]
    fn verbs_and_resources() {
        assert_eq!(
            c(
                "GET",
                "https://127.0.0.1:16443/api/v1/namespaces/b/pods?&watch=true&timeoutSeconds=290"
            ),
            Some(("watch", "pods".into()))
        );
        assert_eq!(
            c("GET", "/api/v1/namespaces/b/pods?&limit=500"),
            Some(("list", "pods".into()))
        );
        assert_eq!(
            c("GET", "/apis/apps/v1/namespaces/b/deployments/x"),
            Some(("get", "deployments".into()))
        );
        assert_eq!(
            c("POST", "/api/v1/namespaces/b/pods?&fieldManager=op"),
            Some(("create", "pods".into()))
        );
        assert_eq!(
            c(
                "PATCH",
                "/apis/batch.tutorial.kubebuilder.io/v1/namespaces/b/podsets/p/status?&fieldManager=op"
            ),
            Some(("patch", "podsets/status".into()))
        );
        assert_eq!(
            c("DELETE", "/api/v1/namespaces/b/pods/p-1"),
            Some(("delete", "pods".into()))
        );
        assert_eq!(
            c("GET", "/apis/example.com/v1/widgets?&limit=1"),
            Some(("list", "widgets".into()))
        );
        assert_eq!(c("GET", "/healthz"), None);
    }

    #[test]
    fn rbac_names() {
        let name = |method: &str, url: &str| classify(method, url).map(|r| r.rbac_resource());
        assert_eq!(
            name("GET", "/api/v1/namespaces/b/pods?&limit=500"),
            Some("pods".into())
        );
        assert_eq!(
            name("PATCH", "/apis/apps/v1/namespaces/b/deployments/d"),
            Some("deployments.apps".into())
        );
        assert_eq!(
            name(
                "PATCH",
                "/apis/batch.tutorial.kubebuilder.io/v1/namespaces/b/podsets/p/status"
            ),
            Some("podsets.batch.tutorial.kubebuilder.io/status".into())
        );
        assert_eq!(
            name("POST", "/apis/authentication.k8s.io/v1/tokenreviews"),
            Some("tokenreviews.authentication.k8s.io".into())
        );
    }

    #[test]
    fn log_lines() {
        let line = r#"{"timestamp":"2026-01-01T00:00:00.1Z","level":"DEBUG","message":"requesting","target":"kube_client::client::builder","span":{"http.method":"PATCH","http.url":"https://127.0.0.1:16443/apis/apps/v1/namespaces/b/deployments/d?&force=true&fieldManager=m","name":"HTTP"}}"#;
        let log = format!("{line}\n{{\"message\":\"reconciled\"}}\n{line}\n");
        let counts = count(&log);
        assert_eq!(counts.get("patch deployments"), Some(&2));
        assert_eq!(totals(&counts), (2, 2));
    }
}
