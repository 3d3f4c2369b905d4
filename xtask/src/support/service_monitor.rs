//! A shipped ServiceMonitor (`deploy/<operator>/prometheus/monitor.yaml`) as the scrape
//! configuration the Prometheus Operator would give Prometheus for it, so that the
//! end-to-end tests' Prometheus (built from its Go module, run on this machine) scrapes
//! an operator exactly as the manifest says: which Services (by label), which port (by
//! name), scheme, path, TLS and bearer token, and the target labels the Prometheus
//! Operator sets (`namespace`, `service`, `pod`, `container`, `endpoint`, `job`), which
//! the dashboards' queries select on.
//!
//! Only the fields the shipped monitors use are understood; any other field is an error
//! naming it, so the translation cannot silently scrape something the manifest does not
//! say.

use anyhow::{Context, Result, bail};
use serde_json::{Map, Value, json};

/// Where the scrape's files are on this machine.
pub struct ScrapeFiles<'a> {
    /// The kubeconfig Prometheus' Kubernetes discovery reads the EndpointSlices with.
    pub kubeconfig: &'a str,
    /// The file holding the token that stands for the pod's own ServiceAccount token
    /// (`bearerTokenFile: /var/run/secrets/kubernetes.io/serviceaccount/token`).
    pub token: &'a str,
}

/// The in-pod path of a ServiceAccount token, the one `bearerTokenFile` may name.
const POD_TOKEN: &str = "/var/run/secrets/kubernetes.io/serviceaccount/token";

/// The scrape configurations (one per endpoint) for `monitor`, a ServiceMonitor.
///
/// # Errors
/// When it is not a ServiceMonitor or uses a field this translation does not know.
pub fn scrape_configs(monitor: &Value, files: &ScrapeFiles<'_>) -> Result<Vec<Value>> {
    if monitor["kind"] != "ServiceMonitor" {
        bail!("not a ServiceMonitor: kind {}", monitor["kind"]);
    }
    let name = monitor["metadata"]["name"]
        .as_str()
        .context("metadata.name is missing")?;
    let namespace = monitor["metadata"]["namespace"]
        .as_str()
        .context("metadata.namespace is missing (render the kustomization, not the file)")?;
    let spec = object(&monitor["spec"], "spec")?;
    only(
        spec,
        "spec",
        &["selector", "endpoints", "namespaceSelector", "jobLabel"],
    )?;
    let namespaces: Vec<String> = match spec.get("namespaceSelector") {
        None => vec![namespace.to_owned()],
        Some(selector) => {
            let selector = object(selector, "spec.namespaceSelector")?;
            only(selector, "spec.namespaceSelector", &["matchNames"])?;
            serde_json::from_value(selector["matchNames"].clone())
                .context("spec.namespaceSelector.matchNames is not a list of names")?
        }
    };
    let selector = object(&spec["selector"], "spec.selector")?;
    only(selector, "spec.selector", &["matchLabels"])?;
    let labels = object(&selector["matchLabels"], "spec.selector.matchLabels")?;
    let mut keep_services = Vec::new();
    for (key, value) in labels {
        let value = value
            .as_str()
            .with_context(|| format!("spec.selector.matchLabels.{key} is not a string"))?;
        let label = sanitize(key);
        keep_services.push(json!({
            "action": "keep",
            "source_labels": [
                format!("__meta_kubernetes_service_label_{label}"),
                format!("__meta_kubernetes_service_labelpresent_{label}"),
            ],
            "regex": format!("({});true", regex_escape(value)),
        }));
    }
    let job_label = spec.get("jobLabel").and_then(Value::as_str);
    let endpoints = spec["endpoints"]
        .as_array()
        .filter(|e| !e.is_empty())
        .context("spec.endpoints is missing or empty")?;
    let mut out = Vec::new();
    for (i, endpoint) in endpoints.iter().enumerate() {
        let at = format!("spec.endpoints[{i}]");
        let endpoint = object(endpoint, &at)?;
        only(
            endpoint,
            &at,
            &[
                "port",
                "path",
                "scheme",
                "bearerTokenFile",
                "tlsConfig",
                "interval",
            ],
        )?;
        let port = endpoint["port"]
            .as_str()
            .with_context(|| format!("{at}.port (a port name) is missing"))?;
        let mut config = Map::new();
        config.insert(
            "job_name".into(),
            json!(format!("serviceMonitor/{namespace}/{name}/{i}")),
        );
        config.insert(
            "kubernetes_sd_configs".into(),
            json!([{
                "role": "endpointslice",
                "kubeconfig_file": files.kubeconfig,
                "namespaces": {"names": namespaces},
            }]),
        );
        config.insert(
            "metrics_path".into(),
            endpoint.get("path").cloned().unwrap_or(json!("/metrics")),
        );
        config.insert(
            "scheme".into(),
            endpoint.get("scheme").cloned().unwrap_or(json!("http")),
        );
        if let Some(interval) = endpoint.get("interval") {
            config.insert("scrape_interval".into(), interval.clone());
        }
        if let Some(file) = endpoint.get("bearerTokenFile") {
            if file != POD_TOKEN {
                bail!("{at}.bearerTokenFile is {file}; only {POD_TOKEN} is understood");
            }
            config.insert(
                "authorization".into(),
                json!({"type": "Bearer", "credentials_file": files.token}),
            );
        }
        if let Some(tls) = endpoint.get("tlsConfig") {
            let tls = object(tls, &format!("{at}.tlsConfig"))?;
            only(tls, &format!("{at}.tlsConfig"), &["insecureSkipVerify"])?;
            config.insert(
                "tls_config".into(),
                json!({"insecure_skip_verify": tls["insecureSkipVerify"] == true}),
            );
        }
        let mut relabel = keep_services.clone();
        relabel.push(json!({
            "action": "keep",
            "source_labels": ["__meta_kubernetes_endpointslice_port_name"],
            "regex": regex_escape(port),
        }));
        for (source, target) in [
            ("__meta_kubernetes_namespace", "namespace"),
            ("__meta_kubernetes_service_name", "service"),
            ("__meta_kubernetes_pod_name", "pod"),
            ("__meta_kubernetes_pod_container_name", "container"),
        ] {
            relabel.push(json!({"source_labels": [source], "target_label": target}));
        }
        relabel.push(json!({
            "source_labels": ["__meta_kubernetes_service_name"],
            "target_label": "job",
        }));
        if let Some(label) = job_label {
            relabel.push(json!({
                "source_labels": [format!("__meta_kubernetes_service_label_{}", sanitize(label))],
                "target_label": "job",
                "regex": "(.+)",
            }));
        }
        relabel.push(json!({"target_label": "endpoint", "replacement": port}));
        config.insert("relabel_configs".into(), Value::Array(relabel));
        out.push(Value::Object(config));
    }
    Ok(out)
}

/// `value` as an object, or an error naming `at`.
fn object<'a>(value: &'a Value, at: &str) -> Result<&'a Map<String, Value>> {
    value
        .as_object()
        .with_context(|| format!("{at} is missing or not an object"))
}

/// Fails naming the first key of `map` not in `known`.
fn only(map: &Map<String, Value>, at: &str, known: &[&str]) -> Result<()> {
    match map.keys().find(|k| !known.contains(&k.as_str())) {
        Some(key) => bail!(
            "{at}.{key} is not understood by this translation (it knows {})",
            known.join(", ")
        ),
        None => Ok(()),
    }
}

/// A label name as Prometheus' Kubernetes discovery writes it in meta labels.
fn sanitize(label: &str) -> String {
    label
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
        .collect()
}

/// `text` as a regular expression that matches only itself.
fn regex_escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        if "\\.+*?()|[]{}^$".contains(c) {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn monitor() -> Value {
        json!({
            "apiVersion": "monitoring.coreos.com/v1",
            "kind": "ServiceMonitor",
            "metadata": {"name": "m", "namespace": "op-system"},
            "spec": {
                "selector": {"matchLabels": {"app.kubernetes.io/name": "op"}},
                "endpoints": [{
                    "port": "https",
                    "path": "/metrics",
                    "scheme": "https",
                    "bearerTokenFile": POD_TOKEN,
                    "tlsConfig": {"insecureSkipVerify": true}
                }]
            }
        })
    }

    const FILES: ScrapeFiles<'static> = ScrapeFiles {
        kubeconfig: "/k",
        token: "/t",
    };

    #[test]
    fn translates_what_the_shipped_monitors_say() {
        let configs = scrape_configs(&monitor(), &FILES).unwrap();
        assert_eq!(configs.len(), 1);
        let c = &configs[0];
        assert_eq!(c["job_name"], "serviceMonitor/op-system/m/0");
        assert_eq!(c["scheme"], "https");
        assert_eq!(c["metrics_path"], "/metrics");
        assert_eq!(c["authorization"]["credentials_file"], "/t");
        assert_eq!(c["tls_config"]["insecure_skip_verify"], true);
        let sd = &c["kubernetes_sd_configs"][0];
        assert_eq!(sd["role"], "endpointslice");
        assert_eq!(sd["namespaces"]["names"], json!(["op-system"]));
        let relabel = c["relabel_configs"].as_array().unwrap();
        assert!(relabel.contains(&json!({
            "action": "keep",
            "source_labels": [
                "__meta_kubernetes_service_label_app_kubernetes_io_name",
                "__meta_kubernetes_service_labelpresent_app_kubernetes_io_name"
            ],
            "regex": "(op);true"
        })));
        assert!(relabel.contains(&json!({
            "action": "keep",
            "source_labels": ["__meta_kubernetes_endpointslice_port_name"],
            "regex": "https"
        })));
        assert!(relabel.contains(&json!({
            "source_labels": ["__meta_kubernetes_namespace"],
            "target_label": "namespace"
        })));
    }

    #[test]
    fn unknown_fields_are_errors_that_name_them() {
        let mut m = monitor();
        m["spec"]["endpoints"][0]["targetPort"] = json!(8443);
        let e = scrape_configs(&m, &FILES).unwrap_err().to_string();
        assert!(e.contains("spec.endpoints[0].targetPort"), "{e}");
        let mut m = monitor();
        m["spec"]["selector"]["matchExpressions"] = json!([]);
        let e = scrape_configs(&m, &FILES).unwrap_err().to_string();
        assert!(e.contains("spec.selector.matchExpressions"), "{e}");
        let mut m = monitor();
        m["spec"]["endpoints"][0]["bearerTokenFile"] = json!("/elsewhere");
        assert!(scrape_configs(&m, &FILES).is_err());
    }

    #[test]
    fn every_shipped_monitor_translates() {
        let root = crate::support::paths::repo_root().join("deploy");
        let mut seen = 0;
        for entry in std::fs::read_dir(&root).unwrap() {
            let file = entry
                .unwrap()
                .path()
                .join("prometheus")
                .join("monitor.yaml");
            if !file.exists() {
                continue;
            }
            let mut m: Value =
                serde_saphyr::from_str(&std::fs::read_to_string(&file).unwrap()).unwrap();
            // The kustomization sets the namespace.
            m["metadata"]["namespace"] = json!("x-system");
            scrape_configs(&m, &FILES).unwrap_or_else(|e| panic!("{}: {e:#}", file.display()));
            seen += 1;
        }
        assert_eq!(seen, 4);
    }

    #[test]
    fn regexes_match_only_themselves() {
        assert_eq!(regex_escape("a.b"), "a\\.b");
        assert_eq!(sanitize("app.kubernetes.io/name"), "app_kubernetes_io_name");
    }
}
