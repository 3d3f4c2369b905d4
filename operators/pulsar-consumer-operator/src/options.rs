//! The operator's own options for the admin API reads, from its environment (the command
//! line is the common crate's, shared by every operator):
//!
//! | variable | default | meaning |
//! |---|---|---|
//! | `PULSAR_ADMIN_ALLOWED_CIDRS` | none | comma-separated CIDRs (or single addresses) every namespace's PulsarConsumers may read the admin API at ([`crate::target::Reach::Granted`]): without them a PulsarConsumer reads only Services of its own namespace. Listed addresses are allowed even where [`crate::target`] refuses them by default, e.g. a shared broker's Service address (`10.96.12.34`), or `127.0.0.0/8,::1` for a broker on the node's loopback in development |
//! | `PULSAR_ADMIN_MIN_POLL_SECONDS` | 5 | the shortest interval between two reads of one object's backlog: a smaller `pollIntervalSeconds` is read as this (1 to 3600) |
//! | `PULSAR_ADMIN_MAX_CONCURRENT_POLLS` | 8 | reads in flight at once, all objects together (1 to 64); one namespace gets at most a quarter of them (at least 1) |
//!
//! These are the operator administrator's: a tenant only writes PulsarConsumers. A bad value
//! stops the operator at startup with a message naming the variable.

use std::time::Duration;

use crate::target::{API_SERVER_HOST_ENV, Cidr, TargetPolicy};

/// The variable with the CIDRs allowed beyond the default policy.
pub const ALLOWED_CIDRS_ENV: &str = "PULSAR_ADMIN_ALLOWED_CIDRS";
/// The variable with the floor of `pollIntervalSeconds`.
pub const MIN_POLL_SECONDS_ENV: &str = "PULSAR_ADMIN_MIN_POLL_SECONDS";
/// The variable with the cap on reads in flight.
pub const MAX_CONCURRENT_POLLS_ENV: &str = "PULSAR_ADMIN_MAX_CONCURRENT_POLLS";

/// Default floor of the poll interval. HorizontalPodAutoscalers sync every 15 s and KEDA
/// polls every 30 s; 5 s still follows a backlog closely, and keeps a tenant's objects from
/// costing more than one read each per 5 s.
pub const DEFAULT_MIN_POLL_SECONDS: u64 = 5;
/// Default cap on reads in flight (see [`crate::admin::MAX_BODY_BYTES`] for the memory).
pub const DEFAULT_MAX_CONCURRENT_POLLS: usize = 8;
/// The highest cap accepted: memory grows with it (one body buffer per read).
pub const MAX_CONCURRENT_POLLS_LIMIT: usize = 64;

/// What the administrator chose.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Options {
    /// Where the operator may connect.
    pub targets: TargetPolicy,
    /// The shortest interval between two reads of one object.
    pub min_poll_interval: Duration,
    /// Reads in flight, all objects together.
    pub max_concurrent_polls: usize,
}

impl Default for Options {
    /// The defaults, outside a cluster (no API server address known).
    fn default() -> Self {
        Self {
            targets: TargetPolicy::default(),
            min_poll_interval: Duration::from_secs(DEFAULT_MIN_POLL_SECONDS),
            max_concurrent_polls: DEFAULT_MAX_CONCURRENT_POLLS,
        }
    }
}

impl Options {
    /// The options of the process's environment.
    ///
    /// # Errors
    /// A message naming the variable whose value is invalid.
    pub fn from_env() -> Result<Self, String> {
        Self::from_vars(|name| std::env::var(name).ok())
    }

    /// The options `var` gives (a variable's value, `None` when unset); an empty value
    /// counts as unset.
    ///
    /// # Errors
    /// A message naming the variable whose value is invalid.
    pub fn from_vars(var: impl Fn(&str) -> Option<String>) -> Result<Self, String> {
        let var = |name: &str| var(name).filter(|v| !v.trim().is_empty());
        let allowed = match var(ALLOWED_CIDRS_ENV) {
            None => Vec::new(),
            Some(list) => list
                .split(',')
                .filter(|c| !c.trim().is_empty())
                .map(str::parse::<Cidr>)
                .collect::<Result<_, _>>()
                .map_err(|e| format!("{ALLOWED_CIDRS_ENV}: {e}"))?,
        };
        let number = |name: &str, default: u64, max: u64| -> Result<u64, String> {
            var(name).map_or(Ok(default), |v| {
                v.trim()
                    .parse::<u64>()
                    .ok()
                    .filter(|n| (1..=max).contains(n))
                    .ok_or_else(|| {
                        format!("{name} must be a whole number from 1 to {max}, not {v:?}")
                    })
            })
        };
        let min_poll = number(MIN_POLL_SECONDS_ENV, DEFAULT_MIN_POLL_SECONDS, 3600)?;
        let concurrent = number(
            MAX_CONCURRENT_POLLS_ENV,
            DEFAULT_MAX_CONCURRENT_POLLS as u64,
            MAX_CONCURRENT_POLLS_LIMIT as u64,
        )?;
        Ok(Self {
            targets: TargetPolicy::new(allowed, var(API_SERVER_HOST_ENV).as_deref()),
            min_poll_interval: Duration::from_secs(min_poll),
            max_concurrent_polls: usize::try_from(concurrent)
                .unwrap_or(DEFAULT_MAX_CONCURRENT_POLLS),
        })
    }

    /// Reads in flight for one namespace: a quarter of the total, at least one, so one
    /// namespace's slow endpoints never hold every slot.
    #[must_use]
    pub fn max_concurrent_polls_per_namespace(&self) -> usize {
        (self.max_concurrent_polls / 4).max(1)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use std::collections::HashMap;

    fn parse(vars: &[(&str, &str)]) -> Result<Options, String> {
        let vars: HashMap<String, String> = vars
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        Options::from_vars(|name| vars.get(name).cloned())
    }

    #[test]
    fn defaults() {
        let o = parse(&[]).unwrap();
        assert_eq!(o, Options::default());
        assert_eq!(o.min_poll_interval, Duration::from_secs(5));
        assert_eq!(
            (
                o.max_concurrent_polls,
                o.max_concurrent_polls_per_namespace()
            ),
            (8, 2)
        );
        assert!(o.targets.check_ip("127.0.0.1".parse().unwrap()).is_err());
        // Empty values are unset (a Deployment's `value: ""`).
        assert_eq!(
            parse(&[(MIN_POLL_SECONDS_ENV, " "), (ALLOWED_CIDRS_ENV, "")]).unwrap(),
            o
        );
    }

    #[test]
    fn values() {
        let o = parse(&[
            (ALLOWED_CIDRS_ENV, "127.0.0.0/8, ::1,"),
            (MIN_POLL_SECONDS_ENV, "1"),
            (MAX_CONCURRENT_POLLS_ENV, "2"),
            (API_SERVER_HOST_ENV, "10.96.0.1"),
        ])
        .unwrap();
        assert!(o.targets.check_ip("127.0.0.1".parse().unwrap()).is_ok());
        assert!(o.targets.check_ip("::1".parse().unwrap()).is_ok());
        assert!(o.targets.check_ip("10.96.0.1".parse().unwrap()).is_err());
        assert_eq!(o.min_poll_interval, Duration::from_secs(1));
        assert_eq!(
            (
                o.max_concurrent_polls,
                o.max_concurrent_polls_per_namespace()
            ),
            (2, 1)
        );
    }

    #[test]
    fn bad_values_name_the_variable() {
        for (name, value) in [
            (ALLOWED_CIDRS_ENV, "127.0.0.0/33"),
            (ALLOWED_CIDRS_ENV, "localhost"),
            (MIN_POLL_SECONDS_ENV, "0"),
            (MIN_POLL_SECONDS_ENV, "3601"),
            (MIN_POLL_SECONDS_ENV, "1.5"),
            (MAX_CONCURRENT_POLLS_ENV, "0"),
            (MAX_CONCURRENT_POLLS_ENV, "65"),
        ] {
            let e = parse(&[(name, value)]).unwrap_err();
            assert!(e.starts_with(name), "{name}={value}: {e}");
        }
    }
}
