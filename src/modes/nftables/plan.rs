//! Builds the [`Ruleset`] of one family from the model. Pure.
//!
//! Layout (see README "Ruleset design"): upstream nftables mode's base chains, static chains
//! and verdict maps keyed on `daddr . l4proto . dport`; per service port a chain whose one
//! `dnat to numgen random mod N offset O map @endpoints-XX` rule picks an endpoint from a
//! block of slots in one of the shared endpoint maps ([`super::slots`]), instead of upstream's
//! per-endpoint chains and anonymous numgen vmaps (the kernel re-validates the chain graph on
//! every rule change; map elements need no validation). One endpoint is a plain `dnat to`;
//! ClientIP affinity keeps a cascade of `numgen random mod (N-i) 0 … dnat to endpoint_i`
//! rules with per-endpoint affinity sets. Hairpin masquerade goes through one
//! `saddr . daddr` set.

use std::collections::BTreeMap;
use std::net::IpAddr;

use crate::model::topology::{categorize_family, CategorizedEndpoints};
use std::sync::Arc;

use crate::kernel::nft::{
    shared_name, Chain, ChainType, Cidr, CmpOp, ElemData, Element, Expr, Family, Field, Hook, Key,
    KeyValue, Name, Rule, Set, Table, Target, Verdict,
};
use crate::model::{Endpoint, NodeInfo, ProxyState, ServicePort};

use crate::proxy::names::*;
use crate::proxy::rules::{
    addr_key, cidrs_of, from_pod, goto, jump, loopback, nat_dispatch, nodeport_guards, of_family,
    port_key, pre_dnat_checks, reject_chain, FILTER, SRCNAT,
};
use crate::proxy::{Fragment, ProxierConfig, Ruleset};

use super::SlotAllocator;

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

/// A chain that many service ports share: what each one's own chain would do, masquerade
/// and DNAT, its endpoint looked up in `map` by `key` (the packet's address and port, and
/// for several endpoints a random number).
fn shared_service_chain(
    rs: &mut Fragment,
    cfg: &ProxierConfig,
    family: Family,
    chain: &str,
    map: &str,
    key: Vec<Field>,
) {
    let mut rules = Vec::new();
    if cfg.masquerade_all {
        rules.push(Rule::new(chain, vec![jump(MARK_FOR_MASQUERADE)]));
    } else if let Some(not_pod) = from_pod(&cfg.local_detector, family, CmpOp::Neq) {
        rules.push(
            Rule::new(chain, vec![not_pod, jump(MARK_FOR_MASQUERADE)])
                .with_comment("masquerade traffic from outside the cluster"),
        );
    }
    rules.push(Rule::new(
        chain,
        vec![Expr::DnatLookup {
            key: key.clone(),
            map: map.into(),
        }],
    ));
    rs.chain(Chain::regular(chain), rules);
    rs.set(Set::endpoint_map_by(map, key));
}

/// The key of the `balance-N` maps.
fn balance_key(n: usize) -> Vec<Field> {
    let mut k = addr_key();
    k.push(Field::Random(n as u32));
    k
}

/// How many service ports use each `balance-N` chain: the base has the chains and maps of
/// the N in use, no others. Kept by the syncer across partial syncs. Pure.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct BalanceWidths(BTreeMap<usize, usize>);

impl BalanceWidths {
    /// The N of the `balance-N` chain a fragment's service port uses: the number of its
    /// elements in a `balance-N` map (a fragment's elements are a few per endpoint).
    pub fn of(f: &Fragment) -> Option<usize> {
        let n = f
            .elements
            .iter()
            .filter(|e| e.set().starts_with(BALANCE_PREFIX))
            .count();
        (n > 0).then_some(n)
    }
    pub fn add(&mut self, f: &Fragment) {
        if let Some(n) = Self::of(f) {
            *self.0.entry(n).or_default() += 1;
        }
    }
    pub fn remove(&mut self, f: &Fragment) {
        if let Some(n) = Self::of(f) {
            if let Some(c) = self.0.get_mut(&n) {
                *c -= 1;
                if *c == 0 {
                    self.0.remove(&n);
                }
            }
        }
    }
    /// The N in use, in order.
    pub fn in_use(&self) -> impl Iterator<Item = usize> + '_ {
        self.0.keys().copied()
    }
    /// Whether both use the same chains (whatever the counts).
    pub fn same_chains(&self, o: &BalanceWidths) -> bool {
        self.0.keys().eq(o.0.keys())
    }
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

/// The load-balancing rules of one chain: affinity lookups first, then a cascade in which
/// rule i matches with probability 1/(N-i), which picks each endpoint with probability 1/N.
fn balance_rules(
    chain: &str,
    sp: &ServicePort,
    eps: &[Endpoint],
    rs: &mut Fragment,
    rules: &mut Vec<Rule>,
    slots: &mut SlotAllocator,
) {
    let proto = sp.name.protocol.number();
    // Without affinity, the endpoints are elements of an endpoint map behind one rule, one
    // endpoint too: replacing it is then an element update, which the kernel does not
    // re-validate, where a rule change re-validates the table (45k Services × 1 endpoint:
    // 120 ms per one-endpoint change with a rule per endpoint).
    if sp.affinity_timeout.is_none() && !eps.is_empty() {
        let n = eps.len() as u32;
        let offset = slots.assign(chain, n);
        let map = slots.map_for(chain);
        for (i, ep) in eps.iter().enumerate() {
            rs.element(Element::new(
                map.clone(),
                vec![KeyValue::Slot(offset + i as u32)],
                ElemData::Target(Target::new(ep.ip, ep.port)),
                None,
            ));
        }
        rules.push(Rule::new(
            chain,
            vec![
                Expr::L4Proto(proto),
                Expr::DnatMap {
                    modulus: n,
                    offset,
                    map: map.to_string(),
                },
            ],
        ));
        return;
    }
    let dnat = |ep: &Endpoint| Expr::Dnat {
        addr: ep.ip,
        port: ep.port,
    };
    let affinity: Vec<Option<String>> = eps
        .iter()
        .map(|ep| {
            sp.affinity_timeout.map(|t| {
                let name = affinity_set(&sp.name, ep);
                let mut s = Set::plain(name.clone(), vec![Field::Saddr]);
                s.timeout = Some(t);
                rs.set(s);
                name
            })
        })
        .collect();
    for (ep, aff) in eps.iter().zip(&affinity) {
        if let Some(set) = aff {
            rules.push(Rule::new(
                chain,
                vec![
                    Expr::InSet {
                        key: vec![Field::Saddr],
                        set: set.clone(),
                        negate: false,
                    },
                    Expr::UpdateSet {
                        set: set.clone(),
                        key: Field::Saddr,
                    },
                    Expr::L4Proto(proto),
                    dnat(ep),
                ],
            ));
        }
    }
    let n = eps.len();
    for (i, (ep, aff)) in eps.iter().zip(&affinity).enumerate() {
        let mut e = Vec::new();
        if i + 1 < n {
            e.push(Expr::NumgenZero((n - i) as u32));
        }
        if let Some(set) = aff {
            e.push(Expr::UpdateSet {
                set: set.clone(),
                key: Field::Saddr,
            });
        }
        e.push(Expr::L4Proto(proto));
        e.push(dnat(ep));
        rules.push(Rule::new(chain, e));
    }
}

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

fn service_port_rules(
    rs: &mut Fragment,
    cfg: &ProxierConfig,
    node: &NodeInfo,
    sp: &ServicePort,
    endpoints: &[Endpoint],
    family: Family,
    slots: &mut SlotAllocator,
) {
    let Some(&cluster_ip) = of_family(&sp.cluster_ips, family).first() else {
        return; // not a service of this family
    };
    let p = PortRules {
        cfg,
        node,
        sp,
        family,
        cat: categorize_family(endpoints, sp, node, family == Family::Ip),
        cluster_ip,
        proto: sp.name.protocol.number(),
        // One copy for every element of this service port.
        comment: sp.name.to_string().into(),
        chains: ServiceChains::new(&sp.name),
    };
    p.shared_elements(rs);
    if p.one_endpoint_fast_path(rs) || p.balance_fast_path(rs) {
        return;
    }
    let reach = p.policy_chains(rs, slots);
    p.cluster_ip_dispatch(rs, &reach);
    let external_ips = of_family(&sp.external_ips, family);
    let lb_ips = of_family(&sp.load_balancer_ips, family);
    if sp.node_port.is_none() && external_ips.is_empty() && lb_ips.is_empty() {
        return; // no external destination
    }
    let uses_ext_chain = p.external_chain(rs, &reach);
    p.external_dispatch(rs, &reach, uses_ext_chain, &external_ips, &lb_ips);
    p.firewall(rs, &lb_ips);
}

/// What every step of one service port's rules reads: the port, its endpoints as each
/// traffic policy may use them, and the names its elements and chains carry.
struct PortRules<'a> {
    cfg: &'a ProxierConfig,
    node: &'a NodeInfo,
    sp: &'a ServicePort,
    family: Family,
    cat: CategorizedEndpoints,
    cluster_ip: IpAddr,
    proto: u8,
    comment: Name,
    chains: ServiceChains,
}

/// Which policy chains a service port has, and what traffic that no endpoint may take
/// meets.
struct Reach {
    has_cluster: bool,
    has_local: bool,
    /// Reject when there is no usable endpoint anywhere, drop when only the policy excludes
    /// them (upstream semantics).
    no_endpoint: Verdict,
}

impl PortRules<'_> {
    /// `address . protocol . port` of this port at `ip`.
    fn key_at(&self, ip: IpAddr) -> Key {
        key(ip, self.proto, self.sp.port)
    }

    /// "From a local pod": a source prefix, or an input interface.
    fn pod_source(&self, op: CmpOp) -> Option<Expr> {
        from_pod(&self.cfg.local_detector, self.family, op)
    }

    /// Whether the port needs nothing of its own: no affinity, no Local policy, no
    /// external destination, no endpoint on this node.
    fn nothing_of_its_own(&self) -> bool {
        let sp = self.sp;
        sp.affinity_timeout.is_none()
            && !sp.internal_policy_local
            && !sp.externally_accessible()
            && self.cat.local.is_empty()
    }

    /// The hairpin pairs of every reachable endpoint and the ClusterIP in `cluster-ips`.
    fn shared_elements(&self, rs: &mut Fragment) {
        for ep in &self.cat.all_reachable {
            rs.element(Element::new(
                shared_name(HAIRPIN),
                vec![KeyValue::Addr(ep.ip), KeyValue::Addr(ep.ip)],
                ElemData::None,
                None,
            ));
        }
        rs.element(Element::new(
            shared_name(CLUSTER_IPS),
            vec![KeyValue::Addr(self.cluster_ip)],
            ElemData::None,
            None,
        ));
    }

    /// One endpoint and nothing of its own: an element of the one-endpoint map, and the
    /// shared chain that masquerades and DNATs through it as this port's chain would have.
    /// Whether it applied.
    fn one_endpoint_fast_path(&self, rs: &mut Fragment) -> bool {
        let ([ep], true) = (&self.cat.cluster[..], self.nothing_of_its_own()) else {
            return false;
        };
        rs.element(Element::new(
            shared_name(ONE_ENDPOINT_SERVICES),
            self.key_at(self.cluster_ip),
            ElemData::Target(Target::new(ep.ip, ep.port)),
            Some(self.comment.clone()),
        ));
        rs.element(elem(
            SERVICE_IPS,
            self.key_at(self.cluster_ip),
            Verdict::Goto(ONE_ENDPOINT_CHAIN.into()),
            &self.comment,
        ));
        true
    }

    /// Several, and nothing of its own: its endpoints are elements 0..N of its address and
    /// port in the `balance-N` map, which the shared `balance-N` chain picks from at random
    /// (one endpoint change is element updates: no chain of its own for the kernel to walk
    /// on every commit). No comment on those elements: `service-ips` names the service
    /// port, and ~20 bytes per endpoint add up (10⁶ endpoints at 100k × 10). Whether it
    /// applied.
    fn balance_fast_path(&self, rs: &mut Fragment) -> bool {
        let n = self.cat.cluster.len();
        if !self.nothing_of_its_own() || !(2..=MAX_BALANCED_ENDPOINTS).contains(&n) {
            return false;
        }
        let map = shared_name(&balance_map(n));
        for (i, ep) in self.cat.cluster.iter().enumerate() {
            let mut k = self.key_at(self.cluster_ip);
            k.push(KeyValue::Slot(i as u32));
            rs.element(Element::new(
                map.clone(),
                k,
                ElemData::Target(Target::new(ep.ip, ep.port)),
                None,
            ));
        }
        rs.element(elem(
            SERVICE_IPS,
            self.key_at(self.cluster_ip),
            Verdict::Goto(balance_chain(n).into()),
            &self.comment,
        ));
        true
    }

    /// Masquerading of ClusterIP traffic belongs to the chain ClusterIP traffic uses,
    /// whatever its policy (upstream puts it in the internal traffic chain): with
    /// internalTrafficPolicy Local the node itself, off-cluster sources routed here, and
    /// every source under masqueradeAll are masqueraded just as with Cluster.
    fn masquerade_cluster_ip(&self, chain: &str) -> Option<Rule> {
        let to_cluster_ip = Expr::Addr {
            field: Field::Daddr,
            op: CmpOp::Eq,
            value: Cidr::host(self.cluster_ip),
        };
        if self.cfg.masquerade_all {
            return Some(Rule::new(
                chain,
                vec![to_cluster_ip, jump(MARK_FOR_MASQUERADE)],
            ));
        }
        self.pod_source(CmpOp::Neq).map(|not_pod| {
            Rule::new(
                chain,
                vec![to_cluster_ip, not_pod, jump(MARK_FOR_MASQUERADE)],
            )
            .with_comment("masquerade traffic from outside the cluster")
        })
    }

    /// The Cluster-policy chain and the Local-policy chain, each when it has endpoints.
    fn policy_chains(&self, rs: &mut Fragment, slots: &mut SlotAllocator) -> Reach {
        let sp = self.sp;
        for (chain, eps, masquerades) in [
            (
                &self.chains.service,
                &self.cat.cluster,
                !sp.internal_policy_local,
            ),
            (
                &self.chains.local,
                &self.cat.local,
                sp.internal_policy_local,
            ),
        ] {
            if eps.is_empty() {
                continue;
            }
            let mut rules = Vec::new();
            if masquerades {
                rules.extend(self.masquerade_cluster_ip(chain));
            }
            balance_rules(chain, sp, eps, rs, &mut rules, slots);
            rs.chain(Chain::regular(chain), rules);
        }
        Reach {
            has_cluster: !self.cat.cluster.is_empty(),
            has_local: !self.cat.local.is_empty(),
            no_endpoint: if self.cat.has_any {
                Verdict::Drop
            } else {
                Verdict::Goto(REJECT_CHAIN.into())
            },
        }
    }

    /// The ClusterIP's element: to the chain of its internal traffic policy, or to the
    /// no-endpoint verdict.
    fn cluster_ip_dispatch(&self, rs: &mut Fragment, reach: &Reach) {
        let (internal_ok, internal_chain) = if self.sp.internal_policy_local {
            (reach.has_local, &self.chains.local)
        } else {
            (reach.has_cluster, &self.chains.service)
        };
        let k = self.key_at(self.cluster_ip);
        if internal_ok {
            let to = Verdict::Goto(internal_chain.as_str().into());
            rs.element(elem(SERVICE_IPS, k, to, &self.comment));
        } else {
            let v = reach.no_endpoint.clone();
            rs.element(elem(NO_ENDPOINT_SERVICES, k, v, &self.comment));
        }
    }

    /// The external chain, and whether the port uses it. As upstream: it is used whenever
    /// the Service has endpoints anywhere. With externalTrafficPolicy Local and none on
    /// this node it still short-circuits pods and the node itself to the cluster-wide
    /// endpoints; only traffic from elsewhere falls through it undNATed, to be dropped by
    /// the no-endpoint maps after DNAT.
    fn external_chain(&self, rs: &mut Fragment, reach: &Reach) -> bool {
        if !(self.cat.has_any && reach.has_cluster) {
            return false;
        }
        let ServiceChains {
            service,
            local,
            external,
            ..
        } = &self.chains;
        let mut rules = Vec::new();
        if self.sp.external_policy_local {
            if let Some(pod) = self.pod_source(CmpOp::Eq) {
                rules.push(
                    Rule::new(external, vec![pod, goto(service)])
                        .with_comment("short-circuit pod traffic"),
                );
            }
            let from_host = Expr::FibLocal(Field::Saddr);
            rules.push(
                Rule::new(external, vec![from_host.clone(), jump(MARK_FOR_MASQUERADE)])
                    .with_comment("masquerade local traffic"),
            );
            rules.push(
                Rule::new(external, vec![from_host, goto(service)])
                    .with_comment("short-circuit local traffic"),
            );
            if reach.has_local {
                rules.push(Rule::new(external, vec![goto(local)]));
            }
        } else {
            rules.push(Rule::new(external, vec![jump(MARK_FOR_MASQUERADE)]));
            rules.push(Rule::new(external, vec![goto(service)]));
        }
        rs.chain(Chain::regular(external), rules);
        true
    }

    /// The elements of the external destinations, written once for service IPs (external
    /// and LoadBalancer IPs) and NodePorts: to the external chain, to the no-endpoint
    /// verdict when external traffic has no endpoint under its policy, and a NodePort's
    /// localhost reject.
    fn external_dispatch(
        &self,
        rs: &mut Fragment,
        reach: &Reach,
        uses_ext_chain: bool,
        external_ips: &[IpAddr],
        lb_ips: &[IpAddr],
    ) {
        let external_ok = if self.sp.external_policy_local {
            reach.has_local
        } else {
            reach.has_cluster
        };
        let mut dispatch = |to_chain: &str, no_endpoint: &str, k: Key| {
            if uses_ext_chain {
                let to = Verdict::Goto(self.chains.external.as_str().into());
                rs.element(elem(to_chain, k, to, &self.comment));
            }
            if !external_ok {
                let v = reach.no_endpoint.clone();
                rs.element(elem(no_endpoint, k, v, &self.comment));
            }
        };
        for ip in external_ips.iter().chain(lb_ips) {
            dispatch(SERVICE_IPS, NO_ENDPOINT_SERVICES, self.key_at(*ip));
        }
        let Some(np) = self.sp.node_port else {
            return;
        };
        let k: Key = [KeyValue::Proto(self.proto), KeyValue::Port(np)].into();
        dispatch(SERVICE_NODEPORTS, NO_ENDPOINT_NODEPORTS, k);
        let protocol = self.sp.name.protocol;
        let loopback = self.cfg.loopback_nodeports.of(self.family == Family::Ip);
        if loopback.rejects().contains(&protocol) {
            let reject = localhost_reject_chain(protocol);
            let to = Verdict::Goto(reject.as_str().into());
            rs.element(elem(LOCALHOST_NODEPORT_REJECTS, k, to, &self.comment));
        }
    }

    /// loadBalancerSourceRanges: a firewall chain for the LB IPs, only when ranges are set.
    fn firewall(&self, rs: &mut Fragment, lb_ips: &[IpAddr]) {
        let sp = self.sp;
        if lb_ips.is_empty() || sp.load_balancer_source_ranges.is_empty() {
            return;
        }
        let fw = &self.chains.firewall;
        let mut allowed = cidrs_of(&sp.load_balancer_source_ranges, self.family);
        // A node reaching its own LB IP uses the LB IP as source (upstream allowFromNode).
        let node_allowed = self
            .node
            .addresses
            .iter()
            .any(|a| allowed.iter().any(|c| c.contains(a)));
        if node_allowed {
            allowed.extend(lb_ips.iter().map(|ip| Cidr::host(*ip)));
        }
        let mut rules: Vec<Rule> = allowed
            .into_iter()
            .map(|c| {
                let from = Expr::Addr {
                    field: Field::Saddr,
                    op: CmpOp::Eq,
                    value: c,
                };
                Rule::new(fw, vec![from, Expr::Verdict(Verdict::Return)])
            })
            .collect();
        rules.push(Rule::new(fw, vec![Expr::Verdict(Verdict::Drop)]));
        rs.chain(Chain::regular(fw), rules);
        for ip in lb_ips {
            let to = Verdict::Goto(fw.as_str().into());
            rs.element(elem(FIREWALL_IPS, self.key_at(*ip), to, &self.comment));
        }
    }
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
    use crate::kernel::nft::render;
    use crate::model::{Protocol, ServicePortName};
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
        let sp = st.services.values_mut().next().unwrap();
        std::sync::Arc::make_mut(sp).node_port = Some(30080);
        let t = text(&st, &ProxierConfig::default(), Family::Ip);
        assert!(t.contains("numgen random mod 2 offset"), "{t}");
        assert!(t.contains("map @endpoints-"), "{t}");
        assert!(!t.contains("balance-2"), "{t}");
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
        let sp = st.services.values_mut().next().unwrap();
        std::sync::Arc::make_mut(sp).node_port = Some(30080);
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
        let sp = st.services.values_mut().next().unwrap();
        std::sync::Arc::make_mut(sp).affinity_timeout = Some(10800);
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
