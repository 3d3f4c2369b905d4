//! The `pulsar-consumer` app against a real Apache Pulsar broker (the
//! standalone broker of `cargo xtask pulsar up`, started on demand): Shared
//! subscription split, at-least-once delivery across a `kill -9`, and
//! reconnection across a broker restart.
//!
//! Every test has its own topic and subscription. The restart test holds the
//! broker exclusively; the others share it and may run in parallel.

use anyhow::{Context, Result, ensure};
use e2e::pulsar::{
    ConsumerProcess, Received, broker_port, exclusive_broker, expected_payloads, payload_counts,
    port_open, produce, restart_broker, shared_broker, unique_topic,
};
use e2e::{check_all_received, poll};
use std::time::{Duration, Instant};

/// Deadline of every wait for consumers (debug builds on a shared machine).
const TIMEOUT: Duration = Duration::from_secs(120);

/// Sum of the acked counters of `consumers` (all must be running).
fn acked_sum(consumers: &mut [&mut ConsumerProcess]) -> Result<u64> {
    let mut sum = 0;
    for c in consumers.iter_mut() {
        c.check_running()?;
        sum += c.counters()?.acked;
    }
    Ok(sum)
}

/// Waits until the acked counters of `consumers` add up to at least `target`.
async fn wait_acked(
    consumers: &mut [&mut ConsumerProcess],
    target: u64,
    already: u64,
) -> Result<u64> {
    poll(&format!("{target} acknowledgements"), TIMEOUT, || {
        let sum = acked_sum(consumers).map(|s| s + already);
        async move {
            let sum = sum?;
            Ok((sum >= target).then_some(sum))
        }
    })
    .await
}

fn logs_of(consumers: &[&ConsumerProcess]) -> Vec<Vec<Received>> {
    consumers.iter().map(|c| c.received()).collect()
}

/// Two consumers on one Shared subscription split the messages, and together
/// receive and acknowledge every one of them exactly once.
#[tokio::test]
async fn shared_subscription_delivers_each_message_once() -> Result<()> {
    const N: u64 = 2000;
    let (server, _broker) = shared_broker().await?;
    let topic = unique_topic("shared");
    let subscription = format!("{topic}-sub");
    let mut a = ConsumerProcess::start(&server, &topic, &subscription, "a")?;
    let mut b = ConsumerProcess::start(&server, &topic, &subscription, "b")?;
    a.wait_connected(TIMEOUT).await?;
    b.wait_connected(TIMEOUT).await?;

    let started = Instant::now();
    produce(&server, &topic, "shared", N).await?;
    wait_acked(&mut [&mut a, &mut b], N, 0).await?;
    let elapsed = started.elapsed();

    let (ca, cb) = (a.counters()?, b.counters()?);
    ensure!(
        ca.acked + cb.acked == N && ca.received + cb.received == N,
        "expected {N} received and acked, got a={ca:?} b={cb:?}"
    );
    ensure!(
        ca.errors + cb.errors == 0,
        "message errors: a={ca:?} b={cb:?}"
    );
    let logs = logs_of(&[&a, &b]);
    let counts = payload_counts(logs.iter().map(Vec::as_slice));
    let duplicates = check_all_received(&counts, &expected_payloads("shared", N))?;
    let total: usize = logs.iter().map(Vec::len).sum();
    ensure!(
        duplicates == 0 && total as u64 == N,
        "{total} messages logged for {N} sent ({duplicates} duplicates)"
    );
    ensure!(
        !logs[0].is_empty() && !logs[1].is_empty(),
        "the Shared subscription did not split the messages: a got {}, b got {}",
        logs[0].len(),
        logs[1].len()
    );
    // Message ids are unique within the topic.
    let ids: std::collections::BTreeSet<&str> =
        logs.iter().flatten().map(|r| r.id.as_str()).collect();
    ensure!(ids.len() as u64 == N, "{} distinct ids for {N}", ids.len());
    println!(
        "{N} messages in {:.1}s: a got {}, b got {}",
        elapsed.as_secs_f64(),
        logs[0].len(),
        logs[1].len()
    );

    ensure!(a.terminate()?, "consumer a did not exit 0 on SIGTERM");
    ensure!(b.terminate()?, "consumer b did not exit 0 on SIGTERM");
    Ok(())
}

/// A consumer killed with `kill -9` mid-stream loses nothing: what it had not
/// acknowledged is redelivered (to the other consumer or to its restarted
/// self), and the only duplicates are messages it received but whose
/// acknowledgement did not reach the broker.
#[tokio::test]
async fn killed_consumer_loses_no_message() -> Result<()> {
    const N: u64 = 10_000;
    let (server, _broker) = shared_broker().await?;
    let topic = unique_topic("kill");
    let subscription = format!("{topic}-sub");
    let mut a = ConsumerProcess::start(&server, &topic, &subscription, "a")?;
    let mut b = ConsumerProcess::start(&server, &topic, &subscription, "b")?;
    a.wait_connected(TIMEOUT).await?;
    b.wait_connected(TIMEOUT).await?;

    let producer = {
        let (server, topic) = (server.clone(), topic.clone());
        tokio::spawn(async move { produce(&server, &topic, "kill", N).await })
    };
    // Mid-stream: a has acknowledged some, far from all.
    let threshold = N / 20;
    let a_acked_before_kill = poll("consumer a to ack some", TIMEOUT, || {
        let acked = a.check_running().and_then(|()| a.counters());
        async move {
            let acked = acked?.acked;
            Ok((acked >= threshold).then_some(acked))
        }
    })
    .await?;
    let b_acked_before_kill = b.counters()?.acked;
    // What b had before the kill: the broker has no reason to send any of it again.
    let b_before_kill: std::collections::BTreeSet<String> =
        b.received().into_iter().map(|r| r.payload).collect();
    a.kill_9()?;
    ensure!(
        a_acked_before_kill + b_acked_before_kill < N,
        "the consumers were done before the kill; nothing was tested"
    );
    let a_log = a.received();
    let a_logged = a_log.len() as u64;
    println!(
        "killed a (pid {}) after {a_acked_before_kill}+ acks ({a_logged} logged), b had {b_acked_before_kill}",
        a.pid()
    );

    let mut a2 = ConsumerProcess::start(&server, &topic, &subscription, "a-restarted")?;
    a2.wait_connected(TIMEOUT).await?;
    producer.await.context("producer task")??;

    // a acknowledged every message it logged except, perhaps, the one in its
    // hands (it logs, then acks, one message at a time); whatever it did not
    // get acknowledged is redelivered to b or a2. So once b and a2 have
    // acknowledged N minus what a logged, every message was handled.
    let survivors_target = N.saturating_sub(a_logged);
    wait_acked(&mut [&mut b, &mut a2], survivors_target, 0).await?;
    // Redeliveries of a's last messages may still be under way: wait until
    // every payload appears in some log.
    let expected = expected_payloads("kill", N);
    let want = expected.len();
    let counts = poll("every payload in the logs", TIMEOUT, || {
        let mut logs = vec![a_log.clone()];
        logs.extend(logs_of(&[&b, &a2]));
        let counts = payload_counts(logs.iter().map(Vec::as_slice));
        async move { Ok((counts.len() == want).then_some(counts)) }
    })
    .await?;
    let duplicates = check_all_received(&counts, &expected)?;

    let (cb, ca2) = (b.counters()?, a2.counters()?);
    ensure!(
        cb.errors + ca2.errors == 0,
        "message errors: b={cb:?} a2={ca2:?}"
    );
    ensure!(
        cb.received == cb.acked && ca2.received == ca2.acked,
        "a survivor received a message it did not acknowledge: b={cb:?} a2={ca2:?}"
    );
    let acked_total = a_logged + cb.acked + ca2.acked;
    ensure!(
        acked_total >= N,
        "acknowledged {acked_total} (a: {a_logged} logged, b: {}, a2: {}) < {N}",
        cb.acked,
        ca2.acked
    );
    // Only messages that were a's can come twice: the broker redelivers what it had
    // dispatched to a and a had not (as far as the broker knows) acknowledged, whether a
    // had logged it or it still sat in a's receive queue, and Pulsar's at-least-once
    // redelivery may hand such a message to a survivor twice. A message b had received
    // before the kill was never a's.
    let foreign: Vec<&String> = counts
        .iter()
        .filter(|(p, n)| **n > 1 && b_before_kill.contains(p.as_str()))
        .map(|(p, _)| p)
        .collect();
    ensure!(
        foreign.is_empty(),
        "messages b had before the kill came again: {:?}",
        foreign.iter().take(5).collect::<Vec<_>>()
    );
    println!(
        "{N} messages: a logged {a_logged} before the kill, b acked {}, restarted a acked {}, \
         {duplicates} redelivered twice",
        cb.acked, ca2.acked
    );
    ensure!(b.terminate()?, "consumer b did not exit 0 on SIGTERM");
    ensure!(
        a2.terminate()?,
        "restarted consumer a did not exit 0 on SIGTERM"
    );
    Ok(())
}

/// The broker stops and comes back (on the same data) while two consumers are
/// mid-stream: they report it (`/healthz` 503), reconnect on their own
/// (`/healthz` 200 again, reconnect counter up) and receive every message.
#[tokio::test]
async fn consumers_survive_a_broker_restart() -> Result<()> {
    const N: u64 = 5000;
    let (server, broker) = exclusive_broker().await?;
    let port = broker_port(&server)?;
    let topic = unique_topic("restart");
    let subscription = format!("{topic}-sub");
    // Produced before the subscription exists: it starts at the earliest message.
    produce(&server, &topic, "restart", N).await?;
    let mut a = ConsumerProcess::start(&server, &topic, &subscription, "a")?;
    let mut b = ConsumerProcess::start(&server, &topic, &subscription, "b")?;

    // Mid-stream, freeze both (SIGSTOP) so that they cannot finish while
    // the broker goes down; they continue once it is down.
    let before = wait_acked(&mut [&mut a, &mut b], N / 10, 0).await?;
    let (ca, cb) = (a.counters()?, b.counters()?);
    a.pause();
    b.pause();
    let acked_at_pause = ca.acked + cb.acked;
    ensure!(
        acked_at_pause < N,
        "the consumers were done before the restart; nothing was tested"
    );
    ensure!(
        ca.reconnects == 0 && cb.reconnects == 0,
        "reconnects before the restart: a={ca:?} b={cb:?}"
    );
    println!("restarting the broker after {before}+ of {N} acks");
    let restarted = Instant::now();
    let restart = tokio::spawn(async move {
        let result = restart_broker(&broker).await;
        (result, broker)
    });
    let resume = poll("the broker to go down", TIMEOUT, || async move {
        Ok((!port_open(port)).then_some(()))
    })
    .await;
    a.resume();
    b.resume();
    resume?;

    // Both notice the outage ...
    for c in [&mut a, &mut b] {
        let what = format!("{} /healthz 503", c.name);
        c.wait_healthz(&what, 503, TIMEOUT).await?;
    }
    let (url, _broker) = restart.await.context("restart task")?;
    let url = url?;
    ensure!(url == server, "the broker came back as {url}, not {server}");
    println!(
        "broker back after {:.1}s",
        restarted.elapsed().as_secs_f64()
    );
    // ... and come back on their own.
    a.wait_connected(TIMEOUT).await?;
    b.wait_connected(TIMEOUT).await?;

    let expected = expected_payloads("restart", N);
    let want = expected.len();
    let counts = poll("every payload in the logs", TIMEOUT, || {
        let logs = logs_of(&[&a, &b]);
        let running = a.check_running().and_then(|()| b.check_running());
        let counts = payload_counts(logs.iter().map(Vec::as_slice));
        async move {
            running?;
            Ok((counts.len() == want).then_some(counts))
        }
    })
    .await?;
    let duplicates = check_all_received(&counts, &expected)?;
    let (ca, cb) = (a.counters()?, b.counters()?);
    ensure!(
        ca.reconnects >= 1 && cb.reconnects >= 1,
        "a consumer did not reconnect: a={ca:?} b={cb:?}"
    );
    ensure!(
        ca.connected == 1 && cb.connected == 1,
        "a consumer is not connected: a={ca:?} b={cb:?}"
    );
    ensure!(
        ca.acked + cb.acked >= N,
        "only {} acknowledged: a={ca:?} b={cb:?}",
        ca.acked + cb.acked
    );
    println!(
        "{N} messages: a acked {}, b acked {}, reconnects {}+{}, {duplicates} redelivered twice, \
         {:.1}s after the restart began",
        ca.acked,
        cb.acked,
        ca.reconnects,
        cb.reconnects,
        restarted.elapsed().as_secs_f64()
    );
    ensure!(a.terminate()?, "consumer a did not exit 0 on SIGTERM");
    ensure!(b.terminate()?, "consumer b did not exit 0 on SIGTERM");
    Ok(())
}
