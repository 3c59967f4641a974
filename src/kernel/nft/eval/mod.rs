//! Evaluates a packet through a [`LiveTable`] the way nf_tables does: the kernel's own
//! register machine (payload, meta, ct, fib, cmp, bitwise, lookup, immediate, numgen, hash,
//! nat, masq, redir, reject, dynset), over the base chains of each hook the packet meets in
//! order (prerouting, then input or forward, then postrouting; or output then
//! postrouting). Every branch a `numgen` can take is followed, with its probability; a
//! `jhash` is computed as the kernel computes it, so it takes the packet's one slot. An
//! expression, key or set it does not model ends that branch as [`End::Unknown`], naming the
//! rule: reported, never guessed. Pure; `explain` runs it over the live kernel's table.
//!
//! The packet model, the branch state and the entry points are here; `machine.rs` runs the
//! chains, rules and expressions.

mod machine;

use std::collections::BTreeMap;
use std::net::IpAddr;

use super::live::LiveTable;
use super::{Hook, Verdict};

/// The packet: the first packet of a new connection.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Packet {
    pub saddr: IpAddr,
    pub daddr: IpAddr,
    pub proto: u8,
    pub sport: u16,
    pub dport: u16,
    /// Input interface; `None` for a packet this host sends (it starts at `output`).
    pub iif: Option<String>,
    pub mark: u32,
}

/// What the host around the table looks like.
#[derive(Debug, Clone, Default)]
pub struct Host {
    /// Addresses `fib … type local` treats as local (loopback ranges always are).
    pub local_addrs: Vec<IpAddr>,
}

impl Host {
    fn is_local(&self, a: IpAddr) -> bool {
        a.is_loopback() || self.local_addrs.contains(&a)
    }
}

/// A rule the packet matched (all its conditions held), and what it did.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Step {
    pub hook: &'static str,
    pub chain: String,
    pub handle: u64,
    pub comment: Option<String>,
    /// What the rule did: `jump X`, `dnat to A:P`, `masquerade`, `mark set 0x4000`, ….
    pub action: String,
}

/// How a branch ended.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, serde::Serialize)]
#[serde(rename_all = "snake_case", tag = "verdict")]
pub enum End {
    /// Accepted by every chain it met (delivered locally or forwarded).
    Accept {
        delivered: Delivery,
    },
    Drop {
        chain: String,
        handle: u64,
    },
    /// Rejected: the client sees "connection refused" (TCP reset or ICMP unreachable).
    Reject {
        chain: String,
        handle: u64,
    },
    /// Reached something this evaluator does not model.
    Unknown {
        chain: String,
        handle: u64,
        why: String,
    },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Delivery {
    /// To a local socket (`input`).
    Local,
    /// Routed on (`forward` or out of this host).
    Routed,
}

/// One way through the table.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Path {
    pub probability: f64,
    pub steps: Vec<Step>,
    /// The destination after NAT, when a rule changed it.
    pub dnat: Option<(IpAddr, u16)>,
    /// Redirected to this host's port.
    pub redirect: Option<u16>,
    pub masquerade: bool,
    /// Sets the packet's source was added to or refreshed in (session affinity).
    pub updated_sets: Vec<String>,
    /// The packet's mark at the end (what a later hook, or IPVS, sees).
    pub mark: u32,
    pub end: End,
}

#[derive(Debug, Clone)]
struct State {
    pkt: Packet,
    prob: f64,
    regs: [u8; 64],
    verdict: Option<Verdict>,
    steps: Vec<Step>,
    dnat: Option<(IpAddr, u16)>,
    redirect: Option<u16>,
    masquerade: bool,
    dnatted: bool,
    updated_sets: Vec<String>,
    /// Statements of the rule being run (`mark set …`, `update @…`), for its step.
    notes: Vec<String>,
}

/// How evaluating one chain ended for one branch.
enum ChainEnd {
    /// Fell off its end or returned.
    Continue,
    /// Accepted (by a verdict or a NAT statement).
    Accept,
    Final(End),
}

/// How evaluating one rule ended.
enum RuleEnd {
    /// A condition failed (`NFT_BREAK`).
    Break,
    /// Every expression ran; `verdict` is the one it set, if any.
    Done,
    Final(End),
    Accept,
}
const MAX_DEPTH: usize = 16;
/// Most `numgen` values followed (a Service's endpoints; upstream has no limit, 64k is far
/// past any real one).
const MAX_BRANCHES: u32 = 65_536;

struct Eval<'a> {
    table: &'a LiveTable,
    host: &'a Host,
    hook: Hook,
}

/// Every way `pkt` can go through `table`, starting at `prerouting` (a packet arriving on
/// `pkt.iif`) or at `output` (one this host sends).
pub fn evaluate(table: &LiveTable, host: &Host, pkt: &Packet) -> Vec<Path> {
    let first = if pkt.iif.is_some() {
        Hook::Prerouting
    } else {
        Hook::Output
    };
    evaluate_from(table, host, pkt, first)
}

/// [`evaluate`] from hook `first_hook`: `postrouting` for a packet IPVS forwards after
/// local delivery.
pub fn evaluate_from(table: &LiveTable, host: &Host, pkt: &Packet, first_hook: Hook) -> Vec<Path> {
    let first = State {
        pkt: pkt.clone(),
        prob: 1.0,
        regs: [0; 64],
        verdict: None,
        steps: Vec::new(),
        dnat: None,
        redirect: None,
        masquerade: false,
        dnatted: false,
        updated_sets: Vec::new(),
        notes: Vec::new(),
    };
    let run = |hook: Hook, states: Vec<State>| Eval { table, host, hook }.hook(states);
    let mut paths = Vec::new();
    let mut finish = |st: State, end: End| {
        paths.push(Path {
            probability: st.prob,
            steps: st.steps,
            dnat: st.dnat,
            redirect: st.redirect,
            masquerade: st.masquerade,
            updated_sets: st.updated_sets,
            mark: st.pkt.mark,
            end,
        })
    };
    for (st, end) in run(first_hook, vec![first]) {
        if let Some(e) = end {
            finish(st, e);
            continue;
        }
        let local = host.is_local(st.pkt.daddr);
        let hooks: &[Hook] = match (first_hook, local) {
            (Hook::Prerouting, true) => &[Hook::Input],
            (Hook::Prerouting, false) => &[Hook::Forward, Hook::Postrouting],
            (Hook::Postrouting | Hook::Input | Hook::Forward, _) => &[],
            (_, true) => &[Hook::Postrouting, Hook::Input],
            (_, false) => &[Hook::Postrouting],
        };
        let mut states = vec![(st, None)];
        for h in hooks {
            let mut next = Vec::new();
            for (st, end) in states {
                match end {
                    Some(e) => next.push((st, Some(e))),
                    None => next.extend(run(*h, vec![st])),
                }
            }
            states = next;
        }
        for (st, end) in states {
            let end = end.unwrap_or(End::Accept {
                delivered: if local {
                    Delivery::Local
                } else {
                    Delivery::Routed
                },
            });
            finish(st, end);
        }
    }
    paths
}

/// Paths with the same result (destination, masquerade, end) merged, probabilities summed;
/// the first path's steps stand for the group. Ordered by result.
pub fn outcomes(paths: &[Path]) -> Vec<Path> {
    type Key = (Option<(IpAddr, u16)>, Option<u16>, bool, End);
    let mut by: BTreeMap<Key, Path> = BTreeMap::new();
    for p in paths {
        let k = (p.dnat, p.redirect, p.masquerade, p.end.clone());
        by.entry(k)
            .and_modify(|q| q.probability += p.probability)
            .or_insert_with(|| p.clone());
    }
    by.into_values().collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernel::nft::live::{LiveChain, LiveRule};
    use crate::kernel::nft::lower::KExpr;
    use crate::kernel::nft::{BaseChain, ChainType, Family};

    fn table(rules: Vec<(&str, Vec<KExpr>)>) -> LiveTable {
        let mut t = LiveTable::empty(Family::Ip, "t");
        t.chains.insert(
            "pre".into(),
            LiveChain {
                base: Some(BaseChain {
                    kind: ChainType::Nat,
                    hook: Hook::Prerouting,
                    priority: -100,
                }),
                rules: Vec::new(),
            },
        );
        for (i, (chain, exprs)) in rules.into_iter().enumerate() {
            t.chains
                .entry(chain.into())
                .or_default()
                .rules
                .push(LiveRule {
                    handle: i as u64 + 1,
                    exprs: Ok(exprs),
                    comment: None,
                });
        }
        t
    }

    /// 10.0.0.1 → 10.96.0.1:80/tcp, in on eth0.
    fn packet() -> Packet {
        Packet {
            saddr: "10.0.0.1".parse().unwrap(),
            daddr: "10.96.0.1".parse().unwrap(),
            proto: 6,
            sport: 1,
            dport: 80,
            iif: Some("eth0".into()),
            mark: 0,
        }
    }

    fn ends(t: &LiveTable) -> Vec<End> {
        let pkt = packet();
        evaluate(t, &Host::default(), &pkt)
            .into_iter()
            .map(|p| p.end)
            .collect()
    }

    #[test]
    fn hostile_rules_end_as_unknown_and_never_hang() {
        let unknown = |e: &End| matches!(e, End::Unknown { .. });
        // Four billion numgen branches.
        let t = table(vec![(
            "pre",
            vec![KExpr::Numgen {
                modulus: u32::MAX,
                offset: 0,
                dreg: 8,
            }],
        )]);
        assert!(ends(&t).iter().all(unknown), "{:?}", ends(&t));
        // A jump loop.
        let t = table(vec![
            ("pre", vec![KExpr::ImmVerdict(Verdict::Jump("a".into()))]),
            ("a", vec![KExpr::ImmVerdict(Verdict::Jump("a".into()))]),
        ]);
        assert!(ends(&t).iter().all(unknown));
        // A lookup in a set that is not there, a register past the end, a payload past the
        // header.
        for e in [
            KExpr::Lookup {
                set: "nope".into(),
                sreg: 8,
                dreg: None,
                flags: 0,
            },
            KExpr::Cmp {
                sreg: 99,
                op: 0,
                data: vec![1],
            },
            KExpr::Payload {
                base: 1,
                offset: u32::MAX,
                len: 4,
                dreg: 8,
            },
        ] {
            let t = table(vec![("pre", vec![e.clone()])]);
            assert!(ends(&t).iter().all(unknown), "{e:?}: {:?}", ends(&t));
        }
    }

    /// Found by the `explain` fuzz target: a packet whose source is not of the table's
    /// family (an IPv4 source traced through an ip6 table) panicked building the network
    /// header a payload expression reads.
    #[test]
    fn a_packet_of_the_other_family_is_evaluated_without_a_panic() {
        let mut t = table(vec![(
            "pre",
            vec![KExpr::Payload {
                base: 1,
                offset: 8,
                len: 16,
                dreg: 8,
            }],
        )]);
        t.family = Family::Ip6;
        let pkt = Packet {
            daddr: "fd00::1".parse().unwrap(),
            ..packet()
        };
        assert!(!evaluate(&t, &Host::default(), &pkt).is_empty());
    }

    #[test]
    fn numgen_branches_carry_their_probability() {
        let t = table(vec![(
            "pre",
            vec![
                KExpr::Numgen {
                    modulus: 4,
                    offset: 0,
                    dreg: 8,
                },
                KExpr::Cmp {
                    sreg: 8,
                    op: 0,
                    data: 0u32.to_ne_bytes().to_vec(),
                },
                KExpr::ImmVerdict(Verdict::Drop),
            ],
        )]);
        let pkt = packet();
        let o = outcomes(&evaluate(&t, &Host::default(), &pkt));
        let drop: f64 = o
            .iter()
            .filter(|p| matches!(p.end, End::Drop { .. }))
            .map(|p| p.probability)
            .sum();
        assert!((drop - 0.25).abs() < 1e-9, "{o:?}");
    }

    /// A nat prerouting chain whose one rule DNATs by `jhash` into slots 16..23 of an
    /// endpoint map, slot `s` holding endpoint `s % 3` (10.244.{s%3}.5:8080).
    fn hash_table(family: Family) -> LiveTable {
        use crate::kernel::nft::{
            Chain, ElemData, Element, Expr, Field, KeyValue, Rule, Set, Target,
        };
        let chain = Chain::base("pre", ChainType::Nat, Hook::Prerouting, -100);
        let rule = Rule::new(
            "pre",
            vec![
                Expr::L4Proto(6),
                Expr::DnatHash {
                    key: vec![Field::Saddr, Field::Sport, Field::Daddr, Field::Dport],
                    modulus: 7,
                    seed: 0x4b4e_4c50,
                    offset: 16,
                    map: "eps".into(),
                },
            ],
        );
        let elements: Vec<Element> = (16..23u32)
            .map(|s| {
                Element::new(
                    "eps".into(),
                    vec![KeyValue::Slot(s)],
                    ElemData::Target(Target::new(endpoint(family, s), 8080)),
                    None,
                )
            })
            .collect();
        LiveTable::from_typed(
            family,
            "t",
            [(chain, vec![rule])].iter(),
            [Set::endpoint_map("eps")].iter(),
            elements.iter(),
        )
    }

    fn endpoint(family: Family, slot: u32) -> IpAddr {
        match family {
            Family::Ip => IpAddr::from([10, 244, (slot % 3) as u8, 5]),
            Family::Ip6 => format!("fd00:244:{}::5", slot % 3).parse().unwrap(),
        }
    }

    /// The evaluator hashes what the kernel hashes: the key's registers, each field padded
    /// to 32 bits, so it predicts the one slot a packet takes, with certainty.
    #[test]
    fn a_jhash_dnat_takes_the_slot_the_kernel_computes() {
        use crate::kernel::nft::jhash::nft_jhash;
        for family in Family::all() {
            let t = hash_table(family);
            let (saddr, daddr): (IpAddr, IpAddr) = match family {
                Family::Ip => ("10.0.0.1".parse().unwrap(), "10.96.0.1".parse().unwrap()),
                Family::Ip6 => ("fd00::1".parse().unwrap(), "fd00:96::1".parse().unwrap()),
            };
            let ip = |a: IpAddr| match a {
                IpAddr::V4(a) => a.octets().to_vec(),
                IpAddr::V6(a) => a.octets().to_vec(),
            };
            let mut reached = std::collections::BTreeSet::new();
            for sport in [1u16, 40000, 40001, 65535] {
                let pkt = Packet {
                    saddr,
                    daddr,
                    sport,
                    ..packet()
                };
                // saddr . sport . daddr . dport, as the registers hold them (16 or 40 bytes).
                let mut key = ip(saddr);
                key.extend(sport.to_be_bytes());
                key.extend([0, 0]);
                key.extend(ip(daddr));
                key.extend(80u16.to_be_bytes());
                key.extend([0, 0]);
                assert_eq!(key.len(), if family == Family::Ip { 16 } else { 40 });
                let slot = nft_jhash(&key, 7, 0x4b4e_4c50, 16);
                let paths = evaluate(&t, &Host::default(), &pkt);
                assert_eq!(paths.len(), 1, "{paths:?}");
                let p = &paths[0];
                assert_eq!(p.probability, 1.0);
                let ep = endpoint(family, slot);
                assert_eq!(p.dnat, Some((ep, 8080)));
                let f = family.name();
                let sock = std::net::SocketAddr::new(ep, 8080);
                assert_eq!(
                    p.steps[0].action,
                    format!(
                        "jhash {f} saddr . th sport . {f} daddr . th dport mod 7 = {} → slot {slot}, \
                         dnat to {sock}",
                        slot - 16
                    )
                );
                reached.insert(slot);
            }
            assert!(reached.len() > 1, "{reached:?}");
        }
    }

    /// An empty slot fails the lookup, and with it the rule, as in the kernel.
    #[test]
    fn a_jhash_into_an_empty_slot_matches_nothing() {
        let mut t = hash_table(Family::Ip);
        t.sets.get_mut("eps").unwrap().elements.clear();
        let paths = evaluate(&t, &Host::default(), &packet());
        assert_eq!(paths.len(), 1);
        assert_eq!(paths[0].dnat, None);
        assert!(paths[0].steps.is_empty(), "{paths:?}");
    }
}
