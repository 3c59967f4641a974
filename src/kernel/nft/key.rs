//! [`Key`]: a set element's key, packed inline (pure). At 10k Services × 10 endpoints a
//! ruleset holds ~220k elements; a key as a `Vec<KeyValue>` was a 24-byte header plus a
//! heap block of 20 bytes per component (an `IpAddr` is 17), 48–96 bytes with the
//! allocator's rounding, per element (issue #18). Packed, the longest key the planners build
//! (IPVS mode's hairpin set, `saddr . daddr . l4proto . dport`: 35 bytes with IPv6) fits in
//! 37 bytes with no allocation, aligned to one byte so that an element fits in 64 (issue #18).

use std::borrow::Borrow;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use super::KeyValue;

/// Bytes of component data a key holds: IPVS mode's hairpin key `saddr . daddr . l4proto .
/// dport` with IPv6 (16 + 16 + 1 + 2).
const CAPACITY: usize = 35;
/// Components a key holds: `daddr . l4proto . dport . numgen` is the longest concatenation.
const MAX_COMPONENTS: usize = 4;
/// Bits per component in `kinds`.
const KIND_BITS: u32 = 3;

/// A component's kind, as stored in [`Key::kinds`].
#[derive(Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
enum Kind {
    V4 = 1,
    V6 = 2,
    Proto = 3,
    Port = 4,
    Slot = 5,
}

impl Kind {
    fn of(v: &KeyValue) -> (Kind, usize) {
        match v {
            KeyValue::Addr(IpAddr::V4(_)) => (Kind::V4, 4),
            KeyValue::Addr(IpAddr::V6(_)) => (Kind::V6, 16),
            KeyValue::Proto(_) => (Kind::Proto, 1),
            KeyValue::Port(_) => (Kind::Port, 2),
            KeyValue::Slot(_) => (Kind::Slot, 4),
        }
    }
    fn from_bits(b: u16) -> Option<(Kind, usize)> {
        Some(match b {
            1 => (Kind::V4, 4),
            2 => (Kind::V6, 16),
            3 => (Kind::Proto, 1),
            4 => (Kind::Port, 2),
            5 => (Kind::Slot, 4),
            _ => return None,
        })
    }
}

/// A set element's key: up to four components, packed. Equal keys have equal bytes (unused
/// bytes stay zero), so equality and hashing are plain byte comparisons; the order is that
/// of the components (as a `Vec<KeyValue>` would sort).
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Key {
    /// Each component's [`Kind`], three bits each, the first in the lowest bits, as a
    /// little-endian `u16`: bytes, not a `u16`, so the key aligns to one byte and packs
    /// after an element's 8-byte pointer with no padding. The number of components and of
    /// bytes in use follow from it (a kind is never 0), so neither is stored.
    kinds: [u8; 2],
    bytes: [u8; CAPACITY],
}

impl Default for Key {
    fn default() -> Key {
        Key::new()
    }
}

/// A key with more components or bytes than [`Key`] holds.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("a set element key of more than {MAX_COMPONENTS} components or {CAPACITY} bytes")]
pub struct KeyTooLong;

impl Key {
    /// An empty key.
    pub const fn new() -> Key {
        Key {
            kinds: [0; 2],
            bytes: [0; CAPACITY],
        }
    }

    fn kind_bits(&self) -> u16 {
        u16::from_le_bytes(self.kinds)
    }

    /// Each component's kind and length, in order.
    fn components(&self) -> impl Iterator<Item = (Kind, usize)> {
        components(self.kind_bits())
    }

    /// Components held.
    fn count(&self) -> usize {
        self.components().count()
    }

    /// Bytes of `bytes` in use.
    fn used(&self) -> usize {
        self.components().map(|(_, len)| len).sum()
    }

    /// A key of `values`, or an error if they do not fit.
    pub fn try_from_values<I>(values: I) -> Result<Key, KeyTooLong>
    where
        I: IntoIterator,
        I::Item: Borrow<KeyValue>,
    {
        let mut k = Key::new();
        for v in values {
            k.try_push(*v.borrow())?;
        }
        Ok(k)
    }

    /// Appends a component, or fails (leaving the key as it was) if it does not fit.
    pub fn try_push(&mut self, v: KeyValue) -> Result<(), KeyTooLong> {
        let (kind, len) = Kind::of(&v);
        let at = self.used();
        let count = self.count();
        if count >= MAX_COMPONENTS || at + len > CAPACITY {
            return Err(KeyTooLong);
        }
        let dst = &mut self.bytes[at..at + len];
        match v {
            KeyValue::Addr(IpAddr::V4(a)) => dst.copy_from_slice(&a.octets()),
            KeyValue::Addr(IpAddr::V6(a)) => dst.copy_from_slice(&a.octets()),
            KeyValue::Proto(p) => dst[0] = p,
            KeyValue::Port(p) => dst.copy_from_slice(&p.to_be_bytes()),
            KeyValue::Slot(s) => dst.copy_from_slice(&s.to_be_bytes()),
        }
        let kinds = self.kind_bits() | (kind as u16) << (KIND_BITS * count as u32);
        self.kinds = kinds.to_le_bytes();
        Ok(())
    }

    /// Appends a component. Every key the planners build fits (at most four components, 35
    /// bytes); one that does not is a planner defect: the component
    /// is left out and the defect logged (the kernel then refuses the element for its
    /// length, naming its set), never a panic.
    pub fn push(&mut self, v: KeyValue) {
        if self.try_push(v).is_err() {
            tracing::error!(key = ?self, value = ?v, "set element key too long; component left out");
        }
    }

    pub fn len(&self) -> usize {
        self.count()
    }
    pub fn is_empty(&self) -> bool {
        self.kinds == [0; 2]
    }

    /// The components, in order.
    pub fn iter(&self) -> KeyIter<'_> {
        KeyIter {
            key: self,
            bits: self.kind_bits(),
            at: 0,
        }
    }

    /// The `i`th component.
    pub fn get(&self, i: usize) -> Option<KeyValue> {
        self.iter().nth(i)
    }

    pub fn to_vec(&self) -> Vec<KeyValue> {
        self.iter().collect()
    }

    /// The packed bytes in use (each component big-endian, unpadded): what equality and
    /// hashing compare.
    pub fn packed(&self) -> (&[u8], u16) {
        (&self.bytes[..self.used()], self.kind_bits())
    }
}

/// Each kind and length in `bits` (three bits a component, the first lowest), up to the
/// first unused (0) one.
fn components(bits: u16) -> impl Iterator<Item = (Kind, usize)> {
    (0..MAX_COMPONENTS)
        .map_while(move |i| Kind::from_bits((bits >> (KIND_BITS * i as u32)) & 0b111))
}

/// The components of a [`Key`].
pub struct KeyIter<'a> {
    key: &'a Key,
    /// The kinds of the components not yet returned, the next one lowest.
    bits: u16,
    at: usize,
}

impl Iterator for KeyIter<'_> {
    type Item = KeyValue;
    fn next(&mut self) -> Option<KeyValue> {
        let (kind, len) = components(self.bits).next()?;
        let b = &self.key.bytes[self.at..self.at + len];
        self.bits >>= KIND_BITS;
        self.at += len;
        let mut a4 = [0u8; 4];
        Some(match kind {
            Kind::V4 => {
                a4.copy_from_slice(b);
                KeyValue::Addr(IpAddr::V4(Ipv4Addr::from(a4)))
            }
            Kind::V6 => {
                let mut a = [0u8; 16];
                a.copy_from_slice(b);
                KeyValue::Addr(IpAddr::V6(Ipv6Addr::from(a)))
            }
            Kind::Proto => KeyValue::Proto(b[0]),
            Kind::Port => KeyValue::Port(u16::from_be_bytes([b[0], b[1]])),
            Kind::Slot => {
                a4.copy_from_slice(b);
                KeyValue::Slot(u32::from_be_bytes(a4))
            }
        })
    }
    fn size_hint(&self) -> (usize, Option<usize>) {
        let n = components(self.bits).count();
        (n, Some(n))
    }
}
impl ExactSizeIterator for KeyIter<'_> {}

impl<'a> IntoIterator for &'a Key {
    type Item = KeyValue;
    type IntoIter = KeyIter<'a>;
    fn into_iter(self) -> KeyIter<'a> {
        self.iter()
    }
}

impl FromIterator<KeyValue> for Key {
    fn from_iter<I: IntoIterator<Item = KeyValue>>(it: I) -> Key {
        let mut k = Key::new();
        for v in it {
            k.push(v);
        }
        k
    }
}
impl From<Vec<KeyValue>> for Key {
    fn from(v: Vec<KeyValue>) -> Key {
        v.into_iter().collect()
    }
}
impl From<&[KeyValue]> for Key {
    fn from(v: &[KeyValue]) -> Key {
        v.iter().copied().collect()
    }
}
impl<const N: usize> From<[KeyValue; N]> for Key {
    fn from(v: [KeyValue; N]) -> Key {
        v.into_iter().collect()
    }
}

impl std::fmt::Debug for Key {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(self.iter()).finish()
    }
}

impl PartialEq<[KeyValue]> for Key {
    fn eq(&self, o: &[KeyValue]) -> bool {
        self.len() == o.len() && self.iter().zip(o).all(|(a, b)| a == *b)
    }
}
impl PartialEq<Vec<KeyValue>> for Key {
    fn eq(&self, o: &Vec<KeyValue>) -> bool {
        *self == o[..]
    }
}
impl<const N: usize> PartialEq<[KeyValue; N]> for Key {
    fn eq(&self, o: &[KeyValue; N]) -> bool {
        *self == o[..]
    }
}

impl PartialOrd for Key {
    fn partial_cmp(&self, o: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(o))
    }
}
impl Ord for Key {
    /// Component by component, as the components themselves order.
    fn cmp(&self, o: &Self) -> std::cmp::Ordering {
        self.iter().cmp(o.iter())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v4(s: &str) -> KeyValue {
        KeyValue::Addr(s.parse().unwrap())
    }

    #[test]
    fn every_shape_the_planners_build_round_trips() {
        let a6 = KeyValue::Addr("fd00::1:2:3:4".parse().unwrap());
        let shapes: Vec<Vec<KeyValue>> = vec![
            vec![],
            vec![v4("10.0.0.1")],
            vec![v4("10.0.0.1"), v4("10.0.0.1")],
            vec![a6, a6],
            vec![v4("10.0.0.1"), KeyValue::Proto(6), KeyValue::Port(443)],
            vec![
                a6,
                KeyValue::Proto(17),
                KeyValue::Port(53),
                KeyValue::Slot(63),
            ],
            // IPVS mode's hairpin set: the longest key any planner builds.
            vec![a6, a6, KeyValue::Proto(6), KeyValue::Port(8080)],
            vec![KeyValue::Slot(u32::MAX)],
        ];
        for s in shapes {
            let k = Key::try_from_values(&s).expect("fits");
            assert_eq!(k.to_vec(), s);
            assert_eq!(k.len(), s.len());
            assert_eq!(k, s);
            assert_eq!(k.iter().len(), s.len());
        }
    }

    #[test]
    fn a_key_that_does_not_fit_is_refused_not_truncated() {
        let a6 = KeyValue::Addr("fd00::1".parse().unwrap());
        assert_eq!(Key::try_from_values([a6, a6, a6]), Err(KeyTooLong));
        let five = [KeyValue::Proto(6); 5];
        assert_eq!(Key::try_from_values(five), Err(KeyTooLong));
        // push keeps what fitted and logs the rest
        let k: Key = five.into();
        assert_eq!(k.len(), 4);
    }

    #[test]
    fn keys_compare_and_order_as_their_components() {
        let a: Key = [v4("10.0.0.2"), KeyValue::Port(1)].into();
        let b: Key = [v4("10.0.0.10"), KeyValue::Port(0)].into();
        let c: Key = [v4("10.0.0.2")].into();
        let va = a.to_vec();
        let vb = b.to_vec();
        assert_eq!(a.cmp(&b), va.cmp(&vb));
        assert!(c < a, "a prefix sorts first, as with vectors");
        assert_ne!(a, b);
        // Same values, same bytes: equality is byte equality.
        let a2: Key = va.into();
        assert_eq!(a, a2);
        assert_eq!(a.packed(), a2.packed());
        // Kinds count: a port 1 is not a protocol 1.
        let p: Key = [KeyValue::Proto(1)].into();
        let q: Key = [KeyValue::Slot(1)].into();
        assert_ne!(p, q);
    }

    #[test]
    fn a_key_is_small_inline_and_byte_aligned() {
        assert_eq!(std::mem::size_of::<Key>(), 37);
        assert_eq!(std::mem::align_of::<Key>(), 1);
    }
}
