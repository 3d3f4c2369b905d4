//! # lolcow-web
//!
//! A tiny web server that shows a cow saying a greeting, cowsay style.
//!
//! - `GET /` answers with a playful HTML page, or with the plain-text cow
//!   for clients that ask for `text/plain` (and for `curl` and friends
//!   sending `Accept: */*`).
//! - `GET /healthz` answers `ok`.
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
