//! [`Ruleset`]: the complete desired content of one of our tables, and the pure diff that
//! turns (what we last committed, what we want) into one [`Transaction`]. Partial syncs come
//! from here: only chains whose rules changed are rewritten and only changed map elements
//! are sent, without listing the table back.

use std::collections::{BTreeMap, BTreeSet};

use crate::nft::{Chain, Element, Family, KeyValue, Rule, Set, Table, Transaction};

/// The full desired content of one table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ruleset {
    pub table: Table,
    pub chains: BTreeMap<String, (Chain, Vec<Rule>)>,
    pub sets: BTreeMap<String, Set>,
    pub elements: BTreeMap<String, BTreeMap<Vec<KeyValue>, Element>>,
}

impl Ruleset {
    pub fn new(table: Table) -> Ruleset {
        Ruleset {
            table,
            chains: BTreeMap::new(),
            sets: BTreeMap::new(),
            elements: BTreeMap::new(),
        }
    }
    pub fn family(&self) -> Family {
        self.table.family
    }
    /// Adds a chain with its rules (replacing any earlier definition).
    pub fn chain(&mut self, chain: Chain, rules: Vec<Rule>) {
        self.chains.insert(chain.name.clone(), (chain, rules));
    }
    pub fn set(&mut self, set: Set) {
        self.elements.entry(set.name.clone()).or_default();
        self.sets.insert(set.name.clone(), set);
    }
    pub fn element(&mut self, e: Element) {
        self.elements
            .entry(e.set.clone())
            .or_default()
            .insert(e.key.clone(), e);
    }
    /// Total number of rules (for logs and metrics).
    pub fn rule_count(&self) -> usize {
        self.chains.values().map(|(_, r)| r.len()).sum()
    }
    pub fn element_count(&self) -> usize {
        self.elements.values().map(|m| m.len()).sum()
    }
}

/// Names that exist in the kernel table (listed at a full sync only).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Existing {
    pub chains: BTreeSet<String>,
    pub sets: BTreeSet<String>,
}

/// A planned transaction and the chains it left flushed but not yet deleted.
#[derive(Debug, Clone)]
pub struct Plan {
    pub tx: Transaction,
    /// Chains that are now unreferenced and empty. Deleting them in the same batch that drops
    /// their last reference fails on kernels before 6.2, so the next sync deletes them (as
    /// upstream does).
    pub stale_chains: Vec<String>,
}

fn rules_of(tx: &mut Transaction, rules: &[Rule]) {
    for r in rules {
        tx.add(r.clone());
    }
}

/// Plans the transaction that takes the kernel from `prev` (what we last committed; `None`
/// for a full sync, which re-asserts everything) to `next`. `existing` lists what the kernel
/// holds at a full sync, so leftovers from an earlier run are removed; `pending_deletes` are
/// chains flushed by the previous sync.
pub fn plan_transaction(
    prev: Option<&Ruleset>,
    next: &Ruleset,
    existing: Option<&Existing>,
    pending_deletes: &[String],
) -> Plan {
    let mut tx = Transaction::new(next.family(), next.table.name.clone());
    // 1. Chains flushed last time and still unwanted.
    for c in pending_deletes {
        if !next.chains.contains_key(c) {
            tx.delete(Chain::regular(c.clone()));
        }
    }
    let full = prev.is_none();
    if full {
        tx.add(next.table.clone());
    }
    // 2. Sets and chains first: rules and elements refer to them.
    for (name, s) in &next.sets {
        if full || !prev.is_some_and(|p| p.sets.contains_key(name)) {
            tx.add(s.clone());
        }
    }
    for (name, (chain, _)) in &next.chains {
        if full || !prev.is_some_and(|p| p.chains.contains_key(name)) {
            tx.add(chain.clone());
        }
    }
    // 3. Rules of new or changed chains.
    for (name, (chain, rules)) in &next.chains {
        match prev.and_then(|p| p.chains.get(name)) {
            None if !full => rules_of(&mut tx, rules),
            Some((_, old)) if old == rules => {}
            // A full sync flushes only chains the kernel already has; new ones are empty.
            None if !existing.is_some_and(|e| e.chains.contains(name)) => rules_of(&mut tx, rules),
            _ => {
                tx.flush(chain.clone());
                rules_of(&mut tx, rules);
            }
        }
    }
    // 4. Elements: a full sync flushes our static sets and refills them; a partial one sends
    // the difference. Changed elements are deleted and re-added (the kernel refuses to
    // change an existing element's data in place).
    let empty = BTreeMap::new();
    for (set_name, want) in &next.elements {
        let Some(set) = next.sets.get(set_name) else {
            continue;
        };
        if set.timeout.is_some() {
            continue; // dynamic (affinity) sets are filled by the data path
        }
        let have = match prev {
            None => {
                if existing.is_some_and(|e| e.sets.contains(set_name)) {
                    tx.flush(set.clone());
                }
                &empty
            }
            Some(p) => p.elements.get(set_name).unwrap_or(&empty),
        };
        for (k, e) in have {
            match want.get(k) {
                Some(n) if n == e => {}
                _ => tx.delete(e.clone()),
            }
        }
        for (k, e) in want {
            if have.get(k) != Some(e) {
                tx.add(e.clone());
            }
        }
    }
    // 5. What is no longer wanted: flush stale chains (delete them next time), delete
    // stale sets.
    let mut stale_chains = Vec::new();
    let mut stale_sets = BTreeSet::new();
    if let Some(p) = prev {
        for (name, (chain, _)) in &p.chains {
            if !next.chains.contains_key(name) {
                tx.flush(chain.clone());
                stale_chains.push(name.clone());
            }
        }
        for name in p.sets.keys() {
            if !next.sets.contains_key(name) {
                stale_sets.insert(name.clone());
            }
        }
    }
    if let Some(ex) = existing {
        for name in &ex.chains {
            if !next.chains.contains_key(name) && !pending_deletes.contains(name) {
                tx.flush(Chain::regular(name.clone()));
                stale_chains.push(name.clone());
            }
        }
        for name in &ex.sets {
            if !next.sets.contains_key(name) {
                stale_sets.insert(name.clone());
            }
        }
    }
    for name in stale_sets {
        let mut s = Set::plain(name, vec![]);
        s.map = false;
        tx.delete(s);
    }
    Plan { tx, stale_chains }
}
