//! Rule helpers and base chains every mode's table uses: map keys, the local-traffic match,
//! NodePort address guards, the NAT dispatch base chains, the pre-DNAT filter base chains,
//! the reject chain, loadBalancerSourceRanges firewalls, commented elements. Pure.

use std::net::IpAddr;

use crate::kernel::nft::{
    shared_name, Chain, ChainType, Cidr, CmpOp, ElemData, Element, Expr, Family, Field, Hook,
    KeyValue, Name, Rule, Verdict,
};
use crate::model::{NodeInfo, ServicePort};

use super::names::{
    firewall_chain, FIREWALL_IPS, NAT_OUTPUT, NAT_PREROUTING, NO_ENDPOINT_NODEPORTS,
    NO_ENDPOINT_SERVICES, REJECT_CHAIN, SERVICE_CHECKS,
};
use super::{FamilyNodePorts, Fragment, LocalDetector, ProxierConfig};

/// Base-chain priorities, nftables' named ones (`nft` prints them as `dstnat`, `srcnat`,
/// `filter`).
pub const DSTNAT: i32 = -100;
pub const SRCNAT: i32 = 100;
pub const FILTER: i32 = 0;
/// Filtering before DNAT rewrites the destination (and before IPVS: its LOCAL_OUT hook
/// runs at -99 and LOCAL_IN at 98), so firewall and no-endpoint checks see the Service's
/// own address of every new connection.
pub const PRE_DNAT: i32 = DSTNAT - 10;
const _: () = assert!(
    PRE_DNAT < DSTNAT && DSTNAT < -99,
    "before IPVS's LOCAL_OUT at -99"
);

pub fn jump(c: &str) -> Expr {
    Expr::Verdict(Verdict::Jump(c.into()))
}
pub fn goto(c: &str) -> Expr {
    Expr::Verdict(Verdict::Goto(c.into()))
}
/// The key of the per-address maps: `ip daddr . meta l4proto . th dport`.
pub fn addr_key() -> Vec<Field> {
    vec![Field::Daddr, Field::L4Proto, Field::Dport]
}
/// The key of the NodePort maps: `meta l4proto . th dport`.
pub fn port_key() -> Vec<Field> {
    vec![Field::L4Proto, Field::Dport]
}

/// "From a pod on this node" (`op` Eq) or not (Neq), per the local-traffic detector;
/// `None` when traffic cannot be told apart.
pub fn from_pod(detector: &LocalDetector, family: Family, op: CmpOp) -> Option<Expr> {
    match detector {
        LocalDetector::Cidrs(c) => cidrs_of(c, family).first().map(|c| Expr::Addr {
            field: Field::Saddr,
            op,
            value: *c,
        }),
        LocalDetector::Bridge(name) => Some(Expr::IifName {
            name: name.clone(),
            prefix: false,
            op,
        }),
        LocalDetector::InterfacePrefix(p) => Some(Expr::IifName {
            name: p.clone(),
            prefix: true,
            op,
        }),
        LocalDetector::None => None,
    }
}

pub fn of_family(ips: &[IpAddr], family: Family) -> Vec<IpAddr> {
    ips.iter()
        .copied()
        .filter(|ip| Family::of(ip) == family)
        .collect()
}

pub fn cidrs_of(c: &[Cidr], family: Family) -> Vec<Cidr> {
    c.iter()
        .copied()
        .filter(|c| c.is_ipv4() == (family == Family::Ip))
        .collect()
}

/// The rules guarding NodePort lookups: which destination addresses count as "this node".
/// The loopback range of `family`: 127.0.0.0/8, ::1.
pub fn loopback(family: Family) -> Cidr {
    match family {
        Family::Ip => "127.0.0.0/8".parse().expect("static"),
        Family::Ip6 => "::1".parse().expect("static"),
    }
}

pub fn nodeport_guards(cfg: &ProxierConfig, node: &NodeInfo, family: Family) -> Vec<Vec<Expr>> {
    let loopback = loopback(family);
    match cfg
        .nodeport_addresses
        .for_family(family == Family::Ip, &node.addresses)
    {
        FamilyNodePorts::All => vec![vec![
            Expr::FibLocal(Field::Daddr),
            Expr::Addr {
                field: Field::Daddr,
                op: CmpOp::Neq,
                value: loopback,
            },
        ]],
        FamilyNodePorts::Only { cidrs, hosts } => cidrs
            .into_iter()
            .map(|c| {
                vec![
                    Expr::FibLocal(Field::Daddr),
                    Expr::Addr {
                        field: Field::Daddr,
                        op: CmpOp::Eq,
                        value: c,
                    },
                ]
            })
            .chain(hosts.into_iter().map(|ip| {
                vec![Expr::Addr {
                    field: Field::Daddr,
                    op: CmpOp::Eq,
                    value: Cidr::host(ip),
                }]
            }))
            .collect(),
    }
}

/// `key vmap @map`.
pub fn vmap(key: Vec<Field>, map: &str) -> Expr {
    Expr::Vmap {
        key,
        map: map.into(),
    }
}

/// `key @set`.
pub fn in_set(key: Vec<Field>, set: &str) -> Expr {
    Expr::InSet {
        key,
        set: set.into(),
        negate: false,
    }
}

/// One rule per NodePort guard of `cfg`: the guard's matches followed by `tail`.
pub fn guarded(guards: &[Vec<Expr>], chain: &str, tail: &[Expr]) -> Vec<Rule> {
    guards
        .iter()
        .map(|g| {
            let mut e = g.clone();
            e.extend(tail.iter().cloned());
            Rule::new(chain, e)
        })
        .collect()
}

/// `nat-prerouting` and `nat-output` at dstnat priority, each jumping to `target`: where
/// every mode's service traffic enters its table.
pub fn nat_dispatch(f: &mut Fragment, target: &str) {
    for (name, hook) in [
        (NAT_PREROUTING, Hook::Prerouting),
        (NAT_OUTPUT, Hook::Output),
    ] {
        f.chain(
            Chain::base(name, ChainType::Nat, hook, DSTNAT),
            vec![Rule::new(name, vec![jump(target)])],
        );
    }
}

/// Filter base chains at [`PRE_DNAT`] that send each new connection to `target`.
pub fn pre_dnat_checks(f: &mut Fragment, chains: [(&str, Hook); 2], target: &str) {
    for (name, hook) in chains {
        f.chain(
            Chain::base(name, ChainType::Filter, hook, PRE_DNAT),
            vec![Rule::new(name, vec![Expr::CtStateNew, jump(target)])],
        );
    }
}

/// The IPVS and userspace modes' `service-checks` chain, reached from their pre-DNAT
/// filter chains: loadBalancerSourceRanges firewalls, then no-endpoint rejects for service
/// addresses and (behind `guards`) NodePorts.
pub fn service_checks(f: &mut Fragment, guards: &[Vec<Expr>]) {
    let r = |exprs: Vec<Expr>| Rule::new(SERVICE_CHECKS, exprs);
    let mut checks = vec![
        r(vec![vmap(addr_key(), FIREWALL_IPS)]),
        r(vec![vmap(addr_key(), NO_ENDPOINT_SERVICES)]),
    ];
    checks.extend(guarded(
        guards,
        SERVICE_CHECKS,
        &[vmap(port_key(), NO_ENDPOINT_NODEPORTS)],
    ));
    f.chain(Chain::regular(SERVICE_CHECKS), checks);
}

/// The chain that rejects connections to Services without endpoints.
pub fn reject_chain(f: &mut Fragment) {
    f.chain(
        Chain::regular(REJECT_CHAIN),
        vec![Rule::new(REJECT_CHAIN, vec![Expr::Reject])],
    );
}

pub fn element(set: &str, key: Vec<KeyValue>, verdict: Option<Verdict>, c: &Name) -> Element {
    Element::new(
        shared_name(set),
        key,
        verdict.map_or(ElemData::None, ElemData::Verdict),
        Some(c.clone()),
    )
}

/// loadBalancerSourceRanges of one LoadBalancer address (`addr_k`: address, protocol,
/// port): a `firewall-ips` element jumping to a chain that returns for each allowed range
/// and drops the rest. Nothing when the Service has no ranges.
pub fn source_range_firewall(
    f: &mut Fragment,
    sp: &ServicePort,
    family: Family,
    addr_k: Vec<KeyValue>,
    comment: &Name,
) {
    if sp.load_balancer_source_ranges.is_empty() {
        return;
    }
    let chain = firewall_chain(&sp.name);
    let mut rules: Vec<Rule> = sp
        .load_balancer_source_ranges
        .iter()
        .filter(|c| c.is_ipv4() == (family == Family::Ip))
        .map(|c| {
            Rule::new(
                &chain,
                vec![
                    Expr::Addr {
                        field: Field::Saddr,
                        op: CmpOp::Eq,
                        value: *c,
                    },
                    Expr::Verdict(Verdict::Return),
                ],
            )
        })
        .collect();
    rules.push(
        Rule::new(&chain, vec![Expr::Verdict(Verdict::Drop)])
            .with_comment("not in loadBalancerSourceRanges"),
    );
    f.chain(Chain::regular(&chain), rules);
    f.element(element(
        FIREWALL_IPS,
        addr_k,
        Some(Verdict::Jump(chain.as_str().into())),
        comment,
    ));
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proxy::NodePortAddresses;

    fn node() -> NodeInfo {
        NodeInfo {
            name: "n".into(),
            addresses: vec!["192.168.0.2".parse().unwrap(), "fd00::2".parse().unwrap()],
            ..Default::default()
        }
    }

    fn all_v6(cfg: &ProxierConfig) -> Vec<Vec<Expr>> {
        let mut c = cfg.clone();
        c.nodeport_addresses = NodePortAddresses::all();
        nodeport_guards(&c, &node(), Family::Ip6)
    }

    #[test]
    fn nodeport_guards_follow_nodeport_addresses_per_family() {
        let mut cfg = ProxierConfig::default();
        let all = nodeport_guards(&cfg, &node(), Family::Ip);
        assert_eq!(all.len(), 1);
        assert!(all[0].contains(&Expr::FibLocal(Field::Daddr)));
        cfg.nodeport_addresses = NodePortAddresses::cidrs(vec![
            "192.168.0.0/24".parse().unwrap(),
            "10.1.0.0/16".parse().unwrap(),
            "fd00::/64".parse().unwrap(),
        ]);
        assert_eq!(nodeport_guards(&cfg, &node(), Family::Ip).len(), 2);
        assert_eq!(nodeport_guards(&cfg, &node(), Family::Ip6).len(), 1);
        // A family with no entry accepts every address, as upstream's NewNodePortAddresses.
        cfg.nodeport_addresses = NodePortAddresses::cidrs(vec!["10.1.0.0/16".parse().unwrap()]);
        assert_eq!(nodeport_guards(&cfg, &node(), Family::Ip6), all_v6(&cfg));
        // Loopback CIDRs are left to the localhost forwarder.
        cfg.nodeport_addresses = NodePortAddresses::cidrs(vec![
            "127.0.0.0/8".parse().unwrap(),
            "192.168.0.0/24".parse().unwrap(),
        ]);
        assert_eq!(nodeport_guards(&cfg, &node(), Family::Ip).len(), 1);
        // primary mixed with a CIDR: both.
        cfg.nodeport_addresses = NodePortAddresses {
            primary: true,
            cidrs: vec!["10.1.0.0/16".parse().unwrap()],
        };
        assert_eq!(nodeport_guards(&cfg, &node(), Family::Ip).len(), 2);
        // all beats everything else.
        cfg.nodeport_addresses = NodePortAddresses {
            primary: true,
            cidrs: vec!["0.0.0.0/0".parse().unwrap()],
        };
        assert_eq!(nodeport_guards(&cfg, &node(), Family::Ip), all);
        cfg.nodeport_addresses = NodePortAddresses::primary();
        let primary = nodeport_guards(&cfg, &node(), Family::Ip6);
        assert_eq!(
            primary,
            [vec![Expr::Addr {
                field: Field::Daddr,
                op: CmpOp::Eq,
                value: Cidr::host("fd00::2".parse().unwrap()),
            }]]
        );
    }

    #[test]
    fn from_pod_matches_the_detector_in_its_family_only() {
        let cidrs = LocalDetector::Cidrs(vec!["10.0.0.0/8".parse().unwrap()]);
        assert!(from_pod(&cidrs, Family::Ip, CmpOp::Eq).is_some());
        assert_eq!(from_pod(&cidrs, Family::Ip6, CmpOp::Eq), None);
        assert_eq!(from_pod(&LocalDetector::None, Family::Ip, CmpOp::Eq), None);
        assert_eq!(
            from_pod(
                &LocalDetector::InterfacePrefix("veth".into()),
                Family::Ip6,
                CmpOp::Neq
            ),
            Some(Expr::IifName {
                name: "veth".into(),
                prefix: true,
                op: CmpOp::Neq,
            })
        );
    }

    #[test]
    fn shared_base_chains_hook_before_and_at_dstnat() {
        let mut f = Fragment::default();
        nat_dispatch(&mut f, "services");
        pre_dnat_checks(
            &mut f,
            [("a", Hook::Prerouting), ("b", Hook::Output)],
            "checks",
        );
        reject_chain(&mut f);
        let prio = |n: &str| f.chains[n].0.base.as_ref().map(|b| b.priority);
        assert_eq!(prio(NAT_PREROUTING), Some(DSTNAT));
        assert_eq!(prio(NAT_OUTPUT), Some(DSTNAT));
        assert_eq!(prio("a"), Some(PRE_DNAT));
        assert_eq!(f.chains[REJECT_CHAIN].1[0].exprs, [Expr::Reject]);
    }
}
