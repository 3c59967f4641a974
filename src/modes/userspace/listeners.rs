//! Which listeners the userspace mode needs: one per service port, family and traffic scope
//! (internal: ClusterIPs; external: NodePorts, externalIPs, LoadBalancer IPs, following
//! `externalTrafficPolicy`), and where each forwards. Pure.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::time::Duration;

use crate::model::topology::categorize_family;
use crate::model::{Protocol, ProxyState, ServicePortName};

use super::forward::Forward;

/// One listener: a service port, a scope and a family.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct ListenerKey {
    pub service: ServicePortName,
    /// External traffic (NodePort, externalIPs, LoadBalancer IPs) rather than ClusterIP.
    pub external: bool,
    pub v4: bool,
}

/// The listeners `state` needs and where each forwards to. SCTP cannot be proxied in
/// userspace: those service ports are returned separately, to be reported.
pub fn plan_listeners(
    state: &ProxyState,
) -> (BTreeMap<ListenerKey, Forward>, Vec<ServicePortName>) {
    let mut out = BTreeMap::new();
    let mut sctp = Vec::new();
    for (spn, sp) in &state.services {
        if spn.protocol == Protocol::Sctp {
            sctp.push(spn.clone());
            continue;
        }
        let eps = state.endpoints_of(spn);
        for v4 in [true, false] {
            if !sp.cluster_ips.iter().any(|a| a.is_ipv4() == v4) {
                continue;
            }
            let cat = categorize_family(eps, sp, &state.node, v4);
            let fwd = |eps: &[crate::model::Endpoint]| Forward {
                endpoints: eps.iter().map(|e| SocketAddr::new(e.ip, e.port)).collect(),
                affinity: sp.affinity_timeout.map(|t| Duration::from_secs(t.into())),
            };
            let internal = if sp.internal_policy_local {
                &cat.local
            } else {
                &cat.cluster
            };
            out.insert(
                ListenerKey {
                    service: spn.clone(),
                    external: false,
                    v4,
                },
                fwd(internal),
            );
            let has_external = sp.node_port.is_some()
                || sp.external_ips.iter().any(|a| a.is_ipv4() == v4)
                || sp.load_balancer_ips.iter().any(|a| a.is_ipv4() == v4);
            if has_external {
                let external = if sp.external_policy_local {
                    &cat.local
                } else {
                    &cat.cluster
                };
                out.insert(
                    ListenerKey {
                        service: spn.clone(),
                        external: true,
                        v4,
                    },
                    fwd(external),
                );
            }
        }
    }
    (out, sctp)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::modes::userspace::proxier::tests::{ip, sample, spn};

    #[test]
    fn listeners_per_scope_follow_the_policies() {
        let (want, sctp) = plan_listeners(&sample());
        assert_eq!(sctp, [spn("sctp", Protocol::Sctp)]);
        let key = |name, p, external| ListenerKey {
            service: spn(name, p),
            external,
            v4: true,
        };
        assert_eq!(want[&key("web", Protocol::Tcp, false)].endpoints.len(), 2);
        assert_eq!(
            want[&key("web", Protocol::Tcp, true)].endpoints,
            [SocketAddr::new(ip("10.244.1.2"), 8080)],
            "externalTrafficPolicy Local"
        );
        assert!(want[&key("empty", Protocol::Udp, false)]
            .endpoints
            .is_empty());
        assert!(!want.contains_key(&key("empty", Protocol::Udp, true)));
    }

    #[test]
    fn no_external_listener_for_external_ips_when_the_gate_is_off() {
        let mut st = sample();
        let web = spn("web", Protocol::Tcp);
        let mut sp = (*st.services[&web]).clone();
        sp.node_port = None;
        sp.load_balancer_ips.clear();
        sp.external_ips = vec![ip("203.0.113.7")];
        st.services.insert(web.clone(), sp.into());
        let key = ListenerKey {
            service: web,
            external: true,
            v4: true,
        };
        assert!(plan_listeners(&st).0.contains_key(&key));
        let off = crate::model::without_external_ips(&st);
        assert!(!plan_listeners(&off).0.contains_key(&key));
    }

    /// The traffic-policy matrix (issue #35.1): for every case of
    /// [`crate::model::fixtures::policy_matrix`], the ClusterIP listener forwards to what
    /// upstream's `CategorizeEndpoints` lets internal traffic use, the external one (NodePort,
    /// externalIP, LB IP) to what it lets external traffic use, and affinity carries over.
    #[test]
    fn every_policy_endpoint_count_and_affinity_forwards_to_upstreams_endpoints() {
        use crate::model::fixtures::policy_matrix::cases;
        use crate::model::Endpoint;
        let sorted = |eps: &[Endpoint]| {
            let mut v: Vec<SocketAddr> =
                eps.iter().map(|e| SocketAddr::new(e.ip, e.port)).collect();
            v.sort();
            v
        };
        let all = cases();
        assert_eq!(all.len(), 72, "matrix size");
        let mut failures = Vec::new();
        for c in &all {
            let mut st = ProxyState::default();
            st.endpoints
                .insert(c.service.name.clone(), c.endpoints.clone().into());
            st.services
                .insert(c.service.name.clone(), c.service.clone().into());
            let (want, _) = plan_listeners(&st);
            for external in [false, true] {
                let key = ListenerKey {
                    service: c.service.name.clone(),
                    external,
                    v4: true,
                };
                let Some(f) = want.get(&key) else {
                    failures.push(format!("{}: no listener external={external}", c.name));
                    continue;
                };
                let mut got = f.endpoints.clone();
                got.sort();
                let expected = sorted(&if external { c.external() } else { c.internal() });
                if got != expected {
                    failures.push(format!(
                        "{}: external={external}: want {expected:?}, got {got:?}",
                        c.name
                    ));
                }
                let affinity = c
                    .service
                    .affinity_timeout
                    .map(|t| Duration::from_secs(t.into()));
                if f.affinity != affinity {
                    failures.push(format!("{}: affinity {:?}", c.name, f.affinity));
                }
            }
        }
        assert!(failures.is_empty(), "{}", failures.join("\n"));
    }
}
