//! The planners: a [`Ruleset`] change as one [`Transaction`], a full sync ([`plan_full`]) or
//! only the changed fragments ([`plan_changes`]). Pure.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use crate::kernel::nft::{Chain, Element, Name, Op, Rule, Set, SharedElement, Transaction};
use crate::model::ServicePortName;
use crate::proxy::fxhash::{FxHashMap, FxHashSet};

use super::index::{key_of, owner_of, same_data, ElemKey};
use super::{Fragment, Ruleset};

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

/// Every element once (the one in force for its key, or one equal to it:
/// [`ElementIndex::sends`](super::index::ElementIndex::sends)), grouped by set, sets in name order
/// (consecutive elements of one set share a netlink message), and within a set in fragment
/// order: the base, then service ports by name. Deterministic without sorting by key, which
/// at 100k × 10 (2.2M elements, each comparison two pointer chases) was 4 s of a 17 s full
/// sync.
fn grouped_elements(rs: &Ruleset) -> Vec<Vec<&SharedElement>> {
    let mut index: FxHashMap<&str, usize> = FxHashMap::default();
    let mut groups: Vec<(&str, Vec<&SharedElement>)> = Vec::new();
    // A fragment's elements come in runs of one set: look the name up once per run.
    let mut last: Option<(&Name, usize)> = None;
    let mut sent = FxHashSet::default();
    for f in rs.fragments() {
        for e in &f.elements {
            if !rs.index.sends(e, &mut sent) {
                continue; // another contributor's copy, or another owner's data
            }
            let g = match last {
                Some((name, g)) if Name::ptr_eq(name, e.set()) => g,
                _ => {
                    let g = *index.entry(e.set()).or_insert_with(|| {
                        groups.push((e.set(), Vec::new()));
                        groups.len() - 1
                    });
                    last = Some((e.set(), g));
                    g
                }
            };
            groups[g].1.push(e);
        }
    }
    groups.sort_unstable_by(|a, b| a.0.cmp(b.0));
    groups.into_iter().map(|(_, v)| v).collect()
}

/// Plans a full sync: re-asserts everything in `next`, flushing what the kernel already has
/// (`existing`, listed once), and removes leftovers of an earlier run without deleting the
/// table, so established connections are untouched.
pub fn plan_full(next: &Ruleset, existing: Option<&Existing>, pending_deletes: &[String]) -> Plan {
    let mut tx = Transaction::new(next.family(), next.table.name.clone());
    tx.whole_table = true;
    // One operation per element, rule, chain and set (2.2M at 100k × 10): sized once.
    tx.ops
        .reserve(next.element_count() + next.rule_count() * 2 + 1024);
    let mut wanted_chains: BTreeMap<&str, &(Chain, Vec<Rule>)> = BTreeMap::new();
    for c in next.chains() {
        wanted_chains.insert(&c.0.name, c);
    }
    let wanted_sets: BTreeMap<&str, &Set> = next.sets().map(|s| (s.name.as_str(), s)).collect();
    for c in pending_deletes {
        if !wanted_chains.contains_key(c.as_str()) && existing.is_none_or(|e| e.chains.contains(c))
        {
            tx.delete(Chain::regular(c.clone()));
        }
    }
    tx.add(next.table.clone());
    for s in wanted_sets.values() {
        tx.add((*s).clone());
    }
    for (c, _) in wanted_chains.values() {
        tx.add(c.clone());
    }
    for (name, (chain, rules)) in &wanted_chains {
        if existing.is_some_and(|e| e.chains.contains(*name)) {
            tx.flush(chain.clone());
        }
        for r in rules {
            tx.add(r.clone());
        }
    }
    for (name, s) in &wanted_sets {
        // Dynamic (affinity) sets are filled by the data path: keep their entries.
        if s.timeout.is_none() && existing.is_some_and(|e| e.sets.contains(*name)) {
            tx.flush((*s).clone());
        }
    }
    for e in grouped_elements(next).into_iter().flatten() {
        tx.add(e.clone());
    }
    let mut stale_chains = Vec::new();
    if let Some(ex) = existing {
        for name in &ex.chains {
            if !wanted_chains.contains_key(name.as_str()) && !pending_deletes.contains(name) {
                tx.flush(Chain::regular(name.clone()));
                stale_chains.push(name.clone());
            }
        }
        for name in &ex.sets {
            if !wanted_sets.contains_key(name.as_str()) {
                tx.delete(Set::plain(name.clone(), vec![]));
            }
        }
    }
    Plan { tx, stale_chains }
}

/// One service port whose fragment changed: `old` is what was committed, `new` what is
/// wanted (`None`: absent).
#[derive(Debug, Clone)]
pub struct Change {
    pub name: ServicePortName,
    pub old: Option<Arc<Fragment>>,
    pub new: Option<Arc<Fragment>>,
}

/// Plans a partial sync from the committed `last` ruleset: the base fragment becomes
/// `new_base` and each [`Change`] replaces one service port's fragment. Only changed chains
/// are rewritten and only elements whose presence or data change are sent.
pub fn plan_changes(
    last: &Ruleset,
    new_base: &Arc<Fragment>,
    changes: &[Change],
    pending_deletes: &[String],
) -> Plan {
    let mut tx = Transaction::new(last.family(), last.table.name.clone());
    let empty = Fragment::default();
    let pairs = changed_pairs(last, new_base, changes, &empty);
    let new_chains: BTreeSet<&str> = pairs
        .iter()
        .flat_map(|(_, n)| n.chains.keys().map(String::as_str))
        .collect();
    for c in pending_deletes {
        if !new_chains.contains(c.as_str()) {
            tx.delete(Chain::regular(c.clone()));
        }
    }
    let stale = diff_chains_and_sets(&pairs, &mut tx);
    diff_elements(last, new_base, changes, &pairs, &mut tx);
    let mut names = Vec::new();
    for (name, chain) in stale.chains {
        if !new_chains.contains(name.as_str()) {
            tx.flush(chain);
            names.push(name);
        }
    }
    for s in stale.sets {
        tx.delete(s);
    }
    Plan {
        tx,
        stale_chains: names,
    }
}

/// Each changed fragment as (committed, wanted): the base when it changed, then each
/// service port's (an absent side is `empty`).
fn changed_pairs<'a>(
    last: &'a Ruleset,
    new_base: &'a Arc<Fragment>,
    changes: &'a [Change],
    empty: &'a Fragment,
) -> Vec<(&'a Fragment, &'a Fragment)> {
    let mut pairs: Vec<(&Fragment, &Fragment)> = Vec::new();
    if !Arc::ptr_eq(&last.base, new_base) && *last.base != **new_base {
        pairs.push((&last.base, new_base));
    }
    for c in changes {
        pairs.push((
            c.old.as_deref().unwrap_or(empty),
            c.new.as_deref().unwrap_or(empty),
        ));
    }
    pairs
}

/// What the changed fragments no longer define: flushed and deleted after everything else
/// in the batch (a chain only when no wanted fragment defines it again).
struct Stale {
    chains: Vec<(String, Chain)>,
    sets: Vec<Set>,
}

/// Chains and sets: new sets and chains added, a chain whose rules changed flushed and
/// refilled (all rule operations after every addition, so a jump never precedes its
/// target), and what went returned as [`Stale`].
fn diff_chains_and_sets(pairs: &[(&Fragment, &Fragment)], tx: &mut Transaction) -> Stale {
    let mut stale = Stale {
        chains: Vec::new(),
        sets: Vec::new(),
    };
    let mut rule_ops = Vec::new();
    for (old, new) in pairs {
        for (name, s) in &new.sets {
            if !old.sets.contains_key(name) {
                tx.add(s.clone());
            }
        }
        for (name, (chain, rules)) in &new.chains {
            match old.chains.get(name) {
                None => {
                    tx.add(chain.clone());
                    rule_ops.extend(rules.iter().map(|r| Op::Add(r.clone().into())));
                }
                Some((_, r)) if r == rules => {}
                Some(_) => {
                    rule_ops.push(Op::Flush(chain.clone().into()));
                    rule_ops.extend(rules.iter().map(|r| Op::Add(r.clone().into())));
                }
            }
        }
        for (name, (chain, _)) in &old.chains {
            if !new.chains.contains_key(name) {
                stale.chains.push((name.clone(), chain.clone()));
            }
        }
        for (name, s) in &old.sets {
            if !new.sets.contains_key(name) {
                stale.sets.push(s.clone());
            }
        }
    }
    tx.ops.extend(rule_ops);
    stale
}

/// Elements: per touched key, the element in force after the change
/// ([`element_in_force_after`]) against the one before; deletions go first, additions
/// after all of them (a key whose data changes is deleted and added again).
fn diff_elements(
    last: &Ruleset,
    new_base: &Arc<Fragment>,
    changes: &[Change],
    pairs: &[(&Fragment, &Fragment)],
    tx: &mut Transaction,
) {
    let mut overrides: BTreeMap<&ServicePortName, Option<&Fragment>> = BTreeMap::new();
    for c in changes {
        overrides.insert(&c.name, c.new.as_deref());
    }
    // (contributions removed, contributions added) per key.
    let mut delta: BTreeMap<ElemKey, (usize, Vec<&SharedElement>)> = BTreeMap::new();
    for (old, new) in pairs {
        for e in &old.elements {
            delta.entry(key_of(e)).or_default().0 += 1;
        }
        for e in &new.elements {
            delta.entry(key_of(e)).or_default().1.push(e);
        }
    }
    let mut adds = Vec::new();
    for (k, (removed, added)) in &delta {
        let before = last.index.get(k);
        let owner = || owner_of(new_base, &last.services, &overrides, k).0;
        let after = element_in_force_after(before, *removed, added, owner);
        match (before.map(|(e, _)| e), after) {
            (Some(b), None) => tx.delete(b.clone()),
            (None, Some(a)) => adds.push(a.clone()),
            (Some(b), Some(a)) if !same_data(a, b) => {
                tx.delete(b.clone());
                adds.push(a.clone());
            }
            _ => {}
        }
    }
    for a in adds {
        tx.add(a);
    }
}

/// Which element holds a shared key after a change: `before` is the element in force and
/// its [`Slot`] (contributors, whether they disagreed), `removed` how many contributions the
/// changed fragments took away, `added` those they add. When the contributors agree (one
/// owner, or several adding identical data such as a shared ClusterIP) the counts decide;
/// when they disagree, `owner` (the fixed owner order: base first, then the oldest Service)
/// does, a walk of every fragment adding the key.
///
/// | before | added | contributors left of the old | in force after |
/// |---|---|---|---|
/// | disagreeing (`mixed`) | any | any | `owner()` |
/// | any | none | some | the one before |
/// | any | none | none | none: deleted |
/// | present | some, all agreeing with it | some | the one before |
/// | present | some, one differing | some | `owner()` |
/// | any | some, all agreeing | none (or none before) | the first added |
/// | any | some, disagreeing | none (or none before) | `owner()` |
fn element_in_force_after<'a>(
    before: Option<(&'a SharedElement, super::index::Slot)>,
    removed: usize,
    added: &[&'a SharedElement],
    owner: impl FnOnce() -> Option<&'a SharedElement>,
) -> Option<&'a SharedElement> {
    let before_el = before.map(|(e, _)| e);
    let remaining = before
        .map_or(0, |(_, s)| s.count as usize)
        .saturating_sub(removed);
    let agree = |e: &&SharedElement, with: &Element| same_data(e, with);
    match (before, added.first()) {
        (Some((_, s)), _) if s.mixed => owner(),
        (_, None) if remaining > 0 => before_el,
        (_, None) => None,
        (Some(_), Some(_)) if remaining > 0 => {
            if before_el.is_some_and(|b| added.iter().all(|e| agree(e, b))) {
                before_el
            } else {
                owner()
            }
        }
        (_, Some(first)) => {
            if added.iter().all(|e| agree(e, first)) {
                Some(*first)
            } else {
                owner()
            }
        }
    }
}

/// Plans the transaction from `prev` to `next` (a full sync when `prev` is `None`), finding
/// changed fragments by comparison. The syncer uses [`plan_changes`] directly with the
/// changes it already knows.
pub fn plan_transaction(
    prev: Option<&Ruleset>,
    next: &Ruleset,
    existing: Option<&Existing>,
    pending_deletes: &[String],
) -> Plan {
    let Some(prev) = prev else {
        return plan_full(next, existing, pending_deletes);
    };
    let keys: BTreeSet<&ServicePortName> =
        prev.services.keys().chain(next.services.keys()).collect();
    let changes: Vec<Change> = keys
        .into_iter()
        .filter_map(|k| {
            let (o, n) = (prev.services.get(k), next.services.get(k));
            let same = match (o, n) {
                (Some(a), Some(b)) => Arc::ptr_eq(a, b) || a == b,
                (None, None) => true,
                _ => false,
            };
            (!same).then(|| Change {
                name: k.clone(),
                old: o.cloned(),
                new: n.cloned(),
            })
        })
        .collect();
    plan_changes(prev, &next.base, &changes, pending_deletes)
}
