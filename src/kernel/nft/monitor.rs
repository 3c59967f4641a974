//! Change notifications: the kernel multicasts every committed nf_tables change on the
//! `NFNLGRP_NFTABLES` group, each message stamped with the netlink port of the socket that
//! made it. A change to our table from any other socket (an admin's `nft flush ruleset`,
//! another agent) means our rules may be gone: the syncer then restores them with a full
//! sync, at once, without polling a canary. Classification is pure; [`watch`] does the I/O.

use super::uapi::*;

use crate::kernel::netlink::msg::{Attrs, RawMsg};
use crate::kernel::netlink::socket::{NetlinkSocket, NETLINK_NETFILTER};

use super::encode::{NFNL_SUBSYS_NFTABLES, NFT_MSG_GETGEN};
use super::Family;

/// Whether one notification reports a change to our table made by someone else.
pub fn is_foreign_change(m: &RawMsg<'_>, table: &str, families: &[Family], our_port: u32) -> bool {
    if m.ty >> 8 != NFNL_SUBSYS_NFTABLES || m.pid == our_port {
        return false;
    }
    let msg = m.ty & 0xff;
    if msg == NFT_MSG_NEWGEN || msg == NFT_MSG_GETGEN {
        return false;
    }
    let Some(family) = m.payload.first().and_then(|f| Family::from_nfproto(*f)) else {
        return false;
    };
    if !families.contains(&family) {
        return false;
    }
    // Every nf_tables object message names its table in attribute 1.
    Attrs::new(m.payload.get(4..).unwrap_or(&[]))
        .get(1)
        .and_then(|a| a.str())
        == Some(table)
}

/// A subscription to nf_tables change notifications.
pub struct Monitor {
    sock: NetlinkSocket,
}

impl Monitor {
    pub fn open() -> Result<Self, crate::kernel::netlink::Error> {
        let sock = NetlinkSocket::open(NETLINK_NETFILTER)?;
        sock.add_membership(NFNLGRP_NFTABLES)?;
        Ok(Monitor { sock })
    }

    /// A handle to pause the subscription: the kernel builds a notification for every
    /// object of every batch while anyone listens, which triples the commit time of a
    /// full sync (see `NetlinkNftables::quiet_large_batches`).
    pub fn switch(
        &self,
    ) -> Result<crate::kernel::netlink::socket::GroupSwitch, crate::kernel::netlink::Error> {
        self.sock.group_switch(NFNLGRP_NFTABLES)
    }

    /// Listens for changes and calls `on_foreign` for each batch that touched our table from
    /// another socket. Runs until the socket fails; meant for its own thread.
    pub fn run(
        self,
        table: String,
        our_port: impl Fn() -> u32,
        on_foreign: impl FnMut(),
    ) -> Result<(), crate::kernel::netlink::Error> {
        listen(self.sock, table, our_port, on_foreign)
    }
}

/// Opens a subscription and runs it (see [`Monitor::run`]).
pub fn watch(
    table: String,
    our_port: impl Fn() -> u32,
    on_foreign: impl FnMut(),
) -> Result<(), crate::kernel::netlink::Error> {
    Monitor::open()?.run(table, our_port, on_foreign)
}

fn listen(
    mut sock: NetlinkSocket,
    table: String,
    our_port: impl Fn() -> u32,
    on_foreign: impl FnMut(),
) -> Result<(), crate::kernel::netlink::Error> {
    let families = Family::all();
    sock.watch_notifications(
        |msgs| {
            let port = our_port();
            msgs.iter()
                .any(|m| is_foreign_change(m, &table, &families, port))
        },
        on_foreign,
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernel::netlink::msg::parse_msgs;
    use crate::kernel::netlink::msg::MsgWriter;
    use crate::kernel::nft::encode::{msg_type, nfgenmsg, NFT_MSG_DELTABLE};

    fn msg(ty: u16, family: u8, table: &str) -> Vec<u8> {
        let mut w = MsgWriter::new();
        w.begin_msg(ty, 0, 1);
        w.put_raw(&nfgenmsg(family, 0));
        w.attr_str(1, table);
        w.end_msg();
        let mut b = w.into_bytes();
        b[12..16].copy_from_slice(&4242u32.to_ne_bytes()); // sender's port
        b
    }

    #[test]
    fn foreign_changes_to_our_table_only() {
        let fams = Family::all();
        let b = msg(msg_type(NFT_MSG_DELTABLE), 2, "kube-nlproxy");
        let m = parse_msgs(&b).unwrap()[0];
        assert!(is_foreign_change(&m, "kube-nlproxy", &fams, 1));
        assert!(
            !is_foreign_change(&m, "kube-nlproxy", &fams, 4242),
            "our own change"
        );
        let b = msg(msg_type(NFT_MSG_DELTABLE), 2, "other");
        assert!(!is_foreign_change(
            &parse_msgs(&b).unwrap()[0],
            "kube-nlproxy",
            &fams,
            1
        ));
        let b = msg(msg_type(NFT_MSG_DELTABLE), 1, "kube-nlproxy"); // inet family
        assert!(!is_foreign_change(
            &parse_msgs(&b).unwrap()[0],
            "kube-nlproxy",
            &fams,
            1
        ));
        let b = msg(msg_type(NFT_MSG_NEWGEN), 0, "kube-nlproxy");
        assert!(!is_foreign_change(
            &parse_msgs(&b).unwrap()[0],
            "kube-nlproxy",
            &fams,
            1
        ));
    }
}
