//! The entry points that do one thing and exit: `--init-only` (the privileged host set-up),
//! `status` and `diff` (compare the kernel with what would be programmed), `--dry-run`
//! (print what would be programmed) and `--once` (one sync against the kernel). None of them
//! starts the health and metrics servers. I/O.

use std::sync::Arc;

use crate::config::{Config, StateTool};
use crate::kernel::nft::netlink::NetlinkNftables;
use crate::kernel::nft::Family;
use crate::model::ProxyState;
use crate::proxy::Proxier;

use super::host;
use super::mode::{self, open_mode, Opened};
use super::process::Shutdown;
use super::sources::Sources;
use super::{AppError, Finished};

/// Upstream's `--init-only`: the steps that need full privileges, then exit, so that the
/// daemon itself can run with CAP_NET_ADMIN only.
pub(super) fn init_only(cfg: &Config) {
    host::apply_privileged(cfg);
    tracing::info!("initialization done (--init-only); exiting");
}

/// `status` and `diff`: compare the live table with what the daemon would program on this
/// kernel now, from the sources read once. (`--dry-run` plans from the configuration alone:
/// in iptables mode it shows the INVALID drop whatever the sysctl says.)
pub(super) async fn report(
    tool: StateTool,
    mut cfg: Config,
    shutdown: Shutdown,
) -> Result<Finished, AppError> {
    let mut sources = Sources::start(&cfg, None).await?;
    let Some(state) = sources.first_state(&shutdown).await? else {
        return Ok(Finished::Stopped);
    };
    host::choose_families(&mut cfg, &state.node)?;
    host::resolve_drop_invalid(&mut cfg.proxier);
    sources.stop();
    let printed = crate::tools::status::run(tool, &cfg, &state)?;
    print!("{}", printed.text);
    Ok(if printed.finding {
        Finished::DriftReported
    } else {
        Finished::Stopped
    })
}

/// `--dry-run`: prints what a full sync of the sources' first state would program, touching
/// nothing (no kernel client is opened, no event posted).
pub(super) async fn dry_run(cfg: &Config, shutdown: Shutdown) -> Result<Finished, AppError> {
    let mut sources = Sources::start(cfg, None).await?;
    let Some(state) = sources.first_state(&shutdown).await? else {
        return Ok(Finished::Stopped);
    };
    if let Opened::DryRun(text) = open_mode(cfg, None, &state)? {
        print!("{text}");
    }
    sources.stop();
    Ok(Finished::Stopped)
}

/// `--once`: starts as the daemon does (host set-up, other modes' leftovers removed, the
/// start-up events posted) and syncs the first state once, then exits. No servers, no
/// change notifications; what IPVS mode's leftovers keep for their connections stays for
/// the next start.
pub(super) async fn once(mut cfg: Config, shutdown: Shutdown) -> Result<Finished, AppError> {
    mode::ensure_kernel_serves(&cfg)?;
    let mut sources = Sources::start(&cfg, Some(&[])).await?;
    let Some(state) = sources.first_state(&shutdown).await? else {
        return Ok(Finished::Stopped);
    };
    host::choose_families(&mut cfg, &state.node)?;
    host::prepare(&mut cfg);
    let nft = NetlinkNftables::open().map_err(AppError::Netlink)?;
    let conntrack = mode::open_conntrack(&cfg);
    let Opened::Proxier { proxier, .. } = open_mode(&cfg, Some((nft, conntrack)), &state)? else {
        return Ok(Finished::Stopped);
    };
    let res = sync_once(proxier, &state);
    sources.finish(res).await.map(|()| Finished::Stopped)
}

/// One sync, logged with its counts; the proxier closes with it.
fn sync_once(
    mut proxier: Box<dyn Proxier + Send>,
    state: &Arc<ProxyState>,
) -> Result<(), AppError> {
    let stats = proxier.sync(state)?;
    tracing::info!(
        rules = stats.rules,
        elements = stats.elements,
        ipv4_ops = stats.ops_of(Family::Ip),
        ipv6_ops = stats.ops_of(Family::Ip6),
        virtual_servers = stats.virtual_servers,
        "synced once"
    );
    Ok(())
}
