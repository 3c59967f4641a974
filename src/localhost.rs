//! Localhost NodePorts in userspace (upstream KEP-6032): nftables DNAT cannot serve
//! `127.0.0.1:<nodePort>` without `route_localnet`, so with `--localhost-nodeports` the daemon
//! listens on 127.0.0.1 for each NodePort and forwards TCP connections and UDP sessions to the
//! Service's usable endpoints, round-robin, honouring ClientIP affinity. Connections in flight
//! keep their endpoint across endpoint changes; listeners come and go with Services. The plan
//! is pure; [`LocalhostNodePorts`] does the I/O.

use std::collections::{BTreeMap, HashMap};
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use crate::model::topology::categorize_family;
use crate::model::{Protocol, ProxyState};

/// Where one localhost NodePort forwards to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Forward {
    pub endpoints: Vec<SocketAddr>,
    pub affinity: Option<Duration>,
}

/// The localhost NodePorts wanted by `state` (IPv4 endpoints; 127.0.0.1 is IPv4), keyed by
/// protocol and port. A port whose Service has no usable endpoint is still listened on and
/// refuses connections, as the kernel path rejects them.
pub fn plan_localhost(state: &ProxyState) -> BTreeMap<(Protocol, u16), Forward> {
    let mut out = BTreeMap::new();
    let none = Vec::new();
    for (spn, sp) in &state.services {
        let Some(np) = sp.node_port else { continue };
        if spn.protocol == Protocol::Sctp {
            continue;
        }
        let eps = state.endpoints.get(spn).unwrap_or(&none);
        let cat = categorize_family(eps, sp, &state.node, true);
        // Traffic to a NodePort is external traffic: the external policy decides.
        let chosen = if sp.external_policy_local {
            &cat.local
        } else {
            &cat.cluster
        };
        out.insert(
            (spn.protocol, np),
            Forward {
                endpoints: chosen
                    .iter()
                    .map(|e| SocketAddr::new(e.ip, e.port))
                    .collect(),
                affinity: sp.affinity_timeout.map(|t| Duration::from_secs(t as u64)),
            },
        );
    }
    out
}

#[derive(Default)]
struct Balancer {
    forward: RwLock<Option<Forward>>,
    next: AtomicUsize,
    sticky: Mutex<HashMap<IpAddr, (SocketAddr, Instant)>>,
}

impl Balancer {
    /// Picks an endpoint for `client`: its sticky one while affinity lasts, else the next in
    /// round-robin order.
    fn pick(&self, client: IpAddr) -> Option<SocketAddr> {
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

/// Running localhost listeners.
#[derive(Default)]
pub struct LocalhostNodePorts {
    listeners: BTreeMap<(Protocol, u16), (tokio::task::JoinHandle<()>, Arc<Balancer>)>,
    failed: std::collections::BTreeSet<(Protocol, u16)>,
}

const UDP_IDLE: Duration = Duration::from_secs(60);

/// UDP sessions: client address → (upstream socket, last use).
type Sessions = Arc<Mutex<HashMap<SocketAddr, (Arc<tokio::net::UdpSocket>, Instant)>>>;

impl LocalhostNodePorts {
    pub fn new() -> Self {
        Self::default()
    }

    /// Starts, updates and stops listeners to match `want`. Must run inside the runtime. A
    /// port that cannot be bound is reported once and retried at the next sync.
    pub fn sync(&mut self, want: BTreeMap<(Protocol, u16), Forward>) {
        self.listeners.retain(|k, (h, _)| {
            let keep = want.contains_key(k);
            if !keep {
                h.abort();
            }
            keep
        });
        for (k, f) in want {
            if let Some((_, b)) = self.listeners.get(&k) {
                *b.forward.write().expect("balancer") = Some(f);
                continue;
            }
            let b = Arc::new(Balancer::default());
            *b.forward.write().expect("balancer") = Some(f);
            let addr = SocketAddr::from(([127, 0, 0, 1], k.1));
            let task = match k.0 {
                Protocol::Tcp => std::net::TcpListener::bind(addr)
                    .and_then(|l| {
                        l.set_nonblocking(true)?;
                        tokio::net::TcpListener::from_std(l)
                    })
                    .map(|l| tokio::spawn(serve_tcp(l, b.clone()))),
                _ => std::net::UdpSocket::bind(addr)
                    .and_then(|s| {
                        s.set_nonblocking(true)?;
                        tokio::net::UdpSocket::from_std(s)
                    })
                    .map(|s| tokio::spawn(serve_udp(Arc::new(s), b.clone()))),
            };
            match task {
                Ok(h) => {
                    self.failed.remove(&k);
                    self.listeners.insert(k, (h, b));
                }
                Err(e) => {
                    if self.failed.insert(k) {
                        tracing::error!(
                            port = k.1,
                            proto = k.0.lower(),
                            "cannot listen for localhost NodePort: {e}"
                        );
                    }
                }
            }
        }
    }
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
        tokio::spawn(async move {
            match tokio::net::TcpStream::connect(ep).await {
                Ok(mut up) => {
                    let _ = tokio::io::copy_bidirectional(&mut client, &mut up).await;
                }
                Err(e) => tracing::debug!(%ep, "localhost NodePort: cannot reach endpoint: {e}"),
            }
        });
    }
}

async fn serve_udp(sock: Arc<tokio::net::UdpSocket>, b: Arc<Balancer>) {
    // One upstream socket per client address; replies are relayed back from it.
    let sessions: Sessions = Arc::default();
    let mut buf = vec![0u8; 65536];
    loop {
        let Ok((n, client)) = sock.recv_from(&mut buf).await else {
            continue;
        };
        let existing = sessions
            .lock()
            .expect("sessions")
            .get(&client)
            .map(|(s, _)| s.clone());
        let up = match existing {
            Some(s) => s,
            None => {
                let Some(ep) = b.pick(client.ip()) else {
                    continue;
                };
                let Ok(up) = tokio::net::UdpSocket::bind("0.0.0.0:0").await else {
                    continue;
                };
                if up.connect(ep).await.is_err() {
                    continue;
                }
                let up = Arc::new(up);
                sessions
                    .lock()
                    .expect("sessions")
                    .insert(client, (up.clone(), Instant::now()));
                let (up2, sock2, sessions2) = (up.clone(), sock.clone(), sessions.clone());
                tokio::spawn(async move {
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
                up
            }
        };
        if let Some(e) = sessions.lock().expect("sessions").get_mut(&client) {
            e.1 = Instant::now();
        }
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
        *b.forward.write().unwrap() = Some(Forward {
            endpoints: eps.clone(),
            affinity: None,
        });
        let c: IpAddr = "127.0.0.1".parse().unwrap();
        let picks: std::collections::BTreeSet<_> = (0..4).map(|_| b.pick(c).unwrap()).collect();
        assert_eq!(picks.len(), 2, "round-robin over both");
        *b.forward.write().unwrap() = Some(Forward {
            endpoints: eps,
            affinity: Some(Duration::from_secs(60)),
        });
        let first = b.pick(c).unwrap();
        assert!((0..5).all(|_| b.pick(c) == Some(first)), "sticky");
        *b.forward.write().unwrap() = Some(Forward {
            endpoints: vec![],
            affinity: None,
        });
        assert_eq!(b.pick(c), None);
    }
}
