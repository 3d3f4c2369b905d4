//! The command line every operator shares: `<operator> run` (the default) and
//! `<operator> crd`, with the flag names of a kubebuilder-generated manager.

use std::{net::SocketAddr, str::FromStr, time::Duration};

use clap::{Args, Parser, Subcommand};

use crate::namespaces::{StreamingLists, WatchNamespaces};
pub(super) use crate::runner::leader::LeaderElectionMode;

/// The command line of an operator binary.
#[derive(Debug, Clone, Parser)]
#[command(version, about, args_conflicts_with_subcommands = false)]
pub(super) struct Cli {
    /// What to do; `run` when omitted.
    #[command(subcommand)]
    pub command: Option<Command>,

    /// Flags of `run`, also accepted without the subcommand (as a kubebuilder manager takes them).
    #[command(flatten)]
    pub run: RunArgs,
}

/// The subcommands.
#[derive(Debug, Clone, Subcommand)]
pub(super) enum Command {
    /// Run the operator (the default).
    Run,
    /// Print the CustomResourceDefinition as YAML on stdout.
    Crd,
}

impl Cli {
    /// Parses the process arguments, naming the program `name` in help and errors.
    #[must_use]
    pub(super) fn parse_for(name: &'static str) -> Self {
        Self::parse_from_for(name, std::env::args_os())
    }

    /// Parses `args` (the first one is the program name); exits with a usage message on error.
    pub(super) fn parse_from_for<I, T>(name: &'static str, args: I) -> Self
    where
        I: IntoIterator<Item = T>,
        T: Into<std::ffi::OsString> + Clone,
    {
        match Self::try_parse_from_for(name, args) {
            Ok(cli) => cli,
            Err(e) => e.exit(),
        }
    }

    /// Parses `args` (the first one is the program name). With `--leader-elect`, the
    /// election timing is checked as client-go checks it (see [`crate::runner::leader::validate_timing`]);
    /// `--kube-api-qps` and `--kube-api-burst` are checked always ([`RunArgs::client_rate_limit`]).
    ///
    /// # Errors
    /// A clap error describing the bad flag.
    pub(super) fn try_parse_from_for<I, T>(name: &'static str, args: I) -> Result<Self, clap::Error>
    where
        I: IntoIterator<Item = T>,
        T: Into<std::ffi::OsString> + Clone,
    {
        use clap::{CommandFactory, FromArgMatches};
        let mut command = <Self as CommandFactory>::command()
            .name(name)
            .bin_name(name);
        let matches = command.try_get_matches_from_mut(args)?;
        let cli = Self::from_arg_matches(&matches)?;
        if cli.run.leader_elect {
            let a = &cli.run;
            crate::runner::leader::validate_timing(
                a.lease_duration,
                a.renew_deadline,
                a.retry_period,
            )
            .map_err(|msg| command.error(clap::error::ErrorKind::ValueValidation, msg))?;
        }
        cli.run
            .client_rate_limit()
            .map_err(|msg| command.error(clap::error::ErrorKind::ValueValidation, msg))?;
        Ok(cli)
    }

    /// The subcommand, defaulting to `run`.
    #[must_use]
    pub(super) fn subcommand(&self) -> Command {
        self.command.clone().unwrap_or(Command::Run)
    }
}

/// Flags of `run`.
#[derive(Debug, Clone, Args)]
pub(super) struct RunArgs {
    /// Enable leader election, so only one replica reconciles at a time
    /// (`--enable-leader-election` is the older kubebuilder scaffold's name).
    #[arg(long, visible_alias = "enable-leader-election", global = true, num_args = 0..=1, default_missing_value = "true", default_value = "false", value_name = "BOOL")]
    pub leader_elect: bool,

    /// Name of the Lease used for leader election (default: `<operator>-leader`).
    #[arg(long, global = true, value_name = "NAME")]
    pub leader_election_id: Option<String>,

    /// Namespace of the leader-election Lease (default: the pod's own namespace, else `default`).
    #[arg(long, global = true, value_name = "NAMESPACE")]
    pub leader_election_namespace: Option<String>,

    /// How leadership is held.
    #[arg(long, global = true, value_enum, default_value_t = LeaderElectionMode::Lease)]
    pub leader_election_mode: LeaderElectionMode,

    /// How long a Lease stays valid without renewal (non-leaders wait this long before taking over).
    #[arg(long = "leader-elect-lease-duration", global = true, default_value = "15s", value_parser = parse_duration)]
    pub lease_duration: Duration,

    /// How long the leader keeps retrying to renew before it gives up leadership.
    #[arg(long = "leader-elect-renew-deadline", global = true, default_value = "10s", value_parser = parse_duration)]
    pub renew_deadline: Duration,

    /// How often candidates try to acquire and the leader renews.
    #[arg(long = "leader-elect-retry-period", global = true, default_value = "2s", value_parser = parse_duration)]
    pub retry_period: Duration,

    /// Address of the Prometheus `/metrics` endpoint (`:8080` = all interfaces; `0` disables it).
    #[arg(long, visible_alias = "metrics-addr", global = true, default_value = ":8080", value_parser = BindAddress::parse, value_name = "ADDR")]
    pub metrics_bind_address: BindAddress,

    /// Address of the `/healthz` and `/readyz` endpoints (`0` disables them).
    #[arg(long, global = true, default_value = ":8081", value_parser = BindAddress::parse, value_name = "ADDR")]
    pub health_probe_bind_address: BindAddress,

    /// Serve `/metrics` over HTTPS, every request authenticated (TokenReview) and authorized
    /// (SubjectAccessReview: the request's verb on its path, e.g. `get` `/metrics`) against
    /// the API server, as a kubebuilder v4 manager does; `deploy/` runs it on `:8443`.
    /// `false`: plain HTTP without authentication.
    #[arg(long, global = true, num_args = 0..=1, default_missing_value = "true", default_value = "false", value_name = "BOOL")]
    pub metrics_secure: bool,

    /// Directory with the metrics server's certificate and key (`--metrics-cert-name`,
    /// `--metrics-cert-key`); unset: a self-signed certificate generated at startup.
    #[arg(
        long,
        visible_alias = "metrics-cert-dir",
        global = true,
        value_name = "DIR"
    )]
    pub metrics_cert_path: Option<std::path::PathBuf>,

    /// File name of the metrics server's PEM certificate (chain) in `--metrics-cert-path`.
    #[arg(long, global = true, default_value = "tls.crt", value_name = "FILE")]
    pub metrics_cert_name: String,

    /// File name of the metrics server's PEM private key in `--metrics-cert-path`.
    #[arg(long, global = true, default_value = "tls.key", value_name = "FILE")]
    pub metrics_cert_key: String,

    /// How many objects of the primary kind are reconciled at once, per watched namespace
    /// (one object is never reconciled twice at once).
    #[arg(long, global = true, default_value_t = 4, value_parser = clap::value_parser!(u16).range(1..))]
    pub max_concurrent_reconciles: u16,

    /// How long an object's triggers must be quiet before it is reconciled (0s: at once),
    /// except a spec change (a new `metadata.generation`), which reconciles at once. Watch
    /// events that arrive together (pods becoming Ready one after another) then cost one
    /// reconcile and one status write instead of one each.
    #[arg(long, global = true, default_value = "500ms", value_parser = parse_duration, value_name = "DURATION")]
    pub reconcile_debounce: Duration,

    /// Client-side rate limit of the requests to the Kubernetes API server, as client-go's
    /// token bucket: requests per second on average. Negative (the default, as
    /// controller-runtime's since v0.21) means no client-side limit; 20 was
    /// controller-runtime's default up to v0.20. Every request waits for a token; a watch
    /// takes one when it starts and holds none. Answers 429 Too Many Requests (and 503 with
    /// Retry-After) are retried after their Retry-After (at most 10 s; 1 s, 2 s, 4 s, ...
    /// without it), 5 attempts in all.
    #[arg(long, global = true, default_value_t = crate::runner::rate_limit::DEFAULT_QPS, value_name = "QPS")]
    pub kube_api_qps: f32,

    /// Requests to the Kubernetes API server allowed at once after a quiet spell: the size
    /// of the `--kube-api-qps` token bucket (at least 1; 30 is controller-runtime's default
    /// up to v0.20).
    #[arg(long, global = true, default_value_t = crate::runner::rate_limit::DEFAULT_BURST, value_name = "N")]
    pub kube_api_burst: u32,

    /// How the caches fill: streaming lists (a watch with `sendInitialEvents`, the API
    /// server's WatchList), where objects arrive one by one, so a start or a relist never
    /// holds a page of 500 whole objects; or paginated lists. `auto` (the default) asks the
    /// API server once per watched scope and uses streaming lists where it serves them
    /// (Kubernetes 1.32 and 1.34 onwards by default; not 1.33, not before 1.32, not with
    /// `--feature-gates=WatchList=false`); `true` always streams, `false` always pages.
    #[arg(long, global = true, num_args = 0..=1, default_missing_value = "true", default_value = "auto", value_name = "auto|true|false")]
    pub streaming_lists: StreamingLists,

    /// Namespaces to watch: empty = all, `a` = one, `a,b` = several. Nothing outside is read or touched.
    #[arg(
        long,
        global = true,
        env = "WATCH_NAMESPACE",
        default_value = "",
        hide_default_value = true,
        value_name = "NAMESPACES"
    )]
    pub watch_namespace: WatchNamespaces,

    /// Log format.
    #[arg(long, visible_alias = "zap-encoder", global = true, value_parser = parse_log_format, value_name = "json|text")]
    pub log_format: Option<LogFormat>,

    /// Log level or tracing filter (`info`, `debug`, `warn,podset_operator=debug`); RUST_LOG wins over it.
    #[arg(
        long,
        visible_alias = "zap-log-level",
        global = true,
        value_name = "LEVEL"
    )]
    pub log_level: Option<String>,

    /// Development logging defaults (text format, debug level), as zap's development mode.
    #[arg(long, global = true, num_args = 0..=1, default_missing_value = "true", default_value = "false", value_name = "BOOL")]
    pub zap_devel: bool,

    /// Accepted for compatibility with zap (`debug`..`fatal`); tracing prints no stack
    /// traces, so it changes nothing.
    #[arg(long, global = true, value_parser = parse_zap_level_name, value_name = "LEVEL")]
    pub zap_stacktrace_level: Option<String>,

    /// Timestamp format of log lines, as zap's: `epoch`, `millis`, `nano`, `iso8601`,
    /// `rfc3339` or `rfc3339nano` (default: RFC 3339 with microseconds).
    #[arg(long, global = true, value_parser = parse_time_encoding, value_name = "ENCODING")]
    pub zap_time_encoding: Option<TimeEncoding>,

    /// Export traces to this OpenTelemetry collector: the base URL of its OTLP/HTTP
    /// receiver (`http://otel-collector:4318`; `/v1/traces` is appended). Traces are off
    /// when neither this nor `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` is set; the SDKs' other
    /// `OTEL_*` variables apply (`OTEL_SERVICE_NAME`, `OTEL_TRACES_SAMPLER`, ...).
    #[arg(
        long,
        global = true,
        env = "OTEL_EXPORTER_OTLP_ENDPOINT",
        value_name = "URL"
    )]
    pub otlp_endpoint: Option<String>,
}

/// How log lines carry their timestamp (zap's `--zap-time-encoding`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum TimeEncoding {
    /// Seconds since the Unix epoch, with a fraction (`1732363980.123456`).
    Epoch,
    /// Milliseconds since the Unix epoch, with a fraction.
    Millis,
    /// Nanoseconds since the Unix epoch.
    Nano,
    /// ISO 8601 with milliseconds (`2026-11-23T12:00:00.123Z`).
    Iso8601,
    /// RFC 3339 to the second (`2026-11-23T12:00:00Z`).
    Rfc3339,
    /// RFC 3339 with nanoseconds.
    Rfc3339Nano,
}

impl TimeEncoding {
    /// `t` in this encoding; `None` (no flag) is RFC 3339 with microseconds.
    #[must_use]
    pub(super) fn format(encoding: Option<Self>, t: jiff::Timestamp) -> String {
        let nanos = t.as_nanosecond();
        #[allow(clippy::cast_precision_loss)]
        match encoding {
            Some(TimeEncoding::Epoch) => format!("{:.6}", nanos as f64 / 1e9),
            Some(TimeEncoding::Millis) => format!("{:.3}", nanos as f64 / 1e6),
            Some(TimeEncoding::Nano) => nanos.to_string(),
            Some(TimeEncoding::Iso8601) => t.strftime("%Y-%m-%dT%H:%M:%S%.3fZ").to_string(),
            Some(TimeEncoding::Rfc3339) => t.strftime("%Y-%m-%dT%H:%M:%SZ").to_string(),
            Some(TimeEncoding::Rfc3339Nano) => t.strftime("%Y-%m-%dT%H:%M:%S%.9fZ").to_string(),
            None => t.strftime("%Y-%m-%dT%H:%M:%S%.6fZ").to_string(),
        }
    }
}

/// Parses zap's time encodings (case-insensitive; zap also takes `ISO8601` and `RFC3339Nano`).
fn parse_time_encoding(s: &str) -> Result<TimeEncoding, String> {
    match s.trim().to_ascii_lowercase().as_str() {
        "epoch" => Ok(TimeEncoding::Epoch),
        "millis" => Ok(TimeEncoding::Millis),
        "nano" => Ok(TimeEncoding::Nano),
        "iso8601" => Ok(TimeEncoding::Iso8601),
        "rfc3339" => Ok(TimeEncoding::Rfc3339),
        "rfc3339nano" => Ok(TimeEncoding::Rfc3339Nano),
        other => Err(format!(
            "unknown time encoding `{other}`: use epoch, millis, nano, iso8601, rfc3339 or rfc3339nano"
        )),
    }
}

/// Accepts zap's level names (for flags that are accepted but have no effect here).
fn parse_zap_level_name(s: &str) -> Result<String, String> {
    let level = s.trim().to_ascii_lowercase();
    match level.as_str() {
        "debug" | "info" | "warn" | "error" | "dpanic" | "panic" | "fatal" => Ok(level),
        other => Err(format!(
            "unknown level `{other}`: use debug, info, warn, error, dpanic, panic or fatal"
        )),
    }
}

/// A listen address; `None` when disabled with `0`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct BindAddress(pub Option<SocketAddr>);

impl BindAddress {
    fn parse(s: &str) -> Result<Self, String> {
        parse_bind_address(s).map(BindAddress)
    }
}

/// Log line format.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum LogFormat {
    /// One JSON object per line.
    Json,
    /// Human-readable text (zap's `console`).
    Text,
}

impl RunArgs {
    /// The log format, after `--zap-devel` defaults (json otherwise, as a zap production logger).
    #[must_use]
    pub(super) fn effective_log_format(&self) -> LogFormat {
        self.log_format.unwrap_or(if self.zap_devel {
            LogFormat::Text
        } else {
            LogFormat::Json
        })
    }

    /// The tracing filter directive from the flags (`RUST_LOG` is applied when logging starts).
    #[must_use]
    pub(super) fn effective_log_level(&self) -> String {
        match self.log_level.as_deref() {
            Some(level) => zap_level_to_directive(level),
            None if self.zap_devel => "debug".to_owned(),
            None => "info".to_owned(),
        }
    }

    /// The API client's rate limit from `--kube-api-qps` and `--kube-api-burst`.
    ///
    /// # Errors
    /// A message naming the flag whose value is out of range.
    pub(super) fn client_rate_limit(
        &self,
    ) -> Result<crate::runner::rate_limit::ClientRateLimit, String> {
        crate::runner::rate_limit::ClientRateLimit::new(self.kube_api_qps, self.kube_api_burst)
    }

    /// The namespace of the leader-election Lease: the flag, else the pod's own namespace, else `default`.
    #[must_use]
    pub(super) fn leader_election_namespace(&self) -> String {
        self.leader_election_namespace
            .clone()
            .filter(|ns| !ns.is_empty())
            .or_else(own_namespace)
            .unwrap_or_else(|| "default".to_owned())
    }

    /// The name of the leader-election Lease: the flag, else `<operator>-leader`.
    #[must_use]
    pub(super) fn leader_election_id(&self, operator: &str) -> String {
        self.leader_election_id
            .clone()
            .filter(|id| !id.is_empty())
            .unwrap_or_else(|| format!("{operator}-leader"))
    }
}

/// The namespace this pod runs in: `POD_NAMESPACE`, else the service account's namespace file.
fn own_namespace() -> Option<String> {
    std::env::var("POD_NAMESPACE")
        .ok()
        .or_else(|| {
            std::fs::read_to_string("/var/run/secrets/kubernetes.io/serviceaccount/namespace").ok()
        })
        .map(|ns| ns.trim().to_owned())
        .filter(|ns| !ns.is_empty())
}

/// zap levels are names or integers (`-1`/`2` etc. = more verbose); tracing has no levels
/// below `trace`, so every negative number means `debug` or `trace`.
fn zap_level_to_directive(level: &str) -> String {
    match level.trim() {
        "panic" | "dpanic" | "fatal" => "error".to_owned(),
        "warning" => "warn".to_owned(),
        n if n.parse::<i64>().is_ok() => match n.parse::<i64>().unwrap_or(0) {
            i64::MIN..=-2 => "trace".to_owned(),
            -1 => "debug".to_owned(),
            0 => "info".to_owned(),
            1 => "warn".to_owned(),
            _ => "error".to_owned(),
        },
        other => other.to_owned(),
    }
}

/// Parses `json`, `text` or zap's `console`.
fn parse_log_format(s: &str) -> Result<LogFormat, String> {
    match s.trim().to_ascii_lowercase().as_str() {
        "json" => Ok(LogFormat::Json),
        "text" | "console" => Ok(LogFormat::Text),
        other => Err(format!(
            "unknown log format `{other}`: use json or text (console)"
        )),
    }
}

/// Parses a Go-style listen address: `:8080` (all interfaces), `127.0.0.1:8080`,
/// `[::1]:8080`, `localhost:8080`; `0` (or empty) disables the server (`None`).
///
/// # Errors
/// A message saying what shape is expected (clap prefixes it with the flag's name).
pub(super) fn parse_bind_address(s: &str) -> Result<Option<SocketAddr>, String> {
    let s = s.trim();
    if s.is_empty() || s == "0" {
        return Ok(None);
    }
    let bad =
        || format!("`{s}` is not a listen address: use `:PORT`, `HOST:PORT`, or `0` to disable");
    let (host, port) = s.rsplit_once(':').ok_or_else(bad)?;
    let port: u16 = port.parse().map_err(|_| bad())?;
    let host = host.trim_start_matches('[').trim_end_matches(']');
    let ip = match host {
        "" | "0.0.0.0" => std::net::IpAddr::from([0, 0, 0, 0]),
        "localhost" => std::net::IpAddr::from([127, 0, 0, 1]),
        other => std::net::IpAddr::from_str(other).map_err(|_| bad())?,
    };
    Ok(Some(SocketAddr::new(ip, port)))
}

/// Parses a Go duration (`time.ParseDuration`): a sequence of decimal numbers, each
/// with a unit (`ns`, `us`/`µs`, `ms`, `s`, `m`, `h`), e.g. `1m30s`, `500ms`, `2.5s`,
/// `1h`, `0s`, `0`; a plain number is taken as seconds (as before). Negative durations
/// are refused: nothing here waits a negative time.
///
/// # Errors
/// A message naming the accepted units.
pub(super) fn parse_duration(s: &str) -> Result<Duration, String> {
    let s = s.trim();
    let bad = || format!("`{s}` is not a duration: use e.g. 15s, 500ms, 1m30s, 2.5s, 1h");
    let rest = s.strip_prefix('+').unwrap_or(s);
    if rest.is_empty() {
        return Err(bad());
    }
    if rest == "0" {
        return Ok(Duration::ZERO);
    }
    if let Ok(secs) = rest.parse::<f64>() {
        return Duration::try_from_secs_f64(secs).map_err(|_| bad());
    }
    let mut total = 0f64;
    let mut rest = rest;
    while !rest.is_empty() {
        let num_end = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .ok_or_else(bad)?;
        let (num, tail) = rest.split_at(num_end);
        if num.is_empty() || num == "." {
            return Err(bad());
        }
        let n: f64 = num.parse().map_err(|_| bad())?;
        let unit_end = tail
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(tail.len());
        let (unit, tail) = tail.split_at(unit_end);
        let scale = match unit {
            "ns" => 1e-9,
            "us" | "\u{b5}s" | "\u{3bc}s" => 1e-6,
            "ms" => 1e-3,
            "s" => 1.0,
            "m" => 60.0,
            "h" => 3600.0,
            _ => return Err(bad()),
        };
        total += n * scale;
        rest = tail;
    }
    Duration::try_from_secs_f64(total).map_err(|_| bad())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    fn parse(args: &[&str]) -> Cli {
        let mut all = vec!["op"];
        all.extend_from_slice(args);
        Cli::try_parse_from_for("op", all).unwrap()
    }

    #[test]
    fn defaults_match_kubebuilder() {
        // SAFETY of the test: WATCH_NAMESPACE is not set in the test environment.
        let cli = parse(&[]);
        assert!(matches!(cli.subcommand(), Command::Run));
        let a = cli.run;
        assert!(!a.leader_elect);
        assert_eq!(
            a.metrics_bind_address.0,
            Some("0.0.0.0:8080".parse().unwrap())
        );
        assert_eq!(
            a.health_probe_bind_address.0,
            Some("0.0.0.0:8081".parse().unwrap())
        );
        assert_eq!(a.lease_duration, Duration::from_secs(15));
        assert_eq!(a.renew_deadline, Duration::from_secs(10));
        assert_eq!(a.retry_period, Duration::from_secs(2));
        assert_eq!(a.max_concurrent_reconciles, 4);
        assert_eq!(a.reconcile_debounce, Duration::from_millis(500));
        assert_eq!(a.effective_log_format(), LogFormat::Json);
        assert_eq!(a.effective_log_level(), "info");
        assert_eq!(
            a.leader_election_id("podset-operator"),
            "podset-operator-leader"
        );
        assert_eq!(a.leader_election_mode, LeaderElectionMode::Lease);
        assert_eq!(
            a.client_rate_limit().unwrap(),
            crate::runner::rate_limit::ClientRateLimit::default()
        );
    }

    /// Asking the API server by default; `true` or `false` force either way.
    #[test]
    fn streaming_lists_flag() {
        assert_eq!(parse(&[]).run.streaming_lists, StreamingLists::Auto);
        assert_eq!(
            parse(&["--streaming-lists=false"]).run.streaming_lists,
            StreamingLists::Never
        );
        assert_eq!(
            parse(&["--streaming-lists=true"]).run.streaming_lists,
            StreamingLists::Always
        );
        assert_eq!(
            parse(&["--streaming-lists"]).run.streaming_lists,
            StreamingLists::Always
        );
        assert_eq!(
            parse(&["--streaming-lists=auto"]).run.streaming_lists,
            StreamingLists::Auto
        );
        assert!(
            Cli::try_parse_from_for("op", ["op", "--streaming-lists=maybe"])
                .unwrap_err()
                .to_string()
                .contains("--streaming-lists")
        );
    }

    /// controller-runtime's defaults (no client-side limit since v0.21; burst 30 once a
    /// rate is set), and values out of range refused with the flag named, as the election
    /// timing is.
    #[test]
    fn kube_api_rate_limit_flags() {
        let a = parse(&[]).run;
        assert!(a.kube_api_qps < 0.0);
        assert_eq!(a.kube_api_burst, 30);
        let limit = a.client_rate_limit().unwrap();
        assert!(limit.is_unlimited());
        assert_eq!(limit.burst(), 30);
        let a = parse(&["run", "--kube-api-qps=20"]).run;
        assert!(!a.client_rate_limit().unwrap().is_unlimited());

        let a = parse(&["run", "--kube-api-qps=2.5", "--kube-api-burst", "1"]).run;
        let limit = a.client_rate_limit().unwrap();
        assert!((limit.qps() - 2.5).abs() < f32::EPSILON);
        assert_eq!(limit.burst(), 1);
        // Global: also before the subcommand.
        let a = parse(&["--kube-api-qps", "100", "--kube-api-burst=150", "run"]).run;
        assert_eq!(a.kube_api_burst, 150);

        for (flags, expected) in [
            (
                &["--kube-api-qps=0"][..],
                "--kube-api-qps (0) must be a finite number greater than zero",
            ),
            (
                &["--kube-api-qps=NaN"],
                "--kube-api-qps (NaN) must be a finite number greater than zero",
            ),
            (
                &["--kube-api-qps=inf"],
                "--kube-api-qps (inf) must be a finite number greater than zero",
            ),
            (
                &["--kube-api-burst=0"],
                "--kube-api-burst (0) must be at least 1",
            ),
            // Not numbers at all: clap's own error, naming the flag too.
            (&["--kube-api-qps=fast"], "--kube-api-qps"),
            (&["--kube-api-burst=-1"], "--kube-api-burst"),
            (&["--kube-api-burst=2.5"], "--kube-api-burst"),
        ] {
            let mut args = vec!["op"];
            args.extend_from_slice(flags);
            let err = Cli::try_parse_from_for("op", args).unwrap_err();
            assert!(err.to_string().contains(expected), "{flags:?}: {err}");
        }
        let help = Cli::try_parse_from_for("op", ["op", "run", "--help"])
            .unwrap_err()
            .to_string();
        for expected in [
            "--kube-api-qps",
            "[default: -1]",
            "--kube-api-burst",
            "[default: 30]",
        ] {
            assert!(help.contains(expected), "{expected} missing in:\n{help}");
        }
    }

    #[test]
    fn subcommands_and_flags_in_both_positions() {
        assert!(matches!(parse(&["crd"]).subcommand(), Command::Crd));
        let a = parse(&["run", "--leader-elect", "--metrics-bind-address=0"]).run;
        assert!(a.leader_elect);
        assert_eq!(a.metrics_bind_address.0, None);
        let a = parse(&["--leader-elect=false", "run"]).run;
        assert!(!a.leader_elect);
        let a = parse(&["--leader-elect=true", "--watch-namespace", "a,b"]).run;
        assert!(a.leader_elect);
        assert_eq!(
            a.watch_namespace,
            WatchNamespaces::Many(vec!["a".into(), "b".into()])
        );
    }

    #[test]
    fn zap_aliases() {
        let a = parse(&["--zap-log-level", "debug", "--zap-encoder", "console"]).run;
        assert_eq!(a.effective_log_level(), "debug");
        assert_eq!(a.effective_log_format(), LogFormat::Text);
        let a = parse(&["--zap-devel"]).run;
        assert_eq!(a.effective_log_format(), LogFormat::Text);
        assert_eq!(a.effective_log_level(), "debug");
        let a = parse(&["--zap-log-level=2"]).run;
        assert_eq!(a.effective_log_level(), "error");
        let a = parse(&["--log-format", "json", "--log-level", "warn,kube=debug"]).run;
        assert_eq!(a.effective_log_format(), LogFormat::Json);
        assert_eq!(a.effective_log_level(), "warn,kube=debug");
    }

    #[test]
    fn bad_flags_name_the_flag() {
        let err = Cli::try_parse_from_for("op", ["op", "--metrics-bind-address", "nonsense"])
            .unwrap_err();
        assert!(err.to_string().contains("--metrics-bind-address"), "{err}");
        let err = Cli::try_parse_from_for("op", ["op", "--watch-namespace", "Bad_NS"]).unwrap_err();
        assert!(err.to_string().contains("WATCH_NAMESPACE"), "{err}");
        let err = Cli::try_parse_from_for("op", ["op", "--log-format", "xml"]).unwrap_err();
        assert!(err.to_string().contains("--log-format"), "{err}");
        assert!(Cli::try_parse_from_for("op", ["op", "--max-concurrent-reconciles", "0"]).is_err());
    }

    /// clap is built without `color` and `suggestions`: help and errors still say
    /// what they must, in plain text (no escape codes in a pod's logs).
    #[test]
    fn help_and_errors_work_without_color_and_suggestions() {
        let help = Cli::try_parse_from_for("op", ["op", "--help"]).unwrap_err();
        assert_eq!(help.kind(), clap::error::ErrorKind::DisplayHelp);
        let text = help.to_string();
        for expected in ["Usage: op", "run", "crd", "--help"] {
            assert!(text.contains(expected), "{expected} missing in:\n{text}");
        }
        let run_help = Cli::try_parse_from_for("op", ["op", "run", "--help"]).unwrap_err();
        let text = run_help.to_string();
        for expected in [
            "--leader-elect",
            "--metrics-bind-address",
            "--watch-namespace",
            "WATCH_NAMESPACE",
        ] {
            assert!(text.contains(expected), "{expected} missing in:\n{text}");
        }
        assert!(!text.contains('\u{1b}'), "escape codes in help:\n{text}");
        let err = Cli::try_parse_from_for("op", ["op", "--leader-electt"]).unwrap_err();
        assert_eq!(err.kind(), clap::error::ErrorKind::UnknownArgument);
        let text = err.to_string();
        // error-context: the argument and the usage line.
        assert!(text.contains("--leader-electt"), "{text}");
        assert!(text.contains("Usage: op"), "{text}");
        assert!(
            !text.contains('\u{1b}'),
            "escape codes in the error:\n{text}"
        );
    }

    #[test]
    fn leader_election_timing_is_validated() {
        let err = Cli::try_parse_from_for(
            "op",
            [
                "op",
                "--leader-elect",
                "--leader-elect-lease-duration",
                "5s",
            ],
        )
        .unwrap_err();
        assert!(
            err.to_string()
                .contains("--leader-elect-lease-duration (5s) must be greater"),
            "{err}"
        );
        let err = Cli::try_parse_from_for(
            "op",
            ["op", "--leader-elect", "--leader-elect-retry-period=9s"],
        )
        .unwrap_err();
        assert!(
            err.to_string().contains("--leader-elect-renew-deadline"),
            "{err}"
        );
        let err = Cli::try_parse_from_for(
            "op",
            ["op", "--leader-elect", "--leader-elect-retry-period=0s"],
        )
        .unwrap_err();
        assert!(
            err.to_string()
                .contains("--leader-elect-retry-period must be greater than zero"),
            "{err}"
        );
        // Valid sub-second timing, and no check at all without --leader-elect.
        let a = parse(&[
            "--leader-elect",
            "--leader-elect-lease-duration=1500ms",
            "--leader-elect-renew-deadline=1s",
            "--leader-elect-retry-period=500ms",
        ])
        .run;
        assert_eq!(a.lease_duration, Duration::from_millis(1500));
        assert!(
            parse(&["--leader-elect-lease-duration=1s"])
                .run
                .lease_duration
                == Duration::from_secs(1)
        );
    }

    #[test]
    fn bind_addresses() {
        assert_eq!(parse_bind_address("0").unwrap(), None);
        assert_eq!(parse_bind_address("").unwrap(), None);
        assert_eq!(
            parse_bind_address(":9090").unwrap(),
            Some("0.0.0.0:9090".parse().unwrap())
        );
        assert_eq!(
            parse_bind_address("127.0.0.1:1").unwrap(),
            Some("127.0.0.1:1".parse().unwrap())
        );
        assert_eq!(
            parse_bind_address("localhost:80").unwrap(),
            Some("127.0.0.1:80".parse().unwrap())
        );
        assert_eq!(
            parse_bind_address("[::1]:8080").unwrap(),
            Some("[::1]:8080".parse().unwrap())
        );
        assert!(parse_bind_address("8080").is_err());
        assert!(parse_bind_address(":99999").is_err());
        assert!(parse_bind_address("host.example:80").is_err());
    }

    #[test]
    fn durations() {
        assert_eq!(parse_duration("15s").unwrap(), Duration::from_secs(15));
        assert_eq!(parse_duration("500ms").unwrap(), Duration::from_millis(500));
        assert_eq!(parse_duration("2m").unwrap(), Duration::from_secs(120));
        assert_eq!(parse_duration("3").unwrap(), Duration::from_secs(3));
        assert!(parse_duration("3x").is_err());
    }

    #[test]
    fn go_style_durations() {
        let ms = Duration::from_millis;
        for (text, want) in [
            ("1m30s", ms(90_000)),
            ("500ms", ms(500)),
            ("1h", ms(3_600_000)),
            ("2.5s", ms(2500)),
            ("0s", Duration::ZERO),
            ("0", Duration::ZERO),
            ("1h2m3s4ms", ms(3_723_004)),
            ("+1.5m", ms(90_000)),
            ("1500us", Duration::from_micros(1500)),
            ("1500\u{b5}s", Duration::from_micros(1500)),
            ("2000000ns", ms(2)),
            (".5s", ms(500)),
        ] {
            let got = parse_duration(text).unwrap();
            // Float arithmetic: equal to the microsecond.
            assert!(
                got.abs_diff(want) < Duration::from_micros(1),
                "{text}: {got:?} != {want:?}"
            );
        }
        for bad in ["", "s", "1.5.2s", "-1s", "1m30", "1d", "ms", "1 s"] {
            assert!(parse_duration(bad).is_err(), "{bad} accepted");
        }
        // Every duration flag takes them.
        let a = parse(&[
            "--reconcile-debounce",
            "1m30s",
            "--leader-elect-retry-period=1.5s",
        ])
        .run;
        assert_eq!(a.reconcile_debounce, ms(90_000));
        assert_eq!(a.retry_period, ms(1500));
    }

    #[test]
    fn older_scaffold_flags() {
        let a = parse(&[
            "--metrics-addr",
            "127.0.0.1:9000",
            "--enable-leader-election",
        ])
        .run;
        assert_eq!(
            a.metrics_bind_address.0,
            Some("127.0.0.1:9000".parse().unwrap())
        );
        assert!(a.leader_elect);
        let a = parse(&["--enable-leader-election=false", "--metrics-addr=0"]).run;
        assert!(!a.leader_elect);
        assert_eq!(a.metrics_bind_address.0, None);
        let a = parse(&[
            "--zap-stacktrace-level",
            "error",
            "--zap-time-encoding",
            "ISO8601",
        ])
        .run;
        assert_eq!(a.zap_stacktrace_level.as_deref(), Some("error"));
        assert_eq!(a.zap_time_encoding, Some(TimeEncoding::Iso8601));
        assert!(Cli::try_parse_from_for("op", ["op", "--zap-stacktrace-level=loud"]).is_err());
        let err = Cli::try_parse_from_for("op", ["op", "--zap-time-encoding=sundial"]).unwrap_err();
        assert!(err.to_string().contains("--zap-time-encoding"), "{err}");
        assert_eq!(parse(&[]).run.zap_time_encoding, None);
    }

    #[test]
    fn time_encodings() {
        let t: jiff::Timestamp = "2026-11-23T12:00:00.123456789Z".parse().unwrap();
        let secs = t.as_second();
        for (enc, want) in [
            (Some(TimeEncoding::Epoch), format!("{secs}.123457")),
            (Some(TimeEncoding::Millis), format!("{secs}123.457")),
            (Some(TimeEncoding::Nano), format!("{secs}123456789")),
            (
                Some(TimeEncoding::Iso8601),
                "2026-11-23T12:00:00.123Z".to_owned(),
            ),
            (
                Some(TimeEncoding::Rfc3339),
                "2026-11-23T12:00:00Z".to_owned(),
            ),
            (
                Some(TimeEncoding::Rfc3339Nano),
                "2026-11-23T12:00:00.123456789Z".to_owned(),
            ),
            (None, "2026-11-23T12:00:00.123456Z".to_owned()),
        ] {
            assert_eq!(TimeEncoding::format(enc, t), want, "{enc:?}");
        }
    }

    #[test]
    fn the_otlp_endpoint_is_a_flag_too() {
        let a = parse(&[
            "--otlp-endpoint",
            "http://jaeger-collector.observability:4318",
        ])
        .run;
        assert_eq!(
            a.otlp_endpoint.as_deref(),
            Some("http://jaeger-collector.observability:4318")
        );
        let a = parse(&["run", "--otlp-endpoint=http://c:4318"]).run;
        assert_eq!(a.otlp_endpoint.as_deref(), Some("http://c:4318"));
    }
}
