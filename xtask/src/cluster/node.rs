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

use super::{API_SERVER_PORT, Layout, Process, build, pki};
use crate::cmd;
use crate::image;
use anyhow::{Context, Result, bail};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

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
/// annotated with `xtask::simulated::NAMESPACE_ANNOTATIONS` tolerate it).
pub const KWOK_TAINT: &str = xtask::simulated::TAINT_KEY;
/// Ports of services on this machine that pods reach on [`NODE_IP`]: the
/// Pulsar broker's binary protocol and admin API.
const HOST_PORTS: &str = "6650, 18080";
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
    crate::deps::is_root()
}

/// Installs the Debian packages the node needs (we run as root here).
pub fn ensure_packages() -> Result<()> {
    crate::deps::ensure_debian(&PACKAGES)?;
    crate::deps::ensure_debian(&image::system::PACKAGES)
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
        pki::kubeconfig(&pki, &cfg_dir, identity, &super::api_server_url())?;
    }
    let runc = cmd::which("runc").context("runc is not installed (apt-get install runc)")?;
    let cni_bin = build::CNI.bin_dir()?;
    let shim_dir = build::CONTAINERD.bin_dir()?;
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
    std::fs::write(
        layout.config("kube-proxy.yaml"),
        format!(
            "apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
clientConnection:
  kubeconfig: {kubeconfig}
hostnameOverride: {NODE_NAME}
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
",
            kubeconfig = cfg_dir.join("kube-proxy.kubeconfig").display(),
        ),
    )?;
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
    # listens on 127.0.0.1 and advertises the bridge address. The same from
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
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: kube-dns-host
  namespace: kube-system
  labels:
    kubernetes.io/service-name: kube-dns
    endpointslice.kubernetes.io/managed-by: xtask-cluster
addressType: IPv4
ports:
- {{name: dns, port: 53, protocol: UDP}}
- {{name: dns-tcp, port: 53, protocol: TCP}}
endpoints:
- addresses: [\"{NODE_IP}\"]
  conditions: {{ready: true}}
  nodeName: {NODE_NAME}
---
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
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: pulsar-broker-host
  namespace: pulsar
  labels:
    kubernetes.io/service-name: pulsar-broker
    endpointslice.kubernetes.io/managed-by: xtask-cluster
addressType: IPv4
ports:
- {{name: pulsar, port: 6650, protocol: TCP}}
- {{name: http, port: 18080, protocol: TCP}}
endpoints:
- addresses: [\"{NODE_IP}\"]
  conditions: {{ready: true}}
---
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

/// Applies [`cluster_objects`].
pub fn apply_cluster_objects(layout: &Layout) -> Result<()> {
    let path = layout.config("node-objects.yaml");
    std::fs::write(&path, cluster_objects())?;
    cmd::output(
        layout
            .kubectl()?
            .with_args([
                "apply",
                "--server-side",
                "--force-conflicts",
                "--field-manager=xtask-cluster",
                "-f",
            ])
            .arg(&path),
    )
    .context("applying the kube-dns Service and CoreDNS's RBAC")?;
    Ok(())
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

/// Stops every container of the node and undoes its mounts, bridge and
/// rules, so the node's folder can be removed (`down`).
pub fn tear_down(layout: &Layout) {
    // Containers outlive containerd and its shims: kill what runs in the
    // kubelet's cgroups.
    kill_cgroup_tree("/sys/fs/cgroup/pids/kubepods");
    kill_cgroup_tree("/sys/fs/cgroup/memory/kubepods");
    let node = NodeLayout::new(layout);
    unmount_under(node.root());
    // containerd keeps pod network namespaces under /run/netns (cni-*).
    if let Ok(entries) = std::fs::read_dir("/run/netns") {
        for e in entries.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            if name.starts_with("cni-") {
                let _ = Command::new("umount")
                    .arg("-l")
                    .arg(e.path())
                    .stderr(Stdio::null())
                    .status();
                let _ = std::fs::remove_file(e.path());
            }
        }
    }
    let _ = Command::new("ip")
        .args(["link", "delete", BRIDGE])
        .stderr(Stdio::null())
        .status();
    let _ = Command::new("nft")
        .args(["delete", "table", "ip", NFT_TABLE])
        .stderr(Stdio::null())
        .status();
    // kube-proxy's own chains: it removes them with --cleanup.
    if let Ok(proxy) = build::KUBERNETES.binary("kube-proxy")
        && cmd::is_executable(&proxy)
    {
        let _ = Command::new(proxy)
            .arg("--cleanup")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
    }
    for controller in [
        "pids", "memory", "cpu", "cpuacct", "cpuset", "blkio", "devices", "freezer", "systemd",
    ] {
        remove_cgroup_dirs(Path::new(&format!("/sys/fs/cgroup/{controller}/kubepods")));
    }
}

fn kill_cgroup_tree(dir: &str) {
    let mut pids = Vec::new();
    collect_cgroup_pids(Path::new(dir), &mut pids);
    for pid in pids {
        xtask::process_group::signal_process(pid, "KILL");
    }
}

fn collect_cgroup_pids(dir: &Path, pids: &mut Vec<u32>) {
    if let Ok(text) = std::fs::read_to_string(dir.join("cgroup.procs")) {
        pids.extend(text.lines().filter_map(|l| l.trim().parse::<u32>().ok()));
    }
    if let Ok(entries) = std::fs::read_dir(dir) {
        for e in entries.flatten() {
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                collect_cgroup_pids(&e.path(), pids);
            }
        }
    }
}

fn remove_cgroup_dirs(dir: &Path) {
    if let Ok(entries) = std::fs::read_dir(dir) {
        for e in entries.flatten() {
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                remove_cgroup_dirs(&e.path());
            }
        }
    }
    let _ = std::fs::remove_dir(dir);
}

/// Lazily unmounts every mount point under `root`, deepest first.
fn unmount_under(root: &Path) {
    let Ok(info) = std::fs::read_to_string("/proc/self/mountinfo") else {
        return;
    };
    let mut points: Vec<&str> = info
        .lines()
        .filter_map(|l| l.split(' ').nth(4))
        .filter(|p| Path::new(p).starts_with(root))
        .collect();
    points.sort_by_key(|p| std::cmp::Reverse(p.len()));
    for p in points {
        let _ = Command::new("umount")
            .args(["-l", p])
            .stderr(Stdio::null())
            .status();
    }
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
