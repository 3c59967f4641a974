//! Localhost NodePorts in userspace (upstream KEP-6032): nftables DNAT cannot serve
//! `127.0.0.1:<nodePort>` without `route_localnet`, so the daemon listens on the loopback
//! address of each family that serves them ([`LoopbackListeners`]: iptables mode's default
//! and `--localhost-nodeports` on 127.0.0.1 for TCP and UDP; nftables mode with upstream's
//! gate on 127.0.0.1 and ::1 for TCP) and forwards TCP connections and UDP sessions to the
//! Service's usable endpoints of that family, round-robin, honouring ClientIP affinity.
//! Connections in flight keep their endpoint across endpoint changes; listeners come and go
//! with Services. The plan is pure; [`LocalhostNodePorts`] does the I/O.

use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::time::Duration;

use crate::model::topology::categorize_family;
use crate::model::{Protocol, ProxyState};
pub use crate::modes::userspace::forward::Forward;
use crate::modes::userspace::forward::{listen_counted, Listener};
use crate::proxy::LoopbackListeners;

/// One loopback listener: the loopback address of its family, protocol and NodePort.
pub type ListenerKey = (IpAddr, Protocol, u16);

/// The loopback address of a family (IPv4 when `v4`).
pub fn loopback(v4: bool) -> IpAddr {
    if v4 {
        Ipv4Addr::LOCALHOST.into()
    } else {
        Ipv6Addr::LOCALHOST.into()
    }
}

/// The localhost NodePorts wanted by `state` on the loopback addresses and protocols of
/// `listen`, each forwarding to its family's endpoints. A NodePort whose Service has no usable
/// endpoint of that family gets no listener: the kernel refuses the connection (a TCP reset,
/// an ICMP port unreachable), as upstream's rules reject it and as upstream's nftables-mode
/// proxy leaves it unbound.
pub fn plan_localhost(
    state: &ProxyState,
    listen: &LoopbackListeners,
) -> BTreeMap<ListenerKey, Forward> {
    let mut out = BTreeMap::new();
    for (spn, sp) in &state.services {
        let Some(np) = sp.node_port else { continue };
        for v4 in [true, false] {
            if !listen.of(v4).contains(&spn.protocol) {
                continue;
            }
            let cat = categorize_family(state.endpoints_of(spn), sp, &state.node, v4);
            // Traffic to a NodePort is external traffic: the external policy decides.
            let chosen = if sp.external_policy_local {
                &cat.local
            } else {
                &cat.cluster
            };
            if chosen.is_empty() {
                continue;
            }
            out.insert(
                (loopback(v4), spn.protocol, np),
                Forward {
                    endpoints: chosen
                        .iter()
                        .map(|e| SocketAddr::new(e.ip, e.port))
                        .collect(),
                    affinity: sp.affinity_timeout.map(|t| Duration::from_secs(t as u64)),
                },
            );
        }
    }
    out
}

/// Running localhost listeners.
#[derive(Default)]
pub struct LocalhostNodePorts {
    listeners: BTreeMap<ListenerKey, Listener>,
    failed: std::collections::BTreeSet<ListenerKey>,
    /// Connections and UDP sessions forwarded, for
    /// `kubeproxy_iptables_localhost_nodeports_accepted_packets_total`.
    accepted: std::sync::Arc<std::sync::atomic::AtomicU64>,
}

impl LocalhostNodePorts {
    /// Listeners that add each connection or UDP session they forward to `accepted`.
    pub fn new(accepted: std::sync::Arc<std::sync::atomic::AtomicU64>) -> Self {
        Self {
            accepted,
            ..Self::default()
        }
    }

    /// Starts, updates and stops listeners to match `want`. Must run inside the runtime. A
    /// port that cannot be bound is logged once and retried at the next sync; every failed
    /// bind of this sync is returned (for upstream's
    /// `kubeproxy_nftables_localhost_nodeport_listener_creation_failures_total`).
    pub fn sync(&mut self, want: BTreeMap<ListenerKey, Forward>) -> Vec<ListenerKey> {
        self.listeners.retain(|k, _| want.contains_key(k));
        self.failed.retain(|k| want.contains_key(k));
        let mut failures = Vec::new();
        for (k, f) in want {
            if let Some(l) = self.listeners.get(&k) {
                l.balancer.set(f);
                continue;
            }
            let (ip, proto, port) = k;
            match listen_counted(
                proto,
                SocketAddr::new(ip, port),
                f,
                Some(self.accepted.clone()),
            ) {
                Ok(l) => {
                    self.failed.remove(&k);
                    self.listeners.insert(k, l);
                }
                Err(e) => {
                    failures.push(k);
                    if self.failed.insert(k) {
                        tracing::error!(
                            address = %ip,
                            port,
                            protocol = proto.lower(),
                            err = %e,
                            "cannot listen for localhost NodePort"
                        );
                    }
                }
            }
        }
        failures
    }

    /// The listeners running on the loopback address of one family (IPv4 when `v4`).
    pub fn listening(&self, v4: bool) -> usize {
        self.listeners
            .keys()
            .filter(|k| k.0.is_ipv4() == v4)
            .count()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::fixtures::web_state;
    use crate::model::{Endpoint, ServicePort, ServicePortName};

    /// `default/web:http` (TCP, NodePort 30080) with endpoints of both families, and
    /// `kube-system/dns:dns` (UDP, NodePort 30053) with an IPv4 one.
    fn dual_stack_node_port_state() -> ProxyState {
        let mut state = web_state(Some(30080));
        let web = state.services.keys().next().unwrap().clone();
        let mut eps = state.endpoints_of(&web).to_vec();
        eps.push(Endpoint::ready(
            "fd00:10:244:1::2".parse().unwrap(),
            8080,
            true,
        ));
        state.endpoints.insert(web, eps.into());
        let dns = ServicePortName {
            namespace: "kube-system".into(),
            name: "dns".into(),
            port: "dns".into(),
            protocol: Protocol::Udp,
        };
        let mut sp = ServicePort::new(dns.clone(), "10.96.0.53".parse().unwrap(), 53);
        sp.node_port = Some(30053);
        state.services.insert(dns.clone(), sp.into());
        state.endpoints.insert(
            dns,
            vec![Endpoint::ready("10.244.1.5".parse().unwrap(), 53, true)].into(),
        );
        state
    }

    fn listen(v4: &[Protocol], v6: &[Protocol]) -> LoopbackListeners {
        LoopbackListeners {
            v4: v4.to_vec(),
            v6: v6.to_vec(),
        }
    }

    #[test]
    fn each_family_listens_on_its_loopback_with_its_own_endpoints_for_the_listed_protocols() {
        let state = dual_stack_node_port_state();
        let tcp = Protocol::Tcp;
        let both = plan_localhost(&state, &listen(&[tcp], &[tcp]));
        let keys: Vec<ListenerKey> = both.keys().copied().collect();
        assert_eq!(
            keys,
            [(loopback(true), tcp, 30080), (loopback(false), tcp, 30080)],
            "TCP only, one listener per family; UDP listed for neither"
        );
        for ((ip, _, _), f) in &both {
            assert!(
                f.endpoints.iter().all(|e| e.is_ipv4() == ip.is_ipv4()),
                "{ip}: {f:?}"
            );
            assert!(!f.endpoints.is_empty());
        }
        let v4_only = plan_localhost(&state, &listen(&[tcp, Protocol::Udp], &[]));
        assert_eq!(
            v4_only.keys().copied().collect::<Vec<_>>(),
            [
                (loopback(true), tcp, 30080),
                (loopback(true), Protocol::Udp, 30053)
            ]
        );
        assert!(plan_localhost(&state, &LoopbackListeners::default()).is_empty());
    }

    /// A port another program holds: each sync's failed bind is returned (what upstream's
    /// listener_creation_failures_total counts, once per attempt) and the next sync retries.
    #[tokio::test]
    async fn a_port_that_cannot_be_bound_is_returned_at_each_sync_and_retried() {
        let held = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = held.local_addr().unwrap().port();
        let key = (loopback(true), Protocol::Tcp, port);
        let want = || {
            BTreeMap::from([(
                key,
                Forward {
                    endpoints: vec!["10.244.1.2:8080".parse().unwrap()],
                    affinity: None,
                },
            )])
        };
        let mut l = LocalhostNodePorts::default();
        assert_eq!(l.sync(want()), [key]);
        assert_eq!(l.sync(want()), [key], "retried and counted again");
        assert_eq!(l.listening(true), 0);
        drop(held);
        assert!(l.sync(want()).is_empty(), "bound once the port is free");
        assert_eq!((l.listening(true), l.listening(false)), (1, 0));
    }

    #[test]
    fn a_node_port_without_endpoints_of_the_family_gets_no_listener() {
        let mut state = dual_stack_node_port_state();
        state.endpoints = state
            .endpoints
            .iter()
            .map(|(k, eps)| {
                let v4: Vec<_> = eps.iter().filter(|e| e.ip.is_ipv4()).cloned().collect();
                (k.clone(), std::sync::Arc::new(v4))
            })
            .collect();
        let tcp = Protocol::Tcp;
        let plan = plan_localhost(&state, &listen(&[tcp], &[tcp]));
        assert_eq!(
            plan.keys().copied().collect::<Vec<_>>(),
            [(loopback(true), tcp, 30080)],
            "no IPv6 endpoint: ::1 left unbound, the kernel refuses"
        );
    }
}
