//! The long-running proxy: the health and metrics servers first, then the source, the host
//! set-up, the mode's proxier, and the sync loop with its hooks and change notifications,
//! until a signal, a configuration file change or the source's end. I/O.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{mpsc, watch, Notify};

use crate::config::Config;
use crate::kernel::nft::monitor::Monitor;
use crate::kernel::nft::netlink::NetlinkNftables;
use crate::kernel::rtnl;
use crate::model::ProxyState;
use crate::modes::userspace;
use crate::proxy::runner::{self, Timing};
use crate::proxy::Proxier;
use crate::serve::admin::Shared;
use crate::source::kube as kube_source;

use super::hooks::Hooks;
use super::mode::{self, open_mode, Opened};
use super::process::Shutdown;
use super::sources::Sources;
use super::{admin, host, AppError, Finished};

/// Runs the daemon until a signal (`Ok`), a configuration file change or the source's end
/// with a reason (errors).
pub(super) async fn run(mut cfg: Config, shutdown: Shutdown) -> Result<Finished, AppError> {
    mode::ensure_kernel_serves(&cfg)?;
    // The health and metrics servers answer from start-up, so that probes never kill a pod
    // that waits for the API server (healthy while starting, as upstream).
    let (shared, bind_failures) = admin::start(&cfg).await?;
    let mut sources = Sources::start(&cfg, Some(&bind_failures)).await?;
    let Some(state) = sources.first_state(&shutdown).await? else {
        return Ok(Finished::Stopped);
    };
    host::choose_families(&mut cfg, &state.node)?;
    shared
        .health
        .lock()
        .expect("proxy health")
        .set_families(&cfg.families);
    host::prepare(&mut cfg);
    let mut nft = NetlinkNftables::open().map_err(AppError::Netlink)?;
    let nft_port = nft.port_id();
    // Someone else changed our state: a full sync restores it at once.
    let tamper = Arc::new(Notify::new());
    let monitor = open_monitor(&mut nft, &tamper);
    let conntrack = mode::open_conntrack(&cfg);
    let Opened::Proxier { proxier, link } = open_mode(&cfg, Some((nft, conntrack)), &state)? else {
        return Ok(Finished::Stopped);
    };
    // The runner gets every state from the source, this first one included. Held here for
    // the daemon's life, the first state kept each Service's original endpoint list alive
    // after a change replaced it: ~560 bytes per changed slice, +3 MiB over the churn row's
    // 60 s at 10k × 10 (issue #18, found with heaptrack).
    drop(state);
    let notifications = Notifications {
        tamper,
        monitor,
        nft_port,
        link,
    };
    let hooks = hooks_of(&cfg, shared, sources.warnings.take());
    let states = sources.states.clone();
    let res = sync_loop(&cfg, proxier, states, hooks, notifications, shutdown).await;
    sources.finish(res).await.map(|()| Finished::Stopped)
}

/// The nftables change notifications, and quiet large batches on our socket (their echoes
/// would flood the monitor); without them the daemon runs on, restoring only at its periodic
/// full syncs.
fn open_monitor(nft: &mut NetlinkNftables, tamper: &Arc<Notify>) -> Option<Monitor> {
    match Monitor::open() {
        Ok(m) => {
            match m.switch() {
                Ok(sw) => {
                    let t = tamper.clone();
                    nft.quiet_large_batches(sw, Box::new(move || t.notify_one()));
                }
                Err(e) => tracing::warn!(err = %e, "large batches will carry notifications"),
            }
            Some(m)
        }
        Err(e) => {
            tracing::error!(err = %e, "nftables change notifications unavailable");
            None
        }
    }
}

/// Change notifications that restore our state when someone else changes it.
struct Notifications {
    tamper: Arc<Notify>,
    monitor: Option<Monitor>,
    /// Our nftables socket's port (its changes are ours).
    nft_port: u32,
    /// IPVS mode: the dummy link and our rtnetlink socket's port.
    link: Option<(String, u32)>,
}

/// What the sync loop feeds: health, metrics, health-check ports, warning events and, when
/// configured, the localhost NodePort listeners.
fn hooks_of(
    cfg: &Config,
    shared: Shared,
    warnings: Option<mpsc::UnboundedSender<kube_source::Warning>>,
) -> Hooks {
    let localhost_accepted = shared.localhost_accepted.clone();
    let mut hooks = Hooks::new(shared);
    hooks.warnings = warnings;
    hooks.families = cfg.families.clone();
    if !cfg.localhost_listeners.is_empty() {
        hooks.localhost = Some((
            userspace::localhost::LocalhostNodePorts::new(localhost_accepted),
            cfg.localhost_listeners.clone(),
        ));
    }
    hooks
}

/// Runs the sync loop over `proxier` with its hooks and change notifications, until a
/// signal or a config file change.
async fn sync_loop(
    cfg: &Config,
    proxier: Box<dyn Proxier + Send>,
    states: watch::Receiver<Option<Arc<ProxyState>>>,
    mut hooks: Hooks,
    notifications: Notifications,
    shutdown: Shutdown,
) -> Result<(), AppError> {
    let tamper = notifications.tamper.clone();
    spawn_notifications(cfg, notifications)?;
    let timing = Timing {
        min_sync_period: cfg.min_sync_period,
        sync_period: cfg.sync_period,
    };
    let config_changed = Arc::new(AtomicBool::new(false));
    let stop = {
        let (flag, path, loaded) = (
            config_changed.clone(),
            cfg.config_path.clone(),
            cfg.config_bytes.clone(),
        );
        async move {
            tokio::select! {
                _ = shutdown.signalled() => {}
                _ = watch_config_file(path, loaded) => flag.store(true, Ordering::SeqCst),
            }
        }
    };
    runner::run(proxier, states, timing, &mut hooks, Some(tamper), stop).await;
    if config_changed.load(Ordering::SeqCst) {
        return Err(AppError::ConfigChanged);
    }
    tracing::info!("shutting down; rules stay in place");
    Ok(())
}

/// Restore our state at once when someone else changes it: threads that listen to the
/// nf_tables and (IPVS mode's dummy link) rtnetlink notifications and wake the sync loop.
fn spawn_notifications(cfg: &Config, n: Notifications) -> Result<(), AppError> {
    let spawn = |name: &str, f: Box<dyn FnOnce() + Send>| {
        std::thread::Builder::new()
            .name(name.into())
            .spawn(f)
            .map(|_| ())
            .map_err(|e| AppError::Thread("notification", e))
    };
    let Notifications {
        tamper,
        monitor,
        nft_port,
        link,
    } = n;
    if let Some(monitor) = monitor {
        let (tamper, table) = (tamper.clone(), cfg.proxier.table.clone());
        spawn(
            "nft-monitor",
            Box::new(move || {
                if let Err(e) = monitor.run(table, || nft_port, || tamper.notify_one()) {
                    tracing::error!(err = %e, "nftables change notifications unavailable");
                }
            }),
        )?;
    }
    if let Some((name, port)) = link {
        spawn(
            "link-monitor",
            Box::new(move || {
                if let Err(e) = rtnl::watch(name, || port, || tamper.notify_one()) {
                    tracing::error!(err = %e, "link change notifications unavailable");
                }
            }),
        )?;
    }
    Ok(())
}

/// Resolves when the `--config` file no longer holds the bytes the configuration was
/// loaded from (never without one). Comparing against those bytes, not a later read, catches
/// an edit made while the daemon was starting.
async fn watch_config_file(path: Option<PathBuf>, loaded: Option<Vec<u8>>) {
    let Some(path) = path else {
        return std::future::pending().await;
    };
    loop {
        if std::fs::read(&path).ok() != loaded {
            tracing::error!(path = %path.display(), "the configuration file changed");
            return;
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}
