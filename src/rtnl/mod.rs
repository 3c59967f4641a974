//! rtnetlink for the IPVS mode: the `kube-ipvs0` dummy link that holds every service VIP,
//! and the node's own addresses (NodePort virtual servers). A pure codec plus one small
//! I/O type behind the [`Links`] trait.

pub mod codec;

use std::net::IpAddr;

use crate::netlink::socket::{NetlinkSocket, NETLINK_ROUTE};
pub use codec::{IfAddr, Link};

/// An rtnetlink failure, naming what was attempted.
#[derive(Debug, thiserror::Error)]
#[error("{op}: {source}")]
pub struct Error {
    pub op: String,
    #[source]
    pub source: crate::netlink::Error,
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
        self.request(
            |seq| codec::encode_addr(true, a, seq),
            format!("add address {}/{}", a.addr, a.prefix_len),
        )
    }

    fn delete_address(&mut self, a: &IfAddr) -> Result<(), Error> {
        self.request(
            |seq| codec::encode_addr(false, a, seq),
            format!("delete address {}/{}", a.addr, a.prefix_len),
        )
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
#[derive(Debug, Default)]
pub struct FakeLinks {
    pub links: Vec<Link>,
    pub addrs: Vec<IfAddr>,
}

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
                source: crate::netlink::Error::Kernel {
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
