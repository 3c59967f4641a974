//! The daemon's HTTP endpoints: `/healthz` and `/livez` on the healthz address, `/metrics`,
//! `/configz`, `/proxyMode`, `/statusz` and `/flagz` on the metrics address. A port that cannot be bound is logged; the proxy keeps running
//! (upstream's default `bindAddressHardFail: false`).

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::SystemTime;

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;

use crate::serve::metrics::{CodeLabel, Metrics};
use crate::serve::proxy_health::ProxyHealth;
use crate::serve::zpages;

/// State shared by the sync loop and the HTTP handlers.
#[derive(Clone)]
pub struct Shared {
    pub health: Arc<Mutex<ProxyHealth>>,
    pub metrics: Arc<Metrics>,
    /// The running configuration, served at `/configz`.
    pub configz: Arc<serde_json::Value>,
    /// The configured mode's name, served at `/proxyMode` (`iptables` when the file left it
    /// empty, as upstream answers).
    pub proxy_mode: Arc<str>,
    /// Userspace mode's listeners after the last sync, served at `/userspace/listeners`
    /// (for `explain`; empty in the other modes).
    pub listeners: Arc<Mutex<Arc<Vec<crate::proxy::ListenerInfo>>>>,
    /// `/statusz` and `/flagz`; `None`: the page's gate is off and it answers 404.
    pub zpages: Arc<Zpages>,
    /// Connections and UDP sessions the localhost NodePort listeners forwarded (iptables
    /// mode's `kubeproxy_iptables_localhost_nodeports_accepted_packets_total`).
    pub localhost_accepted: Arc<std::sync::atomic::AtomicU64>,
    /// The nftables mode's loopback NodePort listener metrics, registered only with the gate
    /// `KubeProxyNFTablesLocalhostNodePorts` on (as upstream).
    pub localhost_metrics: Option<crate::serve::metrics::LocalhostNodePortMetrics>,
    /// The state of the last successful sync (what `/debug/kube-nlproxy/status` compares
    /// the kernel with); `None` before the first.
    pub synced_state: Arc<Mutex<Option<Arc<crate::model::ProxyState>>>>,
}

#[cfg(any(test, feature = "testing"))]
impl Shared {
    /// What a sync loop shares when nothing serves it: nftables mode, a 60 s health
    /// timeout, fresh metrics (tests and benchmarks of the hooks).
    pub fn detached() -> Shared {
        Shared {
            health: Arc::new(Mutex::new(ProxyHealth::new(
                std::time::Duration::from_secs(60),
            ))),
            metrics: Arc::new(Metrics::new()),
            configz: Arc::default(),
            proxy_mode: "nftables".into(),
            listeners: Default::default(),
            zpages: Default::default(),
            localhost_accepted: Default::default(),
            localhost_metrics: None,
            synced_state: Default::default(),
        }
    }
}

/// What the metrics server's z-pages show.
#[derive(Debug, Clone, Default)]
pub struct Zpages {
    pub statusz: Option<zpages::StatuszInfo>,
    pub flagz: Option<std::collections::BTreeMap<String, String>>,
}

/// Answers a z-page: the text form or the negotiated structured form (see [`zpages`]).
fn zpage_response(
    headers: &axum::http::HeaderMap,
    page: &str,
    kind: &str,
    text: impl FnOnce(&'static str) -> String,
    object: impl FnOnce(&str) -> serde_json::Value,
) -> Response {
    let accept = headers
        .get(header::ACCEPT)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default();
    // apiserver pretty-prints for curl, Wget and browsers.
    let agent_pretty = headers
        .get(header::USER_AGENT)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|a| {
            ["curl", "Wget", "Mozilla/5.0"]
                .iter()
                .any(|p| a.starts_with(p))
        });
    let typed = |body: String, ct: &str| {
        let mut r = body.into_response();
        if let Ok(v) = HeaderValue::from_str(ct) {
            r.headers_mut().insert(header::CONTENT_TYPE, v);
        }
        r
    };
    match zpages::negotiate(accept, kind) {
        zpages::Negotiated::Text => typed(
            text(zpages::pick_delimiter(SystemTime::now())),
            "text/plain; charset=utf-8",
        ),
        zpages::Negotiated::Structured {
            yaml,
            version,
            pretty,
        } => {
            let body = zpages::encode(&object(version), yaml, pretty || agent_pretty);
            let mut r = typed(body, &zpages::structured_content_type(yaml, version, kind));
            if let Some(w) = zpages::deprecation_warning(page, version)
                .and_then(|w| HeaderValue::from_str(&w).ok())
            {
                r.headers_mut().insert(header::WARNING, w);
            }
            r
        }
        zpages::Negotiated::NotAcceptable => {
            let mut r = typed(zpages::not_acceptable_body(), "application/json");
            *r.status_mut() = StatusCode::NOT_ACCEPTABLE;
            r
        }
    }
}

fn health_response(shared: &Shared, live: bool) -> Response {
    let st = shared
        .health
        .lock()
        .expect("proxy health")
        .status(SystemTime::now());
    let ok = st.healthy && (live || st.node_eligible);
    let code = if ok {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    let counter = if live {
        &shared.metrics.livez_total
    } else {
        &shared.metrics.healthz_total
    };
    counter
        .get_or_create(&CodeLabel {
            code: code.as_u16().to_string(),
        })
        .inc();
    let mut r = (code, serde_json::to_string(&st).unwrap_or_default()).into_response();
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    r.headers_mut().insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    r
}

/// Routes of the healthz server.
pub fn healthz_router(shared: Shared) -> axum::Router {
    let (a, b) = (shared.clone(), shared);
    axum::Router::new()
        .route(
            "/healthz",
            get(move || async move { health_response(&a, false) }),
        )
        .route(
            "/livez",
            get(move || async move { health_response(&b, true) }),
        )
}

/// Routes of the metrics server, as upstream's metrics mux: `/metrics`, `/configz`,
/// `/proxyMode`, `/healthz` (the server's own liveness, `ok`), `/metrics/slis`, and
/// `/statusz` and `/flagz` when their gates are on.
pub fn metrics_router(shared: Shared) -> axum::Router {
    let mode = shared.proxy_mode.clone();
    let configz = shared.configz.clone();
    let listeners = shared.listeners.clone();
    let metrics = shared.metrics.clone();
    // The metrics server's own healthz checks, counted for `/metrics/slis`.
    let checks = Arc::new(AtomicU64::new(0));
    let counted = checks.clone();
    zpage_routes(&shared)
        .route(
            "/proxyMode",
            get(move || async move { plain_text(mode.to_string()) }),
        )
        .route(
            "/healthz",
            get(move || async move {
                counted.fetch_add(1, Ordering::Relaxed);
                plain_text("ok".into())
            }),
        )
        .route(
            "/metrics/slis",
            get(
                move || async move { plain_text(healthz_sli_text(checks.load(Ordering::Relaxed))) },
            ),
        )
        .route(
            "/userspace/listeners",
            get(move || async move {
                let l = listeners.lock().expect("listeners").clone();
                axum::Json((*l).clone())
            }),
        )
        .route(
            "/configz",
            get(move || async move {
                axum::Json(serde_json::json!({"kubeproxy.config.k8s.io": *configz}))
            }),
        )
        .route(
            "/metrics",
            get(move || async move { metrics_page(metrics).await }),
        )
}

/// `/statusz` and `/flagz`, each where its gate put its content in `shared`.
fn zpage_routes(shared: &Shared) -> axum::Router {
    let mut router = axum::Router::new();
    if let Some(info) = shared.zpages.statusz.clone() {
        let info = Arc::new(info);
        router = router.route(
            "/statusz",
            get(move |headers: axum::http::HeaderMap| async move {
                let now = SystemTime::now();
                zpage_response(
                    &headers,
                    "statusz",
                    "Statusz",
                    |d| zpages::render_statusz_text(&info, now, d),
                    |v| zpages::statusz_object(&info, v, now),
                )
            }),
        );
    }
    if let Some(flags) = shared.zpages.flagz.clone() {
        let flags = Arc::new(flags);
        router = router.route(
            "/flagz",
            get(move |headers: axum::http::HeaderMap| async move {
                zpage_response(
                    &headers,
                    "flagz",
                    "Flagz",
                    |d| zpages::render_flagz_text(&flags, d),
                    |v| zpages::flagz_object(&flags, v),
                )
            }),
        );
    }
    router
}

/// A plain-text answer as upstream's mux writes one.
fn plain_text(body: String) -> Response {
    let mut r = body.into_response();
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    r.headers_mut().insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    r
}

/// component-base's SLI metrics for the metrics server's healthz checks (upstream registers
/// only "ping"), after `checks` of them.
fn healthz_sli_text(checks: u64) -> String {
    format!(
        "# HELP kubernetes_healthcheck [STABLE] This metric records the result of a single healthcheck.\n\
         # TYPE kubernetes_healthcheck gauge\n\
         kubernetes_healthcheck{{name=\"ping\",type=\"healthz\"}} 1\n\
         # HELP kubernetes_healthchecks_total [STABLE] This metric records the results of all healthcheck.\n\
         # TYPE kubernetes_healthchecks_total counter\n\
         kubernetes_healthchecks_total{{name=\"ping\",status=\"success\",type=\"healthz\"}} {checks}\n"
    )
}

/// `/metrics`: rendering may read counters from the kernel (a netlink dump), so it runs off
/// the server's threads.
async fn metrics_page(metrics: Arc<Metrics>) -> Response {
    let body = tokio::task::spawn_blocking(move || metrics.render())
        .await
        .unwrap_or_default();
    let mut r = body.into_response();
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; version=0.0.4; charset=utf-8"),
    );
    r
}

/// Serves `router` on `addr` in the background and returns the bound address; a bind
/// failure is logged and the proxy carries on.
pub async fn serve(
    addr: SocketAddr,
    what: &'static str,
    router: axum::Router,
) -> Option<SocketAddr> {
    match tokio::net::TcpListener::bind(addr).await {
        Ok(l) => {
            let bound = l.local_addr().ok();
            tracing::info!(%addr, server = what, "serving");
            tokio::spawn(async move {
                if let Err(e) = axum::serve(l, router).await {
                    tracing::error!(%addr, server = what, err = %e, "server failed");
                }
            });
            bound
        }
        Err(e) => {
            tracing::error!(%addr, server = what, err = %e, "cannot serve");
            None
        }
    }
}
