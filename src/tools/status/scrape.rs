//! The running daemon's figures, read from its Prometheus metrics page. Pure.

/// The running daemon, from its metrics endpoint.
#[derive(Debug, Clone, Default, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Daemon {
    pub metrics_url: String,
    /// Unix time of the last successful sync.
    pub last_sync: Option<f64>,
    /// The last sync's duration (seconds) and whether it succeeded.
    pub last_sync_seconds: Option<f64>,
    pub last_sync_ok: Option<bool>,
    /// Mean sync duration so far, seconds, and how many syncs.
    pub mean_sync_seconds: Option<f64>,
    pub syncs: u64,
    pub sync_failures: u64,
    pub pending_service_changes: f64,
    pub pending_endpoint_changes: f64,
}

/// Every sample of metric `name` (each label set).
pub(super) fn samples<'a>(text: &'a str, name: &'a str) -> impl Iterator<Item = f64> + 'a {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(move |l| {
            let (k, v) = l.rsplit_once(' ')?;
            (k.split('{').next() == Some(name)).then(|| v.parse().ok())?
        })
}

/// The sum over label sets (counters, per-family sums).
pub(super) fn sample(text: &str, name: &str) -> Option<f64> {
    samples(text, name).reduce(|a, b| a + b)
}

/// The latest over label sets (per-family timestamps).
pub(super) fn sample_max(text: &str, name: &str) -> Option<f64> {
    samples(text, name).reduce(f64::max)
}

/// Reads a Prometheus text page into [`Daemon`].
pub fn daemon_from_metrics(url: String, text: &str) -> Daemon {
    let count = sample(text, "kubeproxy_sync_proxy_rules_duration_seconds_count").unwrap_or(0.0);
    let sum = sample(text, "kubeproxy_sync_proxy_rules_duration_seconds_sum").unwrap_or(0.0);
    Daemon {
        metrics_url: url,
        last_sync: sample_max(text, "kubeproxy_sync_proxy_rules_last_timestamp_seconds")
            .filter(|t| *t > 0.0),
        last_sync_seconds: sample(text, "kube_nlproxy_sync_last_duration_seconds")
            .filter(|_| count > 0.0),
        last_sync_ok: sample(text, "kube_nlproxy_sync_last_result")
            .filter(|_| count > 0.0)
            .map(|v| v == 1.0),
        mean_sync_seconds: (count > 0.0).then(|| sum / count),
        syncs: count as u64,
        sync_failures: sample(
            text,
            "kubeproxy_sync_proxy_rules_nftables_sync_failures_total",
        )
        .unwrap_or(0.0) as u64,
        pending_service_changes: sample(text, "kubeproxy_sync_proxy_rules_service_changes_pending")
            .unwrap_or(0.0),
        pending_endpoint_changes: sample(
            text,
            "kubeproxy_sync_proxy_rules_endpoint_changes_pending",
        )
        .unwrap_or(0.0),
    }
}

/// [`Report::daemon`] as a plain object: no Rust `Ok`/`Err` wrapper in the schema.
pub(super) fn daemon_json<S: serde::Serializer>(
    d: &Result<Daemon, String>,
    s: S,
) -> Result<S::Ok, S::Error> {
    use serde::Serialize;
    #[derive(serde::Serialize)]
    #[serde(rename_all = "camelCase")]
    struct Reachable<'a> {
        reachable: bool,
        #[serde(flatten)]
        daemon: &'a Daemon,
    }
    #[derive(serde::Serialize)]
    #[serde(rename_all = "camelCase")]
    struct Unreachable<'a> {
        reachable: bool,
        error: &'a str,
    }
    match d {
        Ok(daemon) => Reachable {
            reachable: true,
            daemon,
        }
        .serialize(s),
        Err(error) => Unreachable {
            reachable: false,
            error,
        }
        .serialize(s),
    }
}
