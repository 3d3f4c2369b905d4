//! Command line and environment configuration, and its validation.
//!
//! Every setting can be given as a flag or as the environment variable of the
//! same name (the operator uses the environment). The raw values are parsed by
//! clap and then checked here, up front, so that a bad value stops the program
//! with an error naming the variable instead of failing later in the client.

use std::fmt;
use std::net::SocketAddr;
use std::path::PathBuf;

use clap::{Args, Parser, Subcommand, ValueEnum};

/// Environment variable holding the broker service URL.
pub const ENV_SERVER: &str = "PULSAR_SERVER";
/// Environment variable holding the topic name.
pub const ENV_TOPIC: &str = "PULSAR_TOPIC";
/// Environment variable holding the subscription name.
pub const ENV_SUBSCRIPTION: &str = "PULSAR_SUBSCRIPTION_NAME";
/// Environment variable holding the health/metrics listen address.
pub const ENV_HTTP_BIND: &str = "HTTP_BIND_ADDRESS";

/// Default port of `pulsar://` service URLs.
pub const DEFAULT_PLAIN_PORT: u16 = 6650;
/// Default port of `pulsar+ssl://` service URLs.
pub const DEFAULT_TLS_PORT: u16 = 6651;
/// Tenant used for short topic names (`my-topic`).
pub const DEFAULT_TENANT: &str = "public";
/// Namespace used for short topic names (`my-topic`).
pub const DEFAULT_NAMESPACE: &str = "default";

/// Consumes messages from an Apache Pulsar topic (the default), or produces
/// some for demos and tests.
#[derive(Debug, Parser)]
#[command(
    name = "pulsar-consumer",
    version,
    about,
    args_conflicts_with_subcommands = true
)]
pub struct Cli {
    /// Log output format.
    #[arg(long, env = "LOG_FORMAT", value_enum, default_value_t = LogFormat::Text, global = true)]
    pub log_format: LogFormat,

    /// What to do; `consume` when omitted.
    #[command(subcommand)]
    pub command: Option<Command>,

    /// Settings of the default `consume` command.
    #[command(flatten)]
    pub consume: ConsumeArgs,
}

/// The subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Subscribe (Shared) and log every message, acknowledging it afterwards.
    Consume(ConsumeArgs),
    /// Send messages to the topic and wait for the broker's receipts.
    Produce(ProduceArgs),
}

/// How log lines are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    /// Human-readable `key=value` lines.
    Text,
    /// One JSON object per line, event fields at the top level.
    Json,
}

/// Where a new subscription starts reading.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum InitialPosition {
    /// The oldest message still retained in the topic.
    Earliest,
    /// Only messages published after the subscription is created.
    Latest,
}

/// Broker and topic flags shared by both subcommands (raw, unvalidated).
#[derive(Debug, Clone, Default, Args)]
pub struct ConnectionArgs {
    /// Broker service URL: `pulsar://host:port` or `pulsar+ssl://host:port`.
    #[arg(long, env = ENV_SERVER)]
    pub pulsar_server: Option<String>,

    /// Topic: `my-topic`, `tenant/namespace/topic` or
    /// `persistent://tenant/namespace/topic`.
    #[arg(long, env = ENV_TOPIC)]
    pub pulsar_topic: Option<String>,

    /// PEM file of CA certificates to trust for `pulsar+ssl://` (instead of
    /// the built-in web PKI roots).
    #[arg(long, env = "PULSAR_TLS_CA_FILE")]
    pub pulsar_tls_ca_file: Option<PathBuf>,
}

/// Flags of `consume` (raw, unvalidated).
#[derive(Debug, Clone, Default, Args)]
pub struct ConsumeArgs {
    /// Broker and topic.
    #[command(flatten)]
    pub connection: ConnectionArgs,

    /// Subscription name; replicas sharing it split the messages.
    #[arg(long, env = ENV_SUBSCRIPTION)]
    pub pulsar_subscription_name: Option<String>,

    /// Where a subscription that does not exist yet starts reading
    /// (default: earliest, so messages sent before the first consumer
    /// started are not skipped).
    #[arg(long, env = "PULSAR_INITIAL_POSITION", value_enum)]
    pub pulsar_initial_position: Option<InitialPosition>,

    /// Listen address of the `/healthz` and `/metrics` endpoints
    /// (default: 0.0.0.0:8080).
    #[arg(long, env = ENV_HTTP_BIND)]
    pub http_bind_address: Option<String>,
}

/// Flags of `produce` (raw, unvalidated).
#[derive(Debug, Clone, Args)]
pub struct ProduceArgs {
    /// Broker and topic.
    #[command(flatten)]
    pub connection: ConnectionArgs,

    /// Message text to send.
    #[arg(long, env = "PULSAR_MESSAGE", default_value = DEFAULT_MESSAGE)]
    pub message: String,

    /// How many messages to send; with more than one, each payload gets a
    /// ` #<i>` suffix (1-based).
    #[arg(long, env = "PULSAR_MESSAGE_COUNT", default_value_t = 1)]
    pub count: u64,
}

/// Payload sent by `produce` when no message is given.
pub const DEFAULT_MESSAGE: &str = "Hello from the Rust producer";
/// Default listen address of the HTTP endpoints.
pub const DEFAULT_HTTP_BIND: &str = "0.0.0.0:8080";

/// A configuration value that is missing or malformed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConfigError {
    /// A required setting was not given at all.
    #[error("{var} (or --{flag}) is required but not set")]
    Missing {
        /// Environment variable name.
        var: &'static str,
        /// Equivalent flag, without the dashes.
        flag: &'static str,
    },
    /// A setting was given but is not acceptable.
    #[error("invalid {var} {value:?}: {reason}")]
    Invalid {
        /// Environment variable name.
        var: &'static str,
        /// The offending value, as given.
        value: String,
        /// What is wrong with it.
        reason: String,
    },
}

impl ConfigError {
    fn invalid(var: &'static str, value: &str, reason: impl fmt::Display) -> Self {
        ConfigError::Invalid {
            var,
            value: value.to_owned(),
            reason: reason.to_string(),
        }
    }
}

/// A validated broker service URL.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServiceUrl {
    /// Normalized URL, always with an explicit port (`pulsar://host:6650`).
    pub url: String,
    /// Whether the connection uses TLS (`pulsar+ssl://`).
    pub tls: bool,
}

impl fmt::Display for ServiceUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.url)
    }
}

/// Validated broker and topic settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConnectionConfig {
    /// Broker service URL.
    pub server: ServiceUrl,
    /// Fully qualified topic name (`persistent://tenant/namespace/topic`).
    pub topic: String,
    /// Extra trusted CA certificates (PEM), for TLS.
    pub tls_ca_file: Option<PathBuf>,
}

/// Validated settings of `consume`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConsumeConfig {
    /// Broker and topic.
    pub connection: ConnectionConfig,
    /// Subscription name.
    pub subscription: String,
    /// Where a new subscription starts.
    pub initial_position: InitialPosition,
    /// Listen address of the HTTP endpoints.
    pub http_bind_address: SocketAddr,
}

/// Validated settings of `produce`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProduceConfig {
    /// Broker and topic.
    pub connection: ConnectionConfig,
    /// Message text.
    pub message: String,
    /// Number of messages, at least 1.
    pub count: u64,
}

impl ConnectionArgs {
    /// Validates the broker URL, the topic and the CA file setting.
    pub fn validate(&self) -> Result<ConnectionConfig, ConfigError> {
        let server = required(&self.pulsar_server, ENV_SERVER, "pulsar-server")?;
        let topic = required(&self.pulsar_topic, ENV_TOPIC, "pulsar-topic")?;
        let tls_ca_file = match &self.pulsar_tls_ca_file {
            Some(path) if path.as_os_str().is_empty() => None,
            other => other.clone(),
        };
        Ok(ConnectionConfig {
            server: parse_service_url(server)?,
            topic: parse_topic(topic)?,
            tls_ca_file,
        })
    }
}

impl ConsumeArgs {
    /// Validates every setting of `consume`.
    pub fn validate(&self) -> Result<ConsumeConfig, ConfigError> {
        let connection = self.connection.validate()?;
        let subscription = required(
            &self.pulsar_subscription_name,
            ENV_SUBSCRIPTION,
            "pulsar-subscription-name",
        )?;
        let bind = match self.http_bind_address.as_deref() {
            None => DEFAULT_HTTP_BIND,
            Some(s) if s.trim().is_empty() => DEFAULT_HTTP_BIND,
            Some(s) => s,
        };
        Ok(ConsumeConfig {
            connection,
            subscription: parse_subscription(subscription)?,
            initial_position: self
                .pulsar_initial_position
                .unwrap_or(InitialPosition::Earliest),
            http_bind_address: parse_bind_address(bind)?,
        })
    }
}

impl ProduceArgs {
    /// Validates every setting of `produce`.
    pub fn validate(&self) -> Result<ProduceConfig, ConfigError> {
        let connection = self.connection.validate()?;
        if self.count == 0 {
            return Err(ConfigError::invalid(
                "PULSAR_MESSAGE_COUNT",
                "0",
                "must be at least 1",
            ));
        }
        Ok(ProduceConfig {
            connection,
            message: self.message.clone(),
            count: self.count,
        })
    }
}

/// Returns the trimmed value, or `Missing` if it is absent or blank.
fn required<'a>(
    value: &'a Option<String>,
    var: &'static str,
    flag: &'static str,
) -> Result<&'a str, ConfigError> {
    match value.as_deref().map(str::trim) {
        Some(v) if !v.is_empty() => Ok(v),
        _ => Err(ConfigError::Missing { var, flag }),
    }
}

/// Validates a `pulsar://` or `pulsar+ssl://` service URL and fills in the
/// default port.
pub fn parse_service_url(raw: &str) -> Result<ServiceUrl, ConfigError> {
    let raw = raw.trim();
    let invalid = |reason: &str| ConfigError::invalid(ENV_SERVER, raw, reason);
    if raw.is_empty() {
        return Err(invalid("must not be empty"));
    }
    let Some((scheme, rest)) = raw.split_once("://") else {
        return Err(invalid(
            "expected a URL like pulsar://host:6650 or pulsar+ssl://host:6651",
        ));
    };
    let (tls, default_port) = match scheme.to_ascii_lowercase().as_str() {
        "pulsar" => (false, DEFAULT_PLAIN_PORT),
        "pulsar+ssl" => (true, DEFAULT_TLS_PORT),
        _ => {
            return Err(ConfigError::invalid(
                ENV_SERVER,
                raw,
                format!("unsupported scheme {scheme:?}: use pulsar:// or pulsar+ssl://"),
            ));
        }
    };
    if rest.contains(',') {
        return Err(invalid(
            "multiple broker hosts are not supported; give one host (or a load balancer)",
        ));
    }
    let url = url::Url::parse(raw).map_err(|e| ConfigError::invalid(ENV_SERVER, raw, e))?;
    let host = match url.host_str() {
        Some(h) if !h.is_empty() => h,
        _ => return Err(invalid("missing host")),
    };
    if !url.username().is_empty() || url.password().is_some() {
        return Err(invalid("credentials in the URL are not supported"));
    }
    if !(url.path().is_empty() || url.path() == "/")
        || url.query().is_some()
        || url.fragment().is_some()
    {
        return Err(invalid("must not have a path, query or fragment"));
    }
    let port = url.port().unwrap_or(default_port);
    if port == 0 {
        return Err(invalid("port must not be 0"));
    }
    let scheme = if tls { "pulsar+ssl" } else { "pulsar" };
    Ok(ServiceUrl {
        url: format!("{scheme}://{host}:{port}"),
        tls,
    })
}

/// Validates a topic name and returns its fully qualified form.
///
/// Accepted: `topic` (in `public/default`), `tenant/namespace/topic`, and
/// `persistent://` or `non-persistent://tenant/namespace/topic`.
pub fn parse_topic(raw: &str) -> Result<String, ConfigError> {
    let raw = raw.trim();
    let invalid = |reason: String| ConfigError::invalid(ENV_TOPIC, raw, reason);
    if raw.is_empty() {
        return Err(invalid("must not be empty".into()));
    }
    let (domain, path) = match raw.split_once("://") {
        Some((domain @ ("persistent" | "non-persistent"), path)) => (domain, path),
        Some((domain, _)) => {
            return Err(invalid(format!(
                "unsupported topic domain {domain:?}: use persistent:// or non-persistent://"
            )));
        }
        None => ("persistent", raw),
    };
    let parts: Vec<&str> = path.split('/').collect();
    let (tenant, namespace, local) = match parts.as_slice() {
        [local] if domain == "persistent" && !raw.contains("://") => {
            (DEFAULT_TENANT, DEFAULT_NAMESPACE, *local)
        }
        [tenant, namespace, local] => (*tenant, *namespace, *local),
        _ => {
            return Err(invalid(format!(
                "expected {domain}://tenant/namespace/topic (or a short name like my-topic), \
                 found {} path segment(s)",
                parts.len()
            )));
        }
    };
    for (what, value) in [("tenant", tenant), ("namespace", namespace)] {
        if value.is_empty() {
            return Err(invalid(format!("{what} must not be empty")));
        }
        if let Some(c) = value
            .chars()
            .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '=' | ':' | '.')))
        {
            return Err(invalid(format!("{what} {value:?} contains {c:?}")));
        }
    }
    if local.is_empty() {
        return Err(invalid("topic name must not be empty".into()));
    }
    if let Some(c) = local.chars().find(|c| c.is_whitespace() || c.is_control()) {
        return Err(invalid(format!("topic name {local:?} contains {c:?}")));
    }
    Ok(format!("{domain}://{tenant}/{namespace}/{local}"))
}

/// Validates a subscription name.
pub fn parse_subscription(raw: &str) -> Result<String, ConfigError> {
    let raw = raw.trim();
    if raw.is_empty() {
        return Err(ConfigError::invalid(
            ENV_SUBSCRIPTION,
            raw,
            "must not be empty",
        ));
    }
    if let Some(c) = raw
        .chars()
        .find(|c| c.is_whitespace() || c.is_control() || *c == '/')
    {
        return Err(ConfigError::invalid(
            ENV_SUBSCRIPTION,
            raw,
            format!("contains {c:?}"),
        ));
    }
    Ok(raw.to_owned())
}

/// Parses the `host:port` listen address of the HTTP endpoints.
pub fn parse_bind_address(raw: &str) -> Result<SocketAddr, ConfigError> {
    let raw = raw.trim();
    raw.parse::<SocketAddr>().map_err(|_| {
        ConfigError::invalid(
            ENV_HTTP_BIND,
            raw,
            "expected an IP address and port, like 0.0.0.0:8080 or [::]:8080",
        )
    })
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    fn conn(server: Option<&str>, topic: Option<&str>) -> ConnectionArgs {
        ConnectionArgs {
            pulsar_server: server.map(str::to_owned),
            pulsar_topic: topic.map(str::to_owned),
            pulsar_tls_ca_file: None,
        }
    }

    fn consume(subscription: Option<&str>, bind: Option<&str>) -> ConsumeArgs {
        ConsumeArgs {
            connection: conn(Some("pulsar://broker:6650"), Some("my-topic")),
            pulsar_subscription_name: subscription.map(str::to_owned),
            pulsar_initial_position: None,
            http_bind_address: bind.map(str::to_owned),
        }
    }

    fn invalid_var(err: ConfigError) -> &'static str {
        match err {
            ConfigError::Invalid { var, .. } => var,
            ConfigError::Missing { .. } => panic!("expected Invalid, got {err:?}"),
        }
    }

    #[test]
    fn service_url_plain_and_tls() {
        let u = parse_service_url("pulsar://broker.ns.svc:6650").unwrap();
        assert_eq!(u.url, "pulsar://broker.ns.svc:6650");
        assert!(!u.tls);
        let u = parse_service_url("  pulsar+ssl://broker:7777/ ").unwrap();
        assert_eq!(u.url, "pulsar+ssl://broker:7777");
        assert!(u.tls);
    }

    #[test]
    fn service_url_default_ports() {
        assert_eq!(
            parse_service_url("pulsar://broker").unwrap().url,
            "pulsar://broker:6650"
        );
        assert_eq!(
            parse_service_url("pulsar+ssl://broker").unwrap().url,
            "pulsar+ssl://broker:6651"
        );
    }

    #[test]
    fn service_url_ip_addresses() {
        assert_eq!(
            parse_service_url("pulsar://127.0.0.1:6650").unwrap().url,
            "pulsar://127.0.0.1:6650"
        );
        assert_eq!(
            parse_service_url("pulsar://[::1]:6650").unwrap().url,
            "pulsar://[::1]:6650"
        );
    }

    #[test]
    fn service_url_errors_name_the_variable() {
        for bad in [
            "",
            "broker:6650",
            "http://broker:8080",
            "pulsar://",
            "pulsar://:6650",
            "pulsar://broker:notaport",
            "pulsar://broker:70000",
            "pulsar://broker:0",
            "pulsar://a:6650,b:6650",
            "pulsar://user:pw@broker:6650",
            "pulsar://broker:6650/path",
            "pulsar://broker:6650?x=1",
        ] {
            let err = parse_service_url(bad).expect_err(bad);
            assert_eq!(invalid_var(err.clone()), ENV_SERVER, "{bad}");
            assert!(err.to_string().contains("PULSAR_SERVER"), "{err}");
        }
    }

    #[test]
    fn service_url_bad_scheme_message() {
        let err = parse_service_url("http://broker:8080")
            .unwrap_err()
            .to_string();
        assert!(err.contains("unsupported scheme \"http\""), "{err}");
        assert!(err.contains("pulsar+ssl://"), "{err}");
    }

    #[test]
    fn topic_forms() {
        assert_eq!(
            parse_topic("my-topic").unwrap(),
            "persistent://public/default/my-topic"
        );
        assert_eq!(
            parse_topic("acme/orders/in").unwrap(),
            "persistent://acme/orders/in"
        );
        assert_eq!(
            parse_topic("persistent://acme/orders/in").unwrap(),
            "persistent://acme/orders/in"
        );
        assert_eq!(
            parse_topic("non-persistent://public/default/t-partition-0").unwrap(),
            "non-persistent://public/default/t-partition-0"
        );
    }

    #[test]
    fn topic_errors() {
        for bad in [
            "",
            "   ",
            "persistent://",
            "persistent://my-topic",
            "persistent://tenant/topic",
            "persistent://tenant/ns/topic/extra",
            "persistent://tenant//topic",
            "persistent:///ns/topic",
            "persistent://tenant/ns/",
            "http://tenant/ns/topic",
            "tenant/topic",
            "a/b/c/d",
            "my topic",
            "persistent://ten ant/ns/topic",
        ] {
            let err = parse_topic(bad).expect_err(bad);
            assert_eq!(invalid_var(err.clone()), ENV_TOPIC, "{bad}");
            assert!(err.to_string().contains("PULSAR_TOPIC"), "{err}");
        }
    }

    #[test]
    fn topic_malformed_persistent_path_message() {
        let err = parse_topic("persistent://tenant/topic")
            .unwrap_err()
            .to_string();
        assert!(err.contains("persistent://tenant/namespace/topic"), "{err}");
        assert!(err.contains("2 path segment"), "{err}");
    }

    #[test]
    fn subscription_rules() {
        assert_eq!(parse_subscription(" my-sub ").unwrap(), "my-sub");
        for bad in ["", " ", "my sub", "a/b", "tab\there"] {
            let err = parse_subscription(bad).expect_err(bad);
            assert_eq!(invalid_var(err), ENV_SUBSCRIPTION);
        }
    }

    #[test]
    fn bind_address() {
        assert_eq!(
            parse_bind_address("0.0.0.0:8080").unwrap(),
            "0.0.0.0:8080".parse().unwrap()
        );
        assert_eq!(
            parse_bind_address("[::]:9090").unwrap(),
            "[::]:9090".parse().unwrap()
        );
        for bad in ["8080", "localhost:8080", ":8080", "0.0.0.0"] {
            let err = parse_bind_address(bad).expect_err(bad);
            assert_eq!(invalid_var(err), ENV_HTTP_BIND);
        }
    }

    #[test]
    fn missing_settings_are_named() {
        let err = conn(None, Some("t")).validate().unwrap_err();
        assert_eq!(
            err,
            ConfigError::Missing {
                var: ENV_SERVER,
                flag: "pulsar-server"
            }
        );
        assert_eq!(
            err.to_string(),
            "PULSAR_SERVER (or --pulsar-server) is required but not set"
        );
        let err = conn(Some("pulsar://b"), Some("  ")).validate().unwrap_err();
        assert!(matches!(err, ConfigError::Missing { var: ENV_TOPIC, .. }));
        let err = consume(None, None).validate().unwrap_err();
        assert!(matches!(
            err,
            ConfigError::Missing {
                var: ENV_SUBSCRIPTION,
                ..
            }
        ));
    }

    #[test]
    fn consume_defaults() {
        let cfg = consume(Some("sub"), None).validate().unwrap();
        assert_eq!(cfg.connection.server.url, "pulsar://broker:6650");
        assert_eq!(cfg.connection.topic, "persistent://public/default/my-topic");
        assert_eq!(cfg.subscription, "sub");
        assert_eq!(cfg.initial_position, InitialPosition::Earliest);
        assert_eq!(cfg.http_bind_address, "0.0.0.0:8080".parse().unwrap());
        let cfg = consume(Some("sub"), Some("")).validate().unwrap();
        assert_eq!(cfg.http_bind_address, "0.0.0.0:8080".parse().unwrap());
    }

    #[test]
    fn produce_count_must_be_positive() {
        let args = ProduceArgs {
            connection: conn(Some("pulsar://b"), Some("t")),
            message: DEFAULT_MESSAGE.into(),
            count: 0,
        };
        let err = args.validate().unwrap_err();
        assert!(err.to_string().contains("PULSAR_MESSAGE_COUNT"), "{err}");
        let cfg = ProduceArgs { count: 3, ..args }.validate().unwrap();
        assert_eq!(cfg.count, 3);
        assert_eq!(cfg.message, DEFAULT_MESSAGE);
    }

    #[test]
    fn cli_default_subcommand_is_consume() {
        let cli = Cli::try_parse_from([
            "pulsar-consumer",
            "--pulsar-server",
            "pulsar://b:6650",
            "--pulsar-topic",
            "t",
            "--pulsar-subscription-name",
            "s",
            "--log-format",
            "json",
        ])
        .unwrap();
        assert!(cli.command.is_none());
        assert_eq!(cli.log_format, LogFormat::Json);
        assert_eq!(cli.consume.validate().unwrap().subscription, "s");
    }

    #[test]
    fn cli_produce_flags() {
        let cli = Cli::try_parse_from([
            "pulsar-consumer",
            "produce",
            "--pulsar-server",
            "pulsar://b:6650",
            "--pulsar-topic",
            "t",
            "--message",
            "hi",
            "--count",
            "5",
        ])
        .unwrap();
        let Some(Command::Produce(args)) = cli.command else {
            panic!("expected produce");
        };
        let cfg = args.validate().unwrap();
        assert_eq!((cfg.message.as_str(), cfg.count), ("hi", 5));
    }

    #[test]
    fn cli_explicit_consume_subcommand() {
        let cli = Cli::try_parse_from([
            "pulsar-consumer",
            "consume",
            "--pulsar-server",
            "pulsar+ssl://b",
            "--pulsar-topic",
            "persistent://a/b/c",
            "--pulsar-subscription-name",
            "s",
            "--pulsar-initial-position",
            "latest",
        ])
        .unwrap();
        let Some(Command::Consume(args)) = cli.command else {
            panic!("expected consume");
        };
        let cfg = args.validate().unwrap();
        assert!(cfg.connection.server.tls);
        assert_eq!(cfg.initial_position, InitialPosition::Latest);
    }
}
