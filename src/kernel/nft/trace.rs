//! A packet tracer over the [`FakeNftables`] ruleset (after upstream's `tracePacket` test
//! helper): follows a packet through our chains and reports every possible outcome, taking
//! both branches at each `numgen`, and at a `jhash` the packet's one slot when it has a
//! source port, every slot when not. Pure; used by unit tests to check behaviour, not text.

use std::collections::BTreeSet;
use std::net::IpAddr;

use super::{CmpOp, Expr, FakeNftables, Family, Field, KeyValue, Verdict};

/// The packet being traced.
#[derive(Debug, Clone)]
pub struct Packet {
    pub saddr: IpAddr,
    pub daddr: IpAddr,
    pub proto: u8,
    /// The source port, when the test cares which slot a `jhash` picks; `None` follows
    /// every slot (see [`Expr::DnatHash`] below).
    pub sport: Option<u16>,
    pub dport: u16,
    /// Input interface name (empty for locally generated packets).
    pub iif: String,
    /// Addresses `fib … type local` treats as local.
    pub local_addrs: Vec<IpAddr>,
}

/// Where a packet ends up.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Outcome {
    /// DNATed to `addr:port`; `masquerade` when the masquerade mark was set on the way.
    Dnat {
        addr: IpAddr,
        port: u16,
        masquerade: bool,
    },
    /// Redirected to this host's port.
    Redirect(u16),
    /// Left the chain without a terminal verdict (accepted by the base chain's policy).
    Pass,
    Drop,
    Reject,
    Accept,
}

enum Flow {
    /// Fell off the end of a rule list, or `return`.
    Continue,
    Term(Outcome),
}

struct Tracer<'a> {
    fake: &'a FakeNftables,
    family: Family,
    table: &'a str,
    pkt: &'a Packet,
    mark_bit: u32,
}

impl Tracer<'_> {
    fn field(&self, f: Field) -> KeyValue {
        match f {
            Field::Saddr => KeyValue::Addr(self.pkt.saddr),
            Field::Daddr => KeyValue::Addr(self.pkt.daddr),
            Field::L4Proto => KeyValue::Proto(self.pkt.proto),
            Field::Dport => KeyValue::Port(self.pkt.dport),
            Field::Sport => KeyValue::Port(
                self.pkt
                    .sport
                    .expect("a rule keys on th sport: give the traced packet a sport"),
            ),
            // One of its values; a lookup keyed by it follows each (see `DnatLookup`).
            Field::Random(_) => KeyValue::Slot(0),
        }
    }

    fn key(&self, k: &[Field]) -> Vec<KeyValue> {
        k.iter().map(|f| self.field(*f)).collect()
    }

    fn chain(&self, name: &str, mark: u32, depth: usize, out: &mut Vec<(u32, Flow)>) {
        assert!(depth < 32, "chain loop through {name}");
        let rules = self
            .fake
            .rules(self.family, self.table, name)
            .unwrap_or_else(|| panic!("trace reached missing chain {name}"));
        self.rules(rules, 0, mark, depth, out);
    }

    fn rules(
        &self,
        rules: &[super::Rule],
        i: usize,
        mark: u32,
        depth: usize,
        out: &mut Vec<(u32, Flow)>,
    ) {
        let Some(rule) = rules.get(i) else {
            out.push((mark, Flow::Continue));
            return;
        };
        let mut branches = Vec::new();
        self.exprs(&rule.exprs, mark, depth, &mut branches);
        for (m, r) in branches {
            match r {
                RuleEnd::NoMatch | RuleEnd::Next => self.rules(rules, i + 1, m, depth, out),
                RuleEnd::Return => out.push((m, Flow::Continue)),
                RuleEnd::Term(o) => out.push((m, Flow::Term(o))),
            }
        }
    }

    fn verdict(&self, v: &Verdict, mark: u32, depth: usize, out: &mut Vec<(u32, RuleEnd)>) {
        match v {
            Verdict::Accept => out.push((mark, RuleEnd::Term(Outcome::Accept))),
            Verdict::Drop => out.push((mark, RuleEnd::Term(Outcome::Drop))),
            Verdict::Return => out.push((mark, RuleEnd::Return)),
            Verdict::Jump(c) => {
                let mut sub = Vec::new();
                self.chain(c, mark, depth + 1, &mut sub);
                for (m, f) in sub {
                    out.push((
                        m,
                        match f {
                            Flow::Continue => RuleEnd::Next,
                            Flow::Term(o) => RuleEnd::Term(o),
                        },
                    ));
                }
            }
            Verdict::Goto(c) => {
                let mut sub = Vec::new();
                self.chain(c, mark, depth + 1, &mut sub);
                for (m, f) in sub {
                    out.push((
                        m,
                        match f {
                            Flow::Continue => RuleEnd::Return,
                            Flow::Term(o) => RuleEnd::Term(o),
                        },
                    ));
                }
            }
        }
    }

    /// DNAT through slots `first..first + n` of endpoint map `map`, one outcome per slot; an
    /// empty slot makes the lookup (and so the rule) fail.
    fn dnat_to_slots(
        &self,
        map: &str,
        first: u32,
        n: u32,
        mark: u32,
        out: &mut Vec<(u32, RuleEnd)>,
    ) {
        for slot in (0..n).map_while(|i| first.checked_add(i)) {
            let target = self
                .fake
                .lookup(self.family, self.table, map, &[KeyValue::Slot(slot)])
                .and_then(|e| e.target());
            out.push(self.dnat_to(target, mark));
        }
    }

    /// A DNAT to the endpoint an endpoint map held for the packet; no match without one.
    fn dnat_to(&self, target: Option<std::net::SocketAddr>, mark: u32) -> (u32, RuleEnd) {
        match target {
            Some(t) => (
                mark,
                RuleEnd::Term(Outcome::Dnat {
                    addr: t.ip(),
                    port: t.port(),
                    masquerade: mark & self.mark_bit != 0,
                }),
            ),
            None => (mark, RuleEnd::NoMatch),
        }
    }

    fn exprs(&self, exprs: &[Expr], mark: u32, depth: usize, out: &mut Vec<(u32, RuleEnd)>) {
        let Some((e, rest)) = exprs.split_first() else {
            out.push((mark, RuleEnd::Next));
            return;
        };
        let go_on = |ok: bool, out: &mut Vec<(u32, RuleEnd)>| {
            if ok {
                self.exprs(rest, mark, depth, out)
            } else {
                out.push((mark, RuleEnd::NoMatch))
            }
        };
        match e {
            Expr::Addr { field, op, value } => {
                let KeyValue::Addr(a) = self.field(*field) else {
                    unreachable!()
                };
                go_on(value.contains(&a) == (*op == CmpOp::Eq), out)
            }
            Expr::L4Proto(p) => go_on(self.pkt.proto == *p, out),
            Expr::IifName { name, prefix, op } => {
                let m = if *prefix {
                    self.pkt.iif.starts_with(name.as_str())
                } else {
                    self.pkt.iif == *name
                };
                go_on(m == (*op == CmpOp::Eq), out)
            }
            Expr::InSet { key, set, negate } => {
                let found = self
                    .fake
                    .lookup(self.family, self.table, set, &self.key(key))
                    .is_some();
                go_on(found != *negate, out)
            }
            Expr::CtStateNew => go_on(true, out),
            // The traced packet opens a new connection, which conntrack tracks.
            Expr::CtStateInvalid => go_on(false, out),
            Expr::CtStatusDnat => go_on(false, out),
            Expr::FibLocal(f) => {
                let KeyValue::Addr(a) = self.field(*f) else {
                    unreachable!()
                };
                go_on(self.pkt.local_addrs.contains(&a), out)
            }
            Expr::MarkBitClear(b) => go_on(mark & b == 0, out),
            Expr::NumgenZero(_) => {
                self.exprs(rest, mark, depth, out);
                out.push((mark, RuleEnd::NoMatch));
            }
            Expr::Vmap { key, map } => {
                match self
                    .fake
                    .lookup(self.family, self.table, map, &self.key(key))
                {
                    Some(el) => {
                        let v = el.verdict().cloned().expect("vmap element has a verdict");
                        self.verdict(&v, mark, depth, out)
                    }
                    None => self.exprs(rest, mark, depth, out),
                }
            }
            Expr::MarkOr(b) => self.exprs(rest, mark | b, depth, out),
            Expr::MarkXor(b) => self.exprs(rest, mark ^ b, depth, out),
            Expr::Masquerade { .. } => out.push((mark, RuleEnd::Term(Outcome::Accept))),
            Expr::Dnat { addr, port } => out.push((
                mark,
                RuleEnd::Term(Outcome::Dnat {
                    addr: *addr,
                    port: *port,
                    masquerade: mark & self.mark_bit != 0,
                }),
            )),
            Expr::DnatLookup { key, map } => {
                // Every value a `numgen` component can take; a missing element makes the
                // lookup (and so the rule) fail.
                let values = match key.last() {
                    Some(Field::Random(m)) => *m,
                    _ => 1,
                };
                let mut k = self.key(key);
                for v in 0..values {
                    if let Some(KeyValue::Slot(s)) = k.last_mut() {
                        *s = v;
                    }
                    let target = self
                        .fake
                        .lookup(self.family, self.table, map, &k)
                        .and_then(|e| e.target());
                    out.push(self.dnat_to(target, mark));
                }
            }
            Expr::DnatMap {
                modulus,
                offset,
                map,
            } => {
                // Every slot numgen can produce.
                self.dnat_to_slots(map, *offset, *modulus, mark, out);
            }
            Expr::DnatHash {
                key,
                modulus,
                seed,
                offset,
                map,
            } => {
                // With every field of the key known, the one slot the kernel's jhash picks
                // (over the key as the registers hold it, each field of a concatenation
                // padded to 32 bits, a lone field unpadded);
                // a packet without a source port, like `DnatMap`, every slot: tests of
                // which endpoints a Service can reach need no port.
                let known = key.iter().all(|f| match f {
                    Field::Sport => self.pkt.sport.is_some(),
                    Field::Random(_) => false,
                    _ => true,
                });
                let (first, n) = if known {
                    let mut bytes = super::lower::key_bytes(self.key(key));
                    bytes.truncate(super::encode::key_len(key, self.family) as usize);
                    (super::jhash::nft_jhash(&bytes, *modulus, *seed, *offset), 1)
                } else {
                    (*offset, *modulus)
                };
                self.dnat_to_slots(map, first, n, mark, out);
            }
            Expr::Redirect { port } => out.push((mark, RuleEnd::Term(Outcome::Redirect(*port)))),
            Expr::Reject => out.push((mark, RuleEnd::Term(Outcome::Reject))),
            Expr::UpdateSet { .. } | Expr::Counter => self.exprs(rest, mark, depth, out),
            Expr::Verdict(v) => self.verdict(v, mark, depth, out),
        }
    }
}

enum RuleEnd {
    NoMatch,
    Next,
    Return,
    Term(Outcome),
}

/// Every outcome of sending `pkt` through base chain `chain` of a fake table.
pub fn trace(
    fake: &FakeNftables,
    family: Family,
    table: &str,
    chain: &str,
    mark_bit: u32,
    pkt: &Packet,
) -> BTreeSet<Outcome> {
    let t = Tracer {
        fake,
        family,
        table,
        pkt,
        mark_bit,
    };
    let mut out = Vec::new();
    t.chain(chain, 0, 0, &mut out);
    out.into_iter()
        .map(|(_, f)| match f {
            Flow::Continue => Outcome::Pass,
            Flow::Term(o) => o,
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernel::nft::jhash::nft_jhash;
    use crate::kernel::nft::lower::key_bytes;
    use crate::kernel::nft::{
        Chain, ElemData, Element, Nftables, Rule, Set, Table, Target, Transaction,
    };

    /// Chain `c`: `dnat to jhash ip saddr . th sport . ip daddr . th dport mod 5 seed 9
    /// offset 10 map @slots`, slot s holding 10.244.0.s:80.
    fn hashed() -> FakeNftables {
        let mut tx = Transaction::new(Family::Ip, "t");
        tx.add(Table {
            family: Family::Ip,
            name: "t".into(),
            comment: None,
        });
        tx.add(Chain::regular("c"));
        tx.add(Set::endpoint_map("slots"));
        for s in 10..15u8 {
            tx.add(Element::new(
                "slots".into(),
                vec![KeyValue::Slot(s.into())],
                ElemData::Target(Target::new(IpAddr::from([10, 244, 0, s]), 80)),
                None,
            ));
        }
        tx.add(Rule::new(
            "c",
            vec![Expr::DnatHash {
                key: vec![Field::Saddr, Field::Sport, Field::Daddr, Field::Dport],
                modulus: 5,
                seed: 9,
                offset: 10,
                map: "slots".into(),
            }],
        ));
        let mut f = FakeNftables::new();
        f.apply(&tx).unwrap();
        f
    }

    fn packet(sport: Option<u16>) -> Packet {
        Packet {
            saddr: IpAddr::from([10, 0, 0, 1]),
            daddr: IpAddr::from([10, 96, 0, 1]),
            proto: 6,
            sport,
            dport: 443,
            iif: "eth0".into(),
            local_addrs: vec![],
        }
    }

    fn dnat(last: u8) -> Outcome {
        Outcome::Dnat {
            addr: IpAddr::from([10, 244, 0, last]),
            port: 80,
            masquerade: false,
        }
    }

    #[test]
    fn a_jhash_dnat_takes_one_slot_with_a_source_port_and_every_slot_without() {
        let f = hashed();
        let every: BTreeSet<Outcome> = (10..15).map(dnat).collect();
        assert_eq!(trace(&f, Family::Ip, "t", "c", 0, &packet(None)), every);
        let sport = 40000;
        let key = key_bytes([
            KeyValue::Addr(IpAddr::from([10, 0, 0, 1])),
            KeyValue::Port(sport),
            KeyValue::Addr(IpAddr::from([10, 96, 0, 1])),
            KeyValue::Port(443),
        ]);
        let slot = nft_jhash(&key, 5, 9, 10) as u8;
        assert_eq!(
            trace(&f, Family::Ip, "t", "c", 0, &packet(Some(sport))),
            BTreeSet::from([dnat(slot)])
        );
    }
}
