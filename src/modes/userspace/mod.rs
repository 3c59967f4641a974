//! The userspace mode (`--proxy-mode userspace`, kube-proxy's historical third mode): the
//! daemon itself carries every connection. Each service port gets a listener per family and
//! traffic scope (internal: ClusterIPs; external: NodePorts, externalIPs, LoadBalancer IPs,
//! which follow `externalTrafficPolicy`), and nftables `redirect` rules send the Service's
//! traffic to it. Endpoints see the node as the client (the proxy opens the connections), as
//! with upstream's userspace mode. No-endpoint rejects and source ranges stay in nftables.
//! Planning is pure; [`UserspaceProxier`] owns the listeners and applies the table.

pub(crate) mod forward;
pub(crate) mod listeners;
pub mod localhost;
pub(crate) mod proxier;
pub(crate) mod table;

pub use listeners::{plan_listeners, ListenerKey};
pub use proxier::UserspaceProxier;

use crate::kernel::nft::Nftables;
use crate::model::ProxyState;
use crate::proxy::{Options, SyncError};

/// The userspace mode over `nft` (its redirect table).
pub fn open<N: Nftables>(nft: N, opts: &Options) -> UserspaceProxier<N> {
    UserspaceProxier::new(nft, opts.proxier.clone()).with_families(opts.families.clone())
}

/// `--dry-run`: the listeners and where each forwards.
pub fn dry_run(state: &ProxyState) -> Result<String, SyncError> {
    Ok(UserspaceProxier::<crate::kernel::nft::PlanOnly>::render_listeners(state))
}

/// Removes the userspace mode's table (it shares the nftables mode's name).
pub fn cleanup<N: Nftables>(nft: &mut N, opts: &Options) -> Result<Vec<String>, SyncError> {
    crate::proxy::cleanup::delete_tables(nft, &[opts.proxier.table.as_str()])
}
