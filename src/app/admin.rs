//! The health and metrics servers (upstream's healthz and metrics muxes), started before
//! anything else so that probes never kill a pod that waits for the API server: their shared
//! state, the metrics only some modes register, the z-pages. I/O (binds sockets).

use std::sync::{Arc, Mutex};

use crate::config::{gates, Config};
use crate::modes::nftables;
use crate::serve::admin::{self, Shared};
use crate::serve::metrics::{FamilyLabel, Metrics};
use crate::serve::proxy_health::ProxyHealth;

use super::sources::BindFailure;
use super::AppError;

/// What `/statusz` and `/flagz` show, each only while its gate is on.
fn zpages_of(cfg: &Config) -> admin::Zpages {
    let statusz = cfg.gates.enabled(gates::COMPONENT_STATUSZ).then(|| {
        let flagz = cfg.gates.enabled(gates::COMPONENT_FLAGZ);
        // The metrics server's paths, first segment only, as upstream lists its mux's (ours
        // also serves /debug/kube-nlproxy/…, left out so that the page is upstream's).
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
pub(super) async fn start(cfg: &Config) -> Result<(Shared, Vec<BindFailure>), AppError> {
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
        synced_state: Default::default(),
    };
    shared.metrics.record_features(&cfg.gates.metric_values());
    let failures = serve_all(cfg, &shared).await?;
    Ok((shared, failures))
}

/// Binds the healthz server and the metrics server (with the tools' pages), each unless
/// its address is empty; returns what failed to bind as (event reason, message), or the
/// first failure when `bindAddressHardFail` says so.
async fn serve_all(cfg: &Config, shared: &Shared) -> Result<Vec<BindFailure>, AppError> {
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
            admin::metrics_router(shared.clone()).merge(super::diagnostics::router(
                Arc::new(cfg.clone()),
                shared.synced_state.clone(),
            )),
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
    Ok(failures)
}
