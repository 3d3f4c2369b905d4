//! Backlog-based autoscaling of a PulsarConsumer against the real Apache Pulsar broker
//! (`cargo xtask pulsar up`, started on demand) and the real local cluster.
//!
//! Pods are simulated (kwok) here, so this test plays the kubelet for the consumers: a
//! "follower" runs as many local `pulsar-consumer` processes as the Deployment asks for
//! (starting and stopping them as the operator scales), as the other consumer tests run
//! consumer processes locally. The operator reads the backlog through a TCP proxy
//! ([`TcpProxy`]) in front of the broker's admin port, which the test stops to take the
//! admin API away without touching the broker other tests share. With the real node, the
//! same scenario also runs with the operator's image and the consumers as real pods
//! (`real_node.rs`, `assert_autoscaling_with_consumer_pods`).
//!
//! The broker listens on 127.0.0.1, which the operator refuses by default (a tenant's
//! adminUrl must not reach the operator's own loopback): the operator is started with
//! [`allow_loopback`]. `pulsar_autoscaling_never_reaches_refused_targets` starts it without,
//! as a cluster runs it.

use anyhow::{Context, Result, bail, ensure};
use e2e::operator::{OperatorOptions, OperatorProcess, touch_and_wait_reconcile};
use e2e::proxy::TcpProxy;
use e2e::pulsar::{
    ConsumerProcess, Received, expected_payloads, payload_counts, produce, shared_broker,
    unique_topic,
};
use e2e::{
    TestNamespace, check_all_received, create_from_json, dynamic_api, events_where, list_all, poll,
    regards_uid, repo_root,
};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::events::v1::Event;
use kube::api::{Api, ListParams};
use pulsar_consumer_operator::admin::UNAVAILABLE_MESSAGE;
use pulsar_consumer_operator::api::PulsarConsumer;
use serde_json::{Value, json};
use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const OPERATOR: &str = "pulsar-consumer-operator";
/// Deadline of the waits on consumers and scaling (debug builds on a shared machine).
const TIMEOUT: Duration = Duration::from_secs(120);
/// The (shortened) scale-down stabilisation window of the test object.
const WINDOW_SECONDS: u64 = 10;
/// Messages produced before any consumer runs.
const BACKLOG: u64 = 20_000;
/// Messages produced once scaled to zero.
const LATER: u64 = 500;

/// The operator's options for a broker on this machine: loopback allowed
/// (`PULSAR_ADMIN_ALLOWED_CIDRS`) and reads as often as the specs ask
/// (`PULSAR_ADMIN_MIN_POLL_SECONDS=1`; the default floor is 5 s), as the timings below
/// assume.
fn allow_loopback() -> OperatorOptions {
    OperatorOptions {
        env: vec![
            (
                "PULSAR_ADMIN_ALLOWED_CIDRS".into(),
                "127.0.0.0/8,::1".into(),
            ),
            ("PULSAR_ADMIN_MIN_POLL_SECONDS".into(), "1".into()),
        ],
        ..OperatorOptions::default()
    }
}

/// The broker's admin port, as `cargo xtask pulsar status` reports it.
async fn admin_port() -> Result<u16> {
    let out = tokio::process::Command::from(xtask::support::cmd::cargo())
        .current_dir(repo_root())
        .args(["run", "--quiet", "-p", "xtask", "--", "pulsar", "status"])
        .output()
        .await
        .context("running cargo xtask pulsar status")?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    stdout
        .lines()
        .find_map(|l| l.trim().strip_prefix("admin URL:"))
        .and_then(|url| url.trim().rsplit_once(':'))
        .and_then(|(_, port)| port.trim_end_matches('/').parse().ok())
        .with_context(|| format!("no admin URL in `cargo xtask pulsar status`:\n{stdout}"))
}

/// Runs as many local consumer processes as the Deployment's `spec.replicas`, as a kubelet
/// would run its pods; keeps every process it ever started, for their logs.
struct Follower {
    state: Arc<Mutex<FollowerState>>,
    task: tokio::task::JoinHandle<()>,
}

#[derive(Default)]
struct FollowerState {
    running: Vec<ConsumerProcess>,
    stopped: Vec<ConsumerProcess>,
    max_running: usize,
    error: Option<String>,
}

impl Follower {
    fn start(
        deployments: Api<Deployment>,
        name: String,
        server: String,
        topic: String,
        subscription: String,
    ) -> Follower {
        let state = Arc::new(Mutex::new(FollowerState::default()));
        let shared = Arc::clone(&state);
        let task = tokio::spawn(async move {
            let mut n = 0;
            loop {
                let want = match deployments.get_opt(&name).await {
                    Ok(d) => d
                        .and_then(|d| d.spec)
                        .and_then(|s| s.replicas)
                        .unwrap_or(0)
                        .max(0) as usize,
                    Err(_) => {
                        tokio::time::sleep(Duration::from_millis(200)).await;
                        continue;
                    }
                };
                if !follow(&shared, want, &mut n, &server, &topic, &subscription) {
                    return;
                }
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        });
        Follower { state, task }
    }

    /// How many consumers run now.
    fn running(&self) -> usize {
        self.state.lock().map(|s| s.running.len()).unwrap_or(0)
    }

    /// Stops following, terminates what runs and returns every process's received
    /// messages and the most that ran at once.
    fn finish(self) -> Result<(Vec<Vec<Received>>, usize)> {
        self.task.abort();
        let mut s = self
            .state
            .lock()
            .map_err(|_| anyhow::anyhow!("the follower panicked"))?;
        if let Some(e) = s.error.take() {
            bail!("the follower failed: {e}");
        }
        let running = std::mem::take(&mut s.running);
        for mut c in running {
            c.terminate()?;
            s.stopped.push(c);
        }
        let logs = s.stopped.iter().map(ConsumerProcess::received).collect();
        Ok((logs, s.max_running))
    }
}

/// Starts or stops consumers until `want` run; `false` when it cannot (the error is kept).
fn follow(
    state: &Mutex<FollowerState>,
    want: usize,
    n: &mut usize,
    server: &str,
    topic: &str,
    subscription: &str,
) -> bool {
    let Ok(mut s) = state.lock() else {
        return false;
    };
    while s.running.len() < want {
        *n += 1;
        match ConsumerProcess::start(server, topic, subscription, &format!("c{n}")) {
            Ok(c) => s.running.push(c),
            Err(e) => {
                s.error = Some(format!("{e:#}"));
                return false;
            }
        }
    }
    while s.running.len() > want {
        if let Some(mut c) = s.running.pop() {
            // SIGTERM: the consumer finishes the message in hand and exits 0.
            if !c.terminate().unwrap_or(false) {
                s.error = Some(format!("consumer {} did not exit cleanly", c.name));
            }
            s.stopped.push(c);
        }
    }
    s.max_running = s.max_running.max(s.running.len());
    true
}

fn replicas_of(d: &Deployment) -> Option<i32> {
    d.spec.as_ref().and_then(|s| s.replicas)
}

fn condition(pc: &PulsarConsumer, type_: &str) -> Option<(String, String)> {
    pc.status.as_ref().and_then(|s| {
        s.conditions
            .iter()
            .find(|c| c.type_ == type_)
            .map(|c| (c.status.clone(), c.reason.clone()))
    })
}

/// Polls the PulsarConsumer and its Deployment until `check` holds; returns them.
async fn wait_scaled(
    ns: &TestNamespace,
    name: &str,
    what: &str,
    check: impl Fn(&PulsarConsumer, &Deployment) -> bool,
) -> Result<(PulsarConsumer, Deployment)> {
    let check = &check;
    poll(what, TIMEOUT, || async {
        let pc = ns.api::<PulsarConsumer>().get(name).await?;
        let Some(d) = ns
            .api::<Deployment>()
            .get_opt(&format!("{name}-deployment"))
            .await?
        else {
            return Ok(None);
        };
        Ok(check(&pc, &d).then_some((pc, d)))
    })
    .await
}

/// The events about the object with `uid`, with `reason`.
async fn events(ns: &TestNamespace, uid: &str, reason: &str) -> Result<Vec<Event>> {
    events_where(ns, |e| {
        regards_uid(e, uid) && e.reason.as_deref() == Some(reason)
    })
    .await
}

fn autoscaled(name: &str, server: &str, topic: &str, subscription: &str, admin_port: u16) -> Value {
    json!({
        "apiVersion": "pulsar.pulsarconsumer.krvarma.com/v1",
        "kind": "PulsarConsumer",
        "metadata": {"name": name},
        "spec": {
            "serverAddress": server,
            "topic": topic,
            "subscriptionName": subscription,
            "replicas": 1,
            "autoscaling": {
                "minReplicas": 0,
                "maxReplicas": 3,
                "targetBacklogPerReplica": 2000,
                "adminUrl": format!("http://127.0.0.1:{admin_port}"),
                "pollIntervalSeconds": 1,
                "behavior": {"scaleDownStabilizationSeconds": WINDOW_SECONDS}
            }
        }
    })
}

#[tokio::test]
async fn pulsar_autoscaling_follows_the_backlog() -> Result<()> {
    let (server, _broker) = shared_broker().await?;
    let upstream = admin_port().await?;
    let topic = unique_topic("autoscale");
    let subscription = format!("{topic}-sub");

    // The subscription exists (a consumer subscribes once), then 20,000 messages wait on it
    // with no consumer running.
    let mut first = ConsumerProcess::start(&server, &topic, &subscription, "subscribe")?;
    first.wait_connected(TIMEOUT).await?;
    ensure!(first.terminate()?, "the subscribing consumer exits 0");
    ensure!(first.received().is_empty(), "nothing was produced yet");
    produce(&server, &topic, "auto", BACKLOG).await?;

    let mut proxy = TcpProxy::start(upstream).await?;
    let ns = TestNamespace::restricted("pulsar-autoscale").await?;
    let op = OperatorProcess::start_with(OPERATOR, &[&ns.name], allow_loopback()).await?;
    let pc: PulsarConsumer = create_from_json(
        &ns,
        autoscaled("drain", &server, &topic, &subscription, proxy.port),
    )
    .await?;
    let uid = pc.metadata.uid.clone().unwrap_or_default();

    // The backlog asks for 10 consumers: the maximum, 3, reported as limited.
    let (pc, _) = wait_scaled(&ns, "drain", "scaled to maxReplicas", |pc, d| {
        let s = pc.status.clone().unwrap_or_default();
        replicas_of(d) == Some(3)
            && s.backlog == Some(BACKLOG as i64)
            && s.desired_replicas == Some(3)
            && condition(pc, "ScalingActive").is_some_and(|(s, _)| s == "True")
            && condition(pc, "ScalingLimited")
                .is_some_and(|(s, r)| s == "True" && r == "TooManyReplicas")
    })
    .await
    .with_context(|| format!("operator log:\n{}", op.log()))?;
    let scaled_at = pc.status.and_then(|s| s.last_scale_time);

    // Reads that change nothing cost no reconcile: once the 3 (simulated) consumers are
    // ready, the backlog standing still, ~10 reads at 1 s give none (before, each read was
    // a reconcile). A few are let through for late changes of the Deployment's status.
    wait_scaled(&ns, "drain", "3 consumers ready", |pc, d| {
        let ready = d.status.as_ref().and_then(|s| s.ready_replicas) == Some(3);
        ready && condition(pc, "Ready").is_some_and(|(s, _)| s == "True")
    })
    .await?;
    let before = op.reconciles(&[])?;
    tokio::time::sleep(Duration::from_secs(10)).await;
    let quiet = op.reconciles(&[])? - before;
    println!("autoscale: {quiet} reconciles in 10 s of 1 s reads of a standing backlog");
    ensure!(
        quiet <= 3.0,
        "{quiet} reconciles in 10 s of reads that changed nothing"
    );

    // The admin API goes away: ScalingActive=False (one Warning), the replicas stay.
    proxy.stop();
    let (_, held) = wait_scaled(&ns, "drain", "ScalingActive=False", |pc, _| {
        condition(pc, "ScalingActive")
            .is_some_and(|(s, r)| s == "False" && r == "AdminAPIUnavailable")
    })
    .await?;
    // Reconciles while the backlog is unknown (the failed reads themselves ask for none
    // after the first) leave the Deployment as it is.
    for touch in ["away-1", "away-2"] {
        touch_and_wait_reconcile(&ns.api::<PulsarConsumer>(), &op, "drain", touch, &[]).await?;
    }
    let now = ns.api::<Deployment>().get("drain-deployment").await?;
    ensure!(
        replicas_of(&now) == Some(3),
        "replicas unchanged: {:?}",
        replicas_of(&now)
    );
    ensure!(
        now.metadata.generation == held.metadata.generation,
        "the Deployment's spec was not written while the backlog was unknown"
    );
    let pc_now = ns.api::<PulsarConsumer>().get("drain").await?;
    let s = pc_now.status.clone().unwrap_or_default();
    ensure!(
        s.desired_replicas == Some(3) && s.last_scale_time == scaled_at,
        "the autoscaler's count and lastScaleTime kept while the backlog is unknown: {s:?}"
    );
    ensure!(
        s.backlog == Some(BACKLOG as i64),
        "the last backlog read is kept"
    );
    let warnings: Vec<Event> = events(&ns, &uid, "AdminAPIUnavailable")
        .await?
        .into_iter()
        .filter(|e| e.type_.as_deref() == Some("Warning"))
        .collect();
    ensure!(warnings.len() == 1, "one Warning: {warnings:#?}");
    proxy.resume().await?;
    wait_scaled(&ns, "drain", "ScalingActive=True again", |pc, _| {
        condition(pc, "ScalingActive").is_some_and(|(s, _)| s == "True")
    })
    .await?;

    // Consumers follow the Deployment and drain the backlog.
    let started = Instant::now();
    let follower = Follower::start(
        ns.api(),
        "drain-deployment".into(),
        server.clone(),
        topic.clone(),
        subscription.clone(),
    );
    // Drained: a backlog reaching 0 is in the status at once (one that only moves is
    // written at most every 30 s).
    let (_, _) = wait_scaled(&ns, "drain", "the backlog drained", |pc, _| {
        pc.status.as_ref().and_then(|s| s.backlog) == Some(0)
    })
    .await?;
    let drained_at = Instant::now();
    let drain_seconds = drained_at.duration_since(started).as_secs_f64();

    // Drained for the window: down to minReplicas (0), not sooner, and the status says why.
    wait_scaled(&ns, "drain", "scaled to zero", |pc, d| {
        let s = pc.status.clone().unwrap_or_default();
        replicas_of(d) == Some(0) && s.desired_replicas == Some(0) && s.backlog == Some(0)
    })
    .await?;
    let zero_after = drained_at.elapsed().as_secs_f64();
    // The window runs from the last non-zero reading, which can come up to one poll (1 s)
    // before the status shows a backlog of 0, and the test sees the status up to a status
    // write and a poll (about 1 s) later still; without the window this would take ~1 s.
    ensure!(
        zero_after >= (WINDOW_SECONDS as f64) - 3.0,
        "scaled to zero {zero_after:.1}s after the backlog drained; the window is {WINDOW_SECONDS}s"
    );
    poll("the consumers stopped", TIMEOUT, || async {
        Ok((follower.running() == 0).then_some(()))
    })
    .await?;

    // A message waits: at least one consumer at once, which drains it; then zero again.
    produce(&server, &topic, "again", LATER).await?;
    let woke = Instant::now();
    wait_scaled(&ns, "drain", "scaled up from zero", |_, d| {
        replicas_of(d).is_some_and(|r| r >= 1)
    })
    .await?;
    let wake_seconds = woke.elapsed().as_secs_f64();
    wait_scaled(&ns, "drain", "drained and back to zero", |pc, d| {
        replicas_of(d) == Some(0) && pc.status.as_ref().and_then(|s| s.backlog) == Some(0)
    })
    .await?;

    // Every message was received exactly once.
    let (logs, max_running) = follower.finish()?;
    ensure!(
        max_running == 3,
        "at most maxReplicas consumers ran: {max_running}"
    );
    let counts = payload_counts(logs.iter().map(Vec::as_slice));
    let mut expected = expected_payloads("auto", BACKLOG);
    expected.extend(expected_payloads("again", LATER));
    check_all_received(&counts, &expected)?;
    let twice: Vec<(&String, &usize)> = counts.iter().filter(|(_, n)| **n > 1).collect();
    ensure!(
        twice.is_empty(),
        "{} messages received more than once, e.g. {:?}",
        twice.len(),
        twice.iter().take(5).collect::<Vec<_>>()
    );

    // A Scaled event per change: 1 -> 3 at the first read, down to 0 (maybe through
    // 2 or 1 as the backlog fell), 0 -> 1 (or more) for the later messages.
    let scaled = events(&ns, &uid, "Scaled").await?;
    let notes: BTreeSet<String> = scaled.iter().filter_map(|e| e.note.clone()).collect();
    ensure!(
        notes.iter().any(|n| n.contains("from 1 to 3"))
            && notes.iter().any(|n| n.contains(" to 0:"))
            && notes.iter().any(|n| n.contains("from 0 to ")),
        "Scaled events: {notes:#?}"
    );
    println!(
        "autoscale: drained {BACKLOG} messages with up to {max_running} consumers in {drain_seconds:.1}s; \
         scaled to zero {zero_after:.1}s after the drain (window {WINDOW_SECONDS}s); \
         a new message brought a consumer back in {wake_seconds:.1}s"
    );
    Ok(())
}

#[tokio::test]
async fn pulsar_autoscaling_invalid_settings_are_rejected_naming_the_field() -> Result<()> {
    let ns = TestNamespace::new("pulsar-autoscale-invalid").await?;
    e2e::operator::install(OPERATOR)?;
    let api = dynamic_api(
        &ns,
        "pulsar.pulsarconsumer.krvarma.com",
        "v1",
        "PulsarConsumer",
        "pulsarconsumers",
    );
    let good = json!({"maxReplicas": 3, "targetBacklogPerReplica": 100});
    let with = |field: &str, value: Value| {
        let mut a = good.clone();
        a[field] = value;
        a
    };
    let cases = [
        (
            with("minReplicas", json!(4)),
            "spec.autoscaling.minReplicas",
        ),
        (
            with("minReplicas", json!(-1)),
            "spec.autoscaling.minReplicas",
        ),
        (
            with("maxReplicas", json!(0)),
            "spec.autoscaling.maxReplicas",
        ),
        (
            with("maxReplicas", json!(1001)),
            "spec.autoscaling.maxReplicas",
        ),
        (
            json!({"targetBacklogPerReplica": 100}),
            "spec.autoscaling.maxReplicas",
        ),
        (
            with("targetBacklogPerReplica", json!(0)),
            "spec.autoscaling.targetBacklogPerReplica",
        ),
        (
            json!({"maxReplicas": 3}),
            "spec.autoscaling.targetBacklogPerReplica",
        ),
        (
            with("adminUrl", json!("ftp://x:1")),
            "spec.autoscaling.adminUrl",
        ),
        (
            with("adminUrl", json!("http://x")),
            "spec.autoscaling.adminUrl",
        ),
        (
            with("adminUrl", json!("http://x:8080/admin")),
            "spec.autoscaling.adminUrl",
        ),
        (
            with("adminUrl", json!("http://x:0")),
            "spec.autoscaling.adminUrl",
        ),
        (
            with("adminUrl", json!("http://x:65536")),
            "spec.autoscaling.adminUrl",
        ),
        (
            with("adminUrl", json!("http://x:99999")),
            "spec.autoscaling.adminUrl",
        ),
        // Never a broker: refused by the schema's rule, naming the field.
        (
            with("adminUrl", json!("http://169.254.169.254:80")),
            "spec.autoscaling.adminUrl must not point at",
        ),
        (
            with("adminUrl", json!("https://kubernetes.default.svc:443")),
            "spec.autoscaling.adminUrl must not point at",
        ),
        (
            with("adminUrl", json!("http://0.0.0.0:8080")),
            "spec.autoscaling.adminUrl must not point at",
        ),
        (
            with("adminUrl", json!("http://[fe80::1]:8080")),
            "spec.autoscaling.adminUrl must not point at",
        ),
        (
            with("pollIntervalSeconds", json!(0)),
            "spec.autoscaling.pollIntervalSeconds",
        ),
        (
            with("behavior", json!({"scaleDownStabilizationSeconds": -1})),
            "spec.autoscaling.behavior.scaleDownStabilizationSeconds",
        ),
        (
            with("behavior", json!({"scaleUp": {"maxStep": 0}})),
            "spec.autoscaling.behavior.scaleUp.maxStep",
        ),
        (
            with("behavior", json!({"scaleDown": {"periodSeconds": 15}})),
            "spec.autoscaling.behavior.scaleDown.maxStep",
        ),
    ];
    for (i, (autoscaling, field)) in cases.into_iter().enumerate() {
        let manifest = json!({
            "apiVersion": "pulsar.pulsarconsumer.krvarma.com/v1",
            "kind": "PulsarConsumer",
            "metadata": {"name": format!("bad-{i}")},
            "spec": {
                "serverAddress": "pulsar://localhost:6650",
                "topic": "t",
                "subscriptionName": "s",
                "replicas": 1,
                "autoscaling": autoscaling,
            }
        });
        e2e::assert_create_rejected(&api, manifest, field).await?;
    }
    ensure!(api.list(&ListParams::default()).await?.items.is_empty());

    // The boundaries are accepted, with the defaults filled in.
    let ok: PulsarConsumer = create_from_json(
        &ns,
        json!({
            "apiVersion": "pulsar.pulsarconsumer.krvarma.com/v1",
            "kind": "PulsarConsumer",
            "metadata": {"name": "edge"},
            "spec": {
                "serverAddress": "pulsar://localhost:6650",
                "topic": "t",
                "subscriptionName": "s",
                "replicas": 1,
                "autoscaling": {"minReplicas": 0, "maxReplicas": 1, "targetBacklogPerReplica": 1},
            }
        }),
    )
    .await?;
    let a = ok.spec.autoscaling.context("autoscaling kept")?;
    ensure!(a.min_replicas == 0 && a.poll_interval_seconds == 15 && a.admin_url.is_none());

    // The highest port; loopback (left to the operator, whose administrator may allow it);
    // a cluster address; and no adminUrl at all (null) are accepted.
    for (i, admin_url) in [
        json!("http://pulsar-broker.pulsar.svc:65535"),
        json!("http://127.0.0.1:18080"),
        json!("http://10.96.0.10:8080/"),
        Value::Null,
    ]
    .into_iter()
    .enumerate()
    {
        let mut autoscaling = good.clone();
        autoscaling["adminUrl"] = admin_url.clone();
        let manifest = json!({
            "apiVersion": "pulsar.pulsarconsumer.krvarma.com/v1",
            "kind": "PulsarConsumer",
            "metadata": {"name": format!("good-{i}")},
            "spec": {
                "serverAddress": "pulsar://localhost:65535",
                "topic": "t",
                "subscriptionName": "s",
                "replicas": 1,
                "autoscaling": autoscaling,
            }
        });
        let obj: kube::core::DynamicObject = serde_json::from_value(manifest)?;
        api.create(&kube::api::PostParams::default(), &obj)
            .await
            .with_context(|| format!("adminUrl {admin_url} must be accepted"))?;
    }
    Ok(())
}

/// A one-route-per-topic HTTP/1 endpoint on 127.0.0.1 for the admin API reads: answers a
/// request whose path contains a route's key with its status and body (chunked when the
/// route says so, without a length), anything else 404; counts the connections it accepts.
struct FakeAdmin {
    port: u16,
    connections: Arc<std::sync::atomic::AtomicUsize>,
    task: tokio::task::JoinHandle<()>,
}

impl FakeAdmin {
    async fn start(routes: Vec<(&'static str, u16, Vec<u8>, bool)>) -> Result<FakeAdmin> {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let port = listener.local_addr()?.port();
        let connections = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let count = Arc::clone(&connections);
        let routes = Arc::new(routes);
        let task = tokio::spawn(async move {
            while let Ok((mut conn, _)) = listener.accept().await {
                count.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                let routes = Arc::clone(&routes);
                tokio::spawn(async move {
                    let mut head = Vec::new();
                    let mut chunk = [0u8; 1024];
                    while !head.windows(4).any(|w| w == b"\r\n\r\n") && head.len() < 16 << 10 {
                        match conn.read(&mut chunk).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => head.extend_from_slice(&chunk[..n]),
                        }
                    }
                    let head = String::from_utf8_lossy(&head).into_owned();
                    let path = head.split_whitespace().nth(1).unwrap_or("");
                    let (code, body, chunked) = routes
                        .iter()
                        .find(|(key, ..)| path.contains(&format!("/{key}/")))
                        .map(|(_, code, body, chunked)| (*code, body.as_slice(), *chunked))
                        .unwrap_or((404, &b"not found"[..], false));
                    let _ = if chunked {
                        let head =
                            format!("HTTP/1.1 {code} X\r\nTransfer-Encoding: chunked\r\n\r\n");
                        let mut out = head.into_bytes();
                        for piece in body.chunks(64 << 10) {
                            out.extend_from_slice(format!("{:x}\r\n", piece.len()).as_bytes());
                            out.extend_from_slice(piece);
                            out.extend_from_slice(b"\r\n");
                        }
                        out.extend_from_slice(b"0\r\n\r\n");
                        conn.write_all(&out).await
                    } else {
                        let head = format!(
                            "HTTP/1.1 {code} X\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
                            body.len()
                        );
                        let mut out = head.into_bytes();
                        out.extend_from_slice(body);
                        conn.write_all(&out).await
                    };
                });
            }
        });
        Ok(FakeAdmin {
            port,
            connections,
            task,
        })
    }

    fn connections(&self) -> usize {
        self.connections.load(std::sync::atomic::Ordering::SeqCst)
    }
}

impl Drop for FakeAdmin {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// An autoscaled PulsarConsumer reading `admin_url` for `topic`.
fn reading(name: &str, topic: &str, admin_url: &str) -> Value {
    json!({
        "apiVersion": "pulsar.pulsarconsumer.krvarma.com/v1",
        "kind": "PulsarConsumer",
        "metadata": {"name": name},
        "spec": {
            "serverAddress": "pulsar://pulsar-broker.pulsar.svc:6650",
            "topic": topic,
            "subscriptionName": "s",
            "replicas": 1,
            "autoscaling": {
                "minReplicas": 0,
                "maxReplicas": 2,
                "targetBacklogPerReplica": 10,
                "adminUrl": admin_url,
                "pollIntervalSeconds": 1,
            }
        }
    })
}

/// The operator's peak resident memory (VmHWM), in MiB.
fn peak_rss_mib(pid: u32) -> Result<f64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
        .map(|kib| kib / 1024.0)
        .context("no VmHWM")
}

/// Waits until every named PulsarConsumer has `ScalingActive=False` with its reason;
/// returns their `ScalingActive` messages.
async fn wait_reasons(ns: &TestNamespace, want: &[(&str, &str)]) -> Result<Vec<String>> {
    poll("the ScalingActive reasons", TIMEOUT, || async {
        let mut messages = Vec::new();
        for (name, reason) in want {
            let pc = ns.api::<PulsarConsumer>().get(name).await?;
            let Some(c) = pc
                .status
                .iter()
                .flat_map(|s| s.conditions.iter())
                .find(|c| c.type_ == "ScalingActive")
            else {
                return Ok(None);
            };
            if c.status != "False" || c.reason != *reason {
                return Ok(None);
            }
            messages.push(c.message.clone());
        }
        Ok(Some(messages))
    })
    .await
}

/// What a tenant's endpoint answers must never show: the statuses, the events and the
/// operator's log (info level) do not contain `marker`.
async fn assert_nowhere(ns: &TestNamespace, op: &OperatorProcess, marker: &str) -> Result<()> {
    for pc in list_all::<PulsarConsumer>(ns).await? {
        let status = serde_json::to_string(&pc.status)?;
        ensure!(
            !status.contains(marker),
            "the status shows the endpoint's answer: {status}"
        );
    }
    for e in list_all::<Event>(ns).await? {
        let text = serde_json::to_string(&e)?;
        ensure!(
            !text.contains(marker),
            "an event shows the endpoint's answer: {text}"
        );
    }
    ensure!(
        !op.log().contains(marker),
        "the operator logged the endpoint's answer"
    );
    Ok(())
}

#[tokio::test]
async fn pulsar_autoscaling_never_reaches_refused_targets() -> Result<()> {
    const MARKER: &str = "TENANT-ENDPOINT-MARKER-5c2e9";
    let marked = |s: &str| format!("{s} {MARKER}").into_bytes();
    // 8 MiB of `[0,0,...]` with the marker: the answer that once took the operator to
    // 154 MiB at 1 s reads (its limit is 128Mi).
    let huge = {
        let mut b = format!("[\"{MARKER}\",0").into_bytes();
        b.extend(std::iter::repeat_n(&b",0"[..], 4 << 20).flatten());
        b.push(b']');
        b
    };
    let admin = FakeAdmin::start(vec![
        ("marker-503", 503, marked("Service Unavailable"), false),
        ("marker-401", 401, marked("Unauthorized"), false),
        ("marker-garbage", 200, marked("<html>"), false),
        (
            "marker-nosub",
            200,
            json!({"subscriptions": {MARKER: {"msgBacklog": 1}}, "x": MARKER})
                .to_string()
                .into_bytes(),
            false,
        ),
        ("marker-huge", 200, huge.clone(), false),
        ("marker-huge-chunked", 200, huge, true),
    ])
    .await?;
    let literal = format!("http://127.0.0.1:{}", admin.port);
    let named = format!("http://localhost:{}", admin.port);
    let ns = TestNamespace::restricted("pulsar-refused").await?;

    // As a cluster runs it, nothing granted: loopback refused, whether written as an
    // address or a name that resolves to it, and so is a Service of another namespace (the
    // shared broker's); nothing connects to the endpoint. A Service of the PulsarConsumer's
    // own namespace is not refused: it is read (and fails, as no such Service exists).
    let mut op = OperatorProcess::start(OPERATOR, &[&ns.name]).await?;
    create_from_json::<PulsarConsumer>(&ns, reading("literal", "marker-503", &literal)).await?;
    create_from_json::<PulsarConsumer>(&ns, reading("named", "marker-503", &named)).await?;
    create_from_json::<PulsarConsumer>(
        &ns,
        reading(
            "other-ns",
            "marker-503",
            "http://pulsar-broker.pulsar.svc:18080",
        ),
    )
    .await?;
    let own = format!("http://no-such-broker.{}.svc:8080", ns.name);
    create_from_json::<PulsarConsumer>(&ns, reading("own-ns", "marker-503", &own)).await?;
    let messages = wait_reasons(
        &ns,
        &[
            ("literal", "AdminTargetNotAllowed"),
            ("named", "AdminTargetNotAllowed"),
            ("other-ns", "AdminTargetNotAllowed"),
            ("own-ns", "AdminAPIUnavailable"),
        ],
    )
    .await
    .with_context(|| format!("operator log:\n{}", op.log()))?;
    for m in &messages[..3] {
        ensure!(m.contains("spec.autoscaling.adminUrl"), "{m}");
    }
    ensure!(
        messages[3].starts_with(UNAVAILABLE_MESSAGE),
        "{}",
        messages[3]
    );
    // One Warning each (published right after the status write).
    poll("a Warning event for each", TIMEOUT, || async {
        let warnings = events_where(&ns, |e| {
            e.reason.as_deref() == Some("AdminTargetNotAllowed")
                && e.type_.as_deref() == Some("Warning")
        })
        .await?;
        Ok((warnings.len() == 3).then_some(()))
    })
    .await?;
    ensure!(
        admin.connections() == 0,
        "{} connections reached the refused endpoint",
        admin.connections()
    );
    ensure!(op.terminate()?, "the operator exits 0");

    // Allowed by the administrator: the endpoint answers errors, garbage and 8 MiB, each
    // with the marker, and none of it shows.
    let op = OperatorProcess::start_with(OPERATOR, &[&ns.name], allow_loopback()).await?;
    for (name, topic) in [
        ("e401", "marker-401"),
        ("garbage", "marker-garbage"),
        ("nosub", "marker-nosub"),
        ("huge", "marker-huge"),
        ("chunked", "marker-huge-chunked"),
    ] {
        create_from_json::<PulsarConsumer>(&ns, reading(name, topic, &literal)).await?;
    }
    // Every failure (503, 401, not JSON, no such subscription, too large) reads alike: one
    // reason, one message, so a status does not tell one endpoint from another.
    let messages = wait_reasons(
        &ns,
        &[
            ("literal", "AdminAPIUnavailable"),
            ("named", "AdminAPIUnavailable"),
            ("e401", "AdminAPIUnavailable"),
            ("garbage", "AdminAPIUnavailable"),
            ("nosub", "AdminAPIUnavailable"),
            ("huge", "AdminAPIUnavailable"),
            ("chunked", "AdminAPIUnavailable"),
        ],
    )
    .await
    .with_context(|| format!("operator log:\n{}", op.log()))?;
    ensure!(
        messages[0].starts_with(UNAVAILABLE_MESSAGE),
        "{}",
        messages[0]
    );
    ensure!(
        messages.iter().all(|m| *m == messages[0]),
        "the messages differ: {messages:#?}"
    );
    ensure!(admin.connections() > 0, "the allowed endpoint was read");
    // Ten seconds of 8 MiB answers at 1 s reads: the operator's peak memory stays far from
    // its 128Mi limit (each read holds at most 1 MiB of the answer).
    tokio::time::sleep(Duration::from_secs(10)).await;
    let peak = peak_rss_mib(op.pid())?;
    println!("refused targets: operator peak RSS {peak:.1} MiB after 8 MiB answers at 1 s reads");
    ensure!(peak < 96.0, "peak RSS {peak:.1} MiB");
    assert_nowhere(&ns, &op, MARKER).await
}

/// The subscription's backlog, read from the broker's admin API with curl.
fn backlog_of(admin_port: u16, topic: &str, subscription: &str) -> Result<Option<i64>> {
    let url =
        format!("http://127.0.0.1:{admin_port}/admin/v2/persistent/public/default/{topic}/stats");
    let out = std::process::Command::new("curl")
        .args(["--silent", "--fail", "--max-time", "5", &url])
        .output()
        .context("running curl")?;
    if !out.status.success() {
        return Ok(None);
    }
    let stats: Value = serde_json::from_slice(&out.stdout)?;
    Ok(stats["subscriptions"][subscription]["msgBacklog"].as_i64())
}

/// One run of the benchmark: how long consumers that follow the PulsarConsumer's
/// Deployment take to drain `BACKLOG` messages.
struct Drain {
    label: &'static str,
    seconds: f64,
    max_consumers: usize,
    received: usize,
    duplicates: usize,
}

async fn drain(
    ns: &TestNamespace,
    server: &str,
    admin_port: u16,
    label: &'static str,
    autoscaling: Option<Value>,
) -> Result<Drain> {
    let topic = unique_topic("bench-drain");
    let subscription = format!("{topic}-sub");
    let mut first = ConsumerProcess::start(server, &topic, &subscription, "subscribe")?;
    first.wait_connected(TIMEOUT).await?;
    ensure!(first.terminate()?, "the subscribing consumer exits 0");
    produce(server, &topic, "bench", BACKLOG).await?;
    ensure!(
        backlog_of(admin_port, &topic, &subscription)? == Some(BACKLOG as i64),
        "{BACKLOG} messages wait before the consumers start"
    );
    let name = if autoscaling.is_some() {
        "autoscaled"
    } else {
        "fixed"
    };
    let mut spec = json!({
        "serverAddress": server,
        "topic": topic,
        "subscriptionName": subscription,
        "replicas": 1,
    });
    if let Some(a) = autoscaling {
        spec["autoscaling"] = a;
    }
    create_from_json::<PulsarConsumer>(
        ns,
        json!({
            "apiVersion": "pulsar.pulsarconsumer.krvarma.com/v1",
            "kind": "PulsarConsumer",
            "metadata": {"name": name},
            "spec": spec,
        }),
    )
    .await?;
    let started = Instant::now();
    let follower = Follower::start(
        ns.api(),
        format!("{name}-deployment"),
        server.to_owned(),
        topic.clone(),
        subscription.clone(),
    );
    // Generous: a single release-built consumer drains the backlog in well under this.
    poll("the backlog drained", Duration::from_secs(600), || async {
        Ok((backlog_of(admin_port, &topic, &subscription)? == Some(0)).then_some(()))
    })
    .await?;
    let seconds = started.elapsed().as_secs_f64();
    let (logs, max_consumers) = follower.finish()?;
    let counts = payload_counts(logs.iter().map(Vec::as_slice));
    let duplicates = counts.values().filter(|n| **n > 1).count();
    ensure!(
        counts.len() == BACKLOG as usize,
        "{label}: {} distinct messages received of {BACKLOG}",
        counts.len()
    );
    Ok(Drain {
        label,
        seconds,
        max_consumers,
        received: counts.values().sum(),
        duplicates,
    })
}

/// `cargo xtask bench autoscale`: time from a 20,000-message backlog to drained, with
/// autoscaling 1..4 against a fixed single consumer. Consumers are local processes that
/// follow the Deployment's replicas (as in the test above), started when the
/// PulsarConsumer is created. Writes JSON to `E2E_BENCH_OUT` (or prints it).
#[tokio::test]
#[ignore = "a benchmark: run it with `cargo xtask bench autoscale`"]
async fn bench_autoscale_drain() -> Result<()> {
    let (server, _broker) = shared_broker().await?;
    let admin = admin_port().await?;
    let ns = TestNamespace::restricted("pulsar-bench").await?;
    let _op = OperatorProcess::start_with(OPERATOR, &[&ns.name], allow_loopback()).await?;
    let fixed = drain(&ns, &server, admin, "fixed single consumer", None).await?;
    let scaled = drain(
        &ns,
        &server,
        admin,
        "autoscaling 1..4",
        Some(json!({
            "minReplicas": 1,
            "maxReplicas": 4,
            "targetBacklogPerReplica": 2000,
            "adminUrl": format!("http://127.0.0.1:{admin}"),
            "pollIntervalSeconds": 1,
        })),
    )
    .await?;
    let runs: Vec<Value> = [fixed, scaled]
        .iter()
        .map(|d| {
            json!({
                "label": d.label,
                "messages": BACKLOG,
                "seconds": (d.seconds * 1000.0).round() / 1000.0,
                "messages_per_second": (BACKLOG as f64 / d.seconds).round(),
                "max_consumers": d.max_consumers,
                "received": d.received,
                "duplicates": d.duplicates,
            })
        })
        .collect();
    let report = serde_json::to_string_pretty(&json!({ "runs": runs }))?;
    match std::env::var_os("E2E_BENCH_OUT") {
        Some(path) => std::fs::write(&path, report + "\n")?,
        None => println!("{report}"),
    }
    Ok(())
}
