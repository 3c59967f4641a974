//! The IPVS client: virtual and real servers over generic netlink (pure `codec`, I/O in
//! `netlink`, an in-memory `fake` for tests), behind the [`Ipvs`] trait. Our own codec
//! rather than netlink-packet-ipvs, which depends on an incompatible netlink-packet-core
//! generation and panics on unknown attributes; here unknown attributes are skipped.

pub mod codec;
#[cfg(any(test, feature = "testing"))]
pub mod fake;
pub mod netlink;
pub(crate) mod uapi;

use std::net::IpAddr;

/// A virtual server (one IP, port and protocol).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VirtualServer {
    pub addr: IpAddr,
    pub port: u16,
    /// IP protocol number (6, 17, 132).
    pub protocol: u8,
    pub scheduler: String,
    /// Persistence (ClientIP affinity) timeout in seconds; 0 = none.
    pub persistence: u32,
    /// The scheduler's own flags (`IP_VS_SVC_F_SCHED1..3` bits; see
    /// [`uapi::IP_VS_SVC_F_SCHED1`]); 0 for every scheduler but a Maglev Service's `mh`.
    pub sched_flags: u32,
}

impl VirtualServer {
    /// Whether `o` schedules as this one does (scheduler, its flags, persistence); the key
    /// aside.
    pub fn same_settings(&self, o: &VirtualServer) -> bool {
        self.scheduler == o.scheduler
            && self.sched_flags == o.sched_flags
            && self.persistence == o.persistence
    }
    pub fn key(&self) -> VsKey {
        VsKey {
            addr: self.addr,
            port: self.port,
            protocol: self.protocol,
        }
    }
}

/// What identifies a virtual server in the kernel.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct VsKey {
    pub addr: IpAddr,
    pub port: u16,
    pub protocol: u8,
}

impl std::fmt::Display for VsKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let p = crate::model::net::proto::name(self.protocol);
        match self.addr {
            IpAddr::V4(a) => write!(f, "{p} {a}:{}", self.port),
            IpAddr::V6(a) => write!(f, "{p} [{a}]:{}", self.port),
        }
    }
}

/// Forwarding method of a real server.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Forward {
    Masquerade,
    Local,
    Tunnel,
    DirectRoute,
}

/// A real server of a virtual server.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RealServer {
    pub addr: IpAddr,
    pub port: u16,
    pub weight: u32,
    pub forward: Forward,
    /// Read-only counters from the kernel (0 when building requests).
    pub active_conns: u32,
    pub inactive_conns: u32,
}

impl RealServer {
    /// A masquerading real server of weight 1, as every endpoint is.
    pub fn masq(addr: IpAddr, port: u16) -> RealServer {
        RealServer {
            addr,
            port,
            weight: 1,
            forward: Forward::Masquerade,
            active_conns: 0,
            inactive_conns: 0,
        }
    }
}

/// IPVS connection timeouts in seconds (0 = leave as is).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Timeouts {
    pub tcp: u32,
    pub tcp_fin: u32,
    pub udp: u32,
}

/// An IPVS failure, naming what was attempted.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("IPVS is not available in this kernel: the generic netlink family \"IPVS\" does not exist (load the ip_vs module, or use --proxy-mode nftables)")]
    Unavailable,
    #[error("{op}: {source}")]
    Netlink {
        op: String,
        #[source]
        source: crate::kernel::netlink::Error,
    },
    #[error("malformed IPVS reply to {op}: {reason}")]
    Decode {
        op: String,
        reason: crate::kernel::netlink::DecodeError,
    },
}

impl Error {
    pub fn errno(&self) -> Option<i32> {
        match self {
            Error::Netlink { source, .. } => source.errno(),
            _ => None,
        }
    }
}

/// One change of IPVS state, for [`Ipvs::apply`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum IpvsOp {
    AddService(VirtualServer),
    UpdateService(VirtualServer),
    DeleteService(VirtualServer),
    AddDest(VirtualServer, RealServer),
    UpdateDest(VirtualServer, RealServer),
    DeleteDest(VirtualServer, RealServer),
}

/// What the IPVS mode needs from the kernel's IPVS.
pub trait Ipvs {
    /// Applies `ops` in order and returns one result per op, in order: a failed op does not
    /// stop the others. The kernel client sends them pipelined, many per `sendmsg`.
    fn apply(&mut self, ops: &[IpvsOp]) -> Vec<Result<(), Error>> {
        ops.iter()
            .map(|op| match op {
                IpvsOp::AddService(vs) => self.add_service(vs),
                IpvsOp::UpdateService(vs) => self.update_service(vs),
                IpvsOp::DeleteService(vs) => self.delete_service(vs),
                IpvsOp::AddDest(vs, rs) => self.add_dest(vs, rs),
                IpvsOp::UpdateDest(vs, rs) => self.update_dest(vs, rs),
                IpvsOp::DeleteDest(vs, rs) => self.delete_dest(vs, rs),
            })
            .collect()
    }
    fn services(&mut self) -> Result<Vec<VirtualServer>, Error>;
    fn dests(&mut self, vs: &VirtualServer) -> Result<Vec<RealServer>, Error>;
    fn add_service(&mut self, vs: &VirtualServer) -> Result<(), Error>;
    /// Changes scheduler or persistence of an existing virtual server.
    fn update_service(&mut self, vs: &VirtualServer) -> Result<(), Error>;
    fn delete_service(&mut self, vs: &VirtualServer) -> Result<(), Error>;
    fn add_dest(&mut self, vs: &VirtualServer, rs: &RealServer) -> Result<(), Error>;
    /// Changes the weight of an existing real server.
    fn update_dest(&mut self, vs: &VirtualServer, rs: &RealServer) -> Result<(), Error>;
    fn delete_dest(&mut self, vs: &VirtualServer, rs: &RealServer) -> Result<(), Error>;
    fn set_timeouts(&mut self, t: Timeouts) -> Result<(), Error>;
}
