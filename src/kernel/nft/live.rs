//! [`LiveTable`]: one table's content in the kernel's own terms (chains with their base
//! hooks, rules as kernel expressions with handles and comments, sets with their elements as
//! bytes), built either from a netlink dump of the live kernel or from a planned
//! [`Ruleset`] lowered the way the encoder lowers it. The same shape on both sides is what
//! lets `explain` trace the live kernel and `status`/`diff` compare it with a plan. Pure.

use std::collections::BTreeMap;

use super::decode::{ListedChain, ListedElement, ListedRule, ListedSet};
use super::lower::{key_bytes, lower, target_bytes, KExpr};
use super::{BaseChain, Element, Family, Rule, Set, Verdict};
use crate::proxy::ruleset::Ruleset;

/// A rule as the kernel holds it. `exprs` is `Err` with the reason when the kernel's
/// expressions could not be read (another program's rule in our table, an expression we
/// never write): such a rule is reported, never guessed at.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LiveRule {
    /// The kernel's handle (0 for a planned rule).
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
        for (s, elements) in sets.into_iter().filter(|(s, _)| s.table == name) {
            let elements = elements
                .into_iter()
                .map(|e| {
                    let data = match (e.verdict, e.value) {
                        (Some(v), _) => LiveData::Verdict(v),
                        (None, Some(v)) => LiveData::Value(v),
                        (None, None) => LiveData::None,
                    };
                    (e.key, data)
                })
                .collect();
            t.sets.insert(
                s.name,
                LiveSet {
                    flags: s.flags,
                    key_len: s.key_len,
                    timeout_ms: s.timeout_ms,
                    elements,
                },
            );
        }
        t
    }

    /// What the kernel would hold after a full sync of `rs` into an empty table (the
    /// elements of sets the data path fills excepted: those are never planned).
    pub fn planned(rs: &Ruleset) -> LiveTable {
        let family = rs.family();
        let mut t = LiveTable::empty(family, rs.table.name.clone());
        for (chain, rules) in rs.chains() {
            t.chains.insert(
                chain.name.clone(),
                LiveChain {
                    base: chain.base,
                    rules: rules.iter().map(|r| planned_rule(r, family)).collect(),
                },
            );
        }
        for s in rs.sets() {
            t.sets.insert(s.name.clone(), planned_set(s, family));
        }
        for e in rs.elements() {
            if let Some(s) = t.sets.get_mut(&e.set) {
                let (k, d) = planned_element(e, s.key_len as usize);
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
        comment: r.comment.clone(),
    }
}

fn planned_set(s: &Set, family: Family) -> LiveSet {
    use super::uapi::{NFT_SET_EVAL, NFT_SET_MAP, NFT_SET_TIMEOUT};
    let (flags, key_len) = if s.endpoints {
        (NFT_SET_MAP, 4)
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
    }
}

/// An element's key as the kernel stores it (`key_len` bytes: a lone 2-byte port is not
/// padded) and its data.
fn planned_element(e: &Element, key_len: usize) -> (Vec<u8>, LiveData) {
    let mut key = key_bytes(&e.key);
    key.truncate(key_len);
    let data = match (&e.verdict, &e.target) {
        (Some(v), _) => LiveData::Verdict(v.clone()),
        (None, Some(t)) => LiveData::Value(target_bytes(t)),
        (None, None) => LiveData::None,
    };
    (key, data)
}
