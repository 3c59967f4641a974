//! Endpoint selection with upstream kube-proxy's semantics (`pkg/proxy/topology.go`,
//! `CategorizeEndpoints`): ready endpoints, topology hints, serving+terminating fallback,
//! and traffic policies. Pure.

use super::{Endpoint, NodeInfo, ServicePort};

/// The endpoints each kind of traffic may use.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CategorizedEndpoints {
    /// Endpoints for Cluster-policy traffic (empty when no traffic uses the cluster policy).
    pub cluster: Vec<Endpoint>,
    /// Endpoints for Local-policy traffic (empty when no traffic uses the local policy).
    pub local: Vec<Endpoint>,
    /// The union: every endpoint some traffic may reach.
    pub all_reachable: Vec<Endpoint>,
    /// Whether any usable (ready, or serving and terminating) endpoint exists anywhere.
    pub has_any: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum TopologyMode {
    None,
    SameNode,
    SameZone,
}

fn topology_mode(endpoints: &[Endpoint], node: &str, zone: Option<&str>) -> TopologyMode {
    let mut has_for_node = false;
    let mut all_node_hints = true;
    let mut has_for_zone = false;
    let mut all_zone_hints = true;
    for ep in endpoints.iter().filter(|e| e.ready) {
        if ep.node_hints().is_empty() {
            all_node_hints = false;
        } else if ep.node_hints().iter().any(|n| n == node) {
            has_for_node = true;
        }
        if ep.zone_hints().is_empty() {
            all_zone_hints = false;
        } else if zone.is_some_and(|z| ep.zone_hints().iter().any(|h| h == z)) {
            has_for_zone = true;
        }
    }
    if all_node_hints && has_for_node {
        return TopologyMode::SameNode;
    }
    if all_zone_hints && has_for_zone {
        return TopologyMode::SameZone;
    }
    TopologyMode::None
}

fn available(ep: &Endpoint, mode: TopologyMode, node: &str, zone: Option<&str>) -> bool {
    match mode {
        TopologyMode::None => true,
        TopologyMode::SameNode => ep.node_hints().iter().any(|n| n == node),
        TopologyMode::SameZone => zone.is_some_and(|z| ep.zone_hints().iter().any(|h| h == z)),
    }
}

/// [`categorize_endpoints`] over the endpoints of one address family (IPv4 when `v4`), as
/// each family's rules, conntrack cleanup and localhost forwarding see them.
pub fn categorize_family(
    endpoints: &[Endpoint],
    svc: &ServicePort,
    node: &NodeInfo,
    v4: bool,
) -> CategorizedEndpoints {
    let eps: Vec<Endpoint> = endpoints
        .iter()
        .filter(|e| e.ip.is_ipv4() == v4)
        .cloned()
        .collect();
    categorize_endpoints(&eps, svc, &node.name, node.zone())
}

/// Splits a service port's endpoints into what cluster and local traffic may use.
pub fn categorize_endpoints(
    endpoints: &[Endpoint],
    svc: &ServicePort,
    node_name: &str,
    zone: Option<&str>,
) -> CategorizedEndpoints {
    let mut out = CategorizedEndpoints::default();
    if svc.uses_cluster_endpoints() {
        let mode = topology_mode(endpoints, node_name, zone);
        out.cluster = endpoints
            .iter()
            .filter(|e| e.ready && available(e, mode, node_name, zone))
            .cloned()
            .collect();
        // No ready endpoint anywhere (topology never empties the set: see topology_mode):
        // fall back to endpoints that are still serving while terminating.
        if out.cluster.is_empty() {
            out.cluster = endpoints
                .iter()
                .filter(|e| e.serving && e.terminating)
                .cloned()
                .collect();
        }
        out.has_any = !out.cluster.is_empty();
    }
    if !svc.uses_local_endpoints() {
        out.all_reachable = out.cluster.clone();
        return out;
    }
    let mut local_ready = false;
    let mut local_serving_terminating = false;
    for e in endpoints {
        if e.ready {
            out.has_any = true;
            local_ready |= e.is_local;
        } else if e.serving && e.terminating {
            out.has_any = true;
            local_serving_terminating |= e.is_local;
        }
    }
    if local_ready {
        out.local = endpoints
            .iter()
            .filter(|e| e.is_local && e.ready)
            .cloned()
            .collect();
    } else if local_serving_terminating {
        out.local = endpoints
            .iter()
            .filter(|e| e.is_local && e.serving && e.terminating)
            .cloned()
            .collect();
    }
    if !svc.uses_cluster_endpoints() {
        out.all_reachable = out.local.clone();
        return out;
    }
    let mut all = out.cluster.clone();
    for e in &out.local {
        if !all.contains(e) {
            all.push(e.clone());
        }
    }
    out.all_reachable = all;
    out
}

/// [`count_no_local_endpoints_of`] for IPv4 and IPv6, kept up to date from the service ports
/// that changed between the states it is given: counted whole for the first state and when
/// the node changes, otherwise only the changed ports' shares are taken out and put back
/// (the sync loop counts after every sync; a whole count walked every service port).
#[derive(Debug, Default)]
pub struct NoLocalEndpoints {
    seen: Option<super::ProxyState>,
    /// (internal, external) for IPv4, then IPv6.
    counts: [(usize, usize); 2],
}

impl NoLocalEndpoints {
    /// The counts of `state`: (internal, external) for IPv4, then IPv6.
    pub fn update(&mut self, state: &super::ProxyState) -> [(usize, usize); 2] {
        use super::net::Family;
        match &self.seen {
            Some(prev) if prev.node == state.node => {
                for spn in super::changed_service_ports(prev, state) {
                    let (old, new) = (share(prev, spn), share(state, spn));
                    for (c, (o, n)) in self.counts.iter_mut().zip(old.iter().zip(&new)) {
                        c.0 = c.0 - o.0 + n.0;
                        c.1 = c.1 - o.1 + n.1;
                    }
                }
            }
            _ => {
                self.counts =
                    [Family::Ip, Family::Ip6].map(|f| count_no_local_endpoints_of(state, f));
            }
        }
        self.seen = Some(state.clone());
        self.counts
    }
}

/// What one service port adds to [`NoLocalEndpoints`]' counts, per family.
fn share(state: &super::ProxyState, spn: &super::ServicePortName) -> [(usize, usize); 2] {
    use super::net::Family;
    let Some(sp) = state.services.get(spn) else {
        return [(0, 0); 2];
    };
    if !sp.internal_policy_local && !sp.external_policy_local {
        return [(0, 0); 2];
    }
    let cat = categorize_endpoints(
        state.endpoints_of(spn),
        sp,
        &state.node.name,
        state.node.zone(),
    );
    if !cat.has_any || !cat.local.is_empty() {
        return [(0, 0); 2];
    }
    [Family::Ip, Family::Ip6].map(|f| {
        if sp.cluster_ips.iter().any(|ip| Family::of(ip) == f) {
            (
                usize::from(sp.internal_policy_local),
                usize::from(sp.external_policy_local),
            )
        } else {
            (0, 0)
        }
    })
}

/// Service ports whose Local policy finds no local endpoint: (internal, external), for the
/// `sync_proxy_rules_no_local_endpoints_total` gauge.
pub fn count_no_local_endpoints(state: &super::ProxyState) -> (usize, usize) {
    count_no_local_endpoints_where(state, |_| true)
}

/// The same for the service ports with a ClusterIP of one family (upstream counts per
/// family proxier).
pub fn count_no_local_endpoints_of(
    state: &super::ProxyState,
    family: super::net::Family,
) -> (usize, usize) {
    count_no_local_endpoints_where(state, |sp| {
        sp.cluster_ips
            .iter()
            .any(|ip| super::net::Family::of(ip) == family)
    })
}

fn count_no_local_endpoints_where(
    state: &super::ProxyState,
    take: impl Fn(&super::ServicePort) -> bool,
) -> (usize, usize) {
    let (mut internal, mut external) = (0, 0);
    for (spn, sp) in state.services.iter().filter(|(_, sp)| take(sp)) {
        let eps = state.endpoints_of(spn);
        let cat = categorize_endpoints(eps, sp, &state.node.name, state.node.zone());
        if !cat.has_any || !cat.local.is_empty() {
            continue;
        }
        if sp.internal_policy_local {
            internal += 1;
        }
        if sp.external_policy_local {
            external += 1;
        }
    }
    (internal, external)
}

#[cfg(test)]
mod tests {
    //! Cases ported from upstream's `pkg/proxy/topology_test.go`. IP conventions: endpoints
    //! are 10.1.2.x; "local" means on this node (node1, zone-a).
    use super::*;
    use crate::model::fixtures::endpoints::{endpoint, EndpointFixture};
    use crate::model::{Protocol, ServicePortName};

    fn svc(internal_local: bool, external_local: bool, node_port: bool) -> ServicePort {
        ServicePort {
            node_port: node_port.then_some(30080),
            external_policy_local: external_local && node_port,
            internal_policy_local: internal_local,
            ..ServicePort::new(
                ServicePortName {
                    namespace: "ns1".into(),
                    name: "svc1".into(),
                    port: "p80".into(),
                    protocol: Protocol::Tcp,
                },
                "172.30.0.1".parse().unwrap(),
                80,
            )
        }
    }

    /// Endpoint 10.1.2.`last`:80: ready, serving, not terminating, on another node.
    fn ep(last: u8) -> Endpoint {
        endpoint(&format!("10.1.2.{last}:80"))
    }

    fn ips(v: &[Endpoint]) -> Vec<u8> {
        v.iter()
            .map(|e| match e.ip {
                std::net::IpAddr::V4(a) => a.octets()[3],
                _ => 0,
            })
            .collect()
    }

    #[test]
    fn cluster_policy_uses_all_ready_endpoints() {
        let eps = [ep(3), ep(4).local(), ep(5).not_ready().not_serving()];
        let c = categorize_endpoints(&eps, &svc(false, false, false), "node1", Some("zone-a"));
        assert_eq!(ips(&c.cluster), [3, 4]);
        assert!(c.local.is_empty());
        assert!(c.has_any);
    }

    #[test]
    fn zone_hints_restrict_to_this_zone() {
        let a = ep(3).zones(&["zone-a"]);
        let b = ep(4).zones(&["zone-b"]);
        let c = categorize_endpoints(&[a, b], &svc(false, false, false), "node1", Some("zone-a"));
        assert_eq!(ips(&c.cluster), [3]);
    }

    #[test]
    fn hints_ignored_unless_every_ready_endpoint_has_one() {
        let a = ep(3).zones(&["zone-a"]);
        let b = ep(4);
        let c = categorize_endpoints(&[a, b], &svc(false, false, false), "node1", Some("zone-a"));
        assert_eq!(ips(&c.cluster), [3, 4]);
    }

    #[test]
    fn hints_ignored_when_none_match_this_zone() {
        let a = ep(3).zones(&["zone-b"]);
        let c = categorize_endpoints(&[a], &svc(false, false, false), "node1", Some("zone-a"));
        assert_eq!(ips(&c.cluster), [3]);
    }

    #[test]
    fn hints_ignored_when_node_has_no_zone() {
        let a = ep(3).zones(&["zone-a"]);
        let b = ep(4).zones(&["zone-b"]);
        let c = categorize_endpoints(&[a, b], &svc(false, false, false), "node1", None);
        assert_eq!(ips(&c.cluster), [3, 4]);
    }

    #[test]
    fn node_hints_prefer_same_node() {
        let a = ep(3).local().nodes(&["node1"]).zones(&["zone-a"]);
        let b = ep(4).nodes(&["node2"]).zones(&["zone-a"]);
        let c = categorize_endpoints(&[a, b], &svc(false, false, false), "node1", Some("zone-a"));
        assert_eq!(ips(&c.cluster), [3]);
    }

    #[test]
    fn terminating_fallback_only_without_ready_endpoints() {
        let eps = [
            ep(3).not_ready().terminating(),
            ep(4).not_ready().not_serving().terminating(),
        ];
        let c = categorize_endpoints(&eps, &svc(false, false, false), "node1", None);
        assert_eq!(ips(&c.cluster), [3]);
        assert!(c.has_any);
        let eps = [ep(3).not_ready().terminating(), ep(5)];
        let c = categorize_endpoints(&eps, &svc(false, false, false), "node1", None);
        assert_eq!(ips(&c.cluster), [5]);
    }

    #[test]
    fn internal_local_uses_only_local_endpoints() {
        let eps = [ep(3), ep(4).local()];
        let c = categorize_endpoints(&eps, &svc(true, false, false), "node1", None);
        assert!(c.cluster.is_empty());
        assert_eq!(ips(&c.local), [4]);
        assert_eq!(ips(&c.all_reachable), [4]);
    }

    #[test]
    fn internal_local_without_local_endpoints_still_has_endpoints() {
        let eps = [ep(3)];
        let c = categorize_endpoints(&eps, &svc(true, false, false), "node1", None);
        assert!(c.local.is_empty());
        assert!(c.has_any, "a remote ready endpoint means drop, not reject");
    }

    #[test]
    fn external_local_keeps_cluster_endpoints_for_internal_traffic() {
        let eps = [ep(3), ep(4).local()];
        let c = categorize_endpoints(&eps, &svc(false, true, true), "node1", None);
        assert_eq!(ips(&c.cluster), [3, 4]);
        assert_eq!(ips(&c.local), [4]);
        assert_eq!(ips(&c.all_reachable), [3, 4]);
    }

    #[test]
    fn local_policy_falls_back_to_local_serving_terminating() {
        let eps = [ep(3).not_ready().terminating().local(), ep(4)];
        let c = categorize_endpoints(&eps, &svc(false, true, true), "node1", None);
        assert_eq!(ips(&c.local), [3]);
        assert_eq!(ips(&c.cluster), [4]);
    }

    #[test]
    fn no_endpoints_anywhere() {
        let eps = [ep(3).not_ready().not_serving().local()];
        let c = categorize_endpoints(&eps, &svc(false, true, true), "node1", None);
        assert!(!c.has_any);
        assert!(c.cluster.is_empty() && c.local.is_empty());
    }
}

#[cfg(test)]
#[path = "topology_upstream_table.rs"]
mod upstream_table;
