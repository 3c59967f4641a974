//! Legacy x_tables (`iptables-legacy`), as far as cleanup needs it: which tables exist in
//! this network namespace, a table's blob, and replacing it with its counters kept. Kernel
//! access is through the x_tables socket options (`IPT_SO_GET_INFO`, `IPT_SO_GET_ENTRIES`,
//! `IPT_SO_SET_REPLACE`, `IPT_SO_SET_ADD_COUNTERS`) on a raw socket, never the iptables
//! binary. The blob logic is pure (`blob`); `sockopt` is the only I/O.

pub mod blob;
pub mod sockopt;
pub(crate) mod uapi;

use crate::model::net::Family;

/// An x_tables failure.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("x_tables {op} of table {family} {table}: {source}")]
    Io {
        op: &'static str,
        family: Family,
        table: String,
        #[source]
        source: std::io::Error,
    },
    #[error("x_tables table {family} {table}: {why}")]
    Malformed {
        family: Family,
        table: String,
        why: String,
    },
    #[error("cannot take /run/xtables.lock: {0}")]
    Lock(String),
}

/// What cleanup needs from x_tables.
pub trait Xtables {
    /// Tables instantiated in this namespace (`/proc/net/ip_tables_names`); reading them
    /// never loads a table that is not there.
    fn tables(&mut self, family: Family) -> Result<Vec<String>, Error>;
    fn get(&mut self, family: Family, table: &str) -> Result<blob::TableBlob, Error>;
    /// Replaces `old` (as read) with `new.table`, atomically, then gives each of its
    /// entries the counters of the old entry it is (`new.kept`), as iptables-restore does.
    fn replace(
        &mut self,
        family: Family,
        old: &blob::TableBlob,
        new: &blob::Rewrite,
    ) -> Result<(), Error>;
}

pub fn layout(family: Family) -> uapi::EntryLayout {
    match family {
        Family::Ip => uapi::IPV4,
        Family::Ip6 => uapi::IPV6,
    }
}
