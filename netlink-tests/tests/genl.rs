//! The generic netlink family lookup that the IPVS mode starts with, against this kernel:
//! "nlctrl" resolves to its fixed id, and "IPVS" is reported missing here (this kernel has no
//! ip_vs; the IPVS mode's own tests need the VM harness of issue #6).
#![allow(clippy::disallowed_methods)] // tests may run test-time tools

use kube_nlproxy::kernel::ipvs::codec::{
    decode_family_id, encode_get_family, GENL_ID_CTRL, IPVS_GENL_NAME,
};
use kube_nlproxy::kernel::netlink::socket::{NetlinkSocket, NETLINK_GENERIC};
use netlink_tests::ns::{require_root, NetNs};

#[test]
fn genl_family_resolution() {
    require_root();
    let ns = NetNs::new("genl");
    let (ctrl, ipvs) = ns.run(|| {
        let mut s = NetlinkSocket::open(NETLINK_GENERIC).unwrap();
        let seq = s.next_seq();
        let msgs = s
            .dump(&encode_get_family("nlctrl", seq), seq, "family nlctrl")
            .unwrap();
        let ctrl = decode_family_id(&msgs[0].as_raw());
        let seq = s.next_seq();
        let ipvs = s.dump(&encode_get_family(IPVS_GENL_NAME, seq), seq, "family IPVS");
        (ctrl, ipvs.map(|m| m.len()).map_err(|e| e.errno()))
    });
    assert_eq!(ctrl, Some(GENL_ID_CTRL));
    let ipvs_loaded = std::path::Path::new("/proc/net/ip_vs").exists();
    if ipvs_loaded {
        assert!(ipvs.is_ok(), "{ipvs:?}");
    } else {
        assert_eq!(
            ipvs,
            Err(Some(libc::ENOENT)),
            "IPVS absent from this kernel is reported as ENOENT"
        );
    }
}
