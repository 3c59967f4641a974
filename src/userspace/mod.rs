//! The userspace mode (`--proxy-mode userspace`, kube-proxy's historical third mode): the
//! daemon itself carries every connection. Each service port gets a listener per family and
//! traffic scope (internal: ClusterIPs; external: NodePorts, externalIPs, LoadBalancer IPs,
//! which follow `externalTrafficPolicy`), and nftables `redirect` rules send the Service's
//! traffic to it. Backends see the node as the client (the proxy opens the connections), as
//! with upstream's userspace mode. No-endpoint rejects and source ranges stay in nftables.
//! Planning is pure; [`UserspaceProxier`] owns the listeners and applies the table.

pub mod forward;

use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use crate::ipvs::table::{element, source_range_firewall, FIREWALL_IPS};
use crate::model::topology::categorize_family;
use crate::model::{Protocol, ProxyState, ServicePortName};
use crate::nft::{
    self, Chain, ChainType, Expr, Family, Hook, KeyValue, Nftables, Rule, Set, Table, Verdict,
};
use crate::proxier::names::{userspace_chain, TABLE_COMMENT};
use crate::proxier::plan::{addr_key, nodeport_guards, port_key};
use crate::proxier::{plan_transaction, Existing, Fragment, ProxierConfig, Ruleset};
use crate::sync::{SyncError, SyncStats};

use forward::{listen, Forward, Listener};

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
    let none = Vec::new();
    for (spn, sp) in &state.services {
        if spn.protocol == Protocol::Sctp {
            sctp.push(spn.clone());
            continue;
        }
        let eps = state.endpoints.get(spn).unwrap_or(&none);
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

const FILTER_PREROUTING: &str = "filter-prerouting";
const FILTER_OUTPUT: &str = "filter-output";
const NAT_PREROUTING: &str = "nat-prerouting";
const NAT_OUTPUT: &str = "nat-output";
const SERVICE_CHECKS: &str = "service-checks";
const SERVICES: &str = "services";
const REJECT_CHAIN: &str = "reject-chain";
const SERVICE_IPS: &str = "service-ips";
const SERVICE_NODEPORTS: &str = "service-nodeports";
const NO_ENDPOINT_SERVICES: &str = "no-endpoint-services";
const NO_ENDPOINT_NODEPORTS: &str = "no-endpoint-nodeports";

fn vmap(key: Vec<nft::Field>, map: &str) -> Expr {
    Expr::Vmap {
        key,
        map: map.into(),
    }
}

/// The static part of the table.
pub fn build_base(cfg: &ProxierConfig, node: &crate::model::NodeInfo, family: Family) -> Fragment {
    use ChainType::{Filter, Nat};
    let mut f = Fragment::default();
    let r = |chain: &str, exprs: Vec<Expr>| Rule::new(chain, exprs);
    let jump = |c: &str| Expr::Verdict(Verdict::Jump(c.into()));
    // Before the redirect (-100) rewrites the destination.
    for (name, hook) in [
        (FILTER_PREROUTING, Hook::Prerouting),
        (FILTER_OUTPUT, Hook::Output),
    ] {
        f.chain(
            Chain::base(name, Filter, hook, -110),
            vec![r(name, vec![Expr::CtStateNew, jump(SERVICE_CHECKS)])],
        );
    }
    // NodePorts only on the addresses `nodePortAddresses` allows (one rule per guard).
    let guards = nodeport_guards(cfg, node, family);
    let guarded = |chain: &str, tail: Expr| -> Vec<Rule> {
        guards
            .iter()
            .map(|g| {
                let mut e = g.clone();
                e.push(tail.clone());
                Rule::new(chain, e)
            })
            .collect()
    };
    let mut checks = vec![
        r(SERVICE_CHECKS, vec![vmap(addr_key(), FIREWALL_IPS)]),
        r(SERVICE_CHECKS, vec![vmap(addr_key(), NO_ENDPOINT_SERVICES)]),
    ];
    checks.extend(guarded(
        SERVICE_CHECKS,
        vmap(port_key(), NO_ENDPOINT_NODEPORTS),
    ));
    f.chain(Chain::regular(SERVICE_CHECKS), checks);
    for (name, hook) in [
        (NAT_PREROUTING, Hook::Prerouting),
        (NAT_OUTPUT, Hook::Output),
    ] {
        f.chain(
            Chain::base(name, Nat, hook, -100),
            vec![r(name, vec![jump(SERVICES)])],
        );
    }
    let mut services = vec![r(SERVICES, vec![vmap(addr_key(), SERVICE_IPS)])];
    services.extend(guarded(SERVICES, vmap(port_key(), SERVICE_NODEPORTS)));
    f.chain(Chain::regular(SERVICES), services);
    f.chain(
        Chain::regular(REJECT_CHAIN),
        vec![r(REJECT_CHAIN, vec![Expr::Reject])],
    );
    for m in [SERVICE_IPS, NO_ENDPOINT_SERVICES, FIREWALL_IPS] {
        f.set(Set::vmap(m, addr_key()));
    }
    for m in [SERVICE_NODEPORTS, NO_ENDPOINT_NODEPORTS] {
        f.set(Set::vmap(m, port_key()));
    }
    f
}

/// One service port's fragment for `family`, given its listeners' ports.
pub fn build_service(
    state: &ProxyState,
    spn: &ServicePortName,
    ports: &BTreeMap<ListenerKey, (u16, bool)>,
    family: Family,
) -> Option<Fragment> {
    let sp = state.services.get(spn)?;
    let v4 = family == Family::Ip;
    let mut f = Fragment::default();
    let comment = spn.to_string();
    let proto = KeyValue::Proto(spn.protocol.number());
    let of_family = |a: &&IpAddr| a.is_ipv4() == v4;
    let any_usable = state.endpoints.get(spn).is_some_and(|eps| {
        eps.iter()
            .any(|e| e.ip.is_ipv4() == v4 && (e.ready || (e.serving && e.terminating)))
    });
    let no_ep = if any_usable {
        Verdict::Drop
    } else {
        Verdict::Goto(REJECT_CHAIN.into())
    };
    for external in [false, true] {
        let key = ListenerKey {
            service: spn.clone(),
            external,
            v4,
        };
        let Some(&(port, has_endpoints)) = ports.get(&key) else {
            continue;
        };
        let chain = userspace_chain(spn, external);
        let target = if has_endpoints {
            f.chain(
                Chain::regular(&chain),
                vec![Rule::new(&chain, vec![Expr::Redirect { port }])],
            );
            (SERVICE_IPS, SERVICE_NODEPORTS, Verdict::Goto(chain))
        } else {
            (NO_ENDPOINT_SERVICES, NO_ENDPOINT_NODEPORTS, no_ep.clone())
        };
        let addrs: Vec<IpAddr> = if external {
            sp.external_ips
                .iter()
                .chain(&sp.load_balancer_ips)
                .filter(of_family)
                .copied()
                .collect()
        } else {
            sp.cluster_ips.iter().filter(of_family).copied().collect()
        };
        for a in addrs {
            let k = vec![KeyValue::Addr(a), proto, KeyValue::Port(sp.port)];
            f.element(element(
                target.0,
                k.clone(),
                Some(target.2.clone()),
                &comment,
            ));
            if external && sp.load_balancer_ips.contains(&a) {
                source_range_firewall(&mut f, sp, family, k, &comment);
            }
        }
        if let (true, Some(np)) = (external, sp.node_port) {
            f.element(element(
                target.1,
                vec![proto, KeyValue::Port(np)],
                Some(target.2.clone()),
                &comment,
            ));
        }
    }
    Some(f)
}

/// The userspace mode's backend: listeners plus the redirect table.
pub struct UserspaceProxier<N: Nftables> {
    nft: N,
    cfg: ProxierConfig,
    listeners: BTreeMap<ListenerKey, Listener>,
    failed: BTreeSet<ListenerKey>,
    warned_sctp: BTreeSet<ServicePortName>,
    tables: BTreeMap<Family, Ruleset>,
    pending_deletes: BTreeMap<Family, Vec<String>>,
    need_full: bool,
}

impl<N: Nftables> UserspaceProxier<N> {
    pub fn new(nft: N, cfg: ProxierConfig) -> Self {
        UserspaceProxier {
            nft,
            cfg,
            listeners: BTreeMap::new(),
            failed: BTreeSet::new(),
            warned_sctp: BTreeSet::new(),
            tables: BTreeMap::new(),
            pending_deletes: BTreeMap::new(),
            need_full: true,
        }
    }

    pub fn backend(&mut self) -> &mut N {
        &mut self.nft
    }

    /// The listening port of one listener (tests connect to it directly).
    pub fn listener_port(&self, key: &ListenerKey) -> Option<u16> {
        self.listeners.get(key).map(|l| l.port)
    }

    /// Starts, updates and stops listeners; a listener that cannot be bound is reported
    /// once and retried at the next sync (its service is left out of the table meanwhile).
    fn sync_listeners(&mut self, want: BTreeMap<ListenerKey, Forward>) {
        self.listeners.retain(|k, _| want.contains_key(k));
        for (k, f) in want {
            if let Some(l) = self.listeners.get(&k) {
                l.balancer.set(f);
                continue;
            }
            let any: IpAddr = if k.v4 {
                IpAddr::from([0u8; 4])
            } else {
                IpAddr::from([0u16; 8])
            };
            match listen(k.service.protocol, SocketAddr::new(any, 0), f) {
                Ok(l) => {
                    self.failed.remove(&k);
                    self.listeners.insert(k, l);
                }
                Err(e) => {
                    if self.failed.insert(k.clone()) {
                        tracing::error!(service = %k.service, "cannot start a userspace listener: {e}");
                    }
                }
            }
        }
    }

    pub fn force_full_sync(&mut self) {
        self.need_full = true;
    }

    pub fn has_pending_work(&self) -> bool {
        self.pending_deletes.values().any(|v| !v.is_empty())
    }

    pub fn sync(&mut self, state: &ProxyState) -> Result<SyncStats, SyncError> {
        let (want, sctp) = plan_listeners(state);
        for spn in sctp {
            if self.warned_sctp.insert(spn.clone()) {
                tracing::warn!(service = %spn, "SCTP cannot be proxied in userspace mode; service port skipped");
            }
        }
        let has_eps: BTreeMap<ListenerKey, bool> = want
            .iter()
            .map(|(k, f)| (k.clone(), !f.endpoints.is_empty()))
            .collect();
        self.sync_listeners(want);
        let ports: BTreeMap<ListenerKey, (u16, bool)> = self
            .listeners
            .iter()
            .map(|(k, l)| {
                (
                    k.clone(),
                    (l.port, has_eps.get(k).copied().unwrap_or(false)),
                )
            })
            .collect();
        let full = self.need_full;
        let mut stats = SyncStats {
            full,
            ..Default::default()
        };
        let mut first_err = None;
        for family in Family::all() {
            let table = Table {
                family,
                name: self.cfg.table.clone(),
                comment: Some(TABLE_COMMENT.into()),
            };
            let mut rs = Ruleset::new(table, build_base(&self.cfg, &state.node, family));
            for spn in state.services.keys() {
                if let Some(frag) = build_service(state, spn, &ports, family) {
                    if frag != Fragment::default() {
                        rs.set_service(spn, Some(Arc::new(frag)));
                    }
                }
            }
            let nft_err = |error: nft::Error| SyncError::Nft { family, error };
            let res = (|| {
                let existing = if full || !self.tables.contains_key(&family) {
                    Some(Existing {
                        chains: self
                            .nft
                            .list_chains(family, &self.cfg.table)
                            .map_err(nft_err)?
                            .into_iter()
                            .collect(),
                        sets: self
                            .nft
                            .list_sets(family, &self.cfg.table)
                            .map_err(nft_err)?
                            .into_iter()
                            .collect(),
                    })
                } else {
                    None
                };
                let prev = if existing.is_some() {
                    None
                } else {
                    self.tables.get(&family)
                };
                let pending = self
                    .pending_deletes
                    .get(&family)
                    .cloned()
                    .unwrap_or_default();
                let p = plan_transaction(prev, &rs, existing.as_ref(), &pending);
                if !p.tx.ops.is_empty() {
                    self.nft.apply(&p.tx).map_err(nft_err)?;
                }
                stats.ops.insert(family, p.tx.num_ops());
                Ok::<_, SyncError>(p.stale_chains)
            })();
            match res {
                Ok(stale) => {
                    stats.rules += rs.rule_count();
                    stats.elements += rs.element_count();
                    self.pending_deletes.insert(family, stale);
                    self.tables.insert(family, rs);
                }
                Err(e) => {
                    self.tables.remove(&family);
                    first_err.get_or_insert(e);
                }
            }
        }
        match first_err {
            Some(e) => {
                self.need_full = true;
                Err(e)
            }
            None => {
                self.need_full = false;
                Ok(stats)
            }
        }
    }
}

impl<N: Nftables> crate::sync::Backend for UserspaceProxier<N> {
    fn sync(&mut self, state: &Arc<ProxyState>) -> Result<SyncStats, SyncError> {
        UserspaceProxier::sync(self, state)
    }
    fn force_full_sync(&mut self) {
        UserspaceProxier::force_full_sync(self)
    }
    fn has_pending_work(&self) -> bool {
        UserspaceProxier::has_pending_work(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{Endpoint, ServicePort};
    use crate::nft::fake::FakeNftables;

    fn spn(name: &str, p: Protocol) -> ServicePortName {
        ServicePortName {
            namespace: "ns".into(),
            name: name.into(),
            port: "p".into(),
            protocol: p,
        }
    }
    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    fn sample() -> ProxyState {
        let mut st = ProxyState::default();
        st.node.name = "node1".into();
        let mut web = ServicePort::new(spn("web", Protocol::Tcp), ip("10.96.0.10"), 80);
        web.node_port = Some(30080);
        web.external_policy_local = true;
        st.endpoints.insert(
            web.name.clone(),
            vec![
                Endpoint::ready(ip("10.244.1.2"), 8080, true),
                Endpoint::ready(ip("10.244.2.2"), 8080, false),
            ],
        );
        st.services.insert(web.name.clone(), web);
        let empty = ServicePort::new(spn("empty", Protocol::Udp), ip("10.96.0.11"), 53);
        st.services.insert(empty.name.clone(), empty);
        let sctp = ServicePort::new(spn("sctp", Protocol::Sctp), ip("10.96.0.12"), 9);
        st.services.insert(sctp.name.clone(), sctp);
        st
    }

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

    #[tokio::test]
    async fn node_ports_follow_nodeport_addresses() {
        let mut p = UserspaceProxier::new(
            FakeNftables::default(),
            ProxierConfig {
                table: "t".into(),
                nodeport_addresses: crate::proxier::NodePortAddresses::Cidrs(vec![
                    "192.168.50.0/24".parse().unwrap(),
                ]),
                ..Default::default()
            },
        );
        p.sync(&sample()).unwrap();
        let dump = p.backend().dump(Family::Ip, "t");
        assert!(
            dump.contains("fib daddr type local ip daddr 192.168.50.0/24 meta l4proto . th dport vmap @service-nodeports"),
            "{dump}"
        );
        assert!(!dump.contains("ip daddr != 127.0.0.0/8"), "{dump}");
    }

    #[tokio::test]
    async fn sync_binds_listeners_and_redirects_to_them() {
        let mut p = UserspaceProxier::new(
            FakeNftables::default(),
            ProxierConfig {
                table: "t".into(),
                ..Default::default()
            },
        );
        let st = sample();
        p.sync(&st).unwrap();
        let key = ListenerKey {
            service: spn("web", Protocol::Tcp),
            external: false,
            v4: true,
        };
        let port = p.listener_port(&key).expect("listener bound");
        let dump = p.backend().dump(Family::Ip, "t");
        assert!(dump.contains(&format!("redirect to :{port}")), "{dump}");
        assert!(dump.contains("service-nodeports { tcp . 30080"), "{dump}");
        assert!(
            dump.contains("no-endpoint-services { 10.96.0.11 . udp . 53 comment \"ns/empty:p\" : goto reject-chain }"),
            "{dump}"
        );
        // A second sync with nothing changed keeps the same listener and sends nothing.
        let s = p.sync(&st).unwrap();
        assert_eq!(p.listener_port(&key), Some(port));
        assert_eq!(s.ops.values().sum::<usize>(), 0);
        // The Service goes away: its listener closes.
        let mut st2 = st.clone();
        st2.services.remove(&key.service);
        p.sync(&st2).unwrap();
        assert_eq!(p.listener_port(&key), None);
        // The aborted task drops its socket when the runtime next runs it.
        for _ in 0..10 {
            tokio::task::yield_now().await;
        }
        assert!(std::net::TcpStream::connect(("127.0.0.1", port)).is_err());
    }
}
