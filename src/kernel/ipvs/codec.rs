//! Pure codec for the `IPVS` generic netlink family. Integers are native-endian except ports
//! (big-endian) and the IPv4 netmask (big-endian), as `ip_vs_genl_parse_*` reads them.

pub use super::uapi::*;

use netlink_packet_core::{Emitable, NetlinkHeader, NetlinkMessage, NetlinkPayload};
use netlink_packet_generic::ctrl::nlas::GenlCtrlAttrs;
use netlink_packet_generic::ctrl::{GenlCtrl, GenlCtrlCmd};
use netlink_packet_generic::{GenlHeader, GenlMessage};

const GENL_HDRLEN: usize = 4;
use std::net::IpAddr;

use crate::kernel::netlink::decode::{attrs_after_header, DecodeError};
use crate::kernel::netlink::msg::{
    Attr, Attrs, MsgWriter, RawMsg, NLM_F_ACK, NLM_F_DUMP, NLM_F_REQUEST,
};

use super::{Forward, RealServer, Timeouts, VirtualServer};

pub const IPVS_GENL_NAME: &str = "IPVS";

use crate::kernel::netlink::msg::ip_bytes as addr_bytes;

fn af(a: &IpAddr) -> u16 {
    crate::kernel::netlink::msg::af(a).into()
}

/// nlmsghdr and genlmsghdr (from `netlink-packet-generic`) of one IPVS request.
fn begin(w: &mut MsgWriter, family: u16, cmd: u8, flags: u16, seq: u32, version: u8) {
    w.begin_msg(family, NLM_F_REQUEST | flags, seq);
    let mut h = [0u8; GENL_HDRLEN];
    GenlHeader { cmd, version }.emit(&mut h);
    w.put_raw(&h);
}

/// `CTRL_CMD_GETFAMILY` for `name` ("IPVS"), built by `netlink-packet-generic`: the reply
/// carries the family id to use as message type.
pub fn encode_get_family(name: &str, seq: u32) -> Vec<u8> {
    let ctrl = GenlCtrl {
        cmd: GenlCtrlCmd::GetFamily,
        nlas: vec![GenlCtrlAttrs::FamilyName(name.into())],
    };
    let mut header = NetlinkHeader::default();
    header.flags = NLM_F_REQUEST | NLM_F_ACK;
    header.sequence_number = seq;
    let mut m = NetlinkMessage::new(
        header,
        NetlinkPayload::InnerMessage(GenlMessage::from_payload(ctrl)),
    );
    m.finalize();
    let mut buf = vec![0u8; m.buffer_len()];
    m.serialize(&mut buf);
    buf
}

/// `CTRL_ATTR_FAMILY_ID` (linux/genetlink.h): a u16 in host order.
const CTRL_ATTR_FAMILY_ID: u16 = 1;

/// The family id from a `CTRL_CMD_NEWFAMILY` reply: its one attribute we need, read with
/// our own attribute walker after the 4-byte genlmsghdr. `netlink-packet-generic`'s full
/// parse of the reply panicked on a malformed op-policy attribute (its
/// `OppolicyAttr::parse` slices past the buffer; found by the `ipvs_reply` fuzz target).
pub fn decode_family_id(m: &RawMsg<'_>) -> Option<u16> {
    let attrs = m.payload.get(4..)?;
    Attrs::new(attrs).get(CTRL_ATTR_FAMILY_ID)?.u16()
}

fn service_key(w: &mut MsgWriter, vs: &VirtualServer) {
    w.attr_u16(SVC_AF, af(&vs.addr));
    w.attr_u16(SVC_PROTOCOL, vs.protocol as u16);
    w.attr(SVC_ADDR, &addr_bytes(&vs.addr));
    w.attr_be16(SVC_PORT, vs.port);
}

fn service_full(w: &mut MsgWriter, vs: &VirtualServer) {
    service_key(w, vs);
    w.attr_str(SVC_SCHED_NAME, &vs.scheduler);
    let flags = if vs.persistence > 0 {
        IP_VS_SVC_F_PERSISTENT
    } else {
        0
    } | (vs.sched_flags & IP_VS_SVC_F_SCHED_MASK);
    let mut f = Vec::with_capacity(8);
    f.extend_from_slice(&flags.to_ne_bytes());
    f.extend_from_slice(&u32::MAX.to_ne_bytes());
    w.attr(SVC_FLAGS, &f);
    w.attr_u32(SVC_TIMEOUT, vs.persistence);
    match vs.addr {
        IpAddr::V4(_) => w.attr_be32(SVC_NETMASK, u32::MAX),
        IpAddr::V6(_) => w.attr_u32(SVC_NETMASK, 128),
    }
}

/// NEW/SET/DEL of a virtual server (`cmd` one of the `CMD_*_SERVICE`).
pub fn encode_service(family: u16, cmd: u8, vs: &VirtualServer, seq: u32) -> Vec<u8> {
    let mut w = MsgWriter::new();
    begin(&mut w, family, cmd, NLM_F_ACK, seq, IPVS_GENL_VERSION);
    w.nest_start(CMD_ATTR_SERVICE);
    if cmd == CMD_DEL_SERVICE {
        service_key(&mut w, vs);
    } else {
        service_full(&mut w, vs);
    }
    w.nest_end();
    w.end_msg();
    w.into_bytes()
}

fn fwd_code(f: Forward) -> u32 {
    match f {
        Forward::Masquerade => 0,
        Forward::Local => 1,
        Forward::Tunnel => 2,
        Forward::DirectRoute => 3,
    }
}

/// NEW/SET/DEL of a real server of `vs`.
pub fn encode_dest(family: u16, cmd: u8, vs: &VirtualServer, rs: &RealServer, seq: u32) -> Vec<u8> {
    let mut w = MsgWriter::new();
    begin(&mut w, family, cmd, NLM_F_ACK, seq, IPVS_GENL_VERSION);
    w.nest_start(CMD_ATTR_SERVICE);
    service_key(&mut w, vs);
    w.nest_end();
    w.nest_start(CMD_ATTR_DEST);
    w.attr(DEST_ADDR, &addr_bytes(&rs.addr));
    w.attr_be16(DEST_PORT, rs.port);
    if cmd != CMD_DEL_DEST {
        w.attr_u32(DEST_FWD_METHOD, fwd_code(rs.forward));
        w.attr_u32(DEST_WEIGHT, rs.weight);
        w.attr_u32(DEST_U_THRESH, 0);
        w.attr_u32(DEST_L_THRESH, 0);
    }
    w.attr_u16(DEST_ADDR_FAMILY, af(&rs.addr));
    w.nest_end();
    w.end_msg();
    w.into_bytes()
}

/// A dump of every virtual server.
pub fn encode_get_services(family: u16, seq: u32) -> Vec<u8> {
    let mut w = MsgWriter::new();
    begin(
        &mut w,
        family,
        CMD_GET_SERVICE,
        NLM_F_DUMP,
        seq,
        IPVS_GENL_VERSION,
    );
    w.end_msg();
    w.into_bytes()
}

/// A dump of the real servers of `vs`.
pub fn encode_get_dests(family: u16, vs: &VirtualServer, seq: u32) -> Vec<u8> {
    let mut w = MsgWriter::new();
    begin(
        &mut w,
        family,
        CMD_GET_DEST,
        NLM_F_DUMP,
        seq,
        IPVS_GENL_VERSION,
    );
    w.nest_start(CMD_ATTR_SERVICE);
    service_key(&mut w, vs);
    w.nest_end();
    w.end_msg();
    w.into_bytes()
}

/// FLUSH: delete every virtual server (only for `--cleanup` of a node we fully own).
pub fn encode_flush(family: u16, seq: u32) -> Vec<u8> {
    let mut w = MsgWriter::new();
    begin(&mut w, family, CMD_FLUSH, NLM_F_ACK, seq, IPVS_GENL_VERSION);
    w.end_msg();
    w.into_bytes()
}

/// SET_CONFIG (timeouts) or, with `None`, a GET_CONFIG request.
pub fn encode_config(family: u16, t: Option<Timeouts>, seq: u32) -> Vec<u8> {
    let mut w = MsgWriter::new();
    match t {
        Some(t) => {
            begin(
                &mut w,
                family,
                CMD_SET_CONFIG,
                NLM_F_ACK,
                seq,
                IPVS_GENL_VERSION,
            );
            w.attr_u32(CMD_ATTR_TIMEOUT_TCP, t.tcp);
            w.attr_u32(CMD_ATTR_TIMEOUT_TCP_FIN, t.tcp_fin);
            w.attr_u32(CMD_ATTR_TIMEOUT_UDP, t.udp);
        }
        None => begin(&mut w, family, CMD_GET_CONFIG, 0, seq, IPVS_GENL_VERSION),
    }
    w.end_msg();
    w.into_bytes()
}

fn ip_of(a: &Attr<'_>, af: u16) -> Option<IpAddr> {
    if af == libc::AF_INET as u16 {
        Some(IpAddr::from(<[u8; 4]>::try_from(a.data.get(..4)?).ok()?))
    } else {
        Some(IpAddr::from(<[u8; 16]>::try_from(a.data.get(..16)?).ok()?))
    }
}

/// What decode errors call a GET_SERVICE and a GET_DEST reply.
const SERVICE: &str = "IPVS service";
const DEST: &str = "IPVS real server";

/// Decodes a service from a GET_SERVICE reply. Unknown attributes are skipped.
pub fn decode_service(m: &RawMsg<'_>) -> Result<VirtualServer, DecodeError> {
    let top = attrs_after_header(m, "genlmsghdr", GENL_HDRLEN, SERVICE)?;
    let s = top
        .require(CMD_ATTR_SERVICE, SERVICE, "service attribute")?
        .nested();
    let af = s.read(SVC_AF, SERVICE, "address family", Attr::u16)?;
    let flags = s.get(SVC_FLAGS).and_then(|a| a.u32()).unwrap_or(0);
    Ok(VirtualServer {
        addr: s.read(SVC_ADDR, SERVICE, "address (fwmark service?)", |a| {
            ip_of(a, af)
        })?,
        port: s.read(SVC_PORT, SERVICE, "port", Attr::be16)?,
        protocol: s.read(SVC_PROTOCOL, SERVICE, "protocol", Attr::u16)? as u8,
        scheduler: s
            .get(SVC_SCHED_NAME)
            .and_then(|a| a.str())
            .unwrap_or("")
            .to_string(),
        persistence: if flags & IP_VS_SVC_F_PERSISTENT != 0 {
            s.get(SVC_TIMEOUT).and_then(|a| a.u32()).unwrap_or(0)
        } else {
            0
        },
        sched_flags: flags & IP_VS_SVC_F_SCHED_MASK,
    })
}

/// Decodes a real server from a GET_DEST reply.
pub fn decode_dest(m: &RawMsg<'_>, vs_af: u16) -> Result<RealServer, DecodeError> {
    let top = attrs_after_header(m, "genlmsghdr", GENL_HDRLEN, DEST)?;
    let d = top.require(CMD_ATTR_DEST, DEST, "dest attribute")?.nested();
    let af = d
        .get(DEST_ADDR_FAMILY)
        .and_then(|a| a.u16())
        .unwrap_or(vs_af);
    Ok(RealServer {
        addr: d.read(DEST_ADDR, DEST, "address", |a| ip_of(a, af))?,
        port: d.read(DEST_PORT, DEST, "port", Attr::be16)?,
        weight: d.get(DEST_WEIGHT).and_then(|a| a.u32()).unwrap_or(0),
        forward: match d.get(DEST_FWD_METHOD).and_then(|a| a.u32()).unwrap_or(0) & 0x7 {
            1 => Forward::Local,
            2 => Forward::Tunnel,
            3 => Forward::DirectRoute,
            _ => Forward::Masquerade,
        },
        active_conns: d.get(DEST_ACTIVE_CONNS).and_then(|a| a.u32()).unwrap_or(0),
        inactive_conns: d.get(DEST_INACT_CONNS).and_then(|a| a.u32()).unwrap_or(0),
    })
}

/// Decodes a GET_CONFIG reply.
pub fn decode_config(m: &RawMsg<'_>) -> Option<Timeouts> {
    let a = Attrs::new(m.payload.get(4..)?);
    Some(Timeouts {
        tcp: a.get(CMD_ATTR_TIMEOUT_TCP)?.u32()?,
        tcp_fin: a.get(CMD_ATTR_TIMEOUT_TCP_FIN)?.u32()?,
        udp: a.get(CMD_ATTR_TIMEOUT_UDP)?.u32()?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernel::netlink::msg::parse_msgs;

    fn vs() -> VirtualServer {
        VirtualServer {
            addr: "10.96.0.10".parse().unwrap(),
            port: 80,
            protocol: 6,
            scheduler: "rr".into(),
            persistence: 10800,
            sched_flags: 0,
        }
    }

    fn rs() -> RealServer {
        RealServer {
            addr: "10.244.1.2".parse().unwrap(),
            port: 8080,
            weight: 1,
            forward: Forward::Masquerade,
            active_conns: 0,
            inactive_conns: 0,
        }
    }

    #[test]
    fn new_service_bytes_follow_ip_vs_h() {
        let b = encode_service(0x22, CMD_NEW_SERVICE, &vs(), 9);
        // nlmsghdr type = family id, flags REQUEST|ACK; genlmsghdr cmd 1 version 1.
        assert_eq!(&b[4..8], &[0x22, 0, 5, 0]);
        assert_eq!(&b[16..20], &[1, 1, 0, 0]);
        let m = parse_msgs(&b).unwrap()[0];
        let s = Attrs::new(&m.payload[4..]).get(1).unwrap();
        assert!(s.nested);
        let a: Vec<_> = s.nested().map(|a| (a.ty, a.data.to_vec())).collect();
        assert_eq!(
            a[0],
            (1, 2u16.to_ne_bytes().to_vec()),
            "AF_INET, native u16"
        );
        assert_eq!(a[1], (2, 6u16.to_ne_bytes().to_vec()), "protocol");
        assert_eq!(a[2], (3, vec![10, 96, 0, 10]), "address");
        assert_eq!(a[3], (4, vec![0, 80]), "port big-endian");
        assert_eq!(a[4], (6, b"rr\0".to_vec()), "scheduler");
        assert_eq!(a[5].1[..4], 1u32.to_ne_bytes(), "persistent flag");
        assert_eq!(
            a[6],
            (8, 10800u32.to_ne_bytes().to_vec()),
            "persistence timeout"
        );
        assert_eq!(a[7], (9, vec![0xff; 4]), "netmask");
        assert_eq!(decode_service(&m).unwrap(), vs());
    }

    #[test]
    fn dest_round_trips_and_delete_carries_only_the_key() {
        let b = encode_dest(0x22, CMD_NEW_DEST, &vs(), &rs(), 1);
        let m = parse_msgs(&b).unwrap()[0];
        assert_eq!(decode_dest(&m, 2).unwrap(), rs());
        let del = encode_dest(0x22, CMD_DEL_DEST, &vs(), &rs(), 2);
        let m = parse_msgs(&del).unwrap()[0];
        let d = Attrs::new(&m.payload[4..]).get(2).unwrap();
        let types: Vec<u16> = d.nested().map(|a| a.ty).collect();
        assert_eq!(types, vec![1, 2, 11]);
    }

    /// A Maglev virtual server: `mh` with mh-fallback and mh-port in the flags word beside
    /// the persistent flag, read back as sent (the kernel's own flag bits, such as
    /// IP_VS_SVC_F_HASHED in its replies, are not ours and are left out).
    #[test]
    fn scheduler_flags_are_sent_and_read_back() {
        let mh = VirtualServer {
            scheduler: "mh".into(),
            sched_flags: IP_VS_SVC_F_SCHED1 | IP_VS_SVC_F_SCHED2,
            ..vs()
        };
        let b = encode_service(0x22, CMD_NEW_SERVICE, &mh, 1);
        let m = parse_msgs(&b).unwrap()[0];
        let s = Attrs::new(&m.payload[4..]).get(1).unwrap();
        let flags = s.nested().find(|a| a.ty == SVC_FLAGS).unwrap();
        assert_eq!(flags.data[..4], (0x1u32 | 0x8 | 0x10).to_ne_bytes());
        assert_eq!(decode_service(&m).unwrap(), mh);
        // A reply with the kernel's HASHED bit (0x2) set decodes to the same.
        let mut hashed = b.clone();
        let at = hashed
            .windows(4)
            .position(|w| w == (0x19u32).to_ne_bytes())
            .unwrap();
        hashed[at..at + 4].copy_from_slice(&0x1bu32.to_ne_bytes());
        let m = parse_msgs(&hashed).unwrap()[0];
        assert_eq!(decode_service(&m).unwrap(), mh);
    }

    #[test]
    fn ipv6_service_uses_prefix_length_netmask() {
        let mut v = vs();
        v.addr = "fd00::10".parse().unwrap();
        v.persistence = 0;
        let b = encode_service(0x22, CMD_NEW_SERVICE, &v, 1);
        let m = parse_msgs(&b).unwrap()[0];
        assert_eq!(decode_service(&m).unwrap(), v);
    }

    #[test]
    fn config_and_family_messages() {
        let t = Timeouts {
            tcp: 900,
            tcp_fin: 120,
            udp: 300,
        };
        let b = encode_config(0x22, Some(t), 1);
        let m = parse_msgs(&b).unwrap()[0];
        assert_eq!(decode_config(&m), Some(t));
        let g = encode_get_family(IPVS_GENL_NAME, 3);
        assert_eq!(&g[4..6], &GENL_ID_CTRL.to_ne_bytes());
        let m = parse_msgs(&g).unwrap()[0];
        assert_eq!(
            Attrs::new(&m.payload[4..]).get(2).unwrap().str(),
            Some("IPVS")
        );
    }

    #[test]
    fn unknown_attributes_and_garbage_are_no_panic() {
        let mut w = MsgWriter::new();
        w.begin_msg(0x22, 0, 1);
        w.put_raw(&[CMD_NEW_SERVICE, 1, 0, 0]);
        w.nest_start(1);
        w.attr_u16(1, 2);
        w.attr_u16(2, 17);
        w.attr(3, &[10, 0, 0, 1]);
        w.attr_be16(4, 53);
        w.attr(99, &[1, 2, 3]); // unknown: skipped
        w.nest_end();
        w.end_msg();
        let b = w.into_bytes();
        let m = parse_msgs(&b).unwrap()[0];
        let v = decode_service(&m).unwrap();
        assert_eq!((v.port, v.protocol), (53, 17));
        for n in 0..40 {
            let p = vec![0xa5u8; n];
            let m = RawMsg {
                ty: 0,
                flags: 0,
                seq: 0,
                pid: 0,
                payload: &p,
            };
            let _ = decode_service(&m);
            let _ = decode_dest(&m, 2);
            let _ = decode_config(&m);
            let _ = decode_family_id(&m);
        }
    }

    /// A `CTRL_CMD_NEWFAMILY` reply as nlctrl writes it (genlmsghdr, FAMILY_ID, FAMILY_NAME),
    /// and one with a malformed op-policy nest after them: the crate's parser refused that
    /// whole reply (no family id), and panicked on the nest in
    /// `fuzz/regressions/ipvs_reply/`, which `fuzz::tests` replays.
    #[test]
    fn the_family_id_is_read_from_its_attribute_alone() {
        let mut w = MsgWriter::new();
        w.attr_u16(CTRL_ATTR_FAMILY_ID, 0x1f);
        w.attr_str(2, "IPVS");
        let mut payload = vec![1, 2, 0, 0];
        payload.extend(w.into_bytes());
        let m = |p: &[u8]| {
            decode_family_id(&RawMsg {
                ty: 0x10,
                flags: 0,
                seq: 1,
                pid: 0,
                payload: p,
            })
        };
        assert_eq!(m(&payload), Some(0x1f));
        // CTRL_ATTR_OP_POLICY (11) claiming 0xffff bytes of value in a 4-byte attribute.
        payload.extend_from_slice(&[8, 0, 11, 0x80, 4, 0, 0xff, 0xff]);
        assert_eq!(m(&payload), Some(0x1f));
        assert_eq!(m(&payload[..3]), None);
    }
}
