//! Where the operator may connect on a tenant's behalf: the address policy of the admin API
//! reads (`spec.autoscaling.adminUrl`, or the host of `spec.serverAddress`).
//!
//! Anyone who may edit PulsarConsumers in one namespace chooses the host and port the
//! cluster-wide operator connects to, so without a policy it reads the cloud metadata service,
//! its own Pod's loopback, or the API server with the operator's network position. By default
//! the operator therefore never connects to:
//! - loopback (`127.0.0.0/8`, `::1`), unspecified (`0.0.0.0/8`, `::`: Linux connects those to
//!   the host itself), link-local (`169.254.0.0/16` with the metadata service
//!   `169.254.169.254`, `fe80::/10`), multicast (`224.0.0.0/4`, `ff00::/8`), reserved and
//!   broadcast (`240.0.0.0/4`), the other cloud metadata addresses (`100.100.100.200`,
//!   `fd00:ec2::254`), and the same IPv4 addresses written as IPv6 (`::ffff:127.0.0.1`,
//!   `::127.0.0.1`, `64:ff9b::7f00:1`);
//! - the API server: the address in `KUBERNETES_SERVICE_HOST` and the names `kubernetes`,
//!   `kubernetes.default`, `kubernetes.default.svc` and `kubernetes.default.svc.<domain>`.
//!
//! Private cluster addresses (`10.0.0.0/8` and the like) stay allowed: brokers are reached
//! through Services. The check is made on the addresses a name *resolves to*, at connect time
//! ([`GuardedConnector`]: a literal IP is checked before connecting, a name is resolved by
//! [`GuardedResolver`], which drops the refused addresses, so the connector only ever sees
//! allowed ones): a tenant's DNS name that points at `127.0.0.1` is refused too, and DNS
//! rebinding has nothing to race against.
//!
//! An administrator who needs more (a broker on the node's loopback in a development setup)
//! lists CIDRs in `PULSAR_ADMIN_ALLOWED_CIDRS` ([`crate::options`]): an address inside one
//! of them is allowed whatever the rules above say. The `kubernetes*` names stay refused.
//!
//! # Whose admin API
//!
//! On top of those rules, a tenant's PulsarConsumer is read only from its own namespace or
//! from where the administrator allows every tenant ([`Reach`]); the operator never reaches
//! on a tenant's behalf what that tenant's own pods may be kept from by network policies
//! (another tenant's broker, pods, kubelets):
//! - [`Reach::Namespace`]: the host is the DNS name of a Service of the PulsarConsumer's
//!   namespace (`<service>.<namespace>`, `<service>.<namespace>.svc`,
//!   `<service>.<namespace>.svc.<cluster domain>`, or a pod of a headless Service,
//!   `<pod>.<service>.<namespace>.svc[.<cluster domain>]`). It is looked up as the absolute
//!   name under the cluster's domain ([`service_name`]), never through the search path or
//!   the public DNS, and its addresses must pass the rules above.
//! - [`Reach::Granted`]: any other host, and every literal IP address: only addresses inside
//!   `PULSAR_ADMIN_ALLOWED_CIDRS` (a shared broker's Service address, say). With no CIDRs
//!   set, nothing is looked up or connected to.
//!
//! The name cannot tell an `ExternalName` Service of the namespace, an alias of a name
//! elsewhere, from a Service of its own; see `docs/tenants.md` for what that leaves open.

use std::{
    fmt,
    future::Future,
    net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr},
    pin::Pin,
    str::FromStr,
    sync::Arc,
    task::{Context, Poll},
};

use hyper::Uri;
use hyper_util::{
    client::legacy::connect::{HttpConnector, dns::Name},
    rt::TokioIo,
};
use tokio::net::TcpStream;

/// The environment variable with the API server's in-cluster address.
pub const API_SERVER_HOST_ENV: &str = "KUBERNETES_SERVICE_HOST";

/// Why an address is refused (for debug logs; the status only says that it is).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// `127.0.0.0/8`, `::1`.
    Loopback,
    /// `0.0.0.0/8`, `::`.
    Unspecified,
    /// `169.254.0.0/16`, `fe80::/10`.
    LinkLocal,
    /// `224.0.0.0/4`, `ff00::/8`.
    Multicast,
    /// `240.0.0.0/4`, broadcast included.
    Reserved,
    /// A cloud metadata service outside the link-local range.
    CloudMetadata,
    /// The Kubernetes API server (by address or by name).
    ApiServer,
    /// Not a Service of the PulsarConsumer's namespace, nor an address the administrator
    /// allows for every namespace ([`Reach`]).
    OutsideNamespace,
}

impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Refusal::Loopback => "loopback",
            Refusal::Unspecified => "unspecified",
            Refusal::LinkLocal => "link-local",
            Refusal::Multicast => "multicast",
            Refusal::Reserved => "reserved or broadcast",
            Refusal::CloudMetadata => "cloud metadata service",
            Refusal::ApiServer => "Kubernetes API server",
            Refusal::OutsideNamespace => "other namespace's (not granted)",
        })
    }
}

/// The error of a connection the policy refused; found again in the HTTP client's error
/// chain to tell it from a connection that failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NotAllowed(pub Refusal);

impl fmt::Display for NotAllowed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "the operator does not connect to a {} address", self.0)
    }
}

impl std::error::Error for NotAllowed {}

/// An IPv4 or IPv6 network, `address/prefix`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cidr {
    network: IpAddr,
    prefix: u8,
}

impl Cidr {
    /// Whether `ip` is inside (an IPv4-mapped IPv6 address counts as its IPv4 address).
    #[must_use]
    pub fn contains(&self, ip: IpAddr) -> bool {
        match (self.network, ip.to_canonical()) {
            (IpAddr::V4(net), IpAddr::V4(ip)) => prefix_eq(
                u128::from(net.to_bits()),
                u128::from(ip.to_bits()),
                32,
                self.prefix,
            ),
            (IpAddr::V6(net), IpAddr::V6(ip)) => {
                prefix_eq(net.to_bits(), ip.to_bits(), 128, self.prefix)
            }
            _ => false,
        }
    }
}

/// Whether the first `prefix` of the `width` bits of `a` and `b` are equal.
fn prefix_eq(a: u128, b: u128, width: u32, prefix: u8) -> bool {
    let prefix = u32::from(prefix).min(width);
    if prefix == 0 {
        return true;
    }
    let shift = width - prefix;
    (a >> shift) == (b >> shift)
}

impl FromStr for Cidr {
    type Err = String;

    /// `10.0.0.0/8`, `::1/128`, or a single address (`127.0.0.1`: a /32 or /128).
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let s = s.trim();
        let (addr, prefix) = match s.split_once('/') {
            Some((a, p)) => (a, Some(p)),
            None => (s, None),
        };
        let network: IpAddr = addr
            .parse()
            .map_err(|_| format!("{s:?} is not an IP address or CIDR"))?;
        let width = if network.is_ipv4() { 32 } else { 128 };
        let prefix = match prefix {
            None => width,
            Some(p) => p
                .parse::<u8>()
                .ok()
                .filter(|p| *p <= width)
                .ok_or_else(|| format!("{s:?}: the prefix length must be 0 to {width}"))?,
        };
        Ok(Self { network, prefix })
    }
}

/// Which targets the operator connects to.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TargetPolicy {
    /// Allowed even though the default rules refuse them.
    allowed: Vec<Cidr>,
    /// The API server's addresses (from `KUBERNETES_SERVICE_HOST`).
    api_server: Vec<IpAddr>,
}

impl TargetPolicy {
    /// The default rules, with `allowed` allowed anyway and `api_server_host` (the value of
    /// `KUBERNETES_SERVICE_HOST`, if any) refused as the API server.
    #[must_use]
    pub fn new(allowed: Vec<Cidr>, api_server_host: Option<&str>) -> Self {
        let api_server = api_server_host
            .map(|h| h.trim().trim_start_matches('[').trim_end_matches(']'))
            .and_then(|h| h.parse::<IpAddr>().ok())
            .map(|ip| vec![ip.to_canonical()])
            .unwrap_or_default();
        Self {
            allowed,
            api_server,
        }
    }

    /// Whether the operator may connect to `ip`.
    ///
    /// # Errors
    /// [`NotAllowed`] with the rule that refuses it.
    pub fn check_ip(&self, ip: IpAddr) -> Result<(), NotAllowed> {
        if self.allowed.iter().any(|c| c.contains(ip)) {
            return Ok(());
        }
        let ip = ip.to_canonical();
        if self.api_server.contains(&ip) {
            return Err(NotAllowed(Refusal::ApiServer));
        }
        match ip {
            IpAddr::V4(v4) => refuse_v4(v4),
            IpAddr::V6(v6) => refuse_v6(v6),
        }
        .map_or(Ok(()), |r| Err(NotAllowed(r)))
    }

    /// Whether the administrator allows `ip` for every namespace (it is inside one of the
    /// `PULSAR_ADMIN_ALLOWED_CIDRS`): what [`Reach::Granted`] connects to.
    ///
    /// # Errors
    /// [`NotAllowed`] ([`Refusal::OutsideNamespace`]) for any other address.
    pub fn check_granted(&self, ip: IpAddr) -> Result<(), NotAllowed> {
        if self.allowed.iter().any(|c| c.contains(ip)) {
            Ok(())
        } else {
            Err(NotAllowed(Refusal::OutsideNamespace))
        }
    }

    /// Whether the administrator allows any address for every namespace.
    #[must_use]
    pub fn has_grants(&self) -> bool {
        !self.allowed.is_empty()
    }

    /// Whether the operator may resolve the host name `host` (only the API server's names
    /// are refused here; the addresses it resolves to are checked by [`Self::check_ip`]).
    ///
    /// # Errors
    /// [`NotAllowed`] for the API server's names.
    pub fn check_name(&self, host: &str) -> Result<(), NotAllowed> {
        let host = host.trim_end_matches('.').to_ascii_lowercase();
        let api_server = host == "kubernetes"
            || host == "kubernetes.default"
            || host == "kubernetes.default.svc"
            || host.starts_with("kubernetes.default.svc.");
        if api_server {
            return Err(NotAllowed(Refusal::ApiServer));
        }
        Ok(())
    }
}

/// The cluster DNS domain when nothing else tells it.
pub const DEFAULT_CLUSTER_DOMAIN: &str = "cluster.local";

/// Which admin APIs a read may reach: see the module docs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reach {
    /// Services of the PulsarConsumer's namespace, by name, looked up as absolute names
    /// under `cluster_domain`, at addresses the rules allow.
    Namespace {
        /// The cluster's DNS domain (`cluster.local`).
        cluster_domain: Arc<str>,
    },
    /// Only addresses inside the administrator's CIDRs.
    Granted,
}

/// A Kubernetes Service's DNS name, as a PulsarConsumer may write it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServiceName {
    /// The namespace it names.
    pub namespace: String,
    /// The absolute name to look up (`<service>.<namespace>.svc.<cluster domain>.`).
    pub fqdn: String,
}

/// The Service (or a headless Service's pod) `host` names: `<service>.<namespace>`,
/// `<service>.<namespace>.svc`, `<service>.<namespace>.svc.<cluster_domain>`, or the same
/// with a pod's host name in front of `<service>` when `svc` is written. `None` for
/// anything else (one label, another domain after `svc`, an IP address).
#[must_use]
pub fn service_name(host: &str, cluster_domain: &str) -> Option<ServiceName> {
    let host = host.strip_suffix('.').unwrap_or(host).to_ascii_lowercase();
    let domain = cluster_domain.trim_matches('.').to_ascii_lowercase();
    if host.parse::<IpAddr>().is_ok() || host.starts_with('[') {
        return None;
    }
    let labels: Vec<&str> = host.split('.').collect();
    if labels.iter().any(|l| l.is_empty()) {
        return None;
    }
    // `svc` after the namespace: the first one from the third label on (a Service or a
    // namespace may itself be called `svc`).
    let svc = labels
        .iter()
        .enumerate()
        .skip(2)
        .find(|(_, l)| **l == "svc")
        .map(|(i, _)| i);
    let (namespace, name) = match svc {
        Some(i @ (2 | 3)) => {
            let rest = labels[i + 1..].join(".");
            if !rest.is_empty() && rest != domain {
                return None;
            }
            (labels[i - 1], labels[..=i].join("."))
        }
        Some(_) => return None,
        None if labels.len() == 2 => (labels[1], format!("{host}.svc")),
        None => return None,
    };
    Some(ServiceName {
        namespace: namespace.to_owned(),
        fqdn: format!("{name}.{domain}."),
    })
}

/// The cluster's DNS domain in a `resolv.conf`: what follows `svc.` in the first search
/// domain that starts with it (a pod's search list is `<ns>.svc.<domain> svc.<domain>
/// <domain>`).
#[must_use]
pub fn cluster_domain_in(resolv_conf: &str) -> Option<String> {
    resolv_conf
        .lines()
        .filter_map(|line| line.trim().strip_prefix("search"))
        .flat_map(str::split_whitespace)
        .find_map(|domain| domain.strip_prefix("svc."))
        .map(|d| d.trim_end_matches('.').to_owned())
        .filter(|d| !d.is_empty())
}

/// The cluster's DNS domain: from `/etc/resolv.conf` (read once, at startup), else
/// [`DEFAULT_CLUSTER_DOMAIN`].
#[must_use]
pub fn cluster_domain() -> String {
    std::fs::read_to_string("/etc/resolv.conf")
        .ok()
        .and_then(|text| cluster_domain_in(&text))
        .unwrap_or_else(|| DEFAULT_CLUSTER_DOMAIN.to_owned())
}

/// The rule refusing an IPv4 address, if any.
fn refuse_v4(ip: Ipv4Addr) -> Option<Refusal> {
    let [a, b, ..] = ip.octets();
    if a == 0 {
        Some(Refusal::Unspecified)
    } else if a == 127 {
        Some(Refusal::Loopback)
    } else if a == 169 && b == 254 {
        Some(Refusal::LinkLocal)
    } else if (224..240).contains(&a) {
        Some(Refusal::Multicast)
    } else if a >= 240 {
        Some(Refusal::Reserved)
    } else if ip == Ipv4Addr::new(100, 100, 100, 200) {
        // Alibaba Cloud's metadata service (inside the shared 100.64.0.0/10 range, which
        // some clusters use for Pods, so only this one address).
        Some(Refusal::CloudMetadata)
    } else {
        None
    }
}

/// The rule refusing an IPv6 address (not IPv4-mapped: the caller canonicalised it).
fn refuse_v6(ip: Ipv6Addr) -> Option<Refusal> {
    let segments = ip.segments();
    if ip.is_unspecified() {
        return Some(Refusal::Unspecified);
    }
    if ip.is_loopback() {
        return Some(Refusal::Loopback);
    }
    if segments[0] & 0xffc0 == 0xfe80 {
        return Some(Refusal::LinkLocal);
    }
    if segments[0] & 0xff00 == 0xff00 {
        return Some(Refusal::Multicast);
    }
    // AWS's metadata service over IPv6.
    if ip == Ipv6Addr::new(0xfd00, 0xec2, 0, 0, 0, 0, 0, 0x254) {
        return Some(Refusal::CloudMetadata);
    }
    // An IPv4 address inside IPv6: IPv4-compatible (`::a.b.c.d`, deprecated but still
    // routed to the IPv4 address by some stacks) and the NAT64 well-known prefix
    // (`64:ff9b::/96`, translated to the IPv4 address by a NAT64 gateway).
    let embedded = |ip: Ipv6Addr| {
        let [.., a, b, c, d] = ip.octets();
        Ipv4Addr::new(a, b, c, d)
    };
    if segments[..6] == [0; 6] || segments[..6] == [0x64, 0xff9b, 0, 0, 0, 0] {
        return refuse_v4(embedded(ip));
    }
    None
}

/// A resolver for hyper-util's `HttpConnector` that refuses the API server's names and drops
/// the addresses [`TargetPolicy`] refuses for its [`Reach`]; when none is left it fails with
/// [`NotAllowed`]. With [`Reach::Namespace`] it looks up a Service's absolute name (and
/// refuses any other name); with [`Reach::Granted`] and no CIDRs granted it looks up
/// nothing.
#[derive(Debug, Clone)]
pub struct GuardedResolver {
    policy: Arc<TargetPolicy>,
    reach: Reach,
}

impl GuardedResolver {
    /// A resolver enforcing `policy` for `reach`.
    #[must_use]
    pub fn new(policy: Arc<TargetPolicy>, reach: Reach) -> Self {
        Self { policy, reach }
    }
}

/// Whether `reach` may connect to `ip` under `policy`.
fn check_reach(policy: &TargetPolicy, reach: &Reach, ip: IpAddr) -> Result<(), NotAllowed> {
    match reach {
        Reach::Namespace { .. } => policy.check_ip(ip),
        Reach::Granted => policy.check_granted(ip),
    }
}

type BoxError = Box<dyn std::error::Error + Send + Sync>;
type BoxFuture<T> = Pin<Box<dyn Future<Output = Result<T, BoxError>> + Send>>;

impl tower_service::Service<Name> for GuardedResolver {
    type Response = std::vec::IntoIter<SocketAddr>;
    type Error = BoxError;
    type Future = BoxFuture<Self::Response>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, name: Name) -> Self::Future {
        let policy = Arc::clone(&self.policy);
        let reach = self.reach.clone();
        Box::pin(async move {
            let host = name.as_str();
            policy.check_name(host)?;
            let lookup = match &reach {
                Reach::Namespace { cluster_domain } => service_name(host, cluster_domain)
                    .map(|s| s.fqdn)
                    .ok_or(NotAllowed(Refusal::OutsideNamespace))?,
                Reach::Granted if !policy.has_grants() => {
                    return Err(NotAllowed(Refusal::OutsideNamespace).into());
                }
                Reach::Granted => host.to_owned(),
            };
            // The port is set by the connector afterwards.
            let resolved = tokio::net::lookup_host((lookup.as_str(), 0)).await?;
            let mut refused = None;
            let allowed: Vec<SocketAddr> = resolved
                .filter(|addr| match check_reach(&policy, &reach, addr.ip()) {
                    Ok(()) => true,
                    Err(e) => {
                        tracing::debug!(%host, address = %addr.ip(), refused = %e.0, "address refused");
                        refused = Some(e);
                        false
                    }
                })
                .collect();
            match (allowed.is_empty(), refused) {
                (true, Some(e)) => Err(e.into()),
                (true, None) => Err(format!("{host} resolves to no address").into()),
                (false, _) => Ok(allowed.into_iter()),
            }
        })
    }
}

/// hyper-util's `HttpConnector` with the policy: a literal IP host is checked before
/// connecting (the `HttpConnector` does not resolve those; [`Reach::Namespace`] refuses
/// them all), a name goes through [`GuardedResolver`].
#[derive(Debug, Clone)]
pub struct GuardedConnector {
    policy: Arc<TargetPolicy>,
    reach: Reach,
    inner: HttpConnector<GuardedResolver>,
}

impl GuardedConnector {
    /// A connector enforcing `policy` for `reach` that connects with `configure`'s settings.
    #[must_use]
    pub fn new(
        policy: Arc<TargetPolicy>,
        reach: Reach,
        configure: impl FnOnce(&mut HttpConnector<GuardedResolver>),
    ) -> Self {
        let mut inner = HttpConnector::new_with_resolver(GuardedResolver::new(
            Arc::clone(&policy),
            reach.clone(),
        ));
        configure(&mut inner);
        Self {
            policy,
            reach,
            inner,
        }
    }

    /// The policy's answer for the host of `uri` when it is a literal IP; `Ok` for a name
    /// (checked when it is resolved) and for a URI without a host (the connector refuses it).
    fn check_literal(&self, uri: &Uri) -> Result<(), NotAllowed> {
        let Some(host) = uri.host() else {
            return Ok(());
        };
        let host = host.trim_start_matches('[').trim_end_matches(']');
        match (host.parse::<IpAddr>(), &self.reach) {
            (Ok(_), Reach::Namespace { .. }) => Err(NotAllowed(Refusal::OutsideNamespace)),
            (Ok(ip), Reach::Granted) => self.policy.check_granted(ip),
            (Err(_), _) => Ok(()),
        }
    }
}

impl tower_service::Service<Uri> for GuardedConnector {
    type Response = TokioIo<TcpStream>;
    type Error = BoxError;
    type Future = BoxFuture<Self::Response>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        tower_service::Service::<Uri>::poll_ready(&mut self.inner, cx).map_err(Into::into)
    }

    fn call(&mut self, uri: Uri) -> Self::Future {
        if let Err(e) = self.check_literal(&uri) {
            tracing::debug!(host = ?uri.host(), refused = %e.0, "address refused");
            return Box::pin(std::future::ready(Err(e.into())));
        }
        let connecting = tower_service::Service::<Uri>::call(&mut self.inner, uri);
        Box::pin(async move { connecting.await.map_err(Into::into) })
    }
}

/// Whether `error` or one of its sources is a [`NotAllowed`].
#[must_use]
pub fn not_allowed_in(error: &(dyn std::error::Error + 'static)) -> Option<NotAllowed> {
    let mut next = Some(error);
    while let Some(e) = next {
        if let Some(n) = e.downcast_ref::<NotAllowed>() {
            return Some(*n);
        }
        next = e.source();
    }
    None
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    fn refused(policy: &TargetPolicy, s: &str) -> Option<Refusal> {
        policy.check_ip(ip(s)).err().map(|e| e.0)
    }

    #[test]
    fn refuses_what_a_tenant_must_not_reach() {
        let p = TargetPolicy::new(Vec::new(), Some("10.96.0.1"));
        for (addr, why) in [
            ("127.0.0.1", Refusal::Loopback),
            ("127.255.0.9", Refusal::Loopback),
            ("::1", Refusal::Loopback),
            ("::ffff:127.0.0.1", Refusal::Loopback),
            ("::127.0.0.1", Refusal::Loopback),
            ("64:ff9b::7f00:1", Refusal::Loopback),
            ("0.0.0.0", Refusal::Unspecified),
            ("0.1.2.3", Refusal::Unspecified),
            ("::", Refusal::Unspecified),
            ("::ffff:0.0.0.0", Refusal::Unspecified),
            ("169.254.169.254", Refusal::LinkLocal),
            ("::ffff:169.254.169.254", Refusal::LinkLocal),
            ("64:ff9b::a9fe:a9fe", Refusal::LinkLocal),
            ("fe80::1", Refusal::LinkLocal),
            ("febf::1", Refusal::LinkLocal),
            ("224.0.0.1", Refusal::Multicast),
            ("239.255.255.250", Refusal::Multicast),
            ("ff02::1", Refusal::Multicast),
            ("255.255.255.255", Refusal::Reserved),
            ("240.0.0.1", Refusal::Reserved),
            ("100.100.100.200", Refusal::CloudMetadata),
            ("fd00:ec2::254", Refusal::CloudMetadata),
            ("10.96.0.1", Refusal::ApiServer),
            ("::ffff:10.96.0.1", Refusal::ApiServer),
        ] {
            assert_eq!(refused(&p, addr), Some(why), "{addr}");
        }
    }

    #[test]
    fn allows_cluster_and_public_addresses() {
        let p = TargetPolicy::new(Vec::new(), Some("10.96.0.1"));
        for addr in [
            "10.96.0.10",
            "10.244.1.7",
            "172.16.0.5",
            "192.168.1.20",
            "100.64.0.1",
            "100.100.100.201",
            "8.8.8.8",
            "fd00::1",
            "fd00:ec2::253",
            "2001:db8::1",
            "::ffff:10.0.0.7",
            "fec0::1",
        ] {
            assert_eq!(refused(&p, addr), None, "{addr}");
        }
        // Without KUBERNETES_SERVICE_HOST (outside a cluster) no address is the API server.
        let outside = TargetPolicy::new(Vec::new(), None);
        assert_eq!(refused(&outside, "10.96.0.1"), None);
        // An IPv6 API server, bracketed or not.
        let v6 = TargetPolicy::new(Vec::new(), Some("[fd00:10:96::1]"));
        assert_eq!(refused(&v6, "fd00:10:96::1"), Some(Refusal::ApiServer));
    }

    #[test]
    fn the_allow_list_overrides_the_rules() {
        let allowed = vec!["127.0.0.0/8".parse().unwrap(), "::1".parse().unwrap()];
        let p = TargetPolicy::new(allowed, Some("10.96.0.1"));
        assert_eq!(refused(&p, "127.0.0.1"), None);
        assert_eq!(
            refused(&p, "::ffff:127.0.0.1"),
            None,
            "mapped: the IPv4 rule"
        );
        assert_eq!(refused(&p, "::1"), None);
        assert_eq!(refused(&p, "169.254.169.254"), Some(Refusal::LinkLocal));
        let api = TargetPolicy::new(vec!["10.96.0.1/32".parse().unwrap()], Some("10.96.0.1"));
        assert_eq!(refused(&api, "10.96.0.1"), None);
    }

    #[test]
    fn api_server_names_are_refused() {
        let p = TargetPolicy::default();
        for name in [
            "kubernetes",
            "KUBERNETES.default",
            "kubernetes.default.svc",
            "kubernetes.default.svc.cluster.local",
            "kubernetes.default.svc.cluster.local.",
            "kubernetes.default.svc.corp.example",
        ] {
            assert_eq!(
                p.check_name(name),
                Err(NotAllowed(Refusal::ApiServer)),
                "{name}"
            );
        }
        for name in [
            "pulsar-broker.pulsar",
            "kubernetes-broker",
            "kubernetes.pulsar",
        ] {
            assert_eq!(p.check_name(name), Ok(()), "{name}");
        }
    }

    #[test]
    fn cidrs_parse_and_match() {
        let c: Cidr = "10.0.0.0/8".parse().unwrap();
        assert!(c.contains(ip("10.255.0.1")));
        assert!(c.contains(ip("::ffff:10.1.2.3")));
        assert!(!c.contains(ip("11.0.0.1")));
        assert!(!c.contains(ip("::1")));
        let any: Cidr = "0.0.0.0/0".parse().unwrap();
        assert!(any.contains(ip("127.0.0.1")));
        let v6: Cidr = "fd00::/8".parse().unwrap();
        assert!(v6.contains(ip("fd12::1")));
        assert!(!v6.contains(ip("fe80::1")));
        let one: Cidr = " ::1 ".parse().unwrap();
        assert!(one.contains(ip("::1")) && !one.contains(ip("::2")));
        for bad in [
            "",
            "10.0.0.0/33",
            "::/129",
            "10.0.0/8",
            "localhost",
            "10.0.0.0/x",
        ] {
            assert!(bad.parse::<Cidr>().is_err(), "{bad:?}");
        }
    }

    #[test]
    fn service_names_of_a_namespace() {
        let ns = |host: &str| service_name(host, "cluster.local").map(|s| (s.namespace, s.fqdn));
        let of = |namespace: &str, fqdn: &str| Some((namespace.to_owned(), fqdn.to_owned()));
        assert_eq!(
            ns("pulsar-broker.pulsar"),
            of("pulsar", "pulsar-broker.pulsar.svc.cluster.local.")
        );
        assert_eq!(
            ns("pulsar-broker.pulsar.svc"),
            of("pulsar", "pulsar-broker.pulsar.svc.cluster.local.")
        );
        assert_eq!(
            ns("Pulsar-Broker.pulsar.svc.cluster.local."),
            of("pulsar", "pulsar-broker.pulsar.svc.cluster.local.")
        );
        // A headless Service's pod.
        assert_eq!(
            ns("broker-0.brokers.team-a.svc"),
            of("team-a", "broker-0.brokers.team-a.svc.cluster.local.")
        );
        // A Service or a namespace called svc.
        assert_eq!(
            ns("svc.team-a"),
            of("team-a", "svc.team-a.svc.cluster.local.")
        );
        assert_eq!(
            ns("broker.svc.svc.cluster.local"),
            of("svc", "broker.svc.svc.cluster.local.")
        );
        for other in [
            "broker",
            "localhost",
            "broker.team-a.example.com",
            // Another domain after `svc`: the public DNS would answer it.
            "broker.team-a.svc.evil.example",
            "a.b.c.d.svc",
            "broker..svc",
            ".team-a",
            "10.0.0.1",
            "[::1]",
            "",
        ] {
            assert_eq!(ns(other), None, "{other}");
        }
        // Another cluster domain.
        assert_eq!(
            service_name("b.team-a.svc.corp.internal", "corp.internal.").map(|s| s.fqdn),
            Some("b.team-a.svc.corp.internal.".to_owned())
        );
    }

    #[test]
    fn the_cluster_domain_comes_from_the_search_list() {
        let conf = "nameserver 10.96.0.10\nsearch ops.svc.corp.internal svc.corp.internal corp.internal\noptions ndots:5\n";
        assert_eq!(cluster_domain_in(conf).as_deref(), Some("corp.internal"));
        assert_eq!(
            cluster_domain_in("nameserver 1.1.1.1\nsearch example.com\n"),
            None
        );
        assert_eq!(cluster_domain_in(""), None);
    }

    #[test]
    fn granted_means_inside_the_administrators_cidrs() {
        let none = TargetPolicy::new(Vec::new(), None);
        assert!(!none.has_grants());
        assert_eq!(
            none.check_granted(ip("10.0.0.1")),
            Err(NotAllowed(Refusal::OutsideNamespace))
        );
        let some = TargetPolicy::new(vec!["10.96.5.7".parse().unwrap()], None);
        assert!(some.has_grants());
        assert_eq!(some.check_granted(ip("10.96.5.7")), Ok(()));
        assert_eq!(
            some.check_granted(ip("10.96.5.8")),
            Err(NotAllowed(Refusal::OutsideNamespace))
        );
    }

    #[tokio::test]
    async fn names_are_checked_after_resolving() {
        use tower_service::Service;
        let granted = |allowed: Vec<Cidr>| {
            GuardedResolver::new(Arc::new(TargetPolicy::new(allowed, None)), Reach::Granted)
        };
        // Nothing granted: not even looked up.
        let e = granted(Vec::new())
            .call(Name::from_str("localhost").unwrap())
            .await
            .unwrap_err();
        assert_eq!(
            not_allowed_in(&*e),
            Some(NotAllowed(Refusal::OutsideNamespace))
        );
        // `localhost` resolves to loopback only: outside what is granted.
        let e = granted(vec!["10.0.0.0/8".parse().unwrap()])
            .call(Name::from_str("localhost").unwrap())
            .await
            .unwrap_err();
        assert_eq!(
            not_allowed_in(&*e),
            Some(NotAllowed(Refusal::OutsideNamespace))
        );
        // The API server's names, whatever is granted.
        let e = granted(vec!["0.0.0.0/0".parse().unwrap()])
            .call(Name::from_str("kubernetes.default").unwrap())
            .await
            .unwrap_err();
        assert_eq!(not_allowed_in(&*e), Some(NotAllowed(Refusal::ApiServer)));
        // Granted, it resolves.
        let addrs: Vec<_> = granted(vec!["127.0.0.0/8".parse().unwrap(), "::1".parse().unwrap()])
            .call(Name::from_str("localhost").unwrap())
            .await
            .unwrap()
            .collect();
        assert!(addrs.iter().all(|a| a.ip().is_loopback()) && !addrs.is_empty());
        // A namespace's reach takes Service names only, and looks nothing else up.
        let mut services = GuardedResolver::new(
            Arc::new(TargetPolicy::new(
                vec!["127.0.0.0/8".parse().unwrap()],
                None,
            )),
            Reach::Namespace {
                cluster_domain: "cluster.local".into(),
            },
        );
        for name in ["localhost", "broker.team-a.example.com"] {
            let e = services
                .call(Name::from_str(name).unwrap())
                .await
                .unwrap_err();
            assert_eq!(
                not_allowed_in(&*e),
                Some(NotAllowed(Refusal::OutsideNamespace)),
                "{name}"
            );
        }
        // Addresses a namespace's Service resolves to pass the rules.
        let policy = TargetPolicy::default();
        let namespace = Reach::Namespace {
            cluster_domain: "cluster.local".into(),
        };
        assert_eq!(
            check_reach(&policy, &namespace, ip("127.0.0.1")),
            Err(NotAllowed(Refusal::Loopback))
        );
        assert_eq!(check_reach(&policy, &namespace, ip("10.244.0.7")), Ok(()));
        assert_eq!(
            check_reach(&policy, &Reach::Granted, ip("10.244.0.7")),
            Err(NotAllowed(Refusal::OutsideNamespace))
        );
    }

    #[tokio::test]
    async fn literal_addresses_are_checked_before_connecting() {
        use tower_service::Service;
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let namespace = Reach::Namespace {
            cluster_domain: "cluster.local".into(),
        };
        let everything = Arc::new(TargetPolicy::new(vec!["0.0.0.0/0".parse().unwrap()], None));
        let mut refusing = [
            GuardedConnector::new(Arc::new(TargetPolicy::default()), Reach::Granted, |_| {}),
            // A namespace's reach is by Service name: no literal address at all.
            GuardedConnector::new(everything, namespace, |_| {}),
        ];
        for guarded in &mut refusing {
            for uri in [
                format!("http://127.0.0.1:{port}/"),
                format!("http://[::ffff:127.0.0.1]:{port}/"),
                format!("http://0.0.0.0:{port}/"),
            ] {
                let e = guarded.call(uri.parse().unwrap()).await.unwrap_err();
                assert!(not_allowed_in(&*e).is_some(), "{uri}: {e}");
            }
        }
        // Nothing reached the listener.
        let accepted =
            tokio::time::timeout(std::time::Duration::from_millis(100), listener.accept()).await;
        assert!(accepted.is_err(), "no connection was made");
        // Granted: it connects.
        let allowed = Arc::new(TargetPolicy::new(vec!["127.0.0.1".parse().unwrap()], None));
        let mut open = GuardedConnector::new(allowed, Reach::Granted, |_| {});
        let uri = format!("http://127.0.0.1:{port}/").parse().unwrap();
        assert!(open.call(uri).await.is_ok());
    }
}
