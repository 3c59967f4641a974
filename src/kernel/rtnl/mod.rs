//! rtnetlink for the IPVS mode: the `kube-ipvs0` dummy link that holds every service VIP,
//! and the node's own addresses (NodePort virtual servers). Messages come from
//! `netlink-packet-route` (mapped in the pure [`codec`]); one small I/O type behind the
//! [`Links`] trait sends them on our socket.

pub(crate) mod codec;
pub(crate) mod uapi;

use std::net::IpAddr;

use crate::kernel::netlink::socket::{NetlinkSocket, NETLINK_ROUTE};
pub use codec::{IfAddr, Link};

/// An rtnetlink failure, naming what was attempted.
#[derive(Debug, thiserror::Error)]
#[error("{op}: {source}")]
pub struct Error {
    pub op: String,
    #[source]
    pub source: crate::kernel::netlink::Error,
}

/// Links and addresses, as the IPVS mode needs them.
pub trait Links {
    /// The link called `name`, if it exists.
    fn link(&mut self, name: &str) -> Result<Option<Link>, Error>;
    /// Creates a dummy link called `name`.
    fn add_dummy(&mut self, name: &str) -> Result<(), Error>;
    fn delete_link(&mut self, index: u32) -> Result<(), Error>;
    /// Every address on every link.
    fn addresses(&mut self) -> Result<Vec<IfAddr>, Error>;
    fn add_address(&mut self, a: &IfAddr) -> Result<(), Error>;
    fn delete_address(&mut self, a: &IfAddr) -> Result<(), Error>;
    /// Adds (`add`) or deletes each of `addrs`; one result per address, in order, a failed
    /// one not stopping the others. The kernel client sends them pipelined.
    fn change_addresses(&mut self, add: bool, addrs: &[IfAddr]) -> Vec<Result<(), Error>> {
        addrs
            .iter()
            .map(|a| {
                if add {
                    self.add_address(a)
                } else {
                    self.delete_address(a)
                }
            })
            .collect()
    }
}

fn address_op(add: bool, a: &IfAddr) -> String {
    let verb = if add { "add" } else { "delete" };
    format!("{verb} address {}/{}", a.addr, a.prefix_len)
}

/// [`Links`] over an rtnetlink socket.
pub struct NetlinkLinks {
    sock: NetlinkSocket,
}

impl NetlinkLinks {
    pub fn open() -> Result<Self, Error> {
        let sock = NetlinkSocket::open(NETLINK_ROUTE).map_err(|source| Error {
            op: "open rtnetlink socket".into(),
            source,
        })?;
        Ok(NetlinkLinks { sock })
    }

    fn request(&mut self, build: impl FnOnce(u32) -> Vec<u8>, op: String) -> Result<(), Error> {
        let seq = self.sock.next_seq();
        self.sock
            .dump(&build(seq), seq, &op)
            .map(|_| ())
            .map_err(|source| Error { op, source })
    }
}

impl NetlinkLinks {
    /// Every link (for naming interfaces by index).
    pub fn links(&mut self) -> Result<Vec<Link>, Error> {
        let seq = self.sock.next_seq();
        let msgs = self
            .sock
            .dump(&codec::encode_dump_links(seq), seq, "list links")
            .map_err(|source| Error {
                op: "list links".into(),
                source,
            })?;
        Ok(msgs
            .iter()
            .filter_map(|m| codec::decode_link(&m.as_raw()))
            .collect())
    }

    /// The route the kernel picks for `dst` (`ip route get`): output interface index and
    /// preferred source address; None when it has no route.
    pub fn route_get(&mut self, dst: IpAddr) -> Result<Option<(u32, Option<IpAddr>)>, Error> {
        let seq = self.sock.next_seq();
        match self
            .sock
            .dump(&codec::encode_get_route(dst, seq), seq, "get route")
        {
            Ok(msgs) => Ok(msgs.iter().find_map(|m| codec::decode_route(&m.as_raw()))),
            Err(e) if matches!(e.errno(), Some(libc::ENETUNREACH | libc::EHOSTUNREACH)) => Ok(None),
            Err(source) => Err(Error {
                op: format!("look up the route to {dst}"),
                source,
            }),
        }
    }
}

impl Links for NetlinkLinks {
    fn link(&mut self, name: &str) -> Result<Option<Link>, Error> {
        let seq = self.sock.next_seq();
        match self
            .sock
            .dump(&codec::encode_get_link(name, seq), seq, "get link")
        {
            Ok(msgs) => Ok(msgs.iter().find_map(|m| codec::decode_link(&m.as_raw()))),
            Err(e) if e.errno() == Some(libc::ENODEV) => Ok(None),
            Err(source) => Err(Error {
                op: format!("look up link {name}"),
                source,
            }),
        }
    }

    fn add_dummy(&mut self, name: &str) -> Result<(), Error> {
        self.request(
            |seq| codec::encode_new_dummy(name, seq),
            format!("create dummy link {name}"),
        )
    }

    fn delete_link(&mut self, index: u32) -> Result<(), Error> {
        self.request(
            |seq| codec::encode_del_link(index, seq),
            format!("delete link {index}"),
        )
    }

    fn addresses(&mut self) -> Result<Vec<IfAddr>, Error> {
        let seq = self.sock.next_seq();
        let msgs = self
            .sock
            .dump(&codec::encode_get_addrs(seq), seq, "list addresses")
            .map_err(|source| Error {
                op: "list addresses".into(),
                source,
            })?;
        Ok(msgs
            .iter()
            .filter_map(|m| codec::decode_addr(&m.as_raw()))
            .collect())
    }

    fn add_address(&mut self, a: &IfAddr) -> Result<(), Error> {
        self.request(|seq| codec::encode_addr(true, a, seq), address_op(true, a))
    }

    fn delete_address(&mut self, a: &IfAddr) -> Result<(), Error> {
        self.request(
            |seq| codec::encode_addr(false, a, seq),
            address_op(false, a),
        )
    }

    fn change_addresses(&mut self, add: bool, addrs: &[IfAddr]) -> Vec<Result<(), Error>> {
        self.sock
            .pipelined(
                addrs.len(),
                |i, seq| codec::encode_addr(add, &addrs[i], seq),
                |i| address_op(add, &addrs[i]),
            )
            .into_iter()
            .zip(addrs)
            .map(|(r, a)| {
                r.map_err(|source| Error {
                    op: address_op(add, a),
                    source,
                })
            })
            .collect()
    }
}

/// A host prefix for a VIP: /32 or /128.
pub fn host_prefix(a: &IpAddr) -> u8 {
    if a.is_ipv4() {
        32
    } else {
        128
    }
}

/// In-memory [`Links`] for unit tests.
#[cfg(any(test, feature = "testing"))]
#[derive(Debug, Default)]
pub struct FakeLinks {
    pub links: Vec<Link>,
    pub addrs: Vec<IfAddr>,
}

#[cfg(any(test, feature = "testing"))]
impl Links for FakeLinks {
    fn link(&mut self, name: &str) -> Result<Option<Link>, Error> {
        Ok(self.links.iter().find(|l| l.name == name).cloned())
    }
    fn add_dummy(&mut self, name: &str) -> Result<(), Error> {
        let index = self.links.iter().map(|l| l.index).max().unwrap_or(1) + 1;
        self.links.push(Link {
            index,
            name: name.into(),
            kind: "dummy".into(),
        });
        Ok(())
    }
    fn delete_link(&mut self, index: u32) -> Result<(), Error> {
        self.links.retain(|l| l.index != index);
        self.addrs.retain(|a| a.index != index);
        Ok(())
    }
    fn addresses(&mut self) -> Result<Vec<IfAddr>, Error> {
        Ok(self.addrs.clone())
    }
    fn add_address(&mut self, a: &IfAddr) -> Result<(), Error> {
        if self.addrs.contains(a) {
            return Err(Error {
                op: format!("add address {}", a.addr),
                source: crate::kernel::netlink::Error::Kernel {
                    errno: libc::EEXIST,
                    what: "add address".into(),
                    ext_msg: None,
                },
            });
        }
        self.addrs.push(*a);
        Ok(())
    }
    fn delete_address(&mut self, a: &IfAddr) -> Result<(), Error> {
        self.addrs.retain(|x| x != a);
        Ok(())
    }
}

/// Whether one rtnetlink notification reports that someone else (not the socket with
/// `our_port`) deleted our link or an address on it (`link_index`).
pub fn is_foreign_change(
    m: &crate::kernel::netlink::msg::RawMsg<'_>,
    link_name: &str,
    link_index: Option<u32>,
    our_port: u32,
) -> bool {
    if m.pid == our_port {
        return false;
    }
    match m.ty {
        codec::RTM_DELLINK => codec::decode_deleted_link(m).is_some_and(|l| l.name == link_name),
        codec::RTM_DELADDR => codec::decode_addr(m).is_some_and(|a| Some(a.index) == link_index),
        _ => false,
    }
}

/// Listens for link and address notifications and calls `on_foreign` when our link or one
/// of its addresses was removed by someone else. Runs until the socket fails; meant for its
/// own thread.
pub fn watch(
    link_name: String,
    our_port: impl Fn() -> u32,
    on_foreign: impl FnMut(),
) -> Result<(), crate::kernel::netlink::Error> {
    let mut sock = NetlinkSocket::open(NETLINK_ROUTE)?;
    for g in [
        codec::RTNLGRP_LINK,
        codec::RTNLGRP_IPV4_IFADDR,
        codec::RTNLGRP_IPV6_IFADDR,
    ] {
        sock.add_membership(g)?;
    }
    let mut lookup = NetlinkLinks::open().map_err(|e| e.source)?;
    sock.watch_notifications(
        |msgs| {
            let index = lookup.link(&link_name).ok().flatten().map(|l| l.index);
            let port = our_port();
            msgs.iter()
                .any(|m| is_foreign_change(m, &link_name, index, port))
        },
        on_foreign,
    )
}

impl NetlinkLinks {
    /// The socket's port id: notifications carrying it are our own changes.
    pub fn port_id(&self) -> u32 {
        self.sock.port_id()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernel::netlink::msg::{parse_msgs, RawMsg};

    #[test]
    fn foreign_address_removal_on_our_link_only() {
        let a = IfAddr {
            index: 7,
            addr: "10.96.0.1".parse().unwrap(),
            prefix_len: 32,
        };
        let b = codec::encode_addr(false, &a, 1);
        let m = parse_msgs(&b).unwrap()[0];
        let from = |pid| RawMsg { pid, ..m };
        assert!(is_foreign_change(&from(99), "kube-ipvs0", Some(7), 42));
        assert!(
            !is_foreign_change(&from(42), "kube-ipvs0", Some(7), 42),
            "our own"
        );
        assert!(
            !is_foreign_change(&from(99), "kube-ipvs0", Some(8), 42),
            "another link"
        );
    }
}
