//! The nftables mode: one table per family, planned from the model ([`plan`], [`names`],
//! [`slots`]) and kept in step by the [`proxier::NftablesProxier`].

pub mod plan;
pub(crate) mod proxier;
pub(crate) mod slots;
#[cfg(test)]
mod tests;

pub use plan::{build_ruleset, build_ruleset_with_slots};
pub use slots::SlotAllocator;

use crate::kernel::conntrack::Conntrack;
use crate::kernel::nft::{Nftables, PlanOnly};
use crate::model::ProxyState;
use crate::proxy::{Options, Proxier, SyncError, DEFAULT_TABLE};

pub use crate::proxy::names;
pub use proxier::NftablesProxier;

/// The nftables mode over `nft`, with conntrack cleanup when `conntrack` is given.
pub fn open<N: Nftables>(
    nft: N,
    opts: &Options,
    conntrack: Option<Box<dyn Conntrack + Send>>,
) -> NftablesProxier<N> {
    let p = NftablesProxier::new(nft, opts.proxier.clone(), opts.detect_local.clone());
    match conntrack {
        Some(ct) => p.with_conntrack(ct),
        None => p,
    }
}

/// `--dry-run`: the transactions of a full sync of `state`, in `nft` syntax.
pub fn dry_run(opts: &Options, state: &ProxyState) -> Result<String, SyncError> {
    open(PlanOnly, opts, None).dry_run(state)
}

/// Removes the nftables mode's table: the configured one and the default name.
pub fn cleanup<N: Nftables>(nft: &mut N, opts: &Options) -> Result<Vec<String>, SyncError> {
    let mut tables = vec![opts.proxier.table.as_str()];
    if !tables.contains(&DEFAULT_TABLE) {
        tables.push(DEFAULT_TABLE);
    }
    crate::proxy::cleanup::delete_tables(nft, &tables)
}

/// When another mode starts: the nftables mode's table would DNAT service traffic first.
/// Never touches `opts`' own table.
pub fn cleanup_leftovers<N: Nftables>(
    nft: &mut N,
    opts: &Options,
) -> Result<Vec<String>, SyncError> {
    if opts.proxier.table == DEFAULT_TABLE {
        return Ok(vec![]);
    }
    crate::proxy::cleanup::delete_tables(nft, &[DEFAULT_TABLE])
}
