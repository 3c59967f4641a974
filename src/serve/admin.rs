//! The daemon's HTTP endpoints: `/healthz` and `/livez` on the healthz address, `/metrics` on
//! the metrics address. A port that cannot be bound is logged; the proxy keeps running
//! (upstream's default `bindAddressHardFail: false`).

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::SystemTime;

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;

use crate::serve::metrics::{CodeLabel, Metrics};
use crate::serve::proxy_health::ProxyHealth;

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
/// `/proxyMode`, `/healthz` (the server's own liveness, `ok`) and `/metrics/slis`.
pub fn metrics_router(shared: Shared) -> axum::Router {
    let configz = shared.configz.clone();
    let mode = shared.proxy_mode.clone();
    let checks = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let (c1, c2) = (checks.clone(), checks);
    let plain = |body: String| {
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
    };
    axum::Router::new()
        .route(
            "/proxyMode",
            get(move || async move { plain(mode.to_string()) }),
        )
        .route(
            "/healthz",
            get(move || async move {
                c1.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                plain("ok".into())
            }),
        )
        .route(
            "/metrics/slis",
            get(move || async move {
                // component-base's SLI metrics for the metrics server's healthz checks
                // (upstream registers only "ping").
                let n = c2.load(std::sync::atomic::Ordering::Relaxed);
                plain(format!(
                    "# HELP kubernetes_healthcheck [STABLE] This metric records the result of a single healthcheck.\n\
                     # TYPE kubernetes_healthcheck gauge\n\
                     kubernetes_healthcheck{{name=\"ping\",type=\"healthz\"}} 1\n\
                     # HELP kubernetes_healthchecks_total [STABLE] This metric records the results of all healthcheck.\n\
                     # TYPE kubernetes_healthchecks_total counter\n\
                     kubernetes_healthchecks_total{{name=\"ping\",status=\"success\",type=\"healthz\"}} {n}\n"
                ))
            }),
        )
        .route("/userspace/listeners", {
            let listeners = shared.listeners.clone();
            get(move || async move {
                let l = listeners.lock().expect("listeners").clone();
                axum::Json((*l).clone())
            })
        })
        .route(
            "/configz",
            get(move || async move {
                axum::Json(serde_json::json!({"kubeproxy.config.k8s.io": *configz}))
            }),
        )
        .route(
            "/metrics",
            get(move || async move {
                // Rendering may read counters from the kernel (a netlink dump).
                let m = shared.metrics.clone();
                let body = tokio::task::spawn_blocking(move || m.render())
                    .await
                    .unwrap_or_default();
                let mut r = body.into_response();
                r.headers_mut().insert(
                    header::CONTENT_TYPE,
                    HeaderValue::from_static("text/plain; version=0.0.4; charset=utf-8"),
                );
                r
            }),
        )
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
            tracing::info!(%addr, "serving {what}");
            tokio::spawn(async move {
                if let Err(e) = axum::serve(l, router).await {
                    tracing::error!(%addr, "{what} server failed: {e}");
                }
            });
            bound
        }
        Err(e) => {
            tracing::error!(%addr, "cannot serve {what}: {e}");
            None
        }
    }
}
