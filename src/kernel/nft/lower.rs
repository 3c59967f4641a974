//! Lowers typed [`Expr`]essions to the kernel's register-machine expressions ([`KExpr`]),
//! the form that nfnetlink carries and that the kernel lists back. Pure.

use super::uapi::*;

use super::{CmpOp, Expr, Family, Field, KeyValue, Verdict};
use std::borrow::Borrow;

/// A kernel expression, one `NFTA_LIST_ELEM` of `NFTA_RULE_EXPRESSIONS`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KExpr {
    Payload {
        base: u32,
        offset: u32,
        len: u32,
        dreg: u32,
    },
    Meta {
        key: u32,
        dreg: u32,
    },
    MetaSet {
        key: u32,
        sreg: u32,
    },
    Ct {
        key: u32,
        dreg: u32,
    },
    Fib {
        flags: u32,
        result: u32,
        dreg: u32,
    },
    Numgen {
        modulus: u32,
        offset: u32,
        dreg: u32,
    },
    /// `jhash` (`NFT_HASH_JENKINS`) of `len` bytes from `sreg` into `dreg`:
    /// `reciprocal_scale(jhash(regs, len, seed), modulus) + offset`.
    Hash {
        sreg: u32,
        dreg: u32,
        len: u32,
        modulus: u32,
        seed: u32,
        offset: u32,
    },
    /// `op`: 0 eq, 1 neq.
    Cmp {
        sreg: u32,
        op: u32,
        data: Vec<u8>,
    },
    Bitwise {
        sreg: u32,
        dreg: u32,
        mask: Vec<u8>,
        xor: Vec<u8>,
    },
    Lookup {
        set: String,
        sreg: u32,
        dreg: Option<u32>,
        flags: u32,
    },
    ImmData {
        dreg: u32,
        data: Vec<u8>,
    },
    ImmVerdict(Verdict),
    Nat {
        kind: u32,
        family: u32,
        reg_addr: u32,
        reg_proto: Option<u32>,
    },
    Masq {
        flags: u32,
    },
    Redir {
        reg_proto: u32,
    },
    Reject {
        kind: u32,
        code: u8,
    },
    Dynset {
        set: String,
        op: u32,
        sreg_key: u32,
    },
    Counter,
}

impl KExpr {
    /// The kernel's expression name (`NFTA_EXPR_NAME`).
    pub fn name(&self) -> &'static str {
        match self {
            KExpr::Payload { .. } => "payload",
            KExpr::Meta { .. } | KExpr::MetaSet { .. } => "meta",
            KExpr::Ct { .. } => "ct",
            KExpr::Fib { .. } => "fib",
            KExpr::Numgen { .. } => "numgen",
            KExpr::Hash { .. } => "hash",
            KExpr::Cmp { .. } => "cmp",
            KExpr::Bitwise { .. } => "bitwise",
            KExpr::Lookup { .. } => "lookup",
            KExpr::ImmData { .. } | KExpr::ImmVerdict(_) => "immediate",
            KExpr::Nat { .. } => "nat",
            KExpr::Masq { .. } => "masq",
            KExpr::Redir { .. } => "redir",
            KExpr::Reject { .. } => "reject",
            KExpr::Dynset { .. } => "dynset",
            KExpr::Counter => "counter",
        }
    }
}

fn addr_offset(field: Field, family: Family) -> u32 {
    match (field, family) {
        (Field::Saddr, Family::Ip) => 12,
        (Field::Daddr, Family::Ip) => 16,
        (Field::Saddr, Family::Ip6) => 8,
        (Field::Daddr, Family::Ip6) => 24,
        _ => unreachable!("not an address field"),
    }
}

/// Loads one field into `dreg`.
fn load(field: Field, family: Family, dreg: u32) -> KExpr {
    match field {
        Field::Saddr | Field::Daddr => KExpr::Payload {
            base: NFT_PAYLOAD_NETWORK_HEADER,
            offset: addr_offset(field, family),
            len: family.addr_len() as u32,
            dreg,
        },
        Field::L4Proto => KExpr::Meta {
            key: NFT_META_L4PROTO,
            dreg,
        },
        Field::Dport => KExpr::Payload {
            base: NFT_PAYLOAD_TRANSPORT_HEADER,
            offset: 2,
            len: 2,
            dreg,
        },
        Field::Sport => KExpr::Payload {
            base: NFT_PAYLOAD_TRANSPORT_HEADER,
            offset: 0,
            len: 2,
            dreg,
        },
        Field::Random(modulus) => KExpr::Numgen {
            modulus,
            offset: 0,
            dreg,
        },
    }
}

/// The field `k` loads and the register it loads it into: the inverse of [`load`] (for
/// naming what a kernel expression read, e.g. a hash's key).
pub fn loaded_field(k: &KExpr, family: Family) -> Option<(Field, u32)> {
    let dreg = match k {
        KExpr::Payload { dreg, .. } | KExpr::Meta { dreg, .. } => *dreg,
        KExpr::Numgen {
            modulus,
            offset: 0,
            dreg,
        } => return Some((Field::Random(*modulus), *dreg)),
        _ => return None,
    };
    [
        Field::Saddr,
        Field::Daddr,
        Field::L4Proto,
        Field::Dport,
        Field::Sport,
    ]
    .into_iter()
    .find(|f| load(*f, family, dreg) == *k)
    .map(|f| (f, dreg))
}

/// Loads a concatenation into consecutive 32-bit registers from `REG32_00`.
fn load_concat(key: &[Field], family: Family, out: &mut Vec<KExpr>) {
    load_concat_at(key, family, REG32_00, out);
}

/// Loads a concatenation into consecutive 32-bit registers from `first`, each field in
/// whole registers (the kernel zeroes the unused bytes of a partly written one,
/// `nft_payload_eval`).
fn load_concat_at(key: &[Field], family: Family, first: u32, out: &mut Vec<KExpr>) {
    let mut reg = first;
    for f in key {
        out.push(load(*f, family, reg));
        reg += (f.reg_len(family) / 4) as u32;
    }
}

/// Looks the key in register `r` up in endpoint map `map` and DNATs to the address . port
/// it holds (the lookup fails the rule when the map has no such key).
fn dnat_to_looked_up(map: &str, family: Family, r: u32, out: &mut Vec<KExpr>) {
    out.push(KExpr::Lookup {
        set: map.to_string(),
        sreg: r,
        dreg: Some(r),
        flags: 0,
    });
    out.push(KExpr::Nat {
        kind: NFT_NAT_DNAT,
        family: family.nfproto() as u32,
        reg_addr: r,
        reg_proto: Some(r + (family.addr_len() / 4) as u32),
    });
}

fn u32_host(v: u32) -> Vec<u8> {
    v.to_ne_bytes().to_vec()
}

pub use crate::kernel::netlink::msg::ip_bytes;

/// Encodes a set key: each component in its own 32-bit-aligned slot.
pub fn key_bytes<I>(key: I) -> Vec<u8>
where
    I: IntoIterator,
    I::Item: Borrow<KeyValue>,
{
    let mut out = Vec::new();
    for k in key {
        match k.borrow() {
            KeyValue::Addr(a) => out.extend(ip_bytes(a)),
            KeyValue::Proto(p) => out.extend([*p, 0, 0, 0]),
            KeyValue::Port(p) => out.extend([(p >> 8) as u8, *p as u8, 0, 0]),
            KeyValue::Slot(s) => out.extend(s.to_ne_bytes()),
        }
    }
    out
}

/// The data of an endpoint-map element: address, then port in a 32-bit slot.
pub fn target_bytes(t: &super::Target) -> Vec<u8> {
    let mut out = ip_bytes(&t.ip());
    out.extend([(t.port() >> 8) as u8, t.port() as u8, 0, 0]);
    out
}

/// Lowers a rule's expressions for a table of `family`.
pub fn lower(exprs: &[Expr], family: Family) -> Vec<KExpr> {
    let mut out = Vec::new();
    for e in exprs {
        lower_one(e, family, &mut out);
    }
    out
}

fn lower_one(e: &Expr, family: Family, out: &mut Vec<KExpr>) {
    let r = REG32_00;
    match e {
        Expr::Addr { field, op, value } => {
            out.push(load(*field, family, r));
            if !value.is_host() {
                let len = family.addr_len();
                out.push(KExpr::Bitwise {
                    sreg: r,
                    dreg: r,
                    mask: value.mask(),
                    xor: vec![0; len],
                });
            }
            out.push(KExpr::Cmp {
                sreg: r,
                op: match op {
                    CmpOp::Eq => 0,
                    CmpOp::Neq => 1,
                },
                data: value.bytes(),
            });
        }
        Expr::L4Proto(p) => {
            out.push(load(Field::L4Proto, family, r));
            out.push(KExpr::Cmp {
                sreg: r,
                op: 0,
                data: vec![*p],
            });
        }
        Expr::IifName { name, prefix, op } => {
            out.push(KExpr::Meta {
                key: NFT_META_IIFNAME,
                dreg: r,
            });
            // An exact name compares with its NUL terminator; a prefix compares only its
            // own bytes (what nft does for `iifname "veth*"`).
            let mut data = name.as_bytes().to_vec();
            if !prefix {
                data.push(0);
            }
            out.push(KExpr::Cmp {
                sreg: r,
                op: if *op == CmpOp::Eq { 0 } else { 1 },
                data,
            });
        }
        Expr::InSet { key, set, negate } => {
            load_concat(key, family, out);
            out.push(KExpr::Lookup {
                set: set.clone(),
                sreg: r,
                dreg: None,
                flags: if *negate { NFT_LOOKUP_F_INV } else { 0 },
            });
        }
        Expr::CtStateNew | Expr::CtStateInvalid | Expr::CtStatusDnat => {
            let (key, bit) = match e {
                Expr::CtStateNew => (NFT_CT_STATE, CT_STATE_NEW),
                Expr::CtStateInvalid => (NFT_CT_STATE, CT_STATE_INVALID),
                _ => (NFT_CT_STATUS, CT_STATUS_DNAT),
            };
            out.push(KExpr::Ct { key, dreg: r });
            out.push(KExpr::Bitwise {
                sreg: r,
                dreg: r,
                mask: u32_host(bit),
                xor: u32_host(0),
            });
            out.push(KExpr::Cmp {
                sreg: r,
                op: 1,
                data: u32_host(0),
            });
        }
        Expr::FibLocal(field) => {
            out.push(KExpr::Fib {
                flags: if *field == Field::Saddr {
                    NFTA_FIB_F_SADDR
                } else {
                    NFTA_FIB_F_DADDR
                },
                result: NFT_FIB_RESULT_ADDRTYPE,
                dreg: r,
            });
            out.push(KExpr::Cmp {
                sreg: r,
                op: 0,
                data: u32_host(RTN_LOCAL),
            });
        }
        Expr::MarkBitClear(bit) => {
            out.push(KExpr::Meta {
                key: NFT_META_MARK,
                dreg: r,
            });
            out.push(KExpr::Bitwise {
                sreg: r,
                dreg: r,
                mask: u32_host(*bit),
                xor: u32_host(0),
            });
            out.push(KExpr::Cmp {
                sreg: r,
                op: 0,
                data: u32_host(0),
            });
        }
        Expr::NumgenZero(m) => {
            out.push(KExpr::Numgen {
                modulus: *m,
                offset: 0,
                dreg: r,
            });
            out.push(KExpr::Cmp {
                sreg: r,
                op: 0,
                data: u32_host(0),
            });
        }
        Expr::Vmap { key, map } => {
            load_concat(key, family, out);
            out.push(KExpr::Lookup {
                set: map.clone(),
                sreg: r,
                dreg: Some(REG_VERDICT),
                flags: 0,
            });
        }
        Expr::MarkOr(bit) | Expr::MarkXor(bit) => {
            // mark = (mark & mask) ^ xor: "or" clears the bit then sets it, "xor" flips it.
            let (mask, xor) = match e {
                Expr::MarkOr(_) => (!bit, *bit),
                _ => (u32::MAX, *bit),
            };
            out.push(KExpr::Meta {
                key: NFT_META_MARK,
                dreg: r,
            });
            out.push(KExpr::Bitwise {
                sreg: r,
                dreg: r,
                mask: u32_host(mask),
                xor: u32_host(xor),
            });
            out.push(KExpr::MetaSet {
                key: NFT_META_MARK,
                sreg: r,
            });
        }
        Expr::Masquerade { fully_random } => out.push(KExpr::Masq {
            flags: if *fully_random {
                NF_NAT_RANGE_PROTO_RANDOM_FULLY
            } else {
                0
            },
        }),
        Expr::Dnat { addr, port } => {
            let addr_regs = (family.addr_len() / 4) as u32;
            out.push(KExpr::ImmData {
                dreg: r,
                data: ip_bytes(addr),
            });
            out.push(KExpr::ImmData {
                dreg: r + addr_regs,
                data: port.to_be_bytes().to_vec(),
            });
            out.push(KExpr::Nat {
                kind: NFT_NAT_DNAT,
                family: family.nfproto() as u32,
                reg_addr: r,
                reg_proto: Some(r + addr_regs),
            });
        }
        Expr::DnatMap {
            modulus,
            offset,
            map,
        } => {
            out.push(KExpr::Numgen {
                modulus: *modulus,
                offset: *offset,
                dreg: r,
            });
            dnat_to_looked_up(map, family, r, out);
        }
        Expr::DnatHash {
            key,
            modulus,
            seed,
            offset,
            map,
        } => {
            // As nft 1.0 allocates them: the hash's result in NFT_REG_1, the key from
            // NFT_REG_2 (`[ hash reg 1 = jhash(reg 2, 16, SEED) % mod M offset O ]`). A
            // concatenation hashes its padded registers, a lone field only its own bytes
            // (`jhash(reg 2, 2, …)` for `th sport`), as a set key's length counts them.
            load_concat_at(key, family, REG32_04, out);
            out.push(KExpr::Hash {
                sreg: REG32_04,
                dreg: r,
                len: super::encode::key_len(key, family),
                modulus: *modulus,
                seed: *seed,
                offset: *offset,
            });
            dnat_to_looked_up(map, family, r, out);
        }
        Expr::DnatLookup { key, map } => {
            load_concat(key, family, out);
            dnat_to_looked_up(map, family, r, out);
        }
        Expr::Redirect { port } => {
            out.push(KExpr::ImmData {
                dreg: r,
                data: port.to_be_bytes().to_vec(),
            });
            out.push(KExpr::Redir { reg_proto: r });
        }
        Expr::Reject => out.push(KExpr::Reject {
            kind: NFT_REJECT_ICMP_UNREACH,
            // ICMP port unreachable (3) / ICMPv6 port unreachable (4): "connection refused".
            code: if family == Family::Ip { 3 } else { 4 },
        }),
        Expr::UpdateSet { set, key } => {
            out.push(load(*key, family, r));
            out.push(KExpr::Dynset {
                set: set.clone(),
                op: NFT_DYNSET_OP_UPDATE,
                sreg_key: r,
            });
        }
        Expr::Counter => out.push(KExpr::Counter),
        Expr::Verdict(v) => out.push(KExpr::ImmVerdict(v.clone())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernel::nft::Cidr;

    #[test]
    fn concat_uses_consecutive_32bit_registers() {
        let k = lower(
            &[Expr::Vmap {
                key: vec![Field::Daddr, Field::L4Proto, Field::Dport],
                map: "m".into(),
            }],
            Family::Ip6,
        );
        let regs: Vec<u32> = k
            .iter()
            .filter_map(|e| match e {
                KExpr::Payload { dreg, .. } | KExpr::Meta { dreg, .. } => Some(*dreg),
                _ => None,
            })
            .collect();
        // 16-byte address takes 4 registers, proto 1, then the port.
        assert_eq!(regs, vec![8, 12, 13]);
    }

    #[test]
    fn prefix_match_masks_before_compare() {
        let k = lower(
            &[Expr::Addr {
                field: Field::Saddr,
                op: CmpOp::Neq,
                value: "10.0.0.0/8".parse::<Cidr>().unwrap(),
            }],
            Family::Ip,
        );
        assert_eq!(k.len(), 3);
        assert!(matches!(&k[1], KExpr::Bitwise { mask, .. } if mask == &vec![255, 0, 0, 0]));
        assert!(matches!(&k[2], KExpr::Cmp { op: 1, data, .. } if data == &vec![10, 0, 0, 0]));
    }

    fn maglev_key() -> Vec<Field> {
        vec![Field::Saddr, Field::Sport, Field::Daddr, Field::Dport]
    }

    fn dnat_hash(offset: u32) -> Expr {
        Expr::DnatHash {
            key: maglev_key(),
            modulus: 1021,
            seed: 0x4b4e_4c50,
            offset,
            map: "endpoints-3".into(),
        }
    }

    /// What nft 1.0.6 sends for `dnat ip to jhash ip saddr . th sport . ip daddr . th dport
    /// mod 1021 seed 0x4b4e4c50 offset 2048 map @endpoints-3` (`nft --debug=netlink`): the
    /// key from reg 2 (NFT_REG32_04), each field in whole 32-bit registers, 16 bytes
    /// hashed into reg 1, then the map lookup and the nat of `DnatMap`.
    #[test]
    fn a_jhash_dnat_lowers_as_nft_sends_it() {
        let payload = |base, offset, len, dreg| KExpr::Payload {
            base,
            offset,
            len,
            dreg,
        };
        let (nh, th) = (NFT_PAYLOAD_NETWORK_HEADER, NFT_PAYLOAD_TRANSPORT_HEADER);
        let tail = |len, proto_reg, family: Family| {
            vec![
                KExpr::Hash {
                    sreg: 12,
                    dreg: 8,
                    len,
                    modulus: 1021,
                    seed: 0x4b4e_4c50,
                    offset: 2048,
                },
                KExpr::Lookup {
                    set: "endpoints-3".into(),
                    sreg: 8,
                    dreg: Some(8),
                    flags: 0,
                },
                KExpr::Nat {
                    kind: NFT_NAT_DNAT,
                    family: family.nfproto() as u32,
                    reg_addr: 8,
                    reg_proto: Some(proto_reg),
                },
            ]
        };
        // [ payload load 4b @ network header + 12 => reg 2 ]
        // [ payload load 2b @ transport header + 0 => reg 13 ]
        // [ payload load 4b @ network header + 16 => reg 14 ]
        // [ payload load 2b @ transport header + 2 => reg 15 ]
        // [ hash reg 1 = jhash(reg 2, 16, 0x4b4e4c50) % mod 1021 offset 2048 ]
        // [ lookup reg 1 set endpoints-3 dreg 1 ]
        // [ nat dnat ip addr_min reg 1 proto_min reg 9 ]
        let mut ip = vec![
            payload(nh, 12, 4, 12),
            payload(th, 0, 2, 13),
            payload(nh, 16, 4, 14),
            payload(th, 2, 2, 15),
        ];
        ip.extend(tail(16, 9, Family::Ip));
        assert_eq!(lower(&[dnat_hash(2048)], Family::Ip), ip);
        // ip6: [ payload load 16b @ network header + 8 => reg 2 ], sport => reg 3 (16),
        // daddr 16b + 24 => reg 17, dport => reg 21, jhash(reg 2, 40, …), proto_min reg 2.
        let mut ip6 = vec![
            payload(nh, 8, 16, 12),
            payload(th, 0, 2, 16),
            payload(nh, 24, 16, 17),
            payload(th, 2, 2, 21),
        ];
        ip6.extend(tail(40, 12, Family::Ip6));
        assert_eq!(lower(&[dnat_hash(2048)], Family::Ip6), ip6);
    }

    /// nft hashes a lone field's own bytes, not its padded register: `jhash ip saddr` is
    /// `jhash(reg 2, 4, …)`, `jhash th sport` `jhash(reg 2, 2, …)`, `jhash ip6 saddr`
    /// `jhash(reg 2, 16, …)`; a concatenation its registers (`ip saddr . ip daddr . meta
    /// l4proto . th sport . th dport`: 20).
    #[test]
    fn a_lone_field_hashes_its_own_bytes_a_concatenation_its_registers() {
        let len = |key: Vec<Field>, family| {
            let e = Expr::DnatHash {
                key,
                modulus: 7,
                seed: 5,
                offset: 0,
                map: "e".into(),
            };
            lower(&[e], family).into_iter().find_map(|k| match k {
                KExpr::Hash { len, sreg: 12, .. } => Some(len),
                _ => None,
            })
        };
        assert_eq!(len(vec![Field::Saddr], Family::Ip), Some(4));
        assert_eq!(len(vec![Field::Sport], Family::Ip), Some(2));
        assert_eq!(len(vec![Field::Saddr], Family::Ip6), Some(16));
        let five = vec![
            Field::Saddr,
            Field::Daddr,
            Field::L4Proto,
            Field::Sport,
            Field::Dport,
        ];
        assert_eq!(len(five, Family::Ip), Some(20));
    }

    #[test]
    fn loaded_field_names_what_load_loads() {
        for family in Family::all() {
            for f in [
                Field::Saddr,
                Field::Daddr,
                Field::L4Proto,
                Field::Dport,
                Field::Sport,
                Field::Random(5),
            ] {
                assert_eq!(loaded_field(&load(f, family, 13), family), Some((f, 13)));
            }
        }
        let odd = KExpr::Payload {
            base: NFT_PAYLOAD_NETWORK_HEADER,
            offset: 9,
            len: 1,
            dreg: 8,
        };
        assert_eq!(loaded_field(&odd, Family::Ip), None);
    }

    #[test]
    fn key_bytes_pad_each_component() {
        let b = key_bytes([
            KeyValue::Addr("10.0.0.1".parse().unwrap()),
            KeyValue::Proto(6),
            KeyValue::Port(80),
        ]);
        assert_eq!(b, vec![10, 0, 0, 1, 6, 0, 0, 0, 0, 80, 0, 0]);
    }
}
