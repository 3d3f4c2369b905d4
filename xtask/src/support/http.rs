//! A minimal HTTP client for the plain-HTTP endpoints on this machine (an operator's
//! probes and metrics, the Pulsar broker's admin API).

use anyhow::{Context, Result};
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

/// An HTTP/1.0 GET of `path` on 127.0.0.1:`port`: the status code and the body.
///
/// # Errors
/// When nothing answers there, or the answer is not HTTP.
pub fn get(port: u16, path: &str) -> Result<(u16, String)> {
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(2))
        .with_context(|| format!("connecting to {addr}"))?;
    s.set_read_timeout(Some(Duration::from_secs(10)))?;
    s.set_write_timeout(Some(Duration::from_secs(5)))?;
    write!(
        s,
        "GET {path} HTTP/1.0\r\nHost: 127.0.0.1:{port}\r\nAccept: application/json\r\nConnection: close\r\n\r\n"
    )?;
    let mut buf = Vec::new();
    s.read_to_end(&mut buf)?;
    let text = String::from_utf8_lossy(&buf);
    let (head, body) = text
        .split_once("\r\n\r\n")
        .context("malformed HTTP response")?;
    let code = head
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .context("malformed HTTP response")?;
    Ok((code, body.to_owned()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::TcpListener;

    #[test]
    fn reads_the_code_and_the_body() -> Result<()> {
        let listener = TcpListener::bind("127.0.0.1:0")?;
        let port = listener.local_addr()?.port();
        let server = std::thread::spawn(move || -> std::io::Result<String> {
            let (mut stream, _) = listener.accept()?;
            // The whole request first: closing with unread bytes would reset the
            // connection before the client reads the answer.
            let mut request = Vec::new();
            let mut chunk = [0u8; 512];
            while !request.ends_with(b"\r\n\r\n") {
                let n = stream.read(&mut chunk)?;
                if n == 0 {
                    break;
                }
                request.extend_from_slice(&chunk[..n]);
            }
            stream.write_all(b"HTTP/1.0 503 Service Unavailable\r\nX: y\r\n\r\nnot yet")?;
            Ok(String::from_utf8_lossy(&request).into_owned())
        });
        assert_eq!(get(port, "/readyz")?, (503, "not yet".to_owned()));
        let request = server
            .join()
            .map_err(|_| anyhow::anyhow!("server panicked"))??;
        assert!(request.starts_with("GET /readyz HTTP/1.0\r\n"), "{request}");
        Ok(())
    }
}
