//! The server's limits against slow, idle and greedy clients (slowloris): half-written
//! requests neither block the page nor stay open past the header-read timeout, one client
//! address gets at most its share of the page's connections (a newcomer of that address
//! taking the place of its oldest idle one, so clients behind one NAT address are not
//! locked out), and nothing done to the page reaches the probe listener.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpStream};
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
    // One client address may take them all here: this is about the timeout.
    let server = Server::start_with_env(
        Some("still here"),
        &[
            ("HEADER_READ_TIMEOUT", "2s"),
            ("MAX_CONNECTIONS", "1024"),
            ("MAX_CONNECTIONS_PER_PEER", "1024"),
        ],
    );
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

/// A connection to `port` on 127.0.0.1 from 127.0.0.`host` (all of 127/8 is the loopback
/// interface): another client address for the server.
fn connect_from(host: u8, port: u16) -> TcpStream {
    let socket = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
    let from = SocketAddr::from((Ipv4Addr::new(127, 0, 0, host), 0));
    socket.bind(&from.into()).unwrap();
    let to = SocketAddr::from((Ipv4Addr::LOCALHOST, port));
    socket.connect(&to.into()).unwrap();
    socket.into()
}

/// `GET path` on a new connection from 127.0.0.`host`; the answer, empty when the server
/// closed the connection without one.
fn get_from(host: u8, port: u16, path: &str) -> String {
    let mut s = connect_from(host, port);
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let request = format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
    let _ = s.write_all(request.as_bytes());
    let mut out = Vec::new();
    let mut buf = [0_u8; 4096];
    while let Ok(n) = s.read(&mut buf) {
        if n == 0 {
            break;
        }
        out.extend_from_slice(&buf[..n]);
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[test]
fn a_flood_of_the_page_neither_reaches_the_probes_nor_keeps_other_clients_out() {
    let server = Server::start(Some("still here"));
    // 1,100 half-written requests from one address (it holds 64 of the 256 slots: each
    // one beyond is closed at once, or displaces the oldest once that is a second old),
    // then 64 more from each of three others: every slot taken.
    let mut flood = Vec::new();
    for (host, count) in [(1, 1100), (2, 64), (3, 64), (4, 64)] {
        for _ in 0..count {
            let mut s = connect_from(host, server.port);
            let _ = s.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n");
            flood.push(s);
        }
    }
    // A second on, the oldest of the flood are past their time to send a head untouched.
    std::thread::sleep(Duration::from_millis(1100));
    let started = Instant::now();
    // The kubelet, from a flooding address, still gets its probe at once.
    let probe = server.get_probe("/healthz");
    assert_eq!((probe.status, probe.body.as_str()), (200, "ok"));
    // The address that sent 1,100 is at its limit, and still gets the page (its oldest
    // half-written connection gives way: behind a NAT it may be another client's)...
    let same = get_from(1, server.port, "/");
    assert!(same.starts_with("HTTP/1.1 200"), "{same}");
    // ...and so does a new client address.
    let page = get_from(9, server.port, "/");
    assert!(page.starts_with("HTTP/1.1 200"), "{page}");
    assert!(page.contains("still here"), "{page}");
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "answered after {:?}",
        started.elapsed()
    );
    // Of the 1,100, the server closed all but the last 64 at once, and one of those for
    // the same address's page (and maybe one for the new client).
    let deadline = Instant::now() + Duration::from_secs(3);
    let mut closed = 0;
    for s in &mut flood[..1100] {
        // At least 20 ms each once the deadline passed (the open ones used it up).
        if closed_by(s, deadline.max(Instant::now() + Duration::from_millis(20))) {
            closed += 1;
        }
    }
    assert!(
        (1100 - 63..=1100 - 62).contains(&closed),
        "{closed} of 1,100 connections from one address were closed"
    );
}

#[test]
fn heads_over_the_limit_get_431() {
    let server = Server::start_with_env(Some("Hi"), &[("MAX_HEADER_BYTES", "2048")]);
    let padded = |len: usize| {
        let start = "GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\nX-Pad: ";
        format!("{start}{}\r\n\r\n", "a".repeat(len - start.len() - 4))
    };
    let answer = |request: String| {
        let mut s = TcpStream::connect((Ipv4Addr::LOCALHOST, server.port)).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        s.write_all(request.as_bytes()).unwrap();
        let mut out = String::new();
        let _ = s.read_to_string(&mut out);
        out
    };
    assert!(answer(padded(2000)).starts_with("HTTP/1.1 200"));
    let refused = answer(padded(4000));
    assert!(refused.starts_with("HTTP/1.1 431"), "{refused}");
}
