//! [`Ruleset`]: the desired content of one of our tables, kept as a base [`Fragment`] plus one
//! fragment per service port, and the pure planners that turn a change into one
//! [`Transaction`]. A partial sync touches only the fragments that changed: its planning and
//! kernel cost follow the change, not the cluster size, and it never lists the table.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use crate::kernel::nft::{
    Chain, Element, Family, Key, Name, Op, Rule, Set, SharedElement, Table, Transaction,
};
use crate::model::ServicePortName;
use crate::proxy::fxhash::{FxHashMap, FxHashSet};

/// The objects one service port (or the static base) contributes.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Fragment {
    pub chains: BTreeMap<String, (Chain, Vec<Rule>)>,
    pub sets: BTreeMap<String, Set>,
    /// Elements of shared sets and maps (several fragments may add the same key). Shared
    /// (`Arc`) with the ruleset's index, so each element is held once: at 10k Services
    /// × 10 endpoints that is ~250k elements, which the index used to copy.
    pub elements: Vec<SharedElement>,
    /// The owning Service's creation time (Unix seconds): of two service ports that add the
    /// same key with different data, the older one's element is in force.
    pub created: Option<i64>,
}

impl Fragment {
    /// Adds a chain with its rules (replacing any earlier definition).
    pub fn chain(&mut self, chain: Chain, rules: Vec<Rule>) {
        self.chains.insert(chain.name.clone(), (chain, rules));
    }
    pub fn set(&mut self, set: Set) {
        self.sets.insert(set.name.clone(), set);
    }
    pub fn element(&mut self, e: Element) {
        self.elements.push(SharedElement::new(e));
    }
}

/// An element by its set and key: the element itself, compared and hashed on those two
/// (no copy of the set name and key per entry).
#[derive(Debug, Clone)]
struct ElemKey(SharedElement);

impl ElemKey {
    fn parts(&self) -> (&str, &Key) {
        (self.0.set(), &self.0.key)
    }
}

impl PartialEq for ElemKey {
    fn eq(&self, o: &Self) -> bool {
        // One element is its own key: a fragment's element looked up in the index usually
        // finds itself, without reading the set name or key.
        SharedElement::ptr_eq(&self.0, &o.0) || self.parts() == o.parts()
    }
}
impl Eq for ElemKey {}
impl std::hash::Hash for ElemKey {
    /// The set name's bytes, then the key's packed bytes and kinds in two writes: equal
    /// keys hash equally, and a 100k × 10 full sync (2.2M keys, each hashed at least twice)
    /// spent 1.7 s in a derived hash's many small writes (discriminants, lengths).
    fn hash<H: std::hash::Hasher>(&self, h: &mut H) {
        h.write(self.0.set().as_bytes());
        let (bytes, kinds) = self.0.key.packed();
        h.write(bytes);
        h.write_u16(kinds);
    }
}
impl PartialOrd for ElemKey {
    fn partial_cmp(&self, o: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(o))
    }
}
impl Ord for ElemKey {
    fn cmp(&self, o: &Self) -> std::cmp::Ordering {
        self.parts().cmp(&o.parts())
    }
}

/// The full desired content of one table.
#[derive(Debug, Clone)]
pub struct Ruleset {
    pub table: Table,
    pub base: Arc<Fragment>,
    pub services: BTreeMap<ServicePortName, Arc<Fragment>>,
    /// Every element key, held by the element in force for it, with the fragments'
    /// contribution to it.
    index: ElementIndex,
    rules: usize,
}

impl PartialEq for Ruleset {
    fn eq(&self, o: &Self) -> bool {
        self.table == o.table && self.base == o.base && self.services == o.services
    }
}

fn rules_in(f: &Fragment) -> usize {
    f.chains.values().map(|(_, r)| r.len()).sum()
}

fn key_of(e: &SharedElement) -> ElemKey {
    ElemKey(e.clone())
}

/// What the fragments say about one element key: how many add it, and whether they
/// disagree about its data (two Services claiming one address and port). The element in
/// force is the index entry's key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Slot {
    count: u32,
    mixed: bool,
}

impl Slot {
    /// One contributor, so nothing to disagree about: most keys (an endpoint's slot in its
    /// balance map, a ClusterIP).
    const ONE: Slot = Slot {
        count: 1,
        mixed: false,
    };
}

/// Every element key once, held by the element in force for it, and its [`Slot`] where that
/// is not [`Slot::ONE`]. Most keys have one contributor: a set of pointers for all keys (8
/// bytes an entry) and a small map for the rest, where one map of key to slot took 16 bytes
/// an entry. At 100k × 10's 2.2M keys that map had 4M buckets of 17 bytes (71 MiB); the set's
/// are 9 bytes (38 MiB; issue #18).
#[derive(Debug, Clone, Default)]
struct ElementIndex {
    keys: FxHashSet<ElemKey>,
    /// Keys with more than one contributor, or whose contributors disagree.
    shared: FxHashMap<ElemKey, Slot>,
}

impl ElementIndex {
    fn reserve(&mut self, n: usize) {
        self.keys.reserve(n);
    }
    fn len(&self) -> usize {
        self.keys.len()
    }
    fn elements(&self) -> impl Iterator<Item = &Element> {
        self.keys.iter().map(|k| &*k.0)
    }
    /// The element in force for `k`.
    fn in_force(&self, k: &ElemKey) -> Option<&SharedElement> {
        self.keys.get(k).map(|k| &k.0)
    }
    /// The element in force for `k`, with what the fragments say about it.
    fn get(&self, k: &ElemKey) -> Option<(&SharedElement, Slot)> {
        let in_force = self.in_force(k)?;
        let slot = match self.shared.is_empty() {
            true => Slot::ONE,
            false => self.shared.get(k).copied().unwrap_or(Slot::ONE),
        };
        Some((in_force, slot))
    }
    /// One more contributor of `e`'s key: whether its contributors (may) disagree now.
    fn add(&mut self, e: &SharedElement) -> bool {
        let k = key_of(e);
        let Some(in_force) = self.keys.get(&k) else {
            self.keys.insert(k);
            return false;
        };
        let differs = !same_data(&in_force.0, e);
        let slot = self.shared.entry(k).or_insert(Slot::ONE);
        slot.count += 1;
        slot.mixed || differs
    }
    /// Records `slot` for `k`, an indexed key: with no contributor left the key goes.
    fn set_slot(&mut self, k: &ElemKey, slot: Slot) {
        if slot.count == 0 {
            self.keys.remove(k);
            self.shared.remove(k);
        } else if slot == Slot::ONE {
            self.shared.remove(k);
        } else if let Some(s) = self.shared.get_mut(k) {
            *s = slot;
        } else {
            self.shared.insert(k.clone(), slot);
        }
    }
    /// Makes `el` the element in force for its key, an indexed one, with `slot`.
    fn rekey(&mut self, el: SharedElement, slot: Slot) {
        let k = ElemKey(el);
        self.keys.replace(k.clone());
        self.set_slot(&k, slot);
    }
}

/// Whether two elements of one key carry the same data.
fn same_data(a: &Element, b: &Element) -> bool {
    a.same_data(b)
}

/// The element in force for `k` when fragments disagree: the first contributor in a fixed
/// order, the base first, then service ports by the oldest Service creation time (ports
/// without one after those with one), then namespace, name, port name and protocol, so the
/// owner of a shared key never depends on the order of events; `overrides` replaces (or
/// with `None` removes) service ports' fragments. The scan is over every fragment, but it
/// only runs for keys that two contributors disagree about.
fn owner_of<'a>(
    base: &'a Fragment,
    services: &'a BTreeMap<ServicePortName, Arc<Fragment>>,
    overrides: &BTreeMap<&'a ServicePortName, Option<&'a Fragment>>,
    k: &ElemKey,
) -> (Option<&'a SharedElement>, bool) {
    let matches = |f: &'a Fragment| {
        f.elements
            .iter()
            .filter(move |e| (&**e.set(), &e.key) == k.parts())
    };
    let mut names: BTreeSet<&ServicePortName> = services.keys().collect();
    names.extend(overrides.keys().copied());
    let mut ordered: Vec<(&ServicePortName, &'a Fragment)> = names
        .into_iter()
        .filter_map(|n| {
            let f = match overrides.get(n) {
                Some(o) => *o,
                None => services.get(n).map(|f| &**f),
            }?;
            Some((n, f))
        })
        .collect();
    // stable: equal creation times keep the name order
    ordered.sort_by_key(|(_, f)| (f.created.is_none(), f.created));
    let frags = std::iter::once(Some(base)).chain(ordered.into_iter().map(|(_, f)| Some(f)));
    let mut all = frags.flatten().flat_map(matches);
    let first = all.next();
    let mixed = first.is_some_and(|f| all.any(|e| !same_data(e, f)));
    (first, mixed)
}

impl Ruleset {
    /// The table as the kernel would hold it after a full sync into an empty one, in the
    /// kernel's own terms (what `status` and `diff` compare the live table with).
    pub fn as_live(&self) -> crate::kernel::nft::live::LiveTable {
        crate::kernel::nft::live::LiveTable::from_typed(
            self.family(),
            &self.table.name,
            self.chains(),
            self.sets(),
            self.elements(),
        )
    }

    pub fn new(table: Table, base: Fragment) -> Ruleset {
        let mut rs = Ruleset {
            table,
            base: Arc::new(Fragment::default()),
            services: BTreeMap::new(),
            index: ElementIndex::default(),
            rules: 0,
        };
        rs.set_base(Arc::new(base));
        rs
    }
    /// A ruleset of `base` and every service port's fragment at once: the index sized once
    /// and the name map built in one pass, where adding the fragments one by one regrew the
    /// index ~20 times (each time hashing every key again) and searched the map for each:
    /// 2.6 of the 3.6 s of building a 100k × 10 ruleset.
    pub fn with_services(
        table: Table,
        base: Fragment,
        services: impl IntoIterator<Item = (ServicePortName, Arc<Fragment>)>,
    ) -> Ruleset {
        let mut rs = Ruleset::new(table, base);
        // One fragment per name (the last, as with `set_service`); the map's keys are unique.
        let services: BTreeMap<ServicePortName, Arc<Fragment>> = services.into_iter().collect();
        rs.index
            .reserve(services.values().map(|f| f.elements.len()).sum());
        let mut dirty = Vec::new();
        for f in services.values() {
            rs.add_refs(f, &mut dirty);
            rs.rules += rules_in(f);
        }
        // Owners of disputed keys are settled over every fragment: all of them in place.
        rs.services = services;
        rs.settle(dirty);
        rs
    }
    pub fn family(&self) -> Family {
        self.table.family
    }
    fn add_refs(&mut self, f: &Fragment, dirty: &mut Vec<ElemKey>) {
        for e in &f.elements {
            if self.index.add(e) {
                dirty.push(key_of(e));
            }
        }
    }
    fn drop_refs(&mut self, f: &Fragment, dirty: &mut Vec<ElemKey>) {
        for e in &f.elements {
            let k = key_of(e);
            if let Some((_, slot)) = self.index.get(&k) {
                let left = Slot {
                    count: slot.count - 1,
                    ..slot
                };
                self.index.set_slot(&k, left);
                if left.count > 0 && left.mixed {
                    dirty.push(k);
                }
            }
        }
    }
    /// Re-decides the element in force for keys whose contributors disagree.
    fn settle(&mut self, mut dirty: Vec<ElemKey>) {
        dirty.sort();
        dirty.dedup();
        for k in dirty {
            let (first, mixed) = owner_of(&self.base, &self.services, &BTreeMap::new(), &k);
            // The entry is keyed by the element in force: re-keyed by the new owner's (no
            // owner left: the key goes).
            if let (Some(el), Some((_, slot))) = (first.cloned(), self.index.get(&k)) {
                self.index.rekey(el, Slot { mixed, ..slot });
            }
        }
    }
    pub fn set_base(&mut self, base: Arc<Fragment>) {
        let mut dirty = Vec::new();
        let old = std::mem::replace(&mut self.base, base.clone());
        self.drop_refs(&old, &mut dirty);
        self.rules -= rules_in(&old);
        self.add_refs(&base, &mut dirty);
        self.rules += rules_in(&base);
        self.settle(dirty);
    }
    /// Sets (or with `None` removes) one service port's fragment.
    pub fn set_service(&mut self, name: &ServicePortName, frag: Option<Arc<Fragment>>) {
        let mut dirty = Vec::new();
        // A changed fragment replaces the old one in its place: removing and inserting it
        // split the bulk-built map's full nodes, one more node for every ~6 changed service
        // ports until the map had doubled (+0.7 MiB at 10k × 10 over the churn row).
        let old = match (&frag, self.services.get_mut(name)) {
            (Some(f), Some(slot)) => Some(std::mem::replace(slot, f.clone())),
            (Some(f), None) => {
                self.services.insert(name.clone(), f.clone());
                None
            }
            (None, _) => self.services.remove(name),
        };
        if let Some(old) = old {
            self.drop_refs(&old, &mut dirty);
            self.rules -= rules_in(&old);
        }
        if let Some(f) = frag {
            self.add_refs(&f, &mut dirty);
            self.rules += rules_in(&f);
        }
        self.settle(dirty);
    }
    fn fragments(&self) -> impl Iterator<Item = &Fragment> {
        std::iter::once(&*self.base).chain(self.services.values().map(|f| &**f))
    }
    /// Every chain with its rules.
    pub fn chains(&self) -> impl Iterator<Item = &(Chain, Vec<Rule>)> {
        self.fragments().flat_map(|f| f.chains.values())
    }
    /// Every set and map.
    pub fn sets(&self) -> impl Iterator<Item = &Set> {
        self.fragments().flat_map(|f| f.sets.values())
    }
    /// Every element, once.
    pub fn elements(&self) -> impl Iterator<Item = &Element> {
        self.index.elements()
    }
    pub fn has_chain(&self, name: &str) -> bool {
        self.chains().any(|(c, _)| c.name == name)
    }
    pub fn rule_count(&self) -> usize {
        self.rules
    }
    pub fn element_count(&self) -> usize {
        self.index.len()
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

/// Every element once (the one in force for its key), grouped by set, sets in name order
/// (consecutive elements of one set share a netlink message), and within a set in fragment
/// order: the base, then service ports by name. Deterministic without sorting by key, which
/// at 100k × 10 (2.2M elements, each comparison two pointer chases) was 4 s of a 17 s full
/// sync.
fn grouped_elements(rs: &Ruleset) -> Vec<Vec<&SharedElement>> {
    let mut index: FxHashMap<&str, usize> = FxHashMap::default();
    let mut groups: Vec<(&str, Vec<&SharedElement>)> = Vec::new();
    // A fragment's elements come in runs of one set: look the name up once per run.
    let mut last: Option<(&Name, usize)> = None;
    for f in rs.fragments() {
        for e in &f.elements {
            let in_force = rs
                .index
                .in_force(&key_of(e))
                .is_some_and(|k| SharedElement::ptr_eq(k, e));
            if !in_force {
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
    let mut pairs: Vec<(&Fragment, &Fragment)> = Vec::new();
    if !Arc::ptr_eq(&last.base, new_base) && *last.base != **new_base {
        pairs.push((&last.base, new_base));
    }
    for c in changes {
        pairs.push((
            c.old.as_deref().unwrap_or(&empty),
            c.new.as_deref().unwrap_or(&empty),
        ));
    }
    let new_chains: BTreeSet<&str> = pairs
        .iter()
        .flat_map(|(_, n)| n.chains.keys().map(String::as_str))
        .collect();
    for c in pending_deletes {
        if !new_chains.contains(c.as_str()) {
            tx.delete(Chain::regular(c.clone()));
        }
    }
    let mut stale_chains = Vec::new();
    let mut stale_sets = Vec::new();
    let mut rule_ops = Vec::new();
    for (old, new) in &pairs {
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
                stale_chains.push((name.clone(), chain.clone()));
            }
        }
        for (name, s) in &old.sets {
            if !new.sets.contains_key(name) {
                stale_sets.push(s.clone());
            }
        }
    }
    tx.ops.extend(rule_ops);
    // Elements: per touched key, the contributors after the change. When they agree (the
    // usual case: one owner, or several adding identical data such as a shared ClusterIP)
    // the answer follows from the counts; when they disagree, the fixed owner order decides.
    let mut overrides: BTreeMap<&ServicePortName, Option<&Fragment>> = BTreeMap::new();
    for c in changes {
        overrides.insert(&c.name, c.new.as_deref());
    }
    // (contributions removed, contributions added) per key.
    let mut delta: BTreeMap<ElemKey, (usize, Vec<&SharedElement>)> = BTreeMap::new();
    for (old, new) in &pairs {
        for e in &old.elements {
            delta.entry(key_of(e)).or_default().0 += 1;
        }
        for e in &new.elements {
            delta.entry(key_of(e)).or_default().1.push(e);
        }
    }
    let mut adds = Vec::new();
    for (k, (removed, added)) in &delta {
        let (before_el, before) = match last.index.get(k) {
            Some((in_force, s)) => (Some(in_force), Some(s)),
            None => (None, None),
        };
        let remaining = before
            .map_or(0, |s| s.count as usize)
            .saturating_sub(*removed);
        let agree = |e: &&SharedElement, with: &Element| same_data(e, with);
        let after_el: Option<&SharedElement> = match (before, added.first()) {
            (Some(s), _) if s.mixed => owner_of(new_base, &last.services, &overrides, k).0,
            (_, None) if remaining > 0 => before_el,
            (_, None) => None,
            (Some(_), Some(_)) if remaining > 0 => {
                if before_el.is_some_and(|b| added.iter().all(|e| agree(e, b))) {
                    before_el
                } else {
                    owner_of(new_base, &last.services, &overrides, k).0
                }
            }
            (_, Some(first)) => {
                if added.iter().all(|e| agree(e, first)) {
                    Some(*first)
                } else {
                    owner_of(new_base, &last.services, &overrides, k).0
                }
            }
        };
        match (before_el, after_el) {
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
    let mut names = Vec::new();
    for (name, chain) in stale_chains {
        if !new_chains.contains(name.as_str()) {
            tx.flush(chain);
            names.push(name);
        }
    }
    for s in stale_sets {
        tx.delete(s);
    }
    Plan {
        tx,
        stale_chains: names,
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

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::kernel::nft::{ElemData, Expr, Field, KeyValue, Verdict};
    use crate::model::Protocol;

    pub(crate) fn spn(name: &str) -> ServicePortName {
        ServicePortName {
            namespace: "ns".into(),
            name: name.into(),
            port: "p".into(),
            protocol: Protocol::Tcp,
        }
    }

    /// A base with a dispatch chain and one set of service addresses.
    pub(crate) fn base() -> Fragment {
        let mut f = Fragment::default();
        f.chain(
            Chain::regular("services"),
            vec![Rule::new("services", vec![Expr::Verdict(Verdict::Accept)])],
        );
        f.set(Set::plain("ips", vec![Field::Daddr]));
        f
    }

    pub(crate) fn element(addr: &str) -> Element {
        Element::new(
            "ips".into(),
            vec![KeyValue::Addr(addr.parse().unwrap())],
            ElemData::None,
            None,
        )
    }

    /// A service port: its own chain and its address in the shared set.
    pub(crate) fn service(name: &str, addr: &str) -> Arc<Fragment> {
        let mut f = Fragment::default();
        let chain = format!("svc-{name}");
        f.chain(
            Chain::regular(&chain),
            vec![Rule::new(&chain, vec![Expr::Reject])],
        );
        f.element(element(addr));
        Arc::new(f)
    }

    pub(crate) fn ruleset(services: &[(&str, &str)]) -> Ruleset {
        let table = Table {
            family: Family::Ip,
            name: "t".into(),
            comment: None,
        };
        let mut rs = Ruleset::new(table, base());
        for (n, a) in services {
            rs.set_service(&spn(n), Some(service(n, a)));
        }
        rs
    }

    #[test]
    fn the_index_shares_each_element_with_its_fragment() {
        // Memory: an element lives once, in its fragment; the index points at it.
        let rs = ruleset(&[("a", "10.0.0.1"), ("b", "10.0.0.2")]);
        for (name, f) in &rs.services {
            let e = &f.elements[0];
            let in_force = rs.index.in_force(&key_of(e)).expect("indexed");
            assert!(
                SharedElement::ptr_eq(in_force, e),
                "{name}: a copy, not the fragment's element"
            );
        }
        assert_eq!(rs.element_count(), 2);
    }

    fn verbs(tx: &Transaction) -> Vec<String> {
        tx.ops
            .iter()
            .map(|o| format!("{} {}", o.verb(), o.object().describe()))
            .collect()
    }

    #[test]
    fn an_element_two_fragments_add_stays_until_both_are_gone() {
        let mut rs = ruleset(&[("a", "10.0.0.1"), ("b", "10.0.0.1")]);
        assert_eq!(rs.element_count(), 1);
        assert_eq!(rs.rule_count(), 3);
        let prev = rs.clone();
        rs.set_service(&spn("a"), None);
        let p = plan_transaction(Some(&prev), &rs, None, &[]);
        assert!(
            !verbs(&p.tx).iter().any(|v| v.starts_with("delete element")),
            "b still adds the element: {:?}",
            verbs(&p.tx)
        );
        assert_eq!(
            p.stale_chains,
            ["svc-a"],
            "a's chain is flushed, deleted next time"
        );
        let prev = rs.clone();
        rs.set_service(&spn("b"), None);
        let p = plan_transaction(Some(&prev), &rs, None, &[]);
        assert!(verbs(&p.tx).contains(&"delete element of ips".to_string()));
        assert_eq!(rs.element_count(), 0);
    }

    #[test]
    fn the_index_keeps_counts_only_for_keys_with_several_contributors() {
        let mut rs = ruleset(&[("a", "10.0.0.1"), ("b", "10.0.0.1"), ("c", "10.0.0.2")]);
        assert_eq!(rs.element_count(), 2);
        let shared_key = key_of(&rs.services[&spn("a")].elements[0]);
        let own_key = key_of(&rs.services[&spn("c")].elements[0]);
        assert_eq!(
            rs.index.shared.len(),
            1,
            "only 10.0.0.1 has two contributors"
        );
        assert_eq!(rs.index.get(&shared_key).unwrap().1.count, 2);
        assert_eq!(rs.index.get(&own_key).unwrap().1, Slot::ONE);
        rs.set_service(&spn("b"), None);
        assert!(rs.index.shared.is_empty(), "back to one contributor");
        assert_eq!(rs.index.get(&shared_key).unwrap().1, Slot::ONE);
        // Two owners that disagree: counted and marked until one is left.
        let mut rs = ruleset(&[]);
        rs.set_service(&spn("a"), Some(claim("a", "1.2.3.4")));
        rs.set_service(&spn("b"), Some(claim("b", "1.2.3.4")));
        // Each claim adds the address to `ips` (the same data) and to `vm` (its own chain).
        let k = key_of(&rs.services[&spn("a")].elements[1]);
        let (in_force, slot) = rs.index.get(&k).unwrap();
        assert!(SharedElement::ptr_eq(
            in_force,
            &rs.services[&spn("a")].elements[1]
        ));
        assert_eq!((slot.count, slot.mixed), (2, true));
        rs.set_service(&spn("a"), None);
        let (in_force, slot) = rs.index.get(&k).unwrap();
        assert!(SharedElement::ptr_eq(
            in_force,
            &rs.services[&spn("b")].elements[1]
        ));
        assert_eq!(slot, Slot::ONE);
        assert!(rs.index.shared.is_empty());
        rs.set_service(&spn("b"), None);
        assert!(rs.index.get(&k).is_none() && rs.element_count() == 0);
    }

    #[test]
    fn no_change_plans_an_empty_transaction() {
        let rs = ruleset(&[("a", "10.0.0.1")]);
        let p = plan_transaction(Some(&rs), &rs.clone(), None, &[]);
        assert!(p.tx.ops.is_empty(), "{:?}", verbs(&p.tx));
        assert!(p.stale_chains.is_empty());
    }

    #[test]
    fn a_full_plan_flushes_what_the_kernel_has_and_clears_leftovers() {
        let rs = ruleset(&[("a", "10.0.0.1")]);
        let existing = Existing {
            chains: ["services", "svc-a", "svc-old", "svc-older"]
                .map(String::from)
                .into(),
            sets: ["ips", "old-set"].map(String::from).into(),
        };
        let pending = ["svc-older".into(), "gone-already".into()];
        let p = plan_full(&rs, Some(&existing), &pending);
        let v = verbs(&p.tx);
        // Pending deletes first, only of chains the kernel still has; existing chains and
        // sets are flushed before being refilled.
        assert_eq!(v[0], "delete chain svc-older", "{v:?}");
        assert!(
            !v.contains(&"delete chain gone-already".to_string()),
            "{v:?}"
        );
        for want in [
            "add table ip t",
            "flush chain services",
            "flush chain svc-a",
            "flush set ips",
            "add element of ips",
            "flush chain svc-old",
            "delete set old-set",
        ] {
            assert!(v.contains(&want.to_string()), "{want} missing from {v:?}");
        }
        // The unknown chain is emptied now and deleted by the next sync.
        assert_eq!(p.stale_chains, ["svc-old"]);
    }

    #[test]
    fn a_changed_fragment_replaces_only_its_own_objects() {
        let prev = ruleset(&[("a", "10.0.0.1"), ("b", "10.0.0.2")]);
        let mut next = prev.clone();
        next.set_service(&spn("b"), Some(service("b", "10.0.0.3")));
        let v = verbs(&plan_transaction(Some(&prev), &next, None, &[]).tx);
        assert!(v.iter().all(|o| !o.contains("svc-a")), "{v:?}");
        assert!(v.contains(&"delete element of ips".to_string()), "{v:?}");
        assert!(v.contains(&"add element of ips".to_string()), "{v:?}");
    }

    /// A service port whose element in the verdict map `vm` sends `addr` to its own chain.
    fn claim(name: &str, addr: &str) -> Arc<Fragment> {
        let mut f = (*service(name, addr)).clone();
        f.element(Element::new(
            "vm".into(),
            vec![KeyValue::Addr(addr.parse().unwrap())],
            ElemData::Verdict(Verdict::Goto(format!("svc-{name}").into())),
            Some(name.into()),
        ));
        Arc::new(f)
    }

    fn in_force<'a>(rs: &'a Ruleset, set: &str) -> Vec<&'a Element> {
        rs.elements().filter(|e| &**e.set() == set).collect()
    }

    /// Built at once or one fragment at a time: the same ruleset, shared keys' owners and
    /// counts included.
    #[test]
    fn a_ruleset_built_at_once_equals_one_built_fragment_by_fragment() {
        let frags = [("c", "1.2.3.4"), ("a", "1.2.3.1"), ("b", "1.2.3.4")];
        let mut one_by_one = ruleset(&[]);
        for (n, a) in frags {
            one_by_one.set_service(&spn(n), Some(claim(n, a)));
        }
        let table = one_by_one.table.clone();
        let at_once = Ruleset::with_services(
            table,
            base(),
            frags.iter().map(|(n, a)| (spn(n), claim(n, a))),
        );
        assert_eq!(at_once, one_by_one);
        assert_eq!(at_once.rule_count(), one_by_one.rule_count());
        assert_eq!(at_once.element_count(), one_by_one.element_count());
        let owner = |rs: &Ruleset| {
            let mut v: Vec<_> = in_force(rs, "vm")
                .iter()
                .map(|e| e.verdict().cloned())
                .collect();
            v.sort_by_key(|v| format!("{v:?}")); // the index's order is its own
            v
        };
        assert_eq!(owner(&at_once), owner(&one_by_one));
        // Removing one of the two claimants leaves the other's element in force.
        let mut a = at_once.clone();
        let mut b = one_by_one.clone();
        a.set_service(&spn("b"), None);
        b.set_service(&spn("b"), None);
        assert_eq!(owner(&a), owner(&b));
        assert_eq!(
            owner(&a),
            [
                Some(Verdict::Goto("svc-a".into())),
                Some(Verdict::Goto("svc-c".into()))
            ]
        );
    }

    /// A full plan adds each key once, the element in force, with a set's elements
    /// together and sets in name order, whatever order the fragments arrived in.
    #[test]
    fn a_full_plan_adds_each_key_once_grouped_by_set() {
        let elements = |order: &[&str]| -> Vec<(String, Key, Option<Verdict>)> {
            let mut rs = ruleset(&[]);
            for n in order {
                // b and c claim one address (b owns it by name); a has its own.
                let addr = if *n == "a" { "1.2.3.1" } else { "1.2.3.4" };
                rs.set_service(&spn(n), Some(claim(n, addr)));
            }
            plan_full(&rs, None, &[])
                .tx
                .ops
                .iter()
                .filter_map(|o| match o.object() {
                    crate::kernel::nft::Object::Element(e) => {
                        Some((e.set().to_string(), e.key, e.verdict().cloned()))
                    }
                    _ => None,
                })
                .collect()
        };
        let got = elements(&["c", "a", "b"]);
        assert_eq!(got, elements(&["a", "b", "c"]), "deterministic");
        let sets: Vec<&str> = got.iter().map(|(s, _, _)| s.as_str()).collect();
        assert_eq!(sets, ["ips", "ips", "vm", "vm"]);
        let shared = got
            .iter()
            .filter(|(s, k, _)| s == "vm" && *k == [KeyValue::Addr("1.2.3.4".parse().unwrap())])
            .collect::<Vec<_>>();
        assert_eq!(shared.len(), 1, "{got:?}");
        assert_eq!(
            shared[0].2,
            Some(Verdict::Goto("svc-b".into())),
            "b owns it"
        );
    }

    #[test]
    fn a_shared_key_has_a_fixed_owner_and_passes_on_when_it_goes() {
        // Whatever the order they arrive in, "a" (first by name) owns the shared address.
        for order in [["a", "b"], ["b", "a"]] {
            let mut rs = ruleset(&[]);
            for n in order {
                rs.set_service(&spn(n), Some(claim(n, "1.2.3.4")));
            }
            let vm = in_force(&rs, "vm");
            assert_eq!(vm.len(), 1);
            assert_eq!(
                vm[0].verdict().cloned(),
                Some(Verdict::Goto("svc-a".into())),
                "{order:?}"
            );
        }
        // The owner goes: in the same plan its element is replaced by b's, never left
        // pointing at a chain that is being removed.
        let mut prev = ruleset(&[]);
        prev.set_service(&spn("a"), Some(claim("a", "1.2.3.4")));
        prev.set_service(&spn("b"), Some(claim("b", "1.2.3.4")));
        let change = Change {
            name: spn("a"),
            old: prev.services.get(&spn("a")).cloned(),
            new: None,
        };
        let p = plan_changes(&prev, &prev.base, &[change], &[]);
        let v = verbs(&p.tx);
        let added: Vec<_> =
            p.tx.ops
                .iter()
                .filter_map(|o| match o {
                    Op::Add(crate::kernel::nft::Object::Element(e)) if &**e.set() == "vm" => {
                        Some(e.verdict().cloned())
                    }
                    _ => None,
                })
                .collect();
        assert_eq!(added, [Some(Verdict::Goto("svc-b".into()))], "{v:?}");
        let mut next = prev.clone();
        next.set_service(&spn("a"), None);
        assert_eq!(
            in_force(&next, "vm")[0].verdict().cloned(),
            Some(Verdict::Goto("svc-b".into()))
        );
        // b going too removes the key.
        next.set_service(&spn("b"), None);
        assert!(in_force(&next, "vm").is_empty());
    }

    #[test]
    fn the_older_service_owns_a_shared_key_then_the_name_decides() {
        let aged = |name: &str, created: Option<i64>| {
            let mut f = (*claim(name, "1.2.3.4")).clone();
            f.created = created;
            Arc::new(f)
        };
        // "b" is older: it owns the key although "a" sorts first by name.
        for order in [["a", "b"], ["b", "a"]] {
            let mut rs = ruleset(&[]);
            for n in order {
                let created = if n == "b" { Some(100) } else { Some(200) };
                rs.set_service(&spn(n), Some(aged(n, created)));
            }
            assert_eq!(
                in_force(&rs, "vm")[0].verdict().cloned(),
                Some(Verdict::Goto("svc-b".into())),
                "{order:?}"
            );
        }
        // Without a creation time (manifests), a port comes after those with one.
        let mut rs = ruleset(&[]);
        rs.set_service(&spn("a"), Some(aged("a", None)));
        rs.set_service(&spn("b"), Some(aged("b", Some(5))));
        assert_eq!(
            in_force(&rs, "vm")[0].verdict().cloned(),
            Some(Verdict::Goto("svc-b".into()))
        );
        // Equal times: the name.
        let mut rs = ruleset(&[]);
        rs.set_service(&spn("b"), Some(aged("b", Some(5))));
        rs.set_service(&spn("a"), Some(aged("a", Some(5))));
        assert_eq!(
            in_force(&rs, "vm")[0].verdict().cloned(),
            Some(Verdict::Goto("svc-a".into()))
        );
    }
}
