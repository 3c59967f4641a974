//! The nftables mode: one table per family, planned from the model ([`plan`], [`names`],
//! [`slots`]) and kept in step by the [`proxier::NftablesProxier`].

pub mod invalid;
pub mod localhost;
pub mod plan;
#[cfg(test)]
mod policy_matrix;
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

/// The nftables mode over `nft`. With `conntrack`: the stale UDP/SCTP entry cleanup and
/// the dead endpoints' TCP entry reset, as `opts` asks.
pub fn open<N: Nftables>(
    nft: N,
    opts: &Options,
    conntrack: Option<Box<dyn Conntrack + Send>>,
) -> NftablesProxier<N> {
    let p = NftablesProxier::new(nft, opts.proxier.clone(), opts.detect_local.clone())
        .with_families(opts.families.clone());
    match conntrack {
        Some(ct) => p
            .with_conntrack(ct)
            .with_stale_cleanup(opts.conntrack_cleanup)
            .with_dead_endpoint_reset(opts.reset_dead_endpoint_connections),
        None => p,
    }
}

/// `--dry-run`: the transactions of a full sync of `state`, in `nft` syntax.
pub fn dry_run(opts: &Options, state: &ProxyState) -> Result<String, SyncError> {
    open(PlanOnly, opts, None).dry_run(state)
}

/// The ruleset a sync of `state` would program into `live` (one family), for `status`'s
/// drift check and `diff`: the config resolved for the Node as the proxier resolves it,
/// and every chain's endpoint-map slots as `live` has them, so that what did not change
/// plans identically.
pub fn plan_against(
    opts: &Options,
    state: &ProxyState,
    live: &crate::kernel::nft::live::LiveTable,
) -> crate::proxy::ruleset::Ruleset {
    use crate::kernel::nft::lower::KExpr;
    let cfg = proxier::resolved_config(opts, state);
    let maps = live
        .sets
        .keys()
        .filter(|n| n.starts_with("endpoints-"))
        .count() as u32;
    let mut blocks = Vec::new();
    for (name, chain) in &live.chains {
        for r in &chain.rules {
            let Ok(exprs) = &r.exprs else { continue };
            // A random pick's or a Maglev table's block: `numgen`/`jhash … mod M offset O`
            // into an endpoint map.
            for w in exprs.windows(2) {
                if let [KExpr::Numgen {
                    modulus, offset, ..
                }
                | KExpr::Hash {
                    modulus, offset, ..
                }, KExpr::Lookup { set, .. }] = w
                {
                    if set.starts_with("endpoints-") {
                        blocks.push((name.clone(), *offset, *modulus));
                    }
                }
            }
        }
    }
    let mut slots = if maps == 0 {
        SlotAllocator::for_services(state.services.len())
    } else {
        SlotAllocator::seeded(maps, blocks)
    };
    build_ruleset_with_slots(state, &cfg, live.family, &mut slots)
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
