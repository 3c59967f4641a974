//! `kubeproxy.config.k8s.io/v1alpha1` `KubeProxyConfiguration`, field for field as upstream
//! defines it (`k8s.io/kube-proxy/config/v1alpha1/types.go`, v0.37), with upstream's
//! `SetDefaults_KubeProxyConfiguration` and the YAML shape `--write-config-to` writes.
//! Decoding is in [`super::decode`]. Pure.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::duration;

/// The one group/version read and written.
pub const API_VERSION: &str = "kubeproxy.config.k8s.io/v1alpha1";
pub const KIND: &str = "KubeProxyConfiguration";

/// A Go `time.Duration` in nanoseconds, written as Go's `metav1.Duration` is: a string
/// (`15m0s`), read with `time.ParseDuration`. A number is an error there too.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord)]
pub struct GoDuration(pub i64);

impl GoDuration {
    pub const fn secs(s: i64) -> Self {
        GoDuration(s * 1_000_000_000)
    }
    pub fn is_zero(self) -> bool {
        self.0 == 0
    }
    /// As a std Duration; negative values (rejected by validation) become zero.
    pub fn std(self) -> std::time::Duration {
        std::time::Duration::from_nanos(u64::try_from(self.0).unwrap_or(0))
    }
}

impl std::fmt::Display for GoDuration {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&duration::format(self.0))
    }
}

impl Serialize for GoDuration {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&duration::format(self.0))
    }
}

impl<'de> Deserialize<'de> for GoDuration {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        duration::parse(&s)
            .map(GoDuration)
            .map_err(serde::de::Error::custom)
    }
}

/// `logging.flushFrequency`: component-base's `TimeOrMetaDuration`, a duration string or
/// a number of nanoseconds; written back in the form it was read.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TimeOrMetaDuration {
    pub duration: GoDuration,
    pub as_string: bool,
}

impl Serialize for TimeOrMetaDuration {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        if self.as_string {
            self.duration.serialize(s)
        } else {
            s.serialize_i64(self.duration.0)
        }
    }
}

impl<'de> Deserialize<'de> for TimeOrMetaDuration {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Either {
            Nanos(i64),
            Text(String),
        }
        match Either::deserialize(d)? {
            Either::Nanos(n) => Ok(TimeOrMetaDuration {
                duration: GoDuration(n),
                as_string: false,
            }),
            Either::Text(s) => duration::parse(&s)
                .map(|n| TimeOrMetaDuration {
                    duration: GoDuration(n),
                    as_string: true,
                })
                .map_err(serde::de::Error::custom),
        }
    }
}

/// A `resource.Quantity` (`infoBufferSize`), kept as written: a string or a number.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
#[serde(transparent)]
pub struct Quantity(pub String);

impl<'de> Deserialize<'de> for Quantity {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Either {
            Int(i64),
            Float(f64),
            Text(String),
        }
        Ok(Quantity(match Either::deserialize(d)? {
            Either::Int(n) => n.to_string(),
            Either::Float(f) => f.to_string(),
            Either::Text(s) => s,
        }))
    }
}

fn is_false(b: &bool) -> bool {
    !*b
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct ClientConnection {
    pub accept_content_types: String,
    pub burst: i32,
    pub content_type: String,
    pub kubeconfig: String,
    pub qps: f32,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct OutputRouting {
    #[serde(skip_serializing_if = "is_false")]
    pub split_stream: bool,
    #[serde(skip_serializing_if = "quantity_is_empty")]
    pub info_buffer_size: Quantity,
}

fn quantity_is_empty(q: &Quantity) -> bool {
    q.0.is_empty()
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct FormatOptions {
    pub json: OutputRouting,
    pub text: OutputRouting,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct VModuleItem {
    pub file_pattern: String,
    pub verbosity: u32,
}

/// component-base's `LoggingConfiguration` (logs/api/v1).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct Logging {
    #[serde(skip_serializing_if = "String::is_empty")]
    pub format: String,
    pub flush_frequency: TimeOrMetaDuration,
    pub verbosity: u32,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub vmodule: Vec<VModuleItem>,
    pub options: FormatOptions,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct IpTables {
    pub localhost_node_ports: Option<bool>,
    pub masquerade_all: bool,
    pub masquerade_bit: Option<i32>,
    pub min_sync_period: GoDuration,
    pub sync_period: GoDuration,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct Ipvs {
    #[serde(rename = "excludeCIDRs")]
    pub exclude_cidrs: Option<Vec<String>>,
    pub min_sync_period: GoDuration,
    pub scheduler: String,
    #[serde(rename = "strictARP")]
    pub strict_arp: bool,
    pub sync_period: GoDuration,
    pub tcp_fin_timeout: GoDuration,
    pub tcp_timeout: GoDuration,
    pub udp_timeout: GoDuration,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct NfTables {
    pub masquerade_all: bool,
    pub masquerade_bit: Option<i32>,
    pub min_sync_period: GoDuration,
    pub sync_period: GoDuration,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct Conntrack {
    pub max_per_core: Option<i32>,
    pub min: Option<i32>,
    pub tcp_be_liberal: bool,
    pub tcp_close_wait_timeout: Option<GoDuration>,
    pub tcp_established_timeout: Option<GoDuration>,
    pub udp_stream_timeout: GoDuration,
    pub udp_timeout: GoDuration,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct Winkernel {
    #[serde(rename = "enableDSR")]
    pub enable_dsr: bool,
    pub forward_health_check_vip: bool,
    pub network_name: String,
    pub root_hns_endpoint_name: String,
    pub source_vip: String,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct DetectLocal {
    pub bridge_interface: String,
    pub interface_name_prefix: String,
}

/// The whole file. Field order is irrelevant: the writer sorts keys as upstream's does.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct KubeProxyConfiguration {
    pub api_version: String,
    pub kind: String,
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub feature_gates: BTreeMap<String, bool>,
    pub client_connection: ClientConnection,
    pub logging: Logging,
    pub hostname_override: String,
    pub bind_address: String,
    pub healthz_bind_address: String,
    pub metrics_bind_address: String,
    pub bind_address_hard_fail: bool,
    pub enable_profiling: bool,
    pub show_hidden_metrics_for_version: String,
    pub mode: String,
    pub iptables: IpTables,
    pub ipvs: Ipvs,
    pub nftables: NfTables,
    pub winkernel: Winkernel,
    pub detect_local_mode: String,
    pub detect_local: DetectLocal,
    #[serde(rename = "clusterCIDR")]
    pub cluster_cidr: String,
    pub node_port_addresses: Option<Vec<String>>,
    pub oom_score_adj: Option<i32>,
    pub conntrack: Conntrack,
    pub config_sync_period: GoDuration,
    pub port_range: String,
    #[serde(skip_serializing_if = "is_false")]
    pub windows_run_as_service: bool,
}

/// kube-proxy's ports (`pkg/cluster/ports`).
pub const PROXY_HEALTHZ_PORT: u16 = 10256;
pub const PROXY_STATUS_PORT: u16 = 10249;
/// `qos.KubeProxyOOMScoreAdj`.
pub const KUBE_PROXY_OOM_SCORE_ADJ: i32 = -999;

/// Appends `port` to a bare IP (`proxyutil.AppendPortIfNeeded`); an address that already
/// has a port, or is not an IP, is returned unchanged (validation reports the latter).
pub fn append_port_if_needed(addr: &str, port: u16) -> String {
    if split_host_port(addr).is_some() {
        return addr.to_string();
    }
    match parse_ip_sloppy(addr) {
        Some(std::net::IpAddr::V6(_)) => format!("[{addr}]:{port}"),
        Some(std::net::IpAddr::V4(_)) => format!("{addr}:{port}"),
        None => addr.to_string(),
    }
}

/// Go's `net.SplitHostPort` for the forms used here: `host:port` and `[v6]:port`.
pub fn split_host_port(s: &str) -> Option<(&str, &str)> {
    if let Some(rest) = s.strip_prefix('[') {
        let (host, tail) = rest.split_once(']')?;
        let port = tail.strip_prefix(':')?;
        if port.contains(':') {
            return None;
        }
        return Some((host, port));
    }
    let (host, port) = s.rsplit_once(':')?;
    if host.contains(':') {
        return None; // "too many colons": a bare IPv6 address
    }
    Some((host, port))
}

/// `netutils.ParseIPSloppy`: an IP, allowing leading zeros in IPv4 octets.
pub fn parse_ip_sloppy(s: &str) -> Option<std::net::IpAddr> {
    if let Ok(ip) = s.parse() {
        return Some(ip);
    }
    let octets: Vec<&str> = s.split('.').collect();
    if octets.len() == 4
        && octets
            .iter()
            .all(|o| !o.is_empty() && o.len() <= 3 && o.bytes().all(|b| b.is_ascii_digit()))
    {
        let mut b = [0u8; 4];
        for (i, o) in octets.iter().enumerate() {
            b[i] = o.parse().ok()?;
        }
        return Some(std::net::IpAddr::from(b));
    }
    None
}

/// `SetDefaults_KubeProxyConfiguration` (pkg/proxy/apis/config/v1alpha1/defaults.go),
/// line for line: zero values become upstream's defaults.
pub fn set_defaults(c: &mut KubeProxyConfiguration) {
    if c.bind_address.is_empty() {
        c.bind_address = "0.0.0.0".into();
    }
    let v4 = matches!(
        parse_ip_sloppy(&c.bind_address),
        Some(std::net::IpAddr::V4(_))
    );
    let (healthz, metrics) = if v4 {
        ("0.0.0.0", "127.0.0.1")
    } else {
        ("[::]", "[::1]")
    };
    c.healthz_bind_address = if c.healthz_bind_address.is_empty() {
        format!("{healthz}:{PROXY_HEALTHZ_PORT}")
    } else {
        append_port_if_needed(&c.healthz_bind_address, PROXY_HEALTHZ_PORT)
    };
    c.metrics_bind_address = if c.metrics_bind_address.is_empty() {
        format!("{metrics}:{PROXY_STATUS_PORT}")
    } else {
        append_port_if_needed(&c.metrics_bind_address, PROXY_STATUS_PORT)
    };
    c.oom_score_adj.get_or_insert(KUBE_PROXY_OOM_SCORE_ADJ);
    if c.iptables.sync_period.is_zero() {
        c.iptables.sync_period = GoDuration::secs(30);
    }
    if c.iptables.min_sync_period.is_zero() {
        c.iptables.min_sync_period = GoDuration::secs(1);
    }
    c.iptables.localhost_node_ports.get_or_insert(true);
    if c.ipvs.sync_period.is_zero() {
        c.ipvs.sync_period = GoDuration::secs(30);
    }
    if c.nftables.sync_period.is_zero() {
        c.nftables.sync_period = GoDuration::secs(30);
    }
    if c.nftables.min_sync_period.is_zero() {
        c.nftables.min_sync_period = GoDuration::secs(1);
    }
    c.conntrack.max_per_core.get_or_insert(32 * 1024);
    c.conntrack.min.get_or_insert(128 * 1024);
    c.iptables.masquerade_bit.get_or_insert(14);
    c.nftables.masquerade_bit.get_or_insert(14);
    c.conntrack
        .tcp_established_timeout
        .get_or_insert(GoDuration::secs(24 * 3600));
    c.conntrack
        .tcp_close_wait_timeout
        .get_or_insert(GoDuration::secs(3600));
    if c.config_sync_period.is_zero() {
        c.config_sync_period = GoDuration::secs(15 * 60);
    }
    if c.client_connection.content_type.is_empty() {
        c.client_connection.content_type = "application/vnd.kubernetes.protobuf".into();
    }
    if c.client_connection.qps == 0.0 {
        c.client_connection.qps = 5.0;
    }
    if c.client_connection.burst == 0 {
        c.client_connection.burst = 10;
    }
    // logsapi.SetRecommendedLoggingConfiguration
    let l = &mut c.logging;
    if l.format.is_empty() {
        l.format = "text".into();
    }
    if l.flush_frequency.duration.is_zero() {
        l.flush_frequency = TimeOrMetaDuration {
            duration: GoDuration::secs(5),
            as_string: true,
        };
    }
    for o in [&mut l.options.text, &mut l.options.json] {
        if o.info_buffer_size.0.is_empty() {
            o.info_buffer_size = Quantity("0".into());
        }
    }
}

/// The file as upstream's `--write-config-to` writes it: sigs.k8s.io/yaml over the JSON
/// form, so keys sorted, block style, `null` for nil lists and pointers, strings quoted
/// only where YAML 1.1 would read them as something else.
pub fn to_yaml(c: &KubeProxyConfiguration) -> String {
    let v = serde_json::to_value(c).unwrap_or(serde_json::Value::Null);
    let mut out = String::new();
    super::yaml_out::emit(&v, 0, &mut out);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Upstream's golden file for an empty configuration after defaulting
    /// (pkg/proxy/apis/config/scheme/testdata/KubeProxyConfiguration/after/v1alpha1.yaml,
    /// v1.37.2). Upstream writes it after its internal round trip, which keeps the sync
    /// periods of the iptables section only (the mode is empty); `internal` does the same.
    pub const UPSTREAM_AFTER: &str = include_str!("testdata/v1alpha1_after.yaml");

    #[test]
    fn defaults_of_an_empty_file_are_upstreams_golden() {
        let mut c = KubeProxyConfiguration {
            api_version: API_VERSION.into(),
            kind: KIND.into(),
            ..Default::default()
        };
        set_defaults(&mut c);
        let back = super::super::internal::KubeProxyConfig::from_v1alpha1(&c).to_v1alpha1();
        assert_eq!(to_yaml(&back), UPSTREAM_AFTER);
    }

    #[test]
    fn append_port_like_upstream() {
        // TestAddressFromDeprecatedFlags and AppendPortIfNeeded's own cases.
        for (addr, want) in [
            ("1.2.3.4", "1.2.3.4:12345"),
            ("1.2.3.4:23456", "1.2.3.4:23456"),
            ("fd00:1::5", "[fd00:1::5]:12345"),
            ("[fd00:1::5]:23456", "[fd00:1::5]:23456"),
            ("[fd00:1::5]", "[fd00:1::5]"),
            ("not-an-ip", "not-an-ip"),
            ("010.001.002.003", "010.001.002.003:12345"),
        ] {
            assert_eq!(append_port_if_needed(addr, 12345), want, "{addr}");
        }
    }

    #[test]
    fn ipv6_bind_address_moves_the_default_servers_to_v6() {
        let mut c = KubeProxyConfiguration {
            bind_address: "::0".into(),
            ..Default::default()
        };
        set_defaults(&mut c);
        assert_eq!(c.healthz_bind_address, "[::]:10256");
        assert_eq!(c.metrics_bind_address, "[::1]:10249");
    }
}
