//! An instance's default IP: the local address of the route toward the registry, the address
//! the kernel would give a connection to it. `gangway run` registers its child with it and
//! `gangway offline`, `online` and `drain` look the instance up with it, so a preStop hook
//! without `GANGWAY_IP` names the instance the wrapper registered (on one host, behind one
//! route). In Kubernetes this is the pod IP (`status.podIP`).

use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, UdpSocket};

/// The local IP the kernel would use to connect to `target` (`HOST:PORT`, `[IPV6]:PORT`, with
/// or without `http://` or `https://`; of a list `A,B`, the first address: the nodes of one
/// registry are behind one route, and the first is the one every command names alike).
///
/// Nothing is sent: a UDP socket is connected, which only picks the route, and asked for its
/// local address. A host name is resolved first; its first address counts.
///
/// # Errors
/// The name does not resolve, or no route leads to it (`ENETUNREACH`).
pub async fn local_ip_toward(target: &str) -> io::Result<IpAddr> {
    let first = target.split(',').next().unwrap_or(target);
    let host_port = crate::args::strip_scheme(first);
    let host_port = host_port.strip_suffix('/').unwrap_or(host_port);
    let peer = tokio::net::lookup_host(host_port)
        .await?
        .next()
        .ok_or_else(|| io::Error::new(io::ErrorKind::NotFound, "the name has no address"))?;
    source_toward(peer)
}

/// The source address of the route toward `peer`.
fn source_toward(peer: SocketAddr) -> io::Result<IpAddr> {
    let any: IpAddr = match peer {
        SocketAddr::V4(_) => Ipv4Addr::UNSPECIFIED.into(),
        SocketAddr::V6(_) => Ipv6Addr::UNSPECIFIED.into(),
    };
    let socket = UdpSocket::bind((any, 0))?;
    socket.connect(peer)?;
    Ok(socket.local_addr()?.ip())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn loopback_is_reached_from_loopback() {
        for target in [
            "127.0.0.1:8848",
            "http://127.0.0.1:8848/",
            "localhost:9848",
            "127.0.0.1:8848,192.0.2.1:8848",
        ] {
            let ip = local_ip_toward(target).await.unwrap();
            assert!(ip.is_loopback(), "{target}: {ip}");
        }
    }

    #[tokio::test]
    async fn it_is_the_address_a_tcp_connection_gets() {
        // The first non-loopback local address, when the machine has one, and 127.0.0.1.
        let outward = local_ip_toward("192.0.2.1:80").await.ok();
        for ip in [Some(IpAddr::from(Ipv4Addr::LOCALHOST)), outward]
            .into_iter()
            .flatten()
        {
            let listener = tokio::net::TcpListener::bind((ip, 0)).await.unwrap();
            let target = listener.local_addr().unwrap();
            let stream = tokio::net::TcpStream::connect(target).await.unwrap();
            assert_eq!(
                local_ip_toward(&target.to_string()).await.unwrap(),
                stream.local_addr().unwrap().ip()
            );
        }
    }

    #[tokio::test]
    async fn an_address_without_a_port_is_an_error() {
        // No port: refused before any DNS query.
        assert!(local_ip_toward("no port").await.is_err());
        assert!(local_ip_toward("").await.is_err());
    }
}
