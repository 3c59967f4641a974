//! The IPVS mode: virtual and real servers planned from the model ([`plan`]), a companion
//! nftables table for what IPVS cannot do ([`table`]), sysctls ([`sysctl`]), and the
//! [`proxier::IpvsProxier`] that applies them.

pub(crate) mod diff;
pub(crate) mod drain;
pub mod plan;
#[cfg(test)]
mod policy_matrix;
pub(crate) mod proxier;
pub(crate) mod sysctl;
pub mod table;

use crate::kernel::conntrack::Conntrack;
use crate::kernel::ipvs::netlink::NetlinkIpvs;
use crate::kernel::ipvs::Error as IpvsError;
use crate::kernel::nft::Nftables;
use crate::kernel::rtnl::{Links, NetlinkLinks};
use crate::model::ProxyState;
use crate::proxy::{LocalDetectorResolver, Options, ProxierConfig, SyncError};

pub use plan::IpvsConfig;
pub use proxier::{IpvsProxier, Leftovers};

/// The proxier over the kernel's IPVS and rtnetlink, with `proxier`'s table settings.
fn over_kernel<N: Nftables>(
    ipvs: NetlinkIpvs,
    links: NetlinkLinks,
    nft: N,
    opts: &Options,
    proxier: ProxierConfig,
    cfg: &IpvsConfig,
) -> IpvsProxier<NetlinkIpvs, NetlinkLinks, N> {
    IpvsProxier::new(
        ipvs,
        links,
        nft,
        cfg.clone(),
        proxier,
        opts.detect_local.clone(),
    )
    .with_families(opts.families.clone())
}

/// The IPVS mode over the kernel: writes the sysctls it needs, opens IPVS and rtnetlink.
/// Returns the proxier and the rtnetlink socket's port (its own link changes are told apart
/// from others' by it).
pub fn open<N: Nftables>(
    nft: N,
    opts: &Options,
    cfg: &IpvsConfig,
    conntrack: Option<Box<dyn Conntrack + Send>>,
) -> Result<(IpvsProxier<NetlinkIpvs, NetlinkLinks, N>, u32), SyncError> {
    // IPVS first: on a kernel without it, nothing is written.
    let ipvs = NetlinkIpvs::open()?;
    for w in sysctl::apply(cfg).map_err(SyncError::Sysctl)? {
        w.log();
    }
    let links = NetlinkLinks::open()?;
    let port = links.port_id();
    let mut p = over_kernel(ipvs, links, nft, opts, opts.proxier.clone(), cfg)
        .with_full_every(opts.sync_period);
    // IPVS forwards by its own connection table: of the conntrack work only the stale
    // UDP/SCTP cleanup applies (`--reset-dead-endpoint-connections` is warned about).
    if let Some(ct) = conntrack.filter(|_| opts.conntrack_cleanup) {
        p = p.with_conntrack(ct);
    }
    Ok((p, port))
}

/// Whether this kernel serves IPVS: opens its generic netlink family (which loads ip_vs
/// where it is a module) and closes it again. I/O, changes nothing.
pub fn probe() -> Result<(), IpvsError> {
    NetlinkIpvs::open().map(drop)
}

/// `--dry-run`: virtual servers and the companion table for `state`, touching nothing.
pub fn dry_run(opts: &Options, cfg: &IpvsConfig, state: &ProxyState) -> Result<String, SyncError> {
    let mut links = NetlinkLinks::open()?;
    let mut local = LocalDetectorResolver::new(opts.detect_local.clone());
    proxier::render_plan(&mut links, cfg, &opts.proxier, &mut local, state)
}

/// Removes what the IPVS mode created: our virtual servers, the dummy link, the companion
/// table (the configured name and the default). A kernel without IPVS has none of it.
pub fn cleanup<N: Nftables>(
    mut nft: N,
    opts: &Options,
    cfg: &IpvsConfig,
) -> Result<Vec<String>, SyncError> {
    let mut removed = crate::proxy::cleanup::delete_tables(&mut nft, &[table::DEFAULT_TABLE])?;
    let ipvs = match NetlinkIpvs::open() {
        Ok(i) => i,
        Err(IpvsError::Unavailable) => {
            tracing::debug!("no IPVS in this kernel: nothing of the IPVS mode to clean up");
            return Ok(removed);
        }
        Err(e) => return Err(e.into()),
    };
    let links = NetlinkLinks::open()?;
    let mut p = over_kernel(ipvs, links, nft, opts, opts.proxier.clone(), cfg);
    removed.extend(p.cleanup()?);
    Ok(removed)
}

/// When another mode starts: what an earlier IPVS-mode run left (ours or upstream's: the
/// companion table, virtual servers on the dummy link, the link) would take ClusterIP
/// traffic first; remove it, as upstream does when switching modes, except the virtual
/// servers that still carry connections when `keep_connected` (see [`IpvsProxier::drain`]):
/// call again until nothing is kept. Never touches `opts`' own table.
pub fn remove_leftovers<N: Nftables>(
    mut nft: N,
    opts: &Options,
    cfg: &IpvsConfig,
    keep_connected: bool,
) -> Result<Leftovers, SyncError> {
    let removed = crate::proxy::cleanup::delete_tables(&mut nft, &[table::DEFAULT_TABLE])?;
    let mut links = NetlinkLinks::open()?;
    if links.link(&cfg.dummy_link)?.is_none() {
        return Ok(Leftovers {
            removed,
            kept: Vec::new(),
        });
    }
    let mut proxier = opts.proxier.clone();
    proxier.table = table::DEFAULT_TABLE.into();
    let mut p = over_kernel(NetlinkIpvs::open()?, links, nft, opts, proxier, cfg);
    let mut out = if keep_connected {
        p.drain()?
    } else {
        Leftovers {
            removed: p.cleanup()?,
            kept: Vec::new(),
        }
    };
    out.removed.splice(0..0, removed);
    Ok(out)
}
