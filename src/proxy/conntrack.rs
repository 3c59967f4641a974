//! Which conntrack entries are stale (upstream `pkg/proxy/conntrack/cleanup.go`): for UDP and
//! SCTP service ports, an entry whose original destination is a service IP and port (ClusterIP,
//! externalIP, LoadBalancer IP), or whose destination port is a NodePort, and whose reply source
//! is not a serving endpoint of that service port. That covers endpoints that went away and
//! entries created while a Service had no endpoints (their reply source is the service IP
//! itself). Every other entry is left alone. Pure.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;

use crate::kernel::nft::Family;
use crate::model::topology::categorize_family;
use crate::model::{Protocol, ProxyState};

use crate::kernel::conntrack::{Conntrack, Flow};

use super::SyncStats;

/// The protocols whose entries need cleaning (TCP connections reset on their own).
pub const PROTOCOLS: [Protocol; 2] = [Protocol::Udp, Protocol::Sctp];

type Endpoints = BTreeSet<(IpAddr, u16)>;

/// The serving endpoints per service destination, for one family and protocol.
#[derive(Debug, Default)]
pub struct ServiceDestinations {
    by_ip_port: BTreeMap<(IpAddr, u16), Endpoints>,
    by_node_port: BTreeMap<u16, Endpoints>,
}

impl ServiceDestinations {
    pub fn is_empty(&self) -> bool {
        self.by_ip_port.is_empty() && self.by_node_port.is_empty()
    }
}

/// Collects service destinations of `proto` in `family`.
pub fn service_destinations(
    state: &ProxyState,
    family: Family,
    proto: Protocol,
) -> ServiceDestinations {
    let mut d = ServiceDestinations::default();
    for (spn, sp) in &state.services {
        if spn.protocol != proto {
            continue;
        }
        let eps = state.endpoints_of(spn);
        let cat = categorize_family(eps, sp, &state.node, family == Family::Ip);
        let serving: Endpoints = cat.all_reachable.iter().map(|e| (e.ip, e.port)).collect();
        for ip in sp
            .cluster_ips
            .iter()
            .chain(&sp.external_ips)
            .chain(&sp.load_balancer_ips)
            .filter(|ip| Family::of(ip) == family)
        {
            d.by_ip_port.insert((*ip, sp.port), serving.clone());
        }
        if let Some(np) = sp.node_port {
            d.by_node_port.insert(np, serving.clone());
        }
    }
    d
}

/// The entries to delete among `flows` (all of one family and protocol).
pub fn stale_flows(dests: &ServiceDestinations, flows: &[Flow]) -> Vec<Flow> {
    flows
        .iter()
        .filter(|f| {
            let reply = (f.reply_src, f.reply_sport);
            // A flow to a service IP and port is judged by that service alone, even when its
            // port number is also some NodePort.
            match dests.by_ip_port.get(&(f.orig_dst, f.orig_dport)) {
                Some(eps) => !eps.contains(&reply),
                None => dests
                    .by_node_port
                    .get(&f.orig_dport)
                    .is_some_and(|eps| !eps.contains(&reply)),
            }
        })
        .cloned()
        .collect()
}

/// Deletes conntrack entries that point at endpoints the state no longer serves. A failure
/// is logged and retried at the next sync; it never undoes the rules.
pub fn reconcile_conntrack(
    ct: &mut (dyn Conntrack + Send),
    state: &ProxyState,
    families: &[Family],
    stats: &mut SyncStats,
) {
    let t0 = std::time::Instant::now();
    for family in families {
        for proto in PROTOCOLS {
            let dests = service_destinations(state, *family, proto);
            if dests.is_empty() {
                continue;
            }
            let res = ct
                .list(*family, proto.number())
                .and_then(|flows| ct.delete(&stale_flows(&dests, &flows)));
            match res {
                Ok(n) => {
                    stats.conntrack_deleted += n;
                    *stats
                        .conntrack_deleted_by_family
                        .entry(*family)
                        .or_default() += n;
                }
                Err(e) => {
                    tracing::warn!(%family, proto = proto.lower(), "conntrack cleanup failed: {e}")
                }
            }
        }
    }
    stats.conntrack_duration = Some(t0.elapsed());
    if stats.conntrack_deleted > 0 {
        tracing::info!(
            deleted = stats.conntrack_deleted,
            "deleted stale conntrack entries"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{Endpoint, NodeInfo, ServicePort, ServicePortName};

    fn state(eps: &[&str]) -> ProxyState {
        let spn = ServicePortName {
            namespace: "ns".into(),
            name: "dns".into(),
            port: "dns".into(),
            protocol: Protocol::Udp,
        };
        let mut st = ProxyState {
            node: NodeInfo {
                name: "n1".into(),
                ..Default::default()
            },
            ..Default::default()
        };
        st.services.insert(
            spn.clone(),
            ServicePort {
                node_port: Some(30053),
                ..ServicePort::new(spn.clone(), "10.96.0.53".parse().unwrap(), 53)
            }
            .into(),
        );
        st.endpoints.insert(
            spn,
            eps.iter()
                .map(|ip| Endpoint::ready(ip.parse().unwrap(), 5353, true))
                .collect::<Vec<_>>()
                .into(),
        );
        st
    }

    fn flow(dst: &str, dport: u16, reply_src: &str, reply_sport: u16) -> Flow {
        Flow {
            proto: 17,
            orig_src: "10.244.1.9".parse().unwrap(),
            orig_dst: dst.parse().unwrap(),
            orig_sport: 40000,
            orig_dport: dport,
            reply_src: reply_src.parse().unwrap(),
            reply_dst: "10.244.1.9".parse().unwrap(),
            reply_sport,
            reply_dport: 40000,
            zone: 0,
            id: None,
        }
    }

    #[test]
    fn entries_to_removed_endpoints_are_stale() {
        let d = service_destinations(&state(&["10.244.2.2"]), Family::Ip, Protocol::Udp);
        let gone = flow("10.96.0.53", 53, "10.244.1.2", 5353);
        let live = flow("10.96.0.53", 53, "10.244.2.2", 5353);
        assert_eq!(stale_flows(&d, &[gone.clone(), live]), vec![gone]);
    }

    #[test]
    fn entries_from_when_there_were_no_endpoints_are_stale() {
        let d = service_destinations(&state(&["10.244.2.2"]), Family::Ip, Protocol::Udp);
        let unnatted = flow("10.96.0.53", 53, "10.96.0.53", 53);
        assert_eq!(
            stale_flows(&d, std::slice::from_ref(&unnatted)),
            vec![unnatted]
        );
    }

    #[test]
    fn node_port_entries_are_checked_too() {
        let d = service_destinations(&state(&["10.244.2.2"]), Family::Ip, Protocol::Udp);
        let gone = flow("192.168.0.2", 30053, "10.244.1.2", 5353);
        let live = flow("192.168.0.2", 30053, "10.244.2.2", 5353);
        assert_eq!(stale_flows(&d, &[gone.clone(), live]), vec![gone]);
    }

    #[test]
    fn a_service_port_equal_to_some_node_port_is_judged_by_its_own_service() {
        let mut st = state(&["10.244.2.2"]);
        // A second UDP service whose port happens to equal the first one's NodePort.
        let mut other = (**st.services.values().next().unwrap()).clone();
        other.name.name = "other".into();
        other.cluster_ips = vec!["10.96.0.99".parse().unwrap()];
        other.port = 30053;
        other.node_port = None;
        st.endpoints.insert(
            other.name.clone(),
            st.endpoints
                .values()
                .next()
                .unwrap()
                .iter()
                .map(|e| {
                    let mut e = e.clone();
                    e.ip = "10.244.9.9".parse().unwrap();
                    e
                })
                .collect::<Vec<_>>()
                .into(),
        );
        st.services.insert(other.name.clone(), other.into());
        let d = service_destinations(&st, Family::Ip, Protocol::Udp);
        let live = flow("10.96.0.99", 30053, "10.244.9.9", 5353);
        assert!(stale_flows(&d, &[live]).is_empty());
    }

    #[test]
    fn unrelated_entries_are_never_touched() {
        let d = service_destinations(&state(&[]), Family::Ip, Protocol::Udp);
        let other_service = flow("10.96.0.54", 53, "10.244.1.2", 5353);
        let direct = flow("10.244.1.2", 5353, "10.244.1.2", 5353);
        assert!(stale_flows(&d, &[other_service, direct]).is_empty());
        let tcp = service_destinations(&state(&[]), Family::Ip, Protocol::Tcp);
        assert!(tcp.is_empty());
    }
}
