//! Drift between the table a sync would program and the live one: each difference named,
//! and the operations that turn the live table into the plan, ordered so that the kernel
//! (or `nft -f`) takes them as one transaction. `status` reports the differences, `diff`
//! prints the operations. Pure.

use std::collections::{BTreeMap, BTreeSet};

use crate::kernel::nft::live::{
    canonical_rule, element_key, typed_key, LiveChain, LiveData, LiveRule, LiveSet, LiveTable,
};
use crate::kernel::nft::{render, Chain, ElemData, Element, Family, Rule, Set, Transaction};
use crate::proxy::ruleset::Ruleset;

/// How the live table differs from the plan.
#[derive(Debug, Clone)]
pub struct Drift {
    /// One line per difference, naming the chain, set or element.
    pub differences: Vec<String>,
    /// What makes the live table the plan.
    pub tx: Transaction,
}

impl Drift {
    pub fn in_sync(&self) -> bool {
        self.differences.is_empty()
    }
}

fn data_text(d: &LiveData) -> String {
    match d {
        LiveData::None => "member".into(),
        LiveData::Verdict(v) => render::verdict(v),
        LiveData::Value(v) => format!("{v:02x?}"),
    }
}

/// Compares `live` with `plan` (one family's table).
pub fn drift(plan: &Ruleset, live: &LiveTable) -> Drift {
    let planned = plan.as_live();
    let mut pass = Pass::new(plan, live, &planned);
    pass.table_missing();
    pass.sets_added();
    pass.chains_added();
    let adds = pass.elements_removed();
    pass.chains_refilled();
    pass.elements_added(adds);
    pass.chains_gone();
    pass.sets_gone();
    Drift {
        differences: pass.diffs,
        tx: pass.tx,
    }
}

/// One comparison: the plan (typed, and as the kernel lists it), the live table, and the
/// differences and operations found so far. The steps run in [`drift`]'s order, which is
/// the order the operations must have in one transaction.
struct Pass<'a> {
    plan: &'a Ruleset,
    live: &'a LiveTable,
    planned: &'a LiveTable,
    family: Family,
    typed_chains: BTreeMap<&'a str, &'a (Chain, Vec<Rule>)>,
    typed_sets: BTreeMap<&'a str, &'a Set>,
    typed_elements: BTreeMap<(&'a str, Vec<u8>), &'a Element>,
    diffs: Vec<String>,
    tx: Transaction,
}

impl<'a> Pass<'a> {
    fn new(plan: &'a Ruleset, live: &'a LiveTable, planned: &'a LiveTable) -> Pass<'a> {
        let family = plan.family();
        let tx = Transaction::new(family, plan.table.name.clone());
        let typed_chains: BTreeMap<&str, &(Chain, Vec<Rule>)> =
            plan.chains().map(|c| (c.0.name.as_str(), c)).collect();
        let typed_sets: BTreeMap<&str, &Set> = plan.sets().map(|s| (s.name.as_str(), s)).collect();
        let mut typed_elements: BTreeMap<(&str, Vec<u8>), &Element> = BTreeMap::new();
        for e in plan.elements() {
            if let Some(s) = planned.sets.get(&**e.set()) {
                typed_elements.insert((&**e.set(), element_key(e, s.key_len as usize)), e);
            }
        }
        Pass {
            plan,
            live,
            planned,
            family,
            typed_chains,
            typed_sets,
            typed_elements,
            diffs: Vec::new(),
            tx,
        }
    }

    fn table_missing(&mut self) {
        if self.live.chains.is_empty() && self.live.sets.is_empty() {
            self.diffs.push(format!(
                "table {} {}: missing or empty",
                self.family, self.plan.table.name
            ));
            self.tx.add(self.plan.table.clone());
        }
    }

    /// Sets the plan adds (a set of another type is reported: only a full sync recreates it).
    fn sets_added(&mut self) {
        for (name, ps) in &self.planned.sets {
            match self.live.sets.get(name) {
                None => {
                    self.diffs.push(format!("set {name}: missing"));
                    self.tx.add(self.typed_sets[name.as_str()].clone());
                }
                Some(ls)
                    if (ls.flags, ls.key_len, ls.timeout_ms)
                        != (ps.flags, ps.key_len, ps.timeout_ms) =>
                {
                    self.diffs.push(format!(
                        "set {name}: of another type (flags {:#x}, key {} bytes; planned {:#x}, {} bytes): a full sync recreates it",
                        ls.flags, ls.key_len, ps.flags, ps.key_len
                    ));
                }
                Some(_) => {}
            }
        }
    }

    /// Chains the plan adds (a chain hooked otherwise is reported: only a full sync
    /// recreates it).
    fn chains_added(&mut self) {
        for (name, pc) in &self.planned.chains {
            match self.live.chains.get(name) {
                None => {
                    self.diffs.push(format!("chain {name}: missing"));
                    self.tx.add(self.typed_chains[name.as_str()].0.clone());
                }
                Some(lc) if lc.base != pc.base => self.diffs.push(format!(
                    "chain {name}: hooked as {:?}, planned {:?}: a full sync recreates it",
                    lc.base, pc.base
                )),
                Some(_) => {}
            }
        }
    }

    /// Elements that go (or change data), before rules that stop using them; returns the
    /// elements to add, which wait until the rules are in.
    fn elements_removed(&mut self) -> Vec<(&'a str, Vec<u8>)> {
        let mut adds = Vec::new();
        for (name, ps) in &self.planned.sets {
            let Some(ls) = self.live.sets.get(name) else {
                adds.extend(ps.elements.keys().map(|k| (name.as_str(), k.clone())));
                continue;
            };
            // Sets with a timeout are the data path's (session affinity): never planned.
            if ps.timeout_ms.is_some() {
                continue;
            }
            let set = self.typed_sets[name.as_str()];
            element_changes(
                name,
                set,
                self.family,
                ls,
                ps,
                &mut self.diffs,
                &mut self.tx,
                &mut adds,
            );
        }
        adds
    }

    /// Chains whose rules differ: flushed and refilled; new chains filled.
    fn chains_refilled(&mut self) {
        for (name, pc) in &self.planned.chains {
            let (chain, rules) = self.typed_chains[name.as_str()];
            match self.live.chains.get(name) {
                None => {
                    for r in rules {
                        self.tx.add(r.clone());
                    }
                }
                Some(lc) => {
                    let Some(difference) = self.rules_difference(name, rules, lc, pc) else {
                        continue;
                    };
                    self.diffs.push(difference);
                    self.tx.flush(chain.clone());
                    for r in rules {
                        self.tx.add(r.clone());
                    }
                }
            }
        }
    }

    /// The line naming the first rule where the live chain `lc` leaves the planned `pc`,
    /// or `None` when their rules are the same.
    fn rules_difference(
        &self,
        name: &str,
        rules: &[Rule],
        lc: &LiveChain,
        pc: &LiveChain,
    ) -> Option<String> {
        let (live, planned, family) = (self.live, self.planned, self.family);
        let equal = |l: &LiveRule, p: &LiveRule| {
            l.comment == p.comment
                && match (&l.exprs, &p.exprs) {
                    (Ok(a), Ok(b)) => {
                        canonical_rule(a, &|s| live.data_len(s))
                            == canonical_rule(b, &|s| planned.data_len(s))
                    }
                    _ => false,
                }
        };
        let same = lc.rules.len() == pc.rules.len()
            && lc.rules.iter().zip(&pc.rules).all(|(l, p)| equal(l, p));
        if same {
            return None;
        }
        let at = lc
            .rules
            .iter()
            .zip(&pc.rules)
            .position(|(l, p)| !equal(l, p))
            .unwrap_or(lc.rules.len().min(pc.rules.len()));
        let what = match (lc.rules.get(at), pc.rules.get(at)) {
            (Some(r), _) if r.exprs.is_err() => format!(
                "rule handle {} is not one of ours ({})",
                r.handle,
                r.exprs.as_ref().err().map(String::as_str).unwrap_or("")
            ),
            (Some(r), Some(p)) => format!(
                "rule handle {} is not the planned `{}`{}",
                r.handle,
                render::rule_body(&rules[at], family),
                if r.comment != p.comment {
                    format!(" (comment {:?}, planned {:?})", r.comment, p.comment)
                } else {
                    String::new()
                }
            ),
            (Some(r), None) => format!("rule handle {} is extra", r.handle),
            (None, _) => "rules missing at the end".into(),
        };
        Some(format!(
            "chain {name}: {} rules, planned {}; from rule {}: {what}",
            lc.rules.len(),
            pc.rules.len(),
            at + 1
        ))
    }

    /// The elements [`Pass::elements_removed`] held back, once the rules are in.
    fn elements_added(&mut self, adds: Vec<(&'a str, Vec<u8>)>) {
        for (set, key) in adds {
            if let Some(e) = self.typed_elements.get(&(set, key)) {
                self.tx.add((*e).clone());
            }
        }
    }

    /// Chains the plan no longer has: all flushed first (they may jump to each other),
    /// then deleted.
    fn chains_gone(&mut self) {
        let gone: Vec<&String> = self
            .live
            .chains
            .keys()
            .filter(|n| !self.planned.chains.contains_key(*n))
            .collect();
        for name in &gone {
            self.diffs.push(format!("chain {name}: not in the plan"));
            self.tx.flush(Chain::regular((*name).clone()));
        }
        for name in &gone {
            self.tx.delete(Chain::regular((*name).clone()));
        }
    }

    /// Sets the plan no longer has, after the chains that used them.
    fn sets_gone(&mut self) {
        for (name, ls) in &self.live.sets {
            if !self.planned.sets.contains_key(name) {
                self.diffs.push(format!("set {name}: not in the plan"));
                let mut s = Set::plain(name.clone(), vec![]);
                s.map = ls.flags & crate::kernel::nft::uapi::NFT_SET_MAP != 0;
                self.tx.delete(s);
            }
        }
    }
}

/// Element differences of one set both sides have: deletes go into `tx` now, adds into
/// `adds` (made after the rules).
#[allow(clippy::too_many_arguments)]
fn element_changes<'a>(
    name: &'a str,
    set: &Set,
    family: crate::kernel::nft::Family,
    live: &LiveSet,
    planned: &LiveSet,
    diffs: &mut Vec<String>,
    tx: &mut Transaction,
    adds: &mut Vec<(&'a str, Vec<u8>)>,
) {
    let keys: BTreeSet<&Vec<u8>> = live
        .elements
        .keys()
        .chain(planned.elements.keys())
        .collect();
    let (mut missing, mut extra, mut changed) = (0, 0, 0);
    let mut first = None;
    for k in keys {
        let shown = || match typed_key(set, family, k) {
            Some(kv) => kv
                .iter()
                .map(|k| render::key_value(&k))
                .collect::<Vec<_>>()
                .join(" . "),
            None => format!("{k:02x?}"),
        };
        match (live.elements.get(k), planned.elements.get(k)) {
            (Some(l), Some(p)) if l == p => {}
            (Some(l), Some(p)) => {
                changed += 1;
                first.get_or_insert_with(|| {
                    format!(
                        "{} maps to {}, planned {}",
                        shown(),
                        data_text(l),
                        data_text(p)
                    )
                });
                delete_element(name, set, family, k, tx);
                adds.push((name, k.clone()));
            }
            (Some(_), None) => {
                extra += 1;
                first.get_or_insert_with(|| format!("{} is not in the plan", shown()));
                delete_element(name, set, family, k, tx);
            }
            (None, Some(_)) => {
                missing += 1;
                first.get_or_insert_with(|| format!("{} missing", shown()));
                adds.push((name, k.clone()));
            }
            (None, None) => {}
        }
    }
    if let Some(f) = first {
        diffs.push(format!(
            "set {name}: {missing} elements missing, {extra} not in the plan, {changed} with other data (e.g. {f})"
        ));
    }
}

fn delete_element(
    set_name: &str,
    set: &Set,
    family: crate::kernel::nft::Family,
    key: &[u8],
    tx: &mut Transaction,
) {
    if let Some(k) = typed_key(set, family, key) {
        tx.delete(Element::new(set_name.into(), k, ElemData::None, None));
    }
}
