//! Command-line and environment configuration.

use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use anyhow::Context as _;
use clap::Parser;
use serving::Limits;

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

    /// Port of a second listener, on the same address, that serves only
    /// `/healthz` for the kubelet, so that clients of the page cannot starve
    /// the probes (0 picks a free one). Without it there is no second
    /// listener; `/healthz` is served on the page's port either way.
    #[arg(long, env = "PROBE_PORT")]
    pub probe_port: Option<u16>,

    /// Time a client of the page has to send a request's headers (also how
    /// long an idle kept-alive connection stays open), e.g. `10s` or `500ms`.
    #[arg(long, env = "HEADER_READ_TIMEOUT", default_value = "10s", value_parser = parse_duration)]
    pub header_read_timeout: Duration,

    /// Time a client of the page has to read the rest of an answer once
    /// writing it had to wait for the client, e.g. `10s` or `500ms`; then the
    /// connection is closed.
    #[arg(long, env = "WRITE_TIMEOUT", default_value = "10s", value_parser = parse_duration)]
    pub write_timeout: Duration,

    /// Connections to the page served at once. When all are taken, a client
    /// holding fewer than the one holding the most displaces that one's oldest
    /// connection; others are closed.
    #[arg(long, env = "MAX_CONNECTIONS", default_value_t = Limits::PUBLIC.max_connections, value_parser = clap::value_parser!(u32).range(1..))]
    pub max_connections: u32,

    /// Connections to the page served at once from one client address; a
    /// further one takes the place of that address's oldest idle connection
    /// (clients behind one NAT address are not locked out by some of them).
    #[arg(long, env = "MAX_CONNECTIONS_PER_PEER", default_value_t = Limits::PUBLIC.max_connections_per_peer, value_parser = clap::value_parser!(u32).range(1..))]
    pub max_connections_per_peer: u32,

    /// Largest request head (request line and headers) accepted, in bytes
    /// (larger ones get 431).
    #[arg(long, env = "MAX_HEADER_BYTES", default_value_t = Limits::PUBLIC.max_header_bytes, value_parser = parse_header_bytes)]
    pub max_header_bytes: usize,

    /// Largest request body accepted, in bytes (larger ones get 413).
    #[arg(long, env = "MAX_BODY_BYTES", default_value_t = Limits::PUBLIC.max_body_bytes)]
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

    /// The probe listener's address (the page's IP, `probe_port`), if one is
    /// asked for.
    ///
    /// # Errors
    /// When the page's address is invalid, or the probe port is the page's.
    pub fn probe_addr(&self) -> anyhow::Result<Option<SocketAddr>> {
        let page = self.socket_addr()?;
        match self.probe_port {
            None => Ok(None),
            Some(port) if port != 0 && port == page.port() => anyhow::bail!(
                "--probe-port (PROBE_PORT) {port} is the page's port: the probes need a port of their own"
            ),
            Some(port) => Ok(Some(SocketAddr::new(page.ip(), port))),
        }
    }

    /// The page listener's limits: [`Limits::PUBLIC`] changed by the flags.
    pub fn limits(&self) -> Limits {
        Limits {
            header_read_timeout: self.header_read_timeout,
            write_timeout: self.write_timeout,
            max_connections: self.max_connections,
            max_connections_per_peer: self.max_connections_per_peer,
            max_header_bytes: self.max_header_bytes,
            max_body_bytes: self.max_body_bytes,
            ..Limits::PUBLIC
        }
    }
}

/// A head limit of at least 1 KiB (an ordinary browser request's head is
/// about 0.5 KiB).
fn parse_header_bytes(s: &str) -> Result<usize, String> {
    match s.trim().parse::<usize>() {
        Ok(n) if n >= 1024 => Ok(n),
        _ => Err(format!("`{s}` is not a number of bytes of at least 1024")),
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
            probe_port: None,
            header_read_timeout: Duration::from_secs(10),
            write_timeout: Duration::from_secs(10),
            max_connections: 256,
            max_connections_per_peer: 64,
            max_header_bytes: 16384,
            max_body_bytes: 65536,
        };
        assert_eq!(
            config.socket_addr().unwrap(),
            "0.0.0.0:8080".parse().unwrap()
        );
        assert_eq!(config.probe_addr().unwrap(), None);
        assert_eq!(config.limits(), Limits::PUBLIC);
    }

    #[test]
    fn probe_port_is_on_the_page_address_and_never_the_page_port() {
        let config = parse(&[
            "lolcow-web",
            "--listen",
            "127.0.0.1",
            "--probe-port",
            "8081",
        ]);
        assert_eq!(
            config.probe_addr().unwrap(),
            Some("127.0.0.1:8081".parse().unwrap())
        );
        let config = parse(&["lolcow-web", "--listen", "[::1]:9000", "--probe-port", "0"]);
        assert_eq!(
            config.probe_addr().unwrap(),
            Some("[::1]:0".parse().unwrap())
        );
        let config = parse(&["lolcow-web", "--port", "8080", "--probe-port", "8080"]);
        let err = config.probe_addr().unwrap_err().to_string();
        assert!(err.contains("--probe-port"), "{err}");
        assert!(Config::try_parse_from(["lolcow-web", "--probe-port", "70000"]).is_err());
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
        assert_eq!(default("write_timeout"), "10s");
        assert_eq!(default("max_connections"), "256");
        assert_eq!(default("max_connections_per_peer"), "64");
        assert_eq!(default("max_header_bytes"), "16384");
        assert_eq!(default("max_body_bytes"), "65536");
        let config = parse(&[
            "lolcow-web",
            "--header-read-timeout",
            "250ms",
            "--write-timeout",
            "2s",
            "--max-connections",
            "7",
            "--max-connections-per-peer",
            "3",
            "--max-header-bytes",
            "4096",
            "--max-body-bytes",
            "10",
        ]);
        let limits = config.limits();
        assert_eq!(limits.header_read_timeout, Duration::from_millis(250));
        assert_eq!(limits.write_timeout, Duration::from_secs(2));
        assert_eq!(limits.max_connections, 7);
        assert_eq!(limits.max_connections_per_peer, 3);
        assert_eq!(limits.max_header_bytes, 4096);
        assert_eq!(limits.max_body_bytes, 10);
        assert!(Config::try_parse_from(["lolcow-web", "--header-read-timeout", "0s"]).is_err());
        assert!(Config::try_parse_from(["lolcow-web", "--header-read-timeout", "soon"]).is_err());
        assert!(Config::try_parse_from(["lolcow-web", "--write-timeout", "0s"]).is_err());
        assert!(Config::try_parse_from(["lolcow-web", "--max-connections", "0"]).is_err());
        assert!(Config::try_parse_from(["lolcow-web", "--max-connections-per-peer", "0"]).is_err());
        assert!(Config::try_parse_from(["lolcow-web", "--max-header-bytes", "100"]).is_err());
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
