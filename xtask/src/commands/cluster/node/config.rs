//! The configuration files of the node's processes: registry, containerd,
//! CNI, kubelet, kube-proxy and CoreDNS.

use super::{
    BRIDGE, DNS_SERVICE_IP, NODE_IP, NODE_NAME, NodeLayout, PAUSE_IMAGE, POD_CIDR, REGISTRY,
};
use crate::commands::cluster::{Layout, build, pki, write_component_config};
use anyhow::{Context, Result};
use xtask::support::cmd;

/// Writes every configuration file of the node.
pub fn write_configs(layout: &Layout) -> Result<()> {
    let node = NodeLayout::new(layout);
    for dir in [
        "containerd/certs.d/_default",
        "cni/net.d",
        "kubelet",
        "registry",
    ] {
        std::fs::create_dir_all(node.path(dir))?;
    }
    let pki = layout.pki();
    let cfg_dir = layout.root.join("config");
    for id in ["kubelet", "kube-proxy", "coredns"] {
        let identity = pki::IDENTITIES
            .iter()
            .find(|i| i.file == id)
            .with_context(|| format!("no identity {id}"))?;
        pki::kubeconfig(
            &pki,
            &cfg_dir,
            identity,
            &crate::commands::cluster::api_server_url(),
        )?;
    }
    write_registry(layout, &node)?;
    write_containerd(layout, &node)?;
    write_cni(&node)?;
    write_kubelet(layout, &node)?;
    write_kube_proxy(layout)?;
    write_corefile(layout)
}

/// The registry's configuration: its storage under the node's folder.
fn write_registry(layout: &Layout, node: &NodeLayout) -> Result<()> {
    std::fs::write(
        layout.config("registry.yaml"),
        format!(
            "version: 0.1
log:
  level: warn
  accesslog:
    disabled: true
storage:
  filesystem:
    rootdirectory: {}
  delete:
    enabled: true
http:
  addr: {REGISTRY}
",
            node.path("registry").display()
        ),
    )?;
    Ok(())
}

/// containerd's configuration, and the registry mirror every image name
/// resolves to.
fn write_containerd(layout: &Layout, node: &NodeLayout) -> Result<()> {
    let runc = cmd::which("runc").context("runc is not installed (apt-get install runc)")?;
    let cni_bin = build::CNI.bin_dir()?;
    let shim_dir = build::CONTAINERD.bin_dir()?;
    std::fs::write(
        layout.config("containerd.toml"),
        format!(
            r#"# containerd of the local cluster's real node (written by `cargo xtask cluster up`).
version = 3
root = "{root}"
state = "{state}"
disabled_plugins = ["io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.devmapper", "io.containerd.snapshotter.v1.blockfile", "io.containerd.snapshotter.v1.erofs"]

[grpc]
  address = "{socket}"

[ttrpc]
  address = "{socket}.ttrpc"

[debug]
  level = "warn"

[metrics]
  address = ""

[plugins."io.containerd.cri.v1.images"]
  snapshotter = "overlayfs"
  [plugins."io.containerd.cri.v1.images".pinned_images]
    sandbox = "{pause}"
  [plugins."io.containerd.cri.v1.images".registry]
    config_path = "{certs}"

[plugins."io.containerd.cri.v1.runtime"]
  enable_selinux = false
  # This machine refuses a negative oom_score_adj even to root (no
  # CAP_SYS_RESOURCE); the kubelet asks -998 for sandboxes.
  restrict_oom_score_adj = true
  [plugins."io.containerd.cri.v1.runtime".containerd]
    default_runtime_name = "runc"
    [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc.options]
        BinaryName = "{runc}"
        SystemdCgroup = false
  [plugins."io.containerd.cri.v1.runtime".cni]
    bin_dirs = ["{cni_bin}"]
    conf_dir = "{cni_conf}"
"#,
            root = node.path("containerd/root").display(),
            state = node.path("containerd/state").display(),
            socket = node.containerd_socket().display(),
            pause = PAUSE_IMAGE,
            certs = node.path("containerd/certs.d").display(),
            runc = runc.display(),
            cni_bin = cni_bin.display(),
            cni_conf = node.path("cni/net.d").display(),
        ),
    )?;
    // Every registry name resolves to the local registry only: `server` is
    // the registry itself, so nothing falls back to the internet.
    std::fs::write(
        node.path("containerd/certs.d/_default/hosts.toml"),
        format!(
            "server = \"http://{REGISTRY}\"\n\n[host.\"http://{REGISTRY}\"]\n  capabilities = [\"pull\", \"resolve\"]\n  skip_verify = true\n"
        ),
    )?;
    let _ = shim_dir;
    Ok(())
}

/// The CNI configuration: every pod on the bridge, host-local addresses.
fn write_cni(node: &NodeLayout) -> Result<()> {
    std::fs::write(
        node.path("cni/net.d/10-rust-operators.conflist"),
        format!(
            r#"{{
  "cniVersion": "1.0.0",
  "name": "rust-operators",
  "plugins": [
    {{
      "type": "bridge",
      "bridge": "{BRIDGE}",
      "isGateway": true,
      "ipMasq": false,
      "hairpinMode": true,
      "ipam": {{
        "type": "host-local",
        "dataDir": "{ipam}",
        "ranges": [[{{"subnet": "{POD_CIDR}", "gateway": "{NODE_IP}"}}]],
        "routes": [{{"dst": "0.0.0.0/0"}}]
      }}
    }},
    {{"type": "portmap", "capabilities": {{"portMappings": true}}}}
  ]
}}
"#,
            ipam = node.path("cni/ipam").display(),
        ),
    )?;
    // Pods resolve cluster names only: their resolv.conf gets the cluster
    // DNS, and the host's resolvers are not passed on.
    Ok(())
}

/// The kubelet's configuration (and the empty resolv.conf its pods get).
fn write_kubelet(layout: &Layout, node: &NodeLayout) -> Result<()> {
    let pki = layout.pki();
    std::fs::write(node.path("kubelet/resolv.conf"), "")?;
    std::fs::write(
        layout.config("kubelet.yaml"),
        format!(
            "apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
address: {NODE_IP}
port: 10250
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: 10248
authentication:
  anonymous:
    enabled: false
  webhook:
    enabled: false
  x509:
    clientCAFile: {ca}
# Only clients with a certificate of the cluster CA get past authentication.
authorization:
  mode: AlwaysAllow
containerRuntimeEndpoint: unix://{socket}
# This machine has cgroup v1 and no systemd.
cgroupDriver: cgroupfs
failCgroupV1: false
failSwapOn: false
localStorageCapacityIsolation: false
clusterDNS: [{DNS_SERVICE_IP}]
clusterDomain: cluster.local
resolvConf: {resolv}
serializeImagePulls: false
maxPods: 110
podPidsLimit: 4096
evictionHard:
  memory.available: 100Mi
  nodefs.available: 1%
  nodefs.inodesFree: 1%
  imagefs.available: 1%
imageGCHighThresholdPercent: 99
imageGCLowThresholdPercent: 98
nodeStatusReportFrequency: 10s
syncFrequency: 10s
",
            ca = pki.join("ca.crt").display(),
            socket = node.containerd_socket().display(),
            resolv = node.path("kubelet/resolv.conf").display(),
        ),
    )?;
    Ok(())
}

/// kube-proxy's configuration: iptables mode, NodePorts on loopback and the
/// bridge only.
fn write_kube_proxy(layout: &Layout) -> Result<()> {
    let cfg_dir = layout.root.join("config");
    write_component_config(
        layout,
        "kube-proxy.yaml",
        ("kubeproxy.config.k8s.io/v1alpha1", "KubeProxyConfiguration"),
        &cfg_dir.join("kube-proxy.kubeconfig"),
        &format!(
            "hostnameOverride: {NODE_NAME}
mode: iptables
clusterCIDR: {POD_CIDR}
# NodePorts on loopback and the bridge only, never on the machine's own network.
nodePortAddresses: [\"127.0.0.1/32\", \"{NODE_IP}/32\"]
healthzBindAddress: 127.0.0.1:10256
metricsBindAddress: 127.0.0.1:10249
iptables:
  masqueradeAll: true
  localhostNodePorts: true
  syncPeriod: 30s
  minSyncPeriod: 1s
conntrack:
  maxPerCore: 0
  min: 0
  tcpEstablishedTimeout: 0s
  tcpCloseWaitTimeout: 0s
"
        ),
    )?;
    Ok(())
}

/// CoreDNS's Corefile: cluster names only, on the bridge address.
fn write_corefile(layout: &Layout) -> Result<()> {
    let cfg_dir = layout.root.join("config");
    std::fs::write(
        layout.config("Corefile"),
        format!(
            ".:53 {{
    bind {NODE_IP}
    errors
    ready 127.0.0.1:18181
    kubernetes cluster.local in-addr.arpa ip6.arpa {{
        kubeconfig {kubeconfig} local
        pods insecure
        fallthrough in-addr.arpa ip6.arpa
    }}
    cache 5
    loadbalance
}}
",
            kubeconfig = cfg_dir.join("coredns.kubeconfig").display(),
        ),
    )?;
    Ok(())
}
