//! The proxy modes, siblings of one shape: each has a proxier implementing
//! [`crate::proxy::Proxier`], a pure planner, and `open`/`dry_run`/`cleanup` entry points
//! for `app`. A mode imports the shared core and the kernel clients, never another mode.

pub mod ipvs;
pub mod nftables;
pub mod userspace;
