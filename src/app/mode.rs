//! The one `match` on the mode: opens the configured mode's proxier over the kernel (after
//! removing what other modes left), or renders a dry run. I/O (netlink) when opening.

use crate::config::{Config, ProxyMode};
use crate::kernel::conntrack::ctnetlink::NetlinkConntrack;
use crate::kernel::conntrack::Conntrack;
use crate::kernel::nft::netlink::NetlinkNftables;
use crate::model::ProxyState;
use crate::modes::{ipvs, nftables, userspace};
use crate::proxy::Proxier;

use super::leftovers::{self, drain_ipvs_leftovers, open_nft, remove_leftovers};
use super::AppError;

/// What [`open_mode`] gives: a proxier over the kernel, or a dry run's text.
pub(super) enum Opened {
    Proxier {
        proxier: Box<dyn Proxier + Send>,
        /// IPVS mode: the dummy link and our rtnetlink socket's port, to watch.
        link: Option<(String, u32)>,
    },
    DryRun(String),
}

/// The kernel clients a running proxier gets (none for `--dry-run`).
pub(super) type Kernel = Option<(NetlinkNftables, Option<Box<dyn Conntrack + Send>>)>;

/// The one match on the mode. With kernel clients: removes what another mode left and opens
/// this mode's proxier. Without (`--dry-run`): renders what a full sync of `state` would
/// program, touching nothing.
pub(super) fn open_mode(
    cfg: &Config,
    kernel: Kernel,
    state: &ProxyState,
) -> Result<Opened, AppError> {
    let opts = cfg.proxy_options();
    let proxier = |p: Box<dyn Proxier + Send>| Opened::Proxier {
        proxier: p,
        link: None,
    };
    // Beside kube-proxy (`--service-proxy-name`) its rules, tables, ipsets and IPVS
    // virtual servers are the other proxy's working state, never leftovers.
    let beside_kube_proxy = cfg.service_selection.proxy_name().is_some();
    if beside_kube_proxy && kernel.is_some() {
        tracing::info!(
            proxy_name = cfg.service_selection.proxy_name(),
            "serving only the Services labelled with this proxy name; kube-proxy's rules are left alone"
        );
    }
    if kernel.is_some() && !beside_kube_proxy {
        leftovers::remove_upstream();
    }
    let drain_ipvs_leftovers = |opts: &_, ipvs: &_, once| {
        if !beside_kube_proxy {
            drain_ipvs_leftovers(opts, ipvs, once);
        }
    };
    Ok(match (cfg.mode, kernel) {
        (ProxyMode::Nftables, None) => Opened::DryRun(nftables::dry_run(&opts, state)?),
        (ProxyMode::Nftables, Some((nft, conntrack))) => {
            drain_ipvs_leftovers(&opts, &cfg.ipvs, cfg.once);
            proxier(Box::new(nftables::open(nft, &opts, conntrack)))
        }
        (ProxyMode::Userspace, None) => Opened::DryRun(userspace::dry_run(state)?),
        (ProxyMode::Userspace, Some((nft, _))) => {
            // The proxy's own sessions are the flows; conntrack cleanup would cut them.
            drain_ipvs_leftovers(&opts, &cfg.ipvs, cfg.once);
            proxier(Box::new(userspace::open(nft, &opts)))
        }
        (ProxyMode::Ipvs, None) => Opened::DryRun(ipvs::dry_run(&opts, &cfg.ipvs, state)?),
        (ProxyMode::Ipvs, Some((nft, conntrack))) => {
            remove_leftovers("nftables-mode", || {
                nftables::cleanup_leftovers(&mut open_nft()?, &opts)
            });
            let (p, port) = ipvs::open(nft, &opts, &cfg.ipvs, conntrack)?;
            Opened::Proxier {
                proxier: Box::new(p),
                link: Some((cfg.ipvs.dummy_link.clone(), port)),
            }
        }
    })
}

/// IPVS mode needs IPVS in the kernel: proven before anything is changed (another mode's
/// rules removed, sysctls written) or waited for, as upstream's CanUseIPVSProxier fails
/// kube-proxy's start-up. Resolving the generic netlink family loads ip_vs where it is a
/// module (its MODULE_ALIAS_GENL_FAMILY).
pub(super) fn ensure_kernel_serves(cfg: &Config) -> Result<(), AppError> {
    if cfg.mode == ProxyMode::Ipvs {
        ipvs::probe().map_err(AppError::Ipvs)?;
    }
    Ok(())
}

/// The conntrack client of the cleanup of stale flows and of the dead endpoints' reset, when
/// either is enabled; without ctnetlink the proxy runs without it.
pub(super) fn open_conntrack(cfg: &Config) -> Option<Box<dyn Conntrack + Send>> {
    if !cfg.conntrack_cleanup && !cfg.reset_dead_endpoint_connections {
        return None;
    }
    match NetlinkConntrack::open() {
        Ok(ct) => Some(Box::new(ct)),
        Err(e) => {
            tracing::warn!(err = %e, "conntrack cleanup and dead-endpoint reset disabled: cannot open ctnetlink");
            None
        }
    }
}
