//! The shipped images, run for real: each operator is rolled out from its
//! image with `cargo xtask deploy` onto the local cluster's real node
//! (containerd + kubelet), where the kubelet's probes must pass, the operator
//! must run as user 65532 on a read-only root filesystem with the in-cluster
//! configuration of its ServiceAccount, and the workloads it creates must
//! really serve: busybox pods run, memcached answers at its Service's name, the cow
//! page is served on its NodePort, consumers receive every message from the
//! real Pulsar broker.
//!
//! These tests need the real node, which `cargo xtask cluster up` starts when
//! run as root; without it they report themselves skipped.

use anyhow::{Context, Result, bail, ensure};
use e2e::deployed::{
    Deployed, NO_REAL_NODE, REAL_NODE, ROLLOUT, container_processes, has_real_node, pods,
};
use e2e::kinds::{self, free_node_port};
use e2e::pulsar::{self, expected_payloads, payload_counts, unique_topic};
use e2e::{TestNamespace, create_from_json, kubectl_ok, poll};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Pod, Service};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, ListParams, Patch, PatchParams};
use lolcow_operator::api::Lolcow;
use podset_operator::api::PodSet;
use pulsar_consumer_operator::api::PulsarConsumer;
use serde_json::json;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::PathBuf;
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// The container of `pod` really runs here: as `uid`, on a read-only root
/// filesystem.
fn assert_runs_as(pod: &Pod, uid: u32) -> Result<()> {
    let name = pod.metadata.name.clone().unwrap_or_default();
    let pids = container_processes(pod);
    ensure!(
        !pids.is_empty(),
        "no process of pod {name} runs on this machine"
    );
    for pid in pids {
        let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
        let real_uid = status
            .lines()
            .find(|l| l.starts_with("Uid:"))
            .and_then(|l| l.split_whitespace().nth(1))
            .context("no Uid line")?;
        ensure!(
            real_uid == uid.to_string(),
            "pod {name}: process {pid} runs as {real_uid}, not {uid}"
        );
        let mounts = std::fs::read_to_string(format!("/proc/{pid}/mountinfo"))?;
        let root = mounts
            .lines()
            .find(|l| l.split(' ').nth(4) == Some("/"))
            .context("no root mount")?;
        let options = root.split(' ').nth(5).unwrap_or_default();
        ensure!(
            options.split(',').any(|o| o == "ro"),
            "pod {name}: the root filesystem is not read-only: {root}"
        );
    }
    Ok(())
}

/// The operator's pods run on the real node, started and ready, as 65532 on
/// a read-only root filesystem. Ready is waited for (up to [`ROLLOUT`]): the rollout that
/// `deploy` waited for has been seen done while the pod's status, listed right after,
/// still said not ready (its container started a second before).
async fn assert_operator_runs(client: &kube::Client, deployed: &Deployed) -> Result<Vec<Pod>> {
    let selector = format!("app.kubernetes.io/name={}", deployed.operator);
    let namespace = deployed.namespace();
    let pods = poll(
        &format!("{}'s pods running and ready", deployed.operator),
        ROLLOUT,
        || async {
            let pods = pods(client, &namespace, &selector).await?;
            ensure!(!pods.is_empty(), "no pod of {}", deployed.operator);
            for pod in &pods {
                let container = pod
                    .status
                    .as_ref()
                    .and_then(|s| s.container_statuses.as_ref())
                    .and_then(|c| c.first())
                    .context("no container status")?;
                let running = container
                    .state
                    .as_ref()
                    .and_then(|s| s.running.as_ref())
                    .is_some();
                ensure!(
                    container.ready && running,
                    "{} is not ready and running: {container:?}",
                    deployed.operator
                );
            }
            Ok(Some(pods))
        },
    )
    .await?;
    for pod in &pods {
        ensure!(
            pod.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(REAL_NODE),
            "{} runs on {:?}",
            deployed.operator,
            pod.spec.as_ref().and_then(|s| s.node_name.clone())
        );
        assert_runs_as(pod, 65532)?;
    }
    Ok(pods)
}

#[tokio::test(flavor = "multi_thread")]
async fn podset_operator_image_runs_busybox_pods_for_real() -> Result<()> {
    let client = e2e::admin_client().await?;
    if !has_real_node(&client).await? {
        return e2e::skip(
            "podset_operator_image_runs_busybox_pods_for_real",
            NO_REAL_NODE,
        );
    }
    let deployed = Deployed::new("podset-operator")?;
    let operator_pods = assert_operator_runs(&client, &deployed).await?;
    // The lease identity comes from the downward API: the holder is the pod.
    let leases: Api<Lease> = Api::namespaced(client.clone(), &deployed.namespace());
    let holder = poll("the operator's lease", ROLLOUT, || async {
        let list = leases.list(&ListParams::default()).await?;
        Ok(list
            .items
            .iter()
            .find_map(|l| l.spec.as_ref()?.holder_identity.clone()))
    })
    .await?;
    let names: Vec<String> = operator_pods
        .iter()
        .filter_map(|p| p.metadata.name.clone())
        .collect();
    ensure!(
        names.iter().any(|n| holder.starts_with(n.as_str())),
        "the lease holder {holder:?} is none of the operator's pods {names:?}"
    );

    let ns = TestNamespace::real("real-podset").await?;
    create_from_json::<PodSet>(&ns, kinds::podset("sample", 2)).await?;
    let ps = e2e::kinds::wait_podset_ready(&ns, "sample").await?;
    let names = ps.status.map(|s| s.pod_names).unwrap_or_default();
    ensure!(names.len() == 2, "pods: {names:?}");
    let api: Api<Pod> = ns.api();
    for name in &names {
        let pod = api.get(name).await?;
        ensure!(
            pod.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(REAL_NODE),
            "{name} is not on the real node"
        );
        let started = pod
            .status
            .as_ref()
            .and_then(|s| s.container_statuses.as_ref())
            .and_then(|c| c.first())
            .and_then(|c| c.state.as_ref()?.running.as_ref()?.started_at.clone());
        ensure!(started.is_some(), "{name} has no started container");
        // exec and logs reach the container through the kubelet.
        let cmdline = kubectl_ok(["exec", "-n", &ns.name, name, "--", "cat", "/proc/1/cmdline"])?;
        ensure!(
            cmdline.starts_with("sleep\u{0}3600"),
            "{name} runs {cmdline:?}"
        );
        kubectl_ok(["logs", "-n", &ns.name, name])?;
    }
    Ok(())
}

/// Two operator pods: deleting the leader's pod (the kubelet sends SIGTERM)
/// hands the lease to the other within 5 s.
async fn assert_leadership_handover(client: &kube::Client, deployed: &Deployed) -> Result<()> {
    let system = deployed.namespace();
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), &system);
    deployments
        .patch(
            deployed.operator,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"replicas": 2}})),
        )
        .await?;
    let selector = format!("app.kubernetes.io/name={}", deployed.operator);
    poll("two ready operator pods", ROLLOUT, || async {
        let pods = pods(client, &system, &selector).await?;
        let ready = pods
            .iter()
            .filter(|p| {
                p.status
                    .as_ref()
                    .and_then(|s| s.container_statuses.as_ref())
                    .and_then(|c| c.first())
                    .is_some_and(|c| c.ready)
            })
            .count();
        Ok((ready == 2).then_some(()))
    })
    .await?;
    let leases: Api<Lease> = Api::namespaced(client.clone(), &system);
    let holder = |leases: Api<Lease>| async move {
        let list = leases.list(&ListParams::default()).await?;
        Ok::<_, anyhow::Error>(
            list.items
                .iter()
                .find_map(|l| l.spec.as_ref()?.holder_identity.clone())
                .filter(|h| !h.is_empty()),
        )
    };
    let first = poll("a lease holder", ROLLOUT, || holder(leases.clone())).await?;
    let pods_now = pods(client, &system, &selector).await?;
    let leader = pods_now
        .iter()
        .filter_map(|p| p.metadata.name.clone())
        .find(|n| first.starts_with(n.as_str()))
        .with_context(|| format!("no pod holds the lease {first:?}"))?;
    // The kubelet sends SIGTERM: the leader releases the lease on its way out.
    let deleted = Instant::now();
    kubectl_ok(["delete", "pod", "-n", &system, &leader, "--wait=false"])?;
    let second = poll("another lease holder", Duration::from_secs(30), || async {
        Ok(holder(leases.clone())
            .await?
            .filter(|h| !h.starts_with(leader.as_str())))
    })
    .await?;
    let took = deleted.elapsed();
    eprintln!("lease handed from {first} to {second} in {took:?}");
    ensure!(
        took <= Duration::from_secs(5),
        "the standby took {took:?} to hold the lease after the leader's pod was deleted"
    );
    Ok(())
}

/// One pod's time as leader, from the kubelet's timestamps on its log lines.
#[derive(Debug)]
struct Reign {
    pod: String,
    from: Timestamp,
    /// When it released or lost the lease, or its last line if it died without
    /// saying; `None` while it still leads.
    until: Option<Timestamp>,
}

/// Reads `kubectl logs --timestamps` output: when the pod acquired the lease and
/// when it stopped leading. `ended`: the log is complete (the container stopped), so a
/// leader that never said it stopped led at most until its last line.
fn reign_of(pod: &str, log: &str, ended: bool) -> Result<Option<Reign>> {
    let mut from = None;
    let mut until = None;
    let mut last = None;
    for line in log.lines() {
        let Some((stamp, text)) = line.split_once(' ') else {
            continue;
        };
        let Ok(at) = stamp.parse::<Timestamp>() else {
            continue;
        };
        last = Some(at);
        if text.contains("acquired leadership") {
            ensure!(from.is_none(), "{pod} acquired the lease twice:\n{log}");
            from = Some(at);
        } else if from.is_some()
            && (text.contains("released leadership") || text.contains("leader election lost"))
        {
            until = Some(at);
        }
    }
    Ok(from.map(|from| Reign {
        pod: pod.to_owned(),
        from,
        until: until.or(last.filter(|_| ended)),
    }))
}

/// Pods' logs followed with `kubectl logs --follow` from their first line to their last,
/// each into a file of its own: a pod deleted (by a rollout, or a scale-down) takes its log
/// with it, so whatever a test reads from the log must be followed while the pod lives.
struct PodLogs {
    dir: PathBuf,
    namespace: String,
    timestamps: bool,
    followers: Vec<(String, std::process::Child, PathBuf)>,
}

impl PodLogs {
    /// Logs of pods in `namespace`, kept in `target/e2e/<name>/`.
    fn new(name: &str, namespace: &str, timestamps: bool) -> Result<PodLogs> {
        let dir = e2e::target_dir().join("e2e").join(name);
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir)?;
        Ok(PodLogs {
            dir,
            namespace: namespace.to_owned(),
            timestamps,
            followers: Vec::new(),
        })
    }

    /// Follows `pod`'s log (once: a pod already followed is left alone). The pod's
    /// container must have started, or kubectl gives up at once.
    fn follow(&mut self, pod: &str) -> Result<()> {
        if self.followers.iter().any(|(name, ..)| name == pod) {
            return Ok(());
        }
        let path = self.dir.join(format!("{pod}.log"));
        let mut cmd = e2e::kubectl();
        cmd.args(["logs", "--follow", "-n", &self.namespace, pod]);
        if self.timestamps {
            cmd.arg("--timestamps");
        }
        let child = cmd
            .stdout(std::fs::File::create(&path)?)
            .stderr(std::process::Stdio::null())
            .spawn()
            .context("running kubectl logs --follow")?;
        self.followers.push((pod.to_owned(), child, path));
        Ok(())
    }

    /// Every followed pod's log. The streams of pods for which `ends` holds are awaited
    /// until their container stops (up to `timeout`, then cut); the others are cut now.
    async fn finish(
        self,
        ends: impl Fn(&str) -> bool,
        timeout: Duration,
    ) -> Result<Vec<(String, String)>> {
        let mut logs = Vec::new();
        for (pod, mut child, path) in self.followers {
            if ends(&pod) {
                let stopped = poll("a pod's log to end", timeout, || {
                    let status = child.try_wait();
                    async move { Ok(status?.map(|_| ())) }
                })
                .await;
                if stopped.is_err() {
                    let _ = child.kill();
                }
            } else {
                let _ = child.kill();
            }
            let _ = child.wait();
            logs.push((pod, std::fs::read_to_string(&path)?));
        }
        Ok(logs)
    }
}

/// Whether the pod's (first) container runs.
fn container_running(pod: &Pod) -> bool {
    pod.status
        .as_ref()
        .and_then(|s| s.container_statuses.as_ref())
        .and_then(|c| c.first())
        .and_then(|c| c.state.as_ref()?.running.as_ref())
        .is_some()
}

/// `kubectl rollout restart` of the two operator pods: every old and new pod's log is
/// followed from its first line to its last, and no two pods ever lead at once (each
/// acquisition comes after the previous leader released the lease).
async fn assert_rollout_restart_has_one_leader(
    client: &kube::Client,
    deployed: &Deployed,
) -> Result<()> {
    let system = deployed.namespace();
    let selector = format!("app.kubernetes.io/name={}", deployed.operator);
    let mut logs = PodLogs::new("rollout-restart", &system, true)?;
    let ready = |pod: &Pod| {
        pod.status
            .as_ref()
            .and_then(|s| s.container_statuses.as_ref())
            .and_then(|c| c.first())
            .is_some_and(|c| c.ready)
    };
    // The handover before left a replacement pod starting: wait for two ready pods.
    let old: Vec<String> = poll("two ready operator pods", ROLLOUT, || async {
        let now = pods(client, &system, &selector).await?;
        Ok((now.len() == 2 && now.iter().all(ready))
            .then(|| now.iter().filter_map(|p| p.metadata.name.clone()).collect()))
    })
    .await?;
    for pod in &old {
        logs.follow(pod)?;
    }
    kubectl_ok([
        "rollout",
        "restart",
        "-n",
        &system,
        &format!("deployment/{}", deployed.operator),
    ])?;
    // Follow every pod of the rollout once its container runs, until only new
    // pods are left, both ready.
    let deadline = Instant::now() + ROLLOUT;
    loop {
        let now = pods(client, &system, &selector).await?;
        for pod in now.iter().filter(|p| container_running(p)) {
            if let Some(name) = &pod.metadata.name {
                logs.follow(name)?;
            }
        }
        let new_ready = now
            .iter()
            .filter(|p| p.metadata.name.as_ref().is_some_and(|n| !old.contains(n)))
            .filter(|p| ready(p))
            .count();
        if new_ready == 2 && now.len() == 2 {
            break;
        }
        ensure!(
            Instant::now() < deadline,
            "the rollout restart did not finish within {ROLLOUT:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // A new pod holds the lease.
    let leases: Api<Lease> = Api::namespaced(client.clone(), &system);
    let holder = poll("a new pod to hold the lease", ROLLOUT, || async {
        let list = leases.list(&ListParams::default()).await?;
        Ok(list
            .items
            .iter()
            .find_map(|l| l.spec.as_ref()?.holder_identity.clone())
            .filter(|h| !h.is_empty() && !old.iter().any(|o| h.starts_with(o.as_str()))))
    })
    .await?;
    // The old pods' streams end with their containers (graceful shutdown is bounded by
    // the pod's termination grace period); the new ones are cut here.
    let dir = logs.dir.clone();
    let mut reigns = Vec::new();
    for (pod, log) in logs
        .finish(|pod| old.iter().any(|o| o == pod), ROLLOUT)
        .await?
    {
        if let Some(reign) = reign_of(&pod, &log, old.contains(&pod))? {
            reigns.push(reign);
        }
    }
    reigns.sort_by_key(|r| r.from);
    eprintln!("leaders during the rollout restart (holder now {holder}): {reigns:#?}");
    ensure!(
        reigns.len() >= 2,
        "the lease moved to a new pod, yet the logs in {} show {} leader(s)",
        dir.display(),
        reigns.len()
    );
    for pair in reigns.windows(2) {
        let (before, after) = (&pair[0], &pair[1]);
        let Some(until) = before.until else {
            bail!(
                "{} still led when {} acquired the lease at {} (logs in {})",
                before.pod,
                after.pod,
                after.from,
                dir.display()
            );
        };
        ensure!(
            until <= after.from,
            "{} led until {until} but {} acquired the lease at {} (logs in {})",
            before.pod,
            after.pod,
            after.from,
            dir.display()
        );
    }
    Ok(())
}

/// Sends `version` to memcached at `addr` and returns its answer.
fn memcached_version(addr: &str) -> Result<String> {
    let mut stream = TcpStream::connect_timeout(&addr.parse()?, Duration::from_secs(3))?;
    stream.set_read_timeout(Some(Duration::from_secs(3)))?;
    stream.write_all(b"version\r\n")?;
    let mut buf = [0u8; 128];
    let n = stream.read(&mut buf)?;
    Ok(String::from_utf8_lossy(&buf[..n]).trim().to_owned())
}

#[tokio::test(flavor = "multi_thread")]
async fn memcached_operator_image_runs_memcached_that_answers_at_its_service_name() -> Result<()> {
    let client = e2e::admin_client().await?;
    if !has_real_node(&client).await? {
        return e2e::skip(
            "memcached_operator_image_runs_memcached_that_answers_at_its_service_name",
            NO_REAL_NODE,
        );
    }
    let deployed = Deployed::new("memcached-operator")?;
    assert_operator_runs(&client, &deployed).await?;
    let ns = TestNamespace::real("real-memcached").await?;
    create_from_json::<memcached_operator::api::Memcached>(&ns, kinds::memcached("cache", 2))
        .await?;
    e2e::kinds::wait_memcached_ready(&ns, "cache").await?;
    let svc: Service = ns.api::<Service>().get("cache").await?;
    let cluster_ip = svc.spec.as_ref().and_then(|s| s.cluster_ip.as_deref());
    ensure!(
        cluster_ip == Some("None"),
        "a headless Service: {cluster_ip:?}"
    );
    // What a client in a pod does: resolve the Service's name with the cluster's DNS
    // server (from here through kube-proxy's rules to CoreDNS), which answers with
    // every ready memcached pod, and talk to each of them.
    let mut ready: Vec<String> = pods(
        &client,
        &ns.name,
        "app.kubernetes.io/instance=cache,app.kubernetes.io/name=memcached",
    )
    .await?
    .iter()
    .filter(|p| p.metadata.deletion_timestamp.is_none())
    .filter_map(|p| p.status.as_ref()?.pod_ip.clone())
    .collect();
    ready.sort();
    ensure!(ready.len() == 2, "two memcached pods with an IP: {ready:?}");
    let (server, name) = (
        e2e::dns::cluster_server(&client).await?,
        e2e::dns::service_name("cache", &ns.name),
    );
    let resolved = poll(
        "the Service's name resolving to both memcached pods",
        Duration::from_secs(60),
        || async {
            let found = e2e::dns::resolve_a(server, &name).await?;
            let mut found: Vec<String> = found.iter().map(ToString::to_string).collect();
            found.sort();
            Ok((found == ready).then_some(found))
        },
    )
    .await?;
    for ip in &resolved {
        let answer = poll(
            "memcached's version at an address of the Service's name",
            Duration::from_secs(60),
            || {
                let addr = format!("{ip}:11211");
                async move {
                    Ok(memcached_version(&addr)
                        .ok()
                        .filter(|a| a.starts_with("VERSION ")))
                }
            },
        )
        .await?;
        eprintln!("{name} -> {ip}: memcached says {answer}");
    }
    let pods = pods(
        &client,
        &ns.name,
        "app.kubernetes.io/instance=cache,app.kubernetes.io/name=memcached",
    )
    .await?;
    ensure!(!pods.is_empty(), "no memcached pod");
    for pod in &pods {
        assert_runs_as(pod, 1001)?;
    }
    assert_leadership_handover(&client, &deployed).await?;
    assert_rollout_restart_has_one_leader(&client, &deployed).await?;
    // Undeploy with the Memcached in place: `cargo xtask undeploy` deletes it
    // first and waits while the operator honours the finalizer, so its
    // namespace can go away afterwards instead of staying Terminating.
    drop(deployed);
    kubectl_ok([
        "delete",
        "namespace",
        &ns.name,
        "--wait=true",
        "--timeout=60s",
    ])
    .context("the namespace of an undeployed operator's object did not go away")?;
    Ok(())
}

fn curl_page(port: i32) -> Option<String> {
    let out = Command::new("curl")
        .args(["-sf", "--max-time", "3", "-H", "Accept: text/plain"])
        .arg(format!("http://127.0.0.1:{port}/"))
        .output()
        .ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Opens the page in headless Chromium: its DOM, and a screenshot kept
/// under `target/e2e/`.
fn chromium_page(port: i32) -> Result<(String, PathBuf)> {
    let browser = ["chromium", "chromium-browser"]
        .into_iter()
        .find(|b| {
            Command::new(b)
                .arg("--version")
                .output()
                .is_ok_and(|o| o.status.success())
        })
        .context("Chromium is not installed (apt-get install chromium)")?;
    let dir = e2e::target_dir().join("e2e");
    std::fs::create_dir_all(&dir)?;
    let profile = dir.join(format!("chromium-profile-{}", e2e::unique_suffix()));
    let shot = dir.join("lolcow-real-node.png");
    let url = format!("http://127.0.0.1:{port}/");
    let common = [
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--window-size=900,700",
    ];
    let dom = Command::new(browser)
        .args(common)
        .arg(format!("--user-data-dir={}", profile.display()))
        .arg("--dump-dom")
        .arg(&url)
        .output()?;
    Command::new(browser)
        .args(common)
        .arg(format!("--user-data-dir={}", profile.display()))
        .arg(format!("--screenshot={}", shot.display()))
        .arg(&url)
        .output()?;
    let _ = std::fs::remove_dir_all(&profile);
    Ok((String::from_utf8_lossy(&dom.stdout).into_owned(), shot))
}

#[tokio::test(flavor = "multi_thread")]
async fn lolcow_operator_image_serves_the_cow_page_on_its_node_port() -> Result<()> {
    let client = e2e::admin_client().await?;
    if !has_real_node(&client).await? {
        return e2e::skip(
            "lolcow_operator_image_serves_the_cow_page_on_its_node_port",
            NO_REAL_NODE,
        );
    }
    let deployed = Deployed::new("lolcow-operator")?;
    assert_operator_runs(&client, &deployed).await?;
    let ns = TestNamespace::real("real-lolcow").await?;
    let port = free_node_port(&ns, "real-lolcow", &[]).await?;
    create_from_json::<Lolcow>(&ns, kinds::lolcow("cow", port, "Moo from a real pod")).await?;
    e2e::kinds::wait_lolcow_ready(&ns, "cow").await?;
    let page = poll(
        "the cow page on the NodePort",
        Duration::from_secs(90),
        || async move { Ok(curl_page(port).filter(|p| p.contains("Moo from a real pod"))) },
    )
    .await?;
    ensure!(page.contains("(oo)"), "not a cow: {page}");
    let (dom, shot) = chromium_page(port)?;
    ensure!(
        dom.contains("Moo from a real pod"),
        "Chromium's page lacks the greeting: {dom}"
    );
    let png =
        std::fs::read(&shot).with_context(|| format!("no screenshot at {}", shot.display()))?;
    ensure!(png.starts_with(b"\x89PNG"), "the screenshot is not a PNG");
    eprintln!("screenshot: {}", shot.display());
    // A new greeting is served after the rollout.
    ns.api::<Lolcow>()
        .patch(
            "cow",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"greeting": "A new greeting"}})),
        )
        .await?;
    poll(
        "the new greeting on the NodePort",
        Duration::from_secs(120),
        || async move { Ok(curl_page(port).filter(|p| p.contains("A new greeting"))) },
    )
    .await?;
    drop(deployed);
    Ok(())
}

/// The `message received` lines of a consumer pod's log (its default text
/// format: `... message received topic="..." id="..." payload="..."`).
fn received_in_text_log(log: &str) -> Vec<pulsar::Received> {
    let field = |line: &str, key: &str| -> Option<String> {
        let start = line.find(&format!("{key}=\""))? + key.len() + 2;
        let end = start + line[start..].find('"')?;
        Some(line[start..end].to_owned())
    };
    log.lines()
        .filter(|l| l.contains("message received"))
        .filter_map(|l| {
            Some(pulsar::Received {
                payload: field(l, "payload")?,
                id: field(l, "id")?,
            })
        })
        .collect()
}

/// Consumers that run as pods receive each message once and follow scaling, by hand
/// and by backlog autoscaling.
#[tokio::test(flavor = "multi_thread")]
async fn pulsar_consumer_operator_image_consumes_from_the_real_broker() -> Result<()> {
    let client = e2e::admin_client().await?;
    if !has_real_node(&client).await? {
        return e2e::skip(
            "pulsar_consumer_operator_image_consumes_from_the_real_broker",
            NO_REAL_NODE,
        );
    }
    let (host_url, _broker) = pulsar::shared_broker().await?;
    let deployed = Deployed::new("pulsar-consumer-operator")?;
    assert_operator_runs(&client, &deployed).await?;
    let ns = TestNamespace::real("real-pulsar").await?;
    let topic = unique_topic("real-node");
    let mut manifest = kinds::pulsar_consumer("consumers", 2);
    manifest["spec"]["serverAddress"] = json!("pulsar://pulsar-broker.pulsar.svc:6650");
    manifest["spec"]["topic"] = json!(topic);
    manifest["spec"]["subscriptionName"] = json!("real-node");
    create_from_json::<PulsarConsumer>(&ns, manifest).await?;
    e2e::kinds::wait_pulsar_consumer_ready(&ns, "consumers").await?;
    let count = 500;
    pulsar::produce(&host_url, &topic, "real", count).await?;
    let selector = "app.kubernetes.io/instance=consumers";
    let counts = poll(
        "every message received",
        Duration::from_secs(90),
        || async {
            let mut logs = Vec::new();
            for pod in pods(&client, &ns.name, selector).await? {
                let name = pod.metadata.name.clone().unwrap_or_default();
                let log = kubectl_ok(["logs", "-n", &ns.name, &name])?;
                logs.push(received_in_text_log(&log));
            }
            let counts = payload_counts(logs.iter().map(Vec::as_slice));
            Ok((counts.len() as u64 == count).then_some((counts, logs.len())))
        },
    )
    .await?;
    let (counts, consumers) = counts;
    ensure!(consumers == 2, "{consumers} consumer pods");
    for payload in expected_payloads("real", count) {
        ensure!(
            counts.get(&payload) == Some(&1),
            "{payload} received {:?} times",
            counts.get(&payload)
        );
    }
    // Scaling the PulsarConsumer changes the consumers the broker sees.
    let admin = format!("http://127.0.0.1:18080/admin/v2/persistent/public/default/{topic}/stats");
    let consumers_at_broker = |admin: String| async move {
        let out = Command::new("curl")
            .args(["-sf", "--max-time", "3", &admin])
            .output()?;
        let stats: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_default();
        Ok::<_, anyhow::Error>(
            stats["subscriptions"]["real-node"]["consumers"]
                .as_array()
                .map_or(0, Vec::len),
        )
    };
    ensure!(
        consumers_at_broker(admin.clone()).await? == 2,
        "the broker does not see 2 consumers"
    );
    e2e::kubectl_scale(&ns, "pulsarconsumer", "consumers", 1)?;
    poll(
        "one consumer at the broker",
        Duration::from_secs(90),
        || {
            let admin = admin.clone();
            async move { Ok((consumers_at_broker(admin).await? == 1).then_some(())) }
        },
    )
    .await?;
    grant_the_broker(&client, &deployed).await?;
    assert_autoscaling_with_consumer_pods(&client, &host_url).await?;
    drop(deployed);
    Ok(())
}

/// Grants the deployed operator the shared broker of namespace `pulsar`, as an administrator
/// would for a broker every tenant shares: a PulsarConsumer reads only its own namespace's
/// Services or the addresses listed in `PULSAR_ADMIN_ALLOWED_CIDRS`. The broker's Service
/// is headless, so its name resolves to its endpoints' addresses: those are listed (set on
/// the operator's Deployment, its rollout waited for).
async fn grant_the_broker(client: &kube::Client, deployed: &Deployed) -> Result<()> {
    let cidrs = pulsar::broker_addresses(client).await?;
    deployed.set_env(&[format!("PULSAR_ADMIN_ALLOWED_CIDRS={cidrs}")])
}

/// Follows the log of every consumer pod of a PulsarConsumer from the moment its
/// container runs, and counts the most that ran at once, until stopped.
struct ConsumerPods {
    logs: Arc<Mutex<Option<PodLogs>>>,
    max_running: Arc<AtomicUsize>,
    task: tokio::task::JoinHandle<()>,
}

impl ConsumerPods {
    fn start(client: &kube::Client, namespace: &str, instance: &str) -> Result<ConsumerPods> {
        let logs = Arc::new(Mutex::new(Some(PodLogs::new(
            &format!("autoscale-{instance}"),
            namespace,
            false,
        )?)));
        let max_running = Arc::new(AtomicUsize::new(0));
        let (shared_logs, shared_max) = (Arc::clone(&logs), Arc::clone(&max_running));
        let (client, namespace) = (client.clone(), namespace.to_owned());
        let selector = format!("app.kubernetes.io/instance={instance}");
        let task = tokio::spawn(async move {
            loop {
                if let Ok(now) = pods(&client, &namespace, &selector).await {
                    let running: Vec<&Pod> = now.iter().filter(|p| container_running(p)).collect();
                    shared_max.fetch_max(running.len(), Ordering::SeqCst);
                    if let Ok(mut guard) = shared_logs.lock()
                        && let Some(logs) = guard.as_mut()
                    {
                        for name in running.iter().filter_map(|p| p.metadata.name.as_ref()) {
                            if let Err(e) = logs.follow(name) {
                                eprintln!("following {name}: {e:#}");
                            }
                        }
                    }
                }
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        });
        Ok(ConsumerPods {
            logs,
            max_running,
            task,
        })
    }

    /// Stops watching; returns every followed pod's received messages (waiting for
    /// their containers to stop) and the most consumers that ran at once.
    async fn finish(self) -> Result<(Vec<Vec<pulsar::Received>>, usize)> {
        self.task.abort();
        let logs = self
            .logs
            .lock()
            .map_err(|_| anyhow::anyhow!("the pod watcher panicked"))?
            .take()
            .context("the consumer pods' logs were taken twice")?;
        let received: Vec<Vec<pulsar::Received>> = logs
            .finish(|_| true, Duration::from_secs(60))
            .await?
            .iter()
            .map(|(_, log)| received_in_text_log(log))
            .collect();
        Ok((received, self.max_running.load(Ordering::SeqCst)))
    }
}

/// Polls the PulsarConsumer `drain` and its Deployment until `check(deployment replicas,
/// status backlog, status desiredReplicas)` holds.
async fn wait_autoscaled(
    ns: &TestNamespace,
    what: &str,
    check: impl Fn(Option<i32>, Option<i64>, Option<i32>) -> bool,
) -> Result<()> {
    let check = &check;
    poll(what, ROLLOUT, || async {
        let s = ns
            .api::<PulsarConsumer>()
            .get("drain")
            .await?
            .status
            .unwrap_or_default();
        let replicas = ns
            .api::<Deployment>()
            .get_opt("drain-deployment")
            .await?
            .and_then(|d| d.spec?.replicas);
        Ok(check(replicas, s.backlog, s.desired_replicas).then_some(()))
    })
    .await
}

/// Waits until no pod of the PulsarConsumer `drain` is left (running or terminating).
async fn wait_no_consumer_pods(ns: &TestNamespace, what: &str) -> Result<()> {
    poll(what, ROLLOUT, || async {
        let left = ns
            .api::<Pod>()
            .list(&ListParams::default().labels("app.kubernetes.io/instance=drain"))
            .await?;
        Ok(left.items.is_empty().then_some(()))
    })
    .await
}

/// Backlog autoscaling with the consumers as real pods: 20,000 messages wait with no
/// consumer; the operator (in its pod) reads the backlog from the broker's admin API
/// through the cluster's Service and scales to `maxReplicas`; the consumer pods drain it;
/// the Deployment goes to zero after the (shortened) window; a new message brings a
/// consumer back; and every message is received exactly once across all the pods that
/// ever ran (their logs followed while they lived).
async fn assert_autoscaling_with_consumer_pods(
    client: &kube::Client,
    host_url: &str,
) -> Result<()> {
    const BACKLOG: u64 = 20_000;
    const LATER: u64 = 500;
    const WINDOW_SECONDS: u64 = 10;
    const MAX: i32 = 3;
    let ns = TestNamespace::real("real-autoscale").await?;
    let topic = unique_topic("real-autoscale");
    let subscription = "real-autoscale";
    // The subscription exists (a consumer subscribes once), then the backlog waits on it.
    let mut first = pulsar::ConsumerProcess::start(host_url, &topic, subscription, "subscribe")?;
    first.wait_connected(ROLLOUT).await?;
    ensure!(first.terminate()?, "the subscribing consumer exits 0");
    pulsar::produce(host_url, &topic, "auto", BACKLOG).await?;

    let watcher = ConsumerPods::start(client, &ns.name, "drain")?;
    let started = Instant::now();
    let manifest = json!({
        "apiVersion": "pulsar.pulsarconsumer.krvarma.com/v1",
        "kind": "PulsarConsumer",
        "metadata": {"name": "drain"},
        "spec": {
            "serverAddress": "pulsar://pulsar-broker.pulsar.svc:6650",
            "topic": topic,
            "subscriptionName": subscription,
            "replicas": 1,
            "autoscaling": {
                "minReplicas": 0,
                "maxReplicas": MAX,
                "targetBacklogPerReplica": 2000,
                "adminUrl": "http://pulsar-broker.pulsar.svc:18080",
                "pollIntervalSeconds": 1,
                "behavior": {"scaleDownStabilizationSeconds": WINDOW_SECONDS}
            }
        }
    });
    create_from_json::<PulsarConsumer>(&ns, manifest).await?;
    wait_autoscaled(&ns, "scaled to maxReplicas on the backlog", |r, _, d| {
        r == Some(MAX) && d == Some(MAX)
    })
    .await?;
    wait_autoscaled(&ns, "the consumer pods drained the backlog", |_, b, _| {
        b == Some(0)
    })
    .await?;
    let drained = Instant::now();
    let drain_seconds = drained.duration_since(started).as_secs_f64();
    wait_autoscaled(&ns, "scaled to zero after the window", |r, _, d| {
        r == Some(0) && d == Some(0)
    })
    .await?;
    let zero_after = drained.elapsed().as_secs_f64();
    // As in `pulsar_autoscale`: the window runs from the last non-zero reading, up to a
    // poll before the status shows 0, and the test sees the status up to a second late.
    // The deployed operator polls at its default floor (`PULSAR_ADMIN_MIN_POLL_SECONDS`,
    // 5 s), which raises the spec's 1 s.
    ensure!(
        zero_after >= (WINDOW_SECONDS as f64) - 6.0,
        "scaled to zero {zero_after:.1}s after the backlog drained; the window is {WINDOW_SECONDS}s"
    );
    wait_no_consumer_pods(&ns, "no consumer pod left").await?;

    // A message waits: a consumer pod comes back, drains it, and goes again.
    pulsar::produce(host_url, &topic, "again", LATER).await?;
    let woke = Instant::now();
    wait_autoscaled(&ns, "scaled up from zero", |r, _, _| {
        r.is_some_and(|r| r >= 1)
    })
    .await?;
    let wake_seconds = woke.elapsed().as_secs_f64();
    wait_autoscaled(&ns, "drained and back to zero", |r, b, _| {
        r == Some(0) && b == Some(0)
    })
    .await?;
    wait_no_consumer_pods(&ns, "no consumer pod left again").await?;

    let (logs, max_running) = watcher.finish().await?;
    ensure!(
        max_running == MAX as usize,
        "at the most {MAX} consumer pods ran at once, and all {MAX} did: {max_running}"
    );
    let counts = payload_counts(logs.iter().map(Vec::as_slice));
    let mut expected = expected_payloads("auto", BACKLOG);
    expected.extend(expected_payloads("again", LATER));
    let missing = expected.iter().filter(|p| !counts.contains_key(*p)).count();
    let twice = counts.values().filter(|n| **n > 1).count();
    ensure!(
        missing == 0 && twice == 0 && counts.len() == expected.len(),
        "{missing} messages never received and {twice} received more than once, \
         across the logs of {} pods",
        logs.len()
    );
    println!(
        "real-node autoscale: {} consumer pods drained {BACKLOG} messages in {drain_seconds:.1}s \
         (up to {max_running} at once); zero {zero_after:.1}s after the drain (window \
         {WINDOW_SECONDS}s); a new message brought a pod back in {wake_seconds:.1}s",
        logs.len()
    );
    Ok(())
}
