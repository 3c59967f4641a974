//! rtnetlink ABI numbers we name ourselves (`linux/rtnetlink.h`, `if_link.h`): message
//! types our notification filter matches and the multicast groups it joins. Everything
//! else comes typed from `netlink-packet-route`. Pure.

pub const RTM_NEWLINK: u16 = 16;
pub const RTM_DELLINK: u16 = 17;
pub const RTM_NEWADDR: u16 = 20;
pub const RTM_DELADDR: u16 = 21;

/// rtnetlink multicast groups (bit numbers, as `add_membership` takes them).
pub const RTNLGRP_LINK: u32 = 1;
pub const RTNLGRP_IPV4_IFADDR: u32 = 5;
pub const RTNLGRP_IPV6_IFADDR: u32 = 9;

/// Attribute numbers the byte tests check the crate's encoding against.
#[cfg(test)]
pub const IFLA_IFNAME: u16 = 3;
#[cfg(test)]
pub const IFLA_LINKINFO: u16 = 18;
#[cfg(test)]
pub const IFLA_INFO_KIND: u16 = 1;
