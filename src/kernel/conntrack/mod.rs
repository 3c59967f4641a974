//! Conntrack: stale UDP/SCTP entries deleted over ctnetlink after each sync (so clients keep
//! reaching live endpoints), and conntrack sysctl tuning. The decision (`cleanup`) and the
//! codec (`codec`) are pure; `ctnetlink` is the only I/O.

pub mod codec;
pub mod ctnetlink;
pub mod tuning;
pub(crate) mod uapi;

use std::net::IpAddr;

use crate::model::net::Family;

/// One conntrack entry, as far as the cleanup needs it.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Flow {
    pub proto: u8,
    pub orig_src: IpAddr,
    pub orig_dst: IpAddr,
    pub orig_sport: u16,
    pub orig_dport: u16,
    pub reply_src: IpAddr,
    pub reply_dst: IpAddr,
    pub reply_sport: u16,
    pub reply_dport: u16,
    pub zone: u16,
    /// The kernel's entry id: a delete carrying it never hits a newer entry with the same tuple.
    pub id: Option<u32>,
}

impl Flow {
    pub fn family(&self) -> Family {
        Family::of(&self.orig_src)
    }
}

/// An error talking ctnetlink.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Netlink(#[from] crate::kernel::netlink::Error),
    /// A dump entry could not be decoded (the error names the entry and the attribute).
    #[error(transparent)]
    Decode(#[from] crate::kernel::netlink::DecodeError),
}

/// What the reconciler needs from the kernel's connection tracking.
pub trait Conntrack {
    /// Entries of one family and L4 protocol.
    fn list(&mut self, family: Family, proto: u8) -> Result<Vec<Flow>, Error>;
    /// Deletes entries; those already gone are not errors. Returns how many were deleted.
    fn delete(&mut self, flows: &[Flow]) -> Result<usize, Error>;
}

/// A flow from a client at 10.244.1.9:40000 to `dst:dport`, answered by
/// `reply_src:reply_sport`, for unit tests.
#[cfg(test)]
pub(crate) fn test_flow(
    proto: u8,
    dst: &str,
    dport: u16,
    reply_src: &str,
    reply_sport: u16,
) -> Flow {
    let client: IpAddr = "10.244.1.9".parse().expect("an address");
    Flow {
        proto,
        orig_src: client,
        orig_dst: dst.parse().expect("an address"),
        orig_sport: 40000,
        orig_dport: dport,
        reply_src: reply_src.parse().expect("an address"),
        reply_dst: client,
        reply_sport,
        reply_dport: 40000,
        zone: 0,
        id: None,
    }
}

/// An in-memory conntrack table for unit tests.
#[cfg(any(test, feature = "testing"))]
#[derive(Debug, Default, Clone)]
pub struct FakeConntrack {
    pub flows: Vec<Flow>,
}

#[cfg(any(test, feature = "testing"))]
impl Conntrack for FakeConntrack {
    fn list(&mut self, family: Family, proto: u8) -> Result<Vec<Flow>, Error> {
        Ok(self
            .flows
            .iter()
            .filter(|f| f.family() == family && f.proto == proto)
            .cloned()
            .collect())
    }
    fn delete(&mut self, flows: &[Flow]) -> Result<usize, Error> {
        let before = self.flows.len();
        self.flows.retain(|f| !flows.contains(f));
        Ok(before - self.flows.len())
    }
}

/// A fake table a test keeps a handle on while a proxier owns the other.
#[cfg(any(test, feature = "testing"))]
impl Conntrack for std::sync::Arc<std::sync::Mutex<FakeConntrack>> {
    fn list(&mut self, family: Family, proto: u8) -> Result<Vec<Flow>, Error> {
        self.lock().expect("not poisoned").list(family, proto)
    }
    fn delete(&mut self, flows: &[Flow]) -> Result<usize, Error> {
        self.lock().expect("not poisoned").delete(flows)
    }
}
