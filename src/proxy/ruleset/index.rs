//! The element index of a [`Ruleset`](super::Ruleset): every element key once, held by the
//! element in force for it, with what the fragments contributing it say ([`Slot`]), and the
//! fixed owner order that decides between fragments that disagree. Pure.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use crate::kernel::nft::{Element, Key, SharedElement};
use crate::model::ServicePortName;
use crate::proxy::fxhash::{FxHashMap, FxHashSet};

use super::Fragment;

/// An element by its set and key: the element itself, compared and hashed on those two
/// (no copy of the set name and key per entry).
#[derive(Debug, Clone)]
pub(super) struct ElemKey(SharedElement);

impl ElemKey {
    pub(super) fn parts(&self) -> (&str, &Key) {
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

pub(super) fn key_of(e: &SharedElement) -> ElemKey {
    ElemKey(e.clone())
}

/// What the fragments say about one element key: how many add it, and whether they
/// disagree about its data (two Services claiming one address and port). The element in
/// force is the index entry's key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Slot {
    pub(super) count: u32,
    pub(super) mixed: bool,
}

impl Slot {
    /// One contributor, so nothing to disagree about: most keys (an endpoint's slot in its
    /// balance map, a ClusterIP).
    pub(super) const ONE: Slot = Slot {
        count: 1,
        mixed: false,
    };
}

/// Every element key once, held by the element in force for it, and its [`Slot`] where that
/// is not [`Slot::ONE`]. Most keys have one contributor: a set of pointers for all keys (8
/// bytes an entry) and a small map for the rest, where one map of key to slot took 16 bytes
/// an entry. At 100k × 10's 2.2M keys that map had 4M buckets of 17 bytes (71 MiB); the set's
/// are 9 bytes (38 MiB; issue #18). A key whose contributors agree may stay held by the
/// element of one that has since gone (equal data): finding one that stays would scan every
/// fragment, so [`ElementIndex::sends`] does not rely on which element it is.
#[derive(Debug, Clone, Default)]
pub(super) struct ElementIndex {
    keys: FxHashSet<ElemKey>,
    /// Keys with more than one contributor, or whose contributors disagree.
    pub(super) shared: FxHashMap<ElemKey, Slot>,
}

impl ElementIndex {
    pub(super) fn reserve(&mut self, n: usize) {
        self.keys.reserve(n);
    }
    pub(super) fn len(&self) -> usize {
        self.keys.len()
    }
    pub(super) fn elements(&self) -> impl Iterator<Item = &Element> {
        self.keys.iter().map(|k| &*k.0)
    }
    /// The element in force for `k`.
    pub(super) fn in_force(&self, k: &ElemKey) -> Option<&SharedElement> {
        self.keys.get(k).map(|k| &k.0)
    }
    /// Whether a full plan sends `e`, an element of one of the ruleset's fragments, for its
    /// key: a sole contributor's element (most keys: no probe of the 2.2M-key table at
    /// 100k × 10, which was 0.8 s of the full sync's 4 s of our own time), the first of
    /// several that agree (`sent` remembers those keys), or the owner's where they
    /// disagree (settled after every change, so the element held is the owner's).
    pub(super) fn sends(&self, e: &SharedElement, sent: &mut FxHashSet<ElemKey>) -> bool {
        if self.shared.is_empty() {
            return true;
        }
        let k = key_of(e);
        match self.shared.get(&k) {
            None => true,
            Some(slot) if !slot.mixed => sent.insert(k),
            Some(_) => self
                .in_force(&k)
                .is_some_and(|held| SharedElement::ptr_eq(held, e)),
        }
    }
    /// The element in force for `k`, with what the fragments say about it.
    pub(super) fn get(&self, k: &ElemKey) -> Option<(&SharedElement, Slot)> {
        let in_force = self.in_force(k)?;
        let slot = match self.shared.is_empty() {
            true => Slot::ONE,
            false => self.shared.get(k).copied().unwrap_or(Slot::ONE),
        };
        Some((in_force, slot))
    }
    /// One more contributor of `e`'s key: whether its contributors (may) disagree now.
    pub(super) fn add(&mut self, e: &SharedElement) -> bool {
        // Inserted first: most keys are new, so most adds probe the table (2.2M keys at
        // 100k × 10) once, where a lookup and then an insert probed it twice.
        if self.keys.insert(key_of(e)) {
            return false;
        }
        let k = key_of(e);
        let Some(in_force) = self.keys.get(&k) else {
            return false; // not reached: the insert found it
        };
        let differs = !same_data(&in_force.0, e);
        let slot = self.shared.entry(k).or_insert(Slot::ONE);
        slot.count += 1;
        slot.mixed || differs
    }
    /// Records `slot` for `k`, an indexed key: with no contributor left the key goes.
    pub(super) fn set_slot(&mut self, k: &ElemKey, slot: Slot) {
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
    pub(super) fn rekey(&mut self, el: SharedElement, slot: Slot) {
        let k = ElemKey(el);
        self.keys.replace(k.clone());
        self.set_slot(&k, slot);
    }
}

/// Whether two elements of one key carry the same data.
pub(super) fn same_data(a: &Element, b: &Element) -> bool {
    a.same_data(b)
}

/// The element in force for `k` when fragments disagree: the first contributor in a fixed
/// order, the base first, then service ports by the oldest Service creation time (ports
/// without one after those with one), then namespace, name, port name and protocol, so the
/// owner of a shared key never depends on the order of events; `overrides` replaces (or
/// with `None` removes) service ports' fragments. The scan is over every fragment, but it
/// only runs for keys that two contributors disagree about.
pub(super) fn owner_of<'a>(
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
