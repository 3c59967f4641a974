//! Pure ipset codec: the name-list dump and the destroy request, and set names out of the
//! list replies. Byte tests below.

use crate::kernel::netlink::msg::{
    nfgenmsg, Attrs, MsgWriter, RawMsg, NLM_F_ACK, NLM_F_DUMP, NLM_F_REQUEST,
};

use super::uapi::*;

pub fn msg_type(cmd: u16) -> u16 {
    (NFNL_SUBSYS_IPSET << 8) | cmd
}

/// `ipset list -n`: a dump of every set's name.
pub fn encode_list_names(seq: u32) -> Vec<u8> {
    let mut w = MsgWriter::new();
    w.begin_msg(msg_type(IPSET_CMD_LIST), NLM_F_REQUEST | NLM_F_DUMP, seq);
    w.put_raw(&nfgenmsg(NFPROTO_IPV4, 0));
    w.attr_u8(IPSET_ATTR_PROTOCOL, IPSET_PROTOCOL);
    w.attr(
        IPSET_ATTR_FLAGS | NLA_F_NET_BYTEORDER,
        &IPSET_FLAG_LIST_SETNAME.to_be_bytes(),
    );
    w.end_msg();
    w.into_bytes()
}

/// `ipset destroy NAME`, acknowledged.
pub fn encode_destroy(name: &str, seq: u32) -> Vec<u8> {
    let mut w = MsgWriter::new();
    w.begin_msg(msg_type(IPSET_CMD_DESTROY), NLM_F_REQUEST | NLM_F_ACK, seq);
    w.put_raw(&nfgenmsg(NFPROTO_IPV4, 0));
    w.attr_u8(IPSET_ATTR_PROTOCOL, IPSET_PROTOCOL);
    w.attr_str(IPSET_ATTR_SETNAME, name);
    w.end_msg();
    w.into_bytes()
}

/// The set name of one list reply (a set may span several replies: callers dedup).
pub fn decode_set_name(m: &RawMsg<'_>) -> Option<String> {
    if m.ty != msg_type(IPSET_CMD_LIST) || m.payload.len() < 4 {
        return None;
    }
    Attrs::new(&m.payload[4..])
        .get(IPSET_ATTR_SETNAME)
        .and_then(|a| a.str())
        .map(str::to_string)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernel::netlink::msg::parse_msgs;

    #[test]
    fn list_request_bytes() {
        let b = encode_list_names(5);
        assert_eq!(
            b,
            [
                36, 0, 0, 0, // len
                0x07, 0x06, // type: IPSET_CMD_LIST | subsys 6 << 8
                0x01, 0x03, // REQUEST | DUMP
                5, 0, 0, 0, 0, 0, 0, 0, // seq, port
                2, 0, 0, 0, // nfgenmsg: AF_INET, v0, res 0
                5, 0, 1, 0, 7, 0, 0, 0, // PROTOCOL = 7
                8, 0, 6, 0x40, 0, 0, 0, 2, // FLAGS | NET_BYTEORDER = LIST_SETNAME (be)
            ]
        );
    }

    #[test]
    fn destroy_request_bytes() {
        let b = encode_destroy("KUBE-CLUSTER-IP", 9);
        let msgs = parse_msgs(&b).unwrap();
        assert_eq!(msgs[0].ty, 0x0603);
        assert_eq!(msgs[0].flags, NLM_F_REQUEST | NLM_F_ACK);
        let a = Attrs::new(&msgs[0].payload[4..]);
        assert_eq!(a.get(IPSET_ATTR_PROTOCOL).and_then(|x| x.u8()), Some(7));
        assert_eq!(
            a.get(IPSET_ATTR_SETNAME).and_then(|x| x.str()),
            Some("KUBE-CLUSTER-IP")
        );
    }

    #[test]
    fn names_from_replies_and_garbage() {
        let mut w = MsgWriter::new();
        w.begin_msg(msg_type(IPSET_CMD_LIST), 0, 1);
        w.put_raw(&nfgenmsg(2, 0));
        w.attr_u8(IPSET_ATTR_PROTOCOL, 7);
        w.attr_str(IPSET_ATTR_SETNAME, "KUBE-LOOP-BACK");
        w.end_msg();
        let b = w.into_bytes();
        let m = &parse_msgs(&b).unwrap()[0];
        assert_eq!(decode_set_name(m).as_deref(), Some("KUBE-LOOP-BACK"));
        for cut in 0..b.len() {
            if let Ok(ms) = parse_msgs(&b[..cut]) {
                for m in &ms {
                    let _ = decode_set_name(m);
                }
            }
        }
    }
}
