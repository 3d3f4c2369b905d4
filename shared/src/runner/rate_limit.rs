//! Client-side flow control of the kube client, as client-go does it: a token bucket
//! paces every request ([`TokenBucket`], [`RateLimitLayer`]; client-go's
//! `flowcontrol.NewTokenBucketRateLimiter(qps, burst)`, set with `--kube-api-qps` and
//! `--kube-api-burst`), and requests the API server refuses for load (429 Too Many
//! Requests, 503 Service Unavailable with `Retry-After`) are sent again after the wait the
//! server asks for ([`RetryThrottled`]).
//!
//! The kube client (the client module) stacks them as
//! `RetryThrottled -> RateLimit -> rest_client_requests_total -> kube`, so every attempt,
//! retries included, waits for a token and is counted.
//!
//! Written here rather than taken from a crate: tower's own `RateLimit` counts requests
//! per fixed window (no burst, and it blocks in `poll_ready`); `governor`'s async wait
//! sleeps on `futures-timer` (real time, which `tokio::time::pause()` does not move) and
//! lets waiters race to re-check rather than queue in order, and it would add crates.

use std::{
    fmt,
    sync::Arc,
    task::{Context, Poll},
    time::Duration,
};

use axum::http::{HeaderMap, Request, Response, StatusCode};
use futures::future::BoxFuture;
use kube::client::Body;
use tokio::time::Instant;
use tower::{ServiceExt as _, retry::Policy};

/// No client-side limit (`--kube-api-qps` below zero, client-go's way to turn the token
/// bucket off): controller-runtime's default since v0.21, which leaves fairness to the API
/// server's Priority and Fairness.
pub(super) const DEFAULT_QPS: f32 = -1.0;

/// client-go's burst as controller-runtime configured it up to v0.20 (`--kube-api-burst`),
/// used once `--kube-api-qps` sets a rate.
pub(super) const DEFAULT_BURST: u32 = 30;

/// How many times [`RetryThrottled`] sends a request in all (the first attempt included).
pub(super) const MAX_ATTEMPTS: u32 = 5;

/// The longest [`RetryThrottled`] waits before an attempt, whatever `Retry-After` says.
pub(super) const MAX_RETRY_WAIT: Duration = Duration::from_secs(10);

/// [`RetryThrottled`]'s first wait after a 429 without `Retry-After`; doubled each time.
pub(super) const FIRST_BACKOFF: Duration = Duration::from_secs(1);

/// The client's request rate: `qps` tokens per second refill a bucket of `burst` tokens.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) struct ClientRateLimit {
    qps: f32,
    burst: u32,
}

impl ClientRateLimit {
    /// A rate of `qps` requests per second on average, `burst` at once; a negative `qps`
    /// means no limit (as in client-go).
    ///
    /// # Errors
    /// A message naming the flag (`--kube-api-qps`, `--kube-api-burst`) when `qps` is zero
    /// or not a finite number, or `burst` is zero.
    pub(super) fn new(qps: f32, burst: u32) -> Result<Self, String> {
        if !qps.is_finite() || qps == 0.0 {
            return Err(format!(
                "--kube-api-qps ({qps}) must be a finite number greater than zero, or negative for no limit"
            ));
        }
        if burst == 0 {
            return Err(format!("--kube-api-burst ({burst}) must be at least 1"));
        }
        Ok(Self { qps, burst })
    }

    /// Tokens added per second (negative: no limit).
    #[cfg(test)]
    #[must_use]
    pub(super) fn qps(&self) -> f32 {
        self.qps
    }

    /// Whether requests go out without waiting for tokens (a negative `qps`).
    #[must_use]
    pub(super) fn is_unlimited(&self) -> bool {
        self.qps < 0.0
    }

    /// The bucket's size: requests allowed at once after a quiet spell.
    #[cfg(test)]
    #[must_use]
    pub(super) fn burst(&self) -> u32 {
        self.burst
    }
}

impl Default for ClientRateLimit {
    /// [`DEFAULT_QPS`] and [`DEFAULT_BURST`].
    fn default() -> Self {
        Self {
            qps: DEFAULT_QPS,
            burst: DEFAULT_BURST,
        }
    }
}

/// A token bucket shared by all clones: it starts full with `burst` tokens, refills at
/// `qps` tokens per second up to `burst`, and [`TokenBucket::acquire`] takes one token,
/// waiting until there is one.
///
/// Kept as a single instant (the generic cell rate algorithm, the token bucket's exact
/// equivalent): `full_at` is when the bucket would be full again, so it holds
/// `burst - (full_at - now) * qps` tokens. The arithmetic is in whole nanoseconds of
/// tokio's clock (exact under `tokio::time::pause()`), and saturates instead of
/// overflowing for any valid rate.
///
/// Waiters take turns by namespace (the namespace in the request's path; cluster-wide
/// requests count as one more), round robin across the namespaces with requests waiting
/// and first come, first served within one ([`crate::runner::fair`]): one namespace's burst of
/// requests waits behind itself, not in front of another's. The one whose turn it is
/// sleeps until its token is due and takes it only then, so a waiter that is dropped (a
/// cancelled request) takes nothing, and nobody polls in a loop.
#[derive(Clone)]
pub(super) struct TokenBucket {
    shared: Arc<Bucket>,
    turns: Arc<crate::runner::fair::FairSlots>,
}

struct Bucket {
    /// No limit: every request goes out at once.
    unlimited: bool,
    /// Time one token takes to refill: `1 / qps`.
    interval: Duration,
    /// `(burst - 1) * interval`: how far `full_at` may run ahead of now before a request
    /// has to wait.
    tolerance: Duration,
    /// Zero point of `full_at`.
    origin: Instant,
    /// When the bucket is full again, as time since `origin`.
    full_at: tokio::sync::Mutex<Duration>,
}

impl fmt::Debug for TokenBucket {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TokenBucket")
            .field("interval", &self.shared.interval)
            .field("tolerance", &self.shared.tolerance)
            .finish_non_exhaustive()
    }
}

impl TokenBucket {
    /// A full bucket for `limit`.
    #[must_use]
    pub(super) fn new(limit: ClientRateLimit) -> Self {
        // Only a rate below ~5e-20 per second does not fit a Duration: then never refill.
        let interval =
            Duration::try_from_secs_f64(1.0 / f64::from(limit.qps)).unwrap_or(Duration::MAX);
        let tolerance = interval.saturating_mul(limit.burst.saturating_sub(1));
        Self {
            shared: Arc::new(Bucket {
                unlimited: limit.is_unlimited(),
                interval,
                tolerance,
                origin: Instant::now(),
                full_at: tokio::sync::Mutex::new(Duration::ZERO),
            }),
            turns: crate::runner::fair::FairSlots::new(1),
        }
    }

    /// Takes one token for a request in `namespace` (`""`: cluster-wide), first waiting for
    /// the namespace's turn and then until a token is there.
    pub(super) async fn acquire(&self, namespace: &str) {
        let bucket = &*self.shared;
        if bucket.unlimited {
            return;
        }
        let _turn = self.turns.acquire(namespace).await;
        let mut full_at = bucket.full_at.lock().await;
        let now = Instant::now().saturating_duration_since(bucket.origin);
        // An idle bucket is full, and no fuller.
        let from = (*full_at).max(now);
        let due = from.saturating_sub(bucket.tolerance);
        if due > now {
            tokio::time::sleep(due - now).await;
        }
        *full_at = from.saturating_add(bucket.interval);
    }
}

/// Makes every request of the wrapped service wait for a token of a [`TokenBucket`].
#[derive(Debug, Clone)]
pub(super) struct RateLimitLayer {
    bucket: TokenBucket,
}

impl RateLimitLayer {
    /// Every service this layer wraps takes its tokens from `bucket` (clones share it).
    #[must_use]
    pub(super) fn new(bucket: TokenBucket) -> Self {
        Self { bucket }
    }
}

impl<S> tower_layer::Layer<S> for RateLimitLayer {
    type Service = RateLimit<S>;

    fn layer(&self, inner: S) -> Self::Service {
        RateLimit {
            inner,
            bucket: self.bucket.clone(),
        }
    }
}

/// The service of [`RateLimitLayer`]: a request takes a token before it is sent.
///
/// The wait happens in the returned future, not in `poll_ready` (which is always ready),
/// so whoever drives the service (kube's buffer worker, tower's retry) is never blocked by
/// it. The token is taken when a request starts and never given back: a watch costs one
/// token when it is opened and holds none while its response streams, as in client-go.
#[derive(Debug, Clone)]
pub(super) struct RateLimit<S> {
    inner: S,
    bucket: TokenBucket,
}

/// The namespace a request is about, read off its path (`/api/v1/namespaces/<ns>/...`,
/// `/apis/<group>/<version>/namespaces/<ns>/...`); `""` for a cluster-wide one.
#[must_use]
pub(super) fn request_namespace(path: &str) -> &str {
    let mut segments = path.split('/').skip_while(|s| *s != "namespaces").skip(1);
    match (segments.next(), segments.next()) {
        // `/api/v1/namespaces/<ns>` alone is the Namespace object: cluster-wide.
        (Some(ns), Some(_)) => ns,
        _ => "",
    }
}

/// What [`RateLimit`] needs to know of a request: the namespace it is about.
pub(super) trait InNamespace {
    /// The namespace, or `""` for a cluster-wide request.
    fn namespace(&self) -> &str;
}

impl<B> InNamespace for Request<B> {
    fn namespace(&self) -> &str {
        request_namespace(self.uri().path())
    }
}

impl<S, Req> tower_service::Service<Req> for RateLimit<S>
where
    S: tower_service::Service<Req> + Clone + Send + 'static,
    S::Future: Send + 'static,
    Req: InNamespace + Send + 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = BoxFuture<'static, Result<S::Response, S::Error>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        // The inner service's readiness is awaited in the future, after the token.
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: Req) -> Self::Future {
        let inner = self.inner.clone();
        let bucket = self.bucket.clone();
        let namespace = request.namespace().to_owned();
        Box::pin(async move {
            bucket.acquire(&namespace).await;
            inner.oneshot(request).await
        })
    }
}

/// A `tower::retry::Policy` for requests the API server refused for load:
///
/// - 429 Too Many Requests: retried after `Retry-After` seconds, or, without that header,
///   after [`FIRST_BACKOFF`] doubled at each retry (1 s, 2 s, 4 s, 8 s);
/// - 503 Service Unavailable: retried only with `Retry-After` (without it the server is
///   down rather than busy; the caller's own backoff handles that);
/// - every wait capped at [`MAX_RETRY_WAIT`]; at most [`MAX_ATTEMPTS`] attempts, after
///   which the last answer (the 429 or 503) is returned to the caller;
/// - `Retry-After` is read in its seconds form (what the API server sends); an HTTP date
///   counts as absent;
/// - nothing else is retried: errors without an answer and other statuses are returned
///   at once.
///
/// Only a request whose body can be sent again is retried: one whose
/// [`kube::client::Body::try_clone`] succeeds, which is every body held in memory, and
/// so every request kube's `Api` makes (GET, LIST, WATCH, DELETE, and POST, PUT, PATCH
/// with their serialized objects). A body streamed from elsewhere is sent once.
///
/// Retrying is safe for writes too: a 429 or 503 from the API server means the request was
/// not processed. kube's own default retry (`Config::default_retry`, which also retries
/// 504 and waits up to 1,000 s, 15 times) is switched off where this policy is used, so a
/// request is not retried by both.
#[derive(Debug, Clone, Default)]
pub(super) struct RetryThrottled {
    /// Retries made so far for this request.
    retries: u32,
}

impl RetryThrottled {
    /// How long to wait before sending again after an answer with `status` and `headers`;
    /// `None` when it is not retried (given the retries already made).
    #[must_use]
    pub(super) fn wait(&self, status: StatusCode, headers: &HeaderMap) -> Option<Duration> {
        if self.retries.saturating_add(1) >= MAX_ATTEMPTS {
            return None;
        }
        let wait = match status {
            StatusCode::TOO_MANY_REQUESTS => {
                retry_after(headers).unwrap_or_else(|| backoff(self.retries))
            }
            StatusCode::SERVICE_UNAVAILABLE => retry_after(headers)?,
            _ => return None,
        };
        Some(wait.min(MAX_RETRY_WAIT))
    }
}

/// `Retry-After` in seconds, if the header holds a number.
fn retry_after(headers: &HeaderMap) -> Option<Duration> {
    let value = headers.get(axum::http::header::RETRY_AFTER)?;
    let seconds: u64 = value.to_str().ok()?.trim().parse().ok()?;
    Some(Duration::from_secs(seconds))
}

/// [`FIRST_BACKOFF`] doubled `retries` times (capped by the caller).
fn backoff(retries: u32) -> Duration {
    FIRST_BACKOFF.saturating_mul(1u32.checked_shl(retries).unwrap_or(u32::MAX))
}

impl<B, E> Policy<Request<Body>, Response<B>, E> for RetryThrottled {
    type Future = tokio::time::Sleep;

    fn retry(
        &mut self,
        request: &mut Request<Body>,
        result: &mut Result<Response<B>, E>,
    ) -> Option<Self::Future> {
        let response = result.as_ref().ok()?;
        let wait = self.wait(response.status(), response.headers())?;
        self.retries += 1;
        tracing::debug!(
            method = %request.method(),
            uri = %request.uri(),
            status = response.status().as_u16(),
            attempt = self.retries + 1,
            ?wait,
            "the API server refused the request for load; sending it again"
        );
        Some(tokio::time::sleep(wait))
    }

    fn clone_request(&mut self, request: &Request<Body>) -> Option<Request<Body>> {
        let body = request.body().try_clone()?;
        let mut copy = Request::new(body);
        *copy.method_mut() = request.method().clone();
        *copy.uri_mut() = request.uri().clone();
        *copy.version_mut() = request.version();
        *copy.headers_mut() = request.headers().clone();
        *copy.extensions_mut() = request.extensions().clone();
        Some(copy)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    impl InNamespace for u32 {
        fn namespace(&self) -> &str {
            ""
        }
    }

    #[test]
    fn the_namespace_of_a_request_is_read_off_its_path() {
        assert_eq!(request_namespace("/api/v1/namespaces/a/pods"), "a");
        assert_eq!(
            request_namespace("/apis/apps/v1/namespaces/b/deployments/d/scale"),
            "b"
        );
        assert_eq!(
            request_namespace("/api/v1/namespaces/a"),
            "",
            "the Namespace itself"
        );
        assert_eq!(request_namespace("/api/v1/pods"), "");
        assert_eq!(
            request_namespace("/apis/batch.tutorial.kubebuilder.io/v1/podsets"),
            ""
        );
    }

    #[tokio::test(start_paused = true)]
    async fn tokens_go_to_namespaces_in_turn() {
        // One token a second: a's burst of 20 is queued before b's one request.
        let bucket = bucket(1.0, 1);
        let order = Arc::new(std::sync::Mutex::new(Vec::new()));
        let start = |ns: &'static str, id: usize| {
            let (bucket, order) = (bucket.clone(), Arc::clone(&order));
            tokio::spawn(async move {
                bucket.acquire(ns).await;
                order.lock().unwrap().push(format!("{ns}{id}"));
            })
        };
        let mut tasks: Vec<_> = (0..20).map(|i| start("a", i)).collect();
        tokio::time::sleep(Duration::from_millis(10)).await;
        tasks.push(start("b", 0));
        for task in tasks {
            task.await.unwrap();
        }
        let order = order.lock().unwrap().clone();
        let b = order.iter().position(|o| o == "b0").unwrap();
        // a0 took the full bucket's token, a1 holds the turn (waiting for the next one),
        // a's turn came before b's: then b's, not the rest of the burst.
        assert!(
            b <= 3,
            "b waited at most two tokens of a's burst, not all of it: {order:?}"
        );
    }
    use std::sync::{
        Mutex,
        atomic::{AtomicU32, Ordering},
    };
    use tower::{ServiceExt, retry::RetryLayer, service_fn};
    use tower_layer::Layer;
    use tower_service::Service;

    fn bucket(qps: f32, burst: u32) -> TokenBucket {
        TokenBucket::new(ClientRateLimit::new(qps, burst).unwrap())
    }

    /// Times since the start at which requests were sent.
    type Sent = Arc<Mutex<Vec<Duration>>>;

    /// A service that records, for each request, the time since `start` it was sent at.
    #[derive(Clone)]
    struct Recorder {
        start: Instant,
        sent: Sent,
    }

    impl Service<u32> for Recorder {
        type Response = ();
        type Error = std::convert::Infallible;
        type Future = std::future::Ready<Result<(), std::convert::Infallible>>;

        fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
            Poll::Ready(Ok(()))
        }

        fn call(&mut self, _request: u32) -> Self::Future {
            self.sent.lock().unwrap().push(self.start.elapsed());
            std::future::ready(Ok(()))
        }
    }

    fn recorder(start: Instant) -> (Recorder, Sent) {
        let sent = Sent::default();
        (
            Recorder {
                start,
                sent: sent.clone(),
            },
            sent,
        )
    }

    /// (a) qps 2, burst 2: two requests at once, then one every 500 ms, so ten take 4 s,
    /// and by any time t no more than burst + qps * t were sent.
    #[tokio::test(start_paused = true)]
    async fn ten_requests_at_2_qps_and_burst_2_take_4_seconds() {
        let start = Instant::now();
        let (inner, sent) = recorder(start);
        let svc = RateLimitLayer::new(bucket(2.0, 2)).layer(inner);
        futures::future::join_all((0..10).map(|i| svc.clone().oneshot(i))).await;
        assert_eq!(start.elapsed(), Duration::from_secs(4));
        let sent = sent.lock().unwrap().clone();
        let ms: Vec<u128> = sent.iter().map(Duration::as_millis).collect();
        assert_eq!(
            ms,
            [0, 0, 500, 1000, 1500, 2000, 2500, 3000, 3500, 4000],
            "{sent:?}"
        );
        for (n, t) in sent.iter().enumerate() {
            let allowed = 2.0 + 2.0 * t.as_secs_f64();
            assert!((n + 1) as f64 <= allowed, "{} sent by {t:?}", n + 1);
        }
    }

    /// Sequential requests follow the same schedule as concurrent ones.
    #[tokio::test(start_paused = true)]
    async fn one_after_another_the_rate_is_the_same() {
        let start = Instant::now();
        let (inner, sent) = recorder(start);
        let mut svc = RateLimitLayer::new(bucket(2.0, 2)).layer(inner);
        for i in 0..10 {
            svc.ready().await.unwrap().call(i).await.unwrap();
        }
        assert_eq!(start.elapsed(), Duration::from_secs(4));
        assert_eq!(sent.lock().unwrap().len(), 10);
    }

    /// A long quiet spell fills the bucket to `burst`, not beyond.
    #[tokio::test(start_paused = true)]
    async fn an_idle_bucket_refills_to_burst_and_no_more() {
        let b = bucket(2.0, 2);
        b.acquire("").await;
        b.acquire("").await;
        tokio::time::sleep(Duration::from_secs(60)).await;
        let start = Instant::now();
        for _ in 0..3 {
            b.acquire("").await;
        }
        assert_eq!(start.elapsed(), Duration::from_millis(500));
    }

    /// Burst 1 is a steady rate from the first request; a fractional rate works.
    #[tokio::test(start_paused = true)]
    async fn burst_one_and_a_fractional_rate() {
        let b = bucket(0.5, 1);
        let start = Instant::now();
        for _ in 0..3 {
            b.acquire("").await;
        }
        assert_eq!(start.elapsed(), Duration::from_secs(4));
    }

    /// A request dropped while it waits for its token takes none: the next one gets it.
    #[tokio::test(start_paused = true)]
    async fn a_cancelled_wait_takes_no_token() {
        let b = bucket(1.0, 1);
        let start = Instant::now();
        b.acquire("").await;
        let waited = tokio::time::timeout(Duration::from_millis(500), b.acquire("")).await;
        assert!(waited.is_err(), "the second token is not due before 1 s");
        b.acquire("").await;
        assert_eq!(start.elapsed(), Duration::from_secs(1));
    }

    /// A watch takes one token when it starts; its response (which streams for as long as
    /// the watch lasts) holds none, so later requests keep the configured rate.
    #[tokio::test(start_paused = true)]
    async fn a_watch_costs_one_token_and_holds_none() {
        let start = Instant::now();
        let inner = service_fn(|req: Request<Body>| async move {
            // A "watch" answers with a stream that never ends while the watch is open.
            let (tx, rx) = tokio::sync::mpsc::channel::<()>(1);
            let keep_open = if req.uri().query() == Some("watch=true") {
                Some(tx)
            } else {
                None
            };
            Ok::<_, std::convert::Infallible>(Response::new((rx, keep_open)))
        });
        let svc = RateLimitLayer::new(bucket(1.0, 1)).layer(inner);
        let watch = svc
            .clone()
            .oneshot(
                Request::get("/api/v1/pods?watch=true")
                    .body(Body::empty())
                    .unwrap(),
            )
            .await
            .unwrap();
        for _ in 0..3 {
            svc.clone()
                .oneshot(Request::get("/api/v1/pods").body(Body::empty()).unwrap())
                .await
                .unwrap();
        }
        assert_eq!(start.elapsed(), Duration::from_secs(3));
        assert!(watch.body().1.is_some(), "the watch is still open");
    }

    /// When each request came, and its body.
    type Seen = Arc<Mutex<Vec<(Duration, Vec<u8>)>>>;

    /// Answers each request with the next status (and `Retry-After`, if any) of `script`,
    /// the last one for ever; counts calls and records when each came and its body.
    #[derive(Clone)]
    struct Scripted {
        script: Arc<Vec<(u16, Option<&'static str>)>>,
        calls: Arc<AtomicU32>,
        seen: Seen,
        start: Instant,
    }

    impl Scripted {
        fn new(script: &[(u16, Option<&'static str>)]) -> Self {
            Self {
                script: Arc::new(script.to_vec()),
                calls: Arc::new(AtomicU32::new(0)),
                seen: Seen::default(),
                start: Instant::now(),
            }
        }

        fn calls(&self) -> u32 {
            self.calls.load(Ordering::SeqCst)
        }

        fn times(&self) -> Vec<Duration> {
            self.seen.lock().unwrap().iter().map(|(t, _)| *t).collect()
        }
    }

    impl tower_service::Service<Request<Body>> for Scripted {
        type Response = Response<String>;
        type Error = std::convert::Infallible;
        type Future = BoxFuture<'static, Result<Response<String>, std::convert::Infallible>>;

        fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
            Poll::Ready(Ok(()))
        }

        fn call(&mut self, request: Request<Body>) -> Self::Future {
            let n = self.calls.fetch_add(1, Ordering::SeqCst) as usize;
            let (status, retry_after) = self.script[n.min(self.script.len() - 1)];
            let seen = self.seen.clone();
            let at = self.start.elapsed();
            Box::pin(async move {
                let body = request.into_body().collect_bytes().await.unwrap();
                seen.lock().unwrap().push((at, body.to_vec()));
                let mut response = Response::builder().status(status);
                if let Some(seconds) = retry_after {
                    response = response.header("Retry-After", seconds);
                }
                Ok(response.body(format!("attempt {}", n + 1)).unwrap())
            })
        }
    }

    fn get() -> Request<Body> {
        Request::get("/api/v1/namespaces/default/pods/p")
            .body(Body::empty())
            .unwrap()
    }

    /// (b) A 429 with `Retry-After: 2` is sent again 2 s later, and the caller gets the
    /// second answer.
    #[tokio::test(start_paused = true)]
    async fn a_429_is_retried_after_its_retry_after() {
        let server = Scripted::new(&[(429, Some("2")), (200, None)]);
        let svc = RetryLayer::new(RetryThrottled::default()).layer(server.clone());
        let response = svc.oneshot(get()).await.unwrap();
        assert_eq!(response.status(), StatusCode::OK);
        assert_eq!(response.body(), "attempt 2");
        assert_eq!(
            server.times(),
            [Duration::ZERO, Duration::from_secs(2)],
            "sent at"
        );
    }

    /// (c) After MAX_ATTEMPTS the 429 itself is returned; without `Retry-After` the waits
    /// double from 1 s.
    #[tokio::test(start_paused = true)]
    async fn after_five_attempts_the_429_is_returned() {
        let server = Scripted::new(&[(429, None)]);
        let svc = RetryLayer::new(RetryThrottled::default()).layer(server.clone());
        let response = svc.oneshot(get()).await.unwrap();
        assert_eq!(response.status(), StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(response.body(), "attempt 5");
        assert_eq!(server.calls(), MAX_ATTEMPTS);
        let secs: Vec<u64> = server.times().iter().map(Duration::as_secs).collect();
        assert_eq!(secs, [0, 1, 3, 7, 15]);
    }

    /// `Retry-After` is capped; 503 is retried only when it carries one; other answers
    /// (and other 5xx) go straight back.
    #[tokio::test(start_paused = true)]
    async fn which_answers_are_retried_and_how_long_after() {
        let start = Instant::now();
        let server = Scripted::new(&[(429, Some("3600")), (200, None)]);
        let svc = RetryLayer::new(RetryThrottled::default()).layer(server.clone());
        assert_eq!(svc.oneshot(get()).await.unwrap().status(), 200);
        assert_eq!(start.elapsed(), MAX_RETRY_WAIT);

        let server = Scripted::new(&[(503, Some("1")), (200, None)]);
        let svc = RetryLayer::new(RetryThrottled::default()).layer(server.clone());
        assert_eq!(svc.oneshot(get()).await.unwrap().status(), 200);
        assert_eq!(server.calls(), 2);

        for status in [503, 500, 504, 404, 409, 200] {
            let server = Scripted::new(&[(status, None), (200, None)]);
            let svc = RetryLayer::new(RetryThrottled::default()).layer(server.clone());
            assert_eq!(svc.oneshot(get()).await.unwrap().status(), status);
            assert_eq!(server.calls(), 1, "{status} is not retried");
        }

        // An HTTP date is not read: a 429 then backs off from 1 s.
        let start = Instant::now();
        let server = Scripted::new(&[(429, Some("Wed, 21 Oct 2015 07:28:00 GMT")), (200, None)]);
        let svc = RetryLayer::new(RetryThrottled::default()).layer(server.clone());
        assert_eq!(svc.oneshot(get()).await.unwrap().status(), 200);
        assert_eq!(start.elapsed(), FIRST_BACKOFF);
    }

    /// A write is sent again with the same body.
    #[tokio::test(start_paused = true)]
    async fn a_retried_write_sends_its_body_again() {
        let server = Scripted::new(&[(429, Some("1")), (201, None)]);
        let svc = RetryLayer::new(RetryThrottled::default()).layer(server.clone());
        let request = Request::post("/api/v1/namespaces/default/configmaps")
            .header("content-type", "application/json")
            .body(Body::from(br#"{"kind":"ConfigMap"}"#.to_vec()))
            .unwrap();
        assert_eq!(svc.oneshot(request).await.unwrap().status(), 201);
        let seen = server.seen.lock().unwrap();
        assert_eq!(seen.len(), 2);
        for (_, body) in seen.iter() {
            assert_eq!(body, br#"{"kind":"ConfigMap"}"#);
        }
    }

    /// Stacked as in `Metrics::client`, a retry waits for a token like any request.
    #[tokio::test(start_paused = true)]
    async fn retries_wait_for_a_token() {
        let server = Scripted::new(&[(429, Some("0")), (200, None)]);
        let svc = tower::ServiceBuilder::new()
            .layer(RetryLayer::new(RetryThrottled::default()))
            .layer(RateLimitLayer::new(bucket(1.0, 1)))
            .service(server.clone());
        assert_eq!(svc.oneshot(get()).await.unwrap().status(), 200);
        assert_eq!(server.times(), [Duration::ZERO, Duration::from_secs(1)]);
    }

    /// Without a limit nothing waits, even far beyond the burst.
    #[tokio::test(start_paused = true)]
    async fn no_limit_sends_at_once() {
        let bucket = TokenBucket::new(ClientRateLimit::default());
        let start = Instant::now();
        for _ in 0..1000 {
            bucket.acquire("").await;
        }
        assert_eq!(start.elapsed(), Duration::ZERO);
    }

    #[test]
    fn limits_are_validated_naming_the_flag() {
        assert_eq!(
            ClientRateLimit::new(-1.0, 30),
            Ok(ClientRateLimit::default())
        );
        assert!(ClientRateLimit::default().is_unlimited());
        assert!(!ClientRateLimit::new(20.0, 30).unwrap().is_unlimited());
        for qps in [0.0, f32::NAN, f32::INFINITY, f32::NEG_INFINITY] {
            let err = ClientRateLimit::new(qps, 1).unwrap_err();
            assert!(err.starts_with("--kube-api-qps"), "{err}");
        }
        let err = ClientRateLimit::new(1.0, 0).unwrap_err();
        assert!(err.starts_with("--kube-api-burst (0)"), "{err}");
        // The smallest rates do not overflow anything.
        let tiny = TokenBucket::new(ClientRateLimit::new(f32::MIN_POSITIVE, u32::MAX).unwrap());
        assert_eq!(tiny.shared.interval, Duration::MAX);
    }

    #[test]
    fn backoff_doubles_and_saturates() {
        assert_eq!(backoff(0), Duration::from_secs(1));
        assert_eq!(backoff(3), Duration::from_secs(8));
        assert!(backoff(64) >= MAX_RETRY_WAIT);
        let policy = RetryThrottled { retries: 3 };
        assert_eq!(
            policy.wait(StatusCode::TOO_MANY_REQUESTS, &HeaderMap::new()),
            Some(Duration::from_secs(8))
        );
        let last = RetryThrottled {
            retries: MAX_ATTEMPTS - 1,
        };
        assert_eq!(
            last.wait(StatusCode::TOO_MANY_REQUESTS, &HeaderMap::new()),
            None
        );
    }
}
