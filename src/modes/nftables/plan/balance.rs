//! Load balancing: the shared `balance-N` chains many service ports use, how many ports use
//! each width ([`BalanceWidths`]), and one chain's balancing rules (an endpoint map behind
//! one rule picking at random or by a Maglev hash, or the affinity cascade). Pure.

use std::collections::BTreeMap;

use std::net::SocketAddr;

use crate::kernel::nft::{
    Chain, CmpOp, ElemData, Element, Expr, Family, Field, KeyValue, Name, Rule, Set, Target,
};
use crate::model::{Endpoint, LoadBalancing, ServicePort};
use crate::proxy::maglev;

use crate::proxy::names::*;
use crate::proxy::rules::{addr_key, from_pod, jump};
use crate::proxy::{Fragment, ProxierConfig};

use super::super::SlotAllocator;

/// A chain that many service ports share: what each one's own chain would do, masquerade
/// and DNAT, its endpoint looked up in `map` by `key` (the packet's address and port, and
/// for several endpoints a random number).
pub(super) fn shared_service_chain(
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
pub(super) fn balance_key(n: usize) -> Vec<Field> {
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

/// The seed of every Maglev hash. Fixed, so that every node, and every restart, hashes a
/// connection alike (without one the kernel draws a random seed per rule). "KNLP".
pub const MAGLEV_SEED: u32 = 0x4b4e_4c50;

/// What a Maglev rule hashes: both addresses and both ports (the protocol is the rule's
/// own). The destination is the address the client used (ClusterIP, node address,
/// externalIP or LB IP), the same on every node an ECMP router may pick.
pub fn maglev_key() -> Vec<Field> {
    vec![Field::Saddr, Field::Sport, Field::Daddr, Field::Dport]
}

/// The load-balancing rules of one chain of a service port.
pub(super) struct Balance<'a> {
    pub chain: &'a str,
    pub sp: &'a ServicePort,
    pub eps: &'a [Endpoint],
    /// The port's load balancing, its annotation or the proxy's default.
    pub load_balancing: LoadBalancing,
}

impl Balance<'_> {
    /// Affinity first (it wins over any load balancing, as in IPVS mode: a client keeps its
    /// endpoint); else a Maglev table, or a random pick from an endpoint map.
    pub fn rules(&self, rs: &mut Fragment, rules: &mut Vec<Rule>, slots: &mut SlotAllocator) {
        if self.sp.affinity_timeout.is_some() || self.eps.is_empty() {
            self.affinity_cascade(rs, rules);
        } else if self.load_balancing == LoadBalancing::Maglev {
            self.maglev(rs, rules, slots);
        } else {
            self.random(rs, rules, slots);
        }
    }

    /// The endpoints are elements of an endpoint map behind one rule, one endpoint too:
    /// replacing it is then an element update, which the kernel does not re-validate, where
    /// a rule change re-validates the table (45k Services × 1 endpoint: 120 ms per
    /// one-endpoint change with a rule per endpoint).
    fn random(&self, rs: &mut Fragment, rules: &mut Vec<Rule>, slots: &mut SlotAllocator) {
        let n = self.eps.len() as u32;
        let offset = slots.assign(self.chain, n);
        let map = slots.map_for(self.chain);
        for (i, ep) in self.eps.iter().enumerate() {
            rs.element(slot_element(&map, offset + i as u32, ep));
        }
        rules.push(Rule::new(
            self.chain,
            vec![
                Expr::L4Proto(self.sp.name.protocol.number()),
                Expr::DnatMap {
                    modulus: n,
                    offset,
                    map: map.to_string(),
                },
            ],
        ));
    }

    /// The Maglev table of the endpoints ([`maglev::lookup_table`]) in slots
    /// `offset..offset + M` of an endpoint map, behind one rule that hashes the connection
    /// into it. The table's size changes only when the endpoint count crosses a size step
    /// (251 entries up to 2 endpoints, 1021 up to 10, …), so an endpoint change rewrites
    /// only the entries that change owner (about M/N) and not the rule.
    fn maglev(&self, rs: &mut Fragment, rules: &mut Vec<Rule>, slots: &mut SlotAllocator) {
        let m = maglev::table_size(self.eps.len());
        let offset = slots.assign(self.chain, m);
        let map = slots.map_for(self.chain);
        let identities: Vec<String> = self
            .eps
            .iter()
            .map(|e| SocketAddr::new(e.ip, e.port).to_string())
            .collect();
        for (i, owner) in maglev::lookup_table(&identities, m).iter().enumerate() {
            rs.element(slot_element(
                &map,
                offset + i as u32,
                &self.eps[*owner as usize],
            ));
        }
        rules.push(Rule::new(
            self.chain,
            vec![
                Expr::L4Proto(self.sp.name.protocol.number()),
                Expr::DnatHash {
                    key: maglev_key(),
                    modulus: m,
                    seed: MAGLEV_SEED,
                    offset,
                    map: map.to_string(),
                },
            ],
        ));
    }

    /// Affinity lookups first, then a cascade in which rule i matches with probability
    /// 1/(N-i), which picks each endpoint with probability 1/N.
    fn affinity_cascade(&self, rs: &mut Fragment, rules: &mut Vec<Rule>) {
        let (chain, sp, eps) = (self.chain, self.sp, self.eps);
        let proto = sp.name.protocol.number();
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
}

/// Slot `slot` of `map` holding `ep`.
fn slot_element(map: &Name, slot: u32, ep: &Endpoint) -> Element {
    Element::new(
        map.clone(),
        vec![KeyValue::Slot(slot)],
        ElemData::Target(Target::new(ep.ip, ep.port)),
        None,
    )
}
