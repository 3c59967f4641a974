//! IPVS over generic netlink (the foundation of the IPVS mode, not yet wired into the
//! daemon): typed virtual and real servers and a pure codec for the `IPVS` genl family
//! (`linux/ip_vs.h`). Built on our netlink message writer/reader rather than
//! netlink-packet-ipvs, which depends on an incompatible netlink-packet-core generation and
//! panics on unknown attributes; here unknown attributes are skipped.

pub mod codec;

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

/// IPVS connection timeouts in seconds (0 = leave as is).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Timeouts {
    pub tcp: u32,
    pub tcp_fin: u32,
    pub udp: u32,
}
