//! The rtnetlink messages the IPVS mode needs (look up and create a dummy link, dump,
//! add and delete addresses, and their notifications), built and parsed with
//! `netlink-packet-route`: this module only maps its types to ours and frames them for our
//! one socket (`kernel::netlink::socket`). Pure.

use std::net::IpAddr;

use netlink_packet_core::{
    NetlinkDeserializable, NetlinkHeader, NetlinkMessage, NetlinkPayload, NLM_F_ACK, NLM_F_CREATE,
    NLM_F_DUMP, NLM_F_EXCL, NLM_F_REQUEST,
};
use netlink_packet_route::address::{AddressAttribute, AddressFlags, AddressMessage};
use netlink_packet_route::link::{InfoKind, LinkAttribute, LinkInfo, LinkMessage};
use netlink_packet_route::{AddressFamily, RouteNetlinkMessage};

use crate::kernel::netlink::msg::RawMsg;

pub use super::uapi::{
    RTM_DELADDR, RTM_DELLINK, RTM_NEWADDR, RTM_NEWLINK, RTNLGRP_IPV4_IFADDR, RTNLGRP_IPV6_IFADDR,
    RTNLGRP_LINK,
};

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

/// One request, framed with our flags and sequence number.
fn frame(msg: RouteNetlinkMessage, flags: u16, seq: u32) -> Vec<u8> {
    let mut header = NetlinkHeader::default();
    header.flags = flags;
    header.sequence_number = seq;
    let mut m = NetlinkMessage::new(header, NetlinkPayload::InnerMessage(msg));
    m.finalize();
    let mut buf = vec![0u8; m.buffer_len()];
    m.serialize(&mut buf);
    buf
}

/// Parses one message our socket received; `None` for anything else or malformed.
fn parse(m: &RawMsg<'_>) -> Option<RouteNetlinkMessage> {
    let mut header = NetlinkHeader::default();
    header.message_type = m.ty;
    header.flags = m.flags;
    header.sequence_number = m.seq;
    header.port_number = m.pid;
    header.length = (m.payload.len() + 16) as u32;
    RouteNetlinkMessage::deserialize(&header, m.payload).ok()
}

/// RTM_GETLINK of one link by name (the reply is one RTM_NEWLINK, or ENODEV).
pub fn encode_get_link(name: &str, seq: u32) -> Vec<u8> {
    let mut l = LinkMessage::default();
    l.attributes.push(LinkAttribute::IfName(name.into()));
    frame(RouteNetlinkMessage::GetLink(l), NLM_F_REQUEST, seq)
}

/// RTM_NEWLINK creating a dummy link named `name` (left down, as upstream leaves
/// kube-ipvs0: addresses on it are local either way and it never answers ARP).
pub fn encode_new_dummy(name: &str, seq: u32) -> Vec<u8> {
    let mut l = LinkMessage::default();
    l.attributes.push(LinkAttribute::IfName(name.into()));
    l.attributes
        .push(LinkAttribute::LinkInfo(vec![LinkInfo::Kind(
            InfoKind::Dummy,
        )]));
    frame(
        RouteNetlinkMessage::NewLink(l),
        NLM_F_REQUEST | NLM_F_ACK | NLM_F_CREATE | NLM_F_EXCL,
        seq,
    )
}

/// RTM_DELLINK of the link with `index`.
pub fn encode_del_link(index: u32, seq: u32) -> Vec<u8> {
    let mut l = LinkMessage::default();
    l.header.index = index;
    frame(
        RouteNetlinkMessage::DelLink(l),
        NLM_F_REQUEST | NLM_F_ACK,
        seq,
    )
}

fn link_of(l: &LinkMessage) -> Option<Link> {
    let mut name = None;
    let mut kind = String::new();
    for a in &l.attributes {
        match a {
            LinkAttribute::IfName(n) => name = Some(n.clone()),
            LinkAttribute::LinkInfo(infos) => {
                for i in infos {
                    if let LinkInfo::Kind(k) = i {
                        kind = k.to_string();
                    }
                }
            }
            _ => {}
        }
    }
    Some(Link {
        index: l.header.index,
        name: name?,
        kind,
    })
}

/// Decodes an RTM_NEWLINK message.
pub fn decode_link(m: &RawMsg<'_>) -> Option<Link> {
    if m.ty != RTM_NEWLINK {
        return None;
    }
    match parse(m)? {
        RouteNetlinkMessage::NewLink(l) => link_of(&l),
        _ => None,
    }
}

/// Decodes an RTM_DELLINK notification (the link that went away).
pub fn decode_deleted_link(m: &RawMsg<'_>) -> Option<Link> {
    if m.ty != RTM_DELLINK {
        return None;
    }
    match parse(m)? {
        RouteNetlinkMessage::DelLink(l) => link_of(&l),
        _ => None,
    }
}

/// RTM_GETLINK dump of every link.
pub fn encode_dump_links(seq: u32) -> Vec<u8> {
    frame(
        RouteNetlinkMessage::GetLink(LinkMessage::default()),
        NLM_F_REQUEST | NLM_F_DUMP,
        seq,
    )
}

/// RTM_GETROUTE for one destination (`ip route get ADDR`): the reply names the output
/// interface the kernel would use.
pub fn encode_get_route(dst: IpAddr, seq: u32) -> Vec<u8> {
    use netlink_packet_route::route::{RouteAddress, RouteAttribute, RouteMessage};
    let mut m = RouteMessage::default();
    m.header.address_family = match dst {
        IpAddr::V4(_) => AddressFamily::Inet,
        IpAddr::V6(_) => AddressFamily::Inet6,
    };
    m.header.destination_prefix_length = if dst.is_ipv4() { 32 } else { 128 };
    m.attributes
        .push(RouteAttribute::Destination(RouteAddress::from(dst)));
    frame(RouteNetlinkMessage::GetRoute(m), NLM_F_REQUEST, seq)
}

/// The output interface index and preferred source address of an RTM_NEWROUTE reply.
pub fn decode_route(m: &RawMsg<'_>) -> Option<(u32, Option<IpAddr>)> {
    use netlink_packet_route::route::{RouteAddress, RouteAttribute};
    match parse(m)? {
        RouteNetlinkMessage::NewRoute(r) => {
            let mut oif = None;
            let mut src = None;
            for a in &r.attributes {
                match a {
                    RouteAttribute::Oif(i) => oif = Some(*i),
                    RouteAttribute::PrefSource(RouteAddress::Inet(a)) => src = Some(IpAddr::V4(*a)),
                    RouteAttribute::PrefSource(RouteAddress::Inet6(a)) => {
                        src = Some(IpAddr::V6(*a))
                    }
                    _ => {}
                }
            }
            Some((oif?, src))
        }
        _ => None,
    }
}

/// RTM_GETADDR dump of every address of every family.
pub fn encode_get_addrs(seq: u32) -> Vec<u8> {
    frame(
        RouteNetlinkMessage::GetAddress(AddressMessage::default()),
        NLM_F_REQUEST | NLM_F_DUMP,
        seq,
    )
}

/// RTM_NEWADDR (`add`) or RTM_DELADDR of `a`. No duplicate address detection: a service
/// VIP must be usable at once.
pub fn encode_addr(add: bool, a: &IfAddr, seq: u32) -> Vec<u8> {
    let mut m = AddressMessage::default();
    m.header.family = match a.addr {
        IpAddr::V4(_) => AddressFamily::Inet,
        IpAddr::V6(_) => AddressFamily::Inet6,
    };
    m.header.prefix_len = a.prefix_len;
    m.header.index = a.index;
    m.header.flags = netlink_packet_route::address::AddressHeaderFlags::Nodad;
    m.attributes.push(AddressAttribute::Local(a.addr));
    m.attributes.push(AddressAttribute::Address(a.addr));
    if add {
        m.attributes
            .push(AddressAttribute::Flags(AddressFlags::Nodad));
        frame(
            RouteNetlinkMessage::NewAddress(m),
            NLM_F_REQUEST | NLM_F_ACK | NLM_F_CREATE | NLM_F_EXCL,
            seq,
        )
    } else {
        frame(
            RouteNetlinkMessage::DelAddress(m),
            NLM_F_REQUEST | NLM_F_ACK,
            seq,
        )
    }
}

/// Decodes an RTM_NEWADDR/RTM_DELADDR message. IPv4 reports the local address in IFA_LOCAL
/// (IFA_ADDRESS is the peer on point-to-point links); IPv6 only has IFA_ADDRESS.
pub fn decode_addr(m: &RawMsg<'_>) -> Option<IfAddr> {
    if m.ty != RTM_NEWADDR && m.ty != RTM_DELADDR {
        return None;
    }
    let msg = match parse(m)? {
        RouteNetlinkMessage::NewAddress(a) | RouteNetlinkMessage::DelAddress(a) => a,
        _ => return None,
    };
    let (mut local, mut address) = (None, None);
    for a in &msg.attributes {
        match a {
            AddressAttribute::Local(x) => local = Some(*x),
            AddressAttribute::Address(x) => address = Some(*x),
            _ => {}
        }
    }
    let addr = local.or(address)?;
    let family_matches = matches!(
        (msg.header.family, addr),
        (AddressFamily::Inet, IpAddr::V4(_)) | (AddressFamily::Inet6, IpAddr::V6(_))
    );
    family_matches.then_some(IfAddr {
        index: msg.header.index,
        addr,
        prefix_len: msg.header.prefix_len,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernel::netlink::msg::{parse_msgs, Attrs, MsgWriter};
    use crate::kernel::rtnl::uapi::{IFLA_IFNAME, IFLA_INFO_KIND, IFLA_LINKINFO};

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
        // netlink-packet-route leaves NLA_F_NESTED off IFLA_LINKINFO, as iproute2 does; the
        // kernel parses it as nested either way (rtnl_newlink, nla_parse_nested_deprecated).
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

#[cfg(test)]
mod route_tests {
    use super::*;
    use crate::kernel::netlink::msg::parse_msgs;

    #[test]
    fn route_request_round_trips_its_destination() {
        use netlink_packet_route::route::{RouteAddress, RouteAttribute};
        let b = encode_get_route("10.244.1.2".parse().unwrap(), 7);
        let m = parse_msgs(&b).unwrap();
        assert_eq!(m[0].ty, 26, "RTM_GETROUTE");
        match parse(&m[0]) {
            Some(RouteNetlinkMessage::GetRoute(r)) => {
                assert_eq!(r.header.destination_prefix_length, 32);
                assert!(r
                    .attributes
                    .contains(&RouteAttribute::Destination(RouteAddress::Inet(
                        "10.244.1.2".parse().unwrap()
                    ))));
            }
            other => panic!("{other:?}"),
        }
    }
}
