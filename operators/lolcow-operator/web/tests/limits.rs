//! The server's limits against slow and idle clients (slowloris): half-written requests
//! neither block the page nor stay open past the header-read timeout.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::io::{Read, Write};
use std::net::{Ipv4Addr, TcpStream};
use std::time::{Duration, Instant};

use common::Server;

/// Whether the server closes `stream` (EOF or reset) before `deadline`.
fn closed_by(stream: &mut TcpStream, deadline: Instant) -> bool {
    let mut buf = [0_u8; 1024];
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return false;
        }
        stream.set_read_timeout(Some(left)).unwrap();
        match stream.read(&mut buf) {
            Ok(0) => return true,
            Ok(_) => {}
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                return false;
            }
            Err(_) => return true,
        }
    }
}

#[test]
fn half_written_connections_neither_block_the_page_nor_stay_open() {
    let timeout = Duration::from_secs(2);
    let server = Server::start_with_env(Some("still here"), &[("HEADER_READ_TIMEOUT", "2s")]);
    let opened = Instant::now();
    let mut idle: Vec<TcpStream> = (0..300)
        .map(|_| {
            let mut s = TcpStream::connect((Ipv4Addr::LOCALHOST, server.port)).unwrap();
            s.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n").unwrap();
            s
        })
        .collect();

    let asked = Instant::now();
    let resp = server.get("/", &[("Accept", "text/plain")]);
    let took = asked.elapsed();
    assert_eq!(resp.status, 200);
    assert!(resp.body.contains("still here"), "{}", resp.body);
    assert!(
        took < Duration::from_secs(1),
        "the page took {took:?} with 300 half-written connections open"
    );

    // Every half-written connection is closed by the server after the timeout, not before.
    let deadline = opened + timeout + Duration::from_secs(5);
    for (i, s) in idle.iter_mut().enumerate() {
        assert!(
            closed_by(s, deadline),
            "connection {i} still open after {:?}",
            opened.elapsed()
        );
    }
    assert!(
        opened.elapsed() >= timeout - Duration::from_millis(200),
        "closed after {:?}, before the {timeout:?} timeout",
        opened.elapsed()
    );
    // And the server still serves.
    assert_eq!(server.get("/healthz", &[]).status, 200);
}

#[test]
fn idle_keep_alive_connections_are_closed_after_the_timeout() {
    let server = Server::start_with_env(Some("Hi"), &[("HEADER_READ_TIMEOUT", "500ms")]);
    let mut s = TcpStream::connect((Ipv4Addr::LOCALHOST, server.port)).unwrap();
    s.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        .unwrap();
    let mut buf = [0_u8; 1024];
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let n = s.read(&mut buf).unwrap();
    assert!(String::from_utf8_lossy(&buf[..n]).starts_with("HTTP/1.1 200"));
    let waited = Instant::now();
    assert!(
        closed_by(&mut s, waited + Duration::from_secs(5)),
        "kept open"
    );
    assert!(
        waited.elapsed() >= Duration::from_millis(400),
        "{:?}",
        waited.elapsed()
    );
}

#[test]
fn oversized_request_bodies_are_refused() {
    let server = Server::start_with_env(Some("Hi"), &[("MAX_BODY_BYTES", "1024")]);
    let mut s = TcpStream::connect((Ipv4Addr::LOCALHOST, server.port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    s.write_all(b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 1048576\r\n\r\n")
        .unwrap();
    let mut answer = String::new();
    let _ = s.read_to_string(&mut answer);
    assert!(answer.starts_with("HTTP/1.1 413"), "{answer}");
}
