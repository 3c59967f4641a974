//! [`Ruleset`]: the desired content of one of our tables, kept as a base [`Fragment`] plus one
//! fragment per service port, and the pure planners (`plan.rs`) that turn a change into one
//! [`Transaction`](crate::kernel::nft::Transaction). A partial sync touches only the fragments
//! that changed: its planning and kernel cost follow the change, not the cluster size, and it
//! never lists the table. The element index is in `index.rs`. Pure.

mod index;
mod plan;

use std::collections::BTreeMap;
use std::sync::Arc;

use crate::kernel::nft::{Chain, Element, Family, Rule, Set, SharedElement, Table};
use crate::model::ServicePortName;

use index::{key_of, owner_of, ElemKey, ElementIndex, Slot};
pub use plan::{plan_changes, plan_full, plan_transaction, Change, Existing, Plan};

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
#[cfg(test)]
pub(crate) mod tests;
