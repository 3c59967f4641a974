//! Per-service health-check node ports (upstream `service_health.go`): for every Service with
//! `externalTrafficPolicy: Local` and a `healthCheckNodePort`, an HTTP server on that port
//! answering 200 when the node has local endpoints and the proxy is healthy, else 503, with
//! the `X-Load-Balancing-Endpoint-Weight` header. The plan is pure; [`ServiceHealthServers`]
//! binds and stops listeners.

use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::SystemTime;

use axum::extract::ConnectInfo;
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use serde::Serialize;

use crate::model::ProxyState;
use crate::serve::proxy_health::ProxyHealth;

/// What one health-check port reports. Counts are per family, as upstream runs one proxier
/// per family: a client asking over IPv4 learns about IPv4 endpoints.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HcService {
    pub namespace: String,
    pub name: String,
    pub local_endpoints_v4: usize,
    pub local_endpoints_v6: usize,
}

impl HcService {
    /// Local endpoints of the family the client used (IPv4-mapped addresses count as IPv4).
    pub fn local_endpoints(&self, client: IpAddr) -> usize {
        let v4 = match client {
            IpAddr::V4(_) => true,
            IpAddr::V6(a) => a.to_ipv4_mapped().is_some(),
        };
        if v4 {
            self.local_endpoints_v4
        } else {
            self.local_endpoints_v6
        }
    }
}

/// The health-check ports wanted by `state`, with their services' local ready endpoints.
pub fn plan_health_checks(state: &ProxyState) -> BTreeMap<u16, HcService> {
    let mut out: BTreeMap<u16, (HcService, BTreeSet<IpAddr>)> = BTreeMap::new();
    for (spn, sp) in &state.services {
        let Some(port) = sp.health_check_node_port else {
            continue;
        };
        if !sp.external_policy_local {
            continue;
        }
        let entry = out.entry(port).or_insert_with(|| {
            (
                HcService {
                    namespace: spn.namespace.to_string(),
                    name: spn.name.to_string(),
                    local_endpoints_v4: 0,
                    local_endpoints_v6: 0,
                },
                BTreeSet::new(),
            )
        });
        for e in state.endpoints_of(spn) {
            if e.is_local && e.ready {
                entry.1.insert(e.ip);
            }
        }
    }
    out.into_iter()
        .map(|(p, (mut s, ips))| {
            s.local_endpoints_v4 = ips.iter().filter(|i| i.is_ipv4()).count();
            s.local_endpoints_v6 = ips.len() - s.local_endpoints_v4;
            (p, s)
        })
        .collect()
}

#[derive(Serialize)]
struct ServiceRef<'a> {
    namespace: &'a str,
    name: &'a str,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct HcBody<'a> {
    service: ServiceRef<'a>,
    local_endpoints: usize,
    service_proxy_healthy: bool,
}

/// The response for one request to a health-check port from `client`.
pub fn respond(svc: &HcService, client: IpAddr, proxy_healthy: bool) -> Response {
    let local_endpoints = svc.local_endpoints(client);
    let body = serde_json::to_string(&HcBody {
        service: ServiceRef {
            namespace: &svc.namespace,
            name: &svc.name,
        },
        local_endpoints,
        service_proxy_healthy: proxy_healthy,
    })
    .unwrap_or_default();
    let code = if local_endpoints > 0 && proxy_healthy {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    let mut r = (code, body).into_response();
    let h = r.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    h.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    if let Ok(v) = HeaderValue::from_str(&local_endpoints.to_string()) {
        h.insert("X-Load-Balancing-Endpoint-Weight", v);
    }
    r
}

type Shared = Arc<Mutex<BTreeMap<u16, HcService>>>;

/// The running health-check listeners.
pub struct ServiceHealthServers {
    shared: Shared,
    health: Arc<Mutex<ProxyHealth>>,
    servers: BTreeMap<u16, tokio::task::JoinHandle<()>>,
    failed: BTreeSet<u16>,
}

impl ServiceHealthServers {
    pub fn new(health: Arc<Mutex<ProxyHealth>>) -> Self {
        ServiceHealthServers {
            shared: Arc::default(),
            health,
            servers: BTreeMap::new(),
            failed: BTreeSet::new(),
        }
    }

    /// Starts and stops listeners to match `want`. Must run inside the tokio runtime. A
    /// port that cannot be bound is logged (once until it changes) and retried next time;
    /// the others are unaffected. Returns the ports that newly failed, for events.
    pub fn sync(&mut self, want: BTreeMap<u16, HcService>) -> Vec<(u16, HcService, String)> {
        let mut newly_failed = Vec::new();
        let gone: Vec<u16> = self
            .servers
            .keys()
            .filter(|p| !want.contains_key(p))
            .copied()
            .collect();
        for p in gone {
            if let Some(h) = self.servers.remove(&p) {
                h.abort();
                tracing::info!(port = p, "stopped health check server");
            }
        }
        self.failed.retain(|p| want.contains_key(p));
        for (port, svc) in &want {
            if self.servers.contains_key(port) {
                continue;
            }
            match bind(*port) {
                Ok(l) => {
                    let app = router(self.shared.clone(), self.health.clone(), *port);
                    self.servers.insert(
                        *port,
                        tokio::spawn(async move {
                            let svc = app.into_make_service_with_connect_info::<SocketAddr>();
                            let _ = axum::serve(l, svc).await;
                        }),
                    );
                    self.failed.remove(port);
                    tracing::info!(port, service = %format!("{}/{}", svc.namespace, svc.name), "started health check server");
                }
                Err(e) => {
                    if self.failed.insert(*port) {
                        tracing::error!(port, service = %format!("{}/{}", svc.namespace, svc.name), "FailedToStartServiceHealthcheck: cannot listen: {e}");
                        newly_failed.push((*port, svc.clone(), e.to_string()));
                    }
                }
            }
        }
        *self.shared.lock().expect("health check map") = want;
        newly_failed
    }
}

fn bind(port: u16) -> std::io::Result<tokio::net::TcpListener> {
    // One dual-stack socket when IPv6 is available, else IPv4 only.
    let l = std::net::TcpListener::bind(SocketAddr::from(([0u16; 8], port)))
        .or_else(|_| std::net::TcpListener::bind(SocketAddr::from(([0u8; 4], port))))?;
    l.set_nonblocking(true)?;
    tokio::net::TcpListener::from_std(l)
}

fn router(shared: Shared, health: Arc<Mutex<ProxyHealth>>, port: u16) -> axum::Router {
    axum::Router::new().fallback(move |ConnectInfo(peer): ConnectInfo<SocketAddr>| {
        let (shared, health) = (shared.clone(), health.clone());
        async move {
            let svc = shared.lock().expect("health check map").get(&port).cloned();
            let healthy = health
                .lock()
                .expect("proxy health")
                .status(SystemTime::now())
                .healthy;
            match svc {
                Some(s) => respond(&s, peer.ip(), healthy),
                None => StatusCode::NOT_FOUND.into_response(),
            }
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::fixtures::endpoints::{endpoint, EndpointFixture};
    use crate::model::{Protocol, ServicePort, ServicePortName};

    #[test]
    fn plan_counts_local_ready_endpoints_of_local_policy_services() {
        let mut st = ProxyState::default();
        for (port, local_policy) in [("a", true), ("b", true)] {
            let spn = ServicePortName {
                namespace: "ns".into(),
                name: "lb".into(),
                port: port.into(),
                protocol: Protocol::Tcp,
            };
            st.services.insert(
                spn.clone(),
                ServicePort {
                    node_port: Some(30000),
                    external_policy_local: local_policy,
                    health_check_node_port: Some(32000),
                    ..ServicePort::new(spn.clone(), "10.0.0.1".parse().unwrap(), 80)
                }
                .into(),
            );
            st.endpoints.insert(
                spn,
                vec![
                    endpoint("10.1.0.1:80").local(),
                    endpoint("10.1.0.2:80").not_ready().not_serving().local(),
                    endpoint("10.1.0.3:80"),
                ]
                .into(),
            );
        }
        let plan = plan_health_checks(&st);
        assert_eq!(plan.len(), 1);
        let v4: IpAddr = "192.0.2.1".parse().unwrap();
        assert_eq!(
            plan[&32000].local_endpoints(v4),
            1,
            "one local ready endpoint IP across ports"
        );
        assert_eq!(
            plan[&32000].local_endpoints("::ffff:192.0.2.1".parse().unwrap()),
            1
        );
        assert_eq!(
            plan[&32000].local_endpoints("2001:db8::1".parse().unwrap()),
            0
        );
    }

    #[test]
    fn response_codes_and_header() {
        let svc = HcService {
            namespace: "ns".into(),
            name: "lb".into(),
            local_endpoints_v4: 2,
            local_endpoints_v6: 0,
        };
        let v4: IpAddr = "192.0.2.1".parse().unwrap();
        let r = respond(&svc, v4, true);
        assert_eq!(r.status(), StatusCode::OK);
        assert_eq!(r.headers()["X-Load-Balancing-Endpoint-Weight"], "2");
        assert_eq!(
            respond(&svc, v4, false).status(),
            StatusCode::SERVICE_UNAVAILABLE
        );
        let v6: IpAddr = "2001:db8::1".parse().unwrap();
        assert_eq!(
            respond(&svc, v6, true).status(),
            StatusCode::SERVICE_UNAVAILABLE
        );
    }
}
