//! IPVS generic netlink ABI numbers (`linux/ip_vs.h`): commands, attributes, flags. Pure.

/// The generic netlink controller's id (`GENL_ID_CTRL`), the message type of family
/// look-ups.
pub const GENL_ID_CTRL: u16 = 0x10;
pub const IPVS_GENL_VERSION: u8 = 1;
pub const CMD_NEW_SERVICE: u8 = 1;
pub const CMD_SET_SERVICE: u8 = 2;
pub const CMD_DEL_SERVICE: u8 = 3;
pub const CMD_GET_SERVICE: u8 = 4;
pub const CMD_NEW_DEST: u8 = 5;
pub const CMD_SET_DEST: u8 = 6;
pub const CMD_DEL_DEST: u8 = 7;
pub const CMD_GET_DEST: u8 = 8;
pub const CMD_SET_CONFIG: u8 = 12;
pub const CMD_GET_CONFIG: u8 = 13;
pub const CMD_FLUSH: u8 = 17;
pub const CMD_ATTR_SERVICE: u16 = 1;
pub const CMD_ATTR_DEST: u16 = 2;
pub const CMD_ATTR_TIMEOUT_TCP: u16 = 4;
pub const CMD_ATTR_TIMEOUT_TCP_FIN: u16 = 5;
pub const CMD_ATTR_TIMEOUT_UDP: u16 = 6;
pub const SVC_AF: u16 = 1;
pub const SVC_PROTOCOL: u16 = 2;
pub const SVC_ADDR: u16 = 3;
pub const SVC_PORT: u16 = 4;
pub const SVC_SCHED_NAME: u16 = 6;
pub const SVC_FLAGS: u16 = 7;
pub const SVC_TIMEOUT: u16 = 8;
pub const SVC_NETMASK: u16 = 9;
pub const DEST_ADDR: u16 = 1;
pub const DEST_PORT: u16 = 2;
pub const DEST_FWD_METHOD: u16 = 3;
pub const DEST_WEIGHT: u16 = 4;
pub const DEST_U_THRESH: u16 = 5;
pub const DEST_L_THRESH: u16 = 6;
pub const DEST_ACTIVE_CONNS: u16 = 7;
pub const DEST_INACT_CONNS: u16 = 8;
pub const DEST_ADDR_FAMILY: u16 = 11;
pub const IP_VS_SVC_F_PERSISTENT: u32 = 0x1;
/// Scheduler flags 1-3 (`IP_VS_SVC_F_SCHED1..3`); for `mh`, flag 1 is `mh-fallback` (a
/// real server at weight 0 passes its flows to the next one) and flag 2 `mh-port` (the
/// source port is hashed too, not only the source address).
pub const IP_VS_SVC_F_SCHED1: u32 = 0x8;
pub const IP_VS_SVC_F_SCHED2: u32 = 0x10;
pub const IP_VS_SVC_F_SCHED3: u32 = 0x20;
pub const IP_VS_SVC_F_SCHED_MASK: u32 =
    IP_VS_SVC_F_SCHED1 | IP_VS_SVC_F_SCHED2 | IP_VS_SVC_F_SCHED3;
