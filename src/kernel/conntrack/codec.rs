//! Pure ctnetlink codec: the dump request, entry decoding and delete messages
//! (`linux/netfilter/nfnetlink_conntrack.h`). Integers in attributes are big-endian.

pub use super::uapi::*;

use std::net::IpAddr;

use crate::kernel::netlink::decode::{attrs_after_header, DecodeError};
use crate::kernel::netlink::msg::nfgenmsg;
use crate::kernel::netlink::msg::{Attr, MsgWriter, RawMsg, NLM_F_ACK, NLM_F_DUMP, NLM_F_REQUEST};
use crate::model::net::Family;

use super::Flow;

pub fn msg_type(m: u16) -> u16 {
    (NFNL_SUBSYS_CTNETLINK << 8) | m
}

/// A dump request for every entry of `family`.
pub fn encode_dump(family: Family, seq: u32) -> Vec<u8> {
    let mut w = MsgWriter::new();
    w.begin_msg(msg_type(IPCTNL_MSG_CT_GET), NLM_F_REQUEST | NLM_F_DUMP, seq);
    w.put_raw(&nfgenmsg(family.nfproto(), 0));
    w.end_msg();
    w.into_bytes()
}

fn put_tuple(
    w: &mut MsgWriter,
    ty: u16,
    src: IpAddr,
    dst: IpAddr,
    proto: u8,
    sport: u16,
    dport: u16,
) {
    w.nest_start(ty);
    w.nest_start(CTA_TUPLE_IP);
    match (src, dst) {
        (IpAddr::V4(s), IpAddr::V4(d)) => {
            w.attr(CTA_IP_V4_SRC, &s.octets());
            w.attr(CTA_IP_V4_DST, &d.octets());
        }
        (IpAddr::V6(s), IpAddr::V6(d)) => {
            w.attr(CTA_IP_V6_SRC, &s.octets());
            w.attr(CTA_IP_V6_DST, &d.octets());
        }
        _ => {}
    }
    w.nest_end();
    w.nest_start(CTA_TUPLE_PROTO);
    w.attr_u8(CTA_PROTO_NUM, proto);
    w.attr_be16(CTA_PROTO_SRC_PORT, sport);
    w.attr_be16(CTA_PROTO_DST_PORT, dport);
    w.nest_end();
    w.nest_end();
}

/// One delete message (with NLM_F_ACK, so each deletion is confirmed or refused).
pub fn encode_delete(w: &mut MsgWriter, f: &Flow, seq: u32) {
    w.begin_msg(
        msg_type(IPCTNL_MSG_CT_DELETE),
        NLM_F_REQUEST | NLM_F_ACK,
        seq,
    );
    w.put_raw(&nfgenmsg(f.family().nfproto(), 0));
    put_tuple(
        w,
        CTA_TUPLE_ORIG,
        f.orig_src,
        f.orig_dst,
        f.proto,
        f.orig_sport,
        f.orig_dport,
    );
    if f.zone != 0 {
        w.attr_be16(CTA_ZONE, f.zone);
    }
    if let Some(id) = f.id {
        w.attr_be32(CTA_ID, id);
    }
    w.end_msg();
}

/// A `NEW` message creating an entry (used by tests to seed the table, like `conntrack -I`).
pub fn encode_new(w: &mut MsgWriter, f: &Flow, timeout: u32, seq: u32) {
    w.begin_msg(
        msg_type(IPCTNL_MSG_CT_NEW),
        NLM_F_REQUEST | NLM_F_ACK | crate::kernel::netlink::msg::NLM_F_CREATE,
        seq,
    );
    w.put_raw(&nfgenmsg(f.family().nfproto(), 0));
    put_tuple(
        w,
        CTA_TUPLE_ORIG,
        f.orig_src,
        f.orig_dst,
        f.proto,
        f.orig_sport,
        f.orig_dport,
    );
    put_tuple(
        w,
        CTA_TUPLE_REPLY,
        f.reply_src,
        f.reply_dst,
        f.proto,
        f.reply_sport,
        f.reply_dport,
    );
    w.attr_be32(7, timeout); // CTA_TIMEOUT
    w.end_msg();
}

fn ip_of(a: &Attr<'_>) -> Option<IpAddr> {
    match a.data.len() {
        4 => Some(IpAddr::from(<[u8; 4]>::try_from(a.data).ok()?)),
        16 => Some(IpAddr::from(<[u8; 16]>::try_from(a.data).ok()?)),
        _ => None,
    }
}

/// What a decode error calls a dump reply.
const ENTRY: &str = "conntrack entry";

type Tuple = (IpAddr, IpAddr, u8, u16, u16);

fn decode_tuple(a: Attr<'_>) -> Result<Tuple, DecodeError> {
    let t = a.nested();
    let ip = t.require(CTA_TUPLE_IP, ENTRY, "tuple addresses")?.nested();
    let (s, d) = match (ip.get(CTA_IP_V4_SRC), ip.get(CTA_IP_V4_DST)) {
        (Some(_), Some(_)) => (CTA_IP_V4_SRC, CTA_IP_V4_DST),
        _ => (CTA_IP_V6_SRC, CTA_IP_V6_DST),
    };
    let p = t
        .require(CTA_TUPLE_PROTO, ENTRY, "tuple protocol")?
        .nested();
    Ok((
        ip.read(s, ENTRY, "source address", ip_of)?,
        ip.read(d, ENTRY, "destination address", ip_of)?,
        p.read(CTA_PROTO_NUM, ENTRY, "protocol number", Attr::u8)?,
        p.get(CTA_PROTO_SRC_PORT)
            .and_then(|x| x.be16())
            .unwrap_or(0),
        p.get(CTA_PROTO_DST_PORT)
            .and_then(|x| x.be16())
            .unwrap_or(0),
    ))
}

/// Decodes one entry of a dump.
pub fn decode_flow(m: &RawMsg<'_>) -> Result<Flow, DecodeError> {
    let a = attrs_after_header(m, "nfgenmsg", 4, ENTRY)?;
    let o = decode_tuple(a.require(CTA_TUPLE_ORIG, ENTRY, "original tuple")?)?;
    let r = decode_tuple(a.require(CTA_TUPLE_REPLY, ENTRY, "reply tuple")?)?;
    Ok(Flow {
        proto: o.2,
        orig_src: o.0,
        orig_dst: o.1,
        orig_sport: o.3,
        orig_dport: o.4,
        reply_src: r.0,
        reply_dst: r.1,
        reply_sport: r.3,
        reply_dport: r.4,
        zone: a.get(CTA_ZONE).and_then(|x| x.be16()).unwrap_or(0),
        id: a.get(CTA_ID).and_then(|x| x.be32()),
    })
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    proptest! {
        #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]
        /// Kernel replies are input too: any bytes decode or fail, never panic.
        #[test]
        fn decode_flow_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
            let m = RawMsg { ty: 0, flags: 0x300, seq: 0, pid: 0, payload: &bytes };
            let _ = decode_flow(&m);
        }
    }

    use super::*;
    use crate::kernel::netlink::msg::parse_msgs;

    fn flow() -> Flow {
        Flow {
            proto: 17,
            orig_src: "10.244.1.3".parse().unwrap(),
            orig_dst: "10.96.0.53".parse().unwrap(),
            orig_sport: 40000,
            orig_dport: 53,
            reply_src: "10.244.1.2".parse().unwrap(),
            reply_dst: "10.244.1.3".parse().unwrap(),
            reply_sport: 53,
            reply_dport: 40000,
            zone: 0,
            id: Some(7),
        }
    }

    #[test]
    fn delete_message_layout_matches_the_uapi() {
        let mut w = MsgWriter::new();
        encode_delete(&mut w, &flow(), 5);
        let b = w.into_bytes();
        // nlmsghdr: type CTNETLINK<<8 | DELETE, flags REQUEST|ACK
        assert_eq!(&b[4..8], &[0x02, 0x01, 0x05, 0x00]);
        // nfgenmsg: AF_INET, v0, res 0
        assert_eq!(&b[16..20], &[2, 0, 0, 0]);
        // CTA_TUPLE_ORIG (nested) > CTA_TUPLE_IP (nested) > V4_SRC
        assert_eq!(&b[20..24], &[52, 0, 0x01, 0x80]);
        assert_eq!(&b[24..28], &[20, 0, 0x01, 0x80]);
        assert_eq!(&b[28..36], &[8, 0, 1, 0, 10, 244, 1, 3]);
        assert_eq!(&b[36..44], &[8, 0, 2, 0, 10, 96, 0, 53]);
        // CTA_TUPLE_PROTO > NUM (u8, padded), SRC_PORT be16, DST_PORT be16
        assert_eq!(&b[44..48], &[28, 0, 0x02, 0x80]);
        assert_eq!(&b[48..56], &[5, 0, 1, 0, 17, 0, 0, 0]);
        assert_eq!(&b[56..64], &[6, 0, 2, 0, 0x9c, 0x40, 0, 0]);
        assert_eq!(&b[64..72], &[6, 0, 3, 0, 0, 53, 0, 0]);
        // CTA_ID be32
        assert_eq!(&b[72..80], &[8, 0, 12, 0, 0, 0, 0, 7]);
        assert_eq!(b.len(), 80);
    }

    #[test]
    fn new_message_round_trips_through_the_decoder() {
        let mut w = MsgWriter::new();
        let f = Flow { id: None, ..flow() };
        encode_new(&mut w, &f, 60, 1);
        let b = w.into_bytes();
        let m = parse_msgs(&b).unwrap();
        assert_eq!(decode_flow(&m[0]).unwrap(), f);
    }

    #[test]
    fn an_entry_without_its_reply_tuple_names_what_is_missing() {
        let mut w = MsgWriter::new();
        encode_delete(&mut w, &flow(), 1);
        let b = w.into_bytes();
        let m = parse_msgs(&b).unwrap();
        let e = decode_flow(&m[0]).unwrap_err();
        assert_eq!(e, DecodeError::missing(ENTRY, "reply tuple"));
        assert_eq!(
            e.to_string(),
            "cannot decode conntrack entry: no reply tuple"
        );
    }

    #[test]
    fn garbage_is_an_error_not_a_panic() {
        for n in 0..40 {
            let p = vec![0xffu8; n];
            let m = RawMsg {
                ty: 0,
                flags: 0,
                seq: 0,
                pid: 0,
                payload: &p,
            };
            assert!(decode_flow(&m).is_err());
        }
    }
}
