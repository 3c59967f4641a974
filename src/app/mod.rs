//! Wiring of the daemon: sources → model → the mode's proxier → kernel, with the HTTP
//! servers and change notifications around it. The one `match` on the mode is
//! [`open_mode`]; nothing here names a mode's tables, chains or constants.

pub mod hooks;
pub mod logging;

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::watch;

use crate::config::{gates, Config, ProxyMode};
use crate::kernel::conntrack::ctnetlink::NetlinkConntrack;
use crate::kernel::conntrack::Conntrack;
use crate::kernel::nft::monitor::Monitor;
use crate::kernel::nft::netlink::NetlinkNftables;
use crate::kernel::rtnl;
use crate::model::convert::build_state;
use crate::model::ProxyState;
use crate::modes::{ipvs, nftables, userspace};
use crate::proxy::runner::{self, Timing};
use crate::proxy::{cleanup, Options, Proxier, SyncError};
use crate::serve::admin::{self, Shared};
use crate::serve::metrics::{FamilyLabel, Metrics};
use crate::serve::proxy_health::ProxyHealth;
use crate::source::kube as kube_source;
use crate::source::manifest::{self, ManifestCache};

use hooks::Hooks;

/// A failure that ends the daemon: exit 1, except [`AppError::is_usage`] (exit 2, as flag
/// and configuration errors found before [`run`]).
#[derive(Debug, thiserror::Error)]
pub enum AppError {
    /// The manifests cannot be read at start: a usage error (exit 2), since running would
    /// program an empty cluster.
    #[error(transparent)]
    Manifests(#[from] manifest::ManifestError),
    #[error("cannot open the nftables netlink socket: {0}")]
    Netlink(crate::kernel::nft::Error),
    #[error(transparent)]
    Sync(#[from] SyncError),
    #[error("the configuration file changed; exiting so that the new one is used on restart")]
    ConfigChanged,
    #[error("cannot configure the Kubernetes client: {0} (give --kubeconfig or --master, or --manifests PATH to run from files)")]
    Kube(String),
    #[error("the source ended before delivering a state")]
    SourceEnded,
    #[error("cannot start the {0} thread: {1}")]
    Thread(&'static str, std::io::Error),
    /// This node's Node object was deleted (upstream exits too; the DaemonSet restarts us).
    #[error("Node {0} was deleted; exiting so that the DaemonSet restarts the proxy (rules stay in place)")]
    NodeDeleted(String),
    /// `bindAddressHardFail`: a server could not bind its address.
    #[error("cannot serve {0} on {1} and bindAddressHardFail is set")]
    Bind(&'static str, std::net::SocketAddr),
    #[error(transparent)]
    Tool(#[from] crate::tools::ToolError),
    /// IPVS mode on a kernel that cannot serve it: found before anything is changed.
    #[error("cannot use the IPVS proxier: {0}")]
    Ipvs(crate::kernel::ipvs::Error),
}

impl AppError {
    /// The command line points at something unusable (exit code 2).
    pub fn is_usage(&self) -> bool {
        matches!(
            self,
            AppError::Manifests(_) | AppError::Tool(crate::tools::ToolError::Usage { .. })
        )
    }
}

async fn kube_client(cfg: &Config) -> Result<kube::Client, AppError> {
    crate::source::kube::client(cfg.kubeconfig.as_deref(), cfg.master.as_deref())
        .await
        .map_err(AppError::Kube)
}

fn load_state(cache: &mut ManifestCache, path: &Path, node: &str) -> Result<ProxyState, AppError> {
    let (snap, warnings) = cache.load(path, node)?;
    let (state, objects) = build_state(&snap, node);
    for w in warnings {
        tracing::warn!(problem = %w, "manifest content skipped");
    }
    for w in &objects {
        crate::source::log_object_warning(w);
    }
    Ok(state)
}

/// The options every mode is opened with.
fn options(cfg: &Config) -> Options {
    Options {
        proxier: cfg.proxier.clone(),
        detect_local: cfg.detect_local.clone(),
        sync_period: cfg.sync_period,
        conntrack_cleanup: cfg.conntrack_cleanup,
        reset_dead_endpoint_connections: cfg.reset_dead_endpoint_connections,
    }
}

/// How a run ended without an error.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Finished {
    /// Stopped (a signal, a dry run, a tool with nothing to report).
    Stopped,
    /// `status` or `diff` reported drift (exit 1, as `diff(1)`).
    DriftReported,
}

/// Runs the proxy as configured.
pub async fn run(mut cfg: Config) -> Result<Finished, AppError> {
    let shutdown = Shutdown::install();
    for n in &cfg.notices {
        tracing::info!("{n}");
    }
    for w in &cfg.warnings {
        tracing::warn!("{w}");
    }
    if cfg.cleanup {
        return cleanup_everything(&cfg).map(|()| Finished::Stopped);
    }
    if cfg.init_only {
        // Upstream's --init-only: the steps that need full privileges, then exit, so that
        // the daemon itself can run with CAP_NET_ADMIN only.
        set_oom_score_adj(cfg.oom_score_adj);
        for w in crate::kernel::conntrack::tuning::apply(&cfg.conntrack) {
            w.log();
        }
        tracing::info!("initialization done (--init-only); exiting");
        return Ok(Finished::Stopped);
    }
    // IPVS mode needs IPVS in the kernel: prove it before anything is changed (another
    // mode's rules removed, sysctls written) or waited for, as upstream's
    // CanUseIPVSProxier fails kube-proxy's start-up. Resolving the generic netlink family
    // loads ip_vs where it is a module (its MODULE_ALIAS_GENL_FAMILY).
    if cfg.mode == ProxyMode::Ipvs && !cfg.dry_run && cfg.state_tool.is_none() {
        ipvs::probe().map_err(AppError::Ipvs)?;
    }
    // The health and metrics servers answer from start-up, so that probes never kill a pod
    // that waits for the API server (healthy while starting, as upstream).
    let (shared, bind_failures) = if cfg.dry_run || cfg.once {
        (None, Vec::new())
    } else {
        let (s, f) = serve_admin(&cfg).await?;
        (Some(s), f)
    };
    let (tx, mut rx) = watch::channel(None);
    // AllowServiceExternalIPs off: every mode, the conntrack cleanup and the health checks
    // see the states without externalIPs (upstream's `ServicePort.ExternalIPs()`).
    let tx = if cfg.gates.enabled(gates::ALLOW_SERVICE_EXTERNAL_IPS) {
        tx
    } else {
        relay_without_external_ips(tx)
    };
    let mut warnings = None;
    let mut watcher = match cfg.manifests.clone() {
        Some(path) => {
            let mut cache = ManifestCache::new();
            let state = load_state(&mut cache, &path, &cfg.node_name)?;
            tx.send_replace(Some(Arc::new(state)));
            let node = cfg.node_name.clone();
            tokio::spawn(async move {
                watch_manifests(cache, path, node, tx).await;
                crate::source::SourceEnd::Closed
            })
        }
        None => {
            let client = kube_client(&cfg).await?;
            if !cfg.dry_run {
                let (wtx, wrx) = tokio::sync::mpsc::unbounded_channel();
                tokio::spawn(kube_source::run_events(
                    client.clone(),
                    cfg.node_name.clone(),
                    crate::config::host_name(),
                    wrx,
                ));
                for w in startup_events(&cfg, &bind_failures) {
                    let _ = wtx.send(w);
                }
                warnings = Some(wtx);
            }
            tokio::spawn(kube_source::run(
                client,
                cfg.node_name.clone(),
                tx,
                cfg.config_sync_period,
                cfg.min_sync_period,
                cfg.detect_local == crate::proxy::DetectLocal::NodeCidr,
                warnings.clone(),
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
                return Err(AppError::SourceEnded);
            },
            _ = shutdown.clone().signalled() => return Ok(Finished::Stopped),
        }
    };
    if let Some(tool) = cfg.state_tool {
        // `status` and `diff` compare the live table with what the daemon would program on
        // this kernel now. (`--dry-run` plans from the configuration alone: in iptables
        // mode it shows the INVALID drop whatever the sysctl says.)
        resolve_drop_invalid(&mut cfg.proxier);
        watcher.abort();
        let printed = crate::tools::status::run(tool, &cfg, &state)?;
        print!("{}", printed.text);
        return Ok(if printed.finding {
            Finished::DriftReported
        } else {
            Finished::Stopped
        });
    }
    if cfg.dry_run {
        if let Opened::DryRun(text) = open_mode(&cfg, None, &state)? {
            print!("{text}");
        }
        watcher.abort();
        return Ok(Finished::Stopped);
    }
    set_oom_score_adj(cfg.oom_score_adj);
    for w in crate::kernel::conntrack::tuning::apply(&cfg.conntrack) {
        w.log();
    }
    resolve_drop_invalid(&mut cfg.proxier);
    if cfg.proxier.localnet_guard {
        set_route_localnet();
    }
    let mut nft = NetlinkNftables::open().map_err(AppError::Netlink)?;
    let nft_port = nft.port_id();
    // Someone else changed our state: a full sync restores it at once.
    let tamper = Arc::new(tokio::sync::Notify::new());
    let monitor = if cfg.once {
        None
    } else {
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
    };
    let conntrack = if cfg.conntrack_cleanup || cfg.reset_dead_endpoint_connections {
        match NetlinkConntrack::open() {
            Ok(ct) => Some(Box::new(ct) as Box<dyn Conntrack + Send>),
            Err(e) => {
                tracing::warn!(err = %e, "conntrack cleanup disabled: cannot open ctnetlink");
                None
            }
        }
    } else {
        None
    };
    let Opened::Proxier { proxier, link } = open_mode(&cfg, Some((nft, conntrack)), &state)? else {
        return Ok(Finished::Stopped);
    };
    let watch = Watch {
        tamper,
        monitor,
        nft_port,
        link,
        shared,
    };
    let source_alive = rx.clone();
    let res = drive(&cfg, proxier, rx, state, watch, warnings, shutdown).await;
    // The sync loop also ends when the source does (its sender gone): say why when it had
    // a reason. The task is finishing; the bound only guards against a stuck one.
    if res.is_ok() && source_alive.has_changed().is_err() {
        let end = tokio::time::timeout(std::time::Duration::from_secs(5), &mut watcher).await;
        if let Ok(Ok(crate::source::SourceEnd::NodeDeleted(node))) = end {
            return Err(AppError::NodeDeleted(node));
        }
    }
    watcher.abort();
    res.map(|()| Finished::Stopped)
}

/// Upstream's iptables mode reads nf_conntrack_tcp_be_liberal once its conntrack tuning is
/// applied and drops INVALID packets only when it reads 0 (`NewProxier`). The tuning only
/// ever sets the sysctl to 1, so a second call after it can only turn the drop off.
fn resolve_drop_invalid(p: &mut crate::proxy::ProxierConfig) {
    use crate::kernel::conntrack::tuning;
    if !p.drop_invalid {
        return;
    }
    let liberal = tuning::read_tcp_be_liberal();
    p.drop_invalid = tuning::drops_invalid(true, &liberal);
    match liberal {
        Ok(_) if !p.drop_invalid => tracing::info!(
            sysctl = tuning::TCP_BE_LIBERAL,
            "nf_conntrack_tcp_be_liberal set, not installing DROP rules for INVALID packets"
        ),
        Ok(_) => {}
        Err(e) => tracing::debug!(sysctl = tuning::TCP_BE_LIBERAL, err = %e,
            "cannot read nf_conntrack_tcp_be_liberal; dropping INVALID packets as upstream does"),
    }
}

/// A sender whose states reach `out` without externalIPs; `out` closes when it does.
fn relay_without_external_ips(
    out: watch::Sender<Option<Arc<ProxyState>>>,
) -> watch::Sender<Option<Arc<ProxyState>>> {
    let (tx, mut rx) = watch::channel::<Option<Arc<ProxyState>>>(None);
    tokio::spawn(async move {
        while rx.changed().await.is_ok() {
            let st = rx.borrow_and_update().clone();
            out.send_replace(st.map(|s| Arc::new(crate::model::without_external_ips(&s))));
        }
    });
    tx
}

/// The warning events upstream emits at start-up: the defaulted mode, IPVS mode, and each
/// server that could not bind its address.
fn startup_events(
    cfg: &Config,
    bind_failures: &[(&'static str, String)],
) -> Vec<kube_source::Warning> {
    let node = kube_source::node_ref(&cfg.node_name);
    let mut out = Vec::new();
    if cfg.mode_defaulted {
        out.push(kube_source::Warning {
            reference: node.clone(),
            reason: "KubeProxyDefaultMode".into(),
            action: "StartKubeProxy".into(),
            note: "No kube-proxy mode specified: defaulting to 'iptables', served by \
                   kube-nlproxy's nftables engine. Set 'mode' in the config file or \
                   --proxy-mode to choose."
                .into(),
        });
    }
    if cfg.mode == ProxyMode::Ipvs {
        // Upstream 1.35+ posts this reason when its deprecated ipvs proxier starts; ours is
        // supported, so the note says what upstream plans and that this binary keeps it.
        out.push(kube_source::Warning {
            reference: node.clone(),
            reason: "IPVSDeprecation".into(),
            action: "StartKubeProxy".into(),
            note: IPVS_NOTE.into(),
        });
    }
    for (reason, note) in bind_failures {
        out.push(kube_source::Warning {
            reference: node.clone(),
            reason: (*reason).into(),
            action: "StartKubeProxy".into(),
            note: note.clone(),
        });
    }
    out
}

/// The upstream IPVS deprecation, as this binary's IPVS mode sees it.
const IPVS_NOTE: &str = "Upstream kube-proxy deprecates its ipvs proxier (disabled by default in \
Kubernetes 1.40, removed in 1.43) and recommends nftables; kube-nlproxy's IPVS mode stays supported, \
and --proxy-mode=nftables is the way forward.";

/// What `/statusz` and `/flagz` show, each only while its gate is on.
fn zpages_of(cfg: &Config) -> admin::Zpages {
    let statusz = cfg.gates.enabled(gates::COMPONENT_STATUSZ).then(|| {
        let flagz = cfg.gates.enabled(gates::COMPONENT_FLAGZ);
        // The metrics server's paths, first segment only, as upstream lists its mux's.
        let mut paths = vec![
            "/configz",
            "/healthz",
            "/metrics",
            "/proxyMode",
            "/userspace",
        ];
        if flagz {
            paths.push("/flagz");
        }
        paths.sort_unstable();
        crate::serve::zpages::StatuszInfo {
            start: std::time::SystemTime::now(),
            go_version: format!(
                "none: kube-nlproxy {} is a Rust program",
                env!("CARGO_PKG_VERSION")
            ),
            binary_version: format!("1.37.0+kube-nlproxy-{}", env!("CARGO_PKG_VERSION")),
            emulation_version: "1.37".into(),
            paths: paths.into_iter().map(String::from).collect(),
        }
    });
    admin::Zpages {
        statusz,
        flagz: cfg
            .gates
            .enabled(gates::COMPONENT_FLAGZ)
            .then(|| cfg.flagz.clone()),
    }
}

/// Starts the health and metrics servers (each unless disabled by an empty address);
/// returns what failed to bind as (event reason, message).
async fn serve_admin(cfg: &Config) -> Result<(Shared, Vec<(&'static str, String)>), AppError> {
    let mut metrics = Metrics::new();
    let localhost_accepted = Arc::new(std::sync::atomic::AtomicU64::new(0));
    if cfg.requested_mode == "iptables" {
        // Upstream registers these collectors in iptables mode only, whether or not the
        // kernel is liberal (the INVALID count then stays at 0) or localhost NodePorts are
        // served. Upstream counts the first packet of each connection to a localhost
        // NodePort with an nfacct rule; ours are the connections and UDP sessions its
        // listeners forward.
        use crate::serve::metrics::{CT_STATE_INVALID_DROPPED, LOCALHOST_NODEPORTS_ACCEPTED};
        let mut dropped = nftables::invalid::InvalidDropped::new(cfg.proxier.table.clone());
        metrics.register_scraped_counter(
            CT_STATE_INVALID_DROPPED,
            Box::new(move || match dropped.read() {
                Ok(v) => Some(v),
                Err(e) => {
                    tracing::warn!(err = %e, "cannot read the INVALID drop counter");
                    None
                }
            }),
        );
        let accepted = localhost_accepted.clone();
        metrics.register_scraped_counter(
            LOCALHOST_NODEPORTS_ACCEPTED,
            Box::new(move || Some(accepted.load(std::sync::atomic::Ordering::Relaxed))),
        );
    }
    // Upstream registers these with the gate on in nftables mode, whether or not a family
    // serves or rejects anything.
    let localhost_metrics = (cfg.requested_mode == "nftables"
        && cfg
            .gates
            .enabled(gates::KUBE_PROXY_NFTABLES_LOCALHOST_NODE_PORTS))
    .then(|| {
        let mut rejected = nftables::localhost::RejectedCounts::new(cfg.proxier.table.clone());
        metrics.register_scraped_counters(
            crate::serve::metrics::LOCALHOST_NODEPORT_REJECTED,
            Box::new(move || {
                rejected
                    .read()
                    .into_iter()
                    .map(|((family, proto), n)| {
                        let labels = vec![
                            ("ip_family", FamilyLabel::of(family).ip_family),
                            ("protocol", proto.upper().to_owned()),
                        ];
                        (labels, n)
                    })
                    .collect()
            }),
        );
        metrics.register_localhost_nodeports()
    });
    let shared = Shared {
        health: Arc::new(Mutex::new(ProxyHealth::new(cfg.sync_period * 2))),
        metrics: Arc::new(metrics),
        configz: Arc::new(
            serde_json::to_value(cfg.to_kube_proxy_configuration()).unwrap_or_default(),
        ),
        proxy_mode: cfg.requested_mode.as_str().into(),
        listeners: Default::default(),
        zpages: Arc::new(zpages_of(cfg)),
        localhost_accepted,
        localhost_metrics,
    };
    shared.metrics.record_features(&cfg.gates.metric_values());
    let mut failures = Vec::new();
    for (addr, what, router) in [
        (
            cfg.healthz_bind_address,
            "healthz",
            admin::healthz_router(shared.clone()),
        ),
        (
            cfg.metrics_bind_address,
            "metrics",
            admin::metrics_router(shared.clone()),
        ),
    ] {
        let Some(addr) = addr else {
            tracing::info!(server = what, "server disabled (empty bind address)");
            continue;
        };
        if admin::serve(addr, what, router).await.is_none() {
            if cfg.bind_address_hard_fail {
                return Err(AppError::Bind(what, addr));
            }
            let reason = match what {
                "healthz" => "FailedToStartProxierHealthcheck",
                _ => "FailedToStartMetricServer",
            };
            failures.push((
                reason,
                format!("cannot listen on {addr} for the {what} server"),
            ));
        }
    }
    Ok((shared, failures))
}

/// What [`open_mode`] gives: a proxier over the kernel, or a dry run's text.
enum Opened {
    Proxier {
        proxier: Box<dyn Proxier + Send>,
        /// IPVS mode: the dummy link and our rtnetlink socket's port, to watch.
        link: Option<(String, u32)>,
    },
    DryRun(String),
}

/// The kernel clients a running proxier gets (none for `--dry-run`).
type Kernel = Option<(NetlinkNftables, Option<Box<dyn Conntrack + Send>>)>;

/// The one match on the mode. With kernel clients: removes what another mode left and opens
/// this mode's proxier. Without (`--dry-run`): renders what a full sync of `state` would
/// program, touching nothing.
fn open_mode(cfg: &Config, kernel: Kernel, state: &ProxyState) -> Result<Opened, AppError> {
    let opts = options(cfg);
    let proxier = |p: Box<dyn Proxier + Send>| Opened::Proxier {
        proxier: p,
        link: None,
    };
    if kernel.is_some() {
        // Upstream kube-proxy's rules of every mode go, as upstream's own nftables mode
        // removes the others' at start (platformCleanup): conntrack keeps the established
        // connections' NAT, and our first sync follows at once.
        remove_leftovers("upstream kube-proxy", || {
            let mut nft = open_nft()?;
            let mut removed = cleanup::cleanup_upstream(&mut nft).map_err(SyncError::NftCleanup)?;
            removed.extend(
                cleanup::cleanup_upstream_iptables(&mut nft).map_err(SyncError::NftCleanup)?,
            );
            removed.extend(upstream_legacy_chains());
            removed.extend(upstream_ipsets());
            Ok(removed)
        });
    }
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
            // IPVS forwards by its own connection table: only the stale entry cleanup.
            let conntrack = conntrack.filter(|_| cfg.conntrack_cleanup);
            let (p, port) = ipvs::open(nft, &opts, &cfg.ipvs, conntrack)?;
            Opened::Proxier {
                proxier: Box::new(p),
                link: Some((cfg.ipvs.dummy_link.clone(), port)),
            }
        }
    })
}

/// Upstream's chains in legacy x_tables; failures are warnings.
fn upstream_legacy_chains() -> Vec<String> {
    let mut x = crate::kernel::xtables::sockopt::SockoptXtables::default();
    cleanup::cleanup_upstream_legacy(&mut x).unwrap_or_else(|e| {
        tracing::warn!(err = %e, "cannot remove upstream kube-proxy's iptables-legacy chains");
        Vec::new()
    })
}

/// Upstream's IPVS-mode ipsets; failures are warnings (a set still referenced by a rule
/// that is not upstream's stays, and says so).
fn upstream_ipsets() -> Vec<String> {
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
fn drain_ipvs_leftovers(opts: &Options, cfg: &ipvs::IpvsConfig, once: bool) {
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

/// Upstream's iptables mode with localhost NodePorts sets
/// `net.ipv4.conf.all.route_localnet=1` (kubernetes#90259, with its log line) and our table
/// carries the guard it comes with ([`crate::proxy::ProxierConfig::localnet_guard`]). Our
/// forwarder does not need it; the node is left as upstream leaves it (scripts and upstream's
/// e2e spec "[Feature:KubeProxyNFAcct]" read it). A failure is a warning, where upstream's
/// proxier stops: the forwarder works without it.
fn set_route_localnet() {
    const ROUTE_LOCALNET: &str = "/proc/sys/net/ipv4/conf/all/route_localnet";
    tracing::info!("Setting route_localnet=1 to allow node-ports on localhost; to change this either disable iptables.localhostNodePorts (--iptables-localhost-nodeports) or set nodePortAddresses (--nodeport-addresses) to filter loopback addresses");
    if std::fs::read_to_string(ROUTE_LOCALNET).is_ok_and(|v| v.trim() == "1") {
        return;
    }
    if let Err(e) = std::fs::write(ROUTE_LOCALNET, "1") {
        tracing::warn!(sysctl = ROUTE_LOCALNET, err = %e, "cannot set route_localnet");
    }
}

/// A second nftables socket for cleanups (the proxier owns the first).
fn open_nft() -> Result<NetlinkNftables, SyncError> {
    NetlinkNftables::open().map_err(SyncError::NftCleanup)
}

/// Runs a leftover cleanup of another mode; failures are warnings (this mode works
/// regardless).
fn remove_leftovers(what: &str, f: impl FnOnce() -> Result<Vec<String>, SyncError>) {
    match f() {
        Ok(removed) => removed
            .into_iter()
            .for_each(|r| tracing::info!(mode = what, object = %r, "removed a leftover")),
        Err(e) => tracing::warn!(mode = what, err = %e, "cannot remove leftovers"),
    }
}

/// `--cleanup`: removes what every mode created (our tables, our IPVS virtual servers and
/// the dummy link) and upstream kube-proxy's nftables tables.
fn cleanup_everything(cfg: &Config) -> Result<(), AppError> {
    let opts = options(cfg);
    let mut nft = NetlinkNftables::open().map_err(AppError::Netlink)?;
    let mut removed = nftables::cleanup(&mut nft, &opts)?;
    removed.extend(userspace::cleanup(&mut nft, &opts)?);
    removed.extend(ipvs::cleanup(nft, &opts, &cfg.ipvs)?);
    if removed.is_empty() {
        tracing::info!("nothing to clean up");
    }
    for r in removed {
        tracing::info!(object = %r, "removed");
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

/// Change notifications that restore our state when someone else changes it.
struct Watch {
    tamper: Arc<tokio::sync::Notify>,
    monitor: Option<Monitor>,
    /// Our nftables socket's port (its changes are ours).
    nft_port: u32,
    /// IPVS mode: the dummy link and our rtnetlink socket's port.
    link: Option<(String, u32)>,
    /// The health and metrics servers' state, started before the first sync (none with
    /// `--once`).
    shared: Option<Shared>,
}

/// Runs the sync loop over `proxier` with health, metrics, health-check ports and change
/// notifications, until a signal or a config file change.
async fn drive<P: Proxier>(
    cfg: &Config,
    mut proxier: P,
    rx: watch::Receiver<Option<Arc<ProxyState>>>,
    state: Arc<ProxyState>,
    w: Watch,
    warnings: Option<tokio::sync::mpsc::UnboundedSender<kube_source::Warning>>,
    shutdown: Shutdown,
) -> Result<(), AppError> {
    let Watch {
        tamper,
        monitor,
        nft_port,
        link,
        shared,
    } = w;
    if cfg.once {
        let stats = proxier.sync(&state)?;
        tracing::info!(
            rules = stats.rules,
            elements = stats.elements,
            ipv4_ops = stats.ops_of(crate::kernel::nft::Family::Ip),
            ipv6_ops = stats.ops_of(crate::kernel::nft::Family::Ip6),
            virtual_servers = stats.virtual_servers,
            "synced once"
        );
        return Ok(());
    }
    // The runner gets every state from `rx`, this first one included. Held here for the
    // daemon's life, the first state kept each Service's original endpoint list alive after
    // a change replaced it: ~560 bytes per changed slice, +3 MiB over the churn row's 60 s
    // at 10k × 10 (issue #18, found with heaptrack).
    drop(state);
    let timing = Timing {
        min_sync_period: cfg.min_sync_period,
        sync_period: cfg.sync_period,
    };
    let Some(shared) = shared else {
        return Ok(());
    };
    let localhost_accepted = shared.localhost_accepted.clone();
    let mut hooks = Hooks::new(shared);
    hooks.warnings = warnings;
    if !cfg.localhost_listeners.is_empty() {
        hooks.localhost = Some((
            userspace::localhost::LocalhostNodePorts::new(localhost_accepted),
            cfg.localhost_listeners.clone(),
        ));
    }
    // Restore our state at once when someone else changes it (nf_tables and rtnetlink
    // notifications).
    let spawn = |name: &str, f: Box<dyn FnOnce() + Send>| {
        std::thread::Builder::new()
            .name(name.into())
            .spawn(f)
            .map(|_| ())
            .map_err(|e| AppError::Thread("notification", e))
    };
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
        let tamper = tamper.clone();
        spawn(
            "link-monitor",
            Box::new(move || {
                if let Err(e) = rtnl::watch(name, || port, || tamper.notify_one()) {
                    tracing::error!(err = %e, "link change notifications unavailable");
                }
            }),
        )?;
    }
    let config_changed = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let stop = {
        let (flag, path, loaded) = (
            config_changed.clone(),
            cfg.config_path.clone(),
            cfg.config_bytes.clone(),
        );
        async move {
            tokio::select! {
                _ = shutdown.signalled() => {}
                _ = watch_config_file(path, loaded) => flag.store(true, std::sync::atomic::Ordering::SeqCst),
            }
        }
    };
    runner::run(proxier, rx, timing, &mut hooks, Some(tamper), stop).await;
    if config_changed.load(std::sync::atomic::Ordering::SeqCst) {
        return Err(AppError::ConfigChanged);
    }
    tracing::info!("shutting down; rules stay in place");
    Ok(())
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
            Err(e) => tracing::warn!(err = %e, "keeping the last good state"),
        }
    }
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

/// Writes /proc/self/oom_score_adj; lowering it needs CAP_SYS_RESOURCE, so a failure is a
/// warning.
fn set_oom_score_adj(v: i32) {
    if let Err(e) = std::fs::write("/proc/self/oom_score_adj", v.to_string()) {
        tracing::warn!(value = v, err = %e, "cannot set oom_score_adj");
    }
}

/// SIGTERM or SIGINT, listened for from the first moment of [`run`]: a signal during
/// start-up (listing, opening sockets, the first sync) is kept and ends the daemon cleanly
/// as soon as start-up reaches a wait, instead of killing it with the rules half-written.
#[derive(Clone)]
struct Shutdown(watch::Receiver<bool>);

impl Shutdown {
    /// Installs the handlers now (tokio registers them when the streams are created).
    fn install() -> Shutdown {
        use tokio::signal::unix::{signal, SignalKind};
        let (tx, rx) = watch::channel(false);
        let term = signal(SignalKind::terminate());
        let int = signal(SignalKind::interrupt());
        match (term, int) {
            (Ok(mut term), Ok(mut int)) => {
                tokio::spawn(async move {
                    tokio::select! {
                        _ = term.recv() => tracing::info!("SIGTERM received"),
                        _ = int.recv() => tracing::info!("SIGINT received"),
                    }
                    let _ = tx.send(true);
                });
            }
            (Err(e), _) | (_, Err(e)) => {
                tracing::error!(err = %e, "cannot listen for SIGTERM/SIGINT")
            }
        }
        Shutdown(rx)
    }

    /// Resolves once a signal arrived (at once if it already had).
    async fn signalled(mut self) {
        if self.0.wait_for(|s| *s).await.is_err() {
            std::future::pending::<()>().await;
        }
    }
}
