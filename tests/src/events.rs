//! The events (`events.k8s.io/v1`) a test reads: listed, waited for, matched.

use crate::{TIMEOUT, TestNamespace, list_all, poll};
use anyhow::Result;
use k8s_openapi::api::events::v1::Event;

/// The events (`events.k8s.io/v1`) in `ns` that `keep` keeps, in the order listed.
pub async fn events_where(ns: &TestNamespace, keep: impl Fn(&Event) -> bool) -> Result<Vec<Event>> {
    let mut events = list_all::<Event>(ns).await?;
    events.retain(|e| keep(e));
    Ok(events)
}

/// Waits (up to [`TIMEOUT`]) until `ns` holds events that `keep` keeps; returns them.
pub async fn wait_events(
    ns: &TestNamespace,
    what: &str,
    keep: impl Fn(&Event) -> bool,
) -> Result<Vec<Event>> {
    poll(what, TIMEOUT, || async {
        let found = events_where(ns, &keep).await?;
        Ok((!found.is_empty()).then_some(found))
    })
    .await
}

/// Whether event `e` is about the object with `uid`.
pub fn regards_uid(e: &Event, uid: &str) -> bool {
    e.regarding.as_ref().and_then(|r| r.uid.as_deref()) == Some(uid)
}
