//! Asking the cluster's DNS server what a client in a pod would ask: the A records of a
//! name. A UDP query of one question, as a stub resolver sends it; enough to check what a
//! Service's name resolves to from this machine (the DNS Service's ClusterIP is reachable
//! through kube-proxy's rules).

use std::net::{Ipv4Addr, SocketAddr};
use std::time::Duration;

use anyhow::{Context, Result, bail, ensure};
use k8s_openapi::api::core::v1::Service;
use tokio::net::UdpSocket;

/// Record type A (an IPv4 address), class IN.
const TYPE_A: u16 = 1;
const CLASS_IN: u16 = 1;

/// The query for the A records of `name` (a fully qualified name, no trailing dot needed).
fn query(id: u16, name: &str) -> Result<Vec<u8>> {
    let mut q = Vec::with_capacity(18 + name.len());
    q.extend(id.to_be_bytes());
    q.extend(0x0100u16.to_be_bytes()); // a standard query, recursion desired
    q.extend([0, 1, 0, 0, 0, 0, 0, 0]); // one question, no other records
    for label in name.trim_end_matches('.').split('.') {
        ensure!(
            !label.is_empty() && label.len() < 64,
            "bad label {label:?} in {name}"
        );
        q.push(u8::try_from(label.len())?);
        q.extend(label.as_bytes());
    }
    q.push(0);
    q.extend(TYPE_A.to_be_bytes());
    q.extend(CLASS_IN.to_be_bytes());
    Ok(q)
}

/// The offset just past the (possibly compressed) name that starts at `at`.
fn skip_name(m: &[u8], mut at: usize) -> Result<usize> {
    loop {
        let len = *m.get(at).context("answer cut short in a name")?;
        match len {
            0 => return Ok(at + 1),
            l if l & 0xC0 == 0xC0 => return Ok(at + 2),
            l => at += 1 + usize::from(l),
        }
    }
}

fn u16_at(m: &[u8], at: usize) -> Result<u16> {
    let b = m.get(at..at + 2).context("answer cut short")?;
    Ok(u16::from_be_bytes([b[0], b[1]]))
}

/// The IPv4 addresses in the answer section of the reply `m` to the query `id`; an empty
/// list for a name that does not exist (NXDOMAIN) or has no A record.
fn addresses(m: &[u8], id: u16) -> Result<Vec<Ipv4Addr>> {
    ensure!(m.len() >= 12, "a reply of {} bytes", m.len());
    ensure!(u16_at(m, 0)? == id, "a reply to another query");
    match u16_at(m, 2)? & 0x000F {
        0 | 3 => {}
        rcode => bail!("the DNS server answered with rcode {rcode}"),
    }
    let (questions, answers) = (u16_at(m, 4)?, u16_at(m, 6)?);
    let mut at = 12;
    for _ in 0..questions {
        at = skip_name(m, at)? + 4;
    }
    let mut found = Vec::new();
    for _ in 0..answers {
        at = skip_name(m, at)?;
        let (type_, class, len) = (u16_at(m, at)?, u16_at(m, at + 2)?, u16_at(m, at + 8)?);
        at += 10;
        let data = m
            .get(at..at + usize::from(len))
            .context("answer cut short in a record")?;
        if type_ == TYPE_A && class == CLASS_IN && data.len() == 4 {
            found.push(Ipv4Addr::new(data[0], data[1], data[2], data[3]));
        }
        at += usize::from(len);
    }
    found.sort();
    Ok(found)
}

/// The cluster's DNS server: the ClusterIP of `kube-system/kube-dns`, port 53.
///
/// # Errors
/// When the Service cannot be read or has no IP.
pub async fn cluster_server(client: &kube::Client) -> Result<SocketAddr> {
    let api: kube::Api<Service> = kube::Api::namespaced(client.clone(), "kube-system");
    let ip = api
        .get("kube-dns")
        .await?
        .spec
        .and_then(|s| s.cluster_ip)
        .context("kube-system/kube-dns has no ClusterIP")?;
    Ok(SocketAddr::new(ip.parse()?, 53))
}

/// The name a pod resolves for the Service `name` of `namespace`.
#[must_use]
pub fn service_name(name: &str, namespace: &str) -> String {
    format!("{name}.{namespace}.svc.cluster.local")
}

/// The A records of `name` as the DNS server at `server` answers them, sorted; empty when
/// the name does not exist or has none. Errors when no answer comes within 5 s.
///
/// # Errors
/// When the query cannot be sent, no answer comes, or the answer is not one.
pub async fn resolve_a(server: SocketAddr, name: &str) -> Result<Vec<Ipv4Addr>> {
    let id = u16::try_from(std::process::id() & 0xFFFF)?;
    let socket = UdpSocket::bind("0.0.0.0:0").await?;
    socket.send_to(&query(id, name)?, server).await?;
    let mut buf = [0u8; 1500];
    let (n, _) = tokio::time::timeout(Duration::from_secs(5), socket.recv_from(&mut buf))
        .await
        .with_context(|| format!("no answer from {server} for {name}"))??;
    addresses(&buf[..n], id)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn reads_the_a_records_of_an_answer_with_compressed_names() {
        let mut m = query(7, "cache.ns.svc.cluster.local").unwrap();
        m[2] = 0x81; // a response
        m[3] = 0x80;
        m[7] = 3; // three answers: two A records and a CNAME-like record of another type
        for (type_, data) in [
            (TYPE_A, vec![10, 244, 0, 9]),
            (5, vec![0xC0, 12]),
            (TYPE_A, vec![10, 244, 0, 7]),
        ] {
            m.extend([0xC0, 12]); // the question's name
            m.extend(type_.to_be_bytes());
            m.extend(CLASS_IN.to_be_bytes());
            m.extend([0, 0, 0, 5]);
            m.extend(u16::try_from(data.len()).unwrap().to_be_bytes());
            m.extend(data);
        }
        assert_eq!(
            addresses(&m, 7).unwrap(),
            [Ipv4Addr::new(10, 244, 0, 7), Ipv4Addr::new(10, 244, 0, 9)]
        );
        assert!(addresses(&m, 8).is_err(), "another query's answer");
        m[7] = 4; // a record promised but missing
        assert!(addresses(&m, 7).is_err());
    }

    #[test]
    fn a_name_that_does_not_exist_has_no_address() {
        let mut m = query(1, "nothing.ns.svc.cluster.local").unwrap();
        m[2] = 0x81;
        m[3] = 0x83; // NXDOMAIN
        assert!(addresses(&m, 1).unwrap().is_empty());
        m[3] = 0x82; // SERVFAIL
        assert!(addresses(&m, 1).is_err());
    }
}
