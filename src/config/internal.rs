//! Upstream's internal `KubeProxyConfiguration` (pkg/proxy/apis/config/types.go): one sync
//! period pair and one masqueradeAll, taken from the section of the mode, the cluster CIDRs
//! as a list. The conversions to and from v1alpha1 are upstream's (v1alpha1/conversion.go)
//! and validation is upstream's `Validate` (validation/validation.go) with its texts. Pure.

use std::collections::BTreeMap;

use super::v1alpha1::{
    self, parse_ip_sloppy, split_host_port, ClientConnection, Conntrack, GoDuration, Logging,
    Winkernel,
};

#[derive(Debug, Clone, Default, PartialEq)]
pub struct IpTables {
    pub masquerade_bit: Option<i32>,
    pub localhost_node_ports: Option<bool>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Ipvs {
    pub scheduler: String,
    pub exclude_cidrs: Option<Vec<String>>,
    pub strict_arp: bool,
    pub tcp_timeout: GoDuration,
    pub tcp_fin_timeout: GoDuration,
    pub udp_timeout: GoDuration,
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DetectLocal {
    pub bridge_interface: String,
    pub interface_name_prefix: String,
    pub cluster_cidrs: Vec<String>,
}

#[derive(Debug, Clone, Default, PartialEq)]
pub struct KubeProxyConfig {
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
    pub nftables_masquerade_bit: Option<i32>,
    pub winkernel: Winkernel,
    pub windows_run_as_service: bool,
    pub conntrack: Conntrack,
    pub masquerade_all: bool,
    pub oom_score_adj: Option<i32>,
    pub detect_local_mode: String,
    pub detect_local: DetectLocal,
    pub node_port_addresses: Option<Vec<String>>,
    pub sync_period: GoDuration,
    pub min_sync_period: GoDuration,
    pub config_sync_period: GoDuration,
    pub port_range: String,
}

impl KubeProxyConfig {
    /// `NewOptions()`'s starting point: an empty v1alpha1 object, defaulted, converted.
    pub fn defaulted() -> Self {
        let mut v = v1alpha1::KubeProxyConfiguration::default();
        v1alpha1::set_defaults(&mut v);
        Self::from_v1alpha1(&v)
    }

    /// `Convert_v1alpha1_KubeProxyConfiguration_To_config_KubeProxyConfiguration`.
    pub fn from_v1alpha1(v: &v1alpha1::KubeProxyConfiguration) -> Self {
        let (masquerade_all, sync_period, min_sync_period) = match v.mode.as_str() {
            "ipvs" => (
                v.iptables.masquerade_all,
                v.ipvs.sync_period,
                v.ipvs.min_sync_period,
            ),
            "nftables" => (
                v.nftables.masquerade_all,
                v.nftables.sync_period,
                v.nftables.min_sync_period,
            ),
            _ => (
                v.iptables.masquerade_all,
                v.iptables.sync_period,
                v.iptables.min_sync_period,
            ),
        };
        KubeProxyConfig {
            feature_gates: v.feature_gates.clone(),
            client_connection: v.client_connection.clone(),
            logging: v.logging.clone(),
            hostname_override: v.hostname_override.clone(),
            bind_address: v.bind_address.clone(),
            healthz_bind_address: v.healthz_bind_address.clone(),
            metrics_bind_address: v.metrics_bind_address.clone(),
            bind_address_hard_fail: v.bind_address_hard_fail,
            enable_profiling: v.enable_profiling,
            show_hidden_metrics_for_version: v.show_hidden_metrics_for_version.clone(),
            mode: v.mode.clone(),
            iptables: IpTables {
                masquerade_bit: v.iptables.masquerade_bit,
                localhost_node_ports: v.iptables.localhost_node_ports,
            },
            ipvs: Ipvs {
                scheduler: v.ipvs.scheduler.clone(),
                exclude_cidrs: v.ipvs.exclude_cidrs.clone(),
                strict_arp: v.ipvs.strict_arp,
                tcp_timeout: v.ipvs.tcp_timeout,
                tcp_fin_timeout: v.ipvs.tcp_fin_timeout,
                udp_timeout: v.ipvs.udp_timeout,
            },
            nftables_masquerade_bit: v.nftables.masquerade_bit,
            winkernel: v.winkernel.clone(),
            windows_run_as_service: v.windows_run_as_service,
            conntrack: v.conntrack.clone(),
            masquerade_all,
            oom_score_adj: v.oom_score_adj,
            detect_local_mode: v.detect_local_mode.clone(),
            detect_local: DetectLocal {
                bridge_interface: v.detect_local.bridge_interface.clone(),
                interface_name_prefix: v.detect_local.interface_name_prefix.clone(),
                cluster_cidrs: if v.cluster_cidr.is_empty() {
                    Vec::new()
                } else {
                    v.cluster_cidr.split(',').map(str::to_string).collect()
                },
            },
            node_port_addresses: v.node_port_addresses.clone(),
            sync_period,
            min_sync_period,
            config_sync_period: v.config_sync_period,
            port_range: v.port_range.clone(),
        }
    }

    /// `Convert_config_KubeProxyConfiguration_To_v1alpha1_KubeProxyConfiguration`: what
    /// `--write-config-to` writes.
    pub fn to_v1alpha1(&self) -> v1alpha1::KubeProxyConfiguration {
        let mut v = v1alpha1::KubeProxyConfiguration {
            api_version: v1alpha1::API_VERSION.into(),
            kind: v1alpha1::KIND.into(),
            feature_gates: self.feature_gates.clone(),
            client_connection: self.client_connection.clone(),
            logging: self.logging.clone(),
            hostname_override: self.hostname_override.clone(),
            bind_address: self.bind_address.clone(),
            healthz_bind_address: self.healthz_bind_address.clone(),
            metrics_bind_address: self.metrics_bind_address.clone(),
            bind_address_hard_fail: self.bind_address_hard_fail,
            enable_profiling: self.enable_profiling,
            show_hidden_metrics_for_version: self.show_hidden_metrics_for_version.clone(),
            mode: self.mode.clone(),
            winkernel: self.winkernel.clone(),
            windows_run_as_service: self.windows_run_as_service,
            conntrack: self.conntrack.clone(),
            oom_score_adj: self.oom_score_adj,
            detect_local_mode: self.detect_local_mode.clone(),
            detect_local: v1alpha1::DetectLocal {
                bridge_interface: self.detect_local.bridge_interface.clone(),
                interface_name_prefix: self.detect_local.interface_name_prefix.clone(),
            },
            cluster_cidr: self.detect_local.cluster_cidrs.join(","),
            node_port_addresses: self.node_port_addresses.clone(),
            config_sync_period: self.config_sync_period,
            port_range: self.port_range.clone(),
            ..Default::default()
        };
        v.iptables.masquerade_bit = self.iptables.masquerade_bit;
        v.iptables.localhost_node_ports = self.iptables.localhost_node_ports;
        v.nftables.masquerade_bit = self.nftables_masquerade_bit;
        v.ipvs = v1alpha1::Ipvs {
            exclude_cidrs: self.ipvs.exclude_cidrs.clone(),
            scheduler: self.ipvs.scheduler.clone(),
            strict_arp: self.ipvs.strict_arp,
            tcp_timeout: self.ipvs.tcp_timeout,
            tcp_fin_timeout: self.ipvs.tcp_fin_timeout,
            udp_timeout: self.ipvs.udp_timeout,
            ..Default::default()
        };
        match self.mode.as_str() {
            "nftables" => v.nftables.masquerade_all = self.masquerade_all,
            _ => v.iptables.masquerade_all = self.masquerade_all,
        }
        match self.mode.as_str() {
            "ipvs" => {
                v.ipvs.sync_period = self.sync_period;
                v.ipvs.min_sync_period = self.min_sync_period;
            }
            "nftables" => {
                v.nftables.sync_period = self.sync_period;
                v.nftables.min_sync_period = self.min_sync_period;
            }
            _ => {
                v.iptables.sync_period = self.sync_period;
                v.iptables.min_sync_period = self.min_sync_period;
            }
        }
        v
    }

    /// `platformApplyDefaults` (server_linux.go): an empty mode is iptables, nftables mode
    /// serves NodePorts on the primary addresses by default, and detect-local defaults to
    /// ClusterCIDR. Returns whether the mode was defaulted (upstream warns about it).
    pub fn apply_platform_defaults(&mut self) -> bool {
        let defaulted = self.mode.is_empty();
        if defaulted {
            self.mode = "iptables".into();
        }
        if self.mode == "nftables" && self.node_port_addresses.as_ref().is_none_or(Vec::is_empty) {
            self.node_port_addresses = Some(vec!["primary".into()]);
        }
        if self.detect_local_mode.is_empty() {
            self.detect_local_mode = "ClusterCIDR".into();
        }
        defaulted
    }

    /// The mode's section in v1alpha1, for naming the sync-period fields.
    pub fn mode_section(&self) -> &'static str {
        match self.mode.as_str() {
            "ipvs" => "ipvs",
            "nftables" => "nftables",
            _ => "iptables",
        }
    }
}

/// One validation failure: the v1alpha1 field (JSON path), the value, and upstream's text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Violation {
    pub field: String,
    pub value: String,
    pub why: String,
}

fn v(field: impl Into<String>, value: impl ToString, why: impl Into<String>) -> Violation {
    Violation {
        field: field.into(),
        value: value.to_string(),
        why: why.into(),
    }
}

/// Modes this binary runs; `userspace` is ours (upstream removed it in 1.26).
pub const MODES: &[&str] = &["iptables", "ipvs", "nftables", "userspace"];
pub const DETECT_LOCAL_MODES: &[&str] = &[
    "ClusterCIDR",
    "NodeCIDR",
    "BridgeInterface",
    "InterfaceNamePrefix",
];
pub const LOGGING_FORMATS: &[&str] = &["json", "text"];

fn valid_cidr(s: &str) -> bool {
    let Some((ip, len)) = s.split_once('/') else {
        return false;
    };
    let Some(ip) = parse_ip_sloppy(ip) else {
        return false;
    };
    let max = if ip.is_ipv4() { 32 } else { 128 };
    !len.is_empty()
        && len.len() <= 3
        && len.bytes().all(|b| b.is_ascii_digit())
        && len.parse::<u32>().is_ok_and(|l| l <= max)
}

/// `validateHostPort`. Port 0 is accepted besides upstream's 1-65535: it asks the kernel
/// for a free port (tests use it).
fn host_port(field: &str, input: &str, out: &mut Vec<Violation>) {
    let Some((host, port)) = split_host_port(input) else {
        out.push(v(field, format!("{input:?}"), "must be IP:port"));
        return;
    };
    if parse_ip_sloppy(host).is_none() {
        out.push(v(field, format!("{host:?}"), "must be a valid IP"));
    }
    if !port.bytes().all(|b| b.is_ascii_digit()) || port.is_empty() || port.parse::<u16>().is_err()
    {
        out.push(v(field, format!("{port:?}"), "must be a valid port"));
    }
}

/// `Validate`: every rule of upstream's that applies on Linux, in upstream's order.
pub fn validate(c: &KubeProxyConfig) -> Vec<Violation> {
    let mut out = Vec::new();
    let bit = |field: &str, b: Option<i32>, out: &mut Vec<Violation>| {
        if let Some(b) = b.filter(|b| !(0..=31).contains(b)) {
            out.push(v(field, b, "must be within the range [0, 31]"));
        }
    };
    bit(
        "iptables.masqueradeBit",
        c.iptables.masquerade_bit,
        &mut out,
    );
    let nonneg = |field: &str, d: GoDuration, out: &mut Vec<Violation>| {
        if d.0 < 0 {
            out.push(v(field, d, "must be greater than or equal to 0"));
        }
    };
    match c.mode.as_str() {
        "ipvs" => {
            nonneg("ipvs.tcpTimeout", c.ipvs.tcp_timeout, &mut out);
            nonneg("ipvs.tcpFinTimeout", c.ipvs.tcp_fin_timeout, &mut out);
            nonneg("ipvs.udpTimeout", c.ipvs.udp_timeout, &mut out);
            for (i, cidr) in c.ipvs.exclude_cidrs.iter().flatten().enumerate() {
                if !valid_cidr(cidr) {
                    out.push(v(
                        format!("ipvs.excludeCIDRs[{i}]"),
                        format!("{cidr:?}"),
                        "must be a valid CIDR",
                    ));
                }
            }
        }
        "nftables" => bit(
            "nftables.masqueradeBit",
            c.nftables_masquerade_bit,
            &mut out,
        ),
        _ => {}
    }
    let ct = &c.conntrack;
    for (field, n) in [
        ("conntrack.maxPerCore", ct.max_per_core),
        ("conntrack.min", ct.min),
    ] {
        if let Some(n) = n.filter(|n| *n < 0) {
            out.push(v(field, n, "must be greater than or equal to 0"));
        }
    }
    for (field, d) in [
        (
            "conntrack.tcpEstablishedTimeout",
            ct.tcp_established_timeout.unwrap_or_default(),
        ),
        (
            "conntrack.tcpCloseWaitTimeout",
            ct.tcp_close_wait_timeout.unwrap_or_default(),
        ),
        ("conntrack.udpTimeout", ct.udp_timeout),
        ("conntrack.udpStreamTimeout", ct.udp_stream_timeout),
    ] {
        nonneg(field, d, &mut out);
    }
    if let Some(n) = c.oom_score_adj.filter(|n| !(-1000..=1000).contains(n)) {
        out.push(v(
            "oomScoreAdj",
            n,
            "must be within the range [-1000, 1000]",
        ));
    }
    if !c.mode.is_empty() && !MODES.contains(&c.mode.as_str()) {
        out.push(v(
            "mode",
            format!("{:?}", c.mode),
            "must be iptables, ipvs, nftables, userspace or blank (blank means iptables, \
             served here by the nftables engine)",
        ));
    }
    if c.client_connection.burst < 0 {
        out.push(v(
            "clientConnection.burst",
            c.client_connection.burst,
            "must be greater than or equal to 0",
        ));
    }
    if c.config_sync_period.0 <= 0 {
        out.push(v(
            "configSyncPeriod",
            c.config_sync_period,
            "must be greater than 0",
        ));
    }
    let section = c.mode_section();
    if c.sync_period.0 <= 0 {
        out.push(v(
            format!("{section}.syncPeriod"),
            c.sync_period,
            "must be greater than 0",
        ));
    }
    if c.min_sync_period.0 < 0 {
        out.push(v(
            format!("{section}.minSyncPeriod"),
            c.min_sync_period,
            "must be greater than or equal to 0",
        ));
    }
    if c.min_sync_period > c.sync_period {
        out.push(v(
            format!("{section}.syncPeriod"),
            c.min_sync_period,
            format!("must be greater than or equal to {section}.minSyncPeriod"),
        ));
    }
    if parse_ip_sloppy(&c.bind_address).is_none() {
        out.push(v(
            "bindAddress",
            format!("{:?}", c.bind_address),
            "not a valid textual representation of an IP address",
        ));
    }
    if !c.healthz_bind_address.is_empty() {
        host_port("healthzBindAddress", &c.healthz_bind_address, &mut out);
    }
    // Upstream requires a metrics address; here empty disables the server, as it does for
    // healthz (the "an empty bind address disables that server").
    if !c.metrics_bind_address.is_empty() {
        host_port("metricsBindAddress", &c.metrics_bind_address, &mut out);
    }
    let mut seen = Vec::new();
    for (i, a) in c.node_port_addresses.iter().flatten().enumerate() {
        let field = format!("nodePortAddresses[{i}]");
        match a.as_str() {
            "primary" | "localhost" | "all" => {
                if seen.contains(a) {
                    out.push(v(field, format!("{a:?}"), "Duplicate value"));
                }
                seen.push(a.clone());
            }
            _ if valid_cidr(a) => {}
            _ => out.push(v(
                field,
                format!("{a:?}"),
                "must be a valid CIDR or one of the keywords 'primary', 'localhost', 'all'",
            )),
        }
    }
    let shm = &c.show_hidden_metrics_for_version;
    if !shm.is_empty() {
        let ok = shm
            .split_once('.')
            .is_some_and(|(a, b)| a.parse::<u32>().is_ok() && b.parse::<u32>().is_ok());
        if !ok {
            out.push(v(
                "showHiddenMetricsForVersion",
                format!("{shm:?}"),
                "must be in the form <major>.<minor>, e.g.: '1.16'",
            ));
        }
    }
    if !c.detect_local_mode.is_empty()
        && !DETECT_LOCAL_MODES.contains(&c.detect_local_mode.as_str())
    {
        out.push(v(
            "detectLocalMode",
            format!("{:?}", c.detect_local_mode),
            "Unsupported value: supported values: \"ClusterCIDR\", \"NodeCIDR\", \
             \"BridgeInterface\", \"InterfaceNamePrefix\", \"\"",
        ));
    }
    match c.detect_local_mode.as_str() {
        "BridgeInterface" if c.detect_local.bridge_interface.is_empty() => out.push(v(
            "detectLocal.bridgeInterface",
            "\"\"",
            "must not be empty",
        )),
        "InterfaceNamePrefix" if c.detect_local.interface_name_prefix.is_empty() => out.push(v(
            "detectLocal.interfaceNamePrefix",
            "\"\"",
            "must not be empty",
        )),
        "ClusterCIDR" if !c.detect_local.cluster_cidrs.is_empty() => {
            let cidrs = &c.detect_local.cluster_cidrs;
            let shown = format!("{cidrs:?}");
            let pair = "must be a either a single CIDR or dual-stack pair of CIDRs (e.g. \
                        [10.100.0.0/16, fde4:8dba:82e1::/48]";
            if cidrs.len() > 2 {
                out.push(v("clusterCIDR", shown, pair));
            } else {
                let mut all_valid = true;
                for c in cidrs {
                    if !valid_cidr(c) {
                        all_valid = false;
                        out.push(v(
                            "clusterCIDR",
                            format!("{c:?}"),
                            "must be a valid CIDR block (e.g. 10.100.0.0/16 or fde4:8dba:82e1::/48)",
                        ));
                    }
                }
                if all_valid && cidrs.len() == 2 {
                    let v4 = |s: &str| {
                        s.split('/')
                            .next()
                            .and_then(parse_ip_sloppy)
                            .is_some_and(|i| i.is_ipv4())
                    };
                    if v4(&cidrs[0]) == v4(&cidrs[1]) {
                        out.push(v("clusterCIDR", shown, pair));
                    }
                }
            }
        }
        _ => {}
    }
    if !c.logging.format.is_empty() && !LOGGING_FORMATS.contains(&c.logging.format.as_str()) {
        out.push(v(
            "logging.format",
            format!("{:?}", c.logging.format),
            "Unsupported value: supported values: \"json\", \"text\"",
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn valid() -> KubeProxyConfig {
        let mut c = KubeProxyConfig::defaulted();
        c.apply_platform_defaults();
        c
    }

    fn fields(c: &KubeProxyConfig) -> Vec<String> {
        validate(c).into_iter().map(|v| v.field).collect()
    }

    #[test]
    fn defaults_are_valid() {
        assert_eq!(validate(&valid()), vec![]);
    }

    /// Rows of upstream's TestValidateKubeProxyConfiguration and the per-section tests.
    #[test]
    fn upstream_validation_rows() {
        type Edit = fn(&mut KubeProxyConfig);
        let rows: &[(&str, Edit, &[&str])] = &[
            (
                "bit 32",
                |c| c.iptables.masquerade_bit = Some(32),
                &["iptables.masqueradeBit"],
            ),
            (
                "bit -1",
                |c| c.iptables.masquerade_bit = Some(-1),
                &["iptables.masqueradeBit"],
            ),
            (
                "nft bit in nft mode",
                |c| {
                    c.mode = "nftables".into();
                    c.nftables_masquerade_bit = Some(40);
                },
                &["nftables.masqueradeBit"],
            ),
            (
                "nft bit ignored in iptables mode",
                |c| c.nftables_masquerade_bit = Some(40),
                &[],
            ),
            (
                "sync 0",
                |c| c.sync_period = GoDuration(0),
                &["iptables.syncPeriod", "iptables.syncPeriod"],
            ),
            (
                "min > sync",
                |c| c.min_sync_period = GoDuration::secs(60),
                &["iptables.syncPeriod"],
            ),
            (
                "min -1",
                |c| c.min_sync_period = GoDuration(-1),
                &["iptables.minSyncPeriod"],
            ),
            (
                "config sync 0",
                |c| c.config_sync_period = GoDuration(0),
                &["configSyncPeriod"],
            ),
            (
                "bind",
                |c| c.bind_address = "10.10.12.11:2000".into(),
                &["bindAddress"],
            ),
            (
                "healthz no port",
                |c| c.healthz_bind_address = "0.0.0.0".into(),
                &["healthzBindAddress"],
            ),
            (
                "metrics bad ip",
                |c| c.metrics_bind_address = "127.0.0.x:10249".into(),
                &["metricsBindAddress"],
            ),
            (
                "metrics port",
                |c| c.metrics_bind_address = "127.0.0.1:70000".into(),
                &["metricsBindAddress"],
            ),
            ("oom", |c| c.oom_score_adj = Some(1001), &["oomScoreAdj"]),
            (
                "conntrack",
                |c| {
                    c.conntrack.max_per_core = Some(-1);
                    c.conntrack.min = Some(-1);
                    c.conntrack.udp_timeout = GoDuration(-1);
                },
                &[
                    "conntrack.maxPerCore",
                    "conntrack.min",
                    "conntrack.udpTimeout",
                ],
            ),
            ("mode", |c| c.mode = "kernelspace".into(), &["mode"]),
            (
                "burst",
                |c| c.client_connection.burst = -5,
                &["clientConnection.burst"],
            ),
            (
                "np keyword twice",
                |c| c.node_port_addresses = Some(vec!["primary".into(), "primary".into()]),
                &["nodePortAddresses[1]"],
            ),
            (
                "np mixed ok",
                |c| {
                    c.node_port_addresses = Some(vec![
                        "primary".into(),
                        "localhost".into(),
                        "10.0.0.0/8".into(),
                        "all".into(),
                    ])
                },
                &[],
            ),
            (
                "np bad",
                |c| {
                    c.node_port_addresses =
                        Some(vec!["10.0.0.0/8".into(), "foo".into(), "::1".into()])
                },
                &["nodePortAddresses[1]", "nodePortAddresses[2]"],
            ),
            (
                "ipvs exclude",
                |c| {
                    c.mode = "ipvs".into();
                    c.ipvs.exclude_cidrs = Some(vec!["10.0.0.0/8".into(), "x".into()]);
                    c.ipvs.tcp_timeout = GoDuration(-1);
                },
                &["ipvs.tcpTimeout", "ipvs.excludeCIDRs[1]"],
            ),
            (
                "hidden metrics",
                |c| c.show_hidden_metrics_for_version = "1".into(),
                &["showHiddenMetricsForVersion"],
            ),
            (
                "detect",
                |c| c.detect_local_mode = "Guess".into(),
                &["detectLocalMode"],
            ),
            (
                "bridge empty",
                |c| c.detect_local_mode = "BridgeInterface".into(),
                &["detectLocal.bridgeInterface"],
            ),
            (
                "prefix empty",
                |c| c.detect_local_mode = "InterfaceNamePrefix".into(),
                &["detectLocal.interfaceNamePrefix"],
            ),
            (
                "cidr pair same family",
                |c| c.detect_local.cluster_cidrs = vec!["10.0.0.0/8".into(), "11.0.0.0/8".into()],
                &["clusterCIDR"],
            ),
            (
                "cidr three",
                |c| {
                    c.detect_local.cluster_cidrs =
                        vec!["10.0.0.0/8".into(), "fd00::/64".into(), "11.0.0.0/8".into()]
                },
                &["clusterCIDR"],
            ),
            (
                "cidr bad",
                |c| c.detect_local.cluster_cidrs = vec!["10.0.0.0/33".into()],
                &["clusterCIDR"],
            ),
            (
                "cidr dual ok",
                |c| {
                    c.detect_local.cluster_cidrs =
                        vec!["2002:0:0:1234::/64".into(), "10.0.0.0/14".into()]
                },
                &[],
            ),
            (
                "format",
                |c| c.logging.format = "xml".into(),
                &["logging.format"],
            ),
        ];
        for (name, edit, want) in rows {
            let mut c = valid();
            edit(&mut c);
            assert_eq!(fields(&c), *want, "{name}");
        }
    }

    #[test]
    fn conversion_takes_the_modes_section() {
        // TestLoadConfig's expectations: sync periods and masqueradeAll from the section
        // of the mode, cluster CIDRs split.
        let mut v = v1alpha1::KubeProxyConfiguration {
            mode: "ipvs".into(),
            cluster_cidr: "10.0.0.0/8,fd00::/64".into(),
            ..Default::default()
        };
        v.iptables.masquerade_all = true;
        v.iptables.sync_period = GoDuration::secs(60);
        v.ipvs.sync_period = GoDuration::secs(16);
        v.ipvs.min_sync_period = GoDuration::secs(7);
        let c = KubeProxyConfig::from_v1alpha1(&v);
        assert_eq!(c.sync_period, GoDuration::secs(16));
        assert_eq!(c.min_sync_period, GoDuration::secs(7));
        assert!(c.masquerade_all);
        assert_eq!(
            c.detect_local.cluster_cidrs,
            vec!["10.0.0.0/8", "fd00::/64"]
        );
        v.mode = "nftables".into();
        v.nftables.sync_period = GoDuration::secs(3);
        let c = KubeProxyConfig::from_v1alpha1(&v);
        assert_eq!(c.sync_period, GoDuration::secs(3));
        assert!(
            !c.masquerade_all,
            "nftables mode reads nftables.masqueradeAll"
        );
        let back = c.to_v1alpha1();
        assert_eq!(back.nftables.sync_period, GoDuration::secs(3));
        assert_eq!(back.iptables.sync_period, GoDuration(0));
    }

    #[test]
    fn platform_defaults() {
        let mut c = KubeProxyConfig::defaulted();
        assert!(c.apply_platform_defaults());
        assert_eq!(c.mode, "iptables");
        assert_eq!(c.node_port_addresses, None, "iptables mode: all addresses");
        let mut c = KubeProxyConfig::defaulted();
        c.mode = "nftables".into();
        assert!(!c.apply_platform_defaults());
        assert_eq!(c.node_port_addresses, Some(vec!["primary".to_string()]));
        assert_eq!(c.detect_local_mode, "ClusterCIDR");
    }
}
