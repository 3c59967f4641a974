//! Pure rtnetlink codec for what the IPVS mode needs: look up and create a dummy link,
//! dump addresses, add and delete addresses (`linux/rtnetlink.h`, `if_link.h`,
//! `if_addr.h`). Struct headers are native-endian, as the kernel reads them.

use std::net::IpAddr;

use crate::kernel::netlink::msg::{
    Attrs, MsgWriter, RawMsg, NLM_F_ACK, NLM_F_CREATE, NLM_F_DUMP, NLM_F_EXCL, NLM_F_REQUEST,
};

pub const RTM_NEWLINK: u16 = 16;
pub const RTM_DELLINK: u16 = 17;
pub const RTM_GETLINK: u16 = 18;
pub const RTM_NEWADDR: u16 = 20;
pub const RTM_DELADDR: u16 = 21;
pub const RTM_GETADDR: u16 = 22;

const IFLA_IFNAME: u16 = 3;
const IFLA_LINKINFO: u16 = 18;
const IFLA_INFO_KIND: u16 = 1;

const IFA_ADDRESS: u16 = 1;
const IFA_LOCAL: u16 = 2;
const IFA_FLAGS: u16 = 8;
/// No duplicate address detection: a service VIP must be usable at once.
const IFA_F_NODAD: u32 = 0x02;

/// rtnetlink multicast groups (bit numbers, as `add_membership` takes them).
pub const RTNLGRP_LINK: u32 = 1;
pub const RTNLGRP_IPV4_IFADDR: u32 = 5;
pub const RTNLGRP_IPV6_IFADDR: u32 = 9;

/// A link as listed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Link {
    pub index: u32,
    pub name: String,
    /// `IFLA_INFO_KIND` ("dummy", "veth", …), empty for physical devices.
    pub kind: String,
}

/// An interface address as listed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct IfAddr {
    pub index: u32,
    pub addr: IpAddr,
    pub prefix_len: u8,
}

use crate::kernel::netlink::msg::{af as family_of, ip_bytes as addr_bytes};

/// `struct ifinfomsg` (16 bytes).
fn ifinfomsg(w: &mut MsgWriter, index: u32) {
    let mut h = [0u8; 16];
    h[4..8].copy_from_slice(&(index as i32).to_ne_bytes());
    w.put_raw(&h);
}

/// RTM_GETLINK of one link by name (the reply is one RTM_NEWLINK, or ENODEV).
pub fn encode_get_link(name: &str, seq: u32) -> Vec<u8> {
    let mut w = MsgWriter::new();
    w.begin_msg(RTM_GETLINK, NLM_F_REQUEST, seq);
    ifinfomsg(&mut w, 0);
    w.attr_str(IFLA_IFNAME, name);
    w.end_msg();
    w.into_bytes()
}

/// RTM_NEWLINK creating a dummy link named `name` (left down, as upstream leaves
/// kube-ipvs0: addresses on it are local either way and it never answers ARP).
pub fn encode_new_dummy(name: &str, seq: u32) -> Vec<u8> {
    let mut w = MsgWriter::new();
    w.begin_msg(
        RTM_NEWLINK,
        NLM_F_REQUEST | NLM_F_ACK | NLM_F_CREATE | NLM_F_EXCL,
        seq,
    );
    ifinfomsg(&mut w, 0);
    w.attr_str(IFLA_IFNAME, name);
    w.nest_start(IFLA_LINKINFO);
    w.attr_str(IFLA_INFO_KIND, "dummy");
    w.nest_end();
    w.end_msg();
    w.into_bytes()
}

/// RTM_DELLINK of the link with `index`.
pub fn encode_del_link(index: u32, seq: u32) -> Vec<u8> {
    let mut w = MsgWriter::new();
    w.begin_msg(RTM_DELLINK, NLM_F_REQUEST | NLM_F_ACK, seq);
    ifinfomsg(&mut w, index);
    w.end_msg();
    w.into_bytes()
}

/// Decodes an RTM_NEWLINK message.
pub fn decode_link(m: &RawMsg<'_>) -> Option<Link> {
    if m.ty != RTM_NEWLINK || m.payload.len() < 16 {
        return None;
    }
    let index = i32::from_ne_bytes(m.payload[4..8].try_into().ok()?) as u32;
    let attrs = Attrs::new(&m.payload[16..]);
    let name = attrs.get(IFLA_IFNAME)?.str()?.to_string();
    let kind = attrs
        .get(IFLA_LINKINFO)
        .and_then(|li| li.nested().get(IFLA_INFO_KIND))
        .and_then(|k| k.str())
        .unwrap_or("")
        .to_string();
    Some(Link { index, name, kind })
}

/// RTM_GETADDR dump of every address of every family.
pub fn encode_get_addrs(seq: u32) -> Vec<u8> {
    let mut w = MsgWriter::new();
    w.begin_msg(RTM_GETADDR, NLM_F_REQUEST | NLM_F_DUMP, seq);
    w.put_raw(&[0u8; 8]);
    w.end_msg();
    w.into_bytes()
}

/// RTM_NEWADDR (`add`) or RTM_DELADDR of `a`.
pub fn encode_addr(add: bool, a: &IfAddr, seq: u32) -> Vec<u8> {
    let mut w = MsgWriter::new();
    if add {
        w.begin_msg(
            RTM_NEWADDR,
            NLM_F_REQUEST | NLM_F_ACK | NLM_F_CREATE | NLM_F_EXCL,
            seq,
        );
    } else {
        w.begin_msg(RTM_DELADDR, NLM_F_REQUEST | NLM_F_ACK, seq);
    }
    let mut h = [0u8; 8];
    h[0] = family_of(&a.addr);
    h[1] = a.prefix_len;
    h[2] = IFA_F_NODAD as u8;
    h[3] = 0; // RT_SCOPE_UNIVERSE
    h[4..8].copy_from_slice(&a.index.to_ne_bytes());
    w.put_raw(&h);
    let bytes = addr_bytes(&a.addr);
    w.attr(IFA_LOCAL, &bytes);
    w.attr(IFA_ADDRESS, &bytes);
    if add {
        w.attr_u32(IFA_FLAGS, IFA_F_NODAD);
    }
    w.end_msg();
    w.into_bytes()
}

/// Decodes an RTM_NEWADDR/RTM_DELADDR message. IPv4 reports the local address in IFA_LOCAL
/// (IFA_ADDRESS is the peer on point-to-point links); IPv6 only has IFA_ADDRESS.
pub fn decode_addr(m: &RawMsg<'_>) -> Option<IfAddr> {
    if (m.ty != RTM_NEWADDR && m.ty != RTM_DELADDR) || m.payload.len() < 8 {
        return None;
    }
    let fam = m.payload[0];
    let prefix_len = m.payload[1];
    let index = u32::from_ne_bytes(m.payload[4..8].try_into().ok()?);
    let attrs = Attrs::new(&m.payload[8..]);
    let a = attrs.get(IFA_LOCAL).or_else(|| attrs.get(IFA_ADDRESS))?;
    let addr = if fam == libc::AF_INET as u8 {
        IpAddr::from(<[u8; 4]>::try_from(a.data.get(..4)?).ok()?)
    } else if fam == libc::AF_INET6 as u8 {
        IpAddr::from(<[u8; 16]>::try_from(a.data.get(..16)?).ok()?)
    } else {
        return None;
    };
    Some(IfAddr {
        index,
        addr,
        prefix_len,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernel::netlink::msg::parse_msgs;

    #[test]
    fn new_dummy_layout() {
        let b = encode_new_dummy("kube-ipvs0", 7);
        let m = parse_msgs(&b).unwrap();
        assert_eq!(m.len(), 1);
        assert_eq!(m[0].ty, RTM_NEWLINK);
        assert_eq!(
            m[0].flags,
            NLM_F_REQUEST | NLM_F_ACK | NLM_F_CREATE | NLM_F_EXCL
        );
        // ifinfomsg: 16 zero bytes (AF_UNSPEC, index 0, no flags).
        assert_eq!(&m[0].payload[..16], &[0u8; 16]);
        let attrs: Vec<_> = Attrs::new(&m[0].payload[16..]).collect();
        assert_eq!(attrs[0].ty, IFLA_IFNAME);
        assert_eq!(attrs[0].data, b"kube-ipvs0\0");
        assert_eq!(attrs[1].ty, IFLA_LINKINFO);
        assert!(attrs[1].nested);
        let kind = attrs[1].nested().get(IFLA_INFO_KIND).unwrap();
        assert_eq!(kind.data, b"dummy\0");
    }

    #[test]
    fn address_round_trip_v4_and_v6() {
        for (addr, plen, fam) in [
            ("10.96.0.1", 32u8, libc::AF_INET as u8),
            ("fd00:96::1", 128, libc::AF_INET6 as u8),
        ] {
            let a = IfAddr {
                index: 9,
                addr: addr.parse().unwrap(),
                prefix_len: plen,
            };
            let b = encode_addr(true, &a, 3);
            let m = parse_msgs(&b).unwrap();
            // ifaddrmsg: family, prefix length, flags, scope, index.
            assert_eq!(m[0].payload[0], fam);
            assert_eq!(m[0].payload[1], plen);
            assert_eq!(&m[0].payload[4..8], &9u32.to_ne_bytes());
            // The kernel answers a dump with the same layout under RTM_NEWADDR.
            assert_eq!(decode_addr(&m[0]), Some(a));
            let del = encode_addr(false, &a, 3);
            assert_eq!(parse_msgs(&del).unwrap()[0].ty, RTM_DELADDR);
        }
    }

    #[test]
    fn link_reply_decodes_kind() {
        // An RTM_NEWLINK as the kernel sends it: ifinfomsg with index 5, then attributes.
        let mut w = MsgWriter::new();
        w.begin_msg(RTM_NEWLINK, 0, 1);
        let mut h = [0u8; 16];
        h[4..8].copy_from_slice(&5i32.to_ne_bytes());
        w.put_raw(&h);
        w.attr_u32(4, 1500); // IFLA_MTU, skipped
        w.attr_str(IFLA_IFNAME, "kube-ipvs0");
        w.nest_start(IFLA_LINKINFO);
        w.attr_str(IFLA_INFO_KIND, "dummy");
        w.nest_end();
        w.end_msg();
        let b = w.into_bytes();
        let m = parse_msgs(&b).unwrap();
        assert_eq!(
            decode_link(&m[0]),
            Some(Link {
                index: 5,
                name: "kube-ipvs0".into(),
                kind: "dummy".into()
            })
        );
    }

    #[test]
    fn garbage_never_panics() {
        for len in 0..40 {
            let payload = vec![0xffu8; len];
            for ty in [RTM_NEWLINK, RTM_NEWADDR] {
                let m = RawMsg {
                    ty,
                    flags: 0,
                    seq: 0,
                    pid: 0,
                    payload: &payload,
                };
                let _ = decode_link(&m);
                let _ = decode_addr(&m);
            }
        }
    }
}
