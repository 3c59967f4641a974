//! What other modes and upstream kube-proxy left in the kernel, removed when a mode starts
//! over it (upstream's own nftables mode removes the others' at start, `platformCleanup`),
//! and by `--cleanup` ([`super::cleanup`]). Failures are warnings: the starting mode works
//! regardless. I/O (netlink, x_tables sockopts, a drain thread).

use std::time::Duration;

use crate::kernel::nft::netlink::NetlinkNftables;
use crate::modes::ipvs;
use crate::proxy::{cleanup, Options, SyncError};

/// Upstream kube-proxy's rules of every mode go: conntrack keeps the established
/// connections' NAT, and our first sync follows at once.
pub(super) fn remove_upstream() {
    remove_leftovers("upstream kube-proxy", || {
        let mut nft = open_nft()?;
        let mut removed = cleanup::cleanup_upstream(&mut nft).map_err(SyncError::NftCleanup)?;
        removed
            .extend(cleanup::cleanup_upstream_iptables(&mut nft).map_err(SyncError::NftCleanup)?);
        removed.extend(upstream_legacy_chains());
        removed.extend(upstream_ipsets());
        Ok(removed)
    });
}

/// Upstream's chains in legacy x_tables; failures are warnings.
pub(super) fn upstream_legacy_chains() -> Vec<String> {
    let mut x = crate::kernel::xtables::sockopt::SockoptXtables::default();
    cleanup::cleanup_upstream_legacy(&mut x).unwrap_or_else(|e| {
        tracing::warn!(err = %e, "cannot remove upstream kube-proxy's iptables-legacy chains");
        Vec::new()
    })
}

/// Upstream's IPVS-mode ipsets; failures are warnings (a set still referenced by a rule
/// that is not upstream's stays, and says so).
pub(super) fn upstream_ipsets() -> Vec<String> {
    let res = crate::kernel::ipset::netlink::NetlinkIpsets::open()
        .and_then(|mut s| cleanup::cleanup_upstream_ipsets(&mut s));
    res.unwrap_or_else(|e| {
        tracing::warn!(err = %e, "cannot remove upstream kube-proxy's ipsets");
        Vec::new()
    })
}

/// How often a kept IPVS-mode virtual server is checked for connections.
const IPVS_DRAIN_CHECK: Duration = Duration::from_secs(10);
/// How long connections through an IPVS mode's virtual servers are kept alive after another
/// mode took over: four of IPVS's 900 s idle timeouts for established TCP; what is still
/// open then is cut, as upstream's own mode switch cuts it at once.
const IPVS_DRAIN_LIMIT: Duration = Duration::from_secs(3600);

/// Another mode starting over an IPVS mode's state (an earlier run of ours or upstream's
/// IPVS mode): removes it, except the virtual servers that still carry connections, which
/// a background thread removes as their connections end (every [`IPVS_DRAIN_CHECK`], at
/// most [`IPVS_DRAIN_LIMIT`]). Our rules take every new connection meanwhile: they DNAT
/// before IPVS sees a packet. With `once`, what is kept stays for the next start.
/// Failures are warnings (this mode works regardless).
pub(super) fn drain_ipvs_leftovers(opts: &Options, cfg: &ipvs::IpvsConfig, once: bool) {
    let pass = |opts: &Options, cfg: &ipvs::IpvsConfig, keep: bool| match ipvs::remove_leftovers(
        open_nft()?,
        opts,
        cfg,
        keep,
    ) {
        Ok(l) => {
            l.removed
                .iter()
                .for_each(|r| tracing::info!(mode = "IPVS", object = %r, "removed a leftover"));
            Ok(l.kept)
        }
        Err(e) => {
            tracing::warn!(err = %e, "cannot remove the IPVS-mode leftovers");
            Err(e)
        }
    };
    let Ok(kept) = pass(opts, cfg, true) else {
        return;
    };
    if kept.is_empty() {
        return;
    }
    let conns: u64 = kept.iter().map(|(_, n)| n).sum();
    tracing::info!(
        virtual_servers = kept.len(),
        connections = conns,
        limit = ?IPVS_DRAIN_LIMIT,
        "keeping IPVS-mode virtual servers for their connections; they are removed when those end"
    );
    if once {
        return;
    }
    let (opts, cfg) = (opts.clone(), cfg.clone());
    let drain = move || {
        let t0 = std::time::Instant::now();
        loop {
            std::thread::sleep(IPVS_DRAIN_CHECK);
            let last = t0.elapsed() >= IPVS_DRAIN_LIMIT;
            match pass(&opts, &cfg, !last) {
                Ok(kept) if kept.is_empty() => {
                    tracing::info!("the IPVS-mode leftovers are gone");
                    return;
                }
                Ok(_) => {}
                Err(_) => return,
            }
        }
    };
    if let Err(e) = std::thread::Builder::new()
        .name("ipvs-drain".into())
        .spawn(drain)
    {
        tracing::warn!(err = %e, "cannot start the IPVS drain thread; the kept virtual servers stay");
    }
}

/// A second nftables socket for cleanups (the proxier owns the first).
pub(super) fn open_nft() -> Result<NetlinkNftables, SyncError> {
    NetlinkNftables::open().map_err(SyncError::NftCleanup)
}

/// Runs a leftover cleanup of another mode; failures are warnings (this mode works
/// regardless).
pub(super) fn remove_leftovers(what: &str, f: impl FnOnce() -> Result<Vec<String>, SyncError>) {
    match f() {
        Ok(removed) => removed
            .into_iter()
            .for_each(|r| tracing::info!(mode = what, object = %r, "removed a leftover")),
        Err(e) => tracing::warn!(mode = what, err = %e, "cannot remove leftovers"),
    }
}
