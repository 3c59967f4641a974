//! The static part of the nftables mode's table: upstream's base chains, the localnet guard,
//! the loopback NodePort rejects, and the nftables base with its endpoint maps and
//! `balance-N` chains. Pure.

use crate::kernel::nft::{Chain, ChainType, CmpOp, Expr, Family, Field, Hook, Rule, Set, Verdict};
use crate::model::NodeInfo;

use crate::proxy::names::*;
use crate::proxy::rules::{
    addr_key, cidrs_of, jump, loopback, nat_dispatch, nodeport_guards, port_key, pre_dnat_checks,
    reject_chain, FILTER, SRCNAT,
};
use crate::proxy::{Fragment, ProxierConfig};

use super::balance::{balance_key, shared_service_chain, BalanceWidths};

/// The static part of the table: base chains, dispatch chains, shared sets and maps.
pub fn build_base(cfg: &ProxierConfig, node: &NodeInfo, family: Family) -> Fragment {
    let mut rs = Fragment::default();
    base_chains(&mut rs, cfg, node, family);
    rs
}

fn base_chains(rs: &mut Fragment, cfg: &ProxierConfig, node: &NodeInfo, family: Family) {
    let new = Expr::CtStateNew;
    let b = |name: &str, kind, hook, prio| Chain::base(name, kind, hook, prio);
    let r = |chain: &str, exprs: Vec<Expr>| Rule::new(chain, exprs);
    use ChainType::{Filter, Nat};
    pre_dnat_checks(
        rs,
        [
            (FILTER_PREROUTING_PRE_DNAT, Hook::Prerouting),
            (FILTER_OUTPUT_PRE_DNAT, Hook::Output),
        ],
        FIREWALL_CHECK,
    );
    // Upstream's iptables mode drops forwarded INVALID packets first in KUBE-FORWARD
    // (proxier.go, "Drop the packets in INVALID state"): an out-of-window segment that
    // conntrack leaves un-NATed would reach the pod with the Service's address and be
    // answered with a reset that kills the connection (kubernetes#74839, #117924).
    let invalid = cfg.drop_invalid.then(|| {
        r(
            FILTER_FORWARD,
            vec![
                Expr::CtStateInvalid,
                Expr::Counter,
                Expr::Verdict(Verdict::Drop),
            ],
        )
        .with_comment(INVALID_DROP_COMMENT)
    });
    rs.chain(
        b(FILTER_FORWARD, Filter, Hook::Forward, FILTER),
        invalid
            .into_iter()
            .chain([
                r(
                    FILTER_FORWARD,
                    vec![new.clone(), jump(SERVICE_ENDPOINTS_CHECK)],
                ),
                r(FILTER_FORWARD, vec![new.clone(), jump(CLUSTER_IPS_CHECK)]),
            ])
            .collect(),
    );
    let guard = |chain: &str| localnet_guard(guards_localnet(cfg, family), chain);
    rs.chain(
        b(FILTER_INPUT, Filter, Hook::Input, FILTER),
        guard(FILTER_INPUT)
            .into_iter()
            .chain([
                r(
                    FILTER_INPUT,
                    vec![new.clone(), jump(NODEPORT_ENDPOINTS_CHECK)],
                ),
                r(
                    FILTER_INPUT,
                    vec![new.clone(), jump(SERVICE_ENDPOINTS_CHECK)],
                ),
            ])
            .collect(),
    );
    rs.chain(
        b(FILTER_OUTPUT, Filter, Hook::Output, FILTER),
        guard(FILTER_OUTPUT)
            .into_iter()
            .chain([
                r(
                    FILTER_OUTPUT,
                    vec![new.clone(), jump(SERVICE_ENDPOINTS_CHECK)],
                ),
                r(FILTER_OUTPUT, vec![new, jump(CLUSTER_IPS_CHECK)]),
            ])
            .collect(),
    );
    if guards_localnet(cfg, family) {
        rs.chain(
            Chain::regular(LOCALNET_GUARD),
            vec![
                r(
                    LOCALNET_GUARD,
                    vec![Expr::CtStatusDnat, Expr::Verdict(Verdict::Return)],
                ),
                r(LOCALNET_GUARD, vec![Expr::Verdict(Verdict::Drop)])
                    .with_comment(LOCALNET_GUARD_COMMENT),
            ],
        );
    }
    nat_dispatch(rs, SERVICES);
    rs.chain(
        b(NAT_POSTROUTING, Nat, Hook::Postrouting, SRCNAT),
        vec![r(NAT_POSTROUTING, vec![jump(MASQUERADING)])],
    );

    let mark = cfg.masquerade_mark();
    rs.chain(
        Chain::regular(MARK_FOR_MASQUERADE),
        vec![r(MARK_FOR_MASQUERADE, vec![Expr::MarkOr(mark)])],
    );
    rs.chain(
        Chain::regular(MASQUERADING),
        vec![
            r(
                MASQUERADING,
                vec![
                    Expr::CtStatusDnat,
                    Expr::InSet {
                        key: vec![Field::Saddr, Field::Daddr],
                        set: HAIRPIN.into(),
                        negate: false,
                    },
                    Expr::Masquerade { fully_random: true },
                ],
            )
            .with_comment("hairpin: a pod reaching itself through a service"),
            r(
                MASQUERADING,
                vec![Expr::MarkBitClear(mark), Expr::Verdict(Verdict::Return)],
            ),
            r(MASQUERADING, vec![Expr::MarkXor(mark)]),
            r(MASQUERADING, vec![Expr::Masquerade { fully_random: true }]),
        ],
    );
    reject_chain(rs);
    rs.chain(
        Chain::regular(CLUSTER_IPS_CHECK),
        vec![r(
            CLUSTER_IPS_CHECK,
            vec![
                Expr::InSet {
                    key: vec![Field::Daddr],
                    set: CLUSTER_IPS.into(),
                    negate: false,
                },
                Expr::Reject,
            ],
        )
        .with_comment("reject traffic to invalid ports of ClusterIPs")]
        .into_iter()
        .chain(cidrs_of(&cfg.service_cidrs, family).into_iter().map(|c| {
            r(
                CLUSTER_IPS_CHECK,
                vec![
                    Expr::Addr {
                        field: Field::Daddr,
                        op: CmpOp::Eq,
                        value: c,
                    },
                    Expr::Verdict(Verdict::Drop),
                ],
            )
            .with_comment("drop traffic to unallocated ClusterIPs")
        }))
        .collect(),
    );
    rs.chain(
        Chain::regular(FIREWALL_CHECK),
        vec![r(
            FIREWALL_CHECK,
            vec![Expr::Vmap {
                key: addr_key(),
                map: FIREWALL_IPS.into(),
            }],
        )],
    );
    rs.chain(
        Chain::regular(SERVICE_ENDPOINTS_CHECK),
        vec![r(
            SERVICE_ENDPOINTS_CHECK,
            vec![Expr::Vmap {
                key: addr_key(),
                map: NO_ENDPOINT_SERVICES.into(),
            }],
        )],
    );
    let guards = nodeport_guards(cfg, node, family);
    let mut np_check = Vec::new();
    let mut services = vec![r(
        SERVICES,
        vec![Expr::Vmap {
            key: addr_key(),
            map: SERVICE_IPS.into(),
        }],
    )];
    // The one chain of every service port with one endpoint and nothing of its own (see
    // `ONE_ENDPOINT_SERVICES`). Only their ClusterIP reaches it, through `service-ips` (so
    // that two Services claiming one address and port are settled there, as for any).
    shared_service_chain(
        rs,
        cfg,
        family,
        ONE_ENDPOINT_CHAIN,
        ONE_ENDPOINT_SERVICES,
        addr_key(),
    );
    for g in guards {
        let mut e = g.clone();
        e.push(Expr::Vmap {
            key: port_key(),
            map: NO_ENDPOINT_NODEPORTS.into(),
        });
        np_check.push(r(NODEPORT_ENDPOINTS_CHECK, e));
        let mut e = g;
        e.push(Expr::Vmap {
            key: port_key(),
            map: SERVICE_NODEPORTS.into(),
        });
        services.push(r(SERVICES, e));
    }
    np_check.extend(loopback_rejects(rs, cfg, family));
    rs.chain(Chain::regular(NODEPORT_ENDPOINTS_CHECK), np_check);
    rs.chain(Chain::regular(SERVICES), services);

    rs.set(Set::plain(CLUSTER_IPS, vec![Field::Daddr]));
    rs.set(Set::plain(HAIRPIN, vec![Field::Saddr, Field::Daddr]));
    for m in [SERVICE_IPS, NO_ENDPOINT_SERVICES, FIREWALL_IPS] {
        rs.set(Set::vmap(m, addr_key()));
    }
    for m in [SERVICE_NODEPORTS, NO_ENDPOINT_NODEPORTS] {
        rs.set(Set::vmap(m, port_key()));
    }
}

/// Whether `family`'s table carries iptables mode's localnet guard (IPv4 only, as upstream).
fn guards_localnet(cfg: &ProxierConfig, family: Family) -> bool {
    cfg.localnet_guard && family == Family::Ip
}

/// The rule of `chain` (filter input or output) that sends a new connection to 127.0.0.0/8
/// from another source to [`LOCALNET_GUARD`], which drops it unless DNATed: upstream's
/// KUBE-FIREWALL rule `-d 127.0.0.0/8 ! -s 127.0.0.0/8 -m conntrack ! --ctstate
/// RELATED,ESTABLISHED,DNAT -j DROP`, for new connections (an established, related, invalid
/// or untracked packet cannot open one).
fn localnet_guard(needed: bool, chain: &str) -> Option<Rule> {
    let localnet = loopback(Family::Ip);
    needed.then(|| {
        Rule::new(
            chain,
            vec![
                Expr::Addr {
                    field: Field::Daddr,
                    op: CmpOp::Eq,
                    value: localnet,
                },
                Expr::Addr {
                    field: Field::Saddr,
                    op: CmpOp::Neq,
                    value: localnet,
                },
                Expr::CtStateNew,
                jump(LOCALNET_GUARD),
            ],
        )
    })
}

/// Upstream 1.37's loopback NodePort rejects (gate `KubeProxyNFTablesLocalhostNodePorts`):
/// per rejected protocol a chain whose one rule counts and rejects (the counter read for
/// `kubeproxy_nftables_localhost_nodeport_rejected_packets_total`), the map of rejected
/// `l4proto . dport` to those chains, and the returned rule of `nodeport-endpoints-check`
/// that looks new connections to loopback up in it (upstream: `ip daddr 127.0.0.0/8` or
/// `ip6 daddr ::1`; the NodePort guards never match loopback, so the two never overlap).
fn loopback_rejects(rs: &mut Fragment, cfg: &ProxierConfig, family: Family) -> Option<Rule> {
    let rejects = cfg.loopback_nodeports.of(family == Family::Ip).rejects();
    if rejects.is_empty() {
        return None;
    }
    for &proto in rejects {
        let chain = localhost_reject_chain(proto);
        rs.chain(
            Chain::regular(&chain),
            vec![Rule::new(&chain, vec![Expr::Counter, Expr::Reject])
                .with_comment(localhost_reject_counter(proto))],
        );
    }
    rs.set(Set::vmap(LOCALHOST_NODEPORT_REJECTS, port_key()));
    let loopback = loopback(family);
    Some(Rule::new(
        NODEPORT_ENDPOINTS_CHECK,
        vec![
            Expr::Addr {
                field: Field::Daddr,
                op: CmpOp::Eq,
                value: loopback,
            },
            Expr::Vmap {
                key: port_key(),
                map: LOCALHOST_NODEPORT_REJECTS.into(),
            },
        ],
    ))
}

/// The base of the nftables mode's table: [`build_base`], `maps` slot endpoint maps and the
/// `balance-N` chains and maps of `widths`.
pub fn nftables_base(
    cfg: &ProxierConfig,
    node: &NodeInfo,
    family: Family,
    maps: u32,
    widths: &BalanceWidths,
) -> Fragment {
    let mut base = build_base(cfg, node, family);
    for i in 0..maps {
        base.set(Set::endpoint_map(endpoint_map_name(i)));
    }
    for n in widths.in_use() {
        shared_service_chain(
            &mut base,
            cfg,
            family,
            &balance_chain(n),
            &balance_map(n),
            balance_key(n),
        );
    }
    base
}
