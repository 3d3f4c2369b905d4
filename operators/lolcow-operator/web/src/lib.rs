//! # lolcow-web
//!
//! A tiny web server that shows a cow saying a greeting, cowsay style.
//!
//! - `GET /` answers with a playful HTML page, or with the plain-text cow
//!   for clients that ask for `text/plain` (and for `curl` and friends
//!   sending `Accept: */*`).
//! - `GET /healthz` answers `ok`, on the page's port and, with `PROBE_PORT`
//!   (`--probe-port`), on a listener of its own for the kubelet: clients of
//!   the page, however many and however slow, cannot keep the probes from
//!   being answered. The lolcow operator's Deployment probes that port.
//!
//! Both listeners run `serving`'s loop: header-read, idle and write
//! timeouts, head-size and connection limits, a per-client-address limit
//! (a further connection of the address takes the place of its oldest idle
//! one, so clients behind one NAT address are not locked out), fixed socket
//! buffers (the page with `Limits::PUBLIC` changed by the flags,
//! the probes with `Limits::PROBES`). Every slot of both taken, they hold at
//! most ~22 MiB against the 64 MiB limit the operator gives the container.
//!
//! The greeting comes from the first positional argument, else the
//! `GREETING` environment variable, else a random built-in fortune. See
//! [`config::Config`] for the listen address options.
//!
//! The layout logic (bubble, wrapping, escaping) lives in [`cow`] and has no
//! I/O, the HTML and content negotiation in [`page`], the HTTP routes in
//! [`server`].

pub mod config;
pub mod cow;
pub mod fortune;
pub mod page;
pub mod server;
