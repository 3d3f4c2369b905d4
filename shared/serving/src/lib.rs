//! One hardened HTTP/1 serving loop for every server of this workspace: the operators'
//! `/metrics`, `/healthz` and `/readyz` servers (crate `shared`), the lolcow web app's page
//! and probe listeners (crate `lolcow-web`) and the Pulsar consumer's `/healthz` and
//! `/metrics` (crate `pulsar-consumer`).
//!
//! `axum::serve` has no limits: a client that opens connections and never finishes its
//! request headers keeps each one (and its task and buffers) forever. [`serve`] drives
//! each connection with hyper's HTTP/1 connection builder instead and adds:
//!
//! - a **header-read timeout** ([`Limits::header_read_timeout`]): a request whose head is
//!   not complete in time closes the connection. It is one timer for the whole head: hyper
//!   starts it when the connection begins to wait for a head and resets it only once a
//!   complete head was parsed, so a client that trickles its head a byte every few seconds
//!   is closed at the same moment as one that sends nothing. It is also the **idle
//!   keep-alive timeout** (a kept-alive connection that sends no new request in time is
//!   closed), and a TLS (or other) handshake gets the same time.
//! - a **head-size limit** ([`Limits::max_header_bytes`]): a longer request line and
//!   headers are answered `431 Request Header Fields Too Large` and the connection closes.
//!   Hyper's read buffer never grows past the limit (or 8 KiB, its floor).
//! - a **connection limit** ([`Limits::max_connections`]) and a **per-peer limit**
//!   ([`Limits::max_connections_per_peer`]): a peer is a source IP address (the whole
//!   address, IPv6 too: the pods of a node share a /64 with the node's own address, which
//!   the kubelet probes from). A peer at its limit has its next connection closed at
//!   once, without reading it. When the listener is full, a connection of a peer that holds
//!   fewer connections than the peer holding the most displaces that peer's oldest
//!   connection; otherwise it is closed. So one client, or a few, can neither take every
//!   slot nor keep out a peer that holds few (the kubelet, a scraper) for longer than it
//!   takes to accept it.
//! - **socket buffers** ([`Limits::socket_buffer_bytes`]): the kernel's receive and send
//!   buffers of every connection are fixed (no autotuning), so a client that stops reading
//!   its answers, or sends faster than they are read, pins a known amount of kernel memory,
//!   which the container's memory limit counts too.
//! - a **request body limit** ([`Limits::max_body_bytes`]): a declared `Content-Length`
//!   over the limit is answered `413 Payload Too Large` without reading the body, and
//!   a chunked body is cut off at the limit (axum's body extractors then answer 413).
//! - **graceful shutdown**: when the shutdown future resolves, no new connection is
//!   accepted, idle connections close, requests in flight finish (within
//!   [`Limits::shutdown_grace`]).
//!
//! # Worst-case memory
//!
//! Every connection slot holds at most [`Limits::connection_bytes`]: hyper's read buffer
//! (the head limit, at least 8 KiB), its 8 KiB write buffer, the kernel's receive and send
//! buffers (the kernel doubles what is asked, for its bookkeeping) and about 8 KiB of
//! state (the task, hyper's connection, the socket), plus the answer being sent. A listener
//! therefore holds at most [`Limits::worst_case_bytes`], and the presets keep that far below
//! the memory limit of the container that runs them:
//!
//! | listener | connections (per peer) | head | per connection | worst case |
//! | --- | --- | --- | --- | --- |
//! | [`Limits::PUBLIC`] (a page anyone reaches) | 256 (64) | 16 KiB | 64 KiB + answer | 16 MiB + 256 answers |
//! | [`Limits::PROBES`] (the kubelet) | 64 (8) | 8 KiB | 56 KiB + answer | 3.5 MiB + 64 answers |
//! | [`Limits::METRICS`] (scrapers) | 64 (8) | 8 KiB | 56 KiB + answer | 3.5 MiB + 64 answers |
//!
//! Measured (the process's resident memory, 1,000 connections that each sent a head one
//! byte short of the limit): 18 KiB per connection with 8 KiB heads, 27 KiB with 16 KiB
//! heads, so the figures above, which also count the kernel's buffers, are upper bounds.
//! Before these limits every listener took 1,024 connections with 64 KiB heads: 82 KiB
//! each measured the same way, 82 MiB per listener, with autotuned kernel buffers (up to
//! 128 KiB of receive buffer each by default) on top, against 64 MiB (lolcow-web, one
//! listener) and 128 MiB (an operator, two listeners).

use std::{
    collections::{HashMap, VecDeque},
    convert::Infallible,
    future::Future,
    io,
    net::{IpAddr, SocketAddr},
    sync::{Arc, Mutex, PoisonError},
    time::Duration,
};

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
    sync::{Notify, Semaphore, watch},
};
use tower_service::Service;

const KIB: usize = 1024;

/// Hyper's smallest read buffer (its `max_buf_size` floor) and the capacity of the write
/// buffer it allocates for every connection.
const HYPER_BUFFER_BYTES: usize = 8 * KIB;

/// What one connection costs besides its buffers, rounded up: the task and its future,
/// hyper's connection state, this loop's bookkeeping, and the kernel's socket objects.
const CONNECTION_STATE_BYTES: usize = 8 * KIB;

/// The limits of one server. Pick the preset of the listener's kind ([`Limits::PUBLIC`],
/// [`Limits::PROBES`], [`Limits::METRICS`]) and change single fields from there.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Time a client has to send a request's complete head once the connection waits
    /// for one (after it opens, or after the previous response on a kept-alive
    /// connection), and to finish a TLS handshake.
    pub header_read_timeout: Duration,
    /// Connections served at once (at least 1).
    pub max_connections: u32,
    /// Connections served at once from one peer (source IP address), at least 1.
    pub max_connections_per_peer: u32,
    /// Largest request body accepted, in bytes.
    pub max_body_bytes: usize,
    /// Largest request head (request line and headers), in bytes. Hyper buffers at
    /// least 8 KiB whatever this is.
    pub max_header_bytes: usize,
    /// The kernel's receive and send buffer of each connection, as asked with
    /// `SO_RCVBUF`/`SO_SNDBUF` (the kernel doubles it); 0 leaves the kernel's autotuned
    /// defaults.
    pub socket_buffer_bytes: u32,
    /// How long requests in flight get to finish after shutdown begins.
    pub shutdown_grace: Duration,
}

impl Limits {
    /// A page anyone may reach (lolcow-web on its NodePort): 256 connections, 64 per
    /// peer, 16 KiB heads (a browser's cookies for the host name ride along), 64 KiB
    /// bodies, 10 s to send a head (and idle keep-alive), 8 KiB socket buffers, 10 s to
    /// drain. Worst case 16 MiB plus the answers in flight (lolcow-web's page is ~5 KiB:
    /// under 18 MiB against its 64 MiB limit).
    ///
    /// The per-peer limit is a quarter of the slots and not less because clients behind
    /// one address (a NAT, or every client of a NodePort whose Service masquerades their
    /// address, as `externalTrafficPolicy: Cluster` does) share it.
    pub const PUBLIC: Limits = Limits {
        header_read_timeout: Duration::from_secs(10),
        max_connections: 256,
        max_connections_per_peer: 64,
        max_body_bytes: 64 * KIB,
        max_header_bytes: 16 * KIB,
        socket_buffer_bytes: 8 * 1024,
        shutdown_grace: Duration::from_secs(10),
    };

    /// Health probes (`/healthz`, `/readyz`) for the kubelet, which opens one short
    /// connection per probe with a head of ~150 bytes: 64 connections, 8 per peer, 8 KiB
    /// heads, 16 KiB bodies (probes send none), 10 s to send a head, 8 KiB socket
    /// buffers, 10 s to drain. Worst case 3.5 MiB plus 64 answers of a few bytes.
    ///
    /// A pod that floods the port holds 8 slots; the kubelet, holding fewer, displaces
    /// a connection of whoever holds the most when all 64 are taken.
    pub const PROBES: Limits = Limits {
        header_read_timeout: Duration::from_secs(10),
        max_connections: 64,
        max_connections_per_peer: 8,
        max_body_bytes: 16 * KIB,
        max_header_bytes: 8 * KIB,
        socket_buffer_bytes: 8 * 1024,
        shutdown_grace: Duration::from_secs(10),
    };

    /// `/metrics` for scrapers (Prometheus keeps one connection per target alive; its
    /// head, with a bearer token of ~1-2 KiB, fits 8 KiB): the numbers of
    /// [`Limits::PROBES`]. Worst case 3.5 MiB plus 64 answers (an operator's exposition
    /// is tens of KiB; over HTTPS only an authorized scraper gets one, and TLS adds
    /// rustls's buffers of up to ~34 KiB per connection: ~8 MiB in all).
    pub const METRICS: Limits = Limits::PROBES;

    /// The most one connection holds besides the answer it is sending: hyper's read
    /// buffer (the head limit, at least 8 KiB, rounded up to a power of two as it grows)
    /// and write buffer, the kernel's receive and send buffers, and its state.
    #[must_use]
    pub const fn connection_bytes(&self) -> usize {
        let head = if self.max_header_bytes > HYPER_BUFFER_BYTES {
            self.max_header_bytes.next_power_of_two()
        } else {
            HYPER_BUFFER_BYTES
        };
        // The kernel doubles SO_RCVBUF and SO_SNDBUF; 0 leaves its defaults, which grow.
        let kernel = 2 * 2 * self.socket_buffer_bytes as usize;
        head + HYPER_BUFFER_BYTES + kernel + CONNECTION_STATE_BYTES
    }

    /// The most the listener holds with every slot taken, each sending an answer of
    /// `largest_answer` bytes (see the module docs).
    #[must_use]
    pub const fn worst_case_bytes(&self, largest_answer: usize) -> usize {
        self.max_connections as usize * (self.connection_bytes() + largest_answer)
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
    limit_socket_buffers(&listener, limits.socket_buffer_bytes);
    let max_connections = limits.max_connections.max(1);
    let admission = Arc::new(Admission::new(&limits));
    // Every connection task holds a slot until it ends: admission counts connections,
    // the slots count tasks (an evicted connection's task may still be ending).
    let slots = Arc::new(Semaphore::new(max_connections as usize));
    let (stop_tx, stop_rx) = watch::channel(false);
    tokio::pin!(shutdown);
    loop {
        let (stream, addr) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(error) => {
                    // Out of file descriptors and the like: pause instead of spinning.
                    tracing::warn!(%error, "accepting a connection failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
            () = &mut shutdown => break,
        };
        let ticket = match admission.admit(Peer::of(addr)) {
            Ok(ticket) => ticket,
            Err(refused) => {
                // Debug only: the client chooses how often this happens.
                tracing::debug!(peer = %addr.ip(), reason = refused.reason(), "connection refused");
                drop(stream);
                continue;
            }
        };
        // Free at once, or (after an eviction) as soon as the evicted task has ended.
        let permit = tokio::select! {
            permit = slots.clone().acquire_owned() => match permit {
                Ok(permit) => permit,
                Err(_closed) => break,
            },
            () = &mut shutdown => break,
        };
        let (handshake, router, stop) = (handshake.clone(), router.clone(), stop_rx.clone());
        tokio::spawn(async move {
            let evicted = ticket.evicted();
            tokio::select! {
                () = connection(stream, handshake, router, limits, stop) => {}
                () = evicted.notified() => {
                    tracing::debug!(peer = %addr.ip(), "connection closed for another peer's");
                }
            }
            drop(ticket);
            drop(permit);
        });
    }
    drop(listener);
    stop_tx.send_replace(true);
    // All slots back = all connection tasks done.
    let drained =
        tokio::time::timeout(limits.shutdown_grace, slots.acquire_many(max_connections)).await;
    if drained.is_err() {
        tracing::warn!(grace = ?limits.shutdown_grace, "connections still open after the shutdown grace period");
    }
}

/// Fixes the kernel's receive and send buffers of the connections `listener` accepts
/// (they inherit the listener's), so autotuning cannot grow them per connection.
fn limit_socket_buffers(listener: &TcpListener, bytes: u32) {
    if bytes == 0 {
        return;
    }
    let socket = socket2::SockRef::from(listener);
    let bytes = bytes as usize;
    if let Err(error) = socket.set_recv_buffer_size(bytes) {
        tracing::warn!(%error, "cannot limit the receive buffer of connections");
    }
    if let Err(error) = socket.set_send_buffer_size(bytes) {
        tracing::warn!(%error, "cannot limit the send buffer of connections");
    }
}

/// What a connection counts against: its source IP address, an IPv4-mapped IPv6 one as
/// IPv4. Not an IPv6 prefix: a node's pods and the node's address (the kubelet's) often
/// share one /64, and a pod cannot take more addresses than it is given.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
struct Peer(IpAddr);

impl Peer {
    fn of(addr: SocketAddr) -> Peer {
        Peer(addr.ip().to_canonical())
    }
}

/// Why a connection was not admitted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Refused {
    /// Its peer holds [`Limits::max_connections_per_peer`] connections.
    PeerAtLimit,
    /// Every slot is taken and no peer holds more than the newcomer's peer would.
    AtLimit,
}

impl Refused {
    fn reason(self) -> &'static str {
        match self {
            Refused::PeerAtLimit => "the peer is at its connection limit",
            Refused::AtLimit => "every connection slot is taken, none of a peer holding more",
        }
    }
}

/// Which connections are open, by peer, oldest first; decides who gets a slot.
#[derive(Debug)]
struct Admission {
    max_total: usize,
    max_per_peer: usize,
    table: Mutex<Table>,
}

#[derive(Debug, Default)]
struct Table {
    open: usize,
    next_id: u64,
    peers: HashMap<Peer, VecDeque<Held>>,
}

/// One admitted connection: its id and how to make it close.
#[derive(Debug)]
struct Held {
    id: u64,
    evict: Arc<Notify>,
}

/// An admitted connection's place in the [`Admission`] table; gives it back when dropped.
#[derive(Debug)]
struct Ticket {
    admission: Arc<Admission>,
    peer: Peer,
    id: u64,
    evict: Arc<Notify>,
}

impl Admission {
    fn new(limits: &Limits) -> Admission {
        Admission {
            max_total: limits.max_connections.max(1) as usize,
            max_per_peer: limits.max_connections_per_peer.max(1) as usize,
            table: Mutex::default(),
        }
    }

    fn table(&self) -> std::sync::MutexGuard<'_, Table> {
        self.table.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Admits a connection of `peer`, displacing the oldest connection of the peer that
    /// holds the most when every slot is taken and that peer holds at least two more
    /// than `peer` (so the displacement evens them out, and never swaps like for like).
    fn admit(self: &Arc<Self>, peer: Peer) -> Result<Ticket, Refused> {
        let mut table = self.table();
        let mine = table.peers.get(&peer).map_or(0, VecDeque::len);
        if mine >= self.max_per_peer {
            return Err(Refused::PeerAtLimit);
        }
        if table.open >= self.max_total {
            let victim = table
                .peers
                .iter()
                .map(|(p, held)| (*p, held.len()))
                .max_by_key(|(_, n)| *n)
                .filter(|(_, n)| *n > mine + 1)
                .map(|(p, _)| p);
            let Some(victim) = victim else {
                return Err(Refused::AtLimit);
            };
            table.evict_oldest(victim);
        }
        let id = table.next_id;
        table.next_id += 1;
        let evict = Arc::new(Notify::new());
        table.peers.entry(peer).or_default().push_back(Held {
            id,
            evict: evict.clone(),
        });
        table.open += 1;
        Ok(Ticket {
            admission: self.clone(),
            peer,
            id,
            evict,
        })
    }
}

impl Table {
    /// Tells the oldest connection of `peer` to close and forgets it.
    fn evict_oldest(&mut self, peer: Peer) {
        let Some(held) = self.peers.get_mut(&peer) else {
            return;
        };
        if let Some(oldest) = held.pop_front() {
            // Stored if the task is not waiting yet: it then ends at its first poll.
            oldest.evict.notify_one();
            self.open -= 1;
        }
        if held.is_empty() {
            self.peers.remove(&peer);
        }
    }
}

impl Ticket {
    /// Notified when the connection is to close for another peer's.
    fn evicted(&self) -> Arc<Notify> {
        self.evict.clone()
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        let mut table = self.admission.table();
        let Some(held) = table.peers.get_mut(&self.peer) else {
            return;
        };
        // Absent when it was evicted (and counted out then).
        if let Some(i) = held.iter().position(|h| h.id == self.id) {
            held.remove(i);
            let now_empty = held.is_empty();
            table.open -= 1;
            if now_empty {
                table.peers.remove(&self.peer);
            }
        }
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
        .max_header_size(limits.max_header_bytes)
        .max_buf_size(limits.max_header_bytes.max(HYPER_BUFFER_BYTES));
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
    use std::net::Ipv4Addr;
    use std::time::Instant;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpSocket;

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

    /// A connection to `addr` from the loopback address 127.0.0.`host` (all of 127/8 is
    /// the loopback interface on Linux): a peer of its own for the server.
    async fn connect_from(host: u8, addr: SocketAddr) -> TcpStream {
        let socket = TcpSocket::new_v4().unwrap();
        socket
            .bind(SocketAddr::from((Ipv4Addr::new(127, 0, 0, host), 0)))
            .unwrap();
        socket.connect(addr).await.unwrap()
    }

    /// `n` connections from 127.0.0.`host` that sent half a request head.
    async fn half_written(host: u8, addr: SocketAddr, n: usize) -> Vec<TcpStream> {
        let mut held = Vec::with_capacity(n);
        for _ in 0..n {
            let mut s = connect_from(host, addr).await;
            s.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n").await.unwrap();
            held.push(s);
        }
        held
    }

    /// Sends `request` on `stream` and reads the whole answer (until EOF or reset).
    async fn exchange_on(mut stream: TcpStream, request: &str) -> String {
        let _ = stream.write_all(request.as_bytes()).await;
        let mut out = Vec::new();
        let mut buf = [0_u8; 4096];
        tokio::time::timeout(Duration::from_secs(5), async {
            loop {
                match stream.read(&mut buf).await {
                    Ok(0) | Err(_) => break,
                    Ok(n) => out.extend_from_slice(&buf[..n]),
                }
            }
        })
        .await
        .expect("answer within 5 s");
        String::from_utf8_lossy(&out).into_owned()
    }

    /// Sends `request` on a new connection from 127.0.0.1 and reads the whole answer.
    async fn exchange(addr: SocketAddr, request: &str) -> String {
        exchange_on(TcpStream::connect(addr).await.unwrap(), request).await
    }

    const GET: &str = "GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n";

    /// Reads until EOF or error; returns whether the server closed the connection within
    /// `deadline`.
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

    /// Generous limits (many connections per peer) with a short header-read timeout.
    fn short(timeout_ms: u64) -> Limits {
        Limits {
            header_read_timeout: Duration::from_millis(timeout_ms),
            max_connections: 1024,
            max_connections_per_peer: 1024,
            ..Limits::PUBLIC
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn half_written_requests_neither_block_others_nor_stay_open() {
        let (addr, _stop, _task) = start(short(1500)).await;
        let mut idle = half_written(2, addr, 300).await;
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
    async fn a_head_trickled_byte_by_byte_is_closed_at_the_header_read_timeout() {
        let timeout = Duration::from_millis(600);
        let (addr, _stop, _task) = start(short(600)).await;
        let mut s = TcpStream::connect(addr).await.unwrap();
        let opened = Instant::now();
        s.write_all(b"GET / HTTP/1.1\r\nX-Slow: ").await.unwrap();
        // One byte every 50 ms: were the timer per read, this would stay open for ever.
        let mut buf = [0_u8; 256];
        let closed_after = loop {
            assert!(
                opened.elapsed() < Duration::from_secs(5),
                "a trickled head kept the connection open for 5 s"
            );
            if s.write_all(b"a").await.is_err() {
                break opened.elapsed();
            }
            let read = tokio::time::timeout(Duration::from_millis(50), s.read(&mut buf)).await;
            if let Ok(Ok(0) | Err(_)) = read {
                break opened.elapsed();
            }
        };
        assert!(
            closed_after >= timeout - Duration::from_millis(50),
            "closed after {closed_after:?}, before the {timeout:?} timeout"
        );
        assert!(
            closed_after < timeout * 3,
            "closed only after {closed_after:?}: the timeout did not count from the start of the head"
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

    /// A request whose head is `len` bytes long (a padding header fills it).
    fn head_of(len: usize) -> String {
        let start = "GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\nX-Pad: ";
        let end = "\r\n\r\n";
        format!("{start}{}{end}", "a".repeat(len - start.len() - end.len()))
    }

    #[tokio::test]
    async fn heads_over_the_limit_are_answered_431() {
        for limits in [Limits::PROBES, Limits::PUBLIC] {
            let limit = limits.max_header_bytes;
            let (addr, _stop, _task) = start(limits).await;
            let fits = exchange(addr, &head_of(limit - 100)).await;
            assert!(fits.starts_with("HTTP/1.1 200"), "{limit}: {fits}");
            // Exactly `limit` bytes that do not end the head: the server reads them all,
            // so its answer is not lost to a reset.
            let partial = &head_of(limit + 100)[..limit];
            let refused = exchange(addr, partial).await;
            assert!(refused.starts_with("HTTP/1.1 431"), "{limit}: {refused}");
            // A complete head over the limit: 431, or a reset when the server closed with
            // the rest unread; never served.
            let over = exchange(addr, &head_of(limit + 1)).await;
            assert!(
                over.is_empty() || over.starts_with("HTTP/1.1 431"),
                "{limit}: {over}"
            );
        }
        // Below hyper's 8 KiB buffer floor the limit still holds.
        let (addr, _stop, _task) = start(Limits {
            max_header_bytes: 1024,
            ..Limits::PROBES
        })
        .await;
        assert!(
            exchange(addr, &head_of(900))
                .await
                .starts_with("HTTP/1.1 200")
        );
        let refused = exchange(addr, &head_of(1500)).await;
        assert!(refused.starts_with("HTTP/1.1 431"), "{refused}");
    }

    #[tokio::test]
    async fn a_peer_at_its_limit_is_closed_while_another_peer_is_served() {
        let limits = Limits {
            max_connections: 100,
            max_connections_per_peer: 3,
            ..Limits::PUBLIC
        };
        let (addr, _stop, _task) = start(limits).await;
        let mut held = half_written(2, addr, 3).await;
        // The fourth of the same peer is closed at once, without an answer...
        let started = Instant::now();
        let fourth = exchange_on(connect_from(2, addr).await, GET).await;
        assert_eq!(fourth, "", "the fourth connection of a peer was served");
        assert!(started.elapsed() < Duration::from_secs(2));
        // ...while another peer is served.
        let other = exchange_on(connect_from(3, addr).await, GET).await;
        assert!(other.starts_with("HTTP/1.1 200"), "{other}");
        // The three held are still open (the header timeout is 10 s).
        for s in &mut held {
            assert!(!closed_within(s, Duration::from_millis(100)).await);
        }
        // Once one of them is gone, the peer gets a slot again.
        drop(held.pop());
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            let again = exchange_on(connect_from(2, addr).await, GET).await;
            if again.starts_with("HTTP/1.1 200") {
                break;
            }
            assert!(Instant::now() < deadline, "no slot came free: {again:?}");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    #[tokio::test]
    async fn when_full_a_newcomer_displaces_the_oldest_connection_of_the_biggest_peer() {
        let limits = Limits {
            max_connections: 4,
            max_connections_per_peer: 4,
            ..Limits::PUBLIC
        };
        let (addr, _stop, _task) = start(limits).await;
        // Peer .2 takes every slot.
        let mut big = half_written(2, addr, 4).await;
        // A newcomer is served at once; the first of .2's connections made room.
        let started = Instant::now();
        let answer = exchange_on(connect_from(3, addr).await, GET).await;
        assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
        assert!(started.elapsed() < Duration::from_secs(2));
        assert!(closed_within(&mut big[0], Duration::from_secs(2)).await);
        for s in &mut big[1..] {
            assert!(!closed_within(s, Duration::from_millis(100)).await);
        }
        // .2 holds 3, .4 takes the last slot; a second one of .4 (holding 1 against
        // .2's 3) gets in too, and .2 gives up its oldest.
        let mut small = half_written(4, addr, 1).await;
        small.extend(half_written(4, addr, 1).await);
        assert!(closed_within(&mut big[1], Duration::from_secs(2)).await);
        // Now both hold two: a third connection of either would not even them out, so
        // it is refused and nobody is displaced.
        for host in [2, 4] {
            let refused = exchange_on(connect_from(host, addr).await, GET).await;
            assert_eq!(refused, "", "127.0.0.{host} got a third slot");
        }
        for s in big[2..].iter_mut().chain(&mut small) {
            assert!(!closed_within(s, Duration::from_millis(100)).await);
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn probes_answer_while_the_public_listener_is_saturated() {
        let (public, _stop_public, _public_task) = start(Limits::PUBLIC).await;
        let (probes, _stop_probes, _probes_task) = start(Limits::PROBES).await;
        // Five peers with 64 half-written connections each: more than the 256 slots.
        let mut flood = Vec::new();
        for host in 2..7 {
            flood.extend(half_written(host, public, 64).await);
        }
        // The same peers still reach the probes, at once.
        let started = Instant::now();
        for host in 2..7 {
            let answer = exchange_on(connect_from(host, probes).await, GET).await;
            assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
        }
        assert!(
            started.elapsed() < Duration::from_secs(1),
            "probes answered after {:?}",
            started.elapsed()
        );
        // And a new peer still gets the page.
        let answer = exchange_on(connect_from(9, public).await, GET).await;
        assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
        drop(flood);
    }

    #[tokio::test]
    async fn connections_get_the_fixed_socket_buffers() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let _client = TcpStream::connect(addr).await.unwrap();
        let (default, _) = listener.accept().await.unwrap();
        let autotuned = socket2::SockRef::from(&default).recv_buffer_size().unwrap();
        limit_socket_buffers(&listener, 8192);
        let _client = TcpStream::connect(addr).await.unwrap();
        let (accepted, _) = listener.accept().await.unwrap();
        let socket = socket2::SockRef::from(&accepted);
        // Linux doubles what is asked (for its bookkeeping) and no longer autotunes.
        for size in [
            socket.recv_buffer_size().unwrap(),
            socket.send_buffer_size().unwrap(),
        ] {
            assert!((8192..=16384).contains(&size), "{size}");
        }
        assert!(
            autotuned > 16384,
            "the default was already small: {autotuned}"
        );
    }

    #[test]
    fn peers_are_source_addresses_whatever_the_port() {
        let peer = |s: &str| Peer::of(s.parse().unwrap());
        assert_eq!(peer("10.0.0.1:1"), peer("10.0.0.1:2"));
        assert_ne!(peer("10.0.0.1:1"), peer("10.0.0.2:1"));
        assert_eq!(peer("[2001:db8::1]:1"), peer("[2001:db8::1]:2"));
        assert_ne!(peer("[2001:db8::1]:1"), peer("[2001:db8::2]:1"));
        assert_eq!(peer("[::ffff:10.0.0.1]:1"), peer("10.0.0.1:1"));
    }

    #[test]
    fn presets_stay_far_below_the_memory_limits_of_their_containers() {
        const MIB: usize = 1024 * 1024;
        // lolcow-web (64 MiB): the page listener with ~5 KiB pages and its probes.
        let web = Limits::PUBLIC.worst_case_bytes(8 * KIB) + Limits::PROBES.worst_case_bytes(KIB);
        assert!(web < 24 * MIB, "{} MiB", web / MIB);
        // An operator (128 MiB): probes, and HTTPS metrics of up to 64 KiB with TLS.
        let operator = Limits::PROBES.worst_case_bytes(KIB)
            + Limits::METRICS.worst_case_bytes(64 * KIB + 34 * KIB);
        assert!(operator < 16 * MIB, "{} MiB", operator / MIB);
        // Before: 1,024 connections with 64 KiB heads and autotuned buffers.
        let before = Limits {
            max_connections: 1024,
            max_header_bytes: 64 * KIB,
            socket_buffer_bytes: 0,
            ..Limits::PUBLIC
        };
        assert!(before.worst_case_bytes(0) >= 80 * MIB);
    }

    #[tokio::test]
    async fn bodies_over_the_limit_are_refused() {
        let limits = Limits {
            max_body_bytes: 16,
            ..Limits::PUBLIC
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
        let (addr, stop, task) = start(Limits::PUBLIC).await;
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
