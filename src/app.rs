//! Wiring of the daemon: sources → model → syncer → kernel. Kept out of `main.rs` so the
//! binary is only flag parsing and exit codes.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::admin::{self, Hooks, Shared};
use crate::health::ProxyHealth;
use crate::metrics::Metrics;

use tokio::sync::watch;

use crate::config::Config;
use crate::config::ProxyMode;
use crate::conntrack::ctnetlink::NetlinkConntrack;
use crate::ipvs::netlink::NetlinkIpvs;
use crate::ipvs::reconciler::IpvsReconciler;
use crate::model::convert::build_state;
use crate::model::ProxyState;
use crate::nft::netlink::NetlinkNftables;
use crate::nft::render;
use crate::rtnl::{Links, NetlinkLinks};
use crate::source::kube as kube_source;
use crate::source::manifest::{self, ManifestCache};
use crate::sync::runner::{self, Timing};
use crate::sync::{cleanup, Backend, Syncer};

/// A failure that ends the daemon.
#[derive(Debug, thiserror::Error)]
pub enum AppError {
    #[error("{0}")]
    Usage(String),
    #[error("cannot read manifests at {path}: {error}")]
    Manifests {
        path: PathBuf,
        error: std::io::Error,
    },
    #[error("cannot open the nftables netlink socket: {0}")]
    Netlink(crate::nft::Error),
    #[error(transparent)]
    Sync(#[from] crate::sync::SyncError),
    #[error("cleanup failed: {0}")]
    Cleanup(crate::nft::Error),
    #[error("the configuration file changed; exiting so that the new one is used on restart")]
    ConfigChanged,
    #[error("IPVS mode: {0}")]
    Ipvs(String),
    #[error("cannot configure the Kubernetes client: {0} (give --kubeconfig or --master, or --manifests PATH to run from files)")]
    Kube(String),
}

/// The API client: `--kubeconfig`, else the inferred config (in-cluster, $KUBECONFIG,
/// ~/.kube/config); `--master` overrides the server address either way.
async fn kube_client(cfg: &Config) -> Result<kube::Client, AppError> {
    use kube::config::{KubeConfigOptions, Kubeconfig};
    let err = |e: &dyn std::fmt::Display| AppError::Kube(e.to_string());
    let mut config = match (&cfg.kubeconfig, &cfg.master) {
        (Some(path), _) => {
            let kc = Kubeconfig::read_from(path)
                .map_err(|e| AppError::Kube(format!("{}: {e}", path.display())))?;
            kube::Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default())
                .await
                .map_err(|e| err(&e))?
        }
        // Inside a pod keep the service account's token and CA, only the address changes.
        (None, Some(m)) => match kube::Config::incluster() {
            Ok(c) => c,
            Err(_) => kube::Config::new(m.parse().map_err(|e| err(&e))?),
        },
        (None, None) => kube::Config::infer().await.map_err(|e| err(&e))?,
    };
    if let Some(m) = &cfg.master {
        config.cluster_url = m.parse().map_err(|e| err(&e))?;
    }
    kube::Client::try_from(config).map_err(|e| err(&e))
}

fn load_state(cache: &mut ManifestCache, path: &Path, node: &str) -> Result<ProxyState, AppError> {
    let (snap, mut warnings) = cache
        .load(path, node)
        .map_err(|error| AppError::Manifests {
            path: path.to_path_buf(),
            error,
        })?;
    let (state, w2) = build_state(&snap, node);
    warnings.extend(w2);
    for w in warnings {
        tracing::warn!("{w}");
    }
    Ok(state)
}

/// Runs the proxy as configured.
pub async fn run(cfg: Config) -> Result<(), AppError> {
    for w in &cfg.warnings {
        tracing::warn!("{w}");
    }
    if cfg.cleanup {
        return cleanup_everything(&cfg);
    }
    let (tx, mut rx) = watch::channel(None);
    let mut warnings = None;
    let watcher = match cfg.manifests.clone() {
        Some(path) => {
            let mut cache = ManifestCache::new();
            let state = load_state(&mut cache, &path, &cfg.node_name)?;
            tx.send_replace(Some(Arc::new(state)));
            tokio::spawn(watch_manifests(cache, path, cfg.node_name.clone(), tx))
        }
        None => {
            let client = kube_client(&cfg).await?;
            if !cfg.dry_run {
                let (wtx, wrx) = tokio::sync::mpsc::unbounded_channel();
                tokio::spawn(kube_source::run_events(
                    client.clone(),
                    cfg.node_name.clone(),
                    wrx,
                ));
                warnings = Some(wtx);
            }
            tokio::spawn(kube_source::run(
                client,
                cfg.node_name.clone(),
                tx,
                cfg.config_sync_period,
            ))
        }
    };
    // The first sync waits until every source delivered its initial state.
    let state = loop {
        if let Some(s) = rx.borrow_and_update().clone() {
            break s;
        }
        tokio::select! {
            r = rx.changed() => if r.is_err() {
                return Err(AppError::Usage("the source ended before delivering a state".into()));
            },
            _ = shutdown_signal() => return Ok(()),
        }
    };
    if cfg.dry_run {
        match cfg.mode {
            ProxyMode::Nftables => {
                let mut syncer = Syncer::new(DryRun, cfg.proxier.clone(), cfg.detect_local.clone());
                for tx in syncer.plan(&state) {
                    print!("{}", render::transaction(&tx));
                }
            }
            ProxyMode::Ipvs => print!("{}", ipvs_dry_run(&cfg, &state)?),
            ProxyMode::Userspace => print!("{}", userspace_dry_run(&state)),
        }
        watcher.abort();
        return Ok(());
    }
    set_oom_score_adj(cfg.oom_score_adj);
    for w in crate::conntrack::tuning::apply(&cfg.conntrack) {
        tracing::warn!("{w}");
    }
    let mut nft = NetlinkNftables::open().map_err(AppError::Netlink)?;
    let nft_port = nft.port_id();
    // Someone else changed our state: a full sync restores it at once.
    let tamper = Arc::new(tokio::sync::Notify::new());
    let monitor = if cfg.once {
        None
    } else {
        match crate::nft::monitor::Monitor::open() {
            Ok(m) => {
                match m.switch() {
                    Ok(sw) => {
                        let t = tamper.clone();
                        nft.quiet_large_batches(sw, Box::new(move || t.notify_one()));
                    }
                    Err(e) => tracing::warn!("large batches will carry notifications: {e}"),
                }
                Some(m)
            }
            Err(e) => {
                tracing::error!("nftables change notifications unavailable: {e}");
                None
            }
        }
    };
    let watch = Watch {
        tamper,
        monitor,
        nft_port,
        link: None,
    };
    let conntrack = if cfg.conntrack_cleanup {
        match NetlinkConntrack::open() {
            Ok(ct) => Some(Box::new(ct) as Box<dyn crate::conntrack::Conntrack + Send>),
            Err(e) => {
                tracing::warn!("conntrack cleanup disabled: cannot open ctnetlink: {e}");
                None
            }
        }
    } else {
        None
    };
    let res = match cfg.mode {
        ProxyMode::Nftables => {
            remove_ipvs_leftovers(&cfg);
            let mut syncer = Syncer::new(nft, cfg.proxier.clone(), cfg.detect_local.clone());
            if let Some(ct) = conntrack {
                syncer = syncer.with_conntrack(ct);
            }
            drive(&cfg, syncer, rx, state, watch, warnings).await
        }
        ProxyMode::Userspace => {
            remove_ipvs_leftovers(&cfg);
            // The proxy's own sessions are the flows; conntrack cleanup would cut them.
            drop(conntrack);
            let p = crate::userspace::UserspaceProxier::new(nft, cfg.proxier.clone());
            drive(&cfg, p, rx, state, watch, warnings).await
        }
        ProxyMode::Ipvs => {
            for w in crate::ipvs::sysctl::apply(&cfg.ipvs).map_err(AppError::Ipvs)? {
                tracing::warn!("{w}");
            }
            let ipvs = NetlinkIpvs::open().map_err(|e| AppError::Ipvs(e.to_string()))?;
            let links = NetlinkLinks::open().map_err(|e| AppError::Ipvs(e.to_string()))?;
            let links_port = links.port_id();
            remove_nftables_mode_table(&cfg);
            let mut rec = ipvs_reconciler(&cfg, ipvs, links, nft).with_full_every(cfg.sync_period);
            if let Some(ct) = conntrack {
                rec = rec.with_conntrack(ct);
            }
            let watch = Watch {
                link: Some((cfg.ipvs.dummy_link.clone(), links_port)),
                ..watch
            };
            drive(&cfg, rec, rx, state, watch, warnings).await
        }
    };
    watcher.abort();
    res
}

/// Change notifications that restore our state when someone else changes it.
struct Watch {
    tamper: Arc<tokio::sync::Notify>,
    monitor: Option<crate::nft::monitor::Monitor>,
    /// Our nftables socket's port (its changes are ours).
    nft_port: u32,
    /// IPVS mode: the dummy link and our rtnetlink socket's port.
    link: Option<(String, u32)>,
}

/// Runs the sync loop over `backend` with health, metrics, health-check ports and change
/// notifications, until a signal or a config file change.
async fn drive<B: Backend>(
    cfg: &Config,
    mut backend: B,
    rx: watch::Receiver<Option<Arc<ProxyState>>>,
    state: Arc<ProxyState>,
    w: Watch,
    warnings: Option<tokio::sync::mpsc::UnboundedSender<kube_source::Warning>>,
) -> Result<(), AppError> {
    let Watch {
        tamper,
        monitor,
        nft_port,
        link,
    } = w;
    if cfg.once {
        let stats = backend.sync(&state)?;
        tracing::info!(rules = stats.rules, elements = stats.elements, ops = ?stats.ops,
            virtual_servers = stats.virtual_servers, "synced once");
        return Ok(());
    }
    let timing = Timing {
        min_sync_period: cfg.min_sync_period,
        sync_period: cfg.sync_period,
    };
    let shared = Shared {
        health: Arc::new(Mutex::new(ProxyHealth::new(cfg.sync_period * 2))),
        metrics: Arc::new(Metrics::new()),
        configz: Arc::new(cfg.to_kube_proxy_configuration()),
    };
    admin::serve(
        cfg.healthz_bind_address,
        "healthz",
        admin::healthz_router(shared.clone()),
    )
    .await;
    admin::serve(
        cfg.metrics_bind_address,
        "metrics",
        admin::metrics_router(shared.clone()),
    )
    .await;
    let mut hooks = Hooks::new(shared);
    hooks.warnings = warnings;
    if cfg.localhost_nodeports {
        hooks.localhost = Some(crate::localhost::LocalhostNodePorts::new());
    }
    // Restore our state at once when someone else changes it (nf_tables and rtnetlink
    // notifications).
    let spawn = |name: &str, f: Box<dyn FnOnce() + Send>| {
        std::thread::Builder::new()
            .name(name.into())
            .spawn(f)
            .map(|_| ())
            .map_err(|e| AppError::Usage(format!("cannot start the notification thread: {e}")))
    };
    if let Some(monitor) = monitor {
        let (tamper, table) = (tamper.clone(), cfg.proxier.table.clone());
        spawn(
            "nft-monitor",
            Box::new(move || {
                if let Err(e) = monitor.run(table, || nft_port, || tamper.notify_one()) {
                    tracing::error!("nftables change notifications unavailable: {e}");
                }
            }),
        )?;
    }
    if let Some((name, port)) = link {
        let tamper = tamper.clone();
        spawn(
            "link-monitor",
            Box::new(move || {
                if let Err(e) = crate::rtnl::watch(name, || port, || tamper.notify_one()) {
                    tracing::error!("link change notifications unavailable: {e}");
                }
            }),
        )?;
    }
    let config_changed = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let stop = {
        let (flag, path) = (config_changed.clone(), cfg.config_path.clone());
        async move {
            tokio::select! {
                _ = shutdown_signal() => {}
                _ = watch_config_file(path) => flag.store(true, std::sync::atomic::Ordering::SeqCst),
            }
        }
    };
    runner::run(backend, rx, timing, &mut hooks, Some(tamper), stop).await;
    if config_changed.load(std::sync::atomic::Ordering::SeqCst) {
        return Err(AppError::ConfigChanged);
    }
    tracing::info!("shutting down; rules stay in place");
    Ok(())
}

/// The IPVS backend over the kernel, as configured.
fn ipvs_reconciler(
    cfg: &Config,
    ipvs: NetlinkIpvs,
    links: NetlinkLinks,
    nft: NetlinkNftables,
) -> IpvsReconciler<NetlinkIpvs, NetlinkLinks, NetlinkNftables> {
    IpvsReconciler::new(
        ipvs,
        links,
        nft,
        cfg.ipvs.clone(),
        cfg.proxier.clone(),
        cfg.detect_local.clone(),
    )
}

/// `--cleanup`: removes what either mode created (our tables, our IPVS virtual servers and
/// the dummy link) and upstream kube-proxy's nftables tables.
fn cleanup_everything(cfg: &Config) -> Result<(), AppError> {
    let mut nft = NetlinkNftables::open().map_err(AppError::Netlink)?;
    let mut removed = Vec::new();
    let mut tables = vec![cfg.proxier.table.clone()];
    for t in [
        crate::proxier::names::DEFAULT_TABLE,
        crate::ipvs::table::DEFAULT_TABLE,
    ] {
        if !tables.iter().any(|x| x == t) {
            tables.push(t.into());
        }
    }
    for t in &tables {
        removed.extend(cleanup(&mut nft, t).map_err(AppError::Cleanup)?);
    }
    match NetlinkIpvs::open() {
        Ok(ipvs) => {
            let links = NetlinkLinks::open().map_err(|e| AppError::Ipvs(e.to_string()))?;
            let mut rec = ipvs_reconciler(cfg, ipvs, links, nft);
            removed.extend(rec.cleanup().map_err(|e| AppError::Ipvs(e.to_string()))?);
            nft = NetlinkNftables::open().map_err(AppError::Netlink)?;
        }
        Err(crate::ipvs::Error::Unavailable) => {
            tracing::debug!("no IPVS in this kernel: nothing of the IPVS mode to clean up")
        }
        Err(e) => return Err(AppError::Ipvs(e.to_string())),
    }
    if removed.is_empty() {
        tracing::info!("nothing to clean up");
    }
    for r in removed {
        tracing::info!("removed {r}");
    }
    for r in crate::sync::cleanup_upstream(&mut nft).map_err(AppError::Cleanup)? {
        tracing::info!("removed upstream kube-proxy's {r}");
    }
    Ok(())
}

/// In nftables mode: what an earlier IPVS-mode run left (its table, virtual servers on the
/// dummy link, the link) would take ClusterIP traffic first; remove it, as upstream does
/// when switching modes. Failures are warnings: the nftables mode works regardless.
fn remove_ipvs_leftovers(cfg: &Config) {
    let Ok(mut links) = NetlinkLinks::open() else {
        return;
    };
    let has_link = matches!(links.link(&cfg.ipvs.dummy_link), Ok(Some(_)));
    if let Ok(mut nft) = NetlinkNftables::open() {
        match cleanup(&mut nft, crate::ipvs::table::DEFAULT_TABLE) {
            Ok(r) => r
                .into_iter()
                .for_each(|r| tracing::info!("removed IPVS-mode {r}")),
            Err(e) => tracing::warn!("cannot remove the IPVS mode's table: {e}"),
        }
    }
    if !has_link {
        return;
    }
    let (Ok(ipvs), Ok(nft)) = (NetlinkIpvs::open(), NetlinkNftables::open()) else {
        return;
    };
    let mut rec = ipvs_reconciler(cfg, ipvs, links, nft);
    match rec.cleanup() {
        Ok(r) => r
            .into_iter()
            .for_each(|r| tracing::info!("removed IPVS-mode {r}")),
        Err(e) => tracing::warn!("cannot remove the IPVS mode's leftovers: {e}"),
    }
}

/// In IPVS mode: the nftables mode's table would DNAT service traffic before IPVS sees it.
fn remove_nftables_mode_table(cfg: &Config) {
    if cfg.proxier.table == crate::proxier::names::DEFAULT_TABLE {
        return;
    }
    if let Ok(mut nft) = NetlinkNftables::open() {
        match cleanup(&mut nft, crate::proxier::names::DEFAULT_TABLE) {
            Ok(r) => r
                .into_iter()
                .for_each(|r| tracing::info!("removed nftables-mode {r}")),
            Err(e) => tracing::warn!("cannot remove the nftables mode's table: {e}"),
        }
    }
}

/// `--dry-run` in userspace mode: the listeners and where they forward (their ports, and so
/// the redirect rules, are chosen when the daemon binds them).
fn userspace_dry_run(state: &ProxyState) -> String {
    use std::fmt::Write;
    let (want, sctp) = crate::userspace::plan_listeners(state);
    let mut out = String::new();
    for (k, f) in want {
        let scope = if k.external { "external" } else { "internal" };
        let fam = if k.v4 { "IPv4" } else { "IPv6" };
        let eps: Vec<String> = f.endpoints.iter().map(|e| e.to_string()).collect();
        let _ = writeln!(out, "{} {scope} {fam} -> [{}]", k.service, eps.join(", "));
    }
    for s in sctp {
        let _ = writeln!(out, "# {s}: SCTP cannot be proxied in userspace; skipped");
    }
    out
}

/// `--dry-run` in IPVS mode: the virtual servers and the companion table, touching nothing.
fn ipvs_dry_run(cfg: &Config, state: &ProxyState) -> Result<String, AppError> {
    use crate::rtnl::Links;
    let mut links = NetlinkLinks::open().map_err(|e| AppError::Ipvs(e.to_string()))?;
    let index = links
        .link(&cfg.ipvs.dummy_link)
        .map_err(|e| AppError::Ipvs(e.to_string()))?
        .map(|l| l.index);
    let local: Vec<std::net::IpAddr> = links
        .addresses()
        .map_err(|e| AppError::Ipvs(e.to_string()))?
        .into_iter()
        .filter(|a| Some(a.index) != index)
        .map(|a| a.addr)
        .collect();
    let node_addrs = crate::ipvs::plan::nodeport_addresses(
        &local,
        &cfg.proxier.nodeport_addresses,
        &state.node.addresses,
    );
    let plan = crate::ipvs::plan::build_plan(state, &cfg.ipvs, &node_addrs);
    let mut out = crate::ipvs::plan::render(&plan);
    for family in crate::nft::Family::all() {
        let rs = crate::ipvs::table::build_ruleset(state, &plan, &cfg.proxier, family);
        out.push_str(&render::transaction(
            &crate::proxier::plan_transaction(None, &rs, None, &[]).tx,
        ));
    }
    Ok(out)
}

/// Polls the manifests and publishes a new state whenever they change. Polling (250 ms)
/// catches in-place edits and replacement by rename alike, with no inotify dependency.
async fn watch_manifests(
    mut cache: ManifestCache,
    path: PathBuf,
    node: String,
    tx: watch::Sender<Option<Arc<ProxyState>>>,
) {
    let mut fp = manifest::fingerprint(&path);
    loop {
        tokio::time::sleep(Duration::from_millis(250)).await;
        let now = manifest::fingerprint(&path);
        if now == fp {
            continue;
        }
        fp = now;
        match load_state(&mut cache, &path, &node) {
            Ok(s) => {
                tracing::info!(path = %path.display(), "manifests changed");
                let _ = tx.send(Some(Arc::new(s)));
            }
            Err(e) => tracing::error!("{e}; keeping the last good state"),
        }
    }
}

/// Resolves when the `--config` file changes (never without one).
async fn watch_config_file(path: Option<PathBuf>) {
    let Some(path) = path else {
        return std::future::pending().await;
    };
    let read = || std::fs::read(&path).ok();
    let original = read();
    loop {
        tokio::time::sleep(Duration::from_secs(1)).await;
        if read() != original {
            tracing::error!(path = %path.display(), "the configuration file changed");
            return;
        }
    }
}

/// Writes /proc/self/oom_score_adj; lowering it needs CAP_SYS_RESOURCE, so a failure is a
/// warning.
fn set_oom_score_adj(v: i32) {
    if let Err(e) = std::fs::write("/proc/self/oom_score_adj", v.to_string()) {
        tracing::warn!("cannot set oom_score_adj to {v}: {e}");
    }
}

async fn shutdown_signal() {
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = match signal(SignalKind::terminate()) {
        Ok(s) => s,
        Err(e) => {
            tracing::error!("cannot listen for SIGTERM: {e}");
            return std::future::pending().await;
        }
    };
    tokio::select! {
        _ = term.recv() => {},
        _ = tokio::signal::ctrl_c() => {},
    }
}

/// A backend for `--dry-run`: plans only, never called to apply.
struct DryRun;

impl crate::nft::Nftables for DryRun {
    fn apply(&mut self, _: &crate::nft::Transaction) -> Result<(), crate::nft::Error> {
        Ok(())
    }
    fn list_tables(
        &mut self,
        _: crate::nft::Family,
    ) -> Result<Vec<crate::nft::decode::ListedTable>, crate::nft::Error> {
        Ok(vec![])
    }
    fn list_chains(
        &mut self,
        _: crate::nft::Family,
        _: &str,
    ) -> Result<Vec<String>, crate::nft::Error> {
        Ok(vec![])
    }
    fn list_sets(
        &mut self,
        _: crate::nft::Family,
        _: &str,
    ) -> Result<Vec<String>, crate::nft::Error> {
        Ok(vec![])
    }
}
