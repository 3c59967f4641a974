//! The IPVS mode's companion nftables table, replacing upstream's iptables chains and
//! ipsets: IPVS does the load balancing; this table marks what must be masqueraded, rejects
//! traffic to services without endpoints, enforces LoadBalancer source ranges and
//! masquerades hairpin traffic. Built as a [`Ruleset`] (a base fragment plus one fragment per
//! service port) so syncs send only what changed, through the same typed layer as the
//! nftables mode. Pure.

use std::collections::BTreeMap;
use std::sync::Arc;

use crate::kernel::nft::{
    Chain, ChainType, CmpOp, Expr, Family, Field, Hook, KeyValue, Rule, Set, Table, Verdict,
};
use crate::model::{NodeInfo, ProxyState, ServicePortName};
use crate::proxy::names::{
    CLUSTER_IPS, FILTER_INPUT, FILTER_OUTPUT, MARK_FOR_MASQUERADE, NAT_POSTROUTING, REJECT_CHAIN,
    SERVICES, SERVICE_CHECKS,
};
pub use crate::proxy::names::{FIREWALL_IPS, NO_ENDPOINT_NODEPORTS, NO_ENDPOINT_SERVICES};
use crate::proxy::rules::{
    addr_key, element, from_pod, guarded, in_set, jump, nat_dispatch, nodeport_guards, port_key,
    pre_dnat_checks, reject_chain, service_checks, source_range_firewall, SRCNAT,
};
use crate::proxy::{Fragment, ProxierConfig, Ruleset};

use super::plan::{IpvsPlan, VsKind};

/// Default name of the companion table (the nftables mode's is `kube-nlproxy`).
pub const DEFAULT_TABLE: &str = "kube-nlproxy-ipvs";

pub const EXTERNAL_IPS: &str = "external-ips";
pub const NODEPORTS: &str = "nodeports";
pub const HAIRPIN: &str = "hairpin";

/// The static part: base chains, dispatch chains, sets and maps.
pub fn build_base(cfg: &ProxierConfig, node: &NodeInfo, family: Family) -> Fragment {
    use ChainType::Nat;
    let mut f = Fragment::default();
    let r = |chain: &str, exprs: Vec<Expr>| Rule::new(chain, exprs);
    pre_dnat_checks(
        &mut f,
        [(FILTER_INPUT, Hook::Input), (FILTER_OUTPUT, Hook::Output)],
        SERVICE_CHECKS,
    );
    let guards = nodeport_guards(cfg, node, family);
    service_checks(&mut f, &guards);
    nat_dispatch(&mut f, SERVICES);
    let mut services = Vec::new();
    let to_cluster_ip = in_set(addr_key(), CLUSTER_IPS);
    if cfg.masquerade_all {
        services.push(r(SERVICES, vec![to_cluster_ip, jump(MARK_FOR_MASQUERADE)]));
    } else if let Some(not_pod) = from_pod(&cfg.local_detector, family, CmpOp::Neq) {
        services.push(
            r(
                SERVICES,
                vec![to_cluster_ip, not_pod, jump(MARK_FOR_MASQUERADE)],
            )
            .with_comment("masquerade ClusterIP traffic from outside the cluster"),
        );
    }
    services.push(r(
        SERVICES,
        vec![in_set(addr_key(), EXTERNAL_IPS), jump(MARK_FOR_MASQUERADE)],
    ));
    services.extend(guarded(
        &guards,
        SERVICES,
        &[in_set(port_key(), NODEPORTS), jump(MARK_FOR_MASQUERADE)],
    ));
    f.chain(Chain::regular(SERVICES), services);
    let mark = cfg.masquerade_mark();
    f.chain(
        Chain::regular(MARK_FOR_MASQUERADE),
        vec![r(MARK_FOR_MASQUERADE, vec![Expr::MarkOr(mark)])],
    );
    f.chain(
        Chain::base(NAT_POSTROUTING, Nat, Hook::Postrouting, SRCNAT),
        vec![
            r(
                NAT_POSTROUTING,
                vec![
                    in_set(
                        vec![Field::Saddr, Field::Daddr, Field::L4Proto, Field::Dport],
                        HAIRPIN,
                    ),
                    Expr::Masquerade { fully_random: true },
                ],
            )
            .with_comment("hairpin: a pod reaching itself through a service"),
            r(
                NAT_POSTROUTING,
                vec![Expr::MarkBitClear(mark), Expr::Verdict(Verdict::Return)],
            ),
            r(NAT_POSTROUTING, vec![Expr::MarkXor(mark)]),
            r(
                NAT_POSTROUTING,
                vec![Expr::Masquerade { fully_random: true }],
            ),
        ],
    );
    reject_chain(&mut f);
    f.set(Set::plain(CLUSTER_IPS, addr_key()));
    f.set(Set::plain(EXTERNAL_IPS, addr_key()));
    f.set(Set::plain(NODEPORTS, port_key()));
    f.set(Set::plain(
        HAIRPIN,
        vec![Field::Saddr, Field::Daddr, Field::L4Proto, Field::Dport],
    ));
    for m in [FIREWALL_IPS, NO_ENDPOINT_SERVICES] {
        f.set(Set::vmap(m, addr_key()));
    }
    f.set(Set::vmap(NO_ENDPOINT_NODEPORTS, port_key()));
    f
}

/// The per-service-port fragments of one family, from the plan.
pub fn build_services(
    state: &ProxyState,
    plan: &IpvsPlan,
    family: Family,
) -> BTreeMap<ServicePortName, Fragment> {
    let mut out: BTreeMap<ServicePortName, Fragment> = BTreeMap::new();
    let v4 = family == Family::Ip;
    for d in plan.services.values().filter(|d| d.vs.addr.is_ipv4() == v4) {
        let Some(sp) = state.services.get(&d.service) else {
            continue;
        };
        let f = out.entry(d.service.clone()).or_insert_with(|| Fragment {
            created: sp.created,
            ..Fragment::default()
        });
        let comment: crate::kernel::nft::Name = d.service.to_string().into();
        let proto = KeyValue::Proto(d.vs.protocol);
        let addr_k = vec![KeyValue::Addr(d.vs.addr), proto, KeyValue::Port(d.vs.port)];
        match d.kind {
            VsKind::ClusterIp => f.element(element(CLUSTER_IPS, addr_k.clone(), None, &comment)),
            VsKind::ExternalIp | VsKind::LoadBalancer if !sp.external_policy_local => {
                f.element(element(EXTERNAL_IPS, addr_k.clone(), None, &comment))
            }
            VsKind::NodePort if !sp.external_policy_local => f.element(element(
                NODEPORTS,
                vec![proto, KeyValue::Port(d.vs.port)],
                None,
                &comment,
            )),
            _ => {}
        }
        for (ip, port) in d.dests.keys() {
            f.element(element(
                HAIRPIN,
                vec![
                    KeyValue::Addr(*ip),
                    KeyValue::Addr(*ip),
                    proto,
                    KeyValue::Port(*port),
                ],
                None,
                &comment,
            ));
        }
        if d.dests.is_empty() {
            // None anywhere: reject; only the traffic policy excludes them: drop (upstream).
            let any = state.endpoints.get(&d.service).is_some_and(|eps| {
                eps.iter()
                    .any(|e| e.ip.is_ipv4() == v4 && (e.ready || (e.serving && e.terminating)))
            });
            let v = if any {
                Verdict::Drop
            } else {
                Verdict::Goto(REJECT_CHAIN.into())
            };
            if d.kind == VsKind::NodePort {
                f.element(element(
                    NO_ENDPOINT_NODEPORTS,
                    vec![proto, KeyValue::Port(d.vs.port)],
                    Some(v),
                    &comment,
                ));
            } else {
                f.element(element(
                    NO_ENDPOINT_SERVICES,
                    addr_k.clone(),
                    Some(v),
                    &comment,
                ));
            }
        }
        if d.kind == VsKind::LoadBalancer {
            source_range_firewall(f, sp, family, addr_k, &comment);
        }
    }
    out
}

/// The whole companion table of one family.
pub fn build_ruleset(
    state: &ProxyState,
    plan: &IpvsPlan,
    cfg: &ProxierConfig,
    family: Family,
) -> Ruleset {
    let table = Table {
        family,
        name: cfg.table.clone(),
        comment: Some(crate::proxy::TABLE_COMMENT.into()),
    };
    let mut rs = Ruleset::new(table, build_base(cfg, &state.node, family));
    for (name, frag) in build_services(state, plan, family) {
        rs.set_service(&name, Some(Arc::new(frag)));
    }
    rs
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernel::nft::fake::FakeNftables;
    use crate::kernel::nft::Nftables;
    use crate::model::{Endpoint, Protocol, ServicePort};
    use crate::modes::ipvs::plan::{build_plan, IpvsConfig};
    use crate::proxy::plan_transaction;
    use crate::proxy::LocalDetector;

    fn spn(name: &str) -> ServicePortName {
        ServicePortName {
            namespace: "ns".into(),
            name: name.into(),
            port: "p".into(),
            protocol: Protocol::Tcp,
        }
    }
    fn ip(s: &str) -> std::net::IpAddr {
        s.parse().unwrap()
    }

    fn cfg() -> ProxierConfig {
        ProxierConfig {
            table: DEFAULT_TABLE.into(),
            local_detector: LocalDetector::Cidrs(vec!["10.244.0.0/16".parse().unwrap()]),
            ..Default::default()
        }
    }

    fn sample() -> ProxyState {
        let mut st = ProxyState::default();
        st.node.name = "node1".into();
        let mut web = ServicePort::new(spn("web"), ip("10.96.0.10"), 80);
        web.node_port = Some(30080);
        web.load_balancer_ips = vec![ip("198.51.100.9")];
        web.load_balancer_source_ranges = vec!["203.0.113.0/24".parse().unwrap()];
        st.endpoints.insert(
            web.name.clone(),
            vec![Endpoint::ready(ip("10.244.1.2"), 8080, true)].into(),
        );
        st.services.insert(web.name.clone(), web.into());
        let empty = ServicePort::new(spn("empty"), ip("10.96.0.11"), 53);
        st.services.insert(empty.name.clone(), empty.into());
        st
    }

    #[test]
    fn the_kernel_accepts_what_we_build() {
        // The fake checks references (sets, chains, key types) as the kernel would.
        let st = sample();
        let plan = build_plan(&st, &IpvsConfig::default(), &[ip("192.168.50.1")]);
        let rs = build_ruleset(&st, &plan, &cfg(), Family::Ip);
        let mut nft = FakeNftables::default();
        nft.apply(&plan_transaction(None, &rs, None, &[]).tx)
            .unwrap();
        let dump = nft.dump(Family::Ip, DEFAULT_TABLE);
        for needle in [
            "10.96.0.10 . tcp . 80",
            "tcp . 30080",
            "198.51.100.9 . tcp . 80",
            "10.244.1.2 . 10.244.1.2 . tcp . 8080",
            "no-endpoint-services { 10.96.0.11 . tcp . 53 comment \"ns/empty:p\" : goto reject-chain }",
            "ip saddr 203.0.113.0/24 return",
        ] {
            assert!(dump.contains(needle), "missing {needle:?} in\n{dump}");
        }
    }

    /// IPv6: the hairpin key `saddr . daddr . l4proto . dport` is 35 bytes, the longest key
    /// any planner builds; every element reaches the (fake) kernel whole.
    #[test]
    fn the_kernel_accepts_what_we_build_for_ipv6() {
        let mut st = ProxyState::default();
        st.node.name = "node1".into();
        let mut web = ServicePort::new(spn("web6"), ip("fd00:96::10"), 80);
        web.node_port = Some(30080);
        st.endpoints.insert(
            web.name.clone(),
            vec![Endpoint::ready(ip("fd00:244::2"), 8080, true)].into(),
        );
        st.services.insert(web.name.clone(), web.into());
        let plan = build_plan(&st, &IpvsConfig::default(), &[ip("fd00:50::1")]);
        let rs = build_ruleset(&st, &plan, &cfg(), Family::Ip6);
        let hairpin: Vec<_> = rs.elements().filter(|e| &**e.set() == HAIRPIN).collect();
        assert_eq!(hairpin.len(), 1, "{hairpin:?}");
        assert_eq!(hairpin[0].key.len(), 4, "{:?}", hairpin[0].key);
        let mut nft = FakeNftables::default();
        nft.apply(&plan_transaction(None, &rs, None, &[]).tx)
            .unwrap();
        assert!(
            nft.dump(Family::Ip6, DEFAULT_TABLE)
                .contains("fd00:244::2 . fd00:244::2 . tcp . 8080"),
            "{}",
            nft.dump(Family::Ip6, DEFAULT_TABLE)
        );
    }

    #[test]
    fn an_endpoint_change_touches_only_its_elements() {
        let st = sample();
        let plan = build_plan(&st, &IpvsConfig::default(), &[ip("192.168.50.1")]);
        let before = build_ruleset(&st, &plan, &cfg(), Family::Ip);
        let mut st2 = st.clone();
        st2.endpoints.insert(
            spn("empty"),
            vec![Endpoint::ready(ip("10.244.1.3"), 5353, true)].into(),
        );
        let plan2 = build_plan(&st2, &IpvsConfig::default(), &[ip("192.168.50.1")]);
        let after = build_ruleset(&st2, &plan2, &cfg(), Family::Ip);
        let tx = plan_transaction(Some(&before), &after, None, &[]).tx;
        let text = crate::kernel::nft::render::transaction(&tx);
        assert_eq!(tx.ops.len(), 2, "{text}");
        assert!(text.contains("delete element ip kube-nlproxy-ipvs no-endpoint-services"));
        assert!(text.contains("add element ip kube-nlproxy-ipvs hairpin"));
    }
}
