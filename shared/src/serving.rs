//! One hardened HTTP/1 serving loop for every server of this workspace: the operators'
//! `/metrics`, `/healthz` and `/readyz` servers (crate `shared`) and the lolcow web app
//! on its NodePort (crate `lolcow-web`).
//!
//! `axum::serve` has no limits: a client that opens connections and never finishes its
//! request headers keeps each one (and its task and buffers) forever. [`serve`] drives
//! each connection with hyper's HTTP/1 connection builder instead and adds:
//!
//! - a **header-read timeout** ([`Limits::header_read_timeout`]): a request whose headers
//!   are not complete in time closes the connection. Hyper starts this timer whenever the
//!   connection waits for the head of a request, so it is also the **idle keep-alive
//!   timeout**: a kept-alive connection that sends no new request in time is closed. A
//!   TLS (or other) handshake gets the same time.
//! - a **connection limit** ([`Limits::max_connections`]): at the limit no connection is
//!   accepted until one closes (new ones wait in the kernel's backlog), as Go's
//!   `netutil.LimitListener` does. The timeouts above guarantee that slots come free.
//! - a **request body limit** ([`Limits::max_body_bytes`]): a declared `Content-Length`
//!   over the limit is answered `413 Payload Too Large` without reading the body, and
//!   a chunked body is cut off at the limit (axum's body extractors then answer 413).
//! - a **header size limit** ([`Limits::max_header_bytes`]).
//! - **graceful shutdown**: when the shutdown future resolves, no new connection is
//!   accepted, idle connections close, requests in flight finish (within
//!   [`Limits::shutdown_grace`]).

use std::{convert::Infallible, future::Future, io, sync::Arc, time::Duration};

use axum::{
    Router,
    body::Body,
    http::{Request, Response, StatusCode, header},
};
use http_body_util::Limited;
use hyper::{body::Incoming, server::conn::http1};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::{
    io::{AsyncRead, AsyncWrite},
    net::{TcpListener, TcpStream},
    sync::{Semaphore, watch},
};
use tower_service::Service;

/// The limits of one server.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Time a client has to send a request's complete headers once the connection waits
    /// for one (after it opens, or after the previous response on a kept-alive
    /// connection), and to finish a TLS handshake.
    pub header_read_timeout: Duration,
    /// Connections served at once; at the limit, accepting pauses.
    pub max_connections: u32,
    /// Largest request body accepted, in bytes.
    pub max_body_bytes: usize,
    /// Largest request head (request line and headers) buffered, in bytes (at least 8192).
    pub max_header_bytes: usize,
    /// How long requests in flight get to finish after shutdown begins.
    pub shutdown_grace: Duration,
}

impl Limits {
    /// 10 s to send headers (and the idle keep-alive limit), 1,024 connections, 64 KiB
    /// bodies, 64 KiB heads, 10 s to finish at shutdown.
    pub const DEFAULT: Limits = Limits {
        header_read_timeout: Duration::from_secs(10),
        max_connections: 1024,
        max_body_bytes: 64 * 1024,
        max_header_bytes: 64 * 1024,
        shutdown_grace: Duration::from_secs(10),
    };
}

impl Default for Limits {
    fn default() -> Self {
        Limits::DEFAULT
    }
}

/// Serves `router` over plain HTTP on `listener` until `shutdown` resolves, then drains
/// the connections (see the crate docs).
pub async fn serve_plain(
    listener: TcpListener,
    router: Router,
    limits: Limits,
    shutdown: impl Future<Output = ()> + Send,
) {
    serve(
        listener,
        router,
        limits,
        |stream| std::future::ready(Ok(stream)),
        shutdown,
    )
    .await;
}

/// Serves `router` on `listener` until `shutdown` resolves, then drains the connections.
///
/// Every accepted TCP stream first goes through `handshake` (a TLS acceptor, or the
/// identity for plain HTTP), which must finish within [`Limits::header_read_timeout`].
/// Errors of single connections are logged at debug level and never end the loop.
pub async fn serve<H, Fut, Io>(
    listener: TcpListener,
    router: Router,
    limits: Limits,
    handshake: H,
    shutdown: impl Future<Output = ()> + Send,
) where
    H: Fn(TcpStream) -> Fut + Clone + Send + Sync + 'static,
    Fut: Future<Output = io::Result<Io>> + Send + 'static,
    Io: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let slots = Arc::new(Semaphore::new(limits.max_connections as usize));
    let (stop_tx, stop_rx) = watch::channel(false);
    tokio::pin!(shutdown);
    loop {
        let permit = tokio::select! {
            permit = slots.clone().acquire_owned() => match permit {
                Ok(permit) => permit,
                Err(_closed) => break,
            },
            () = &mut shutdown => break,
        };
        let stream = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, _peer)) => stream,
                Err(error) => {
                    // Out of file descriptors and the like: pause instead of spinning.
                    tracing::warn!(%error, "accepting a connection failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
            () = &mut shutdown => break,
        };
        let (handshake, router, stop) = (handshake.clone(), router.clone(), stop_rx.clone());
        tokio::spawn(async move {
            connection(stream, handshake, router, limits, stop).await;
            drop(permit);
        });
    }
    drop(listener);
    stop_tx.send_replace(true);
    // Every connection holds a slot until it ends: all slots back = all connections done.
    let drained = tokio::time::timeout(
        limits.shutdown_grace,
        slots.acquire_many(limits.max_connections),
    )
    .await;
    if drained.is_err() {
        tracing::warn!(grace = ?limits.shutdown_grace, "connections still open after the shutdown grace period");
    }
}

/// Serves one connection until it ends or shutdown begins (then gracefully).
async fn connection<H, Fut, Io>(
    stream: TcpStream,
    handshake: H,
    router: Router,
    limits: Limits,
    mut stop: watch::Receiver<bool>,
) where
    H: Fn(TcpStream) -> Fut,
    Fut: Future<Output = io::Result<Io>>,
    Io: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let _ = stream.set_nodelay(true);
    let io = match tokio::time::timeout(limits.header_read_timeout, handshake(stream)).await {
        Ok(Ok(io)) => io,
        Ok(Err(error)) => {
            tracing::debug!(%error, "handshake failed");
            return;
        }
        Err(_elapsed) => {
            tracing::debug!("handshake timed out");
            return;
        }
    };
    let max_body = limits.max_body_bytes;
    let service = hyper::service::service_fn(move |request: Request<Incoming>| {
        let mut router = router.clone();
        async move { Ok::<_, Infallible>(handle(&mut router, request, max_body).await) }
    });
    let mut builder = http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_read_timeout)
        .keep_alive(true)
        .max_buf_size(limits.max_header_bytes.max(8192));
    let conn = builder.serve_connection(TokioIo::new(io), service);
    tokio::pin!(conn);
    let stopping = async move {
        // An error means the server is gone: stop as well.
        let _ = stop.wait_for(|stop| *stop).await;
    };
    let result = tokio::select! {
        result = conn.as_mut() => result,
        () = stopping => {
            conn.as_mut().graceful_shutdown();
            conn.await
        }
    };
    if let Err(error) = result {
        tracing::debug!(%error, "connection ended with an error");
    }
}

/// Applies the body limit and routes the request.
async fn handle(
    router: &mut Router,
    request: Request<Incoming>,
    max_body: usize,
) -> Response<Body> {
    if declared_length(&request).is_some_and(|n| n > max_body as u64) {
        return Response::builder()
            .status(StatusCode::PAYLOAD_TOO_LARGE)
            .header(header::CONTENT_TYPE, "text/plain; charset=utf-8")
            .header(header::CONNECTION, "close")
            .body(Body::from("request body too large\n"))
            .unwrap_or_else(|_| Response::new(Body::empty()));
    }
    let request = request.map(|body| Body::new(Limited::new(body, max_body)));
    match router.call(request).await {
        Ok(response) => response,
        Err(never) => match never {},
    }
}

/// The request's `Content-Length`, when it has a valid one.
fn declared_length<B>(request: &Request<B>) -> Option<u64> {
    request
        .headers()
        .get(header::CONTENT_LENGTH)?
        .to_str()
        .ok()?
        .trim()
        .parse()
        .ok()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;
    use axum::routing::{get, post};
    use std::net::SocketAddr;
    use std::time::Instant;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    fn app() -> Router {
        Router::new().route("/", get(|| async { "hello" })).route(
            "/echo",
            post(|body: String| async move { body.len().to_string() }),
        )
    }

    /// Starts a server; returns its address and a sender that shuts it down.
    async fn start(
        limits: Limits,
    ) -> (
        SocketAddr,
        tokio::sync::oneshot::Sender<()>,
        tokio::task::JoinHandle<()>,
    ) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let task = tokio::spawn(serve_plain(listener, app(), limits, async {
            let _ = rx.await;
        }));
        (addr, tx, task)
    }

    /// Sends `request` on a new connection and reads the whole answer (until EOF).
    async fn exchange(addr: SocketAddr, request: &str) -> String {
        let mut stream = TcpStream::connect(addr).await.unwrap();
        stream.write_all(request.as_bytes()).await.unwrap();
        let mut out = Vec::new();
        tokio::time::timeout(Duration::from_secs(5), stream.read_to_end(&mut out))
            .await
            .expect("answer within 5 s")
            .unwrap();
        String::from_utf8_lossy(&out).into_owned()
    }

    const GET: &str = "GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n";

    /// Reads until EOF or error; returns when the server closed the connection.
    async fn closed_within(stream: &mut TcpStream, deadline: Duration) -> bool {
        let mut buf = [0_u8; 1024];
        tokio::time::timeout(deadline, async {
            loop {
                match stream.read(&mut buf).await {
                    Ok(0) | Err(_) => return,
                    Ok(_) => {}
                }
            }
        })
        .await
        .is_ok()
    }

    fn short(timeout_ms: u64) -> Limits {
        Limits {
            header_read_timeout: Duration::from_millis(timeout_ms),
            ..Limits::DEFAULT
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn half_written_requests_neither_block_others_nor_stay_open() {
        let (addr, _stop, _task) = start(short(1500)).await;
        let mut idle = Vec::new();
        for _ in 0..300 {
            let mut s = TcpStream::connect(addr).await.unwrap();
            s.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n").await.unwrap();
            idle.push(s);
        }
        let started = Instant::now();
        let answer = exchange(addr, GET).await;
        assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
        assert!(answer.ends_with("hello"), "{answer}");
        assert!(
            started.elapsed() < Duration::from_secs(1),
            "answered after {:?} with 300 half-written connections open",
            started.elapsed()
        );
        // Every half-written connection is closed by the server after the timeout.
        for s in &mut idle {
            assert!(closed_within(s, Duration::from_secs(5)).await, "still open");
        }
        assert!(
            started.elapsed() >= Duration::from_millis(1000),
            "closed before the timeout"
        );
    }

    #[tokio::test]
    async fn idle_keep_alive_connections_are_closed() {
        let (addr, _stop, _task) = start(short(300)).await;
        let mut s = TcpStream::connect(addr).await.unwrap();
        s.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
            .await
            .unwrap();
        let mut buf = vec![0_u8; 4096];
        let n = s.read(&mut buf).await.unwrap();
        assert!(String::from_utf8_lossy(&buf[..n]).starts_with("HTTP/1.1 200"));
        let waited = Instant::now();
        assert!(closed_within(&mut s, Duration::from_secs(5)).await);
        assert!(
            waited.elapsed() >= Duration::from_millis(250),
            "{:?}",
            waited.elapsed()
        );
    }

    #[tokio::test]
    async fn at_the_connection_limit_new_connections_wait_for_a_free_slot() {
        let limits = Limits {
            max_connections: 2,
            ..short(800)
        };
        let (addr, _stop, _task) = start(limits).await;
        let mut held = Vec::new();
        for _ in 0..2 {
            let mut s = TcpStream::connect(addr).await.unwrap();
            s.write_all(b"GET / HTTP/1.1\r\n").await.unwrap();
            held.push(s);
        }
        // The kernel queues connections in order, so the held two take both slots.
        let started = Instant::now();
        let answer = exchange(addr, GET).await;
        assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
        // Served only once a held connection timed out.
        assert!(
            started.elapsed() >= Duration::from_millis(500),
            "served at once ({:?}): the limit did not hold",
            started.elapsed()
        );
    }

    #[tokio::test]
    async fn bodies_over_the_limit_are_refused() {
        let limits = Limits {
            max_body_bytes: 16,
            ..Limits::DEFAULT
        };
        let (addr, _stop, _task) = start(limits).await;
        let small = exchange(
            addr,
            "POST /echo HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Length: 5\r\n\r\nhello",
        )
        .await;
        assert!(small.starts_with("HTTP/1.1 200"), "{small}");
        assert!(small.ends_with("\r\n5"), "{small}");
        let declared = exchange(
            addr,
            "POST /echo HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Length: 100000\r\n\r\n",
        )
        .await;
        assert!(declared.starts_with("HTTP/1.1 413"), "{declared}");
        let chunked = exchange(
            addr,
            "POST /echo HTTP/1.1\r\nHost: x\r\nConnection: close\r\nTransfer-Encoding: chunked\r\n\r\n\
             14\r\n01234567890123456789\r\n0\r\n\r\n",
        )
        .await;
        assert!(chunked.starts_with("HTTP/1.1 413"), "{chunked}");
    }

    #[tokio::test]
    async fn shutdown_stops_accepting_and_ends_the_loop() {
        let (addr, stop, task) = start(Limits::DEFAULT).await;
        // An idle kept-alive connection must not hold the shutdown up.
        let mut s = TcpStream::connect(addr).await.unwrap();
        s.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
            .await
            .unwrap();
        let mut buf = vec![0_u8; 4096];
        let _ = s.read(&mut buf).await.unwrap();
        stop.send(()).unwrap();
        tokio::time::timeout(Duration::from_secs(3), task)
            .await
            .expect("serve returns promptly")
            .unwrap();
        assert!(closed_within(&mut s, Duration::from_secs(1)).await);
        assert!(TcpStream::connect(addr).await.is_err(), "still accepting");
    }
}
