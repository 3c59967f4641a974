//! Thin kernel clients, one folder per protocol: pure codecs, a small trait per subsystem,
//! its netlink implementation and (for tests) a fake. A client never imports a mode or the
//! shared proxy core; it knows kernel objects, not Services.

pub mod conntrack;
pub mod ipset;
pub mod ipvs;
pub mod netlink;
pub mod nft;
pub mod rtnl;
pub mod sysctl;
pub mod xtables;
