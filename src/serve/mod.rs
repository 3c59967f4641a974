//! What the daemon serves: `/healthz`, `/livez`, `/metrics`, `/configz`
//! ([`admin`]), `/statusz` and `/flagz` ([`zpages`]), the proxy's own health ([`proxy_health`]), the health-check node ports of
//! `externalTrafficPolicy: Local` Services ([`service_health`]) and the metrics registry.

pub mod admin;
pub mod metrics;
pub mod proxy_health;
pub(crate) mod service_health;
pub mod zpages;
