//! Traces over OTLP/HTTP (OpenTelemetry), off unless an endpoint is set.
//!
//! Configured the standard way: `OTEL_EXPORTER_OTLP_ENDPOINT` (or `--otlp-endpoint`, the
//! base URL, `/v1/traces` appended) or `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` (the URL as
//! is), `OTEL_SERVICE_NAME` (default: the operator's name), `OTEL_TRACES_SAMPLER` and
//! `OTEL_TRACES_SAMPLER_ARG` (read by the SDK), `OTEL_EXPORTER_OTLP_HEADERS` (read by the
//! exporter), `OTEL_EXPORTER_OTLP_TIMEOUT`; `OTEL_SDK_DISABLED=true` or
//! `OTEL_TRACES_EXPORTER=none` turn it off. Spans go out in batches from a task on the
//! tokio runtime, over the hyper client kube already links; a collector that fails or is
//! gone only costs a logged error per batch.
//!
//! What is exported (see [`ExportFilter`]): the spans at `INFO` and above (the reconcile
//! span, [`super::super::guard`]), the `DEBUG` span `HTTP` of each API request made inside
//! one of them (whatever the log level), and the `INFO`+ events inside them as span events.

use std::{
    sync::atomic::{AtomicBool, Ordering},
    time::Duration,
};

use opentelemetry::trace::{TraceContextExt as _, TracerProvider as _};
use opentelemetry_otlp::{WithExportConfig as _, WithHttpConfig as _};
use opentelemetry_sdk::{Resource, trace::SdkTracerProvider};
use tracing::{Level, Metadata, Subscriber, level_filters::LevelFilter, subscriber::Interest};
use tracing_opentelemetry::OpenTelemetrySpanExt as _;
use tracing_subscriber::{
    Layer,
    layer::{Context, Filter},
    registry::LookupSpan,
};

/// The base URL of the OTLP collector (the flag's environment variable too).
pub(crate) const ENDPOINT_VAR: &str = "OTEL_EXPORTER_OTLP_ENDPOINT";
/// The full URL traces are posted to, used as it is.
const TRACES_ENDPOINT_VAR: &str = "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT";
/// The flag that sets [`ENDPOINT_VAR`] on the command line.
const ENDPOINT_FLAG: &str = "--otlp-endpoint";
/// The path OTLP/HTTP appends to a base URL for traces.
const TRACES_PATH: &str = "v1/traces";
/// How long one export may take (the OTLP default).
const DEFAULT_TIMEOUT: Duration = Duration::from_secs(10);
/// How long the process waits at exit for the last spans to be sent.
pub(super) const SHUTDOWN_WAIT: Duration = Duration::from_secs(2);
/// The targets whose `HTTP` spans are the API requests: the runner's transport, and
/// kube's own (used through a proxy or with an `exec` credential plugin).
const REQUEST_TARGETS: [&str; 2] = ["shared::runner::client", "kube_client::client::builder"];
/// The samplers the SDK reads from `OTEL_TRACES_SAMPLER`.
const SAMPLERS: [&str; 6] = [
    "always_on",
    "always_off",
    "traceidratio",
    "parentbased_always_on",
    "parentbased_always_off",
    "parentbased_traceidratio",
];

/// Whether traces are exported (spares the reconciles the trace id look-up when not).
static ENABLED: AtomicBool = AtomicBool::new(false);

/// Where and how traces are exported.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Config {
    /// The URL spans are posted to (`…/v1/traces`).
    pub(super) endpoint: http::Uri,
    /// The `service.name` to set: the operator's, unless `OTEL_SERVICE_NAME` or
    /// `OTEL_RESOURCE_ATTRIBUTES` names one (the SDK reads those itself).
    pub(super) service_name: Option<String>,
    /// How long one export may take (`OTEL_EXPORTER_OTLP_[TRACES_]TIMEOUT`, in ms).
    pub(super) timeout: Duration,
    /// What is wrong with `OTEL_TRACES_SAMPLER[_ARG]`, if anything (the SDK then falls
    /// back to its default and says so before logging is set up; logged after it).
    pub(super) sampler_warning: Option<String>,
}

impl Config {
    /// The configuration from the environment and `--otlp-endpoint` (`flag`, which clap
    /// also fills from [`ENDPOINT_VAR`]); `None` when traces are off.
    ///
    /// # Errors
    /// A message naming the variable or flag whose value is not usable.
    pub(super) fn from_env(flag: Option<&str>, operator: &str) -> Result<Option<Self>, String> {
        Self::resolve(flag, operator, |name| std::env::var(name).ok())
    }

    /// [`Config::from_env`] with the environment read through `env`.
    fn resolve(
        flag: Option<&str>,
        operator: &str,
        env: impl Fn(&str) -> Option<String>,
    ) -> Result<Option<Self>, String> {
        let var = |name: &str| {
            env(name)
                .map(|v| v.trim().to_owned())
                .filter(|v| !v.is_empty())
        };
        if var("OTEL_SDK_DISABLED").is_some_and(|v| v.eq_ignore_ascii_case("true"))
            || var("OTEL_TRACES_EXPORTER").is_some_and(|v| v.eq_ignore_ascii_case("none"))
        {
            return Ok(None);
        }
        let endpoint = if let Some(url) = var(TRACES_ENDPOINT_VAR) {
            parse_endpoint(&url, TRACES_ENDPOINT_VAR)?
        } else if let Some(base) = flag.map(str::trim).filter(|v| !v.is_empty()) {
            // clap fills the flag from the variable: name the one the value came from.
            let source = if var(ENDPOINT_VAR).as_deref() == Some(base) {
                ENDPOINT_VAR
            } else {
                ENDPOINT_FLAG
            };
            parse_endpoint(base, source)?;
            let url = format!("{}/{TRACES_PATH}", base.trim_end_matches('/'));
            parse_endpoint(&url, source)?
        } else {
            return Ok(None);
        };
        // The signal's own variable first, as the specification orders them.
        for name in [
            "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL",
            "OTEL_EXPORTER_OTLP_PROTOCOL",
        ] {
            if let Some(protocol) = var(name) {
                if protocol != "http/protobuf" {
                    return Err(format!(
                        "{name}={protocol}: only http/protobuf is supported (OTLP over HTTP, the collector's port 4318)"
                    ));
                }
                break;
            }
        }
        let mut timeout = DEFAULT_TIMEOUT;
        for name in [
            "OTEL_EXPORTER_OTLP_TRACES_TIMEOUT",
            "OTEL_EXPORTER_OTLP_TIMEOUT",
        ] {
            if let Some(ms) = var(name) {
                let ms: u64 = ms
                    .parse()
                    .map_err(|_| format!("{name}={ms}: expected a whole number of milliseconds"))?;
                timeout = Duration::from_millis(ms);
                break;
            }
        }
        let named = var("OTEL_SERVICE_NAME").is_some()
            || var("OTEL_RESOURCE_ATTRIBUTES").is_some_and(|attributes| {
                attributes
                    .split(',')
                    .any(|kv| kv.split('=').next().map(str::trim) == Some("service.name"))
            });
        Ok(Some(Self {
            endpoint,
            service_name: (!named).then(|| operator.to_owned()),
            timeout,
            sampler_warning: sampler_warning(
                var("OTEL_TRACES_SAMPLER"),
                var("OTEL_TRACES_SAMPLER_ARG"),
            ),
        }))
    }
}

/// `value` as an OTLP/HTTP endpoint: an `http` or `https` URL with a host.
fn parse_endpoint(value: &str, source: &str) -> Result<http::Uri, String> {
    let bad = |why: &str| {
        format!("{source}={value}: {why}; expected a URL such as http://otel-collector:4318")
    };
    let uri: http::Uri = value
        .parse()
        .map_err(|e| bad(&format!("not a URL ({e})")))?;
    match uri.scheme_str() {
        Some("http" | "https") => {}
        Some(other) => return Err(bad(&format!("scheme {other} is not http or https"))),
        None => return Err(bad("no scheme")),
    }
    if uri.host().is_none_or(str::is_empty) {
        return Err(bad("no host"));
    }
    Ok(uri)
}

/// What the SDK will not understand in `OTEL_TRACES_SAMPLER` (it then samples
/// everything, parent-based) or `OTEL_TRACES_SAMPLER_ARG` (it then takes 1.0).
fn sampler_warning(sampler: Option<String>, arg: Option<String>) -> Option<String> {
    let sampler = sampler?;
    if !SAMPLERS.contains(&sampler.as_str()) {
        return Some(format!(
            "OTEL_TRACES_SAMPLER={sampler} is not one of {}: every trace is sampled (parentbased_always_on)",
            SAMPLERS.join(", ")
        ));
    }
    if sampler.ends_with("traceidratio")
        && !arg
            .as_deref()
            .and_then(|a| a.parse::<f64>().ok())
            .is_some_and(|r| (0.0..=1.0).contains(&r))
    {
        return Some(format!(
            "OTEL_TRACES_SAMPLER_ARG={} is not a ratio from 0 to 1: every trace is sampled",
            arg.unwrap_or_default()
        ));
    }
    None
}

/// The tracer provider exporting to `config`'s endpoint in batches, from a task on the
/// tokio runtime (so it must be called inside one).
///
/// # Errors
/// When the exporter cannot be built (an `https` endpoint and no root certificates).
pub(super) fn provider(config: &Config) -> Result<SdkTracerProvider, String> {
    let endpoint = config.endpoint.to_string();
    let builder = opentelemetry_otlp::SpanExporter::builder().with_http();
    let builder = if config.endpoint.scheme_str() == Some("https") {
        let https = hyper_rustls::HttpsConnectorBuilder::new()
            .with_native_roots()
            .map_err(|e| format!("{endpoint}: no root certificates for HTTPS ({e})"))?
            .https_only()
            .enable_http1()
            .build();
        builder.with_http_client(opentelemetry_http::hyper::HyperClient::new(
            https,
            config.timeout,
            None,
        ))
    } else {
        builder.with_http_client(
            opentelemetry_http::hyper::HyperClient::with_default_connector(config.timeout, None),
        )
    };
    let exporter = builder
        .with_endpoint(endpoint.clone())
        .with_timeout(config.timeout)
        .build()
        .map_err(|e| format!("the OTLP trace exporter for {endpoint}: {e}"))?;
    let processor =
        opentelemetry_sdk::trace::span_processor_with_async_runtime::BatchSpanProcessor::builder(
            exporter,
            opentelemetry_sdk::runtime::Tokio,
        )
        .build();
    let mut resource = Resource::builder();
    if let Some(name) = &config.service_name {
        resource = resource.with_service_name(name.clone());
    }
    Ok(SdkTracerProvider::builder()
        .with_span_processor(processor)
        .with_resource(resource.build())
        .build())
}

/// The layer turning spans into OpenTelemetry spans of `provider`, with its own filter
/// ([`ExportFilter`]) beside the log filter. `scope` names the instrumentation scope.
pub(super) fn layer<S>(provider: &SdkTracerProvider, scope: &'static str) -> impl Layer<S> + use<S>
where
    S: Subscriber + for<'a> LookupSpan<'a>,
{
    ENABLED.store(true, Ordering::Relaxed);
    tracing_opentelemetry::layer()
        .with_tracer(provider.tracer(scope))
        .with_threads(false)
        .with_location(false)
        .with_filter(ExportFilter)
}

/// Records the trace id of `span` (a reconcile span, with a `trace_id` field) in it, so
/// every log line inside it carries it; nothing when traces are off or the trace is not
/// sampled (it is then in no collector).
pub(crate) fn record_trace_id(span: &tracing::Span) {
    if !ENABLED.load(Ordering::Relaxed) {
        return;
    }
    let cx = span.context();
    let otel_span = cx.span();
    let context = otel_span.span_context();
    if context.is_valid() && context.is_sampled() {
        span.record("trace_id", tracing::field::display(context.trace_id()));
    }
}

/// What is exported, whatever the log filter lets through: the spans and events at `INFO`
/// and above, except kube-runtime's (its `reconciling object` span would otherwise be the
/// root of every reconcile's trace), and the `DEBUG` spans `HTTP` of the API requests,
/// when made inside an exported span (the watches and the lease's renewals would each be
/// a trace of one span).
#[derive(Debug, Clone, Copy)]
pub(super) struct ExportFilter;

impl ExportFilter {
    /// Whether `meta` is one of the request spans.
    fn is_request(meta: &Metadata<'_>) -> bool {
        meta.is_span() && meta.name() == "HTTP" && REQUEST_TARGETS.contains(&meta.target())
    }

    /// Whether `meta` is exported wherever it happens.
    fn always(meta: &Metadata<'_>) -> bool {
        if meta.target().starts_with("kube_runtime") {
            *meta.level() <= Level::WARN
        } else {
            *meta.level() <= Level::INFO
        }
    }
}

impl<S: Subscriber + for<'a> LookupSpan<'a>> Filter<S> for ExportFilter {
    fn enabled(&self, meta: &Metadata<'_>, cx: &Context<'_, S>) -> bool {
        Self::always(meta) || (Self::is_request(meta) && cx.lookup_current().is_some())
    }

    fn callsite_enabled(&self, meta: &'static Metadata<'static>) -> Interest {
        if Self::is_request(meta) {
            Interest::sometimes()
        } else if Self::always(meta) {
            Interest::always()
        } else {
            Interest::never()
        }
    }

    fn max_level_hint(&self) -> Option<LevelFilter> {
        Some(LevelFilter::DEBUG)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use std::{
        collections::HashMap,
        sync::{Arc, Mutex},
    };

    use opentelemetry::trace::SpanKind;
    use opentelemetry_sdk::trace::{InMemorySpanExporter, SpanData};
    use tracing_subscriber::{EnvFilter, prelude::*};

    use super::*;

    fn resolve(flag: Option<&str>, vars: &[(&str, &str)]) -> Result<Option<Config>, String> {
        let vars: HashMap<String, String> = vars
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        Config::resolve(flag, "podset-operator", |name| vars.get(name).cloned())
    }

    #[test]
    fn traces_are_off_unless_an_endpoint_is_set() {
        assert_eq!(resolve(None, &[]), Ok(None));
        assert_eq!(resolve(Some(""), &[(ENDPOINT_VAR, "")]), Ok(None));
        assert_eq!(
            resolve(
                None,
                &[
                    ("OTEL_SERVICE_NAME", "x"),
                    ("OTEL_TRACES_SAMPLER", "always_on")
                ]
            ),
            Ok(None)
        );
        let on = [(ENDPOINT_VAR, "http://c:4318")];
        assert_eq!(
            resolve(
                Some("http://c:4318"),
                &[("OTEL_SDK_DISABLED", "true"), on[0]]
            ),
            Ok(None)
        );
        assert_eq!(
            resolve(
                Some("http://c:4318"),
                &[("OTEL_TRACES_EXPORTER", "none"), on[0]]
            ),
            Ok(None)
        );
    }

    #[test]
    fn the_endpoint_comes_from_the_flag_or_the_environment() {
        // The base URL (from the flag, or the variable clap reads it from) gets /v1/traces.
        let config = resolve(Some("http://jaeger-collector.observability:4318"), &[])
            .unwrap()
            .unwrap();
        assert_eq!(
            config.endpoint.to_string(),
            "http://jaeger-collector.observability:4318/v1/traces"
        );
        assert_eq!(config.service_name.as_deref(), Some("podset-operator"));
        assert_eq!(config.timeout, DEFAULT_TIMEOUT);
        assert_eq!(config.sampler_warning, None);
        let config = resolve(
            Some("https://c/otlp/"),
            &[(ENDPOINT_VAR, "https://c/otlp/")],
        )
        .unwrap()
        .unwrap();
        assert_eq!(config.endpoint.to_string(), "https://c/otlp/v1/traces");
        // The traces' own variable wins, and is used as it is.
        let config = resolve(
            Some("http://c:4318"),
            &[
                (TRACES_ENDPOINT_VAR, "http://t:4318/custom"),
                (ENDPOINT_VAR, "http://c:4318"),
            ],
        )
        .unwrap()
        .unwrap();
        assert_eq!(config.endpoint.to_string(), "http://t:4318/custom");
        let config = resolve(None, &[(TRACES_ENDPOINT_VAR, "http://t:4318/v1/traces")]).unwrap();
        assert!(config.is_some());
        // The service name the environment gives is left to the SDK.
        let config = resolve(Some("http://c:4318"), &[("OTEL_SERVICE_NAME", "mine")])
            .unwrap()
            .unwrap();
        assert_eq!(config.service_name, None);
        let config = resolve(
            Some("http://c:4318"),
            &[("OTEL_RESOURCE_ATTRIBUTES", "team=a, service.name=mine")],
        )
        .unwrap()
        .unwrap();
        assert_eq!(config.service_name, None);
        let config = resolve(
            Some("http://c:4318"),
            &[("OTEL_EXPORTER_OTLP_TIMEOUT", "2500")],
        )
        .unwrap()
        .unwrap();
        assert_eq!(config.timeout, Duration::from_millis(2500));
    }

    #[test]
    fn a_bad_value_is_an_error_naming_its_variable_or_flag() {
        // (flag, environment, how the error starts)
        type Case = (
            Option<&'static str>,
            &'static [(&'static str, &'static str)],
            &'static str,
        );
        let cases: [Case; 5] = [
            (
                Some("jaeger:4318"),
                &[(ENDPOINT_VAR, "jaeger:4318")],
                "OTEL_EXPORTER_OTLP_ENDPOINT=jaeger:4318: ",
            ),
            (
                Some("not a url"),
                &[],
                "--otlp-endpoint=not a url: not a URL",
            ),
            (
                None,
                &[(TRACES_ENDPOINT_VAR, "grpc://c:4317")],
                "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT=grpc://c:4317: scheme grpc",
            ),
            (
                Some("http://c:4317"),
                &[("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc")],
                "OTEL_EXPORTER_OTLP_PROTOCOL=grpc: ",
            ),
            (
                Some("http://c:4318"),
                &[("OTEL_EXPORTER_OTLP_TIMEOUT", "2s")],
                "OTEL_EXPORTER_OTLP_TIMEOUT=2s: ",
            ),
        ];
        for (flag, env, expected) in cases {
            let error = resolve(flag, env).unwrap_err();
            assert!(error.starts_with(expected), "{error}");
        }
        assert!(
            resolve(
                Some("http://c:4318"),
                &[("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf")]
            )
            .is_ok()
        );
    }

    #[test]
    fn the_samplers_the_sdk_does_not_know_are_warned_of() {
        let warn = |s: &str, a: Option<&str>| sampler_warning(Some(s.into()), a.map(Into::into));
        assert_eq!(sampler_warning(None, None), None);
        for sampler in [
            "always_on",
            "always_off",
            "parentbased_always_on",
            "parentbased_always_off",
        ] {
            assert_eq!(warn(sampler, None), None);
        }
        assert_eq!(warn("traceidratio", Some("0.25")), None);
        assert_eq!(warn("parentbased_traceidratio", Some("1")), None);
        assert!(warn("parentbased_traceidratio", Some("2")).is_some());
        assert!(warn("traceidratio", None).is_some());
        assert!(
            warn("sometimes", None)
                .unwrap()
                .starts_with("OTEL_TRACES_SAMPLER=sometimes")
        );
    }

    /// Log lines written to memory.
    #[derive(Clone, Default)]
    struct Buffer(Arc<Mutex<Vec<u8>>>);

    impl std::io::Write for Buffer {
        fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(bytes);
            Ok(bytes.len())
        }

        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    /// The subscriber [`super::super::init`] installs, with the log filter at `info` and
    /// the spans going to an in-memory exporter.
    fn subscriber(
        exporter: &InMemorySpanExporter,
        logs: &Buffer,
    ) -> (impl Subscriber + Send + Sync, SdkTracerProvider) {
        let logs = logs.clone();
        let provider = SdkTracerProvider::builder()
            .with_simple_exporter(exporter.clone())
            .build();
        let logs = tracing_subscriber::fmt::layer()
            .json()
            .flatten_event(true)
            .with_current_span(true)
            .with_span_list(false)
            .with_writer(move || logs.clone())
            .with_filter(EnvFilter::new("info"));
        let subscriber = tracing_subscriber::registry()
            .with(layer(&provider, "test"))
            .with(logs);
        (subscriber, provider)
    }

    fn attribute(span: &SpanData, key: &str) -> Option<String> {
        span.attributes
            .iter()
            .find(|kv| kv.key.as_str() == key)
            .map(|kv| kv.value.to_string())
    }

    /// A reconcile span with a request inside is exported as parent and child though the
    /// request's span is at `DEBUG` and the logs at `INFO`; requests outside a reconcile,
    /// and kube-runtime's span around it, are not exported.
    #[test]
    fn a_reconcile_and_its_requests_are_exported_as_parent_and_children() {
        let exporter = InMemorySpanExporter::default();
        let logs = Buffer::default();
        let (subscriber, provider) = subscriber(&exporter, &logs);
        tracing::subscriber::with_default(subscriber, || {
            let outer =
                tracing::info_span!(target: "kube_runtime::controller", "reconciling object");
            let _outer = outer.enter();
            let mut object = k8s_openapi::api::core::v1::ConfigMap::default();
            object.metadata.namespace = Some("ns".into());
            object.metadata.name = Some("a".into());
            object.metadata.generation = Some(3);
            let span = crate::runner::guard::reconcile_span("podset", &object, "ns/a");
            let _entered = span.enter();
            let request = http::Request::get(
                "https://10.0.0.1:6443/api/v1/namespaces/ns/pods?labelSelector=a",
            )
            .body(())
            .unwrap();
            let http = crate::runner::client::request_span(&request);
            http.in_scope(|| tracing::debug!("requesting"));
            http.record("http.status_code", 200);
            drop(http);
            let request = http::Request::patch(
                "https://10.0.0.1:6443/apis/batch.tutorial.kubebuilder.io/v1/namespaces/ns/podsets/a/status?fieldManager=x",
            )
            .body(())
            .unwrap();
            drop(crate::runner::client::request_span(&request));
            tracing::info!("reconciled");
            crate::runner::guard::record_result(&span, "error");
            drop(_entered);
            drop(span);
            drop(_outer);
            // A request outside any reconcile (a watch, a lease renewal): not exported.
            drop(crate::runner::client::request_span(&request));
        });
        provider.force_flush().unwrap();
        let spans = exporter.get_finished_spans().unwrap();
        let names: Vec<&str> = spans.iter().map(|s| s.name.as_ref()).collect();
        assert_eq!(
            names,
            ["GET pods", "PATCH podsets/status", "reconcile"],
            "{spans:#?}"
        );
        let reconcile = &spans[2];
        assert_eq!(
            reconcile.parent_span_id,
            opentelemetry::trace::SpanId::INVALID,
            "a root span"
        );
        for request in &spans[..2] {
            assert_eq!(request.parent_span_id, reconcile.span_context.span_id());
            assert_eq!(
                request.span_context.trace_id(),
                reconcile.span_context.trace_id()
            );
            assert_eq!(request.span_kind, SpanKind::Client);
        }
        assert_eq!(attribute(&spans[0], "http.method").as_deref(), Some("GET"));
        assert_eq!(
            attribute(&spans[0], "http.url").as_deref(),
            Some("/api/v1/namespaces/ns/pods?labelSelector=a")
        );
        assert_eq!(
            attribute(&spans[0], "http.status_code").as_deref(),
            Some("200")
        );
        assert_eq!(spans[0].events.len(), 0, "DEBUG events are not exported");
        for (key, value) in [
            ("controller", "podset"),
            ("object", "ns/a"),
            ("namespace", "ns"),
            ("object.name", "a"),
            ("generation", "3"),
            ("result", "error"),
        ] {
            assert_eq!(
                attribute(reconcile, key).as_deref(),
                Some(value),
                "{key}: {reconcile:#?}"
            );
        }
        assert_eq!(
            attribute(reconcile, "trace_id"),
            Some(reconcile.span_context.trace_id().to_string())
        );
        assert!(matches!(
            reconcile.status,
            opentelemetry::trace::Status::Error { .. }
        ));
        assert_eq!(reconcile.events.len(), 1, "the INFO event inside");
        // The log line inside the reconcile carries its trace id.
        let logs = String::from_utf8(logs.0.lock().unwrap().clone()).unwrap();
        let line: serde_json::Value = serde_json::from_str(logs.lines().next().unwrap()).unwrap();
        assert_eq!(line["message"], "reconciled", "{logs}");
        assert_eq!(
            line["span"]["trace_id"].as_str(),
            Some(reconcile.span_context.trace_id().to_string().as_str()),
            "{logs}"
        );
        assert_eq!(logs.lines().count(), 1, "no DEBUG line: {logs}");
    }
    /// A span on the real pipeline: posted as OTLP/HTTP protobuf to the collector's
    /// `/v1/traces` by the batch processor on this (current-thread) runtime, flushed by
    /// the shutdown at exit.
    #[tokio::test]
    async fn spans_are_posted_to_the_collector_and_flushed_at_exit() {
        let posted = Arc::new(Mutex::new(Vec::<(String, usize)>::new()));
        let seen = posted.clone();
        let app = axum::Router::new().route(
            "/v1/traces",
            axum::routing::post(move |headers: http::HeaderMap, body: axum::body::Bytes| {
                let seen = seen.clone();
                async move {
                    let kind = headers
                        .get(http::header::CONTENT_TYPE)
                        .and_then(|v| v.to_str().ok())
                        .unwrap_or_default()
                        .to_owned();
                    seen.lock().unwrap().push((kind, body.len()));
                }
            }),
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, app).await });
        let config = resolve(Some(&format!("http://{address}")), &[])
            .unwrap()
            .unwrap();
        let provider = provider(&config).unwrap();
        let subscriber = tracing_subscriber::registry().with(layer(&provider, "test"));
        tracing::subscriber::with_default(subscriber, || {
            tracing::info_span!("reconcile").in_scope(|| tracing::info!("inside"));
        });
        assert!(
            posted.lock().unwrap().is_empty(),
            "sent in batches, not one by one"
        );
        let telemetry = super::super::Telemetry {
            provider: Some(provider),
        };
        telemetry.shutdown().await;
        let posted = posted.lock().unwrap();
        assert_eq!(posted.len(), 1, "{posted:?}");
        assert_eq!(posted[0].0, "application/x-protobuf");
        assert!(posted[0].1 > 0);
    }

    /// A collector that takes the connection and never answers holds up the exit for
    /// [`SHUTDOWN_WAIT`], not for the export's timeout.
    #[tokio::test]
    async fn a_collector_that_does_not_answer_holds_up_the_exit_briefly() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap();
        let config = resolve(Some(&format!("http://{address}")), &[])
            .unwrap()
            .unwrap();
        let provider = provider(&config).unwrap();
        let subscriber = tracing_subscriber::registry().with(layer(&provider, "test"));
        tracing::subscriber::with_default(subscriber, || {
            drop(tracing::info_span!("reconcile"));
        });
        let start = std::time::Instant::now();
        super::super::Telemetry {
            provider: Some(provider),
        }
        .shutdown()
        .await;
        let waited = start.elapsed();
        assert!(
            waited >= SHUTDOWN_WAIT && waited < SHUTDOWN_WAIT + Duration::from_secs(1),
            "{waited:?}"
        );
        drop(listener);
    }
}
