//! The kernel's `jhash()` (`include/linux/jhash.h`: Bob Jenkins' lookup3 `hashlittle`), as
//! nftables' `jhash` expression applies it (`net/netfilter/nft_hash.c`:
//! `reciprocal_scale(jhash(data, len, seed), modulus) + offset`), so that the packet
//! evaluator and `explain` pick the entry the kernel picks. Pure.

const INITVAL: u32 = 0xdead_beef;

fn mix(a: &mut u32, b: &mut u32, c: &mut u32) {
    *a = a.wrapping_sub(*c);
    *a ^= c.rotate_left(4);
    *c = c.wrapping_add(*b);
    *b = b.wrapping_sub(*a);
    *b ^= a.rotate_left(6);
    *a = a.wrapping_add(*c);
    *c = c.wrapping_sub(*b);
    *c ^= b.rotate_left(8);
    *b = b.wrapping_add(*a);
    *a = a.wrapping_sub(*c);
    *a ^= c.rotate_left(16);
    *c = c.wrapping_add(*b);
    *b = b.wrapping_sub(*a);
    *b ^= a.rotate_left(19);
    *a = a.wrapping_add(*c);
    *c = c.wrapping_sub(*b);
    *c ^= b.rotate_left(4);
    *b = b.wrapping_add(*a);
}

fn final_mix(a: &mut u32, b: &mut u32, c: &mut u32) {
    *c ^= *b;
    *c = c.wrapping_sub(b.rotate_left(14));
    *a ^= *c;
    *a = a.wrapping_sub(c.rotate_left(11));
    *b ^= *a;
    *b = b.wrapping_sub(a.rotate_left(25));
    *c ^= *b;
    *c = c.wrapping_sub(b.rotate_left(16));
    *a ^= *c;
    *a = a.wrapping_sub(c.rotate_left(4));
    *b ^= *a;
    *b = b.wrapping_sub(a.rotate_left(14));
    *c ^= *b;
    *c = c.wrapping_sub(b.rotate_left(24));
}

/// Little-endian word of up to 4 bytes (the kernel reads native-endian words; nftables runs
/// on little-endian x86 and arm64 here, and the tail is assembled little-endian anyway).
fn word(bytes: &[u8]) -> u32 {
    bytes
        .iter()
        .enumerate()
        .fold(0, |w, (i, b)| w | (u32::from(*b) << (8 * i)))
}

/// `jhash(key, len, initval)`.
pub fn jhash(key: &[u8], initval: u32) -> u32 {
    let len = key.len() as u32;
    let mut a = INITVAL.wrapping_add(len).wrapping_add(initval);
    let (mut b, mut c) = (a, a);
    let mut rest = key;
    while rest.len() > 12 {
        a = a.wrapping_add(word(&rest[0..4]));
        b = b.wrapping_add(word(&rest[4..8]));
        c = c.wrapping_add(word(&rest[8..12]));
        mix(&mut a, &mut b, &mut c);
        rest = &rest[12..];
    }
    if rest.is_empty() {
        return c;
    }
    a = a.wrapping_add(word(&rest[..rest.len().min(4)]));
    if rest.len() > 4 {
        b = b.wrapping_add(word(&rest[4..rest.len().min(8)]));
    }
    if rest.len() > 8 {
        c = c.wrapping_add(word(&rest[8..]));
    }
    final_mix(&mut a, &mut b, &mut c);
    c
}

/// What nftables' `jhash KEY mod MODULUS seed SEED offset OFFSET` yields for `key` (the
/// registers' bytes): the kernel scales the hash with `reciprocal_scale`, not `%`.
pub fn nft_jhash(key: &[u8], modulus: u32, seed: u32, offset: u32) -> u32 {
    let h = jhash(key, seed);
    // u32 arithmetic as the kernel's: the sum wraps (the kernel refuses rules whose slots
    // would, but a listed rule is input all the same).
    (((u64::from(h) * u64::from(modulus)) >> 32) as u32).wrapping_add(offset)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// lookup3.c's own self-test values (`driver5`), which the kernel's jhash shares.
    #[test]
    fn lookup3_test_vectors() {
        assert_eq!(jhash(b"", 0), 0xdead_beef);
        assert_eq!(jhash(b"", 0xdead_beef), 0xbd5b_7dde);
        let four_score = b"Four score and seven years ago";
        assert_eq!(jhash(four_score, 0), 0x1777_0551);
        assert_eq!(jhash(four_score, 1), 0xcd62_8161);
    }

    #[test]
    fn the_result_is_scaled_into_the_modulus_and_offset() {
        for key in [&b"abcd"[..], b"0123456789abcdef", b"\x0a\x00\x00\x01"] {
            let v = nft_jhash(key, 251, 7, 1000);
            assert!((1000..1251).contains(&v), "{v}");
        }
        assert_eq!(nft_jhash(b"", 1, 0, 0), 0);
    }
}
