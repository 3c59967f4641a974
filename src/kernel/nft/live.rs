//! [`LiveTable`]: one table's content in the kernel's own terms (chains with their base
//! hooks, rules as kernel expressions with handles and comments, sets with their elements as
//! bytes), built either from a netlink dump of the live kernel or from planned typed
//! objects lowered the way the encoder lowers them. The same shape on both sides is what
//! lets `explain` trace the live kernel and `status`/`diff` compare it with a plan. Pure.

use std::collections::BTreeMap;

use super::decode::{ListedChain, ListedElement, ListedRule, ListedSet};
use super::lower::{key_bytes, lower, target_bytes, KExpr};

use super::{BaseChain, Chain, Element, Family, Rule, Set, Verdict};

/// A rule as the kernel holds it. `exprs` is `Err` with the reason when the kernel's
/// expressions could not be read (another program's rule in our table, an expression we
/// never write): such a rule is reported, never guessed at.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LiveRule {
    /// The kernel's handle (for a planned rule: its place in the table, from 1).
    pub handle: u64,
    pub exprs: Result<Vec<KExpr>, String>,
    pub comment: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct LiveChain {
    pub base: Option<BaseChain>,
    pub rules: Vec<LiveRule>,
}

/// What an element maps its key to.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub enum LiveData {
    /// A plain set's member.
    None,
    Verdict(Verdict),
    /// Data bytes (an endpoint map's address . port).
    Value(Vec<u8>),
}

#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct LiveSet {
    pub flags: u32,
    pub key_len: u32,
    /// Element timeout, for sets the data path fills (session affinity).
    pub timeout_ms: Option<u64>,
    /// Key bytes (exactly `key_len` long) → data.
    pub elements: BTreeMap<Vec<u8>, LiveData>,
    /// Element comments by key (shown by `explain`; not compared).
    pub comments: BTreeMap<Vec<u8>, String>,
}

/// One table, chains and sets by name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LiveTable {
    pub family: Family,
    pub name: String,
    pub chains: BTreeMap<String, LiveChain>,
    pub sets: BTreeMap<String, LiveSet>,
}

impl LiveTable {
    pub fn empty(family: Family, name: impl Into<String>) -> LiveTable {
        LiveTable {
            family,
            name: name.into(),
            chains: BTreeMap::new(),
            sets: BTreeMap::new(),
        }
    }

    /// Assembles a dump of one table (the lists may hold other tables' objects: the kernel
    /// ignores the table filter of chain dumps, so they are filtered here). `rules` are in
    /// kernel order; a rule that did not decode comes as `(chain, handle, why)`.
    pub fn from_dump(
        family: Family,
        name: &str,
        chains: Vec<ListedChain>,
        rules: Vec<Result<ListedRule, (String, String, u64, String)>>,
        sets: Vec<(ListedSet, Vec<ListedElement>)>,
    ) -> LiveTable {
        let mut t = LiveTable::empty(family, name);
        for c in chains.into_iter().filter(|c| c.table == name) {
            t.chains.insert(
                c.name,
                LiveChain {
                    base: c.base,
                    rules: Vec::new(),
                },
            );
        }
        for r in rules {
            let (table, chain, rule) = match r {
                Ok(r) => (
                    r.table,
                    r.chain,
                    LiveRule {
                        handle: r.handle,
                        exprs: Ok(r.exprs),
                        comment: r.comment,
                    },
                ),
                Err((table, chain, handle, why)) => (
                    table,
                    chain,
                    LiveRule {
                        handle,
                        exprs: Err(why),
                        comment: None,
                    },
                ),
            };
            if table == name {
                t.chains.entry(chain).or_default().rules.push(rule);
            }
        }
        for (s, listed) in sets.into_iter().filter(|(s, _)| s.table == name) {
            let mut elements = BTreeMap::new();
            let mut comments = BTreeMap::new();
            for e in listed {
                let data = match (e.verdict, e.value) {
                    (Some(v), _) => LiveData::Verdict(v),
                    (None, Some(v)) => LiveData::Value(v),
                    (None, None) => LiveData::None,
                };
                if let Some(c) = e.comment {
                    comments.insert(e.key.clone(), c);
                }
                elements.insert(e.key, data);
            }
            t.sets.insert(
                s.name,
                LiveSet {
                    flags: s.flags,
                    key_len: s.key_len,
                    timeout_ms: s.timeout_ms,
                    elements,
                    comments,
                },
            );
        }
        t
    }

    /// What the kernel would hold after adding these typed objects to an empty table (a
    /// plan's: the elements of sets the data path fills are never among them).
    pub fn from_typed<'a>(
        family: Family,
        name: &str,
        chains: impl Iterator<Item = &'a (Chain, Vec<Rule>)>,
        sets: impl Iterator<Item = &'a Set>,
        elements: impl Iterator<Item = &'a Element>,
    ) -> LiveTable {
        let mut t = LiveTable::empty(family, name);
        // Handles numbered as a fresh table's would be: 1, 2, … in creation order.
        let mut handle = 0;
        for (chain, rules) in chains {
            let rules = rules
                .iter()
                .map(|r| {
                    handle += 1;
                    LiveRule {
                        handle,
                        ..planned_rule(r, family)
                    }
                })
                .collect();
            t.chains.insert(
                chain.name.clone(),
                LiveChain {
                    base: chain.base,
                    rules,
                },
            );
        }
        for s in sets {
            t.sets.insert(s.name.clone(), planned_set(s, family));
        }
        for e in elements {
            if let Some(s) = t.sets.get_mut(&**e.set()) {
                let (k, d) = planned_element(e, s.key_len as usize);
                if let Some(c) = e.comment().map(|c| &**c).and_then(stored_comment) {
                    s.comments.insert(k.clone(), c);
                }
                s.elements.insert(k, d);
            }
        }
        t
    }

    /// Base chains at `hook`, in the order the kernel runs them (priority, then name).
    pub fn base_chains(&self, hook: super::Hook) -> Vec<(&str, &LiveChain)> {
        let mut v: Vec<(&str, &LiveChain)> = self
            .chains
            .iter()
            .filter(|(_, c)| c.base.is_some_and(|b| b.hook == hook))
            .map(|(n, c)| (n.as_str(), c))
            .collect();
        v.sort_by_key(|(n, c)| (c.base.map(|b| b.priority), *n));
        v
    }

    pub fn rule_count(&self) -> usize {
        self.chains.values().map(|c| c.rules.len()).sum()
    }

    pub fn element_count(&self) -> usize {
        self.sets.values().map(|s| s.elements.len()).sum()
    }
}

fn planned_rule(r: &Rule, family: Family) -> LiveRule {
    LiveRule {
        handle: 0,
        exprs: Ok(lower(&r.exprs, family)),
        comment: r.comment.as_deref().and_then(stored_comment),
    }
}

/// A comment as the kernel hands it back: the encoder keeps its first
/// [`MAX_COMMENT`](super::encode::MAX_COMMENT) bytes, and one cut inside a character no
/// longer decodes.
fn stored_comment(c: &str) -> Option<String> {
    let b = c.as_bytes();
    String::from_utf8(b[..b.len().min(super::encode::MAX_COMMENT)].to_vec()).ok()
}

fn planned_set(s: &Set, family: Family) -> LiveSet {
    use super::uapi::{NFT_SET_EVAL, NFT_SET_MAP, NFT_SET_TIMEOUT};
    let (flags, key_len) = if s.endpoints && s.key.is_empty() {
        (NFT_SET_MAP, 4)
    } else if s.endpoints {
        (NFT_SET_MAP, super::encode::key_len(&s.key, family))
    } else {
        let mut f = 0;
        if s.map {
            f |= NFT_SET_MAP;
        }
        if s.timeout.is_some() {
            f |= NFT_SET_TIMEOUT | NFT_SET_EVAL;
        }
        (f, super::encode::key_len(&s.key, family))
    };
    LiveSet {
        flags,
        key_len,
        timeout_ms: s.timeout.map(|t| u64::from(t) * 1000),
        elements: BTreeMap::new(),
        comments: BTreeMap::new(),
    }
}

/// The typed key of `bytes` in `set` (the inverse of the element encoding), if it decodes
/// (and fits a [`Key`](super::Key)).
pub fn typed_key(set: &Set, family: Family, bytes: &[u8]) -> Option<super::Key> {
    use super::{Field, Key, KeyValue};
    if set.endpoints && set.key.is_empty() {
        return Some([KeyValue::Slot(u32::from_ne_bytes(bytes.try_into().ok()?))].into());
    }
    let single = set.key.len() == 1;
    let mut out = Key::new();
    let mut at = 0;
    for f in &set.key {
        let len = f.len(family);
        let v = bytes.get(at..at + len)?;
        out.try_push(match f {
            Field::Saddr | Field::Daddr => KeyValue::Addr(match family {
                Family::Ip => std::net::IpAddr::from(<[u8; 4]>::try_from(v).ok()?),
                Family::Ip6 => std::net::IpAddr::from(<[u8; 16]>::try_from(v).ok()?),
            }),
            Field::L4Proto => KeyValue::Proto(v[0]),
            Field::Dport | Field::Sport => KeyValue::Port(u16::from_be_bytes([v[0], v[1]])),
            Field::Random(_) => KeyValue::Slot(u32::from_ne_bytes(v.try_into().ok()?)),
        })
        .ok()?;
        at += if single { len } else { f.reg_len(family) };
    }
    (at == bytes.len()).then_some(out)
}

/// The key bytes of a typed element of a set with keys `key_len` long.
pub fn element_key(e: &Element, key_len: usize) -> Vec<u8> {
    planned_element(e, key_len).0
}

/// An element's key as the kernel stores it (`key_len` bytes: a lone 2-byte port is not
/// padded) and its data.
fn planned_element(e: &Element, key_len: usize) -> (Vec<u8>, LiveData) {
    let mut key = key_bytes(&e.key);
    key.truncate(key_len);
    let data = match &e.data() {
        super::ElemData::Verdict(v) => LiveData::Verdict(v.clone()),
        super::ElemData::Target(t) => LiveData::Value(target_bytes(t)),
        super::ElemData::None => LiveData::None,
    };
    (key, data)
}

/// A rule's expressions in a canonical form, so that two compilations of the same rule
/// compare equal: ours, and `nft`'s (which loads only the bytes a prefix match needs,
/// `ip daddr != 127.0.0.0/8` as a 1-byte load and no mask, and allocates registers in
/// 16-byte steps). Prefix matches are cut to their significant bytes, then registers are
/// renumbered in the order they are first written. `data_len` gives a map's data width
/// (a lookup writes that many bytes).
pub fn canonical_rule(exprs: &[KExpr], data_len: &dyn Fn(&str) -> usize) -> Vec<KExpr> {
    use super::uapi::{NFT_META_IIFNAME, NFT_META_L4PROTO, NFT_META_NFPROTO, REG_VERDICT};
    // 1. Prefix matches: load, optional mask, compare for (in)equality.
    let mut cut = Vec::with_capacity(exprs.len());
    let mut i = 0;
    while i < exprs.len() {
        if let KExpr::Payload {
            base,
            offset,
            len,
            dreg,
        } = &exprs[i]
        {
            let (mask, next) = match exprs.get(i + 1) {
                Some(KExpr::Bitwise {
                    sreg,
                    dreg: d,
                    mask,
                    xor,
                }) if sreg == dreg && d == dreg && xor.iter().all(|x| *x == 0) => {
                    (mask.clone(), i + 2)
                }
                _ => (vec![0xff; *len as usize], i + 1),
            };
            if let Some(KExpr::Cmp { sreg, op, data }) = exprs.get(next) {
                if sreg == dreg
                    && *op <= 1
                    && data.len() == mask.len()
                    && mask.len() == *len as usize
                {
                    let n = mask.iter().rposition(|m| *m != 0).map_or(0, |p| p + 1);
                    cut.push(KExpr::Payload {
                        base: *base,
                        offset: *offset,
                        len: n as u32,
                        dreg: *dreg,
                    });
                    if mask[..n].iter().any(|m| *m != 0xff) {
                        cut.push(KExpr::Bitwise {
                            sreg: *dreg,
                            dreg: *dreg,
                            mask: mask[..n].to_vec(),
                            xor: vec![0; n],
                        });
                    }
                    cut.push(KExpr::Cmp {
                        sreg: *sreg,
                        op: *op,
                        data: data[..n].to_vec(),
                    });
                    i = next + 1;
                    continue;
                }
            }
        }
        cut.push(exprs[i].clone());
        i += 1;
    }
    // 2. Registers renumbered by first write, each write taking as many 32-bit registers
    //    as it fills.
    let mut map: BTreeMap<u32, u32> = BTreeMap::new();
    let mut next = super::uapi::REG32_00;
    let mut write = |r: u32, bytes: usize, map: &mut BTreeMap<u32, u32>| -> u32 {
        if r == REG_VERDICT {
            return r;
        }
        if let Some(n) = map.get(&r) {
            return *n;
        }
        let words = bytes.div_ceil(4).max(1) as u32;
        let base = next;
        for k in 0..words {
            map.insert(r + k, base + k);
        }
        next += words;
        base
    };
    let read = |r: u32, map: &BTreeMap<u32, u32>| map.get(&r).copied().unwrap_or(r);
    cut.into_iter()
        .map(|e| match e {
            KExpr::Payload {
                base,
                offset,
                len,
                dreg,
            } => KExpr::Payload {
                base,
                offset,
                len,
                dreg: write(dreg, len as usize, &mut map),
            },
            KExpr::Meta { key, dreg } => {
                let w = match key {
                    NFT_META_IIFNAME => 16,
                    NFT_META_L4PROTO | NFT_META_NFPROTO => 1,
                    _ => 4,
                };
                KExpr::Meta {
                    key,
                    dreg: write(dreg, w, &mut map),
                }
            }
            KExpr::MetaSet { key, sreg } => KExpr::MetaSet {
                key,
                sreg: read(sreg, &map),
            },
            KExpr::Ct { key, dreg } => KExpr::Ct {
                key,
                dreg: write(dreg, 4, &mut map),
            },
            KExpr::Fib {
                flags,
                result,
                dreg,
            } => KExpr::Fib {
                flags,
                result,
                dreg: write(dreg, 4, &mut map),
            },
            KExpr::Numgen {
                modulus,
                offset,
                dreg,
            } => KExpr::Numgen {
                modulus,
                offset,
                dreg: write(dreg, 4, &mut map),
            },
            KExpr::Hash {
                sreg,
                dreg,
                len,
                modulus,
                seed,
                offset,
            } => {
                // The key is read from where it was loaded; the 32-bit result is a write.
                let sreg = read(sreg, &map);
                KExpr::Hash {
                    sreg,
                    dreg: write(dreg, 4, &mut map),
                    len,
                    modulus,
                    seed,
                    offset,
                }
            }
            KExpr::Cmp { sreg, op, data } => KExpr::Cmp {
                sreg: read(sreg, &map),
                op,
                data,
            },
            KExpr::Bitwise {
                sreg,
                dreg,
                mask,
                xor,
            } => {
                let sreg = read(sreg, &map);
                let dreg = write(dreg, mask.len(), &mut map);
                KExpr::Bitwise {
                    sreg,
                    dreg,
                    mask,
                    xor,
                }
            }
            KExpr::Lookup {
                set,
                sreg,
                dreg,
                flags,
            } => {
                let sreg = read(sreg, &map);
                let dreg = dreg.map(|d| write(d, data_len(&set), &mut map));
                KExpr::Lookup {
                    set,
                    sreg,
                    dreg,
                    flags,
                }
            }
            KExpr::ImmData { dreg, data } => KExpr::ImmData {
                dreg: write(dreg, data.len(), &mut map),
                data,
            },
            KExpr::Nat {
                kind,
                family,
                reg_addr,
                reg_proto,
            } => KExpr::Nat {
                kind,
                family,
                reg_addr: read(reg_addr, &map),
                reg_proto: reg_proto.map(|r| read(r, &map)),
            },
            KExpr::Redir { reg_proto } => KExpr::Redir {
                reg_proto: read(reg_proto, &map),
            },
            KExpr::Dynset { set, op, sreg_key } => KExpr::Dynset {
                set,
                op,
                sreg_key: read(sreg_key, &map),
            },
            // No register read or written: kept as they are. Named, not a catch-all, so
            // that a new expression kind does not compile until its registers are mapped.
            e @ (KExpr::ImmVerdict(_)
            | KExpr::Masq { .. }
            | KExpr::Reject { .. }
            | KExpr::Counter) => e,
        })
        .collect()
}

impl LiveTable {
    /// The data width of map `set` (its first element's; 0 for a plain set or none).
    pub fn data_len(&self, set: &str) -> usize {
        self.sets
            .get(set)
            .and_then(|s| {
                s.elements.values().find_map(|d| match d {
                    LiveData::Value(v) => Some(v.len()),
                    _ => None,
                })
            })
            .unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn payload(offset: u32, len: u32, dreg: u32) -> KExpr {
        KExpr::Payload {
            base: 1,
            offset,
            len,
            dreg,
        }
    }

    #[test]
    fn nft_and_our_prefix_matches_and_registers_compare_equal() {
        let none = |_: &str| 0;
        // ours: ip daddr != 127.0.0.0/8 as a 4-byte load, mask, compare
        let ours = vec![
            payload(16, 4, 8),
            KExpr::Bitwise {
                sreg: 8,
                dreg: 8,
                mask: vec![0xff, 0, 0, 0],
                xor: vec![0; 4],
            },
            KExpr::Cmp {
                sreg: 8,
                op: 1,
                data: vec![127, 0, 0, 0],
            },
            KExpr::ImmData {
                dreg: 8,
                data: vec![10, 0, 0, 1],
            },
            KExpr::ImmData {
                dreg: 9,
                data: vec![0x1f, 0x90],
            },
            KExpr::Nat {
                kind: 1,
                family: 2,
                reg_addr: 8,
                reg_proto: Some(9),
            },
        ];
        // nft: a 1-byte load, no mask; the port in the next 16-byte register
        let nft = vec![
            payload(16, 1, 8),
            KExpr::Cmp {
                sreg: 8,
                op: 1,
                data: vec![127],
            },
            KExpr::ImmData {
                dreg: 8,
                data: vec![10, 0, 0, 1],
            },
            KExpr::ImmData {
                dreg: 12,
                data: vec![0x1f, 0x90],
            },
            KExpr::Nat {
                kind: 1,
                family: 2,
                reg_addr: 8,
                reg_proto: Some(12),
            },
        ];
        assert_eq!(canonical_rule(&ours, &none), canonical_rule(&nft, &none));
        // a /12 keeps its partial mask
        let twelve = vec![
            payload(12, 4, 8),
            KExpr::Bitwise {
                sreg: 8,
                dreg: 8,
                mask: vec![0xff, 0xf0, 0, 0],
                xor: vec![0; 4],
            },
            KExpr::Cmp {
                sreg: 8,
                op: 0,
                data: vec![10, 16, 0, 0],
            },
        ];
        let c = canonical_rule(&twelve, &none);
        assert_eq!(c[0], payload(12, 2, 8));
        assert!(matches!(&c[1], KExpr::Bitwise { mask, .. } if mask == &vec![0xff, 0xf0]));
        // a different address still differs
        let mut other = nft.clone();
        other[1] = KExpr::Cmp {
            sreg: 8,
            op: 1,
            data: vec![10],
        };
        assert_ne!(canonical_rule(&ours, &none), canonical_rule(&other, &none));
    }

    /// A hash reads its key where it was loaded and writes its result: where a program put
    /// the key does not matter, its seed, modulus and offset do.
    #[test]
    fn hash_registers_are_renumbered_and_its_parameters_kept() {
        use crate::kernel::nft::{lower::lower, Expr, Family, Field};
        let rule = |seed| {
            lower(
                &[Expr::DnatHash {
                    key: vec![Field::Saddr, Field::Sport, Field::Daddr, Field::Dport],
                    modulus: 251,
                    seed,
                    offset: 1000,
                    map: "m".into(),
                }],
                Family::Ip,
            )
        };
        let ours = rule(7);
        // The same rule with the key four registers further on.
        let moved: Vec<KExpr> = ours
            .iter()
            .map(|e| match e.clone() {
                KExpr::Payload {
                    base,
                    offset,
                    len,
                    dreg,
                } => KExpr::Payload {
                    base,
                    offset,
                    len,
                    dreg: dreg + 4,
                },
                KExpr::Hash {
                    sreg,
                    dreg,
                    len,
                    modulus,
                    seed,
                    offset,
                } => KExpr::Hash {
                    sreg: sreg + 4,
                    dreg,
                    len,
                    modulus,
                    seed,
                    offset,
                },
                e => e,
            })
            .collect();
        assert_ne!(ours, moved);
        let len = |_: &str| 8;
        assert_eq!(canonical_rule(&ours, &len), canonical_rule(&moved, &len));
        assert_ne!(canonical_rule(&ours, &len), canonical_rule(&rule(8), &len));
    }
}
