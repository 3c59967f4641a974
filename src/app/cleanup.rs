//! `--cleanup`: removes what every mode of ours created and what upstream kube-proxy left,
//! then exits. I/O (netlink, x_tables sockopts).

use crate::config::Config;
use crate::kernel::nft::netlink::NetlinkNftables;
use crate::modes::{ipvs, nftables, userspace};
use crate::proxy::{cleanup, SyncError};

use super::leftovers::{upstream_ipsets, upstream_legacy_chains};
use super::AppError;

/// `--cleanup`: removes what every mode created (our tables, our IPVS virtual servers and
/// the dummy link) and, unless ours runs beside kube-proxy, upstream kube-proxy's rules.
pub(super) fn run(cfg: &Config) -> Result<(), AppError> {
    let opts = cfg.proxy_options();
    let mut nft = NetlinkNftables::open().map_err(AppError::Netlink)?;
    let mut removed = nftables::cleanup(&mut nft, &opts)?;
    removed.extend(userspace::cleanup(&mut nft, &opts)?);
    // Beside kube-proxy, IPVS state and `kube-ipvs0` are its ipvs mode's (ours does not
    // run in ipvs mode there).
    let beside_kube_proxy = cfg.service_selection.proxy_name().is_some();
    if !beside_kube_proxy {
        removed.extend(ipvs::cleanup(nft, &opts, &cfg.ipvs)?);
    }
    if removed.is_empty() {
        tracing::info!("nothing to clean up");
    }
    for r in removed {
        tracing::info!(object = %r, "removed");
    }
    // Beside kube-proxy (`--service-proxy-name`) its rules are its own, not leftovers.
    if beside_kube_proxy {
        tracing::info!("kube-proxy's rules are left alone (--service-proxy-name)");
        return Ok(());
    }
    let mut nft = NetlinkNftables::open().map_err(AppError::Netlink)?;
    for r in cleanup::cleanup_upstream(&mut nft).map_err(SyncError::NftCleanup)? {
        tracing::info!(mode = "upstream kube-proxy", object = %r, "removed a leftover");
    }
    for r in cleanup::cleanup_upstream_iptables(&mut nft).map_err(SyncError::NftCleanup)? {
        tracing::info!(mode = "upstream kube-proxy", object = %r, "removed a leftover");
    }
    for r in upstream_legacy_chains()
        .into_iter()
        .chain(upstream_ipsets())
    {
        tracing::info!(mode = "upstream kube-proxy", object = %r, "removed a leftover");
    }
    Ok(())
}
