//! Prometheus metrics under upstream kube-proxy's names, types and buckets
//! (`pkg/proxy/metrics`), plus process metrics read from /proc/self. Counters that live in
//! the kernel are read through a [`CounterReader`] the daemon wires in, at every scrape.

use std::fmt::Write;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use prometheus_client::collector::Collector;
use prometheus_client::encoding::text::encode;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
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

/// `traffic_policy` and `ip_family` labels of the no-local-endpoints gauge.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PolicyLabel {
    pub traffic_policy: String,
    pub ip_family: String,
}

/// `ip_family` label (`IPv4`, `IPv6`), which upstream puts on every per-proxier metric
/// since 1.33 (one proxier per family; here one sync covers both, so both are recorded).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct FamilyLabel {
    pub ip_family: String,
}

impl FamilyLabel {
    pub fn of(f: crate::model::net::Family) -> FamilyLabel {
        FamilyLabel {
            ip_family: match f {
                crate::model::net::Family::Ip => "IPv4",
                crate::model::net::Family::Ip6 => "IPv6",
            }
            .into(),
        }
    }
    /// The labels of `families`.
    pub fn of_each(
        families: &[crate::model::net::Family],
    ) -> impl Iterator<Item = FamilyLabel> + '_ {
        families.iter().map(|f| FamilyLabel::of(*f))
    }
}

/// `kubernetes_build_info`'s labels.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct BuildInfoLabel {
    pub major: String,
    pub minor: String,
    pub git_version: String,
    pub git_commit: String,
    pub git_tree_state: String,
    pub build_date: String,
    pub go_version: String,
    pub compiler: String,
    pub platform: String,
}

/// `kubernetes_feature_enabled`'s labels.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct FeatureLabel {
    pub name: String,
    /// `ALPHA`, `BETA`, `DEPRECATED` or empty for GA (component-base's prerelease strings).
    pub stage: String,
}

type Hist = MetricFamily<FamilyLabel, Histogram, fn() -> Histogram>;
type FloatGauge = Gauge<f64, std::sync::atomic::AtomicU64>;

fn sync_histogram() -> Histogram {
    Histogram::new(exponential_buckets(0.001, 2.0, 15))
}

fn programming_histogram() -> Histogram {
    Histogram::new(network_programming_buckets())
}

/// Every metric the daemon exports.
pub struct Metrics {
    registry: Registry,
    pub sync_duration: Hist,
    pub sync_full_duration: Hist,
    pub sync_partial_duration: Hist,
    pub last_sync_timestamp: MetricFamily<FamilyLabel, FloatGauge>,
    pub last_queued_timestamp: MetricFamily<FamilyLabel, FloatGauge>,
    pub network_programming_duration: Hist,
    pub endpoint_changes_pending: Gauge,
    pub endpoint_changes_total: Counter,
    pub service_changes_pending: Gauge,
    pub service_changes_total: Counter,
    pub no_local_endpoints: MetricFamily<PolicyLabel, Gauge>,
    pub healthz_total: MetricFamily<CodeLabel, Counter>,
    pub livez_total: MetricFamily<CodeLabel, Counter>,
    pub nftables_sync_failures: MetricFamily<FamilyLabel, Counter>,
    pub nftables_cleanup_failures: MetricFamily<FamilyLabel, Counter>,
    pub nftables_restores: Counter,
    /// Ours (not upstream's): the last sync's duration and result (1 ok, 0 failed), for
    /// `kube-nlproxy status`.
    pub last_sync_duration: FloatGauge,
    pub last_sync_ok: Gauge,
    pub conntrack_deleted: MetricFamily<FamilyLabel, Counter>,
    pub conntrack_duration: Hist,
    pub build_info: MetricFamily<BuildInfoLabel, Gauge>,
    /// component-base's feature enablement gauge, 1 or 0 per known gate.
    pub feature_enabled: MetricFamily<FeatureLabel, Gauge>,
    start: SystemTime,
}

/// Reads a counter that lives in the kernel, at scrape time; `None` when it cannot be read
/// (the sample is then left out, as upstream's collectors leave it out on an error).
pub type CounterReader = Box<dyn FnMut() -> Option<u64> + Send>;

/// One sample of a labelled counter read at scrape time: its labels and value.
pub type LabelledCount = (Vec<(&'static str, String)>, u64);

/// Reads the samples of a labelled counter family that lives in the kernel, at scrape time
/// (those that cannot be read are left out).
pub type LabelledCounterReader = Box<dyn FnMut() -> Vec<LabelledCount> + Send>;

/// A counter family whose samples come from a reader at each scrape.
struct ScrapedCounter {
    name: &'static str,
    help: &'static str,
    read: std::sync::Mutex<LabelledCounterReader>,
}

impl std::fmt::Debug for ScrapedCounter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ScrapedCounter")
            .field("name", &self.name)
            .finish()
    }
}

impl Collector for ScrapedCounter {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        // A poisoned lock means an earlier read panicked: leave the samples out.
        let samples = self.read.lock().map(|mut read| read()).unwrap_or_default();
        if samples.is_empty() {
            return Ok(());
        }
        let mut m = encoder.encode_descriptor(
            self.name,
            self.help,
            None,
            prometheus_client::metrics::MetricType::Counter,
        )?;
        for (labels, v) in samples {
            let c: ConstCounter<u64> = ConstCounter::new(v);
            if labels.is_empty() {
                // An unlabelled counter has this one sample.
                return c.encode(m);
            }
            c.encode(m.encode_family(&labels)?)?;
        }
        Ok(())
    }
}

/// Upstream's name (without the `_total` the exposition adds) and help of the iptables
/// mode's INVALID-drop counter (`pkg/proxy/metrics`, `iptablesCTStateInvalidDroppedPacketsDescription`).
pub const CT_STATE_INVALID_DROPPED: (&str, &str) = (
    "kubeproxy_iptables_ct_state_invalid_dropped_packets",
    "packets dropped by iptables to work around conntrack problems",
);

/// Upstream's name (without `_total`) and help of the iptables mode's localhost NodePort
/// counter (`localhostNodePortsAcceptedPacketsDescription`).
pub const LOCALHOST_NODEPORTS_ACCEPTED: (&str, &str) = (
    "kubeproxy_iptables_localhost_nodeports_accepted_packets",
    "Number of packets accepted on nodeports of loopback interface",
);

/// Upstream's name (without `_total`) and help of the nftables mode's count of rejected
/// loopback NodePort packets (`localhostNodePortRejectedPacketsDescription`), labelled
/// `ip_family` and `protocol`.
pub const LOCALHOST_NODEPORT_REJECTED: (&str, &str) = (
    "kubeproxy_nftables_localhost_nodeport_rejected_packets",
    "Number of packets rejected on localhost NodePorts. UDP and SCTP are always rejected; TCP is rejected when the localhost NodePort proxy is not running",
);

/// The nftables mode's loopback NodePort listener metrics (upstream registers them only with
/// the gate `KubeProxyNFTablesLocalhostNodePorts` on).
#[derive(Debug, Default, Clone)]
pub struct LocalhostNodePortMetrics {
    /// `kubeproxy_nftables_localhost_nodeport_listeners`.
    pub listeners: MetricFamily<FamilyLabel, Gauge>,
    /// `kubeproxy_nftables_localhost_nodeport_listener_creation_failures_total`.
    pub creation_failures: MetricFamily<FamilyLabel, Counter>,
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
        let mut root = Registry::default();
        let hist = || Hist::new_with_constructor(sync_histogram as fn() -> Histogram);
        let m = Metrics {
            sync_duration: hist(),
            sync_full_duration: hist(),
            sync_partial_duration: hist(),
            last_sync_timestamp: Default::default(),
            last_queued_timestamp: Default::default(),
            network_programming_duration: Hist::new_with_constructor(
                programming_histogram as fn() -> Histogram,
            ),
            endpoint_changes_pending: Default::default(),
            endpoint_changes_total: Default::default(),
            service_changes_pending: Default::default(),
            service_changes_total: Default::default(),
            no_local_endpoints: Default::default(),
            healthz_total: Default::default(),
            livez_total: Default::default(),
            nftables_sync_failures: Default::default(),
            last_sync_duration: Default::default(),
            last_sync_ok: Default::default(),
            nftables_cleanup_failures: Default::default(),
            nftables_restores: Default::default(),
            conntrack_deleted: Default::default(),
            conntrack_duration: hist(),
            build_info: Default::default(),
            feature_enabled: Default::default(),
            registry: Registry::default(),
            start: SystemTime::now(),
        };
        m.build_info
            .get_or_create(&BuildInfoLabel {
                major: "1".into(),
                minor: "37".into(),
                git_version: format!("kube-nlproxy-{}", env!("CARGO_PKG_VERSION")),
                git_commit: env!("KUBE_NLPROXY_GIT_COMMIT").into(),
                git_tree_state: String::new(),
                build_date: String::new(),
                go_version: String::new(),
                compiler: "rustc".into(),
                platform: format!("{}/{}", std::env::consts::OS, goarch()),
            })
            .set(1);
        root.register(
            "kubernetes_build_info",
            "A metric with a constant '1' value labeled by major, minor, git version, git commit, git tree state, build date, Go version, and compiler from which Kubernetes was built, and platform on which it is running.",
            m.build_info.clone(),
        );
        root.register(
            "kubernetes_feature_enabled",
            "[BETA] This metric records the data about the stage and enablement of a k8s feature.",
            m.feature_enabled.clone(),
        );
        root.register(
            "rest_client_requests",
            "Number of HTTP requests, partitioned by status code, method, and host.",
            crate::source::rest_client::REQUESTS.clone(),
        );
        root.register(
            "rest_client_request_duration_seconds",
            "Request latency in seconds. Broken down by verb, and host.",
            crate::source::rest_client::DURATION.clone(),
        );
        let own = root.sub_registry_with_prefix("kube_nlproxy");
        own.register(
            "sync_last_duration_seconds",
            "How long the last sync of proxy rules took, whether it succeeded or not",
            m.last_sync_duration.clone(),
        );
        own.register(
            "sync_last_result",
            "Whether the last sync of proxy rules succeeded (1) or failed (0)",
            m.last_sync_ok.clone(),
        );
        // Upstream's metrics go under kubeproxy_; the build info stays unprefixed.
        let r = root.sub_registry_with_prefix("kubeproxy");
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
        Metrics {
            registry: root,
            ..m
        }
    }

    /// Records every gate's (name, stage, enabled), as upstream's `AddMetrics` does at start.
    pub fn record_features(&self, gates: &[(&str, &str, bool)]) {
        for (name, stage, on) in gates {
            self.feature_enabled
                .get_or_create(&FeatureLabel {
                    name: (*name).into(),
                    stage: (*stage).into(),
                })
                .set(i64::from(*on));
        }
    }

    /// Registers a counter read with `read` at each scrape (a failed read leaves it out of
    /// that scrape): `metric` is one of [`CT_STATE_INVALID_DROPPED`] and
    /// [`LOCALHOST_NODEPORTS_ACCEPTED`], which upstream registers in iptables mode only.
    pub fn register_scraped_counter(
        &mut self,
        metric: (&'static str, &'static str),
        mut read: CounterReader,
    ) {
        self.register_scraped_counters(
            metric,
            Box::new(move || read().map(|v| vec![(Vec::new(), v)]).unwrap_or_default()),
        );
    }

    /// Registers a labelled counter family whose samples `read` gives at each scrape
    /// ([`LOCALHOST_NODEPORT_REJECTED`]).
    pub fn register_scraped_counters(
        &mut self,
        metric: (&'static str, &'static str),
        read: LabelledCounterReader,
    ) {
        let (name, help) = metric;
        self.registry.register_collector(Box::new(ScrapedCounter {
            name,
            help,
            read: std::sync::Mutex::new(read),
        }));
    }

    /// Registers the nftables mode's loopback NodePort listener metrics and returns them
    /// for the forwarder to update.
    pub fn register_localhost_nodeports(&mut self) -> LocalhostNodePortMetrics {
        let m = LocalhostNodePortMetrics::default();
        let r = &mut self.registry;
        r.register(
            "kubeproxy_nftables_localhost_nodeport_listeners",
            "Number of active localhost NodePort userspace proxy listeners.",
            m.listeners.clone(),
        );
        r.register(
            "kubeproxy_nftables_localhost_nodeport_listener_creation_failures",
            "Number of localhost NodePort userspace proxy listener creation failures.",
            m.creation_failures.clone(),
        );
        m
    }

    /// Records a sync that took `d`, for each of `families` (one sync programs them all).
    pub fn observe_sync(
        &self,
        families: &[crate::model::net::Family],
        full: bool,
        d: Duration,
        ok: bool,
    ) {
        let s = d.as_secs_f64();
        self.last_sync_duration.set(s);
        self.last_sync_ok.set(i64::from(ok));
        for f in FamilyLabel::of_each(families) {
            self.sync_duration.get_or_create(&f).observe(s);
            if full {
                self.sync_full_duration.get_or_create(&f).observe(s);
            } else {
                self.sync_partial_duration.get_or_create(&f).observe(s);
            }
            if ok {
                self.last_sync_timestamp
                    .get_or_create(&f)
                    .set(unix_secs(SystemTime::now()));
            } else {
                self.nftables_sync_failures.get_or_create(&f).inc();
            }
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

/// GOARCH spelling of the architecture, as `platform` carries it upstream.
fn goarch() -> &'static str {
    match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        "x86" => "386",
        "powerpc64" => "ppc64le",
        other => other,
    }
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

    /// prometheus-client 0.24 leaves out a labelled family that has no series yet, as Go's
    /// client does (a fresh upstream kube-proxy lists no `kubeproxy_sync_proxy_rules_duration_seconds`
    /// before its first sync); 0.23 wrote its HELP and TYPE lines alone.
    #[test]
    fn a_family_without_series_is_not_written() {
        let m = Metrics::new();
        let name = "kubeproxy_sync_proxy_rules_duration_seconds";
        assert!(!m.render().contains(name), "{}", m.render());
        m.observe_sync(
            &[crate::model::net::Family::Ip],
            true,
            Duration::from_millis(3),
            true,
        );
        let text = m.render();
        assert!(text.contains(&format!("# HELP {name} ")), "{text}");
        assert!(!text.contains("ip_family=\"IPv6\""), "{text}");
    }

    #[test]
    fn exports_upstream_names() {
        let m = Metrics::new();
        m.observe_sync(
            &crate::model::net::Family::all(),
            true,
            Duration::from_millis(3),
            true,
        );
        m.conntrack_deleted
            .get_or_create(&FamilyLabel::of(crate::model::net::Family::Ip))
            .inc_by(2);
        let text = m.render();
        for name in [
            "kubeproxy_sync_proxy_rules_duration_seconds_bucket{le=\"0.004\",ip_family=\"IPv4\"} 1",
            "kubeproxy_sync_proxy_rules_duration_seconds_bucket{le=\"0.004\",ip_family=\"IPv6\"} 1",
            "kubeproxy_sync_full_proxy_rules_duration_seconds_count{ip_family=\"IPv4\"} 1",
            "kubeproxy_sync_proxy_rules_endpoint_changes_total 0",
            "kubeproxy_conntrack_reconciler_deleted_entries_total{ip_family=\"IPv4\"} 2",
            "# TYPE kubeproxy_sync_proxy_rules_last_timestamp_seconds gauge",
            "kubeproxy_sync_proxy_rules_last_timestamp_seconds{ip_family=\"IPv6\"} ",
            "kubernetes_build_info{major=\"1\",minor=\"37\",git_version=\"kube-nlproxy-",
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

    #[test]
    fn scraped_counters_are_read_at_each_scrape_and_absent_unless_registered() {
        for (metric, help) in [
            (
                CT_STATE_INVALID_DROPPED,
                "packets dropped by iptables to work around conntrack problems",
            ),
            (
                LOCALHOST_NODEPORTS_ACCEPTED,
                "Number of packets accepted on nodeports of loopback interface",
            ),
        ] {
            let name = format!("{}_total", metric.0);
            assert!(!Metrics::new().render().contains(&name));
            let mut m = Metrics::new();
            let mut reads = [Some(3), None, Some(5)].into_iter();
            m.register_scraped_counter(metric, Box::new(move || reads.next().flatten()));
            let text = m.render();
            assert!(
                text.contains(&format!(
                    "# HELP {name} {help}\n# TYPE {name} counter\n{name} 3\n"
                )),
                "{text}"
            );
            assert!(!m.render().contains(&name), "a failed read leaves it out");
            assert!(m.render().contains(&format!("{name} 5\n")));
        }
    }

    /// Upstream's definitions (pkg/proxy/metrics/metrics.go, v1.37.2) of the metrics this
    /// daemon has: name, type and label names; and the buckets of the histograms.
    #[test]
    fn names_types_labels_and_buckets_match_upstream() {
        const UPSTREAM: &[(&str, &str, &[&str])] = &[
            (
                "kubeproxy_sync_proxy_rules_duration_seconds",
                "histogram",
                &["ip_family"],
            ),
            (
                "kubeproxy_sync_full_proxy_rules_duration_seconds",
                "histogram",
                &["ip_family"],
            ),
            (
                "kubeproxy_sync_partial_proxy_rules_duration_seconds",
                "histogram",
                &["ip_family"],
            ),
            (
                "kubeproxy_sync_proxy_rules_last_timestamp_seconds",
                "gauge",
                &["ip_family"],
            ),
            (
                "kubeproxy_network_programming_duration_seconds",
                "histogram",
                &["ip_family"],
            ),
            (
                "kubeproxy_sync_proxy_rules_endpoint_changes_pending",
                "gauge",
                &[],
            ),
            (
                "kubeproxy_sync_proxy_rules_endpoint_changes_total",
                "counter",
                &[],
            ),
            (
                "kubeproxy_sync_proxy_rules_service_changes_pending",
                "gauge",
                &[],
            ),
            (
                "kubeproxy_sync_proxy_rules_service_changes_total",
                "counter",
                &[],
            ),
            (
                "kubeproxy_sync_proxy_rules_nftables_sync_failures_total",
                "counter",
                &["ip_family"],
            ),
            (
                "kubeproxy_sync_proxy_rules_nftables_cleanup_failures_total",
                "counter",
                &["ip_family"],
            ),
            ("kubeproxy_proxy_healthz_total", "counter", &["code"]),
            ("kubeproxy_proxy_livez_total", "counter", &["code"]),
            (
                "kubeproxy_sync_proxy_rules_last_queued_timestamp_seconds",
                "gauge",
                &["ip_family"],
            ),
            (
                "kubeproxy_sync_proxy_rules_no_local_endpoints_total",
                "gauge",
                &["traffic_policy", "ip_family"],
            ),
            (
                "kubeproxy_conntrack_reconciler_sync_duration_seconds",
                "histogram",
                &["ip_family"],
            ),
            (
                "kubeproxy_conntrack_reconciler_deleted_entries_total",
                "counter",
                &["ip_family"],
            ),
            (
                "kubernetes_build_info",
                "gauge",
                &[
                    "major",
                    "minor",
                    "git_version",
                    "git_commit",
                    "git_tree_state",
                    "build_date",
                    "go_version",
                    "compiler",
                    "platform",
                ],
            ),
        ];
        let m = Metrics::new();
        // Touch every family so that each has a sample to read its labels from.
        m.observe_sync(
            &crate::model::net::Family::all(),
            true,
            Duration::from_millis(1),
            true,
        );
        m.observe_sync(
            &crate::model::net::Family::all(),
            false,
            Duration::from_millis(1),
            false,
        );
        let v4 = FamilyLabel::of(crate::model::net::Family::Ip);
        m.network_programming_duration
            .get_or_create(&v4)
            .observe(1.0);
        m.nftables_cleanup_failures.get_or_create(&v4).inc();
        m.last_queued_timestamp.get_or_create(&v4).set(1.0);
        m.conntrack_duration.get_or_create(&v4).observe(0.1);
        m.conntrack_deleted.get_or_create(&v4).inc();
        m.healthz_total
            .get_or_create(&CodeLabel { code: "200".into() })
            .inc();
        m.livez_total
            .get_or_create(&CodeLabel { code: "200".into() })
            .inc();
        m.no_local_endpoints
            .get_or_create(&PolicyLabel {
                traffic_policy: "internal".into(),
                ip_family: "IPv4".into(),
            })
            .set(0);
        crate::source::rest_client::record("GET", "api:6443", Some(200), 0.2);
        let text = m.render();
        for (name, ty, labels) in UPSTREAM {
            assert!(
                text.contains(&format!("# TYPE {name} {ty}\n")),
                "{name} {ty}\n{text}"
            );
            let sample = text
                .lines()
                .find(|l| {
                    l.starts_with(name) && l[name.len()..].starts_with(['{', ' '])
                        || l.starts_with(&format!("{name}_count"))
                })
                .unwrap_or_else(|| panic!("no sample of {name}"));
            let got: Vec<&str> = sample
                .split_once('{')
                .map(|(_, rest)| rest.split_once('}').unwrap().0)
                .unwrap_or("")
                .split(',')
                .filter(|kv| !kv.is_empty())
                .map(|kv| kv.split('=').next().unwrap())
                .collect();
            assert_eq!(&got, labels, "{name}: {sample}");
        }
        // ExponentialBuckets(0.001, 2, 15) and the network programming merge.
        let buckets = |name: &str| -> Vec<String> {
            text.lines()
                .filter(|l| l.starts_with(&format!("{name}_bucket{{")) && l.contains("IPv4"))
                .map(|l| {
                    l.split("le=\"")
                        .nth(1)
                        .unwrap()
                        .split('"')
                        .next()
                        .unwrap()
                        .to_string()
                })
                .collect()
        };
        let sync = buckets("kubeproxy_sync_proxy_rules_duration_seconds");
        assert_eq!(sync.len(), 16, "{sync:?}");
        assert_eq!(sync[0], "0.001");
        assert_eq!(sync[14], "16.384");
        assert_eq!(sync[15], "+Inf");
        let np = buckets("kubeproxy_network_programming_duration_seconds");
        assert_eq!(np.len(), 2 + 59 + 12 + 7 + 1, "{np:?}");
        assert_eq!(&np[..3], ["0.25", "0.5", "1.0"]);
        assert_eq!(np[np.len() - 2], "300.0");
    }
}
