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
//! - a **write timeout** ([`Limits::write_timeout`]): once writing a response has to wait
//!   for the client to read (the socket's send buffer is full), the client has this long
//!   to take the rest of it (and of anything written before its next request); else the
//!   connection closes. A client that asks and never reads (or reads a byte now and then,
//!   or pipelines requests it never reads the answers of) holds its slot this long, not
//!   for ever: the header-read timeout does not run while the server writes.
//! - a **connection limit** ([`Limits::max_connections`]) and a **per-peer limit**
//!   ([`Limits::max_connections_per_peer`]): a peer is a source IP address (the whole
//!   address, IPv6 too: the pods of a node share a /64 with the node's own address, which
//!   the kubelet probes from). A new connection is not refused while its own peer holds an
//!   idle connection (one not inside a request handler: waiting for a head, kept alive, or
//!   writing an answer) that has been open for a second: at the per-peer limit, or when
//!   the listener is full and no peer holds more, it takes the place of its peer's oldest
//!   such connection (the second is each connection's time to send its head, whatever
//!   rate newer ones of its address come at). So clients that
//!   share one address (behind a NAT, or every client of a NodePort whose Service
//!   masquerades their address, as `externalTrafficPolicy: Cluster` does) are never all
//!   locked out by a few of them that hold connections open: a newcomer is served, and the
//!   connection it displaces is the one that has waited longest. When the listener is
//!   full, a connection of a peer that holds fewer connections than the peer holding the
//!   most displaces that peer's oldest (idle, if it has one) connection. So one client, or
//!   a few, can neither take every slot nor keep out a peer that holds few (the kubelet, a
//!   scraper) for longer than it takes to accept it. The price of not refusing: a client
//!   opening connections as fast as it can from an address shared with others shortens
//!   the time their connections may wait for a head (to a second, at the least), and a
//!   newcomer of that address gets in only when a slot of the address has passed its
//!   second: one per slot and second, shared by whoever asks (previously the flood locked
//!   them out for as long as it lasted).
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
    pin::Pin,
    sync::{
        Arc, Mutex, PoisonError,
        atomic::{AtomicBool, Ordering},
    },
    task::{Context, Poll},
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
    io::{AsyncRead, AsyncWrite, ReadBuf},
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
    /// Connections served at once from one peer (source IP address), at least 1. At the
    /// limit, a new connection of the peer takes the place of its oldest idle one.
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
    /// How long a client has to read the rest of a response once writing it had to wait
    /// for the client (its socket's send buffer full); then the connection closes.
    pub write_timeout: Duration,
    /// How long requests in flight get to finish after shutdown begins.
    pub shutdown_grace: Duration,
}

impl Limits {
    /// A page anyone may reach (lolcow-web on its NodePort): 256 connections, 64 per
    /// peer, 16 KiB heads (a browser's cookies for the host name ride along), 64 KiB
    /// bodies, 10 s to send a head (and idle keep-alive), 10 s to read the rest of an
    /// answer once it waits, 8 KiB socket buffers, 10 s to drain. Worst case 16 MiB plus
    /// the answers in flight (lolcow-web's page is ~5 KiB: under 18 MiB against its 64 MiB
    /// limit).
    ///
    /// The per-peer limit is a quarter of the slots and not less because clients behind
    /// one address (a NAT, or every client of a NodePort whose Service masquerades their
    /// address, as `externalTrafficPolicy: Cluster` does) share it; at the limit a newcomer
    /// displaces its peer's oldest idle connection rather than being refused.
    pub const PUBLIC: Limits = Limits {
        header_read_timeout: Duration::from_secs(10),
        max_connections: 256,
        max_connections_per_peer: 64,
        max_body_bytes: 64 * KIB,
        max_header_bytes: 16 * KIB,
        socket_buffer_bytes: 8 * 1024,
        write_timeout: Duration::from_secs(10),
        shutdown_grace: Duration::from_secs(10),
    };

    /// Health probes (`/healthz`, `/readyz`) for the kubelet, which opens one short
    /// connection per probe with a head of ~150 bytes: 64 connections, 8 per peer, 8 KiB
    /// heads, 16 KiB bodies (probes send none), 10 s to send a head, 10 s to read the rest
    /// of an answer once it waits, 8 KiB socket buffers, 10 s to drain. Worst case
    /// 3.5 MiB plus 64 answers of a few bytes.
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
        write_timeout: Duration::from_secs(10),
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
            let busy = ticket.busy();
            tokio::select! {
                () = connection(stream, handshake, router, limits, stop, busy) => {}
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
    /// Its peer holds [`Limits::max_connections_per_peer`] connections, all inside a
    /// request handler.
    PeerAtLimit,
    /// Every slot is taken, no peer holds more than the newcomer's peer would, and the
    /// newcomer's peer has no idle connection to give up.
    AtLimit,
}

impl Refused {
    fn reason(self) -> &'static str {
        match self {
            Refused::PeerAtLimit => {
                "the peer is at its connection limit, every one of them inside a request"
            }
            Refused::AtLimit => {
                "every connection slot is taken, none of a peer holding more, none idle of its own"
            }
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

/// How long a new connection is safe from being displaced by a newer one of its own peer:
/// time enough for a client that shares its address with a flood to send its request head,
/// and a cap of one displacement a second per slot on how fast a flood churns them.
const OWN_PEER_GRACE: Duration = Duration::from_secs(1);

/// One admitted connection: its id, when it was admitted, how to make it close, and whether
/// it is inside a request handler now (not idle).
#[derive(Debug)]
struct Held {
    id: u64,
    since: tokio::time::Instant,
    evict: Arc<Notify>,
    busy: Arc<AtomicBool>,
}

/// Which connection of a peer [`Table::evict_oldest`] may displace.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Victim {
    /// Its oldest idle one if it has one, else its oldest.
    Oldest,
    /// Only its oldest idle one older than [`OWN_PEER_GRACE`].
    IdleAfterGrace,
}

/// An admitted connection's place in the [`Admission`] table; gives it back when dropped.
#[derive(Debug)]
struct Ticket {
    admission: Arc<Admission>,
    peer: Peer,
    id: u64,
    evict: Arc<Notify>,
    busy: Arc<AtomicBool>,
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

    /// Admits a connection of `peer`:
    /// - at the per-peer limit, in place of the peer's own oldest idle connection that has
    ///   been open for [`OWN_PEER_GRACE`] (refused when there is none: every one inside a
    ///   request handler, or newer);
    /// - when every slot is taken, in place of the oldest (idle, if it has one) connection
    ///   of the peer that holds the most, if that peer holds at least two more than `peer`
    ///   (so the displacement evens them out, and never swaps like for like); else in place
    ///   of `peer`'s own oldest idle connection past the grace; else refused.
    ///
    /// So a peer is refused only when it has nothing idle to give up: clients sharing one
    /// address are not locked out by those of them that hold connections open.
    fn admit(self: &Arc<Self>, peer: Peer) -> Result<Ticket, Refused> {
        let mut table = self.table();
        let mine = table.peers.get(&peer).map_or(0, VecDeque::len);
        if mine >= self.max_per_peer {
            if !table.evict_oldest(peer, Victim::IdleAfterGrace) {
                return Err(Refused::PeerAtLimit);
            }
        } else if table.open >= self.max_total {
            let victim = table
                .peers
                .iter()
                .map(|(p, held)| (*p, held.len()))
                .max_by_key(|(_, n)| *n)
                .filter(|(_, n)| *n > mine + 1)
                .map(|(p, _)| p);
            let made_room = match victim {
                Some(victim) => table.evict_oldest(victim, Victim::Oldest),
                None => mine > 0 && table.evict_oldest(peer, Victim::IdleAfterGrace),
            };
            if !made_room {
                return Err(Refused::AtLimit);
            }
        }
        let id = table.next_id;
        table.next_id += 1;
        let evict = Arc::new(Notify::new());
        let busy = Arc::new(AtomicBool::new(false));
        table.peers.entry(peer).or_default().push_back(Held {
            id,
            since: tokio::time::Instant::now(),
            evict: evict.clone(),
            busy: busy.clone(),
        });
        table.open += 1;
        Ok(Ticket {
            admission: self.clone(),
            peer,
            id,
            evict,
            busy,
        })
    }
}

impl Table {
    /// Tells the oldest connection of `peer` that `victim` allows to close, and forgets it.
    /// Whether there was one.
    fn evict_oldest(&mut self, peer: Peer, victim: Victim) -> bool {
        let Some(held) = self.peers.get_mut(&peer) else {
            return false;
        };
        let idle = |h: &Held| !h.busy.load(Ordering::Acquire);
        let chosen = match victim {
            Victim::Oldest => held
                .iter()
                .position(idle)
                .or((!held.is_empty()).then_some(0)),
            Victim::IdleAfterGrace => {
                let now = tokio::time::Instant::now();
                held.iter()
                    .position(|h| idle(h) && now.duration_since(h.since) >= OWN_PEER_GRACE)
            }
        };
        let Some(i) = chosen else {
            return false;
        };
        if let Some(oldest) = held.remove(i) {
            // Stored if the task is not waiting yet: it then ends at its first poll.
            oldest.evict.notify_one();
            self.open -= 1;
        }
        if held.is_empty() {
            self.peers.remove(&peer);
        }
        true
    }
}

impl Ticket {
    /// Notified when the connection is to close for another connection's.
    fn evicted(&self) -> Arc<Notify> {
        self.evict.clone()
    }

    /// Set by the connection while a request handler runs (it is not idle then).
    fn busy(&self) -> Arc<AtomicBool> {
        self.busy.clone()
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

/// Serves one connection until it ends or shutdown begins (then gracefully); `busy` is set
/// while a request handler runs.
async fn connection<H, Fut, Io>(
    stream: TcpStream,
    handshake: H,
    router: Router,
    limits: Limits,
    mut stop: watch::Receiver<bool>,
    busy: Arc<AtomicBool>,
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
    let new_request = Arc::new(AtomicBool::new(false));
    let io = WriteTimeout::new(io, limits.write_timeout, new_request.clone());
    let service = hyper::service::service_fn(move |request: Request<Incoming>| {
        let mut router = router.clone();
        let (busy, new_request) = (busy.clone(), new_request.clone());
        async move {
            new_request.store(true, Ordering::Release);
            busy.store(true, Ordering::Release);
            let response = handle(&mut router, request, max_body).await;
            busy.store(false, Ordering::Release);
            Ok::<_, Infallible>(response)
        }
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

/// A connection's I/O whose writes fail ([`io::ErrorKind::TimedOut`]) once they have waited
/// for the client longer than the write timeout: the deadline starts at the first write
/// that cannot go through at once (the socket's send buffer is full) and is dropped when the
/// next request arrives, if nothing waits to be written then. Hyper then ends the
/// connection.
struct WriteTimeout<Io> {
    io: Io,
    timeout: Duration,
    deadline: Option<Pin<Box<tokio::time::Sleep>>>,
    /// Whether the last write operation had to wait.
    waiting: bool,
    /// Set by the service for each request it gets.
    new_request: Arc<AtomicBool>,
}

impl<Io> WriteTimeout<Io> {
    fn new(io: Io, timeout: Duration, new_request: Arc<AtomicBool>) -> Self {
        Self {
            io,
            timeout,
            deadline: None,
            waiting: false,
            new_request,
        }
    }

    /// Runs the write operation `op` within the deadline.
    fn guard<T>(
        &mut self,
        cx: &mut Context<'_>,
        op: impl FnOnce(Pin<&mut Io>, &mut Context<'_>) -> Poll<io::Result<T>>,
    ) -> Poll<io::Result<T>>
    where
        Io: Unpin,
    {
        // A new request drops the deadline once what came before it is written; not while
        // a write still waits (a client pipelining requests it never reads the answers of
        // does not get a new deadline with each).
        if self.new_request.swap(false, Ordering::AcqRel) && !self.waiting {
            self.deadline = None;
        }
        let timed_out = || {
            io::Error::new(
                io::ErrorKind::TimedOut,
                "the client did not read the answer in time",
            )
        };
        if let Some(deadline) = self.deadline.as_mut()
            && deadline.as_mut().poll(cx).is_ready()
        {
            return Poll::Ready(Err(timed_out()));
        }
        let result = op(Pin::new(&mut self.io), cx);
        self.waiting = result.is_pending();
        if result.is_pending() && self.deadline.is_none() {
            let mut deadline = Box::pin(tokio::time::sleep(self.timeout));
            // Polled once so that it wakes the connection when it passes.
            if deadline.as_mut().poll(cx).is_ready() {
                return Poll::Ready(Err(timed_out()));
            }
            self.deadline = Some(deadline);
        }
        result
    }
}

impl<Io: AsyncRead + Unpin> AsyncRead for WriteTimeout<Io> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_read(cx, buf)
    }
}

impl<Io: AsyncWrite + Unpin> AsyncWrite for WriteTimeout<Io> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        self.get_mut().guard(cx, |io, cx| io.poll_write(cx, buf))
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        self.get_mut()
            .guard(cx, |io, cx| io.poll_write_vectored(cx, bufs))
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.get_mut().guard(cx, |io, cx| io.poll_flush(cx))
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.get_mut().guard(cx, |io, cx| io.poll_shutdown(cx))
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

    /// The size of `GET /large`: far more than the socket buffers of both ends hold.
    const LARGE: usize = 4 << 20;

    fn app() -> Router {
        Router::new()
            .route("/", get(|| async { "hello" }))
            .route("/large", get(|| async { "x".repeat(LARGE) }))
            .route(
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
    async fn a_peer_at_its_limit_gives_up_its_oldest_idle_connection() {
        let limits = Limits {
            max_connections: 100,
            max_connections_per_peer: 3,
            ..Limits::PUBLIC
        };
        let (addr, _stop, _task) = start(limits).await;
        let mut held = half_written(2, addr, 3).await;
        // Within their first second, the three are safe: a fourth of the peer is closed.
        let fourth = exchange_on(connect_from(2, addr).await, GET).await;
        assert_eq!(fourth, "", "a connection was displaced in its first second");
        tokio::time::sleep(OWN_PEER_GRACE + Duration::from_millis(100)).await;
        // Then the fourth of the same peer is served at once, in place of the peer's oldest...
        let started = Instant::now();
        let fourth = exchange_on(connect_from(2, addr).await, GET).await;
        assert!(fourth.starts_with("HTTP/1.1 200"), "{fourth}");
        assert!(started.elapsed() < Duration::from_secs(2));
        assert!(closed_within(&mut held[0], Duration::from_secs(2)).await);
        // ...and the others of that peer, and every other peer's, stay (the header timeout
        // is 10 s).
        let mut other = half_written(3, addr, 3).await;
        for s in held[1..].iter_mut().chain(&mut other) {
            assert!(!closed_within(s, Duration::from_millis(100)).await);
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_peer_whose_connections_are_all_inside_a_request_is_refused() {
        let admission = Arc::new(Admission::new(&Limits {
            max_connections: 4,
            max_connections_per_peer: 2,
            ..Limits::PUBLIC
        }));
        let peer = |n: u8| Peer(IpAddr::from([10, 0, 0, n]));
        let a: Vec<Ticket> = (0..2).map(|_| admission.admit(peer(1)).unwrap()).collect();
        for t in &a {
            t.busy().store(true, Ordering::Release);
        }
        tokio::time::advance(OWN_PEER_GRACE).await;
        assert_eq!(admission.admit(peer(1)).err(), Some(Refused::PeerAtLimit));
        // One of them idle again: it makes room.
        a[1].busy().store(false, Ordering::Release);
        let third = admission.admit(peer(1)).unwrap();
        assert_eq!(admission.table().open, 2);
        assert_eq!(
            admission.table().peers[&peer(1)]
                .iter()
                .map(|h| h.id)
                .collect::<Vec<_>>(),
            [a[0].id, third.id]
        );
        drop((a, third));
        assert_eq!(admission.table().open, 0);
        assert!(admission.table().peers.is_empty());

        // Full, two peers at one each, both inside a request: neither evens out by taking
        // the other's, and neither has an idle one of its own to give up.
        let admission = Arc::new(Admission::new(&Limits {
            max_connections: 2,
            max_connections_per_peer: 2,
            ..Limits::PUBLIC
        }));
        let a = admission.admit(peer(1)).unwrap();
        let b = admission.admit(peer(2)).unwrap();
        a.busy().store(true, Ordering::Release);
        b.busy().store(true, Ordering::Release);
        tokio::time::advance(OWN_PEER_GRACE).await;
        assert_eq!(admission.admit(peer(1)).err(), Some(Refused::AtLimit));
        // Idle, it gives way to its own peer's newcomer (not to another peer's), once its
        // first second is over.
        a.busy().store(false, Ordering::Release);
        assert_eq!(admission.admit(peer(3)).err(), Some(Refused::AtLimit));
        let again = admission.admit(peer(1)).unwrap();
        assert_eq!(
            admission.admit(peer(1)).err(),
            Some(Refused::AtLimit),
            "the newcomer is safe in its first second"
        );
        assert_eq!(admission.table().peers[&peer(1)].len(), 1);
        assert_eq!(admission.table().peers[&peer(1)][0].id, again.id);
        assert_eq!(admission.table().open, 2);
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
        // it takes the place of its own peer's oldest (past its first second), and the
        // other peer keeps its two.
        tokio::time::sleep(OWN_PEER_GRACE + Duration::from_millis(100)).await;
        let third = exchange_on(connect_from(4, addr).await, GET).await;
        assert!(third.starts_with("HTTP/1.1 200"), "{third}");
        assert!(closed_within(&mut small[0], Duration::from_secs(2)).await);
        for s in big[2..].iter_mut().chain(&mut small[1..]) {
            assert!(!closed_within(s, Duration::from_millis(100)).await);
        }
    }

    /// A connection from 127.0.0.`host` whose receive buffer is small, so that an answer it
    /// does not read fills both ends' buffers quickly.
    async fn slow_reader(host: u8, addr: SocketAddr, request: &str) -> TcpStream {
        let socket = TcpSocket::new_v4().unwrap();
        socket.set_recv_buffer_size(4096).unwrap();
        socket
            .bind(SocketAddr::from((Ipv4Addr::new(127, 0, 0, host), 0)))
            .unwrap();
        let mut stream = socket.connect(addr).await.unwrap();
        stream.write_all(request.as_bytes()).await.unwrap();
        stream
    }

    /// Reads what is left on `stream` until EOF or an error, within `deadline`: the bytes
    /// read, or `None` if it stayed open.
    async fn drain_within(stream: &mut TcpStream, deadline: Duration) -> Option<usize> {
        let mut buf = vec![0_u8; 64 * 1024];
        let mut total = 0;
        tokio::time::timeout(deadline, async {
            loop {
                match stream.read(&mut buf).await {
                    Ok(0) | Err(_) => return total,
                    Ok(n) => total += n,
                }
            }
        })
        .await
        .ok()
    }

    const GET_LARGE: &str = "GET /large HTTP/1.1\r\nHost: x\r\n\r\n";

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_client_that_never_reads_is_closed_at_the_write_timeout_and_its_slot_freed() {
        let timeout = Duration::from_millis(800);
        let limits = Limits {
            max_connections: 1,
            max_connections_per_peer: 1,
            write_timeout: timeout,
            ..Limits::PUBLIC
        };
        let (addr, _stop, _task) = start(limits).await;
        let asked = Instant::now();
        let mut stuck = slow_reader(2, addr, GET_LARGE).await;
        // The one slot is taken: another peer (holding none against its one) is refused.
        tokio::time::sleep(Duration::from_millis(200)).await;
        let refused = exchange_on(connect_from(3, addr).await, GET).await;
        assert_eq!(refused, "", "a second connection got the only slot");
        // Before the timeout the stuck connection is still open...
        assert!(asked.elapsed() < timeout);
        // ...after it, another peer gets the slot.
        let served_at = loop {
            let answer = exchange_on(connect_from(3, addr).await, GET).await;
            if answer.starts_with("HTTP/1.1 200") {
                break asked.elapsed();
            }
            assert!(
                asked.elapsed() < timeout * 4,
                "no slot came free after {:?}",
                asked.elapsed()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        };
        assert!(served_at >= timeout, "slot free after {served_at:?}");
        // The client that never read finds its answer cut short.
        let got = drain_within(&mut stuck, Duration::from_secs(5))
            .await
            .expect("the stuck connection was closed");
        assert!(got < LARGE, "the whole answer was written: {got}");
    }

    #[tokio::test]
    async fn the_write_deadline_runs_from_the_first_wait_to_the_next_request() {
        use std::future::poll_fn;
        let timeout = Duration::from_millis(300);
        // A pipe of 1 KiB that nobody reads: the second KiB waits.
        let (io, mut peer) = tokio::io::duplex(1024);
        let new_request = Arc::new(AtomicBool::new(false));
        let mut io = WriteTimeout::new(io, timeout, new_request.clone());
        let kib = [0_u8; 1024];
        io.write_all(&kib).await.unwrap();
        let started = Instant::now();
        // A request coming while the write waits does not put the deadline off.
        let writing = async {
            let mut pending = 0;
            poll_fn(|cx| {
                pending += 1;
                if pending == 2 {
                    new_request.store(true, Ordering::Release);
                }
                Pin::new(&mut io).poll_write(cx, &kib)
            })
            .await
        };
        let error = writing.await.unwrap_err();
        assert_eq!(error.kind(), io::ErrorKind::TimedOut);
        let took = started.elapsed();
        assert!(took >= timeout && took < timeout * 3, "{took:?}");

        // Read by the client in time, then a new request: a new deadline for its answer.
        let (io, mut peer2) = tokio::io::duplex(1024);
        let new_request = Arc::new(AtomicBool::new(false));
        let mut io = WriteTimeout::new(io, timeout, new_request.clone());
        io.write_all(&kib).await.unwrap();
        let reader = tokio::spawn(async move {
            tokio::time::sleep(timeout / 2).await;
            let mut buf = vec![0_u8; 2048];
            let mut got = 0;
            while got < 2048 {
                got += peer2.read(&mut buf).await.unwrap();
            }
            peer2
        });
        io.write_all(&kib).await.unwrap();
        let mut peer2 = reader.await.unwrap();
        tokio::time::sleep(timeout).await;
        new_request.store(true, Ordering::Release);
        io.write_all(&kib).await.unwrap();
        io.flush().await.unwrap();
        let mut buf = vec![0_u8; 1024];
        assert_eq!(peer2.read(&mut buf).await.unwrap(), 1024);
        drop(peer.read(&mut buf).await);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn clients_behind_one_address_are_not_locked_out_by_slow_ones() {
        // As lolcow-web's page is served: every NodePort visitor may arrive from the node's
        // address. 40 clients that never finish their head and 40 that never read their
        // answer, all from one address (more than its 64 slots)...
        let limits = Limits::PUBLIC;
        let (addr, _stop, _task) = start(limits).await;
        let mut slow = half_written(2, addr, 40).await;
        for _ in 0..40 {
            slow.push(slow_reader(2, addr, GET_LARGE).await);
        }
        // (Each connection is safe from its own address's newer ones for its first second.)
        tokio::time::sleep(OWN_PEER_GRACE + Duration::from_millis(100)).await;
        // ...and a new client from the same address still gets the page, at once (well
        // within the 10 s header-read and write timeouts).
        let started = Instant::now();
        let answer = exchange_on(connect_from(2, addr).await, GET).await;
        assert!(answer.starts_with("HTTP/1.1 200"), "{answer:?}");
        assert!(answer.ends_with("hello"), "{answer}");
        assert!(
            started.elapsed() < Duration::from_secs(2),
            "served after {:?}",
            started.elapsed()
        );
        // Again and again: each newcomer displaces the oldest idle one.
        for _ in 0..20 {
            let answer = exchange_on(connect_from(2, addr).await, GET).await;
            assert!(answer.starts_with("HTTP/1.1 200"), "{answer:?}");
        }
        assert!(started.elapsed() < Duration::from_secs(5));
        drop(slow);
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
