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

/// Routes of the metrics server: `/metrics` and `/configz`.
pub fn metrics_router(shared: Shared) -> axum::Router {
    let configz = shared.configz.clone();
    axum::Router::new()
        .route(
            "/configz",
            get(move || async move {
                axum::Json(serde_json::json!({"kubeproxy.config.k8s.io": *configz}))
            }),
        )
        .route(
            "/metrics",
            get(move || async move {
                let mut r = shared.metrics.render().into_response();
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
