//! Secure `/metrics`, as a kubebuilder v4 manager serves it (controller-runtime's
//! `filters.WithAuthenticationAndAuthorization`): HTTPS, and every request
//!
//! 1. carries `Authorization: Bearer <token>` (else `401`),
//! 2. whose token a `TokenReview` (`authentication.k8s.io/v1`) authenticates (else `401`),
//! 3. and whose user a `SubjectAccessReview` (`authorization.k8s.io/v1`) allows the
//!    request's verb on its non-resource path, e.g. `get` on `/metrics` (else `403`).
//!
//! The answers are cached, keyed by a SHA-256 of token, verb and path (no token is kept):
//! allowed ones for 1 min (at most 1,024), refused ones (unauthenticated or forbidden) for
//! 10 s in a cache of their own (at most 256), so a Prometheus scraping every 15 s costs
//! two API calls a minute, not two per scrape, a rejected token is not reviewed again
//! within 10 s, and a flood of made-up tokens, which fills only the refused answers'
//! cache, never evicts the scraper's allowed answer. An API server that cannot be asked
//! gives `500` and nothing is cached.
//!
//! Whoever reaches the port chooses the tokens, so the reviews are bounded too: none for a
//! request without a bearer token, at most [`MAX_REVIEWS_IN_FLIGHT`] in flight at once and
//! at most [`MAX_REVIEWS_PER_PEER`] for one peer (a source IP address); a request over a cap
//! gets `429` at once, without asking the API server (a cached answer is never refused).
//! The peer of a request is that of its connection: [`tls_handshake`] tags the task that
//! serves the connection ([`serving`] serves each connection on a task of its own, the
//! request included), and the middleware looks the tag up.
//!
//! The certificate is `tls.crt`/`tls.key` (PEM) from a directory (e.g. a cert-manager
//! Secret mounted into the pod; reloaded when the files change), or self-signed and
//! generated in memory at startup (the root filesystem can stay read-only), as
//! controller-runtime does without a cert path.

use std::{
    collections::HashMap,
    io,
    net::IpAddr,
    path::Path,
    pin::Pin,
    sync::{Arc, Mutex},
    task::{Context, Poll},
    time::{Duration, Instant, SystemTime},
};

use axum::{
    extract::{Request, State},
    http::{StatusCode, header},
    middleware::Next,
    response::{IntoResponse, Response},
};
use futures::future::BoxFuture;
use k8s_openapi::api::{
    authentication::v1::{TokenReview, TokenReviewSpec},
    authorization::v1::{NonResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec},
};
use kube::{
    Client,
    api::{Api, PostParams},
};
use rustls_pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer, pem::PemObject};
use tokio::{
    io::{AsyncRead, AsyncWrite, ReadBuf},
    net::TcpStream,
    time::Instant as TokioInstant,
};

/// How long an allowed request's answer is reused.
pub(super) const ALLOW_TTL: Duration = Duration::from_secs(60);
/// How long a refused (401 or 403) request's answer is reused.
pub(super) const DENY_TTL: Duration = Duration::from_secs(10);
/// At most this many allowed answers are cached.
pub(super) const CACHE_CAPACITY: usize = 1024;
/// At most this many refused answers are cached (apart from the allowed ones).
pub(super) const DENY_CACHE_CAPACITY: usize = 256;
/// At most this many reviews are asked of the API server at once.
pub(super) const MAX_REVIEWS_IN_FLIGHT: usize = 8;
/// At most this many reviews are asked at once for the requests of one peer.
pub(super) const MAX_REVIEWS_PER_PEER: usize = 2;

/// What the API server said about a request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Decision {
    /// The token is not valid (`401`).
    Unauthenticated,
    /// The token's user may not do this (`403`).
    Forbidden {
        /// The user name from the TokenReview.
        user: String,
    },
    /// The token's user may do this.
    Allowed {
        /// The user name from the TokenReview.
        user: String,
    },
}

/// Asks whether a bearer token may use `verb` on the non-resource `path`.
pub(super) trait Reviewer: Send + Sync + 'static {
    /// One review; an error means the question could not be answered (not cached).
    fn review<'a>(
        &'a self,
        token: &'a str,
        verb: &'a str,
        path: &'a str,
    ) -> BoxFuture<'a, Result<Decision, kube::Error>>;
}

/// Reviews with a TokenReview and a SubjectAccessReview against the API server.
#[derive(Clone)]
pub(super) struct ApiServerReviewer {
    client: Client,
}

impl ApiServerReviewer {
    /// Reviews with `client` (its identity needs `create` on `tokenreviews` and
    /// `subjectaccessreviews`: the `metrics-auth-role` of `deploy/`).
    #[must_use]
    pub(super) fn new(client: Client) -> Self {
        Self { client }
    }
}

impl Reviewer for ApiServerReviewer {
    fn review<'a>(
        &'a self,
        token: &'a str,
        verb: &'a str,
        path: &'a str,
    ) -> BoxFuture<'a, Result<Decision, kube::Error>> {
        Box::pin(async move {
            let review = TokenReview {
                spec: TokenReviewSpec {
                    token: token.to_owned(),
                    ..TokenReviewSpec::default()
                },
                ..TokenReview::default()
            };
            let reviewed = Api::<TokenReview>::all(self.client.clone())
                .create(&PostParams::default(), &review)
                .await?;
            let status = reviewed.status.unwrap_or_default();
            let user = match (status.authenticated, status.user) {
                (Some(true), Some(user)) => user,
                _ => return Ok(Decision::Unauthenticated),
            };
            let name = user.username.clone().unwrap_or_default();
            let access = SubjectAccessReview {
                spec: SubjectAccessReviewSpec {
                    user: user.username,
                    groups: user.groups,
                    uid: user.uid,
                    extra: user.extra,
                    non_resource_attributes: Some(NonResourceAttributes {
                        path: Some(path.to_owned()),
                        verb: Some(verb.to_owned()),
                    }),
                    ..SubjectAccessReviewSpec::default()
                },
                ..SubjectAccessReview::default()
            };
            let answered = Api::<SubjectAccessReview>::all(self.client.clone())
                .create(&PostParams::default(), &access)
                .await?;
            Ok(if answered.status.is_some_and(|s| s.allowed) {
                Decision::Allowed { user: name }
            } else {
                Decision::Forbidden { user: name }
            })
        })
    }
}

/// A [`Reviewer`] behind bounded caches of its answers and caps on the reviews in flight
/// (see the module docs).
pub(super) struct Authorizer {
    reviewer: Box<dyn Reviewer>,
    /// Allowed answers: only tokens the API server authenticated and authorized fill it.
    allowed: Mutex<Cache>,
    /// Refused answers (unauthenticated or forbidden): anyone can fill it, so it is apart
    /// and smaller.
    refused: Mutex<Cache>,
    in_flight: Mutex<InFlight>,
    /// The peer of each connection being served, by the task that serves it.
    connections: Mutex<HashMap<tokio::task::Id, IpAddr>>,
}

impl std::fmt::Debug for Authorizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Authorizer").finish_non_exhaustive()
    }
}

/// Why a request could not be decided.
#[derive(Debug, thiserror::Error)]
pub(super) enum ReviewError {
    /// [`MAX_REVIEWS_IN_FLIGHT`] reviews are in flight, or [`MAX_REVIEWS_PER_PEER`] for
    /// the request's peer: not asked (`429`).
    #[error("too many reviews in flight")]
    Busy,
    /// The API server could not be asked (`500`; not cached).
    #[error(transparent)]
    Api(#[from] kube::Error),
}

impl Authorizer {
    /// Caches the answers of `reviewer`.
    #[must_use]
    pub(super) fn new(reviewer: impl Reviewer) -> Self {
        Self {
            reviewer: Box::new(reviewer),
            allowed: Mutex::new(Cache::new(CACHE_CAPACITY)),
            refused: Mutex::new(Cache::new(DENY_CACHE_CAPACITY)),
            in_flight: Mutex::new(InFlight::default()),
            connections: Mutex::new(HashMap::new()),
        }
    }

    /// The decision for `token` doing `verb` on `path`, for a request from `peer` (`None`:
    /// unknown, held to the overall cap only): cached, or asked when the caps allow.
    ///
    /// # Errors
    /// [`ReviewError::Busy`] over a cap, [`ReviewError::Api`] when the API server could
    /// not be asked.
    pub(super) async fn decide(
        &self,
        peer: Option<IpAddr>,
        token: &str,
        verb: &str,
        path: &str,
    ) -> Result<Decision, ReviewError> {
        let key = cache_key(token, verb, path);
        let now = TokioInstant::now();
        if let Some(hit) = lock(&self.allowed).get(&key, now) {
            return Ok(hit);
        }
        if let Some(hit) = lock(&self.refused).get(&key, now) {
            return Ok(hit);
        }
        let _slot = InFlight::take(&self.in_flight, peer).ok_or(ReviewError::Busy)?;
        let decision = self.reviewer.review(token, verb, path).await?;
        let now = TokioInstant::now();
        match decision {
            Decision::Allowed { .. } => {
                lock(&self.allowed).insert(key, decision.clone(), now, now + ALLOW_TTL);
            }
            Decision::Unauthenticated | Decision::Forbidden { .. } => {
                lock(&self.refused).insert(key, decision.clone(), now, now + DENY_TTL);
            }
        }
        Ok(decision)
    }

    /// Remembers that the current task serves a connection from `peer`, until the
    /// returned tag drops (with the connection). `None` outside a Tokio task.
    fn connection_from(self: &Arc<Self>, peer: IpAddr) -> Option<ConnectionTag> {
        let task = tokio::task::try_id()?;
        lock(&self.connections).insert(task, peer.to_canonical());
        Some(ConnectionTag {
            auth: Arc::downgrade(self),
            task,
        })
    }

    /// How many connections are tagged with their peer.
    #[cfg(test)]
    pub(crate) fn tagged_connections(&self) -> usize {
        lock(&self.connections).len()
    }

    /// The peer of the connection the current task serves, if [`tls_handshake`] tagged it.
    fn peer_of_current_task(&self) -> Option<IpAddr> {
        let task = tokio::task::try_id()?;
        lock(&self.connections).get(&task).copied()
    }
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // A panic while holding the lock leaves maps that are still consistent.
    mutex
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Reviews in flight, overall and per peer (an entry only while it has one).
#[derive(Debug, Default)]
struct InFlight {
    total: usize,
    per_peer: HashMap<IpAddr, usize>,
}

impl InFlight {
    /// A slot for one review for `peer`, held until the slot drops; `None` over a cap.
    fn take(this: &Mutex<InFlight>, peer: Option<IpAddr>) -> Option<Slot<'_>> {
        let mut in_flight = lock(this);
        if in_flight.total >= MAX_REVIEWS_IN_FLIGHT {
            return None;
        }
        if let Some(peer) = peer {
            let mine = in_flight.per_peer.entry(peer).or_default();
            if *mine >= MAX_REVIEWS_PER_PEER {
                return None;
            }
            *mine += 1;
        }
        in_flight.total += 1;
        Some(Slot {
            in_flight: this,
            peer,
        })
    }
}

/// One review in flight; dropped when it is answered or its request is abandoned.
struct Slot<'a> {
    in_flight: &'a Mutex<InFlight>,
    peer: Option<IpAddr>,
}

impl Drop for Slot<'_> {
    fn drop(&mut self) {
        let mut in_flight = lock(self.in_flight);
        in_flight.total = in_flight.total.saturating_sub(1);
        if let Some(peer) = self.peer
            && let Some(mine) = in_flight.per_peer.get_mut(&peer)
        {
            *mine = mine.saturating_sub(1);
            if *mine == 0 {
                in_flight.per_peer.remove(&peer);
            }
        }
    }
}

/// Forgets a connection's peer when the connection's stream drops.
#[derive(Debug)]
struct ConnectionTag {
    auth: std::sync::Weak<Authorizer>,
    task: tokio::task::Id,
}

impl Drop for ConnectionTag {
    fn drop(&mut self) {
        if let Some(auth) = self.auth.upgrade() {
            lock(&auth.connections).remove(&self.task);
        }
    }
}

type Key = [u8; 32];

fn cache_key(token: &str, verb: &str, path: &str) -> Key {
    let mut ctx = ring::digest::Context::new(&ring::digest::SHA256);
    for part in [token, verb, path] {
        ctx.update(&(part.len() as u64).to_be_bytes());
        ctx.update(part.as_bytes());
    }
    let mut key = [0_u8; 32];
    key.copy_from_slice(ctx.finish().as_ref());
    key
}

/// Decisions with their expiry; at capacity, expired entries go first, then the ones
/// expiring soonest.
#[derive(Debug)]
struct Cache {
    capacity: usize,
    entries: HashMap<Key, (Decision, TokioInstant)>,
}

impl Cache {
    fn new(capacity: usize) -> Self {
        Self {
            capacity,
            entries: HashMap::new(),
        }
    }

    fn get(&mut self, key: &Key, now: TokioInstant) -> Option<Decision> {
        match self.entries.get(key) {
            Some((decision, expires)) if *expires > now => Some(decision.clone()),
            Some(_) => {
                self.entries.remove(key);
                None
            }
            None => None,
        }
    }

    fn insert(&mut self, key: Key, decision: Decision, now: TokioInstant, expires: TokioInstant) {
        if self.entries.len() >= self.capacity && !self.entries.contains_key(&key) {
            self.entries.retain(|_, (_, e)| *e > now);
            while self.entries.len() >= self.capacity {
                let soonest = self
                    .entries
                    .iter()
                    .min_by_key(|(_, (_, e))| *e)
                    .map(|(k, _)| *k);
                match soonest {
                    Some(k) => self.entries.remove(&k),
                    None => break,
                };
            }
        }
        self.entries.insert(key, (decision, expires));
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.entries.len()
    }
}

/// The bearer token of a request's `Authorization` header.
fn bearer(request: &Request) -> Option<&str> {
    let value = request
        .headers()
        .get(header::AUTHORIZATION)?
        .to_str()
        .ok()?;
    let (scheme, token) = value.trim().split_once(' ')?;
    let token = token.trim();
    (scheme.eq_ignore_ascii_case("bearer") && !token.is_empty()).then_some(token)
}

/// axum middleware: authenticates and authorizes every request (see the module docs).
pub(super) async fn require_authorized(
    State(auth): State<Arc<Authorizer>>,
    request: Request,
    next: Next,
) -> Response {
    let unauthorized = || {
        (
            StatusCode::UNAUTHORIZED,
            [(header::WWW_AUTHENTICATE, "Bearer")],
            "Unauthorized\n",
        )
            .into_response()
    };
    // No token, no review: nothing to ask the API server about.
    let Some(token) = bearer(&request) else {
        return unauthorized();
    };
    let verb = request.method().as_str().to_ascii_lowercase();
    let path = request.uri().path().to_owned();
    let peer = auth.peer_of_current_task();
    match auth.decide(peer, token, &verb, &path).await {
        Ok(Decision::Allowed { .. }) => next.run(request).await,
        Ok(Decision::Unauthenticated) => unauthorized(),
        Ok(Decision::Forbidden { user }) => {
            tracing::debug!(%user, %verb, %path, "metrics request forbidden");
            (
                StatusCode::FORBIDDEN,
                format!("Forbidden (user={user}, verb={verb}, resource=, subresource=)\n"),
            )
                .into_response()
        }
        Err(ReviewError::Busy) => {
            // Debug only: the client chooses how often this happens.
            tracing::debug!(?peer, "too many metrics reviews in flight; refused");
            (
                StatusCode::TOO_MANY_REQUESTS,
                [(header::RETRY_AFTER, "1")],
                "Too many authentication requests in flight\n",
            )
                .into_response()
        }
        Err(ReviewError::Api(error)) => {
            tracing::warn!(%error, "cannot review a metrics request with the API server");
            (
                StatusCode::INTERNAL_SERVER_ERROR,
                "Authentication or authorization failed\n",
            )
                .into_response()
        }
    }
}

/// Where a certificate and its key are.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct CertFiles {
    /// The PEM certificate (chain).
    pub cert: std::path::PathBuf,
    /// The PEM private key.
    pub key: std::path::PathBuf,
}

/// How often the certificate files are checked for a change (a rotated Secret).
pub(super) const CERT_CHECK_INTERVAL: Duration = Duration::from_secs(10);

/// The TLS configuration of the metrics server: the certificate in `files` (reloaded when
/// the files change, as controller-runtime's certwatcher does, so a rotated cert-manager
/// Secret takes effect without a restart), else a new self-signed one (for `localhost`
/// and the pod's host name).
///
/// # Errors
/// A file that cannot be read or holds no certificate or key; a key that does not match.
pub(super) fn tls_config(files: Option<&CertFiles>) -> io::Result<Arc<rustls::ServerConfig>> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let resolver: Arc<dyn rustls::server::ResolvesServerCert> = match files {
        Some(files) => Arc::new(ReloadingCert::load(files.clone(), provider.clone())?),
        None => {
            let (certs, key) = self_signed()?;
            Arc::new(FixedCert(Arc::new(certified_key(certs, key, &provider)?)))
        }
    };
    let mut config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(io::Error::other)?
        .with_no_client_auth()
        .with_cert_resolver(resolver);
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

fn certified_key(
    certs: Vec<CertificateDer<'static>>,
    key: PrivateKeyDer<'static>,
    provider: &rustls::crypto::CryptoProvider,
) -> io::Result<rustls::sign::CertifiedKey> {
    rustls::sign::CertifiedKey::from_der(certs, key, provider)
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))
}

/// The self-signed certificate.
#[derive(Debug)]
struct FixedCert(Arc<rustls::sign::CertifiedKey>);

impl rustls::server::ResolvesServerCert for FixedCert {
    fn resolve(
        &self,
        _hello: rustls::server::ClientHello<'_>,
    ) -> Option<Arc<rustls::sign::CertifiedKey>> {
        Some(self.0.clone())
    }
}

type Mtimes = (Option<SystemTime>, Option<SystemTime>);

/// The certificate of `files`, read again when their modification times change (checked
/// at most every [`CERT_CHECK_INTERVAL`], at a handshake). A change that does not load
/// (half-written, key and certificate not matching) keeps the previous certificate.
#[derive(Debug)]
struct ReloadingCert {
    files: CertFiles,
    provider: Arc<rustls::crypto::CryptoProvider>,
    state: Mutex<ReloadState>,
}

#[derive(Debug)]
struct ReloadState {
    key: Arc<rustls::sign::CertifiedKey>,
    mtimes: Mtimes,
    checked: Instant,
}

fn mtimes(files: &CertFiles) -> Mtimes {
    let modified = |p: &Path| std::fs::metadata(p).and_then(|m| m.modified()).ok();
    (modified(&files.cert), modified(&files.key))
}

impl ReloadingCert {
    fn load(files: CertFiles, provider: Arc<rustls::crypto::CryptoProvider>) -> io::Result<Self> {
        let stamp = mtimes(&files);
        let (certs, key) = read_cert(&files)?;
        let key = Arc::new(certified_key(certs, key, &provider)?);
        Ok(Self {
            files,
            provider,
            state: Mutex::new(ReloadState {
                key,
                mtimes: stamp,
                checked: Instant::now(),
            }),
        })
    }

    /// The current certificate, reloaded first if the files changed.
    fn current(&self, now: Instant) -> Arc<rustls::sign::CertifiedKey> {
        let mut state = self
            .state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if now.saturating_duration_since(state.checked) >= CERT_CHECK_INTERVAL {
            state.checked = now;
            let stamp = mtimes(&self.files);
            if stamp != state.mtimes {
                let loaded = read_cert(&self.files)
                    .and_then(|(certs, key)| certified_key(certs, key, &self.provider));
                match loaded {
                    Ok(key) => {
                        tracing::info!(cert = %self.files.cert.display(), "metrics certificate reloaded");
                        state.key = Arc::new(key);
                        state.mtimes = stamp;
                    }
                    Err(error) => {
                        tracing::warn!(%error, "the changed metrics certificate does not load; keeping the previous one");
                    }
                }
            }
        }
        state.key.clone()
    }
}

impl rustls::server::ResolvesServerCert for ReloadingCert {
    fn resolve(
        &self,
        _hello: rustls::server::ClientHello<'_>,
    ) -> Option<Arc<rustls::sign::CertifiedKey>> {
        Some(self.current(Instant::now()))
    }
}

type CertAndKey = (Vec<CertificateDer<'static>>, PrivateKeyDer<'static>);

fn read_cert(files: &CertFiles) -> io::Result<CertAndKey> {
    let invalid = |path: &Path, what: &str| {
        io::Error::new(
            io::ErrorKind::InvalidData,
            format!("{}: {what}", path.display()),
        )
    };
    let certs = CertificateDer::pem_file_iter(&files.cert)
        .map_err(|e| invalid(&files.cert, &e.to_string()))?
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| invalid(&files.cert, &e.to_string()))?;
    if certs.is_empty() {
        return Err(invalid(&files.cert, "no PEM certificate"));
    }
    let key = PrivateKeyDer::from_pem_file(&files.key)
        .map_err(|e| invalid(&files.key, &e.to_string()))?;
    Ok((certs, key))
}

fn self_signed() -> io::Result<CertAndKey> {
    let mut names = vec!["localhost".to_owned()];
    if let Ok(host) = std::env::var("HOSTNAME")
        && !host.is_empty()
    {
        names.push(host);
    }
    let generated = rcgen::generate_simple_self_signed(names).map_err(io::Error::other)?;
    let key = PrivatePkcs8KeyDer::from(generated.signing_key.serialize_der());
    Ok((
        vec![generated.cert.der().clone()],
        PrivateKeyDer::Pkcs8(key),
    ))
}

/// The TLS handshake for [`serving::serve`]. Each connection's stream is tagged with its
/// peer for `authorizer` until it drops, so the reviews of its requests count against that
/// peer ([`MAX_REVIEWS_PER_PEER`]).
pub(super) fn tls_handshake(
    config: Arc<rustls::ServerConfig>,
    authorizer: Arc<Authorizer>,
) -> impl Fn(
    TcpStream,
) -> BoxFuture<'static, io::Result<Tagged<tokio_rustls::server::TlsStream<TcpStream>>>>
+ Clone
+ Send
+ Sync
+ 'static {
    let acceptor = tokio_rustls::TlsAcceptor::from(config);
    move |stream| {
        let (acceptor, authorizer) = (acceptor.clone(), authorizer.clone());
        Box::pin(async move {
            // On the task that serves the connection (and its requests).
            let tag = match stream.peer_addr() {
                Ok(addr) => authorizer.connection_from(addr.ip()),
                Err(_) => None,
            };
            let stream = acceptor.accept(stream).await?;
            Ok(Tagged { stream, _tag: tag })
        })
    }
}

/// A connection's stream, tagged with its peer while it lives ([`tls_handshake`]).
#[derive(Debug)]
pub(super) struct Tagged<S> {
    stream: S,
    _tag: Option<ConnectionTag>,
}

impl<S: AsyncRead + Unpin> AsyncRead for Tagged<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_read(cx, buf)
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Tagged<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_shutdown(cx)
    }
}

/// Certificate files for the tests of this module and of the health module.
#[cfg(test)]
pub(crate) mod test_files {
    #![allow(clippy::unwrap_used)]

    use super::CertFiles;
    use super::{BoxFuture, Decision, Reviewer};
    use std::path::PathBuf;
    use std::sync::{
        Arc,
        atomic::{AtomicUsize, Ordering},
    };

    /// `tls.crt` and `tls.key` (not written yet) in a fresh temporary folder named after
    /// `tag` and this process; returns the folder too, for the test to remove.
    pub(crate) fn cert_files(tag: &str) -> (PathBuf, CertFiles) {
        let dir = std::env::temp_dir().join(format!("{tag}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let files = CertFiles {
            cert: dir.join("tls.crt"),
            key: dir.join("tls.key"),
        };
        (dir, files)
    }

    /// Writes a new self-signed certificate for `name` and its key to `files`; returns the
    /// certificate.
    pub(crate) fn write_self_signed(
        files: &CertFiles,
        name: &str,
    ) -> rustls_pki_types::CertificateDer<'static> {
        let generated = rcgen::generate_simple_self_signed(vec![name.to_owned()]).unwrap();
        std::fs::write(&files.cert, generated.cert.pem()).unwrap();
        std::fs::write(&files.key, generated.signing_key.serialize_pem()).unwrap();
        generated.cert.der().clone()
    }

    /// A reviewer for the tests: allows `reader` for `get /metrics`, knows `stranger` but
    /// forbids it, fails on `broken`; counts the reviews it made.
    #[derive(Default)]
    pub(crate) struct FakeReviewer(pub(crate) Arc<AtomicUsize>);

    impl Reviewer for FakeReviewer {
        fn review<'a>(
            &'a self,
            token: &'a str,
            verb: &'a str,
            path: &'a str,
        ) -> BoxFuture<'a, Result<Decision, kube::Error>> {
            self.0.fetch_add(1, Ordering::SeqCst);
            Box::pin(async move {
                match token {
                    "reader" if verb == "get" && path == "/metrics" => {
                        Ok(Decision::Allowed { user: token.into() })
                    }
                    "reader" | "stranger" => Ok(Decision::Forbidden { user: token.into() }),
                    "broken" => Err(kube::Error::LinesCodecMaxLineLengthExceeded),
                    _ => Ok(Decision::Unauthenticated),
                }
            })
        }
    }

    /// A reviewer for the tests that holds every review until its gate closes, then
    /// answers `Unauthenticated`; counts the reviews it was asked for.
    pub(crate) struct GatedReviewer {
        pub(crate) asked: Arc<AtomicUsize>,
        pub(crate) gate: Arc<tokio::sync::Semaphore>,
    }

    impl GatedReviewer {
        /// A reviewer whose gate is shut; returns it with its count and its gate (`close`
        /// it to let every review answer).
        pub(crate) fn shut() -> (Self, Arc<AtomicUsize>, Arc<tokio::sync::Semaphore>) {
            let asked = Arc::new(AtomicUsize::new(0));
            let gate = Arc::new(tokio::sync::Semaphore::new(0));
            let reviewer = Self {
                asked: asked.clone(),
                gate: gate.clone(),
            };
            (reviewer, asked, gate)
        }
    }

    impl Reviewer for GatedReviewer {
        fn review<'a>(
            &'a self,
            _token: &'a str,
            _verb: &'a str,
            _path: &'a str,
        ) -> BoxFuture<'a, Result<Decision, kube::Error>> {
            self.asked.fetch_add(1, Ordering::SeqCst);
            Box::pin(async move {
                // Closed: every waiting review goes on.
                let _ = self.gate.acquire().await;
                Ok(Decision::Unauthenticated)
            })
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::test_files::{FakeReviewer, cert_files, write_self_signed};
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    #[tokio::test]
    async fn answers_are_cached_per_token_verb_and_path_errors_are_not() {
        let calls = Arc::new(AtomicUsize::new(0));
        let auth = Authorizer::new(FakeReviewer(calls.clone()));
        for _ in 0..3 {
            assert_eq!(
                auth.decide(None, "reader", "get", "/metrics")
                    .await
                    .unwrap(),
                Decision::Allowed {
                    user: "reader".into()
                }
            );
        }
        assert_eq!(
            calls.load(Ordering::SeqCst),
            1,
            "one review for three scrapes"
        );
        assert!(matches!(
            auth.decide(None, "reader", "post", "/metrics")
                .await
                .unwrap(),
            Decision::Forbidden { .. }
        ));
        assert!(matches!(
            auth.decide(None, "stranger", "get", "/metrics")
                .await
                .unwrap(),
            Decision::Forbidden { .. }
        ));
        assert_eq!(
            auth.decide(None, "nope", "get", "/metrics").await.unwrap(),
            Decision::Unauthenticated
        );
        assert_eq!(calls.load(Ordering::SeqCst), 4);
        assert!(
            auth.decide(None, "broken", "get", "/metrics")
                .await
                .is_err()
        );
        assert!(
            auth.decide(None, "broken", "get", "/metrics")
                .await
                .is_err()
        );
        assert_eq!(calls.load(Ordering::SeqCst), 6, "errors are asked again");
    }

    /// A router serving `/metrics` behind [`require_authorized`] with `auth`.
    fn guarded(auth: Arc<Authorizer>) -> axum::Router {
        axum::Router::new()
            .route("/metrics", axum::routing::get(|| async { "metrics" }))
            .layer(axum::middleware::from_fn_with_state(
                auth,
                require_authorized,
            ))
    }

    /// The status of `GET /metrics` with the `Authorization` header `authorization`.
    async fn status_of(router: &axum::Router, authorization: Option<&str>) -> StatusCode {
        use tower::ServiceExt;
        let mut request = axum::http::Request::get("/metrics");
        if let Some(value) = authorization {
            request = request.header(header::AUTHORIZATION, value);
        }
        let request = request.body(axum::body::Body::empty()).unwrap();
        router.clone().oneshot(request).await.unwrap().status()
    }

    #[tokio::test]
    async fn a_request_without_a_bearer_token_is_refused_without_a_review() {
        let calls = Arc::new(AtomicUsize::new(0));
        let router = guarded(Arc::new(Authorizer::new(FakeReviewer(calls.clone()))));
        for authorization in [
            None,
            Some("Basic cmVhZGVyOng="),
            Some("Bearer "),
            Some("reader"),
        ] {
            assert_eq!(
                status_of(&router, authorization).await,
                StatusCode::UNAUTHORIZED,
                "{authorization:?}"
            );
        }
        assert_eq!(calls.load(Ordering::SeqCst), 0, "no token, no review");
        assert_eq!(
            status_of(&router, Some("Bearer reader")).await,
            StatusCode::OK
        );
        assert_eq!(calls.load(Ordering::SeqCst), 1);
    }

    /// Lets the spawned tasks run until they wait on something.
    async fn settle() {
        for _ in 0..100 {
            tokio::task::yield_now().await;
        }
    }

    #[tokio::test]
    async fn reviews_in_flight_are_capped_per_peer_and_overall() {
        let (reviewer, asked, gate) = test_files::GatedReviewer::shut();
        let auth = Arc::new(Authorizer::new(reviewer));
        let ask = |peer: Option<&str>, token: String| {
            let auth = auth.clone();
            let peer = peer.map(|p| p.parse::<IpAddr>().unwrap());
            tokio::spawn(async move { auth.decide(peer, &token, "get", "/metrics").await })
        };
        // Six new tokens at once from one peer: two reach the API server, four are
        // refused at once.
        let mut waiting = Vec::new();
        let mut refused = Vec::new();
        for i in 0..6 {
            waiting.push(ask(Some("10.0.0.1"), format!("one-{i}")));
        }
        settle().await;
        assert_eq!(asked.load(Ordering::SeqCst), MAX_REVIEWS_PER_PEER);
        for task in std::mem::take(&mut waiting) {
            if task.is_finished() {
                refused.push(task);
            } else {
                waiting.push(task);
            }
        }
        assert_eq!(waiting.len(), MAX_REVIEWS_PER_PEER);
        assert_eq!(refused.len(), 6 - MAX_REVIEWS_PER_PEER);
        for task in refused {
            assert!(matches!(task.await.unwrap(), Err(ReviewError::Busy)));
        }
        // Other peers get their share, until the overall cap.
        for peer in ["10.0.0.2", "10.0.0.3", "10.0.0.4"] {
            for i in 0..MAX_REVIEWS_PER_PEER {
                waiting.push(ask(Some(peer), format!("{peer}-{i}")));
            }
        }
        settle().await;
        assert_eq!(asked.load(Ordering::SeqCst), MAX_REVIEWS_IN_FLIGHT);
        for peer in [Some("10.0.0.5"), None] {
            let over = ask(peer, "one-too-many".into()).await.unwrap();
            assert!(matches!(over, Err(ReviewError::Busy)), "{peer:?}: {over:?}");
        }
        assert_eq!(asked.load(Ordering::SeqCst), MAX_REVIEWS_IN_FLIGHT);
        // Answered: the slots are free again.
        gate.close();
        for task in waiting {
            assert_eq!(task.await.unwrap().unwrap(), Decision::Unauthenticated);
        }
        assert_eq!(
            ask(Some("10.0.0.1"), "later".into())
                .await
                .unwrap()
                .unwrap(),
            Decision::Unauthenticated
        );
        assert_eq!(asked.load(Ordering::SeqCst), MAX_REVIEWS_IN_FLIGHT + 1);
        assert_eq!(lock(&auth.in_flight).total, 0);
        assert!(lock(&auth.in_flight).per_peer.is_empty());
    }

    #[tokio::test(start_paused = true)]
    async fn a_flood_of_made_up_tokens_does_not_evict_the_scrapers_answer() {
        let calls = Arc::new(AtomicUsize::new(0));
        let auth = Authorizer::new(FakeReviewer(calls.clone()));
        let allowed = Decision::Allowed {
            user: "reader".into(),
        };
        let scraper = Some(IpAddr::from([10, 0, 0, 9]));
        assert_eq!(
            auth.decide(scraper, "reader", "get", "/metrics")
                .await
                .unwrap(),
            allowed
        );
        // Late in the answer's minute, when every refused answer would outlive it.
        tokio::time::advance(ALLOW_TTL - Duration::from_secs(5)).await;
        let flood = 2 * (CACHE_CAPACITY + DENY_CACHE_CAPACITY);
        for i in 0..flood {
            let peer = Some(IpAddr::from([10, 1, (i / 256) as u8, (i % 256) as u8]));
            let token = format!("made-up-{i}");
            assert_eq!(
                auth.decide(peer, &token, "get", "/metrics").await.unwrap(),
                Decision::Unauthenticated
            );
        }
        assert_eq!(calls.load(Ordering::SeqCst), 1 + flood);
        assert!(lock(&auth.refused).len() <= DENY_CACHE_CAPACITY);
        assert_eq!(
            auth.decide(scraper, "reader", "get", "/metrics")
                .await
                .unwrap(),
            allowed
        );
        assert_eq!(
            calls.load(Ordering::SeqCst),
            1 + flood,
            "the scraper's answer was evicted"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_refused_token_is_not_reviewed_again_within_its_ttl() {
        let calls = Arc::new(AtomicUsize::new(0));
        let auth = Authorizer::new(FakeReviewer(calls.clone()));
        let peer = Some(IpAddr::from([10, 0, 0, 1]));
        for (token, refused) in [
            ("forged", Decision::Unauthenticated),
            (
                "stranger",
                Decision::Forbidden {
                    user: "stranger".into(),
                },
            ),
        ] {
            let before = calls.load(Ordering::SeqCst);
            assert_eq!(
                auth.decide(peer, token, "get", "/metrics").await.unwrap(),
                refused
            );
            tokio::time::advance(DENY_TTL - Duration::from_millis(1)).await;
            assert_eq!(
                auth.decide(peer, token, "get", "/metrics").await.unwrap(),
                refused
            );
            assert_eq!(
                calls.load(Ordering::SeqCst),
                before + 1,
                "{token} reviewed twice"
            );
            // Once its time is up, it is asked again.
            tokio::time::advance(Duration::from_millis(1)).await;
            auth.decide(peer, token, "get", "/metrics").await.unwrap();
            assert_eq!(calls.load(Ordering::SeqCst), before + 2);
        }
    }

    /// A fake API server: authenticates `reader-token` and `stranger-token`, allows the
    /// reader `get /metrics`; records what it was asked.
    fn fake_api_server(asked: Arc<Mutex<Vec<(String, serde_json::Value)>>>) -> Client {
        let service = tower::service_fn(move |request: axum::http::Request<kube::client::Body>| {
            let asked = asked.clone();
            async move {
                let path = request.uri().path().to_owned();
                let body = request.into_body().collect_bytes().await?;
                let sent: serde_json::Value = serde_json::from_slice(&body)?;
                asked.lock().unwrap().push((path.clone(), sent.clone()));
                let answer = match path.as_str() {
                    "/apis/authentication.k8s.io/v1/tokenreviews" => {
                        let token = sent["spec"]["token"].as_str().unwrap_or_default();
                        let user = token.strip_suffix("-token").unwrap_or_default();
                        let known = matches!(user, "reader" | "stranger");
                        serde_json::json!({
                            "apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview",
                            "spec": sent["spec"],
                            "status": {"authenticated": known,
                                       "user": {"username": format!("system:serviceaccount:ns:{user}"),
                                                "uid": "u-1", "groups": ["system:serviceaccounts"]}}
                        })
                    }
                    "/apis/authorization.k8s.io/v1/subjectaccessreviews" => {
                        let spec = &sent["spec"];
                        let allowed = spec["user"] == "system:serviceaccount:ns:reader"
                            && spec["nonResourceAttributes"]
                                == serde_json::json!({"path": "/metrics", "verb": "get"});
                        serde_json::json!({
                            "apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview",
                            "spec": spec, "status": {"allowed": allowed}
                        })
                    }
                    _ => {
                        return Ok::<_, Box<dyn std::error::Error + Send + Sync>>(
                            axum::http::Response::builder()
                                .status(404)
                                .body(kube::client::Body::empty())?,
                        );
                    }
                };
                Ok(axum::http::Response::builder()
                    .status(201)
                    .header("content-type", "application/json")
                    .body(kube::client::Body::from(serde_json::to_vec(&answer)?))?)
            }
        });
        Client::new(service, "default")
    }

    /// What `reviewer` decides on `get path` with `token`.
    async fn get(reviewer: &ApiServerReviewer, token: &str, path: &str) -> Decision {
        reviewer.review(token, "get", path).await.unwrap()
    }

    #[tokio::test]
    async fn the_api_server_reviewer_sends_a_token_review_then_a_subject_access_review() {
        let asked = Arc::new(Mutex::new(Vec::new()));
        let reviewer = ApiServerReviewer::new(fake_api_server(asked.clone()));
        assert_eq!(
            get(&reviewer, "reader-token", "/metrics").await,
            Decision::Allowed {
                user: "system:serviceaccount:ns:reader".into()
            }
        );
        {
            let asked = asked.lock().unwrap();
            assert_eq!(asked.len(), 2, "{asked:?}");
            assert_eq!(asked[0].1["spec"]["token"], "reader-token");
            // The reviewed user's groups and uid are passed on to the authorizer.
            assert_eq!(
                asked[1].1["spec"]["groups"],
                serde_json::json!(["system:serviceaccounts"])
            );
            assert_eq!(asked[1].1["spec"]["uid"], "u-1");
        }
        assert_eq!(
            get(&reviewer, "stranger-token", "/metrics").await,
            Decision::Forbidden {
                user: "system:serviceaccount:ns:stranger".into()
            }
        );
        assert_eq!(
            get(&reviewer, "reader-token", "/other").await,
            Decision::Forbidden {
                user: "system:serviceaccount:ns:reader".into()
            }
        );
        let before = asked.lock().unwrap().len();
        assert_eq!(
            get(&reviewer, "forged", "/metrics").await,
            Decision::Unauthenticated
        );
        assert_eq!(
            asked.lock().unwrap().len(),
            before + 1,
            "an unauthenticated token is not sent to the authorizer"
        );
    }

    #[test]
    fn cache_expires_and_stays_bounded() {
        let mut cache = Cache::new(3);
        let now = TokioInstant::now();
        let allowed = Decision::Allowed { user: "u".into() };
        cache.insert(
            cache_key("a", "get", "/"),
            allowed.clone(),
            now,
            now + ALLOW_TTL,
        );
        assert_eq!(
            cache.get(&cache_key("a", "get", "/"), now),
            Some(allowed.clone())
        );
        assert_eq!(
            cache.get(&cache_key("a", "get", "/"), now + ALLOW_TTL),
            None
        );
        assert_eq!(cache.len(), 0, "an expired entry is dropped when read");
        for (i, token) in ["t1", "t2", "t3", "t4", "t5"].iter().enumerate() {
            let expires = now + DENY_TTL + Duration::from_secs(i as u64);
            cache.insert(cache_key(token, "get", "/"), allowed.clone(), now, expires);
            assert!(cache.len() <= 3);
        }
        // The ones expiring soonest made room.
        assert_eq!(cache.get(&cache_key("t1", "get", "/"), now), None);
        assert_eq!(cache.get(&cache_key("t2", "get", "/"), now), None);
        assert!(cache.get(&cache_key("t5", "get", "/"), now).is_some());
        // Keys differ by every part (length-prefixed: no ambiguity from concatenation).
        assert_ne!(cache_key("ab", "c", "/"), cache_key("a", "bc", "/"));
        assert_ne!(
            cache_key("a", "get", "/metrics"),
            cache_key("a", "get", "/x")
        );
    }

    #[test]
    fn bearer_tokens_are_read_from_the_authorization_header() {
        let req = |v: Option<&str>| {
            let mut b = axum::http::Request::builder().uri("/metrics");
            if let Some(v) = v {
                b = b.header(header::AUTHORIZATION, v);
            }
            b.body(axum::body::Body::empty()).unwrap()
        };
        assert_eq!(bearer(&req(Some("Bearer abc"))), Some("abc"));
        assert_eq!(bearer(&req(Some("bearer  abc "))), Some("abc"));
        assert_eq!(bearer(&req(Some("Basic abc"))), None);
        assert_eq!(bearer(&req(Some("Bearer "))), None);
        assert_eq!(bearer(&req(None)), None);
    }

    #[test]
    fn self_signed_and_file_certificates_make_a_tls_config() {
        let config = tls_config(None).unwrap();
        assert_eq!(config.alpn_protocols, vec![b"http/1.1".to_vec()]);
        // The same kind of certificate from files, as a mounted Secret would hold it.
        let (dir, files) = cert_files("metrics-auth-test");
        write_self_signed(&files, "localhost");
        assert!(tls_config(Some(&files)).is_ok());
        std::fs::write(&files.cert, "not a certificate").unwrap();
        let err = tls_config(Some(&files)).unwrap_err();
        assert!(err.to_string().contains("tls.crt"), "{err}");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_rotated_certificate_is_picked_up_and_a_broken_one_is_not() {
        let (dir, files) = cert_files("metrics-rotate-test");
        let first = write_self_signed(&files, "first.example");
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let reloading = ReloadingCert::load(files.clone(), provider).unwrap();
        let t0 = Instant::now();
        assert_eq!(reloading.current(t0).cert[0], first);
        // Rotated: new files with a new modification time.
        let second = write_self_signed(&files, "second.example");
        let later = SystemTime::now() + Duration::from_secs(5);
        for path in [&files.cert, &files.key] {
            std::fs::File::options()
                .write(true)
                .open(path)
                .unwrap()
                .set_modified(later)
                .unwrap();
        }
        // Not before the check interval...
        assert_eq!(reloading.current(t0).cert[0], first);
        // ...then the new one.
        let t1 = t0 + CERT_CHECK_INTERVAL;
        assert_eq!(reloading.current(t1).cert[0], second);
        // A broken rotation keeps the last good certificate.
        std::fs::write(&files.cert, "half-written").unwrap();
        std::fs::File::options()
            .write(true)
            .open(&files.cert)
            .unwrap()
            .set_modified(later + Duration::from_secs(5))
            .unwrap();
        let t2 = t1 + CERT_CHECK_INTERVAL;
        assert_eq!(reloading.current(t2).cert[0], second);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
