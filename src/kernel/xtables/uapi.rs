//! x_tables' socket-option ABI (`linux/netfilter_ipv4/ip_tables.h`,
//! `linux/netfilter_ipv6/ip6_tables.h`, `linux/netfilter/x_tables.h`), x86-64/aarch64
//! layouts. Pure.

pub const SOL_IP: i32 = 0;
pub const SOL_IPV6: i32 = 41;
/// `IPT_SO_GET_INFO` / `IP6T_SO_GET_INFO` (IPT_BASE_CTL).
pub const SO_GET_INFO: i32 = 64;
/// `IPT_SO_GET_ENTRIES`.
pub const SO_GET_ENTRIES: i32 = 65;
/// `IPT_SO_SET_REPLACE`.
pub const SO_SET_REPLACE: i32 = 64;
/// `IPT_SO_SET_ADD_COUNTERS` / `IP6T_SO_SET_ADD_COUNTERS`.
pub const SO_SET_ADD_COUNTERS: i32 = 65;

pub const XT_TABLE_MAXNAMELEN: usize = 32;
pub const NF_INET_NUMHOOKS: usize = 5;

/// `struct ipt_getinfo`: name, valid_hooks, hook_entry[5], underflow[5], num_entries, size.
pub const GETINFO_LEN: usize = 84;
/// `struct ipt_get_entries` before `entrytable` (36 bytes, padded to the entries' 8).
pub const GET_ENTRIES_HDR: usize = 40;
/// `struct ipt_replace` before `entries`: name, valid_hooks, num_entries, size,
/// hook_entry[5], underflow[5], num_counters, counters pointer.
pub const REPLACE_HDR: usize = 96;
/// `struct xt_counters`: packets and bytes, u64 each.
pub const COUNTERS_LEN: usize = 16;
/// `struct xt_counters_info` before `counters`: name, num_counters (36 bytes, padded to the
/// counters' 8).
pub const ADD_COUNTERS_HDR: usize = 40;

/// `struct xt_entry_target` header: target_size u16, name[29], revision u8.
pub const TARGET_HDR: usize = 32;
/// `XT_ERROR_TARGET`.
pub const ERROR_TARGET: &str = "ERROR";

/// Where the fields of `struct ipt_entry` / `struct ip6t_entry` are.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EntryLayout {
    pub target_offset: usize,
    pub next_offset: usize,
    /// Size of the entry header (where matches start).
    pub size: usize,
}

/// `struct ipt_entry`: ipt_ip (84), nfcache, target_offset @88, next_offset @90,
/// comefrom, counters @96; 112 bytes.
pub const IPV4: EntryLayout = EntryLayout {
    target_offset: 88,
    next_offset: 90,
    size: 112,
};
/// `struct ip6t_entry`: ip6t_ip6 (136), nfcache, target_offset @140, next_offset @142,
/// comefrom, counters @152; 168 bytes.
pub const IPV6: EntryLayout = EntryLayout {
    target_offset: 140,
    next_offset: 142,
    size: 168,
};
