//! The local cluster's real node: containerd, kubelet, kube-proxy and CoreDNS
//! on this machine, so the project's images start as real Pods.
//!
//! Layout (everything on this machine, nothing routed off it):
//! - a bridge `rustop0` with the gateway `10.88.0.1/16`; the bridge CNI plugin
//!   puts every pod on it (host-local IPAM), without masquerading;
//! - an nftables table of our own: pods reach the API server (bound to
//!   127.0.0.1 only) through the `kubernetes` Service address 10.96.0.1:443,
//!   and nothing a pod sends is forwarded out of the bridge;
//! - kube-proxy (iptables mode) serves ClusterIPs, and NodePorts only on
//!   127.0.0.1 and the bridge address;
//! - CoreDNS on 10.88.0.1:53 behind the `kube-dns` Service (10.96.0.10),
//!   answering cluster names only (nothing is forwarded);
//! - a registry on 127.0.0.1 that containerd uses as the mirror of every
//!   registry name, so manifests keep their usual image names.
//!
//! The machine this is developed on has cgroup v1 and no systemd: the kubelet
//! runs with the cgroupfs driver and `failCgroupV1: false`.

mod config;
mod network;
mod teardown;

pub use config::write_configs;
pub use network::{apply_cluster_objects, setup_network};
pub use teardown::tear_down;

use super::{Layout, Process, build};
use crate::commands::image;
use anyhow::{Context, Result, bail};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;
use xtask::support::cmd;

/// The real node's name.
pub const NODE_NAME: &str = "real-node";
/// The pod bridge.
pub const BRIDGE: &str = "rustop0";
/// The bridge's address: the node's InternalIP and the pods' gateway.
pub const NODE_IP: &str = "10.88.0.1";
/// The pod network.
pub const POD_CIDR: &str = "10.88.0.0/16";
/// The `kubernetes` Service address (first address of the Service range).
const API_SERVICE_IP: &str = "10.96.0.1";
/// The `kube-dns` Service address pods use as their resolver.
pub const DNS_SERVICE_IP: &str = "10.96.0.10";
/// The image registry the node pulls from (every registry name maps here).
pub const REGISTRY: &str = "127.0.0.1:15000";
/// The sandbox ("pause") image containerd runs for every pod.
const PAUSE_IMAGE: &str = "registry.k8s.io/pause:3.10";
/// The taint that keeps ordinary pods off the simulated nodes (namespaces
/// annotated with `xtask::support::simulated::NAMESPACE_ANNOTATIONS` tolerate it).
pub const KWOK_TAINT: &str = xtask::support::simulated::TAINT_KEY;
/// Ports of services on this machine that pods reach on [`NODE_IP`]: the
/// Pulsar broker's binary protocol and admin API, and the OTLP/HTTP receiver of the
/// Jaeger the end-to-end tests start (the operators' traces).
const HOST_PORTS: &str = "6650, 18080, 4318";
/// Our nftables table.
const NFT_TABLE: &str = "rust_operators_node";

/// Debian packages the real node needs, by the program that proves each.
const PACKAGES: [(&str, &str); 7] = [
    ("runc", "runc"),
    ("iptables", "iptables"),
    ("nft", "nftables"),
    ("conntrack", "conntrack"),
    ("ip", "iproute2"),
    ("docker-registry", "docker-registry"),
    ("skopeo", "skopeo"),
];

/// Whether this machine can run the real node (root, for namespaces,
/// cgroups, mounts and the bridge).
pub fn supported() -> bool {
    xtask::support::machine_packages::is_root()
}

/// Installs the Debian packages the node needs (we run as root here).
pub fn ensure_packages() -> Result<()> {
    xtask::support::machine_packages::ensure_debian(&PACKAGES)?;
    xtask::support::machine_packages::ensure_debian(&image::system::PACKAGES)
}

/// Files of the node under the cluster's state folder.
pub struct NodeLayout {
    root: PathBuf,
}

impl NodeLayout {
    /// The node's folder in `layout`.
    pub fn new(layout: &Layout) -> Self {
        NodeLayout {
            root: layout.root.join("node"),
        }
    }
    /// The root of everything the node mounts or writes.
    pub fn root(&self) -> &Path {
        &self.root
    }
    fn path(&self, rel: &str) -> PathBuf {
        self.root.join(rel)
    }
    /// containerd's socket.
    pub fn containerd_socket(&self) -> PathBuf {
        self.path("containerd/containerd.sock")
    }
}

/// Command-line arguments of the node's processes.
pub fn process_args(layout: &Layout, p: Process) -> Result<Vec<String>> {
    let node = NodeLayout::new(layout);
    let cfg = |f: &str| layout.config(f).display().to_string();
    Ok(match p {
        Process::Registry => vec!["serve".into(), cfg("registry.yaml")],
        Process::Containerd => vec![format!("--config={}", cfg("containerd.toml"))],
        Process::Kubelet => vec![
            format!("--config={}", cfg("kubelet.yaml")),
            format!("--kubeconfig={}", cfg("kubelet.kubeconfig")),
            format!("--root-dir={}", node.path("kubelet").display()),
            format!("--cert-dir={}", node.path("kubelet/pki").display()),
            format!("--hostname-override={NODE_NAME}"),
            format!("--node-ip={NODE_IP}"),
            "--node-labels=type=real".into(),
            "--v=1".into(),
        ],
        Process::KubeProxy => vec![format!("--config={}", cfg("kube-proxy.yaml"))],
        Process::CoreDns => vec!["-conf".into(), cfg("Corefile")],
        other => bail!("{} is not a process of the real node", other.name()),
    })
}

/// Pushes the images every cluster needs (pause, busybox, memcached) to the
/// node's registry unless it has them.
pub fn ensure_system_images() -> Result<()> {
    for img in image::system::ALL {
        let repo = image::system::registry_path(img.reference);
        if registry_has(&repo)? {
            continue;
        }
        let built = image::system::build(img)?;
        image::push_to(&built, &format!("{REGISTRY}/{repo}"))?;
    }
    Ok(())
}

/// Whether the node's registry has `repo:tag`.
pub fn registry_has(repo_tag: &str) -> Result<bool> {
    let (repo, tag) = repo_tag
        .rsplit_once(':')
        .with_context(|| format!("{repo_tag} has no tag"))?;
    let out = Command::new("curl")
        .args([
            "-s",
            "-o",
            "/dev/null",
            "-w",
            "%{http_code}",
            "--max-time",
            "5",
            "-I",
            "-H",
            "Accept: application/vnd.oci.image.index.v1+json, application/vnd.oci.image.manifest.v1+json",
            &format!("http://{REGISTRY}/v2/{repo}/manifests/{tag}"),
        ])
        .stdin(Stdio::null())
        .output()?;
    Ok(String::from_utf8_lossy(&out.stdout).trim() == "200")
}

/// Whether the registry answers.
pub fn registry_ready() -> bool {
    Command::new("curl")
        .args(["-sf", "--max-time", "2", &format!("http://{REGISTRY}/v2/")])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// Whether containerd answers on its socket.
pub fn containerd_ready(layout: &Layout) -> bool {
    let node = NodeLayout::new(layout);
    build::CONTAINERD.binary("ctr").is_ok_and(|ctr| {
        Command::new(ctr)
            .arg(format!("--address={}", node.containerd_socket().display()))
            .args(["version"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    })
}

/// Whether CoreDNS says it is ready.
pub fn coredns_ready() -> bool {
    Command::new("curl")
        .args(["-sf", "--max-time", "2", "http://127.0.0.1:18181/ready"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// Waits until the real node is Ready.
pub fn wait_ready(layout: &Layout) -> Result<()> {
    let ok = cmd::wait_until(Duration::from_secs(90), || {
        layout.kubectl().is_ok_and(|k| {
            k.output([
                "get",
                "node",
                NODE_NAME,
                "-o",
                "jsonpath={.status.conditions[?(@.type==\"Ready\")].status}",
            ])
            .is_ok_and(|s| s.trim() == "True")
        })
    });
    if !ok {
        bail!(
            "the real node did not become Ready within 90 s; see {} and {}",
            layout.log(Process::Kubelet).display(),
            layout.log(Process::Containerd).display()
        );
    }
    Ok(())
}
