//! Command-line and environment configuration.

use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use anyhow::Context as _;
use clap::Parser;

/// Serve a cow saying a greeting over HTTP.
#[derive(Debug, Clone, Parser)]
#[command(name = "lolcow-web", version, about)]
pub struct Config {
    /// What the cow says. Without it (or when empty) the `GREETING`
    /// environment variable is used, else a random built-in fortune.
    #[arg(env = "GREETING")]
    pub greeting: Option<String>,

    /// Address to listen on: an IP address (combined with --port) or a full
    /// `ip:port` socket address (then --port is ignored).
    #[arg(long, env = "BIND_ADDRESS", default_value = "0.0.0.0")]
    pub listen: String,

    /// Port to listen on (0 picks a free one).
    #[arg(long, env = "PORT", default_value_t = 8080)]
    pub port: u16,

    /// Time a client has to send a request's headers (also how long an idle
    /// kept-alive connection stays open), e.g. `10s` or `500ms`.
    #[arg(long, env = "HEADER_READ_TIMEOUT", default_value = "10s", value_parser = parse_duration)]
    pub header_read_timeout: Duration,

    /// Connections served at once; further ones wait until one closes.
    #[arg(long, env = "MAX_CONNECTIONS", default_value_t = 1024, value_parser = clap::value_parser!(u32).range(1..))]
    pub max_connections: u32,

    /// Largest request body accepted, in bytes (larger ones get 413).
    #[arg(long, env = "MAX_BODY_BYTES", default_value_t = 64 * 1024)]
    pub max_body_bytes: usize,
}

impl Config {
    /// The greeting to use, if one was given and it is not blank.
    pub fn greeting(&self) -> Option<&str> {
        self.greeting.as_deref().filter(|g| !g.trim().is_empty())
    }

    /// The socket address to bind, from `listen` and `port`.
    pub fn socket_addr(&self) -> anyhow::Result<SocketAddr> {
        let listen = self.listen.trim();
        if let Ok(addr) = listen.parse::<SocketAddr>() {
            return Ok(addr);
        }
        let ip: IpAddr = listen
            .trim_start_matches('[')
            .trim_end_matches(']')
            .parse()
            .with_context(|| {
                format!("listen address {listen:?} is neither an IP address nor ip:port")
            })?;
        Ok(SocketAddr::new(ip, self.port))
    }

    /// The serving limits from the flags.
    pub fn limits(&self) -> shared::serving::Limits {
        shared::serving::Limits {
            header_read_timeout: self.header_read_timeout,
            max_connections: self.max_connections,
            max_body_bytes: self.max_body_bytes,
            ..shared::serving::Limits::DEFAULT
        }
    }
}

/// Parses `10s`, `500ms` or a plain number of seconds.
fn parse_duration(s: &str) -> Result<Duration, String> {
    let s = s.trim();
    let bad = || format!("`{s}` is not a duration: use e.g. 10s or 500ms");
    let (number, scale) = if let Some(ms) = s.strip_suffix("ms") {
        (ms, 0.001)
    } else {
        (s.strip_suffix('s').unwrap_or(s), 1.0)
    };
    let value: f64 = number.trim().parse().map_err(|_| bad())?;
    Duration::try_from_secs_f64(value * scale)
        .ok()
        .filter(|d| !d.is_zero())
        .ok_or_else(bad)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // Panicking is how tests fail.
mod tests {
    use super::*;

    fn parse(args: &[&str]) -> Config {
        // Keep the test independent of the environment it runs in.
        let mut config = Config::try_parse_from(args).unwrap();
        if args.len() == 1 {
            config.greeting = None;
        }
        config
    }

    #[test]
    fn defaults_listen_on_all_interfaces_port_8080() {
        let config = Config {
            greeting: None,
            listen: "0.0.0.0".into(),
            port: 8080,
            header_read_timeout: Duration::from_secs(10),
            max_connections: 1024,
            max_body_bytes: 65536,
        };
        assert_eq!(
            config.socket_addr().unwrap(),
            "0.0.0.0:8080".parse().unwrap()
        );
    }

    #[test]
    fn serving_limits_default_and_flags() {
        // The defaults as declared (the environment may set the variables).
        use clap::CommandFactory as _;
        let command = Config::command();
        let default = |id: &str| {
            command
                .get_arguments()
                .find(|a| a.get_id() == id)
                .and_then(|a| a.get_default_values().first())
                .and_then(|v| v.to_str())
                .unwrap()
                .to_owned()
        };
        assert_eq!(default("header_read_timeout"), "10s");
        assert_eq!(default("max_connections"), "1024");
        assert_eq!(default("max_body_bytes"), "65536");
        let config = parse(&[
            "lolcow-web",
            "--header-read-timeout",
            "250ms",
            "--max-connections",
            "7",
            "--max-body-bytes",
            "10",
        ]);
        let limits = config.limits();
        assert_eq!(limits.header_read_timeout, Duration::from_millis(250));
        assert_eq!(limits.max_connections, 7);
        assert_eq!(limits.max_body_bytes, 10);
        assert!(Config::try_parse_from(["lolcow-web", "--header-read-timeout", "0s"]).is_err());
        assert!(Config::try_parse_from(["lolcow-web", "--header-read-timeout", "soon"]).is_err());
        assert!(Config::try_parse_from(["lolcow-web", "--max-connections", "0"]).is_err());
        assert_eq!(parse_duration("3").unwrap(), Duration::from_secs(3));
    }

    #[test]
    fn listen_ip_combines_with_port() {
        let config = parse(&["lolcow-web", "--listen", "127.0.0.1", "--port", "9999"]);
        assert_eq!(
            config.socket_addr().unwrap(),
            "127.0.0.1:9999".parse().unwrap()
        );
        let config = parse(&["lolcow-web", "--listen", "[::1]", "--port", "9"]);
        assert_eq!(config.socket_addr().unwrap(), "[::1]:9".parse().unwrap());
    }

    #[test]
    fn listen_socket_address_overrides_port() {
        let config = parse(&["lolcow-web", "--listen", "127.0.0.1:7000", "--port", "1"]);
        assert_eq!(
            config.socket_addr().unwrap(),
            "127.0.0.1:7000".parse().unwrap()
        );
    }

    #[test]
    fn bad_listen_address_is_an_error() {
        let config = parse(&["lolcow-web", "--listen", "localhost"]);
        assert!(config.socket_addr().is_err());
    }

    #[test]
    fn positional_argument_is_the_greeting() {
        let config = parse(&["lolcow-web", "Hello there"]);
        assert_eq!(config.greeting(), Some("Hello there"));
    }

    #[test]
    fn blank_greeting_counts_as_none() {
        let config = parse(&["lolcow-web", "   "]);
        assert_eq!(config.greeting(), None);
    }
}
