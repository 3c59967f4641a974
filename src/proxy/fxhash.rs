//! A small, fast, non-cryptographic hasher (the "Fx" hash used by rustc) for in-memory maps
//! keyed by our own data: SipHash's DoS resistance buys nothing there and costs a sixth of a
//! full ruleset build.

use std::hash::{BuildHasherDefault, Hasher};

const SEED: u64 = 0x51_7c_c1_b7_27_22_0a_95;

/// The Fx hasher.
#[derive(Default, Clone, Copy)]
pub struct FxHasher {
    hash: u64,
}

impl FxHasher {
    #[inline]
    fn add(&mut self, w: u64) {
        self.hash = (self.hash.rotate_left(5) ^ w).wrapping_mul(SEED);
    }
}

impl Hasher for FxHasher {
    #[inline]
    fn write(&mut self, bytes: &[u8]) {
        let mut chunks = bytes.chunks_exact(8);
        for c in &mut chunks {
            self.add(u64::from_le_bytes(c.try_into().expect("8 bytes")));
        }
        let mut tail = [0u8; 8];
        let r = chunks.remainder();
        tail[..r.len()].copy_from_slice(r);
        self.add(u64::from_le_bytes(tail) ^ r.len() as u64);
    }
    #[inline]
    fn write_u8(&mut self, i: u8) {
        self.add(i as u64);
    }
    #[inline]
    fn write_u16(&mut self, i: u16) {
        self.add(i as u64);
    }
    #[inline]
    fn write_u32(&mut self, i: u32) {
        self.add(i as u64);
    }
    #[inline]
    fn write_u64(&mut self, i: u64) {
        self.add(i);
    }
    #[inline]
    fn write_usize(&mut self, i: usize) {
        self.add(i as u64);
    }
    /// The multiply leaves its best-mixed bits at the top, and the map indexes buckets with
    /// the low bits: rotated down (as rustc-hash 2 does). Without it the 2.2M element keys
    /// of a 100k × 10 ruleset (addresses and small slot numbers) crowded into few buckets.
    #[inline]
    fn finish(&self) -> u64 {
        self.hash.rotate_left(26)
    }
}

/// `HashMap` with the Fx hasher.
pub type FxHashMap<K, V> = std::collections::HashMap<K, V, BuildHasherDefault<FxHasher>>;
/// `HashSet` with the Fx hasher.
pub type FxHashSet<K> = std::collections::HashSet<K, BuildHasherDefault<FxHasher>>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn distinguishes_similar_keys() {
        let mut m: FxHashMap<(String, Vec<u8>), u8> = FxHashMap::default();
        for i in 0..1000u32 {
            m.insert((format!("s{}", i % 7), i.to_be_bytes().to_vec()), 1);
        }
        assert_eq!(m.len(), 1000);
    }

    /// Keys that differ only in high bits (an address's last octets, written as a
    /// native-endian integer) still differ in the low bits the map picks buckets with.
    #[test]
    fn keys_differing_in_high_bits_spread_over_low_bits() {
        let low: std::collections::HashSet<u64> = (0..4096u32)
            .map(|i| {
                let mut h = FxHasher::default();
                h.write_u32(i << 20);
                h.finish() & 0xfff
            })
            .collect();
        assert!(low.len() > 2000, "{} distinct of 4096", low.len());
    }
}
