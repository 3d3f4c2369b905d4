//! Command-line and environment configuration.

use std::net::{IpAddr, SocketAddr};

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
        };
        assert_eq!(
            config.socket_addr().unwrap(),
            "0.0.0.0:8080".parse().unwrap()
        );
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
