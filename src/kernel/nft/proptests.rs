//! Property tests: every decoder takes arbitrary bytes without panicking (kernel replies are
//! input too), and typed expressions survive lower → encode → decode unchanged.

use proptest::prelude::*;

use crate::kernel::netlink::msg::{parse_error, parse_msgs, Attrs, RawMsg};
use crate::kernel::nft::decode::{
    decode_chain, decode_elements, decode_rule, decode_set, decode_table,
};
use crate::kernel::nft::encode::rule_message;
use crate::kernel::nft::lower::lower;
use crate::kernel::nft::{Cidr, CmpOp, Expr, Family, Field, Verdict};

fn raw(payload: &[u8]) -> RawMsg<'_> {
    RawMsg {
        ty: 0,
        flags: 0x300,
        seq: 0,
        pid: 0,
        payload,
    }
}

fn field() -> impl Strategy<Value = Field> {
    prop_oneof![
        Just(Field::Saddr),
        Just(Field::Daddr),
        Just(Field::L4Proto),
        Just(Field::Dport),
        Just(Field::Sport)
    ]
}

fn expr(family: Family) -> impl Strategy<Value = Expr> {
    let addr = move |b: [u8; 16]| -> std::net::IpAddr {
        match family {
            Family::Ip => std::net::Ipv4Addr::new(b[0], b[1], b[2], b[3]).into(),
            Family::Ip6 => std::net::Ipv6Addr::from(b).into(),
        }
    };
    let max = if family == Family::Ip { 32 } else { 128 };
    prop_oneof![
        (
            any::<[u8; 16]>(),
            0..=max as u8,
            any::<bool>(),
            any::<bool>()
        )
            .prop_map(move |(b, p, neq, src)| Expr::Addr {
                field: if src { Field::Saddr } else { Field::Daddr },
                op: if neq { CmpOp::Neq } else { CmpOp::Eq },
                value: Cidr::new(addr(b), p).unwrap(),
            }),
        any::<u8>().prop_map(Expr::L4Proto),
        ("[a-z0-9]{1,15}", any::<bool>(), any::<bool>()).prop_map(|(name, prefix, neq)| {
            Expr::IifName {
                name,
                prefix,
                op: if neq { CmpOp::Neq } else { CmpOp::Eq },
            }
        }),
        (
            proptest::collection::vec(field(), 1..4),
            "[a-z-]{1,20}",
            any::<bool>()
        )
            .prop_map(|(key, set, negate)| Expr::InSet { key, set, negate }),
        Just(Expr::CtStateNew),
        Just(Expr::CtStateInvalid),
        Just(Expr::CtStatusDnat),
        Just(Expr::FibLocal(Field::Saddr)),
        any::<u32>().prop_map(Expr::MarkBitClear),
        (1u32..10_000).prop_map(Expr::NumgenZero),
        (proptest::collection::vec(field(), 1..4), "[a-z-]{1,20}")
            .prop_map(|(key, map)| Expr::Vmap { key, map }),
        any::<u32>().prop_map(Expr::MarkOr),
        any::<bool>().prop_map(|fully_random| Expr::Masquerade { fully_random }),
        (any::<[u8; 16]>(), any::<u16>()).prop_map(move |(b, port)| Expr::Dnat {
            addr: addr(b),
            port
        }),
        Just(Expr::Reject),
        any::<u16>().prop_map(|port| Expr::Redirect { port }),
        (1u32..10_000, any::<u32>(), "[a-z-]{1,20}").prop_map(|(modulus, offset, map)| {
            Expr::DnatMap {
                modulus,
                offset,
                map,
            }
        }),
        (
            proptest::collection::vec(field(), 1..4),
            1u32..10_000,
            any::<u32>(),
            any::<u32>(),
            "[a-z-]{1,20}"
        )
            .prop_map(|(key, modulus, seed, offset, map)| Expr::DnatHash {
                key,
                modulus,
                seed,
                offset,
                map,
            }),
        "[a-z-]{1,20}".prop_map(|set| Expr::UpdateSet {
            set,
            key: Field::Saddr
        }),
        "[a-z/0-9-]{1,60}".prop_map(|c| Expr::Verdict(Verdict::Goto(c.into()))),
        Just(Expr::Verdict(Verdict::Return)),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    #[test]
    fn decoders_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
        let m = raw(&bytes);
        let _ = decode_rule(&m);
        let _ = decode_chain(&m);
        let _ = decode_set(&m);
        let _ = decode_elements(&m);
        let _ = decode_table(&m);
        let _ = parse_msgs(&bytes);
        let _ = parse_error(&m);
        let _ = crate::kernel::nft::monitor::is_foreign_change(&m, "t", &Family::all(), 0);
        for a in Attrs::new(&bytes) {
            let _ = (a.str(), a.be32(), a.be64(), a.nested().count());
        }
    }

    #[test]
    fn expressions_round_trip(v4 in any::<bool>(), exprs in proptest::collection::vec(expr(Family::Ip), 1..12), exprs6 in proptest::collection::vec(expr(Family::Ip6), 1..12)) {
        let (family, exprs) = if v4 { (Family::Ip, exprs) } else { (Family::Ip6, exprs6) };
        let k = lower(&exprs, family);
        let b = rule_message(family, &k);
        let m = parse_msgs(&b).unwrap();
        prop_assert_eq!(decode_rule(&m[0]).unwrap().exprs, k);
    }
}
