//! The daemon's HTTP endpoints: `/healthz` and `/livez` on the healthz address, `/metrics` on
//! the metrics address. A port that cannot be bound is logged; the proxy keeps running
//! (upstream's default `bindAddressHardFail: false`).

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::SystemTime;

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;

use std::collections::BTreeMap;
use std::time::Duration;

use crate::health::ProxyHealth;
use crate::healthcheck::{plan_health_checks, ServiceHealthServers};
use crate::metrics::{unix_secs, CodeLabel, Metrics, PolicyLabel};
use crate::model::{count_changes, ProxyState};
use crate::nft::Family;
use crate::sync::runner::SyncHooks;
use crate::sync::{SyncError, SyncStats};

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

/// Feeds health, metrics and health-check ports from the sync loop.
pub struct Hooks {
    /// The localhost NodePort forwarder, when enabled.
    pub localhost: Option<crate::localhost::LocalhostNodePorts>,
    /// Where warning events go when the API source is in use.
    pub warnings: Option<tokio::sync::mpsc::UnboundedSender<crate::source::kube::Warning>>,
    shared: Shared,
    hc: ServiceHealthServers,
    prev: Option<Arc<ProxyState>>,
    observed_triggers: BTreeMap<crate::model::ServicePortName, SystemTime>,
}

impl Hooks {
    pub fn new(shared: Shared) -> Self {
        Hooks {
            localhost: None,
            warnings: None,
            hc: ServiceHealthServers::new(shared.health.clone()),
            shared,
            prev: None,
            observed_triggers: BTreeMap::new(),
        }
    }
}

impl SyncHooks for Hooks {
    fn tampered(&mut self) {
        self.shared.metrics.nftables_restores.inc();
    }

    fn state_changed(&mut self, state: &Arc<ProxyState>) {
        let now = SystemTime::now();
        let m = &self.shared.metrics;
        let (svcs, eps) = match &self.prev {
            Some(p) => count_changes(p, state),
            None => (state.services.len(), state.endpoints.len()),
        };
        m.service_changes_total.inc_by(svcs as u64);
        m.endpoint_changes_total.inc_by(eps as u64);
        m.service_changes_pending.inc_by(svcs as i64);
        m.endpoint_changes_pending.inc_by(eps as i64);
        m.last_queued_timestamp.set(unix_secs(now));
        let mut h = self.shared.health.lock().expect("proxy health");
        for f in Family::all() {
            h.queued_update(f, now);
        }
        h.set_node_eligible(!state.node.being_deleted);
        drop(h);
        self.prev = Some(state.clone());
    }

    fn synced(&mut self, state: &ProxyState, res: &Result<SyncStats, SyncError>, took: Duration) {
        let now = SystemTime::now();
        let m = &self.shared.metrics;
        match res {
            Ok(s) => {
                m.observe_sync(s.full, took, true);
                tracing::info!(full = s.full, rules = s.rules, elements = s.elements, ops = ?s.ops, took = ?took, "synced");
                m.service_changes_pending.set(0);
                m.endpoint_changes_pending.set(0);
                if let Some(d) = s.conntrack_duration {
                    m.conntrack_duration.observe(d.as_secs_f64());
                }
                m.conntrack_deleted.inc_by(s.conntrack_deleted as u64);
                if s.restored > 0 {
                    m.nftables_restores.inc();
                }
                let mut h = self.shared.health.lock().expect("proxy health");
                for f in Family::all() {
                    h.updated(f, now);
                }
                drop(h);
                // Network programming latency: from the EndpointSlice change to now, once per
                // trigger time.
                for (spn, t) in &state.trigger_times {
                    if self.observed_triggers.get(spn) != Some(t) {
                        if let Ok(d) = now.duration_since(*t) {
                            m.network_programming_duration.observe(d.as_secs_f64());
                        }
                        self.observed_triggers.insert(spn.clone(), *t);
                    }
                }
                self.observed_triggers
                    .retain(|k, _| state.trigger_times.contains_key(k));
                let (internal, external) = crate::proxier::plan::count_no_local_endpoints(state);
                for (policy, n) in [("internal", internal), ("external", external)] {
                    m.no_local_endpoints
                        .get_or_create(&PolicyLabel {
                            traffic_policy: policy.into(),
                        })
                        .set(n as i64);
                }
                if let Some(l) = self.localhost.as_mut() {
                    l.sync(crate::localhost::plan_localhost(state));
                }
                for (port, svc, err) in self.hc.sync(plan_health_checks(state)) {
                    if let Some(w) = &self.warnings {
                        let _ = w.send(crate::source::kube::Warning {
                            reference: k8s_openapi::api::core::v1::ObjectReference {
                                api_version: Some("v1".into()),
                                kind: Some("Service".into()),
                                namespace: Some(svc.namespace.clone()),
                                name: Some(svc.name.clone()),
                                ..Default::default()
                            },
                            reason: "FailedToStartServiceHealthcheck".into(),
                            note: format!(
                                "node {} failed to start healthcheck on port {port}: {err}",
                                state.node.name
                            ),
                        });
                    }
                }
            }
            Err(_) => m.observe_sync(true, took, false),
        }
    }
}
