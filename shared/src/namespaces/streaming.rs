//! Streaming lists (the API server's WatchList): whether the caches are filled with them
//! (`--streaming-lists`), and, by default, asking the API server whether it serves them.
//!
//! A streaming list is a watch with `sendInitialEvents=true`: the server sends every object
//! as an event, then a bookmark annotated `k8s.io/initial-events-end`. Servers that do not
//! serve it answer `422 Invalid` ("sendInitialEvents is forbidden for watch unless the
//! WatchList feature gate is enabled"): Kubernetes 1.27 to 1.31 (alpha, off by default),
//! 1.33 (switched back off), and any server started with `--feature-gates=WatchList=false`.
//! 1.32 and 1.34 onwards serve it by default. The gate, not the version, decides, so the
//! server is asked rather than its `/version` read: one watch that selects nothing, made
//! with the permission the cache's own watch needs anyway.

use std::{fmt, str::FromStr, time::Duration};

use futures::StreamExt;
use kube::{
    Api,
    api::{WatchEvent, WatchParams},
};

use super::Watched;

/// How the caches fill: `--streaming-lists=auto|true|false`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) enum StreamingLists {
    /// Streaming lists where the API server serves them, paged lists where it does not:
    /// each [`Scope`](super::Scope) asks the server once, before its first watch starts.
    #[default]
    Auto,
    /// Always streaming lists (`true`): against a server without them the caches never
    /// fill (each watch fails with 422 and retries).
    Always,
    /// Always paged lists (`false`), without asking.
    Never,
}

impl FromStr for StreamingLists {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.to_ascii_lowercase().as_str() {
            "auto" => Ok(Self::Auto),
            "true" | "always" => Ok(Self::Always),
            "false" | "never" => Ok(Self::Never),
            other => Err(format!(
                "`{other}` is not one of `auto` (ask the API server), `true` (always streaming lists), `false` (always paged lists)"
            )),
        }
    }
}

impl fmt::Display for StreamingLists {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Auto => "auto",
            Self::Always => "true",
            Self::Never => "false",
        })
    }
}

/// What asking the API server found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Support {
    /// It sent the bookmark that ends a streaming list.
    Served,
    /// It refused the request, or ended the watch without that bookmark: the reason.
    Refused(String),
    /// No answer either way (unreachable, no permission, overloaded): the reason. Not
    /// remembered, so the next watch of the scope asks again.
    Unknown(String),
}

/// Selects no object: `~` cannot be part of an object name, so the probe's watch carries
/// nothing but its bookmark whatever the namespace holds.
const PROBE_SELECTOR: &str = "metadata.name=shared~streaming-list-probe";
/// How long the server keeps the probe's watch open. A server that serves streaming
/// lists sends the bookmark within about a second (its bookmark timer's period); one that
/// ignores `sendInitialEvents` sends nothing until this ends the watch.
const PROBE_SERVER_TIMEOUT_SECS: u32 = 10;
/// Beyond the server's own timeout: the connection itself is stuck.
const PROBE_DEADLINE: Duration = Duration::from_secs(PROBE_SERVER_TIMEOUT_SECS as u64 + 5);

/// Whether the API server behind `api` serves streaming lists of `K`: the request kube's
/// watcher makes for one (`resourceVersion=0`, `sendInitialEvents=true`,
/// `resourceVersionMatch=NotOlderThan`, bookmarks), selecting nothing.
pub(super) async fn probe<K: Watched>(api: &Api<K>) -> Support {
    let params = WatchParams::default()
        .fields(PROBE_SELECTOR)
        .timeout(PROBE_SERVER_TIMEOUT_SECS)
        .initial_events();
    let answer = async {
        let mut events = match api.watch(&params, "0").await {
            Ok(events) => events.boxed(),
            Err(kube::Error::Api(status)) => {
                return refused_or_unknown(status.code, &status.message);
            }
            Err(error) => return Support::Unknown(error.to_string()),
        };
        while let Some(event) = events.next().await {
            match event {
                Ok(WatchEvent::Bookmark(bookmark))
                    if bookmark
                        .metadata
                        .annotations
                        .contains_key("k8s.io/initial-events-end") =>
                {
                    return Support::Served;
                }
                Ok(WatchEvent::Error(status)) => {
                    return refused_or_unknown(status.code, &status.message);
                }
                // Other bookmarks, and objects (none match the selector): keep reading.
                Ok(_) => {}
                Err(error) => return Support::Unknown(error.to_string()),
            }
        }
        Support::Refused(format!(
            "the watch ended after {PROBE_SERVER_TIMEOUT_SECS} s without the bookmark that ends a streaming list"
        ))
    };
    tokio::time::timeout(PROBE_DEADLINE, answer)
        .await
        .unwrap_or_else(|_| {
            Support::Unknown(format!("no answer within {} s", PROBE_DEADLINE.as_secs()))
        })
}

/// An error answer: 400 and 422 say the server does not take the request (an older
/// server refuses `resourceVersionMatch` on a watch with 422 too); anything else (403,
/// 429, 5xx) says nothing about streaming lists.
fn refused_or_unknown(code: u16, message: &str) -> Support {
    if matches!(code, 400 | 422) {
        Support::Refused(format!("{code}: {message}"))
    } else {
        Support::Unknown(format!("{code}: {message}"))
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use axum::http::{Request, Response};
    use k8s_openapi::api::core::v1::ConfigMap;
    use kube::{Client, client::Body};
    use serde_json::{Value, json};
    use std::sync::{Arc, Mutex};

    /// A client whose every request is answered with `code` and `body` (lines of JSON for a
    /// watch); the query strings it was asked are kept in the returned list.
    fn answering(code: u16, body: String) -> (Client, Arc<Mutex<Vec<String>>>) {
        let asked = Arc::new(Mutex::new(Vec::new()));
        let seen = Arc::clone(&asked);
        let service = tower::service_fn(move |request: Request<Body>| {
            seen.lock()
                .unwrap()
                .push(request.uri().query().unwrap_or_default().to_owned());
            let body = body.clone();
            async move {
                let mut response = Response::new(Body::from(body.into_bytes()));
                *response.status_mut() = code.try_into().unwrap();
                Ok::<_, std::convert::Infallible>(response)
            }
        });
        (Client::new(service, "default"), asked)
    }

    fn lines(events: &[Value]) -> String {
        events.iter().map(|e| format!("{e}\n")).collect()
    }

    fn bookmark(annotations: Value) -> Value {
        json!({"type": "BOOKMARK", "object": {
            "apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"resourceVersion": "42", "annotations": annotations}
        }})
    }

    #[tokio::test]
    async fn the_bookmark_that_ends_the_initial_events_means_served() {
        let body = lines(&[
            bookmark(json!({})),
            bookmark(json!({"k8s.io/initial-events-end": "true"})),
        ]);
        let (client, asked) = answering(200, body);
        let api: Api<ConfigMap> = Api::namespaced(client, "a");
        assert_eq!(probe(&api).await, Support::Served);
        // Exactly the request kube's watcher makes for a streaming list, selecting nothing.
        let query = asked.lock().unwrap().clone();
        assert_eq!(query.len(), 1);
        for part in [
            "watch=true",
            "resourceVersion=0",
            "sendInitialEvents=true",
            "resourceVersionMatch=NotOlderThan",
            "allowWatchBookmarks=true",
            "fieldSelector=metadata.name%3Dshared%7Estreaming-list-probe",
        ] {
            assert!(
                query[0].split('&').any(|p| p == part),
                "{part} in {query:?}"
            );
        }
    }

    #[tokio::test]
    async fn a_server_without_the_feature_gate_refuses() {
        // What kube-apiserver 1.33 answers (its WatchList gate is off by default).
        let status = json!({
            "kind": "Status", "apiVersion": "v1", "status": "Failure",
            "message": "ConfigMap \"\" is invalid: sendInitialEvents: Forbidden: sendInitialEvents is forbidden for watch unless the WatchList feature gate is enabled",
            "reason": "Invalid", "code": 422
        });
        let (client, _) = answering(422, status.to_string());
        let api: Api<ConfigMap> = Api::namespaced(client, "a");
        match probe(&api).await {
            Support::Refused(why) => assert!(why.contains("WatchList feature gate"), "{why}"),
            other => panic!("{other:?}"),
        }
    }

    #[tokio::test]
    async fn a_watch_that_ends_without_the_bookmark_is_refused() {
        // A server that ignores sendInitialEvents: plain bookmarks, then the end.
        let (client, _) = answering(200, lines(&[bookmark(json!({}))]));
        let api: Api<ConfigMap> = Api::namespaced(client, "a");
        assert!(matches!(probe(&api).await, Support::Refused(_)));
    }

    #[tokio::test]
    async fn forbidden_or_unreachable_says_nothing() {
        let status = json!({"kind": "Status", "apiVersion": "v1", "status": "Failure",
            "message": "configmaps is forbidden", "reason": "Forbidden", "code": 403});
        let (client, _) = answering(403, status.to_string());
        let api: Api<ConfigMap> = Api::namespaced(client, "a");
        assert!(matches!(probe(&api).await, Support::Unknown(_)));

        let offline = tower::service_fn(|_: Request<Body>| async {
            Err::<Response<Body>, _>(std::io::Error::other("offline"))
        });
        let api: Api<ConfigMap> = Api::namespaced(Client::new(offline, "default"), "a");
        assert!(matches!(probe(&api).await, Support::Unknown(_)));
    }

    #[test]
    fn the_flag_takes_auto_true_and_false() {
        assert_eq!("auto".parse(), Ok(StreamingLists::Auto));
        assert_eq!("true".parse(), Ok(StreamingLists::Always));
        assert_eq!("False".parse(), Ok(StreamingLists::Never));
        let error = "sometimes".parse::<StreamingLists>().unwrap_err();
        assert!(
            error.contains("`sometimes`") && error.contains("auto"),
            "{error}"
        );
        for mode in [
            StreamingLists::Auto,
            StreamingLists::Always,
            StreamingLists::Never,
        ] {
            assert_eq!(mode.to_string().parse(), Ok(mode));
        }
    }
}
