//! ipset's nfnetlink ABI numbers (`linux/netfilter/ipset/ip_set.h`). Pure.

/// `NFNL_SUBSYS_IPSET`.
pub const NFNL_SUBSYS_IPSET: u16 = 6;
/// `IPSET_PROTOCOL`: the version every request carries (7 since Linux 5.x; the kernel
/// accepts 6 and 7).
pub const IPSET_PROTOCOL: u8 = 7;

pub const IPSET_CMD_DESTROY: u16 = 3;
pub const IPSET_CMD_LIST: u16 = 7;

pub const IPSET_ATTR_PROTOCOL: u16 = 1;
pub const IPSET_ATTR_SETNAME: u16 = 2;
pub const IPSET_ATTR_FLAGS: u16 = 6;

/// `IPSET_FLAG_LIST_SETNAME`: list names only (`ipset list -n`).
pub const IPSET_FLAG_LIST_SETNAME: u32 = 1 << 1;
/// `NLA_F_NET_BYTEORDER`: ipset's integers are big-endian and flagged so.
pub const NLA_F_NET_BYTEORDER: u16 = 1 << 14;

/// `IPSET_ERR_BUSY`: the set is referenced (by an iptables `-m set` rule).
pub const IPSET_ERR_BUSY: i32 = 4100;

/// `AF_INET`: libipset puts it in every request's `nfgenmsg`.
pub const NFPROTO_IPV4: u8 = 2;
