//! Each object kustomize builds, turned into its chart template: which value decides
//! whether it is rendered, and which of its fields the values set. Everything else is
//! copied as kustomize builds it, so the chart renders the same objects by default.
//!
//! - every object: names starting with the operator's (`podset-operator`,
//!   `podset-operator-metrics-reader`) start with the release's instead
//!   (`<op>.fullname`); the operator's namespace is the release's; the ServiceAccount is
//!   `<op>.serviceAccountName`; `app.kubernetes.io/managed-by` says Helm.
//! - `crd.yaml`: `crd.enabled`, `crd.keep` (`helm.sh/resource-policy: keep`).
//! - `base/`: the Deployment takes `manager.*` and the metrics flags from `metrics.*`;
//!   the ServiceAccount `serviceAccount.*`; the metrics Service and the metrics-auth
//!   ClusterRoles are there with `metrics.enabled` (and `metrics.secure`); the
//!   Namespace is left out (Helm installs into the release's namespace).
//! - `cluster-rbac/`: unless `rbac.namespaced`. `user-rbac/`: `rbacHelpers.enabled`.
//! - `namespaced/`: with `rbac.namespaced`, its Role and RoleBinding once per namespace
//!   of `rbac.watchNamespaces` (its Namespaces are the user's, not the chart's).
//! - `prometheus/`, `network-policy/`: `prometheus.enabled`, `networkPolicy.enabled`; the
//!   PrometheusRule's selectors and texts name the release's metrics Service and namespace.

use super::holes::Holes;
use anyhow::{Context, Result, bail};
use serde_json::{Map, Value, json};

/// The part of the kustomize tree an object was built from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Part {
    /// `deploy/<op>`: the default install.
    Default,
    /// `deploy/<op>/namespaced`: only its own files are taken (its `../base` is the default's).
    Namespaced,
    /// `deploy/<op>/prometheus`.
    Prometheus,
    /// `deploy/<op>/network-policy`.
    NetworkPolicy,
}

/// One object kustomize built and the file under `deploy/<op>/` it came from.
pub struct Source {
    /// The part it was built with.
    pub part: Part,
    /// Its file, relative to `deploy/<op>/` (`base/deployment.yaml`).
    pub path: String,
    /// The object.
    pub object: Value,
}

/// One object's template.
pub struct Piece {
    /// The template file, relative to `templates/` (mirrors `deploy/<op>/`).
    pub file: String,
    /// The condition it is rendered under, if any.
    pub condition: Option<String>,
    /// With `rbac.namespaced`: once per watched namespace (`$namespace`).
    pub per_watched_namespace: bool,
    /// The object's template text.
    pub body: String,
}

/// What the kustomize Deployment sets, as the chart's default values.
#[derive(Debug, PartialEq)]
pub struct Defaults {
    /// `manager.replicas`.
    pub replicas: Value,
    /// `manager.image.repository`.
    pub repository: String,
    /// `manager.image.tag`.
    pub tag: String,
    /// `manager.image.digest`.
    pub digest: String,
    /// `manager.image.pullPolicy`.
    pub pull_policy: String,
    /// `manager.args`: the command line without the metrics flags.
    pub args: Vec<String>,
    /// `manager.env`: the container's environment beyond what the chart sets itself.
    pub env: Vec<Value>,
    /// `manager.resources`.
    pub resources: Value,
    /// `metrics.port`.
    pub metrics_port: u16,
    /// `metrics.secure`.
    pub metrics_secure: bool,
}

/// The environment the chart sets itself (the downward API and the watched namespaces).
const OWN_ENV: [&str; 3] = ["POD_NAME", "POD_NAMESPACE", "WATCH_NAMESPACE"];

/// The pod spec fields the chart adds from `manager.<field>` when set.
const POD_EXTRAS: [&str; 4] = [
    "imagePullSecrets",
    "nodeSelector",
    "tolerations",
    "affinity",
];

/// The objects' templates and the Deployment's values.
///
/// # Errors
/// When the tree has something the chart cannot express (no Deployment, a container
/// without the metrics flags, ...): the message names it.
pub fn templates(op: &str, sources: Vec<Source>) -> Result<(Vec<Piece>, Defaults)> {
    let ctx = Ctx {
        op: op.to_owned(),
        system: format!("{op}-system"),
    };
    let mut pieces = Vec::new();
    let mut defaults = None;
    let mut per_namespace: Vec<(Value, Value)> = Vec::new();
    for source in sources {
        let Source { part, path, object } = source;
        let kind = object["kind"].as_str().unwrap_or_default().to_owned();
        if kind == "Namespace" {
            continue;
        }
        let in_namespaced = path.starts_with("namespaced/");
        if part == Part::Namespaced && !in_namespaced {
            continue;
        }
        let mut holes = Holes::default();
        let mut object = object;
        let mut per_watched_namespace = false;
        let condition = match part {
            Part::Default => match (kind.as_str(), path.as_str()) {
                ("CustomResourceDefinition", _) => {
                    keep_annotation(&mut holes, &mut object)?;
                    Some("$.Values.crd.enabled".to_owned())
                }
                ("Deployment", _) => {
                    if defaults.is_some() {
                        bail!("{path}: a second Deployment; the chart has one manager");
                    }
                    defaults = Some(deployment(&ctx, &mut holes, &mut object)?);
                    None
                }
                ("ServiceAccount", _) => {
                    service_account(&mut holes, &mut object)?;
                    Some("$.Values.serviceAccount.enabled".to_owned())
                }
                ("Service", "base/metrics-service.yaml") => {
                    metrics_service(&mut holes, &mut object)?;
                    Some("$.Values.metrics.enabled".to_owned())
                }
                (_, "base/metrics-auth-rbac.yaml") => {
                    Some("and $.Values.metrics.enabled $.Values.metrics.secure".to_owned())
                }
                (_, p) if p.starts_with("cluster-rbac/") => {
                    Some("not $.Values.rbac.namespaced".to_owned())
                }
                (_, p) if p.starts_with("user-rbac/") => {
                    Some("$.Values.rbacHelpers.enabled".to_owned())
                }
                _ => None,
            },
            Part::Prometheus => {
                match kind.as_str() {
                    "ServiceMonitor" => service_monitor(&mut holes, &mut object)?,
                    "PrometheusRule" => prometheus_rule(&ctx, &mut holes, &mut object)?,
                    _ => bail!(
                        "{path}: a {kind} in prometheus/; the chart knows ServiceMonitors and PrometheusRules"
                    ),
                }
                Some("and $.Values.prometheus.enabled $.Values.metrics.enabled".to_owned())
            }
            Part::NetworkPolicy => {
                network_policy(&mut holes, &mut object)?;
                Some("and $.Values.networkPolicy.enabled $.Values.metrics.enabled".to_owned())
            }
            Part::Namespaced => {
                let namespace = object["metadata"]["namespace"].as_str().unwrap_or_default();
                if !namespace.is_empty() && namespace != ctx.system {
                    // One Role and RoleBinding per watched namespace: the first namespace's
                    // become the template, the others must be the same but for it.
                    let mut general = object.clone();
                    general["metadata"]["namespace"] = json!("");
                    if let Some((_, seen)) = per_namespace.iter().find(|(k, _)| {
                        k["kind"] == general["kind"] && k["name"] == general["metadata"]["name"]
                    }) {
                        if *seen != general {
                            bail!(
                                "{path}: the {kind} of namespace {namespace} differs from the first \
                                 watched namespace's; the chart makes them all alike"
                            );
                        }
                        continue;
                    }
                    per_namespace.push((
                        json!({"kind": general["kind"], "name": general["metadata"]["name"]}),
                        general,
                    ));
                    object["metadata"]["namespace"] = json!(holes.inline("{{ $namespace }}"));
                    per_watched_namespace = true;
                }
                Some("$.Values.rbac.namespaced".to_owned())
            }
        };
        rename(&ctx, &mut holes, &mut object);
        pieces.push(Piece {
            file: path,
            condition,
            per_watched_namespace,
            body: holes.fill(&object)?,
        });
    }
    let defaults = defaults.with_context(|| format!("deploy/{op} builds no Deployment"))?;
    Ok((pieces, defaults))
}

struct Ctx {
    op: String,
    system: String,
}

impl Ctx {
    fn helper(&self, name: &str) -> String {
        format!("{{{{ include \"{}.{name}\" $ }}}}", self.op)
    }

    /// The template of a name that starts with the operator's, else `None`.
    fn name(&self, name: &str) -> Option<String> {
        let rest = name.strip_prefix(&self.op)?;
        (rest.is_empty() || rest.starts_with('-'))
            .then(|| format!("{}{rest}", self.helper("fullname")))
    }
}

/// What every object gets: names, namespaces, the ServiceAccount, `managed-by`.
fn rename(ctx: &Ctx, holes: &mut Holes, object: &mut Value) {
    let kind = object["kind"].as_str().unwrap_or_default().to_owned();
    let metadata = &mut object["metadata"];
    if let Some(name) = metadata["name"].as_str() {
        let template = if kind == "ServiceAccount" && name == ctx.op {
            Some(ctx.helper("serviceAccountName"))
        } else if kind == "CustomResourceDefinition" {
            None
        } else {
            ctx.name(name)
        };
        if let Some(template) = template {
            metadata["name"] = json!(holes.inline(template));
        }
    }
    if metadata["namespace"] == json!(ctx.system) {
        metadata["namespace"] = json!(holes.inline("{{ $.Release.Namespace }}"));
    }
    if metadata["labels"]["app.kubernetes.io/managed-by"] == "kustomize" {
        metadata["labels"]["app.kubernetes.io/managed-by"] =
            json!(holes.inline("{{ $.Release.Service }}"));
    }
    if let Some(name) = object["roleRef"]["name"].as_str()
        && let Some(template) = ctx.name(name)
    {
        object["roleRef"]["name"] = json!(holes.inline(template));
    }
    if let Some(subjects) = object.get_mut("subjects").and_then(Value::as_array_mut) {
        for subject in subjects {
            if subject["kind"] == "ServiceAccount" && subject["name"] == json!(ctx.op) {
                subject["name"] = json!(holes.inline(ctx.helper("serviceAccountName")));
            }
            if subject["namespace"] == json!(ctx.system) {
                subject["namespace"] = json!(holes.inline("{{ $.Release.Namespace }}"));
            }
        }
    }
}

/// `helm.sh/resource-policy: keep` with `crd.keep`.
fn keep_annotation(holes: &mut Holes, crd: &mut Value) -> Result<()> {
    if crd["metadata"].get("annotations").is_some() {
        bail!("crd.yaml: the CRD has annotations; the chart adds its own");
    }
    holes.key(&mut crd["metadata"], |_| {
        lines(&[
            "{{- if $.Values.crd.keep }}",
            "annotations:",
            "  helm.sh/resource-policy: keep",
            "{{- end }}",
        ])
    })
}

fn service_account(holes: &mut Holes, sa: &mut Value) -> Result<()> {
    if sa["metadata"].get("annotations").is_some() {
        bail!("base/service-account.yaml: annotations would clash with serviceAccount.annotations");
    }
    holes.key(&mut sa["metadata"], |column| {
        with_block("$.Values.serviceAccount.annotations", "annotations", column)
    })
}

fn metrics_service(holes: &mut Holes, service: &mut Value) -> Result<()> {
    let ports = service["spec"]["ports"]
        .as_array_mut()
        .context("base/metrics-service.yaml: the Service has no ports")?;
    for port in ports {
        port["port"] = json!(holes.inline("{{ $.Values.metrics.port }}"));
        port["name"] = json!(holes.inline(SCHEME));
    }
    Ok(())
}

/// `https` with `metrics.secure`, else `http` (the Service's port name and the scheme).
const SCHEME: &str = "{{ if $.Values.metrics.secure }}https{{ else }}http{{ end }}";

fn service_monitor(holes: &mut Holes, monitor: &mut Value) -> Result<()> {
    let endpoints = monitor["spec"]["endpoints"]
        .as_array_mut()
        .context("prometheus/: the ServiceMonitor has no endpoints")?;
    for endpoint in endpoints {
        let map = endpoint
            .as_object_mut()
            .context("an endpoint is not a mapping")?;
        if map.get("port").is_some_and(|p| p == "https") {
            map.insert("port".into(), json!(holes.inline(SCHEME)));
        }
        if map.get("scheme").is_some_and(|p| p == "https") {
            map.insert("scheme".into(), json!(holes.inline(SCHEME)));
        }
        // The bearer token and TLS settings only make sense over HTTPS.
        let mut secure = Map::new();
        for key in ["bearerTokenFile", "tlsConfig", "authorization"] {
            if let Some(v) = map.remove(key) {
                secure.insert(key.into(), v);
            }
        }
        if !secure.is_empty() {
            let text = serde_saphyr::to_string(&Value::Object(secure))?;
            holes.key(endpoint, move |_| {
                let mut out = vec!["{{- if $.Values.metrics.secure }}".to_owned()];
                out.extend(text.lines().map(str::to_owned));
                out.push("{{- end }}".into());
                out
            })?;
        }
    }
    Ok(())
}

/// The alerts: their selectors and texts name the metrics Service (`<op>-metrics`, the
/// `job` label) and the operator's namespace, which are the release's in the chart; and
/// `{{` (Prometheus' own templates in annotations, `{{ $labels.pod }}`) is written so that
/// Helm leaves it as it is.
fn prometheus_rule(ctx: &Ctx, holes: &mut Holes, rule: &mut Value) -> Result<()> {
    let spec = rule
        .get_mut("spec")
        .context("prometheus/: the PrometheusRule has no spec")?;
    let service = format!("{}-metrics", ctx.op);
    let service_template = ctx
        .name(&service)
        .context("the metrics Service's name does not start with the operator's")?;
    let replacements = [
        ("{{", "{{ \"{{\" }}".to_owned()),
        (service.as_str(), service_template),
        (ctx.system.as_str(), "{{ $.Release.Namespace }}".to_owned()),
    ];
    template_strings(spec, &mut |text| {
        let mut out = String::new();
        let mut rest = text;
        while let Some((at, (from, to))) = replacements
            .iter()
            .filter_map(|r| rest.find(r.0).map(|at| (at, r)))
            .min_by_key(|(at, _)| *at)
        {
            out.push_str(&rest[..at]);
            out.push_str(&holes.inline(to.clone()));
            rest = &rest[at + from.len()..];
        }
        out.push_str(rest);
        out
    });
    Ok(())
}

/// Every string under `value` (values, not keys) replaced by `f` of it.
fn template_strings(value: &mut Value, f: &mut impl FnMut(&str) -> String) {
    match value {
        Value::String(text) => *text = f(text),
        Value::Array(items) => items.iter_mut().for_each(|v| template_strings(v, f)),
        Value::Object(map) => map.values_mut().for_each(|v| template_strings(v, f)),
        _ => {}
    }
}

fn network_policy(holes: &mut Holes, policy: &mut Value) -> Result<()> {
    let ingress = policy["spec"]["ingress"]
        .as_array_mut()
        .context("network-policy/: the NetworkPolicy has no ingress rules")?;
    for rule in ingress {
        for port in rule
            .get_mut("ports")
            .and_then(Value::as_array_mut)
            .into_iter()
            .flatten()
        {
            port["port"] = json!(holes.inline("{{ $.Values.metrics.port }}"));
        }
    }
    Ok(())
}

/// The Deployment: `manager.*` and the metrics flags; returns what kustomize sets as
/// the defaults.
fn deployment(ctx: &Ctx, holes: &mut Holes, deployment: &mut Value) -> Result<Defaults> {
    let replicas = deployment["spec"]["replicas"].clone();
    deployment["spec"]["replicas"] = json!(holes.inline("{{ $.Values.manager.replicas }}"));
    let pod = &mut deployment["spec"]["template"]["spec"];
    if pod["serviceAccountName"] == json!(ctx.op) {
        pod["serviceAccountName"] = json!(holes.inline(ctx.helper("serviceAccountName")));
    }
    for field in POD_EXTRAS {
        if pod.get(field).is_some() {
            bail!(
                "base/deployment.yaml: the pod sets {field}, which the chart takes from manager.{field}"
            );
        }
        holes.key(pod, move |column| {
            with_block(&format!("$.Values.manager.{field}"), field, column)
        })?;
    }
    let containers = pod["containers"]
        .as_array_mut()
        .context("base/deployment.yaml: no containers")?;
    if containers.len() != 1 {
        bail!(
            "base/deployment.yaml: {} containers; the chart has one manager container",
            containers.len()
        );
    }
    let container = &mut containers[0];
    let (repository, tag, digest) = split_image(container["image"].as_str().unwrap_or_default());
    container["image"] = json!(holes.inline(ctx.helper("image")));
    let pull_policy = container["imagePullPolicy"]
        .as_str()
        .unwrap_or("IfNotPresent")
        .to_owned();
    container["imagePullPolicy"] = json!(holes.inline("{{ $.Values.manager.image.pullPolicy }}"));

    let (args, metrics_port, metrics_secure) = split_args(&container["args"])?;
    container
        .as_object_mut()
        .context("the container is not a mapping")?
        .remove("args");
    holes.key(container, |_| {
        lines(&[
            "args:",
            "{{- range $.Values.manager.args }}",
            "- {{ . | quote }}",
            "{{- end }}",
            "{{- if $.Values.metrics.enabled }}",
            "- --metrics-bind-address=:{{ $.Values.metrics.port }}",
            "{{- if $.Values.metrics.secure }}",
            "- --metrics-secure",
            "{{- end }}",
            "{{- else }}",
            "- --metrics-bind-address=0",
            "{{- end }}",
        ])
    })?;

    let env = env(holes, container)?;

    let ports = container["ports"]
        .as_array_mut()
        .context("base/deployment.yaml: the container has no ports")?;
    let metrics = ports
        .iter()
        .position(|p| p["name"] == "metrics")
        .context("base/deployment.yaml: no container port named metrics")?;
    if ports[metrics]["containerPort"] != json!(metrics_port) {
        bail!(
            "base/deployment.yaml: the metrics containerPort is not the port of --metrics-bind-address ({metrics_port})"
        );
    }
    ports[metrics] = holes.item(|_| {
        lines(&[
            "{{- if $.Values.metrics.enabled }}",
            "- containerPort: {{ $.Values.metrics.port }}",
            "  name: metrics",
            "{{- end }}",
        ])
    });

    let resources = container
        .as_object_mut()
        .context("the container is not a mapping")?
        .remove("resources")
        .unwrap_or_else(|| json!({}));
    holes.key(container, |column| {
        vec![
            "resources:".into(),
            format!(
                "  {{{{- toYaml $.Values.manager.resources | nindent {} }}}}",
                column + 2
            ),
        ]
    })?;
    Ok(Defaults {
        replicas,
        repository,
        tag,
        digest,
        pull_policy,
        args,
        env,
        resources,
        metrics_port,
        metrics_secure,
    })
}

/// The container's environment: the chart's own variables stay (WATCH_NAMESPACE set
/// from `rbac.watchNamespaces`), the others move to `manager.env`; returns those.
fn env(holes: &mut Holes, container: &mut Value) -> Result<Vec<Value>> {
    let Some(env) = container["env"].as_array_mut() else {
        bail!("base/deployment.yaml: the container has no env (WATCH_NAMESPACE must be there)");
    };
    let own = env
        .iter()
        .take_while(|e| OWN_ENV.iter().any(|n| e["name"] == *n))
        .count();
    let rest: Vec<Value> = env.split_off(own);
    if let Some(misplaced) = rest
        .iter()
        .find(|e| OWN_ENV.iter().any(|n| e["name"] == *n))
    {
        bail!(
            "base/deployment.yaml: {} comes after the operator's own settings; list POD_NAME, \
             POD_NAMESPACE and WATCH_NAMESPACE first",
            misplaced["name"]
        );
    }
    let watch = env
        .iter_mut()
        .find(|e| e["name"] == "WATCH_NAMESPACE")
        .context("base/deployment.yaml: no WATCH_NAMESPACE")?;
    if watch.get("value").is_some() || watch.get("valueFrom").is_some() {
        bail!(
            "base/deployment.yaml: WATCH_NAMESPACE has a value; the chart sets it from rbac.watchNamespaces"
        );
    }
    holes.key(watch, |_| {
        lines(&[
            "{{- if $.Values.rbac.namespaced }}",
            "{{- if not $.Values.rbac.watchNamespaces }}",
            "{{- fail \"rbac.watchNamespaces: list the namespaces to watch when rbac.namespaced is true\" }}",
            "{{- end }}",
            "value: {{ join \",\" $.Values.rbac.watchNamespaces | quote }}",
            "{{- end }}",
        ])
    })?;
    env.push(holes.item(|column| {
        vec![
            "{{- with $.Values.manager.env }}".into(),
            format!("{{{{- toYaml . | nindent {column} }}}}"),
            "{{- end }}".into(),
        ]
    }));
    Ok(rest)
}

/// `{{- with <value> }}` `<key>:` (its YAML) `{{- end }}`, at `column`.
fn with_block(value: &str, key: &str, column: usize) -> Vec<String> {
    vec![
        format!("{{{{- with {value} }}}}"),
        format!("{key}:"),
        format!("  {{{{- toYaml . | nindent {} }}}}", column + 2),
        "{{- end }}".into(),
    ]
}

fn lines(lines: &[&str]) -> Vec<String> {
    lines.iter().map(|l| (*l).to_owned()).collect()
}

/// `repository[:tag][@digest]`.
pub fn split_image(image: &str) -> (String, String, String) {
    let (rest, digest) = image.split_once('@').unwrap_or((image, ""));
    let slash = rest.rfind('/').map_or(0, |i| i + 1);
    match rest[slash..].rfind(':') {
        Some(colon) => (
            rest[..slash + colon].to_owned(),
            rest[slash + colon + 1..].to_owned(),
            digest.to_owned(),
        ),
        None => (rest.to_owned(), String::new(), digest.to_owned()),
    }
}

/// The arguments without the metrics flags, which must come last
/// (`--metrics-bind-address=:<port>`, then `--metrics-secure` when secure), the port and
/// whether it is secure.
fn split_args(args: &Value) -> Result<(Vec<String>, u16, bool)> {
    let args: Vec<String> = args
        .as_array()
        .context("base/deployment.yaml: the container has no args")?
        .iter()
        .map(|a| {
            a.as_str()
                .map(str::to_owned)
                .context("an argument is not a string")
        })
        .collect::<Result<_>>()?;
    let is_metrics =
        |a: &String| a.starts_with("--metrics-bind-address") || a.starts_with("--metrics-secure");
    let first = args.iter().position(is_metrics).context(
        "base/deployment.yaml: no --metrics-bind-address=:<port> in args; the chart sets it from metrics.port",
    )?;
    let (rest, metrics) = args.split_at(first);
    let port = metrics[0]
        .strip_prefix("--metrics-bind-address=:")
        .and_then(|p| p.parse::<u16>().ok())
        .with_context(|| {
            format!(
                "base/deployment.yaml: {:?} is not --metrics-bind-address=:<port>",
                metrics[0]
            )
        })?;
    let secure = match &metrics[1..] {
        [] => false,
        [flag] if flag == "--metrics-secure" || flag == "--metrics-secure=true" => true,
        other => bail!(
            "base/deployment.yaml: after --metrics-bind-address the chart expects --metrics-secure \
             or nothing, not {other:?}"
        ),
    };
    Ok((rest.to_vec(), port, secure))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn images_split() {
        assert_eq!(
            split_image("podset-operator:latest"),
            ("podset-operator".into(), "latest".into(), String::new())
        );
        assert_eq!(
            split_image("127.0.0.1:15000/op:0.1.0@sha256:ab"),
            (
                "127.0.0.1:15000/op".into(),
                "0.1.0".into(),
                "sha256:ab".into()
            )
        );
        assert_eq!(
            split_image("host:5000/op"),
            ("host:5000/op".into(), String::new(), String::new())
        );
    }

    #[test]
    fn alerts_name_the_release_and_keep_prometheus_templates() -> Result<()> {
        let ctx = Ctx {
            op: "op".into(),
            system: "op-system".into(),
        };
        let mut holes = Holes::default();
        let mut rule = json!({"kind": "PrometheusRule", "spec": {"groups": [{"rules": [{
            "expr": "up{job=\"op-metrics\", namespace=\"op-system\"} == 0",
            "annotations": {"description": "{{ $labels.pod }} of op in op-system"},
        }]}]}});
        prometheus_rule(&ctx, &mut holes, &mut rule)?;
        let text = holes.fill(&rule)?;
        assert!(
            text.contains(
                r#"up{job="{{ include "op.fullname" $ }}-metrics", namespace="{{ $.Release.Namespace }}"} == 0"#
            ),
            "{text}"
        );
        assert!(
            text.contains(r#"{{ "{{" }} $labels.pod }} of op in {{ $.Release.Namespace }}"#),
            "{text}"
        );
        Ok(())
    }

    #[test]
    fn metrics_flags_come_off_the_args() -> Result<()> {
        let (args, port, secure) = split_args(&json!([
            "run",
            "--leader-elect",
            "--metrics-bind-address=:8443",
            "--metrics-secure"
        ]))?;
        assert_eq!(args, ["run", "--leader-elect"]);
        assert_eq!((port, secure), (8443, true));
        let (_, port, secure) = split_args(&json!(["run", "--metrics-bind-address=:8080"]))?;
        assert_eq!((port, secure), (8080, false));
        assert!(split_args(&json!(["run"])).is_err());
        assert!(split_args(&json!(["--metrics-bind-address=:1", "run"])).is_err());
        Ok(())
    }

    #[test]
    fn names_follow_the_release() {
        let ctx = Ctx {
            op: "podset-operator".into(),
            system: "podset-operator-system".into(),
        };
        assert_eq!(
            ctx.name("podset-operator-metrics").as_deref(),
            Some("{{ include \"podset-operator.fullname\" $ }}-metrics")
        );
        assert!(ctx.name("podsets-admin-role").is_none());
        assert!(ctx.name("podset-operatorx").is_none());
    }
}
