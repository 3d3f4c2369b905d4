//! The node's network: the bridge, sysctls and nftables rules on this
//! machine, and the cluster objects that make DNS and the host's services
//! reachable from pods.

use super::{API_SERVICE_IP, BRIDGE, DNS_SERVICE_IP, HOST_PORTS, NFT_TABLE, NODE_IP, NODE_NAME};
use crate::commands::cluster::{API_SERVER_PORT, Layout};
use anyhow::{Context, Result, bail};
use std::process::{Command, Stdio};
use xtask::support::cmd;

/// The nftables rules of the node (replaced as a whole on every `up`).
fn nft_rules() -> String {
    format!(
        "table ip {NFT_TABLE}
delete table ip {NFT_TABLE}
table ip {NFT_TABLE} {{
    # Pods reach the API server, which listens on 127.0.0.1 only, through the
    # `kubernetes` Service address. Runs before kube-proxy's DNAT.
    chain pods_to_api {{
        type nat hook prerouting priority -110; policy accept;
        iifname \"{BRIDGE}\" ip daddr {API_SERVICE_IP} tcp dport 443 dnat to 127.0.0.1:{API_SERVER_PORT}
    }}
    # Services of this machine that pods use, on the bridge address: the
    # Pulsar broker of `cargo xtask pulsar up` (binary and admin ports), which
    # listens on 127.0.0.1 and advertises the bridge address, and the OTLP/HTTP
    # receiver of the tests' Jaeger (127.0.0.1:4318). The same from
    # the host itself, so both follow the broker's lookup answers.
    chain pods_to_host {{
        type nat hook prerouting priority -110; policy accept;
        iifname \"{BRIDGE}\" ip daddr {NODE_IP} tcp dport {{ {HOST_PORTS} }} dnat to 127.0.0.1
    }}
    chain host_to_host {{
        type nat hook output priority -110; policy accept;
        ip daddr {NODE_IP} tcp dport {{ {HOST_PORTS} }} dnat to 127.0.0.1
    }}
    # The pod network is a private bridge: nothing from it leaves the machine.
    chain keep_inside {{
        type filter hook forward priority -10; policy accept;
        iifname \"{BRIDGE}\" oifname != \"{BRIDGE}\" drop
    }}
}}
"
    )
}

fn sysctl(key: &str, value: &str) -> Result<()> {
    let path = format!("/proc/sys/{}", key.replace('.', "/"));
    std::fs::write(&path, value).with_context(|| format!("setting {key}={value}"))
}

/// The bridge, sysctls and nftables rules (idempotent).
pub fn setup_network() -> Result<()> {
    let exists = cmd::succeeds(Command::new("ip").args(["link", "show", BRIDGE]));
    if !exists {
        cmd::run(Command::new("ip").args(["link", "add", BRIDGE, "type", "bridge"]))?;
    }
    let addr = format!("{NODE_IP}/16");
    let has_addr = cmd::output(Command::new("ip").args(["-4", "addr", "show", "dev", BRIDGE]))
        .is_ok_and(|o| o.contains(&addr));
    if !has_addr {
        cmd::run(Command::new("ip").args(["addr", "add", &addr, "dev", BRIDGE]))?;
    }
    cmd::run(Command::new("ip").args(["link", "set", BRIDGE, "up"]))?;
    sysctl("net.ipv4.ip_forward", "1")?;
    sysctl(&format!("net.ipv4.conf.{BRIDGE}.route_localnet"), "1")?;
    // Traffic between pods on the bridge goes through kube-proxy's rules too.
    let _ = sysctl("net.bridge.bridge-nf-call-iptables", "1");
    let rules = nft_rules();
    let mut nft = Command::new("nft")
        .args(["-f", "-"])
        .stdin(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .context("running nft")?;
    if let Some(mut stdin) = nft.stdin.take() {
        use std::io::Write;
        stdin.write_all(rules.as_bytes())?;
    }
    let out = nft.wait_with_output()?;
    if !out.status.success() {
        bail!(
            "nft refused the node's rules: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(())
}

/// Objects of the cluster that the node needs: the `kube-dns` Service with
/// its endpoint on the bridge, and what CoreDNS may read.
fn cluster_objects() -> String {
    let dns_endpoints = bridge_endpoints(
        "kube-dns",
        "kube-system",
        &[("dns", 53, "UDP"), ("dns-tcp", 53, "TCP")],
        Some(NODE_NAME),
    );
    let pulsar_endpoints = bridge_endpoints(
        "pulsar-broker",
        "pulsar",
        &[("pulsar", 6650, "TCP"), ("http", 18080, "TCP")],
        None,
    );
    let jaeger_endpoints = bridge_endpoints(
        "jaeger-collector",
        "observability",
        &[("otlp-http", 4318, "TCP")],
        None,
    );
    format!(
        "apiVersion: v1
kind: Service
metadata:
  name: kube-dns
  namespace: kube-system
  labels:
    k8s-app: kube-dns
    kubernetes.io/name: CoreDNS
spec:
  clusterIP: {DNS_SERVICE_IP}
  ports:
  - {{name: dns, port: 53, protocol: UDP, targetPort: 53}}
  - {{name: dns-tcp, port: 53, protocol: TCP, targetPort: 53}}
---
{dns_endpoints}---
# The Pulsar broker of `cargo xtask pulsar up`, as pods address it:
# pulsar://pulsar-broker.pulsar.svc:6650 (a headless Service: the name
# resolves to the bridge address, where the broker is forwarded).
apiVersion: v1
kind: Namespace
metadata:
  name: pulsar
---
apiVersion: v1
kind: Service
metadata:
  name: pulsar-broker
  namespace: pulsar
spec:
  clusterIP: None
  ports:
  - {{name: pulsar, port: 6650, protocol: TCP}}
  - {{name: http, port: 18080, protocol: TCP}}
---
{pulsar_endpoints}---
# The OTLP/HTTP receiver of the Jaeger that the end-to-end tests start on this
# machine (127.0.0.1:4318), as pods address it:
# OTEL_EXPORTER_OTLP_ENDPOINT=http://jaeger-collector.observability:4318
apiVersion: v1
kind: Namespace
metadata:
  name: observability
---
apiVersion: v1
kind: Service
metadata:
  name: jaeger-collector
  namespace: observability
spec:
  clusterIP: None
  ports:
  - {{name: otlp-http, port: 4318, protocol: TCP}}
---
{jaeger_endpoints}---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata:
  name: system:coredns
rules:
- apiGroups: [\"\"]
  resources: [endpoints, services, pods, namespaces]
  verbs: [list, watch]
- apiGroups: [discovery.k8s.io]
  resources: [endpointslices]
  verbs: [list, watch]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata:
  name: system:coredns
roleRef:
  apiGroup: rbac.authorization.k8s.io
  kind: ClusterRole
  name: system:coredns
subjects:
- apiGroup: rbac.authorization.k8s.io
  kind: User
  name: system:coredns
"
    )
}

/// An EndpointSlice of the Service `service` in `namespace` whose one
/// endpoint is this machine's bridge address; `ports`: (name, port,
/// protocol); `node`: the node the endpoint is on, if any.
fn bridge_endpoints(
    service: &str,
    namespace: &str,
    ports: &[(&str, u16, &str)],
    node: Option<&str>,
) -> String {
    let ports: String = ports
        .iter()
        .map(|(name, port, protocol)| {
            format!("- {{name: {name}, port: {port}, protocol: {protocol}}}\n")
        })
        .collect();
    let node = node
        .map(|n| format!("  nodeName: {n}\n"))
        .unwrap_or_default();
    format!(
        "apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: {service}-host
  namespace: {namespace}
  labels:
    kubernetes.io/service-name: {service}
    endpointslice.kubernetes.io/managed-by: xtask-cluster
addressType: IPv4
ports:
{ports}endpoints:
- addresses: [\"{NODE_IP}\"]
  conditions: {{ready: true}}
{node}"
    )
}

/// Applies [`cluster_objects`].
pub fn apply_cluster_objects(layout: &Layout) -> Result<()> {
    layout
        .apply("node-objects.yaml", &cluster_objects(), true)
        .context("applying the kube-dns Service and CoreDNS's RBAC")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nft_rules_keep_pods_inside_and_reach_the_api() {
        let rules = nft_rules();
        assert!(rules.contains(&format!("dnat to 127.0.0.1:{API_SERVER_PORT}")));
        assert!(rules.contains("oifname != \"rustop0\" drop"));
    }

    #[test]
    fn dns_endpoint_is_the_bridge() {
        let objects = cluster_objects();
        assert!(objects.contains(&format!("clusterIP: {DNS_SERVICE_IP}")));
        assert!(objects.contains(&format!("addresses: [\"{NODE_IP}\"]")));
    }
}
