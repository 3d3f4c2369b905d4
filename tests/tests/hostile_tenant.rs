//! One hostile tenant against the four operators, deployed from their images with their
//! real limits on the local cluster's real node, while another tenant goes about its work.
//!
//! Tenant `a` acts only with the built-in `edit` role (impersonated) and runs every attack
//! at once:
//! - a PulsarConsumer whose admin API answers 200 with 8 MiB, polled every second;
//!   others whose endpoint answers non-JSON text or a 500 with text, all of it carrying a
//!   marker that must never show up in a status or an event;
//! - a port scan through `spec.autoscaling.adminUrl` (loopback, link-local, the API server):
//!   refused, and an open port reads exactly like a closed one;
//! - twenty PulsarConsumers polled every second with the longest stabilization window;
//! - stray-pod churn: pods labelled as the PodSet operator's, owned by a ConfigMap,
//!   unlabelled and deleted, over and over;
//! - 1,100 half-sent requests held open against each of the operators' probe and metrics
//!   ports and against another tenant's lolcow page (at its pod), reopened as soon as the
//!   server closes them.
//!
//! The half-sent requests come from a thread of their own at a low CPU priority (nice 10),
//! as a tenant's pods run under a CPU limit, and a slot whose connection the server closed
//! waits 5 s before it opens the next: each server is still held at its connection caps
//! all the time (a new connection evicts a held one every few milliseconds), but on two
//! cores a flood that reconnected at once measured the machine (tens of thousands of
//! connections a second, on the test's own runtime too) rather than the operators. Each
//! attacked port must have seen at least half of `HALF_OPEN` connections.
//!
//! Tenant `b` (also only `edit`) creates one object of each kind and changes it, once with
//! no attack and once under attack. Asserted: `b` converges under attack about as fast as
//! without (the two times are reported side by side), no operator container restarts or turns unready, no
//! pod of `b` restarts, the attacked page keeps answering, nothing of `a`'s endpoints
//! appears in any status or event. Each operator's peak memory under attack is reported
//! against its limit (`target/e2e/hostile-tenant.json`).

use anyhow::{Context, Result, bail, ensure};
use e2e::deployed::{
    Deployed, NO_REAL_NODE, all_containers_ready, container_peak_memory, has_real_node, pods,
    restarts,
};
use e2e::kinds::{
    OPERATORS, free_node_port, lolcow_ready, memcached_ready, podset_ready, pulsar_consumer_ready,
};
use e2e::{TestNamespace, poll, pulsar, target_dir};
use k8s_openapi::api::core::v1::{ConfigMap, Pod, Service};
use k8s_openapi::api::events::v1::Event;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::{Client, Resource, ResourceExt};
use lolcow_operator::api::Lolcow;
use memcached_operator::api::Memcached;
use podset_operator::api::PodSet;
use pulsar_consumer_operator::api::PulsarConsumer;
use serde::de::DeserializeOwned;
use serde_json::{Value, json};
use std::collections::BTreeMap;
use std::fmt::Debug;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpSocket;

/// In every answer of tenant `a`'s endpoints; never in a status or an event.
const MARKER: &str = "tenant-a-secret-c0ffee";
/// Half-sent requests held open against each attacked port.
const HALF_OPEN: usize = 1_100;
/// Stray pods tenant `a` creates, unlabels and deletes.
const STRAYS: usize = 200;
/// PulsarConsumers with a 1 s poll and the longest stabilization window.
const WINDOWS: usize = 20;
/// The attacker thread's nice value.
const ATTACKER_NICE: i32 = 10;
/// How long a flood's slot waits after the server closed its connection.
const REOPEN_AFTER: Duration = Duration::from_secs(5);
/// How long one of `b`'s steps may take, attack or not.
const CONVERGE: Duration = Duration::from_secs(240);

async fn wait_until<K>(client: &Client, ns: &str, name: &str, ready: fn(&K) -> bool) -> Result<()>
where
    K: Resource<Scope = k8s_openapi::NamespaceResourceScope, DynamicType = ()>
        + Clone
        + Debug
        + DeserializeOwned
        + Send
        + Sync
        + 'static,
{
    let api: Api<K> = Api::namespaced(client.clone(), ns);
    e2e::wait_for_within(&api, name, CONVERGE, move |o: Option<&K>| {
        o.is_some_and(ready)
    })
    .await?;
    Ok(())
}

/// How long tenant `b` waited, each step in all and per kind.
#[derive(Debug, Clone)]
struct Convergence {
    create: Duration,
    change: Duration,
    create_by_kind: BTreeMap<&'static str, f64>,
    change_by_kind: BTreeMap<&'static str, f64>,
}

impl Convergence {
    fn report(&self) -> Value {
        json!({
            "create": self.create.as_secs_f64(),
            "change": self.change.as_secs_f64(),
            "create_by_kind": self.create_by_kind,
            "change_by_kind": self.change_by_kind,
        })
    }
}

/// Tenant `b`'s work: one object of each kind, created, then changed, each step waited for
/// until every object is Ready for its new generation.
async fn one_of_each(b: &Client, admin: &Client, ns: &TestNamespace) -> Result<Convergence> {
    let n = &ns.name;
    let port = free_node_port(ns, "tenant-b", &[]).await?;
    let mut pc = e2e::kinds::pulsar_consumer("pc", 1);
    pc["spec"]["serverAddress"] = json!("pulsar://pulsar-broker.pulsar.svc:6650");
    pc["spec"]["topic"] = json!(pulsar::unique_topic("tenant-b"));
    let started = Instant::now();
    e2e::create_as::<PodSet>(b, n, e2e::kinds::podset("ps", 1)).await?;
    e2e::create_as::<Memcached>(b, n, e2e::kinds::memcached("mc", 1)).await?;
    e2e::create_as::<Lolcow>(b, n, e2e::kinds::lolcow("cow", port, "Hello from b")).await?;
    e2e::create_as::<PulsarConsumer>(b, n, pc).await?;
    let create_by_kind = all_ready(admin, n, started).await?;
    let create = started.elapsed();

    let started = Instant::now();
    let merge = |spec: Value| Patch::Merge(json!({ "spec": spec }));
    let params = PatchParams::default();
    Api::<PodSet>::namespaced(b.clone(), n)
        .patch("ps", &params, &merge(json!({"replicas": 2})))
        .await?;
    Api::<Memcached>::namespaced(b.clone(), n)
        .patch("mc", &params, &merge(json!({"size": 2})))
        .await?;
    Api::<Lolcow>::namespaced(b.clone(), n)
        .patch("cow", &params, &merge(json!({"greeting": "Hello again"})))
        .await?;
    Api::<PulsarConsumer>::namespaced(b.clone(), n)
        .patch("pc", &params, &merge(json!({"replicas": 2})))
        .await?;
    let change_by_kind = all_ready(admin, n, started).await?;
    let lc = Api::<Lolcow>::namespaced(admin.clone(), n)
        .get("cow")
        .await?;
    ensure!(
        lc.status.and_then(|s| s.greeting).as_deref() == Some("Hello again"),
        "the Lolcow does not serve its new greeting"
    );
    Ok(Convergence {
        create,
        change: started.elapsed(),
        create_by_kind,
        change_by_kind,
    })
}

/// Waits until every object of `b` is Ready; returns when (seconds since `started`) each was.
async fn all_ready(
    admin: &Client,
    ns: &str,
    started: Instant,
) -> Result<BTreeMap<&'static str, f64>> {
    let (ps, mc, lc, pc) = tokio::join!(
        timed(
            "PodSet",
            started,
            wait_until::<PodSet>(admin, ns, "ps", podset_ready)
        ),
        timed(
            "Memcached",
            started,
            wait_until::<Memcached>(admin, ns, "mc", memcached_ready)
        ),
        timed(
            "Lolcow",
            started,
            wait_until::<Lolcow>(admin, ns, "cow", lolcow_ready)
        ),
        timed(
            "PulsarConsumer",
            started,
            wait_until::<PulsarConsumer>(admin, ns, "pc", pulsar_consumer_ready)
        ),
    );
    Ok(BTreeMap::from([ps?, mc?, lc?, pc?]))
}

/// `wait`'s outcome, with when (seconds since `started`) it ended.
async fn timed(
    kind: &'static str,
    started: Instant,
    wait: impl Future<Output = Result<()>>,
) -> Result<(&'static str, f64)> {
    wait.await.with_context(|| format!("{kind} of tenant b"))?;
    Ok((kind, started.elapsed().as_secs_f64()))
}

/// The shell of tenant `a`'s endpoint pod: busybox httpd on 8080 serving Pulsar-shaped
/// stats (an 8 MiB one, a text one, small valid ones), and a 500 with text on 8081.
fn endpoint_script() -> String {
    let stats = "/www/admin/v2/persistent/public/default";
    let body = format!("{MARKER}: internal details of the service of tenant a");
    let answer = format!(
        "HTTP/1.0 500 Internal Server Error\\r\\nContent-Type: text/plain\\r\\nContent-Length: {}\\r\\n\\r\\n{body}",
        body.len()
    );
    format!(
        r#"set -e
mkdir -p {stats}/flood {stats}/text
{{ printf '["{MARKER}",'; yes '0,' | head -c 8388600 | tr -d '\n'; printf '0]'; }} > {stats}/flood/stats
printf '{MARKER} is not JSON' > {stats}/text/stats
for i in $(seq 0 {last}); do
  mkdir -p {stats}/window-$i
  printf '{{"subscriptions":{{"s":{{"msgBacklog":0}}}},"note":"{MARKER}"}}' > {stats}/window-$i/stats
done
( while true; do printf '{answer}' | nc -l -p 8081 >/dev/null 2>&1 || true; done ) &
exec httpd -f -p 8080 -h /www
"#,
        last = WINDOWS - 1,
    )
}

fn endpoint_pod() -> Value {
    json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "endpoint", "labels": {"app": "endpoint"}},
        "spec": {
            "securityContext": {
                "runAsNonRoot": true, "runAsUser": 65534, "runAsGroup": 65534,
                "seccompProfile": {"type": "RuntimeDefault"}
            },
            "containers": [{
                "name": "endpoint",
                "image": "busybox",
                "imagePullPolicy": "IfNotPresent",
                "command": ["sh", "-c", endpoint_script()],
                "volumeMounts": [{"name": "www", "mountPath": "/www"}],
                "readinessProbe": {"tcpSocket": {"port": 8080}, "periodSeconds": 2},
                "securityContext": {
                    "allowPrivilegeEscalation": false,
                    "readOnlyRootFilesystem": true,
                    "capabilities": {"drop": ["ALL"]}
                },
                "resources": {"limits": {"memory": "64Mi", "cpu": "500m"}}
            }],
            "volumes": [{"name": "www", "emptyDir": {}}]
        }
    })
}

/// The headless Service of tenant `a`'s endpoint pod (the operator reads a tenant's admin
/// API only at a Service of its own namespace; headless, its name resolves to the pod).
fn endpoint_service() -> Value {
    json!({
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": "endpoint"},
        "spec": {
            "clusterIP": "None",
            "selector": {"app": "endpoint"},
            "ports": [
                {"name": "stats", "port": 8080, "targetPort": 8080},
                {"name": "error", "port": 8081, "targetPort": 8081}
            ]
        }
    })
}

/// A PulsarConsumer of tenant `a` that polls `admin_url` every second and runs no
/// consumer (its backlog is never above 0, and `minReplicas` is 0).
fn polled(name: &str, topic: &str, admin_url: &str, window: i32) -> Value {
    json!({
        "apiVersion": "pulsar.pulsarconsumer.krvarma.com/v1",
        "kind": "PulsarConsumer",
        "metadata": {"name": name},
        "spec": {
            "serverAddress": "pulsar://pulsar-broker.pulsar.svc:6650",
            "topic": topic,
            "subscriptionName": "s",
            "replicas": 0,
            "autoscaling": {
                "minReplicas": 0, "maxReplicas": 1, "targetBacklogPerReplica": 1000,
                "adminUrl": admin_url, "pollIntervalSeconds": 1,
                "behavior": {"scaleDownStabilizationSeconds": window}
            }
        }
    })
}

/// The `ScalingActive` condition of a PulsarConsumer: (reason, message).
fn scaling(pc: &PulsarConsumer) -> Option<(String, String)> {
    pc.status
        .as_ref()?
        .conditions
        .iter()
        .find(|c| c.type_ == "ScalingActive")
        .map(|c| (c.reason.clone(), c.message.clone()))
}

/// Targets of the port scan: loopback (an open and a closed port, and by name), the cloud
/// metadata address, the API server by address and by name, IPv6 loopback.
const SCAN: [(&str, &str); 7] = [
    ("scan-open", "http://127.0.0.1:8081"),
    ("scan-closed", "http://127.0.0.1:1"),
    ("scan-localhost", "http://localhost:8443"),
    ("scan-metadata", "http://169.254.169.254:80"),
    ("scan-apiserver", "https://10.96.0.1:443"),
    ("scan-apiserver-name", "https://kubernetes.default.svc:443"),
    ("scan-ipv6", "http://[::1]:8080"),
];

/// A source address of this machine that is not the real node's (the kubelet probes
/// from the node's address, so an attacker must be another peer).
fn attacker_source() -> Result<IpAddr> {
    let out = std::process::Command::new("ip")
        .args(["-4", "-o", "addr", "show", "scope", "global"])
        .output()
        .context("running `ip addr`")?;
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| {
            let addr = l.split_whitespace().skip_while(|w| *w != "inet").nth(1)?;
            addr.split('/').next()?.parse::<IpAddr>().ok()
        })
        .find(|ip| !ip.to_string().starts_with("10.88."))
        .context("this machine has no global IPv4 address besides the real node's to attack from")
}

/// The attacker's own thread and runtime, at nice 10: it gets a small share of the CPU when
/// the machine is busy, as a tenant's pods under a CPU limit get their share and no more.
struct Attacker {
    handle: tokio::runtime::Handle,
    done: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Attacker {
    fn start() -> Result<Attacker> {
        let (handle_tx, handle_rx) = std::sync::mpsc::channel();
        let (done, done_rx) = tokio::sync::oneshot::channel::<()>();
        let thread = std::thread::Builder::new()
            .name("attacker".into())
            .spawn(move || {
                // On Linux the nice value is the thread's, not the whole process's.
                let tid = rustix::thread::gettid();
                let reniced =
                    rustix::process::setpriority_process(Some(tid), ATTACKER_NICE).is_ok();
                let runtime = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build();
                match runtime {
                    Ok(runtime) => {
                        let _ = handle_tx.send(Ok((runtime.handle().clone(), reniced)));
                        runtime.block_on(async {
                            let _ = done_rx.await;
                        });
                    }
                    Err(e) => {
                        let _ = handle_tx.send(Err(e));
                    }
                }
            })?;
        let (handle, reniced) = handle_rx
            .recv()
            .context("the attacker thread ended before it started")??;
        ensure!(
            reniced,
            "could not lower the attacker thread's priority (setpriority)"
        );
        Ok(Attacker {
            handle,
            done: Some(done),
            thread: Some(thread),
        })
    }

    fn stop(mut self) {
        if let Some(done) = self.done.take() {
            let _ = done.send(());
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// Half-sent requests held against one port: each slot connects, sends a partial head
/// (or a partial TLS record) and waits until the server closes, then opens again, until
/// stopped.
struct Flood {
    target: String,
    stop: Arc<AtomicBool>,
    opened: Arc<AtomicU64>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Flood {
    fn start(attacker: &Attacker, target: SocketAddr, source: Option<IpAddr>, tls: bool) -> Flood {
        let stop = Arc::new(AtomicBool::new(false));
        let opened = Arc::new(AtomicU64::new(0));
        let head: Arc<Vec<u8>> = Arc::new(if tls {
            // A TLS handshake record announcing 16 KiB, 8 KiB of it sent.
            let mut r = vec![0x16, 0x03, 0x01, 0x40, 0x00];
            r.extend(std::iter::repeat_n(0x01, 8 * 1024));
            r
        } else {
            let mut r = b"GET / HTTP/1.1\r\nHost: victim\r\nX-Padding: ".to_vec();
            r.extend(std::iter::repeat_n(b'a', 8 * 1024));
            r
        });
        let tasks = (0..HALF_OPEN)
            .map(|_| {
                let (stop, opened, head) = (stop.clone(), opened.clone(), head.clone());
                attacker.handle.spawn(async move {
                    while !stop.load(Ordering::Relaxed) {
                        let held = hold(target, source, &head, &stop).await;
                        if held.is_ok() {
                            opened.fetch_add(1, Ordering::Relaxed);
                            sleep_unless_stopped(REOPEN_AFTER, &stop).await;
                        } else {
                            // Refused or timed out: the server is at its limit; try again.
                            tokio::time::sleep(Duration::from_millis(250)).await;
                        }
                    }
                })
            })
            .collect();
        Flood {
            target: target.to_string(),
            stop,
            opened,
            tasks,
        }
    }

    async fn stop(self) -> (String, u64) {
        self.stop.store(true, Ordering::Relaxed);
        for t in self.tasks {
            let _ = t.await;
        }
        (self.target, self.opened.load(Ordering::Relaxed))
    }
}

/// Sleeps `wait`, or less once `stop` is set.
async fn sleep_unless_stopped(wait: Duration, stop: &AtomicBool) {
    let until = tokio::time::Instant::now() + wait;
    while !stop.load(Ordering::Relaxed) && tokio::time::Instant::now() < until {
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// One half-sent request, held until the server closes it or the flood stops.
async fn hold(
    target: SocketAddr,
    source: Option<IpAddr>,
    head: &[u8],
    stop: &AtomicBool,
) -> Result<()> {
    let socket = TcpSocket::new_v4()?;
    if let Some(source) = source {
        socket.bind(SocketAddr::new(source, 0))?;
    }
    let mut stream = tokio::time::timeout(Duration::from_secs(3), socket.connect(target)).await??;
    stream.write_all(head).await?;
    let mut buf = [0u8; 512];
    while !stop.load(Ordering::Relaxed) {
        let read = tokio::time::timeout(Duration::from_millis(500), stream.read(&mut buf)).await;
        // Closed by the server (or reset): this slot opens a new one.
        if let Ok(Ok(0) | Err(_)) = read {
            break;
        }
    }
    Ok(())
}

/// Tenant `a`'s stray-pod churn: pods labelled as the PodSet operator's, controlled by a
/// ConfigMap, unlabelled (they leave the operator's watch as a stray would) and deleted.
async fn stray_churn(a: Client, ns: String, stop: Arc<AtomicBool>) -> Result<usize> {
    let decoy: ConfigMap = e2e::create_as(
        &a,
        &ns,
        json!({
            "apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "decoy"}
        }),
    )
    .await?;
    let uid = decoy.uid().context("the decoy has no uid")?;
    let pods: Api<Pod> = Api::namespaced(a.clone(), &ns);
    let mut done = 0;
    for i in 0..STRAYS {
        if stop.load(Ordering::Relaxed) {
            break;
        }
        let name = format!("stray-{i}");
        let pod: Pod = serde_json::from_value(json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {
                "name": name,
                "labels": {"app.kubernetes.io/managed-by": "podset-operator"},
                "ownerReferences": [{
                    "apiVersion": "v1", "kind": "ConfigMap", "name": "decoy", "uid": uid,
                    "controller": true
                }]
            },
            "spec": {
                // Never scheduled: the churn is in the operator's watch, not on the node.
                "nodeSelector": {"e2e.rust-operators.dev/nowhere": "true"},
                "securityContext": {"runAsNonRoot": true, "runAsUser": 65534,
                    "seccompProfile": {"type": "RuntimeDefault"}},
                "containers": [{"name": "c", "image": "busybox",
                    "securityContext": {"allowPrivilegeEscalation": false,
                        "capabilities": {"drop": ["ALL"]}}}]
            }
        }))?;
        pods.create(&PostParams::default(), &pod).await?;
        pods.patch(
            &name,
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {"app.kubernetes.io/managed-by": null}}})),
        )
        .await?;
        pods.delete(&name, &DeleteParams::default().grace_period(0))
            .await?;
        done += 1;
    }
    Ok(done)
}

/// What the watchdog saw while the attack ran.
#[derive(Debug, Default)]
struct Watched {
    samples: u64,
    /// Pods seen not ready (after having been ready at the start), as `namespace/name`.
    unready: BTreeMap<String, u64>,
    page_ok: u64,
    page_failed: u64,
}

/// Every second: are the operators' pods and `b`'s victim page pod ready, and does the
/// page answer a fresh client (from the node's own address, another peer than the
/// attacker's)?
fn watchdog(
    admin: Client,
    watched_namespaces: Vec<String>,
    page: SocketAddr,
    stop: Arc<AtomicBool>,
) -> tokio::task::JoinHandle<Watched> {
    tokio::spawn(async move {
        let mut seen = Watched::default();
        while !stop.load(Ordering::Relaxed) {
            seen.samples += 1;
            for ns in &watched_namespaces {
                let list = Api::<Pod>::namespaced(admin.clone(), ns)
                    .list(&ListParams::default())
                    .await;
                for pod in list.map(|l| l.items).unwrap_or_default() {
                    if pod.metadata.deletion_timestamp.is_none() && !all_containers_ready(&pod) {
                        *seen
                            .unready
                            .entry(format!("{ns}/{}", pod.name_any()))
                            .or_default() += 1;
                    }
                }
            }
            match page_answers(page).await {
                Ok(()) => seen.page_ok += 1,
                Err(_) => seen.page_failed += 1,
            }
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
        seen
    })
}

async fn page_answers(page: SocketAddr) -> Result<()> {
    let mut stream =
        tokio::time::timeout(Duration::from_secs(5), tokio::net::TcpStream::connect(page))
            .await??;
    stream
        .write_all(b"GET / HTTP/1.1\r\nHost: page\r\nConnection: close\r\n\r\n")
        .await?;
    let mut answer = Vec::new();
    tokio::time::timeout(Duration::from_secs(5), stream.read_to_end(&mut answer)).await??;
    ensure!(
        answer.starts_with(b"HTTP/1.1 200"),
        "the page answered {:?}",
        String::from_utf8_lossy(&answer[..answer.len().min(40)])
    );
    Ok(())
}

fn pod_ip(pod: &Pod) -> Result<IpAddr> {
    pod.status
        .as_ref()
        .and_then(|s| s.pod_ip.as_deref())
        .context("pod without an IP")?
        .parse()
        .context("pod IP")
}

/// The one running pod of `selector` in `ns`.
async fn the_pod(admin: &Client, ns: &str, selector: &str) -> Result<Pod> {
    poll(
        &format!("a ready pod {selector} in {ns}"),
        CONVERGE,
        || async {
            let list = pods(admin, ns, selector).await?;
            Ok(list.into_iter().find(all_containers_ready))
        },
    )
    .await
}

fn memory_limit(pod: &Pod) -> Option<String> {
    pod.spec
        .as_ref()?
        .containers
        .first()?
        .resources
        .as_ref()?
        .limits
        .as_ref()?
        .get("memory")
        .map(|q| q.0.clone())
}

#[tokio::test(flavor = "multi_thread")]
async fn a_hostile_tenant_cannot_hurt_another() -> Result<()> {
    let admin = e2e::admin_client().await?;
    if !has_real_node(&admin).await? {
        return e2e::skip("a_hostile_tenant_cannot_hurt_another", NO_REAL_NODE);
    }
    let source = attacker_source()?;
    let (_broker_url, _broker) = pulsar::shared_broker().await?;
    let mut deployed = Vec::new();
    for operator in OPERATORS {
        deployed.push(Deployed::new(operator)?);
    }
    let mut operator_pods = BTreeMap::new();
    for d in &deployed {
        operator_pods.insert(
            d.operator,
            the_pod(
                &admin,
                &d.namespace(),
                &format!("app.kubernetes.io/name={}", d.operator),
            )
            .await?,
        );
    }

    // Tenant b's work with nobody attacking.
    let quiet_ns = TestNamespace::real("tenant-b-quiet").await?;
    let b = e2e::tenant_client(&admin, &quiet_ns, "e2e-tenant-b").await?;
    let quiet = one_of_each(&b, &admin, &quiet_ns).await?;
    eprintln!("tenant b, no attack: {quiet:?}");

    // The page that gets attacked: another Lolcow of b's.
    let page_ns = TestNamespace::real("tenant-b-page").await?;
    let b_page = e2e::tenant_client(&admin, &page_ns, "e2e-tenant-b").await?;
    let port = free_node_port(&page_ns, "page", &[]).await?;
    e2e::create_as::<Lolcow>(
        &b_page,
        &page_ns.name,
        e2e::kinds::lolcow("page", port, "Still here"),
    )
    .await?;
    wait_until::<Lolcow>(&admin, &page_ns.name, "page", lolcow_ready).await?;
    let page_pod = the_pod(&admin, &page_ns.name, "app.kubernetes.io/instance=page").await?;
    let page_ip = pod_ip(&page_pod)?;
    let page_port = page_pod
        .spec
        .as_ref()
        .and_then(|s| {
            s.containers
                .first()?
                .ports
                .as_ref()?
                .iter()
                .find(|p| p.name.as_deref() == Some("http"))
        })
        .map_or(8080, |p| p.container_port);
    let page_port = u16::try_from(page_port)?;

    // Tenant a.
    let a_ns = TestNamespace::real("tenant-a").await?;
    let a = e2e::tenant_client(&admin, &a_ns, "e2e-tenant-a").await?;
    e2e::create_as::<Pod>(&a, &a_ns.name, endpoint_pod()).await?;
    e2e::create_as::<Service>(&a, &a_ns.name, endpoint_service()).await?;
    the_pod(&admin, &a_ns.name, "app=endpoint").await?;
    let endpoint = format!("endpoint.{}.svc", a_ns.name);
    let http = format!("http://{endpoint}:8080");
    let pcs = Api::<PulsarConsumer>::namespaced(a.clone(), &a_ns.name);
    e2e::create_as::<PulsarConsumer>(&a, &a_ns.name, polled("flood", "flood", &http, 300)).await?;
    e2e::create_as::<PulsarConsumer>(&a, &a_ns.name, polled("text", "text", &http, 300)).await?;
    e2e::create_as::<PulsarConsumer>(
        &a,
        &a_ns.name,
        polled("error", "error", &format!("http://{endpoint}:8081"), 300),
    )
    .await?;
    for i in 0..WINDOWS {
        e2e::create_as::<PulsarConsumer>(
            &a,
            &a_ns.name,
            polled(&format!("window-{i}"), &format!("window-{i}"), &http, 3600),
        )
        .await?;
    }
    let mut scanned = Vec::new();
    for (name, url) in SCAN {
        match pcs
            .create(
                &PostParams::default(),
                &serde_json::from_value(polled(name, "scan", url, 300))?,
            )
            .await
        {
            Ok(_) => scanned.push(name),
            Err(kube::Error::Api(s)) if s.code == 422 => {
                ensure!(
                    s.message.contains("spec.autoscaling.adminUrl"),
                    "{url} was rejected without naming the field: {}",
                    s.message
                );
                eprintln!("{url}: rejected by the API server: {}", s.message);
            }
            Err(e) => bail!("creating {name}: {e}"),
        }
    }

    // Everything at once.
    let stop = Arc::new(AtomicBool::new(false));
    // The page is flooded at its pod, from an address of its own. (Through the NodePort
    // the local cluster's kube-proxy masquerades every client as the node, the address
    // the watchdog asks from: `lolcow.rs` floods the NodePort on its own.)
    let attacker = Attacker::start()?;
    let mut floods = vec![Flood::start(
        &attacker,
        SocketAddr::new(page_ip, page_port),
        Some(source),
        false,
    )];
    for pod in operator_pods.values() {
        let ip = pod_ip(pod)?;
        floods.push(Flood::start(
            &attacker,
            SocketAddr::new(ip, 8081),
            Some(source),
            false,
        ));
        floods.push(Flood::start(
            &attacker,
            SocketAddr::new(ip, 8443),
            Some(source),
            true,
        ));
    }
    let churn = tokio::spawn(stray_churn(a.clone(), a_ns.name.clone(), stop.clone()));
    let watched_namespaces: Vec<String> = deployed
        .iter()
        .map(Deployed::namespace)
        .chain([page_ns.name.clone()])
        .collect();
    let dog = watchdog(
        admin.clone(),
        watched_namespaces,
        SocketAddr::new(page_ip, page_port),
        stop.clone(),
    );
    // The flood endpoint has been polled before b starts.
    poll("the flood PulsarConsumer polled", CONVERGE, || async {
        Ok(scaling(&pcs.get("flood").await?))
    })
    .await?;

    let attack_ns = TestNamespace::real("tenant-b-attacked").await?;
    let b2 = e2e::tenant_client(&admin, &attack_ns, "e2e-tenant-b").await?;
    let attacked = one_of_each(&b2, &admin, &attack_ns).await;
    stop.store(true, Ordering::Relaxed);
    let watched = dog.await?;
    let mut held = Vec::new();
    for flood in floods {
        held.push(flood.stop().await);
    }
    attacker.stop();
    for (target, opened) in &held {
        ensure!(
            *opened >= HALF_OPEN as u64 / 2,
            "the flood of {target} opened only {opened} connections (at least half of {HALF_OPEN} expected): no attack"
        );
    }
    let strays = churn.await??;
    let attacked = attacked?;
    eprintln!(
        "tenant b, under attack: {attacked:?}; half-sent requests opened: {held:?}; strays churned: {strays}"
    );

    // No operator restarted, each one's peak memory against its limit.
    let mut report = serde_json::Map::new();
    for d in &deployed {
        let now = the_pod(
            &admin,
            &d.namespace(),
            &format!("app.kubernetes.io/name={}", d.operator),
        )
        .await?;
        let before = &operator_pods[d.operator];
        ensure!(
            now.uid() == before.uid() && restarts(&now) == restarts(before),
            "{} restarted under attack (restarts {} -> {}, pod {:?} -> {:?})",
            d.operator,
            restarts(before),
            restarts(&now),
            before.name_any(),
            now.name_any()
        );
        let peak = container_peak_memory(&now)?;
        let limit = memory_limit(&now).unwrap_or_default();
        eprintln!(
            "{}: peak {:.1} MiB under attack, limit {limit}",
            d.operator,
            peak as f64 / 1048576.0
        );
        report.insert(
            d.operator.to_owned(),
            json!({"peak_mib": (peak as f64 / 1048576.0 * 10.0).round() / 10.0, "limit": limit}),
        );
    }
    let page_peak = container_peak_memory(&page_pod)?;
    report.insert("lolcow-web".into(), json!({"peak_mib": (page_peak as f64 / 1048576.0 * 10.0).round() / 10.0, "limit": memory_limit(&page_pod).unwrap_or_default()}));
    ensure!(
        watched.unready.is_empty(),
        "pods turned unready under attack (samples out of {}): {:?}",
        watched.samples,
        watched.unready
    );
    ensure!(
        watched.page_ok > 0 && watched.page_failed * 10 <= watched.page_ok,
        "the attacked page answered {} times and failed {} times",
        watched.page_ok,
        watched.page_failed
    );
    // No pod of b's restarted.
    for ns in [&quiet_ns, &page_ns, &attack_ns] {
        for pod in Api::<Pod>::namespaced(admin.clone(), &ns.name)
            .list(&ListParams::default())
            .await?
        {
            ensure!(
                restarts(&pod) == 0,
                "pod {}/{} of tenant b restarted",
                ns.name,
                pod.name_any()
            );
        }
    }
    // A refused target reads the same whether its port is open or closed.
    let reason_of = |name: &'static str| {
        let pcs = pcs.clone();
        async move {
            poll(&format!("{name} refused"), CONVERGE, || async {
                Ok(scaling(&pcs.get(name).await?))
            })
            .await
        }
    };
    if scanned.contains(&"scan-open") && scanned.contains(&"scan-closed") {
        let (open, closed) = (
            reason_of("scan-open").await?,
            reason_of("scan-closed").await?,
        );
        ensure!(
            open.0 == closed.0 && open.1.replace(":8081", "") == closed.1.replace(":1", ""),
            "an open and a closed loopback port read differently: {open:?} / {closed:?}"
        );
    }
    for name in &scanned {
        let (reason, message) = reason_of(name).await?;
        ensure!(
            reason == pulsar_consumer_operator::admin::REASON_TARGET_NOT_ALLOWED,
            "{name}: the target was not refused ({reason}: {message})"
        );
    }
    // Nothing of a's endpoints in any status or event.
    for pc in pcs.list(&ListParams::default()).await? {
        let status = serde_json::to_string(&pc.status)?;
        ensure!(
            !status.contains(MARKER),
            "{}'s status carries a's endpoint text: {status}",
            pc.name_any()
        );
    }
    let events = Api::<Event>::all(admin.clone())
        .list(&ListParams::default())
        .await?;
    for e in events.items {
        let text = serde_json::to_string(&e)?;
        ensure!(
            !text.contains(MARKER),
            "an event carries a's endpoint text: {text}"
        );
    }

    // Tenant b converged under attack; the two runs side by side.
    report.insert(
        "tenant_b_seconds".into(),
        json!({"quiet": quiet.report(), "attacked": attacked.report()}),
    );
    report.insert(
        "half_open_opened".into(),
        json!(
            held.iter()
                .map(|(t, n)| (t.clone(), json!(n)))
                .collect::<serde_json::Map<_, _>>()
        ),
    );
    report.insert("stray_pods".into(), json!(strays));
    let dir = target_dir().join("e2e");
    std::fs::create_dir_all(&dir)?;
    std::fs::write(
        dir.join("hostile-tenant.json"),
        serde_json::to_string_pretty(&Value::Object(report))?,
    )?;
    // As fast as with no attack, give or take the real node's own variation: a pod's start
    // there varies by seconds from one run to the next (a Lolcow rollout took 1.6 s in
    // one quiet run and 6.6 s in the next), and the node also carries the flood.
    let slack = Duration::from_secs(10);
    let as_fast = |attacked: Duration, quiet: Duration| attacked <= quiet * 3 / 2 + slack;
    ensure!(
        as_fast(attacked.create, quiet.create) && as_fast(attacked.change, quiet.change),
        "tenant b converged slower under attack: {attacked:?} against {quiet:?}"
    );
    Ok(())
}
