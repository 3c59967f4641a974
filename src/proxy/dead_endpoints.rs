//! Failing fast on endpoints that died (our extension, flag
//! `--reset-dead-endpoint-connections`, off by default). When a node or a pod dies its
//! endpoints leave the EndpointSlices while their TCP connections are still in conntrack:
//! clients keep sending into a DNAT to an address that never answers and hang until TCP gives
//! up (about 15 minutes with Linux's default `tcp_retries2`). Upstream keeps those entries on
//! purpose, for graceful shutdown (kubernetes#104098, #101607, #100698, #93143 ask for an
//! option).
//!
//! An endpoint *died* when it was ready and not terminating in the last synced state and is
//! absent from the Service's endpoints now: it never went through terminating, the way a pod
//! that is shut down does. Only then are the TCP entries whose original destination is the
//! Service (a service IP and port, or the NodePort) and whose reply source is that endpoint
//! deleted. The client's next segment is then a new flow to the kernel: with
//! `nf_conntrack_tcp_loose` (the default, 1) it is picked up mid-stream and DNATed to a live
//! endpoint, whose stack answers a segment of an unknown connection with a reset. Endpoints
//! that drain (terminating, then gone) and Services that are deleted (their pods may live)
//! keep upstream's behaviour. Pure, except [`reset_dead_endpoint_connections`].

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;
use std::sync::Arc;

use crate::kernel::conntrack::{Conntrack, Flow};
use crate::kernel::nft::Family;
use crate::model::{Endpoint, Protocol, ProxyState, ServicePort, ServicePortName};

use super::conntrack::{Endpoints, ServiceDestinations};
use super::SyncStats;

/// An endpoint's address and port, as a conntrack entry's reply source names it.
type EndpointAddr = (IpAddr, u16);

/// For one family, the endpoints that died per service destination.
#[derive(Debug, Default)]
pub struct DeadEndpoints {
    dests: ServiceDestinations,
    /// Every endpoint that died, for the log line.
    endpoints: Endpoints,
}

impl DeadEndpoints {
    pub fn is_empty(&self) -> bool {
        self.endpoints.is_empty()
    }

    /// How many distinct endpoints died.
    pub fn len(&self) -> usize {
        self.endpoints.len()
    }

    /// Adds one endpoint of `sp` that died (of this map entry's family).
    fn add(&mut self, sp: &ServicePort, dead: EndpointAddr) {
        let one = Endpoints::from([dead]);
        self.dests.add(sp, Family::of(&dead.0), &one);
        self.endpoints.insert(dead);
    }
}

/// The TCP endpoints that died between `prev` (the last synced state) and `now`, per family.
/// Only service ports that may have changed are compared, once for both families: those
/// `now` names as changed when it follows `prev` directly, otherwise those whose endpoint
/// list is not the same allocation.
pub fn dead_endpoints(prev: &ProxyState, now: &ProxyState) -> BTreeMap<Family, DeadEndpoints> {
    let mut out: BTreeMap<Family, DeadEndpoints> = BTreeMap::new();
    let mut visit = |spn: &ServicePortName| {
        if spn.protocol != Protocol::Tcp {
            return;
        }
        // A deleted Service says nothing about its pods: they may be alive, their
        // connections keep working through their entries, as upstream.
        let (Some(before), Some(_)) = (prev.services.get(spn), now.services.get(spn)) else {
            return;
        };
        for (ip, port) in died(prev.endpoints_of(spn), now.endpoints_of(spn)) {
            // The flows were made to the destinations the Service had then.
            out.entry(Family::of(&ip))
                .or_default()
                .add(before, (ip, port));
        }
    };
    match now.changes_since(prev) {
        Some(named) => named.iter().for_each(&mut visit),
        None => {
            for (spn, eps) in &prev.endpoints {
                if now.endpoints.get(spn).is_none_or(|e| !Arc::ptr_eq(e, eps)) {
                    visit(spn);
                }
            }
        }
    }
    out
}

/// The endpoints ready and not terminating in `before` whose address and port are absent
/// from `after` (in any condition: an endpoint still listed, even unready, is not dead).
fn died(before: &[Endpoint], after: &[Endpoint]) -> Vec<EndpointAddr> {
    if before.is_empty() {
        return Vec::new();
    }
    let still: BTreeSet<EndpointAddr> = after.iter().map(|e| (e.ip, e.port)).collect();
    before
        .iter()
        .filter(|e| e.ready && !e.terminating && !still.contains(&(e.ip, e.port)))
        .map(|e| (e.ip, e.port))
        .collect()
}

/// The entries among `flows` (TCP, one family) that lead to an endpoint that died.
pub fn dead_flows(dead: &DeadEndpoints, flows: &[Flow]) -> Vec<Flow> {
    flows
        .iter()
        .filter(|f| {
            dead.dests
                .of_flow(f)
                .is_some_and(|eps| eps.contains(&(f.reply_src, f.reply_sport)))
        })
        .cloned()
        .collect()
}

/// Deletes the TCP conntrack entries of endpoints that died between `prev` and `now`. The
/// table is listed only when some endpoint died. A failure is logged, never retried: the
/// next state no longer names those endpoints.
pub fn reset_dead_endpoint_connections(
    ct: &mut (dyn Conntrack + Send),
    prev: &ProxyState,
    now: &ProxyState,
    families: &[Family],
    stats: &mut SyncStats,
) {
    let mut dead_by_family = dead_endpoints(prev, now);
    for family in families {
        let Some(dead) = dead_by_family.remove(family) else {
            continue;
        };
        let res = ct
            .list(*family, Protocol::Tcp.number())
            .and_then(|flows| ct.delete(&dead_flows(&dead, &flows)));
        match res {
            Ok(n) => {
                stats.count_conntrack_deleted(*family, n);
                tracing::info!(
                    %family,
                    endpoints = dead.len(),
                    deleted = n,
                    "deleted TCP conntrack entries of endpoints that died"
                );
            }
            Err(e) => tracing::warn!(
                %family,
                endpoints = dead.len(),
                err = %e,
                "cannot delete TCP conntrack entries of endpoints that died"
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::NodeInfo;

    const CLUSTER_IP: &str = "10.96.0.10";
    const NODE_PORT: u16 = 30080;
    const A: &str = "10.244.1.2";
    const B: &str = "10.244.2.3";

    fn spn(proto: Protocol) -> ServicePortName {
        ServicePortName {
            namespace: "ns".into(),
            name: "web".into(),
            port: "http".into(),
            protocol: proto,
        }
    }

    /// The Service web (ClusterIP, NodePort) with `eps`; `proto` for its one port.
    fn state(proto: Protocol, eps: Vec<Endpoint>) -> ProxyState {
        let mut st = ProxyState {
            node: NodeInfo {
                name: "n1".into(),
                ..Default::default()
            },
            ..Default::default()
        };
        let spn = spn(proto);
        st.services.insert(
            spn.clone(),
            ServicePort {
                node_port: Some(NODE_PORT),
                ..ServicePort::new(spn.clone(), CLUSTER_IP.parse().unwrap(), 80)
            }
            .into(),
        );
        st.endpoints.insert(spn, eps.into());
        st
    }

    fn ready(ip: &str) -> Endpoint {
        Endpoint::ready(ip.parse().unwrap(), 8080, false)
    }

    fn terminating(ip: &str) -> Endpoint {
        Endpoint {
            ready: false,
            serving: true,
            terminating: true,
            ..ready(ip)
        }
    }

    fn tcp_flow(dst: &str, dport: u16, reply_src: &str) -> Flow {
        crate::kernel::conntrack::test_flow(6, dst, dport, reply_src, 8080)
    }

    fn dead(prev: &ProxyState, now: &ProxyState) -> BTreeSet<EndpointAddr> {
        dead_endpoints(prev, now)
            .remove(&Family::Ip)
            .map(|d| d.endpoints)
            .unwrap_or_default()
    }

    fn addr(ip: &str) -> EndpointAddr {
        (ip.parse().unwrap(), 8080)
    }

    #[test]
    fn a_ready_endpoint_that_vanishes_died() {
        let prev = state(Protocol::Tcp, vec![ready(A), ready(B)]);
        let now = state(Protocol::Tcp, vec![ready(B)]);
        assert_eq!(dead(&prev, &now), BTreeSet::from([addr(A)]));
    }

    #[test]
    fn an_endpoint_that_went_through_terminating_did_not_die() {
        let prev = state(Protocol::Tcp, vec![terminating(A), ready(B)]);
        let now = state(Protocol::Tcp, vec![ready(B)]);
        assert!(dead(&prev, &now).is_empty());
    }

    #[test]
    fn an_endpoint_still_listed_unready_did_not_die() {
        let unready = Endpoint {
            ready: false,
            serving: false,
            ..ready(A)
        };
        let prev = state(Protocol::Tcp, vec![ready(A)]);
        let now = state(Protocol::Tcp, vec![unready]);
        assert!(dead(&prev, &now).is_empty());
    }

    #[test]
    fn an_endpoint_that_moved_port_died_on_its_old_port() {
        let prev = state(Protocol::Tcp, vec![ready(A)]);
        let moved = Endpoint::ready(A.parse().unwrap(), 9090, false);
        let now = state(Protocol::Tcp, vec![moved]);
        assert_eq!(dead(&prev, &now), BTreeSet::from([addr(A)]));
    }

    #[test]
    fn a_deleted_service_kills_nothing() {
        let prev = state(Protocol::Tcp, vec![ready(A)]);
        let now = ProxyState::default();
        assert!(dead(&prev, &now).is_empty());
    }

    #[test]
    fn udp_and_sctp_are_left_to_the_stale_entry_cleanup() {
        for proto in [Protocol::Udp, Protocol::Sctp] {
            let prev = state(proto, vec![ready(A)]);
            let now = state(proto, vec![]);
            assert!(dead(&prev, &now).is_empty(), "{proto:?}");
        }
    }

    #[test]
    fn only_the_changed_service_ports_named_by_the_lineage_are_compared() {
        let mut prev = state(Protocol::Tcp, vec![ready(A)]);
        prev.lineage.generation = 7;
        let mut now = state(Protocol::Tcp, vec![]);
        now.lineage.generation = 8;
        now.lineage.changed_since = Some((7, Arc::new(BTreeSet::new())));
        assert!(
            dead(&prev, &now).is_empty(),
            "named nothing, compared nothing"
        );
        now.lineage.changed_since = Some((7, Arc::new(BTreeSet::from([spn(Protocol::Tcp)]))));
        assert_eq!(dead(&prev, &now), BTreeSet::from([addr(A)]));
    }

    #[test]
    fn flows_to_the_dead_endpoint_through_the_service_go_and_others_stay() {
        let prev = state(Protocol::Tcp, vec![ready(A), ready(B)]);
        let now = state(Protocol::Tcp, vec![ready(B)]);
        let d = dead_endpoints(&prev, &now).remove(&Family::Ip).unwrap();
        let via_cluster_ip = tcp_flow(CLUSTER_IP, 80, A);
        let via_node_port = tcp_flow("192.168.0.2", NODE_PORT, A);
        let to_live = tcp_flow(CLUSTER_IP, 80, B);
        let direct_to_pod = tcp_flow(A, 8080, A);
        let other_service_port = tcp_flow(CLUSTER_IP, 443, A);
        let got = dead_flows(
            &d,
            &[
                via_cluster_ip.clone(),
                via_node_port.clone(),
                to_live,
                direct_to_pod,
                other_service_port,
            ],
        );
        assert_eq!(got, vec![via_cluster_ip, via_node_port]);
    }

    #[test]
    fn the_other_family_is_not_touched() {
        let prev = state(Protocol::Tcp, vec![ready(A)]);
        let now = state(Protocol::Tcp, vec![]);
        assert!(!dead_endpoints(&prev, &now).contains_key(&Family::Ip6));
    }

    #[test]
    fn reset_deletes_only_dead_entries_from_the_table() {
        use crate::kernel::conntrack::FakeConntrack;
        let prev = state(Protocol::Tcp, vec![ready(A), ready(B)]);
        let now = state(Protocol::Tcp, vec![ready(B)]);
        let mut ct = FakeConntrack {
            flows: vec![tcp_flow(CLUSTER_IP, 80, A), tcp_flow(CLUSTER_IP, 80, B)],
        };
        let mut stats = SyncStats::default();
        reset_dead_endpoint_connections(&mut ct, &prev, &now, &Family::all(), &mut stats);
        assert_eq!(ct.flows, vec![tcp_flow(CLUSTER_IP, 80, B)]);
        assert_eq!(stats.conntrack_deleted, 1);
    }
}
