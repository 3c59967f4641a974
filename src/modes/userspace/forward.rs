//! The userspace forwarding engine shared by the userspace mode and localhost NodePorts: a
//! listener per port that accepts TCP connections and UDP sessions and forwards them to the
//! current endpoints, round-robin, honouring ClientIP affinity. Connections in flight keep
//! their endpoint across endpoint changes; a UDP session whose endpoint went away picks a new
//! one on its next datagram.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use crate::model::Protocol;

/// Where one listener forwards to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Forward {
    pub endpoints: Vec<SocketAddr>,
    pub affinity: Option<Duration>,
}

/// Endpoint choice for one listener; updated in place when endpoints change.
#[derive(Default)]
pub struct Balancer {
    forward: RwLock<Option<Forward>>,
    next: AtomicUsize,
    sticky: Mutex<HashMap<IpAddr, (SocketAddr, Instant)>>,
    /// Counts each connection and UDP session forwarded: what upstream's NAT-table nfacct
    /// rule counts for localhost NodePorts (the first packet of each connection).
    accepted: Option<Arc<AtomicU64>>,
}

impl Balancer {
    pub fn set(&self, f: Forward) {
        *self.forward.write().expect("balancer") = Some(f);
    }

    fn note_accepted(&self) {
        if let Some(c) = &self.accepted {
            c.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Where it forwards now.
    pub fn current(&self) -> Option<Forward> {
        self.forward.read().expect("balancer").clone()
    }

    fn has(&self, ep: &SocketAddr) -> bool {
        self.forward
            .read()
            .expect("balancer")
            .as_ref()
            .is_some_and(|f| f.endpoints.contains(ep))
    }

    /// Picks an endpoint for `client`: its sticky one while affinity lasts, else the next in
    /// round-robin order.
    pub fn pick(&self, client: IpAddr) -> Option<SocketAddr> {
        let f = self.forward.read().expect("balancer").clone()?;
        if f.endpoints.is_empty() {
            return None;
        }
        if let Some(t) = f.affinity {
            let mut s = self.sticky.lock().expect("affinity");
            if let Some((ep, at)) = s.get(&client) {
                if at.elapsed() < t && f.endpoints.contains(ep) {
                    let ep = *ep;
                    s.insert(client, (ep, Instant::now()));
                    return Some(ep);
                }
            }
            let ep = f.endpoints[self.next.fetch_add(1, Ordering::Relaxed) % f.endpoints.len()];
            s.insert(client, (ep, Instant::now()));
            return Some(ep);
        }
        Some(f.endpoints[self.next.fetch_add(1, Ordering::Relaxed) % f.endpoints.len()])
    }
}

/// A running listener; stops when dropped.
pub struct Listener {
    task: tokio::task::JoinHandle<()>,
    pub balancer: Arc<Balancer>,
    /// The bound port (chosen by the kernel when asked for port 0).
    pub port: u16,
}

impl Drop for Listener {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Binds `addr` for `proto` and starts forwarding to `f`. Must run inside the runtime.
pub fn listen(proto: Protocol, addr: SocketAddr, f: Forward) -> std::io::Result<Listener> {
    listen_counted(proto, addr, f, None)
}

/// [`listen`], adding each connection or UDP session it forwards to `accepted`.
pub fn listen_counted(
    proto: Protocol,
    addr: SocketAddr,
    f: Forward,
    accepted: Option<Arc<AtomicU64>>,
) -> std::io::Result<Listener> {
    let b = Arc::new(Balancer {
        accepted,
        ..Balancer::default()
    });
    b.set(f);
    let (task, port) = match proto {
        Protocol::Tcp => {
            let l = std::net::TcpListener::bind(addr)?;
            l.set_nonblocking(true)?;
            let port = l.local_addr()?.port();
            let l = tokio::net::TcpListener::from_std(l)?;
            (tokio::spawn(serve_tcp(l, b.clone())), port)
        }
        Protocol::Udp => {
            let s = std::net::UdpSocket::bind(addr)?;
            s.set_nonblocking(true)?;
            let port = s.local_addr()?.port();
            let s = tokio::net::UdpSocket::from_std(s)?;
            (tokio::spawn(serve_udp(Arc::new(s), b.clone())), port)
        }
        Protocol::Sctp => {
            return Err(std::io::Error::new(
                std::io::ErrorKind::Unsupported,
                "SCTP cannot be proxied in userspace",
            ))
        }
    };
    Ok(Listener {
        task,
        balancer: b,
        port,
    })
}

async fn serve_tcp(l: tokio::net::TcpListener, b: Arc<Balancer>) {
    loop {
        let Ok((mut client, peer)) = l.accept().await else {
            continue;
        };
        let Some(ep) = b.pick(peer.ip()) else {
            drop(client); // no endpoint: the connection is refused by closing it
            continue;
        };
        b.note_accepted();
        tokio::spawn(async move {
            match tokio::net::TcpStream::connect(ep).await {
                Ok(mut up) => {
                    let _ = tokio::io::copy_bidirectional(&mut client, &mut up).await;
                }
                Err(e) => {
                    tracing::debug!(endpoint = %ep, err = %e, "userspace proxy: cannot reach endpoint")
                }
            }
        });
    }
}

const UDP_IDLE: Duration = Duration::from_secs(60);

struct Session {
    up: Arc<tokio::net::UdpSocket>,
    ep: SocketAddr,
    last: Instant,
    relay: tokio::task::JoinHandle<()>,
}

/// UDP sessions by client address.
type Sessions = Arc<Mutex<HashMap<SocketAddr, Session>>>;

async fn serve_udp(sock: Arc<tokio::net::UdpSocket>, b: Arc<Balancer>) {
    // One upstream socket per client address; replies are relayed back from it.
    let sessions: Sessions = Arc::default();
    let mut buf = vec![0u8; 65536];
    loop {
        let Ok((n, client)) = sock.recv_from(&mut buf).await else {
            continue;
        };
        let existing = {
            let mut s = sessions.lock().expect("sessions");
            match s.get_mut(&client) {
                // The endpoint is gone: start over with a live one.
                Some(sess) if !b.has(&sess.ep) => {
                    if let Some(old) = s.remove(&client) {
                        old.relay.abort();
                    }
                    None
                }
                Some(sess) => {
                    sess.last = Instant::now();
                    Some(sess.up.clone())
                }
                None => None,
            }
        };
        let up = match existing {
            Some(s) => s,
            None => {
                let Some(ep) = b.pick(client.ip()) else {
                    continue;
                };
                b.note_accepted();
                let bind = if ep.is_ipv4() { "0.0.0.0:0" } else { "[::]:0" };
                let Ok(up) = tokio::net::UdpSocket::bind(bind).await else {
                    continue;
                };
                if up.connect(ep).await.is_err() {
                    continue;
                }
                let up = Arc::new(up);
                let (up2, sock2, sessions2) = (up.clone(), sock.clone(), sessions.clone());
                let relay = tokio::spawn(async move {
                    let mut rb = vec![0u8; 65536];
                    loop {
                        match tokio::time::timeout(UDP_IDLE, up2.recv(&mut rb)).await {
                            Ok(Ok(m)) => {
                                let _ = sock2.send_to(&rb[..m], client).await;
                            }
                            // Idle (or broken): end the session.
                            _ => {
                                sessions2.lock().expect("sessions").remove(&client);
                                return;
                            }
                        }
                    }
                });
                sessions.lock().expect("sessions").insert(
                    client,
                    Session {
                        up: up.clone(),
                        ep,
                        last: Instant::now(),
                        relay,
                    },
                );
                up
            }
        };
        let _ = up.send(&buf[..n]).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_robin_and_affinity() {
        let b = Balancer::default();
        let eps: Vec<SocketAddr> = vec![
            "10.0.0.1:80".parse().unwrap(),
            "10.0.0.2:80".parse().unwrap(),
        ];
        b.set(Forward {
            endpoints: eps.clone(),
            affinity: None,
        });
        let c: IpAddr = "127.0.0.1".parse().unwrap();
        let picks: Vec<_> = (0..4).map(|_| b.pick(c).unwrap()).collect();
        assert_eq!(picks, [eps[0], eps[1], eps[0], eps[1]], "round-robin");
        b.set(Forward {
            endpoints: eps,
            affinity: Some(Duration::from_secs(60)),
        });
        let first = b.pick(c).unwrap();
        assert!((0..5).all(|_| b.pick(c) == Some(first)), "sticky");
        b.set(Forward {
            endpoints: vec![],
            affinity: None,
        });
        assert_eq!(b.pick(c), None);
    }

    #[tokio::test]
    async fn counted_listeners_count_connections_and_udp_sessions() {
        let backend = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let ep = backend.local_addr().unwrap();
        let accepted = Arc::new(AtomicU64::new(0));
        let f = Forward {
            endpoints: vec![ep],
            affinity: None,
        };
        let l = listen_counted(
            Protocol::Tcp,
            "127.0.0.1:0".parse().unwrap(),
            f,
            Some(accepted.clone()),
        )
        .unwrap();
        for _ in 0..3 {
            let c = tokio::net::TcpStream::connect(("127.0.0.1", l.port))
                .await
                .unwrap();
            drop(c);
        }
        // Bounded: the listener task counts after accepting.
        let settled = |want: u64| {
            let accepted = accepted.clone();
            async move {
                let deadline = Instant::now() + Duration::from_secs(5);
                while accepted.load(Ordering::Relaxed) < want && Instant::now() < deadline {
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
                accepted.load(Ordering::Relaxed)
            }
        };
        assert_eq!(settled(3).await, 3, "one per connection");
        // UDP: one session per client address, however many datagrams it sends.
        let up = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        let f = Forward {
            endpoints: vec![up.local_addr().unwrap()],
            affinity: None,
        };
        let u = listen_counted(
            Protocol::Udp,
            "127.0.0.1:0".parse().unwrap(),
            f,
            Some(accepted.clone()),
        )
        .unwrap();
        let client = tokio::net::UdpSocket::bind("127.0.0.1:0").await.unwrap();
        for _ in 0..3 {
            client.send_to(b"x", ("127.0.0.1", u.port)).await.unwrap();
        }
        settled(4).await;
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert_eq!(accepted.load(Ordering::Relaxed), 4, "one per UDP session");
        // An uncounted listener counts nothing.
        let plain = listen(
            Protocol::Tcp,
            "127.0.0.1:0".parse().unwrap(),
            Forward {
                endpoints: vec![ep],
                affinity: None,
            },
        )
        .unwrap();
        drop(
            tokio::net::TcpStream::connect(("127.0.0.1", plain.port))
                .await
                .unwrap(),
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert_eq!(accepted.load(Ordering::Relaxed), 4);
    }
}
