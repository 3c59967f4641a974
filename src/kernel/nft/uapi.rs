//! nf_tables and nfnetlink ABI numbers (`linux/netfilter/nf_tables.h`,
//! `linux/netfilter/nfnetlink.h`): message types, attributes, expression fields. No crate
//! has the expressions we need (numgen, dnat maps, fib, …), so the typed layer encodes them
//! itself with these. Pure.

pub const NFNL_SUBSYS_NFTABLES: u16 = 10;
pub const NFNL_MSG_BATCH_BEGIN: u16 = 0x10;
pub const NFNL_MSG_BATCH_END: u16 = 0x11;
pub const NFT_MSG_NEWTABLE: u16 = 0;
pub const NFT_MSG_GETTABLE: u16 = 1;
pub const NFT_MSG_DELTABLE: u16 = 2;
pub const NFT_MSG_NEWCHAIN: u16 = 3;
pub const NFT_MSG_GETCHAIN: u16 = 4;
pub const NFT_MSG_DELCHAIN: u16 = 5;
pub const NFT_MSG_NEWRULE: u16 = 6;
pub const NFT_MSG_GETRULE: u16 = 7;
pub const NFT_MSG_DELRULE: u16 = 8;
pub const NFT_MSG_NEWSET: u16 = 9;
pub const NFT_MSG_GETSET: u16 = 10;
pub const NFT_MSG_DELSET: u16 = 11;
pub const NFT_MSG_NEWSETELEM: u16 = 12;
pub const NFT_MSG_GETSETELEM: u16 = 13;
pub const NFT_MSG_DELSETELEM: u16 = 14;
pub const NFT_MSG_GETGEN: u16 = 16;
// nft_table_attributes
pub const NFTA_TABLE_NAME: u16 = 1;
pub const NFTA_TABLE_FLAGS: u16 = 2;
pub const NFTA_TABLE_USERDATA: u16 = 6;
// nft_chain_attributes
pub const NFTA_CHAIN_TABLE: u16 = 1;
pub const NFTA_CHAIN_NAME: u16 = 3;
pub const NFTA_CHAIN_HOOK: u16 = 4;
pub const NFTA_CHAIN_POLICY: u16 = 5;
pub const NFTA_CHAIN_TYPE: u16 = 7;
pub const NFTA_CHAIN_USERDATA: u16 = 12;
pub const NFTA_HOOK_HOOKNUM: u16 = 1;
pub const NFTA_HOOK_PRIORITY: u16 = 2;
// nft_rule_attributes
pub const NFTA_RULE_TABLE: u16 = 1;
pub const NFTA_RULE_CHAIN: u16 = 2;
pub const NFTA_RULE_HANDLE: u16 = 3;
pub const NFTA_RULE_EXPRESSIONS: u16 = 4;
pub const NFTA_RULE_USERDATA: u16 = 7;
pub const NFTA_LIST_ELEM: u16 = 1;
pub const NFTA_EXPR_NAME: u16 = 1;
pub const NFTA_EXPR_DATA: u16 = 2;
// nft_set_attributes
pub const NFTA_SET_TABLE: u16 = 1;
pub const NFTA_SET_NAME: u16 = 2;
pub const NFTA_SET_FLAGS: u16 = 3;
pub const NFTA_SET_KEY_TYPE: u16 = 4;
pub const NFTA_SET_KEY_LEN: u16 = 5;
pub const NFTA_SET_DATA_TYPE: u16 = 6;
pub const NFTA_SET_DATA_LEN: u16 = 7;
pub const NFTA_SET_ID: u16 = 10;
pub const NFTA_SET_TIMEOUT: u16 = 11;
pub const NFTA_SET_USERDATA: u16 = 13;
pub const NFT_SET_INTERVAL: u32 = 0x4;
pub const NFT_SET_MAP: u32 = 0x8;
pub const NFT_SET_TIMEOUT: u32 = 0x10;
pub const NFT_SET_EVAL: u32 = 0x20;
pub const NFT_DATA_VERDICT: u32 = 0xffff_ff00;
// nft_set_elem_list_attributes / nft_set_elem_attributes
pub const NFTA_SET_ELEM_LIST_TABLE: u16 = 1;
pub const NFTA_SET_ELEM_LIST_SET: u16 = 2;
pub const NFTA_SET_ELEM_LIST_ELEMENTS: u16 = 3;
pub const NFTA_SET_ELEM_KEY: u16 = 1;
pub const NFTA_SET_ELEM_DATA: u16 = 2;
pub const NFTA_SET_ELEM_USERDATA: u16 = 6;
// nft_data_attributes / nft_verdict_attributes
pub const NFTA_DATA_VALUE: u16 = 1;
pub const NFTA_DATA_VERDICT: u16 = 2;
pub const NFTA_VERDICT_CODE: u16 = 1;
pub const NFTA_VERDICT_CHAIN: u16 = 2;
pub const NF_DROP: i32 = 0;
pub const NF_ACCEPT: i32 = 1;
pub const NFT_JUMP: i32 = -3;
pub const NFT_GOTO: i32 = -4;
pub const NFT_RETURN: i32 = -5;
/// libnftnl user-data TLV type of a comment on tables, chains, rules and elements.
pub const UDATA_COMMENT: u8 = 0;
/// libnftnl user-data TLV type of a set comment (`NFTNL_UDATA_SET_COMMENT`).
pub const UDATA_SET_COMMENT: u8 = 7;
// nft's datatype ids (userspace only: `NFTA_SET_KEY_TYPE` is informational to the kernel,
// but `nft list` uses it to print keys).
pub const TYPE_IPADDR: u32 = 7;
pub const TYPE_IP6ADDR: u32 = 8;
pub const TYPE_INET_PROTOCOL: u32 = 12;
pub const TYPE_INET_SERVICE: u32 = 13;
pub const TYPE_BITS: u32 = 6;
pub const TYPE_INTEGER: u32 = 4;

/// The verdict register.
pub const REG_VERDICT: u32 = 0;
/// First 32-bit data register (`NFT_REG32_00`); concatenations fill consecutive ones.
pub const REG32_00: u32 = 8;
/// `NFT_REG32_04`, the first of the second 128-bit register (`NFT_REG_2`): where nft loads
/// a `jhash` key, its result going to `NFT_REG_1`.
pub const REG32_04: u32 = 12;
pub const NFT_PAYLOAD_NETWORK_HEADER: u32 = 1;
pub const NFT_PAYLOAD_TRANSPORT_HEADER: u32 = 2;
pub const NFT_META_MARK: u32 = 3;
pub const NFT_META_L4PROTO: u32 = 16;
pub const NFT_META_IIFNAME: u32 = 6;
pub const NFT_META_NFPROTO: u32 = 15;
pub const NFT_CT_STATE: u32 = 0;
pub const NFT_CT_STATUS: u32 = 2;
/// `NF_CT_STATE_BIT(IP_CT_NEW)`.
pub const CT_STATE_NEW: u32 = 1 << 3;
/// `NF_CT_STATE_INVALID_BIT`.
pub const CT_STATE_INVALID: u32 = 1;
/// `NFTA_COUNTER_BYTES` and `NFTA_COUNTER_PACKETS` (big-endian u64s in a counter's data).
pub const NFTA_COUNTER_BYTES: u16 = 1;
pub const NFTA_COUNTER_PACKETS: u16 = 2;
/// `IPS_DST_NAT`.
pub const CT_STATUS_DNAT: u32 = 1 << 5;
pub const NFTA_FIB_F_SADDR: u32 = 1;
pub const NFTA_FIB_F_DADDR: u32 = 2;
pub const NFT_FIB_RESULT_ADDRTYPE: u32 = 3;
pub const RTN_LOCAL: u32 = 2;
pub const NFT_NG_RANDOM: u32 = 1;
// nft_hash_attributes
pub const NFTA_HASH_SREG: u16 = 1;
pub const NFTA_HASH_DREG: u16 = 2;
pub const NFTA_HASH_LEN: u16 = 3;
pub const NFTA_HASH_MODULUS: u16 = 4;
pub const NFTA_HASH_SEED: u16 = 5;
pub const NFTA_HASH_OFFSET: u16 = 6;
pub const NFTA_HASH_TYPE: u16 = 7;
/// `nft_hash_types`: `jhash` over registers (`NFT_HASH_SYM` hashes the flow dissector's keys).
pub const NFT_HASH_JENKINS: u32 = 0;
pub const NFT_NAT_DNAT: u32 = 1;
pub const NF_NAT_RANGE_PROTO_RANDOM_FULLY: u32 = 1 << 4;
pub const NFT_REJECT_ICMP_UNREACH: u32 = 0;
pub const NFT_DYNSET_OP_UPDATE: u32 = 1;
pub const NFT_LOOKUP_F_INV: u32 = 1;

/// `NFNLGRP_NFTABLES`.
pub const NFNLGRP_NFTABLES: u32 = 7;
pub const NFT_MSG_NEWGEN: u16 = 15;
