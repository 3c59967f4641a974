//! Builds the [`Ruleset`] of one family from the model. Pure.
//!
//! Layout (see docs/design.md, "Ruleset design"): upstream nftables mode's base chains, static chains
//! and verdict maps keyed on `daddr . l4proto . dport`; per service port a chain whose one
//! `dnat to numgen random mod N offset O map @endpoints-XX` rule picks an endpoint from a
//! block of slots in one of the shared endpoint maps ([`super::slots`]), instead of upstream's
//! per-endpoint chains and anonymous numgen vmaps (the kernel re-validates the chain graph on
//! every rule change; map elements need no validation). One endpoint is a plain `dnat to`;
//! ClientIP affinity keeps a cascade of `numgen random mod (N-i) 0 … dnat to endpoint_i`
//! rules with per-endpoint affinity sets. Hairpin masquerade goes through one
//! `saddr . daddr` set.
//!
//! One concern per file: `base.rs` the static base (base chains, guards, loopback rejects),
//! `balance.rs` the shared `balance-N` chains and the load-balancing rules, `port_rules.rs`
//! one service port's rules as named steps (`PortRules`); here the entry points.

mod balance;
mod base;
mod port_rules;

use std::net::IpAddr;
use std::sync::Arc;

use crate::kernel::nft::{
    shared_name, ElemData, Element, Family, Key, KeyValue, Name, Table, Verdict,
};
use crate::model::{Endpoint, NodeInfo, ProxyState, ServicePort};

use crate::proxy::names::*;
use crate::proxy::{Fragment, ProxierConfig, Ruleset};

use super::SlotAllocator;

pub use balance::BalanceWidths;
pub use base::{build_base, nftables_base};
use port_rules::service_port_rules;

fn key(addr: IpAddr, proto: u8, port: u16) -> Key {
    [
        KeyValue::Addr(addr),
        KeyValue::Proto(proto),
        KeyValue::Port(port),
    ]
    .into()
}

fn elem(set: &str, key: Key, v: Verdict, comment: &Name) -> Element {
    Element::new(
        shared_name(set),
        key,
        ElemData::Verdict(v),
        Some(comment.clone()),
    )
}

/// The objects of one service port in one family (empty when it has no ClusterIP there).
pub fn build_service(
    cfg: &ProxierConfig,
    node: &NodeInfo,
    sp: &ServicePort,
    endpoints: &[Endpoint],
    family: Family,
    slots: &mut SlotAllocator,
) -> Fragment {
    let mut rs = Fragment {
        created: sp.created,
        ..Fragment::default()
    };
    service_port_rules(&mut rs, cfg, node, sp, endpoints, family, slots);
    // Kept as long as the port is: 22 elements (10 endpoints) sit in a list grown to 32.
    rs.elements.shrink_to_fit();
    rs
}

/// Frees the endpoint-map slots of one service port's chains (before rebuilding or
/// removing it).
pub fn release_service_slots(spn: &crate::model::ServicePortName, slots: &mut SlotAllocator) {
    let c = ServiceChains::new(spn);
    slots.release(&c.service);
    slots.release(&c.local);
}

/// Our table of `family`, named as configured.
pub fn table(cfg: &ProxierConfig, family: Family) -> Table {
    Table {
        family,
        name: cfg.table.clone(),
        comment: Some(TABLE_COMMENT.into()),
    }
}

/// Builds the complete ruleset of one family's table.
pub fn build_ruleset(state: &ProxyState, cfg: &ProxierConfig, family: Family) -> Ruleset {
    let mut slots = SlotAllocator::for_services(state.services.len());
    build_ruleset_with_slots(state, cfg, family, &mut slots)
}

/// [`build_ruleset`] assigning endpoint-map slots from `slots` (the syncer keeps it for
/// partial syncs).
pub fn build_ruleset_with_slots(
    state: &ProxyState,
    cfg: &ProxierConfig,
    family: Family,
    slots: &mut SlotAllocator,
) -> Ruleset {
    build_ruleset_counted(state, cfg, family, slots).0
}

/// [`build_ruleset_with_slots`], with how many service ports use each `balance-N` chain
/// (the syncer keeps that for partial syncs too).
pub fn build_ruleset_counted(
    state: &ProxyState,
    cfg: &ProxierConfig,
    family: Family,
    slots: &mut SlotAllocator,
) -> (Ruleset, BalanceWidths) {
    let mut widths = BalanceWidths::default();
    let fragments: Vec<(&crate::model::ServicePortName, Fragment)> = state
        .services
        .iter()
        .map(|(spn, sp)| {
            let eps = state.endpoints_of(spn);
            let f = build_service(cfg, &state.node, sp, eps, family, slots);
            widths.add(&f);
            (spn, f)
        })
        .collect();
    let base = nftables_base(cfg, &state.node, family, slots.maps(), &widths);
    let services = fragments
        .into_iter()
        .map(|(spn, f)| (spn.clone(), Arc::new(f)));
    (
        Ruleset::with_services(table(cfg, family), base, services),
        widths,
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    use crate::kernel::nft::{render, Expr, KeyValue, Object, Op, Rule};
    use crate::model::{LoadBalancing, Protocol, ServicePortName};
    use crate::proxy::{plan_transaction, LocalDetector};

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    fn state(eps: &[&str]) -> ProxyState {
        let mut st = ProxyState::default();
        st.node.name = "node1".into();
        let name = ServicePortName {
            namespace: "ns".into(),
            name: "web".into(),
            port: "http".into(),
            protocol: Protocol::Tcp,
        };
        let sp = ServicePort::new(name.clone(), ip("172.30.0.10"), 80);
        st.endpoints.insert(
            name.clone(),
            eps.iter()
                .map(|e| Endpoint::ready(ip(e), 8080, false))
                .collect::<Vec<_>>()
                .into(),
        );
        st.services.insert(name, sp.into());
        st
    }

    fn text(st: &ProxyState, cfg: &ProxierConfig, family: Family) -> String {
        let rs = build_ruleset(st, cfg, family);
        render::transaction(&plan_transaction(None, &rs, None, &[]).tx)
    }

    #[test]
    fn several_endpoints_and_nothing_else_are_elements_of_the_balance_map_without_a_chain() {
        let t = text(
            &state(&["10.180.0.1", "10.180.0.2"]),
            &ProxierConfig::default(),
            Family::Ip,
        );
        for want in [
            "add map ip kube-nlproxy balance-2-services { typeof ip daddr . meta l4proto . th \
             dport . numgen random mod 2 : ip daddr . th dport ; }",
            "add rule ip kube-nlproxy balance-2 dnat ip to ip daddr . meta l4proto . th dport . \
             numgen random mod 2 map @balance-2-services",
            "add element ip kube-nlproxy balance-2-services { 172.30.0.10 . tcp . 80 . 0 : \
             10.180.0.1 . 8080 }",
            "add element ip kube-nlproxy balance-2-services { 172.30.0.10 . tcp . 80 . 1 : \
             10.180.0.2 . 8080 }",
            "add element ip kube-nlproxy service-ips { 172.30.0.10 . tcp . 80 comment \
             \"ns/web:http\" : goto balance-2 }",
        ] {
            assert!(t.contains(want), "{want}\n{t}");
        }
        assert!(!t.contains("add chain ip kube-nlproxy svc-"), "{t}");
        assert!(!t.contains("offset"), "no slots: {t}");
        assert!(!t.contains("balance-3"), "only the widths in use: {t}");
        // A NodePort: its own chain, one rule over a block of endpoint-map slots.
        let mut st = state(&["10.180.0.1", "10.180.0.2"]);
        crate::model::fixtures::first_service_mut(&mut st).node_port = Some(30080);
        let t = text(&st, &ProxierConfig::default(), Family::Ip);
        assert!(t.contains("numgen random mod 2 offset"), "{t}");
        assert!(t.contains("map @endpoints-"), "{t}");
        assert!(!t.contains("balance-2"), "{t}");
    }

    /// The state of [`state`] with `n` endpoints and the port's load balancing set.
    fn maglev_state(n: usize, lb: Option<LoadBalancing>) -> ProxyState {
        let ips: Vec<String> = (0..n).map(|i| format!("10.180.0.{}", i + 1)).collect();
        let mut st = state(&ips.iter().map(String::as_str).collect::<Vec<_>>());
        crate::model::fixtures::first_service_mut(&mut st).load_balancing = lb;
        st
    }

    /// The Maglev rule of a ruleset (modulus, offset, map) and how many slots of that
    /// block each endpoint address holds.
    fn maglev_of(rs: &Ruleset) -> Option<(u32, u32, BTreeMap<IpAddr, usize>)> {
        let (modulus, offset, map) = rs.chains().find_map(|(_, rules)| {
            rules.iter().flat_map(|r| &r.exprs).find_map(|e| match e {
                Expr::DnatHash {
                    key,
                    modulus,
                    seed,
                    offset,
                    map,
                } => {
                    assert_eq!(*key, balance::maglev_key());
                    assert_eq!(seed, &balance::MAGLEV_SEED);
                    Some((*modulus, *offset, map.clone()))
                }
                _ => None,
            })
        })?;
        let mut owners = BTreeMap::new();
        for e in rs.elements() {
            if &**e.set() != map.as_str() {
                continue;
            }
            let (Some(KeyValue::Slot(slot)), Some(target)) = (e.key.get(0), e.target()) else {
                panic!("not an endpoint-map element: {e:?}");
            };
            assert!((offset..offset + modulus).contains(&slot), "{slot}");
            *owners.entry(target.ip()).or_default() += 1;
        }
        Some((modulus, offset, owners))
    }

    #[test]
    fn a_maglev_port_hashes_into_its_table_by_annotation_or_default_and_affinity_wins() {
        let cfg = ProxierConfig::default();
        let rs = build_ruleset(
            &maglev_state(3, Some(LoadBalancing::Maglev)),
            &cfg,
            Family::Ip,
        );
        let (m, _, owners) = maglev_of(&rs).expect("a Maglev rule");
        assert_eq!(
            m, 509,
            "the smallest table with 100 entries for each of 3 endpoints"
        );
        assert_eq!(owners.len(), 3, "{owners:?}");
        assert_eq!(
            owners.values().sum::<usize>(),
            509,
            "every entry is an element"
        );
        let (lo, hi) = (
            owners.values().min().unwrap(),
            owners.values().max().unwrap(),
        );
        assert!(hi - lo <= 1, "balanced within one entry: {owners:?}");
        // One endpoint is a table too (no shared fast path): the next endpoint only adds.
        let one = build_ruleset(
            &maglev_state(1, Some(LoadBalancing::Maglev)),
            &cfg,
            Family::Ip,
        );
        let smallest = maglev_of(&one).unwrap().2.values().sum::<usize>();
        assert_eq!(smallest, 251, "the smallest table");
        // The default applies to ports without the annotation, and the annotation overrides it.
        let maglev_default = ProxierConfig {
            load_balancing: LoadBalancing::Maglev,
            ..ProxierConfig::default()
        };
        let rs = build_ruleset(&maglev_state(3, None), &maglev_default, Family::Ip);
        assert!(maglev_of(&rs).is_some());
        assert!(maglev_of(&build_ruleset(&maglev_state(3, None), &cfg, Family::Ip)).is_none());
        let opted_out = maglev_state(3, Some(LoadBalancing::Random));
        assert!(maglev_of(&build_ruleset(&opted_out, &maglev_default, Family::Ip)).is_none());
        // ClientIP affinity: the affinity cascade, as for a random port.
        let mut st = maglev_state(3, Some(LoadBalancing::Maglev));
        crate::model::fixtures::first_service_mut(&mut st).affinity_timeout = Some(600);
        let rs = build_ruleset(&st, &cfg, Family::Ip);
        assert!(maglev_of(&rs).is_none());
        assert!(
            render_text(&rs).contains("update @affinity-"),
            "{}",
            render_text(&rs)
        );
    }

    fn render_text(rs: &Ruleset) -> String {
        render::transaction(&plan_transaction(None, rs, None, &[]).tx)
    }

    /// `status` and `diff` plan against the live table with its slots: a Maglev chain's block
    /// is read from its `jhash … offset O` rule, so an unchanged table plans identically.
    #[test]
    fn a_plan_against_the_live_table_keeps_a_maglev_tables_slots() {
        let cfg = ProxierConfig::default();
        let st = maglev_state(3, Some(LoadBalancing::Maglev));
        // Slots 0..1024 taken first: the table lands where a fresh allocator would not.
        let mut slots = SlotAllocator::new();
        slots.assign("someone-else", 1000);
        let live_rs = build_ruleset_with_slots(&st, &cfg, Family::Ip, &mut slots);
        let (_, offset, _) = maglev_of(&live_rs).unwrap();
        assert_eq!(offset, 1024);
        let opts = crate::proxy::Options {
            proxier: cfg,
            detect_local: crate::proxy::DetectLocal::ClusterCidr(vec![]),
            sync_period: std::time::Duration::from_secs(30),
            conntrack_cleanup: true,
            reset_dead_endpoint_connections: false,
            families: crate::kernel::nft::Family::all().to_vec(),
        };
        let planned = super::super::plan_against(&opts, &st, &live_rs.as_live());
        assert_eq!(maglev_of(&planned).unwrap().1, offset);
    }

    #[test]
    fn removing_one_of_ten_maglev_endpoints_rewrites_only_the_entries_that_change_owner() {
        let cfg = ProxierConfig::default();
        let before = build_ruleset(
            &maglev_state(10, Some(LoadBalancing::Maglev)),
            &cfg,
            Family::Ip,
        );
        let after = build_ruleset(
            &maglev_state(9, Some(LoadBalancing::Maglev)),
            &cfg,
            Family::Ip,
        );
        let (m, offset, owners) = maglev_of(&before).unwrap();
        assert_eq!(
            (m, offset),
            (maglev_of(&after).unwrap().0, maglev_of(&after).unwrap().1)
        );
        let gone = owners[&ip("10.180.0.10")];
        let tx = plan_transaction(Some(&before), &after, None, &[]).tx;
        assert!(
            tx.ops
                .iter()
                .all(|op| matches!(op.object(), Object::Element(_))),
            "elements only, no rule: {}",
            render::transaction(&tx)
        );
        // Each changed entry of the table is a delete and an add; besides, the removed
        // endpoint's hairpin element goes.
        let in_table = |op: &&Op| matches!(op.object(), Object::Element(e) if e.set().starts_with("endpoints-"));
        let count = |verb: &str| {
            tx.ops
                .iter()
                .filter(in_table)
                .filter(|op| op.verb() == verb)
                .count()
        };
        let changed = count("add");
        assert_eq!(changed, count("delete"), "rewritten in place");
        assert!(
            changed >= gone,
            "at least the removed endpoint's {gone} entries: {changed}"
        );
        assert!(
            changed <= 3 * gone,
            "about 1/N of the {m} entries: {changed} of {m}"
        );
        assert_eq!(
            tx.ops.len(),
            2 * changed + 1,
            "{}",
            render::transaction(&tx)
        );
    }

    #[test]
    fn one_endpoint_and_nothing_else_is_an_element_of_the_one_endpoint_map_without_a_chain() {
        let t = text(
            &state(&["10.180.0.1"]),
            &ProxierConfig::default(),
            Family::Ip,
        );
        assert!(
            t.contains(
                "add element ip kube-nlproxy one-endpoint-services { 172.30.0.10 . tcp . 80 \
                 comment \"ns/web:http\" : 10.180.0.1 . 8080 }"
            ),
            "{t}"
        );
        assert!(
            t.contains(
                "add rule ip kube-nlproxy one-endpoint dnat ip to ip daddr . meta l4proto . th \
                 dport map @one-endpoint-services"
            ),
            "{t}"
        );
        assert!(
            !t.contains("add chain ip kube-nlproxy svc-"),
            "no chain: {t}"
        );
        assert!(
            t.contains(
                "add element ip kube-nlproxy service-ips { 172.30.0.10 . tcp . 80 \
                 comment \"ns/web:http\" : goto one-endpoint }"
            ),
            "{t}"
        );
        assert!(!t.contains("numgen random mod 1 offset"), "{t}");
    }

    #[test]
    fn one_endpoint_with_something_of_its_own_keeps_its_chain_and_an_endpoint_map_slot() {
        let mut st = state(&["10.180.0.1"]);
        crate::model::fixtures::first_service_mut(&mut st).node_port = Some(30080);
        let t = text(&st, &ProxierConfig::default(), Family::Ip);
        assert!(t.contains("numgen random mod 1 offset"), "{t}");
        assert!(t.contains("10.180.0.1 . 8080"), "{t}");
        assert!(!t.contains("one-endpoint-services { 172"), "{t}");
        assert!(
            !t.contains("dnat to 10.180.0.1:8080"),
            "no per-endpoint rule: {t}"
        );
        // With affinity: the per-endpoint cascade with its affinity set.
        let mut st = state(&["10.180.0.1"]);
        crate::model::fixtures::first_service_mut(&mut st).affinity_timeout = Some(10800);
        let t = text(&st, &ProxierConfig::default(), Family::Ip);
        assert!(t.contains("dnat to 10.180.0.1:8080"), "{t}");
        assert!(!t.contains("one-endpoint-services { 172"), "{t}");
    }

    #[test]
    fn no_endpoints_rejects_through_the_no_endpoint_map() {
        let t = text(&state(&[]), &ProxierConfig::default(), Family::Ip);
        assert!(
            t.contains("172.30.0.10 . tcp . 80 comment \"ns/web:http\" : goto reject-chain"),
            "{t}"
        );
        assert!(!t.contains("dnat to"), "{t}");
    }

    #[test]
    fn the_other_family_gets_none_of_an_ipv4_service() {
        let t = text(
            &state(&["10.180.0.1"]),
            &ProxierConfig::default(),
            Family::Ip6,
        );
        assert!(!t.contains("172.30.0.10"), "{t}");
        assert!(t.contains("add table ip6 kube-nlproxy"), "{t}");
    }

    #[test]
    fn masquerade_all_marks_every_cluster_ip_connection() {
        let cfg = ProxierConfig {
            masquerade_all: true,
            ..Default::default()
        };
        let all = text(&state(&["10.180.0.1"]), &cfg, Family::Ip);
        let detected = text(
            &state(&["10.180.0.1"]),
            &ProxierConfig {
                local_detector: LocalDetector::Cidrs(vec!["10.0.0.0/8".parse().unwrap()]),
                ..Default::default()
            },
            Family::Ip,
        );
        assert!(detected.contains("ip saddr != 10.0.0.0/8"), "{detected}");
        assert!(!all.contains("ip saddr != 10.0.0.0/8"), "{all}");
        assert!(all.contains("jump mark-for-masquerade"), "{all}");
    }

    /// The forward chain's rules of `cfg`'s IPv4 ruleset, in order.
    fn forward_rules(cfg: &ProxierConfig) -> Vec<Rule> {
        let rs = build_ruleset(&state(&["10.180.0.1"]), cfg, Family::Ip);
        let rules = rs
            .chains()
            .find(|(c, _)| c.name == FILTER_FORWARD)
            .map(|(_, rules)| rules.clone());
        rules.unwrap_or_default()
    }

    /// Upstream 1.37's gate `KubeProxyNFTablesLocalhostNodePorts`: a chain per rejected
    /// protocol that counts and rejects, the `localhost-nodeport-reject-ports` map with the
    /// NodePorts of those protocols, and the loopback lookup in `nodeport-endpoints-check`.
    #[test]
    fn loopback_node_ports_are_rejected_and_counted_per_family_policy() {
        use crate::proxy::{LoopbackNodePorts, LoopbackPolicy};
        let mut st = state(&["10.180.0.1", "fd00::1"]);
        let spn = st.services.keys().next().unwrap().clone();
        let mut sp = (*st.services[&spn]).clone();
        sp.node_port = Some(30080);
        sp.cluster_ips.push(ip("fd00:30::10"));
        st.services.insert(spn, sp.into());
        let cfg = ProxierConfig {
            loopback_nodeports: LoopbackPolicy {
                v4: LoopbackNodePorts::ServeTcp,
                v6: LoopbackNodePorts::RejectAll,
            },
            ..Default::default()
        };
        let v4 = text(&st, &cfg, Family::Ip);
        for want in [
            "add rule ip kube-nlproxy localhost-nodeport-reject-udp counter reject comment \"localhost-nodeport-rejected-udp\"",
            "add chain ip kube-nlproxy localhost-nodeport-reject-sctp",
            "add map ip kube-nlproxy localhost-nodeport-reject-ports",
            "add rule ip kube-nlproxy nodeport-endpoints-check ip daddr 127.0.0.0/8 meta l4proto . th dport vmap @localhost-nodeport-reject-ports",
        ] {
            assert!(v4.contains(want), "{want}\n in\n{v4}");
        }
        assert!(
            !v4.contains("localhost-nodeport-reject-tcp"),
            "IPv4 serves TCP in userspace: not rejected\n{v4}"
        );
        let v6 = text(&st, &cfg, Family::Ip6);
        for want in [
            "add rule ip6 kube-nlproxy localhost-nodeport-reject-tcp counter reject comment \"localhost-nodeport-rejected-tcp\"",
            "add rule ip6 kube-nlproxy nodeport-endpoints-check ip6 daddr ::1 meta l4proto . th dport vmap @localhost-nodeport-reject-ports",
            "add element ip6 kube-nlproxy localhost-nodeport-reject-ports { tcp . 30080 comment \"ns/web:http\" : goto localhost-nodeport-reject-tcp }",
        ] {
            assert!(v6.contains(want), "{want}\n in\n{v6}");
        }
        let untouched = text(&st, &ProxierConfig::default(), Family::Ip);
        assert!(!untouched.contains("localhost-nodeport"), "{untouched}");
    }

    /// iptables mode with localhost NodePorts: upstream's KUBE-FIREWALL rule, first in the
    /// input and output hooks, IPv4 only; nothing of it otherwise.
    #[test]
    fn iptables_mode_guards_route_localnet_as_upstream() {
        let cfg = ProxierConfig {
            localnet_guard: true,
            ..Default::default()
        };
        let st = state(&["10.180.0.1"]);
        let v4 = text(&st, &cfg, Family::Ip);
        for want in [
            "add rule ip kube-nlproxy filter-input ip daddr 127.0.0.0/8 ip saddr != 127.0.0.0/8 ct state new jump localnet-guard",
            "add rule ip kube-nlproxy filter-output ip daddr 127.0.0.0/8 ip saddr != 127.0.0.0/8 ct state new jump localnet-guard",
            "add rule ip kube-nlproxy localnet-guard ct status dnat return",
            "add rule ip kube-nlproxy localnet-guard drop comment \"block incoming localnet connections\"",
        ] {
            assert!(v4.contains(want), "{want}\n in\n{v4}");
        }
        let input = v4
            .lines()
            .find(|l| l.starts_with("add rule ip kube-nlproxy filter-input"))
            .unwrap();
        assert!(input.contains("localnet-guard"), "first in input: {input}");
        assert!(
            !text(&st, &cfg, Family::Ip6).contains("localnet"),
            "IPv4 only"
        );
        assert!(!text(&st, &ProxierConfig::default(), Family::Ip).contains("localnet"));
    }

    #[test]
    fn iptables_mode_with_a_strict_conntrack_drops_invalid_packets_first_in_forward() {
        let cfg = ProxierConfig {
            drop_invalid: true,
            ..Default::default()
        };
        let rules = forward_rules(&cfg);
        assert_eq!(
            rules[0].exprs,
            [
                Expr::CtStateInvalid,
                Expr::Counter,
                Expr::Verdict(Verdict::Drop)
            ]
        );
        assert_eq!(rules[0].comment.as_deref(), Some(INVALID_DROP_COMMENT));
        assert!(INVALID_DROP_COMMENT.contains("kubernetes#74839"));
        assert_eq!(rules.len(), 3, "{rules:?}");
        let t = text(&state(&["10.180.0.1"]), &cfg, Family::Ip6);
        assert!(
            t.contains("add rule ip6 kube-nlproxy filter-forward ct state invalid counter drop"),
            "{t}"
        );
    }

    #[test]
    fn nftables_mode_or_a_liberal_conntrack_forwards_invalid_packets_untouched() {
        // Neither upstream's nftables mode nor its iptables mode with
        // nf_conntrack_tcp_be_liberal=1 has the rule; both reach the planner as `false`.
        let rules = forward_rules(&ProxierConfig::default());
        assert_eq!(rules.len(), 2, "{rules:?}");
        assert!(
            rules
                .iter()
                .all(|r| !r.exprs.contains(&Expr::CtStateInvalid)),
            "{rules:?}"
        );
        assert!(
            !text(&state(&[]), &ProxierConfig::default(), Family::Ip).contains("ct state invalid")
        );
    }
}
