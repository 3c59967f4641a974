//! Prometheus metrics under upstream kube-proxy's names, types and buckets
//! (`pkg/proxy/metrics`), plus process metrics read from /proc/self.

use std::fmt::Write;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use prometheus_client::encoding::text::encode;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family as MetricFamily;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;

/// `code` label of the healthz/livez counters.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct CodeLabel {
    pub code: String,
}

/// `traffic_policy` label of the no-local-endpoints gauge.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PolicyLabel {
    pub traffic_policy: String,
}

/// Every metric the daemon exports.
pub struct Metrics {
    registry: Registry,
    pub sync_duration: Histogram,
    pub sync_full_duration: Histogram,
    pub sync_partial_duration: Histogram,
    pub last_sync_timestamp: Gauge<f64, std::sync::atomic::AtomicU64>,
    pub last_queued_timestamp: Gauge<f64, std::sync::atomic::AtomicU64>,
    pub network_programming_duration: Histogram,
    pub endpoint_changes_pending: Gauge,
    pub endpoint_changes_total: Counter,
    pub service_changes_pending: Gauge,
    pub service_changes_total: Counter,
    pub no_local_endpoints: MetricFamily<PolicyLabel, Gauge>,
    pub healthz_total: MetricFamily<CodeLabel, Counter>,
    pub livez_total: MetricFamily<CodeLabel, Counter>,
    pub nftables_sync_failures: Counter,
    pub nftables_cleanup_failures: Counter,
    pub nftables_restores: Counter,
    pub conntrack_deleted: Counter,
    pub conntrack_duration: Histogram,
    start: SystemTime,
}

fn network_programming_buckets() -> Vec<f64> {
    // Upstream: 0.25, 0.5, 1..59 by 1, 60..115 by 5, 120..300 by 30.
    let mut b = vec![0.25, 0.5];
    b.extend((1..=59).map(|i| i as f64));
    b.extend((0..12).map(|i| 60.0 + 5.0 * i as f64));
    b.extend((0..7).map(|i| 120.0 + 30.0 * i as f64));
    b
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    pub fn new() -> Self {
        let mut r = Registry::with_prefix("kubeproxy");
        let sync_buckets = || Histogram::new(exponential_buckets(0.001, 2.0, 15));
        let m = Metrics {
            sync_duration: sync_buckets(),
            sync_full_duration: sync_buckets(),
            sync_partial_duration: sync_buckets(),
            last_sync_timestamp: Default::default(),
            last_queued_timestamp: Default::default(),
            network_programming_duration: Histogram::new(network_programming_buckets()),
            endpoint_changes_pending: Default::default(),
            endpoint_changes_total: Default::default(),
            service_changes_pending: Default::default(),
            service_changes_total: Default::default(),
            no_local_endpoints: Default::default(),
            healthz_total: Default::default(),
            livez_total: Default::default(),
            nftables_sync_failures: Default::default(),
            nftables_cleanup_failures: Default::default(),
            nftables_restores: Default::default(),
            conntrack_deleted: Default::default(),
            conntrack_duration: Histogram::new(exponential_buckets(0.001, 2.0, 15)),
            registry: Registry::default(),
            start: SystemTime::now(),
        };
        r.register(
            "sync_proxy_rules_duration_seconds",
            "SyncProxyRules latency in seconds",
            m.sync_duration.clone(),
        );
        r.register(
            "sync_full_proxy_rules_duration_seconds",
            "SyncProxyRules latency in seconds for full resyncs",
            m.sync_full_duration.clone(),
        );
        r.register(
            "sync_partial_proxy_rules_duration_seconds",
            "SyncProxyRules latency in seconds for partial resyncs",
            m.sync_partial_duration.clone(),
        );
        r.register(
            "sync_proxy_rules_last_timestamp_seconds",
            "The last time proxy rules were successfully synced",
            m.last_sync_timestamp.clone(),
        );
        r.register(
            "sync_proxy_rules_last_queued_timestamp_seconds",
            "The last time a sync of proxy rules was queued",
            m.last_queued_timestamp.clone(),
        );
        r.register(
            "network_programming_duration_seconds",
            "In Cluster Network Programming Latency in seconds",
            m.network_programming_duration.clone(),
        );
        r.register(
            "sync_proxy_rules_endpoint_changes_pending",
            "Pending proxy rules Endpoint changes",
            m.endpoint_changes_pending.clone(),
        );
        r.register(
            "sync_proxy_rules_endpoint_changes",
            "Cumulative proxy rules Endpoint changes",
            m.endpoint_changes_total.clone(),
        );
        r.register(
            "sync_proxy_rules_service_changes_pending",
            "Pending proxy rules Service changes",
            m.service_changes_pending.clone(),
        );
        r.register(
            "sync_proxy_rules_service_changes",
            "Cumulative proxy rules Service changes",
            m.service_changes_total.clone(),
        );
        r.register(
            "sync_proxy_rules_no_local_endpoints_total",
            "Number of services with a Local traffic policy and no endpoints",
            m.no_local_endpoints.clone(),
        );
        r.register(
            "proxy_healthz",
            "Cumulative proxy healthz HTTP status",
            m.healthz_total.clone(),
        );
        r.register(
            "proxy_livez",
            "Cumulative proxy livez HTTP status",
            m.livez_total.clone(),
        );
        r.register(
            "sync_proxy_rules_nftables_sync_failures",
            "Cumulative proxy nftables sync failures",
            m.nftables_sync_failures.clone(),
        );
        r.register(
            "sync_proxy_rules_nftables_cleanup_failures",
            "Cumulative proxy nftables cleanup failures",
            m.nftables_cleanup_failures.clone(),
        );
        r.register(
            "sync_proxy_rules_nftables_restores",
            "Full syncs forced because another program changed our nftables table (in IPVS mode also kube-ipvs0, its addresses or our virtual servers)",
            m.nftables_restores.clone(),
        );
        r.register(
            "api_objects_skipped",
            "Services, EndpointSlices and Nodes from the API server that could not be decoded and were skipped (kube-nlproxy's own metric)",
            crate::source::kube::UNDECODABLE_OBJECTS.clone(),
        );
        r.register(
            "conntrack_reconciler_deleted_entries",
            "Cumulative conntrack flows deleted by conntrack reconciler",
            m.conntrack_deleted.clone(),
        );
        r.register(
            "conntrack_reconciler_sync_duration_seconds",
            "ReconcileConntrackFlowsLatency latency in seconds",
            m.conntrack_duration.clone(),
        );
        Metrics { registry: r, ..m }
    }

    /// Records a sync that took `d`.
    pub fn observe_sync(&self, full: bool, d: Duration, ok: bool) {
        let s = d.as_secs_f64();
        self.sync_duration.observe(s);
        if full {
            self.sync_full_duration.observe(s);
        } else {
            self.sync_partial_duration.observe(s);
        }
        if ok {
            self.last_sync_timestamp.set(unix_secs(SystemTime::now()));
        } else {
            self.nftables_sync_failures.inc();
        }
    }

    /// The exposition text (Prometheus text format 0.0.4), process metrics included.
    pub fn render(&self) -> String {
        let mut s = String::new();
        if encode(&mut s, &self.registry).is_err() {
            s.clear();
        }
        let mut s = to_prometheus_text(&s);
        write_process_metrics(&mut s, self.start);
        s
    }
}

/// Converts prometheus-client's OpenMetrics output to the Prometheus text format 0.0.4 that
/// kube-proxy serves: counter families are named with their `_total` suffix, and the
/// OpenMetrics-only `# UNIT` and `# EOF` lines go.
fn to_prometheus_text(om: &str) -> String {
    let counters: std::collections::HashSet<&str> = om
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .filter_map(|l| l.strip_suffix(" counter"))
        .collect();
    let mut out = String::with_capacity(om.len());
    for line in om.lines() {
        if line == "# EOF" || line.starts_with("# UNIT ") {
            continue;
        }
        let renamed = ["# HELP ", "# TYPE "].iter().find_map(|p| {
            let rest = line.strip_prefix(p)?;
            let (name, tail) = rest.split_once(' ')?;
            counters
                .contains(name)
                .then(|| format!("{p}{name}_total {tail}"))
        });
        out.push_str(renamed.as_deref().unwrap_or(line));
        out.push('\n');
    }
    out
}

/// Seconds since the epoch.
pub fn unix_secs(t: SystemTime) -> f64 {
    t.duration_since(UNIX_EPOCH)
        .unwrap_or_default()
        .as_secs_f64()
}

fn write_process_metrics(s: &mut String, start: SystemTime) {
    let page = 4096.0;
    let ticks = 100.0; // USER_HZ on Linux
    if let Ok(stat) = std::fs::read_to_string("/proc/self/stat") {
        // Fields after the command name (which may contain spaces) start after ") ".
        if let Some(rest) = stat.rsplit_once(") ").map(|(_, r)| r) {
            let f: Vec<&str> = rest.split_whitespace().collect();
            let num = |i: usize| f.get(i).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
            let cpu = (num(11) + num(12)) / ticks;
            let _ = writeln!(s, "# HELP process_cpu_seconds_total Total user and system CPU time spent in seconds.\n# TYPE process_cpu_seconds_total counter\nprocess_cpu_seconds_total {cpu}");
            let _ = writeln!(s, "# HELP process_virtual_memory_bytes Virtual memory size in bytes.\n# TYPE process_virtual_memory_bytes gauge\nprocess_virtual_memory_bytes {}", num(20));
            let _ = writeln!(s, "# HELP process_resident_memory_bytes Resident memory size in bytes.\n# TYPE process_resident_memory_bytes gauge\nprocess_resident_memory_bytes {}", num(21) * page);
        }
    }
    if let Ok(d) = std::fs::read_dir("/proc/self/fd") {
        let _ = writeln!(s, "# HELP process_open_fds Number of open file descriptors.\n# TYPE process_open_fds gauge\nprocess_open_fds {}", d.count());
    }
    let _ = writeln!(s, "# HELP process_start_time_seconds Start time of the process since unix epoch in seconds.\n# TYPE process_start_time_seconds gauge\nprocess_start_time_seconds {}", unix_secs(start));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exports_upstream_names() {
        let m = Metrics::new();
        m.observe_sync(true, Duration::from_millis(3), true);
        m.conntrack_deleted.inc_by(2);
        let text = m.render();
        for name in [
            "kubeproxy_sync_proxy_rules_duration_seconds_bucket{le=\"0.004\"} 1",
            "kubeproxy_sync_full_proxy_rules_duration_seconds_count 1",
            "kubeproxy_sync_partial_proxy_rules_duration_seconds_count 0",
            "kubeproxy_sync_proxy_rules_endpoint_changes_total 0",
            "kubeproxy_conntrack_reconciler_deleted_entries_total 2",
            "# TYPE kubeproxy_sync_proxy_rules_last_timestamp_seconds gauge",
            "kubeproxy_network_programming_duration_seconds_bucket{le=\"0.25\"} 0",
            "process_resident_memory_bytes ",
        ] {
            assert!(text.contains(name), "missing {name:?} in\n{text}");
        }
        assert!(!text.contains("# EOF"));
        assert!(
            text.contains("# TYPE kubeproxy_conntrack_reconciler_deleted_entries_total counter")
        );
        // Every sample belongs to the family declared before it.
        let mut family = String::new();
        for l in text.lines() {
            if let Some(rest) = l.strip_prefix("# TYPE ") {
                family = rest.split(' ').next().unwrap().to_string();
            } else if !l.starts_with('#') {
                let name = l.split(['{', ' ']).next().unwrap();
                assert!(
                    name == family
                        || name
                            .strip_prefix(family.as_str())
                            .is_some_and(|s| ["_bucket", "_sum", "_count"].contains(&s)),
                    "{name} outside family {family}"
                );
            }
        }
    }
}
