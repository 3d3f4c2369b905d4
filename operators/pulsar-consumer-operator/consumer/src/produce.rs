//! The `produce` subcommand: send messages to the topic and wait for the
//! broker's receipts.

use std::collections::VecDeque;
use std::time::Duration;

use anyhow::Context;
use pulsar::producer::SendFuture;
use pulsar::{ConnectionRetryOptions, ProducerOptions};
use tracing::{debug, info};

use crate::config::ProduceConfig;
use crate::consume::{client_builder, format_message_id};

/// Messages sent ahead of their receipts; bounds memory for large counts.
const MAX_IN_FLIGHT: usize = 256;

/// The payload of message `index` (1-based) of `count`: the message itself
/// when only one is sent, else the message with a ` #<index>` suffix.
pub fn payload_for(message: &str, index: u64, count: u64) -> String {
    if count > 1 {
        format!("{message} #{index}")
    } else {
        message.to_owned()
    }
}

/// Sends `cfg.count` messages and returns how many the broker confirmed,
/// which on success is all of them.
pub async fn run(cfg: &ProduceConfig) -> anyhow::Result<u64> {
    let topic = cfg.connection.topic.as_str();
    let retry = ConnectionRetryOptions {
        min_backoff: Duration::from_millis(200),
        max_backoff: Duration::from_secs(5),
        max_retries: 5,
        connection_timeout: Duration::from_secs(10),
        ..ConnectionRetryOptions::default()
    };
    let client = client_builder(&cfg.connection, retry)?
        .build()
        .await
        .with_context(|| format!("connecting to Pulsar at {}", cfg.connection.server))?;
    // Without `block_queue_if_full` a send fails with `SlowDown` as soon as
    // the client's outbound queue (100 messages) is full; waiting for room
    // instead gives plain back-pressure.
    let options = ProducerOptions {
        block_queue_if_full: true,
        ..ProducerOptions::default()
    };
    let mut producer = client
        .producer()
        .with_topic(topic)
        .with_options(options)
        .build()
        .await
        .with_context(|| format!("creating a producer for {topic}"))?;
    info!(topic, count = cfg.count, "sending messages");

    let mut pending: VecDeque<(u64, SendFuture)> = VecDeque::new();
    let mut confirmed = 0u64;
    for index in 1..=cfg.count {
        let payload = payload_for(&cfg.message, index, cfg.count);
        let receipt = producer
            .send_non_blocking(payload)
            .await
            .with_context(|| sent_so_far(confirmed, cfg.count, index))?;
        pending.push_back((index, receipt));
        if pending.len() >= MAX_IN_FLIGHT {
            await_receipt(&mut pending, &mut confirmed, cfg.count).await?;
        }
    }
    while !pending.is_empty() {
        await_receipt(&mut pending, &mut confirmed, cfg.count).await?;
    }
    if let Err(e) = producer.close().await {
        debug!(error = %e, "could not close the producer cleanly");
    }
    Ok(confirmed)
}

/// Waits for the oldest pending receipt.
async fn await_receipt(
    pending: &mut VecDeque<(u64, SendFuture)>,
    confirmed: &mut u64,
    count: u64,
) -> anyhow::Result<()> {
    let Some((index, receipt)) = pending.pop_front() else {
        return Ok(());
    };
    let receipt = receipt
        .await
        .with_context(|| sent_so_far(*confirmed, count, index))?;
    *confirmed += 1;
    if let Some(id) = &receipt.message_id {
        debug!(index, id = format_message_id(id).as_str(), "message sent");
    }
    Ok(())
}

fn sent_so_far(confirmed: u64, count: u64, index: u64) -> String {
    format!("sending message #{index} failed ({confirmed} of {count} confirmed by the broker)")
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    #[test]
    fn single_message_has_no_suffix() {
        assert_eq!(payload_for("hello", 1, 1), "hello");
    }

    #[test]
    fn several_messages_are_numbered() {
        assert_eq!(payload_for("hello", 1, 3), "hello #1");
        assert_eq!(payload_for("hello", 3, 3), "hello #3");
        assert_eq!(payload_for("", 2, 2), " #2");
    }

    #[test]
    fn failure_message_counts() {
        assert_eq!(
            sent_so_far(4, 10, 6),
            "sending message #6 failed (4 of 10 confirmed by the broker)"
        );
    }
}
