//! Slots of the endpoint map. A service chain with N ≥ 2 endpoints (and no affinity) is one
//! rule, `dnat to numgen random mod N offset O map @endpoints`, and its endpoints are the
//! map's elements O..O+N. Each chain owns a block of power-of-two capacity, so endpoint
//! changes within the capacity rewrite only map elements: no rule changes, and so no
//! re-validation of the table's chain graph, which is what a rule change costs the kernel
//! (tens of milliseconds at 10k services). Pure.

use std::collections::{BTreeMap, HashMap};

/// Assigns blocks of slots to owners (chain names). Blocks are reused when freed.
#[derive(Debug, Clone, Default)]
pub struct SlotAllocator {
    blocks: HashMap<String, (u32, u32)>,
    free: BTreeMap<u32, Vec<u32>>,
    next: u32,
    maps: u32,
}

impl SlotAllocator {
    /// An allocator with one endpoint map.
    pub fn new() -> Self {
        Self::for_services(0)
    }

    /// An allocator whose chains spread over about one endpoint map per 32 Services (see
    /// [`ENDPOINT_MAPS`](super::names::ENDPOINT_MAPS)); fixed until the next full sync.
    pub fn for_services(services: usize) -> Self {
        let want = (services / 32).max(1).next_power_of_two() as u32;
        SlotAllocator {
            maps: want.min(super::names::ENDPOINT_MAPS),
            ..Default::default()
        }
    }

    /// An allocator holding the blocks a table already uses: `(owner, first slot,
    /// endpoints)` over `maps` endpoint maps (what a live table's `numgen … map` rules say),
    /// so that a plan against that table keeps every unchanged chain's slots. New blocks go
    /// after the last one: a freed block's capacity is not recorded in the kernel.
    pub fn seeded(maps: u32, blocks: impl IntoIterator<Item = (String, u32, u32)>) -> Self {
        let mut a = SlotAllocator {
            maps: maps.clamp(1, super::names::ENDPOINT_MAPS),
            ..Default::default()
        };
        for (owner, off, n) in blocks {
            let cap = n.max(2).next_power_of_two();
            a.next = a.next.max(off.saturating_add(cap));
            a.blocks.insert(owner, (off, cap));
        }
        a
    }

    /// How many endpoint maps there are.
    pub fn maps(&self) -> u32 {
        self.maps.max(1)
    }

    /// The endpoint map of `chain`.
    pub fn map_for(&self, chain: &str) -> crate::kernel::nft::Name {
        crate::kernel::nft::shared_name(&super::names::endpoint_map_name(
            super::names::endpoint_map_index(chain, self.maps()),
        ))
    }

    /// The first slot of `owner`'s block for `n` endpoints: its current block when the
    /// capacity still fits, else a new one (the old one is freed).
    pub fn assign(&mut self, owner: &str, n: u32) -> u32 {
        let cap = n.max(2).next_power_of_two();
        if let Some(&(off, c)) = self.blocks.get(owner) {
            if c == cap {
                return off;
            }
            self.release(owner);
        }
        let off = match self.free.get_mut(&cap).and_then(Vec::pop) {
            Some(o) => o,
            None => {
                let o = self.next;
                self.next = self.next.saturating_add(cap);
                o
            }
        };
        self.blocks.insert(owner.to_string(), (off, cap));
        off
    }

    /// Frees `owner`'s block, if any.
    pub fn release(&mut self, owner: &str) {
        if let Some((off, cap)) = self.blocks.remove(owner) {
            self.free.entry(cap).or_default().push(off);
        }
    }

    /// Number of owners holding a block.
    pub fn len(&self) -> usize {
        self.blocks.len()
    }

    pub fn is_empty(&self) -> bool {
        self.blocks.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_seeded_allocator_keeps_the_blocks_it_was_given() {
        let mut a = SlotAllocator::seeded(4, [("a".to_string(), 0, 3), ("b".to_string(), 4, 2)]);
        assert_eq!(a.maps(), 4);
        assert_eq!(a.assign("a", 4), 0, "same capacity: same block");
        assert_eq!(a.assign("b", 2), 4);
        assert_eq!(a.assign("c", 2), 6, "new blocks after the last one");
        assert_eq!(a.assign("a", 5), 8, "a larger capacity moves");
    }

    #[test]
    fn about_one_map_per_32_services_up_to_the_limit() {
        assert_eq!(SlotAllocator::for_services(0).maps(), 1);
        assert_eq!(SlotAllocator::for_services(40).maps(), 1);
        assert_eq!(SlotAllocator::for_services(1000).maps(), 32);
        assert_eq!(SlotAllocator::for_services(10_000).maps(), 256);
        assert_eq!(SlotAllocator::for_services(30_000).maps(), 256);
        let s = SlotAllocator::for_services(10_000);
        assert_eq!(s.map_for("service-X"), s.map_for("service-X"), "stable");
    }

    #[test]
    fn blocks_are_stable_reused_and_disjoint() {
        let mut s = SlotAllocator::new();
        let a = s.assign("a", 3);
        let b = s.assign("b", 10);
        assert_eq!((a, b), (0, 4), "a gets 4 slots, b 16");
        assert_eq!(s.assign("a", 4), a, "same capacity: same block");
        let a2 = s.assign("a", 5);
        assert_eq!(a2, 20, "grew past its capacity: a new block");
        // The freed 4-slot block goes to the next owner that needs 4.
        assert_eq!(s.assign("c", 3), 0);
        assert_eq!(s.assign("e", 2), 28, "capacity 2 is its own size class");
        s.release("b");
        assert_eq!(s.assign("d", 16), 4);
        assert_eq!(s.len(), 4);
    }
}
