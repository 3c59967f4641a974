//! Upstream's `Validate` (pkg/proxy/apis/config/validation/validation.go) on the internal
//! configuration: one function per section, each given its field path as upstream's are,
//! and [`validate`] collecting their errors in upstream's order with upstream's texts.
//! Only the rules that apply on Linux. [`check`] runs it after the feature gates, as
//! upstream's `Complete` and `Validate` do, and turns the first failure into the one error
//! the user sees. Pure.

use super::file::internal::KubeProxyConfig;
use super::file::v1alpha1::{
    parse_ip_sloppy, split_host_port, ClientConnection, Conntrack, GoDuration,
};
use super::flags::fields::Namer;
use super::{bad, gates, ConfigError};

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

const GREATER_OR_EQUAL_0: &str = "must be greater than or equal to 0";

/// `Validate`: every rule of upstream's that applies on Linux, in upstream's order.
pub fn validate(c: &KubeProxyConfig) -> Vec<Violation> {
    let mut out = validate_masquerade_bit(c.iptables.masquerade_bit, "iptables");
    match c.mode.as_str() {
        "ipvs" => out.extend(validate_ipvs(c, "ipvs")),
        "nftables" => out.extend(validate_masquerade_bit(
            c.nftables_masquerade_bit,
            "nftables",
        )),
        _ => {}
    }
    out.extend(validate_conntrack(&c.conntrack, "conntrack"));
    out.extend(validate_oom_score_adj(c.oom_score_adj, "oomScoreAdj"));
    out.extend(validate_proxy_mode(&c.mode, "mode"));
    out.extend(validate_client_connection(
        &c.client_connection,
        "clientConnection",
    ));
    out.extend(validate_sync_periods(c));
    out.extend(validate_bind_addresses(c));
    out.extend(validate_node_port_addresses(
        &c.node_port_addresses,
        "nodePortAddresses",
    ));
    out.extend(validate_show_hidden_metrics_version(
        &c.show_hidden_metrics_for_version,
        "showHiddenMetricsForVersion",
    ));
    out.extend(validate_detect_local(c));
    out.extend(validate_logging_format(&c.logging.format, "logging.format"));
    out
}

/// `validateKubeProxyIPTablesConfiguration` and the nftables one: the masquerade bit.
fn validate_masquerade_bit(bit: Option<i32>, path: &str) -> Vec<Violation> {
    match bit.filter(|b| !(0..=31).contains(b)) {
        Some(b) => vec![v(
            format!("{path}.masqueradeBit"),
            b,
            "must be within the range [0, 31]",
        )],
        None => Vec::new(),
    }
}

fn non_negative(field: impl Into<String>, d: GoDuration, out: &mut Vec<Violation>) {
    if d.0 < 0 {
        out.push(v(field, d, GREATER_OR_EQUAL_0));
    }
}

/// `validateKubeProxyIPVSConfiguration`: the timeouts and the excluded CIDRs.
fn validate_ipvs(c: &KubeProxyConfig, path: &str) -> Vec<Violation> {
    let mut out = Vec::new();
    let ipvs = &c.ipvs;
    non_negative(format!("{path}.tcpTimeout"), ipvs.tcp_timeout, &mut out);
    non_negative(
        format!("{path}.tcpFinTimeout"),
        ipvs.tcp_fin_timeout,
        &mut out,
    );
    non_negative(format!("{path}.udpTimeout"), ipvs.udp_timeout, &mut out);
    for (i, cidr) in ipvs.exclude_cidrs.iter().flatten().enumerate() {
        if !valid_cidr(cidr) {
            out.push(v(
                format!("{path}.excludeCIDRs[{i}]"),
                format!("{cidr:?}"),
                "must be a valid CIDR",
            ));
        }
    }
    out
}

/// `validateKubeProxyConntrackConfiguration`.
fn validate_conntrack(ct: &Conntrack, path: &str) -> Vec<Violation> {
    let mut out = Vec::new();
    for (field, n) in [("maxPerCore", ct.max_per_core), ("min", ct.min)] {
        if let Some(n) = n.filter(|n| *n < 0) {
            out.push(v(format!("{path}.{field}"), n, GREATER_OR_EQUAL_0));
        }
    }
    for (field, d) in [
        (
            "tcpEstablishedTimeout",
            ct.tcp_established_timeout.unwrap_or_default(),
        ),
        (
            "tcpCloseWaitTimeout",
            ct.tcp_close_wait_timeout.unwrap_or_default(),
        ),
        ("udpTimeout", ct.udp_timeout),
        ("udpStreamTimeout", ct.udp_stream_timeout),
    ] {
        non_negative(format!("{path}.{field}"), d, &mut out);
    }
    out
}

fn validate_oom_score_adj(oom: Option<i32>, path: &str) -> Vec<Violation> {
    match oom.filter(|n| !(-1000..=1000).contains(n)) {
        Some(n) => vec![v(path, n, "must be within the range [-1000, 1000]")],
        None => Vec::new(),
    }
}

/// `validateProxyMode`.
fn validate_proxy_mode(mode: &str, path: &str) -> Vec<Violation> {
    if mode.is_empty() || MODES.contains(&mode) {
        return Vec::new();
    }
    vec![v(
        path,
        format!("{mode:?}"),
        "must be iptables, ipvs, nftables, userspace or blank (blank means iptables, \
         served here by the nftables engine)",
    )]
}

/// `validateClientConnectionConfiguration`.
fn validate_client_connection(cc: &ClientConnection, path: &str) -> Vec<Violation> {
    if cc.burst >= 0 {
        return Vec::new();
    }
    vec![v(format!("{path}.burst"), cc.burst, GREATER_OR_EQUAL_0)]
}

/// The config sync period and the sync periods, named in the section of the mode.
fn validate_sync_periods(c: &KubeProxyConfig) -> Vec<Violation> {
    let mut out = Vec::new();
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
    non_negative(
        format!("{section}.minSyncPeriod"),
        c.min_sync_period,
        &mut out,
    );
    if c.min_sync_period > c.sync_period {
        out.push(v(
            format!("{section}.syncPeriod"),
            c.min_sync_period,
            format!("must be greater than or equal to {section}.minSyncPeriod"),
        ));
    }
    out
}

/// The bind address and the health and metrics servers' addresses.
fn validate_bind_addresses(c: &KubeProxyConfig) -> Vec<Violation> {
    let mut out = Vec::new();
    if parse_ip_sloppy(&c.bind_address).is_none() {
        out.push(v(
            "bindAddress",
            format!("{:?}", c.bind_address),
            "not a valid textual representation of an IP address",
        ));
    }
    if !c.healthz_bind_address.is_empty() {
        out.extend(validate_host_port(
            &c.healthz_bind_address,
            "healthzBindAddress",
        ));
    }
    // Upstream requires a metrics address; here empty disables the server, as it does for
    // healthz (the "an empty bind address disables that server").
    if !c.metrics_bind_address.is_empty() {
        out.extend(validate_host_port(
            &c.metrics_bind_address,
            "metricsBindAddress",
        ));
    }
    out
}

/// `validateHostPort`. Port 0 is accepted besides upstream's 1-65535: it asks the kernel
/// for a free port (tests use it).
fn validate_host_port(input: &str, path: &str) -> Vec<Violation> {
    let Some((host, port)) = split_host_port(input) else {
        return vec![v(path, format!("{input:?}"), "must be IP:port")];
    };
    let mut out = Vec::new();
    if parse_ip_sloppy(host).is_none() {
        out.push(v(path, format!("{host:?}"), "must be a valid IP"));
    }
    if !port.bytes().all(|b| b.is_ascii_digit()) || port.is_empty() || port.parse::<u16>().is_err()
    {
        out.push(v(path, format!("{port:?}"), "must be a valid port"));
    }
    out
}

/// `validateKubeProxyNodePortAddress`: CIDRs and each keyword at most once.
fn validate_node_port_addresses(addresses: &Option<Vec<String>>, path: &str) -> Vec<Violation> {
    let mut out = Vec::new();
    let mut seen = Vec::new();
    for (i, a) in addresses.iter().flatten().enumerate() {
        let field = format!("{path}[{i}]");
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
    out
}

/// `validateShowHiddenMetricsVersion`: empty or `<major>.<minor>`.
fn validate_show_hidden_metrics_version(version: &str, path: &str) -> Vec<Violation> {
    let ok = version.is_empty()
        || version
            .split_once('.')
            .is_some_and(|(a, b)| a.parse::<u32>().is_ok() && b.parse::<u32>().is_ok());
    if ok {
        return Vec::new();
    }
    vec![v(
        path,
        format!("{version:?}"),
        "must be in the form <major>.<minor>, e.g.: '1.16'",
    )]
}

/// `validateDetectLocalMode`, then what the mode needs: its interface or its cluster CIDRs.
fn validate_detect_local(c: &KubeProxyConfig) -> Vec<Violation> {
    let mut out = validate_detect_local_mode(&c.detect_local_mode, "detectLocalMode");
    let dl = &c.detect_local;
    match c.detect_local_mode.as_str() {
        "BridgeInterface" => out.extend(validate_interface(
            &dl.bridge_interface,
            "detectLocal.bridgeInterface",
        )),
        "InterfaceNamePrefix" => out.extend(validate_interface(
            &dl.interface_name_prefix,
            "detectLocal.interfaceNamePrefix",
        )),
        "ClusterCIDR" if !dl.cluster_cidrs.is_empty() => {
            out.extend(validate_dual_stack_cidrs(&dl.cluster_cidrs, "clusterCIDR"))
        }
        _ => {}
    }
    out
}

fn validate_detect_local_mode(mode: &str, path: &str) -> Vec<Violation> {
    if mode.is_empty() || DETECT_LOCAL_MODES.contains(&mode) {
        return Vec::new();
    }
    vec![v(
        path,
        format!("{mode:?}"),
        "Unsupported value: supported values: \"ClusterCIDR\", \"NodeCIDR\", \
         \"BridgeInterface\", \"InterfaceNamePrefix\", \"\"",
    )]
}

/// `validateInterface`: the interface name or prefix is given.
fn validate_interface(name: &str, path: &str) -> Vec<Violation> {
    if !name.is_empty() {
        return Vec::new();
    }
    vec![v(path, "\"\"", "must not be empty")]
}

/// `validateDualStackCIDRStrings`: one CIDR, or two of different families.
fn validate_dual_stack_cidrs(cidrs: &[String], path: &str) -> Vec<Violation> {
    let shown = format!("{cidrs:?}");
    let pair = "must be a either a single CIDR or dual-stack pair of CIDRs (e.g. \
                [10.100.0.0/16, fde4:8dba:82e1::/48]";
    if cidrs.len() > 2 {
        return vec![v(path, shown, pair)];
    }
    let out: Vec<Violation> = cidrs
        .iter()
        .filter(|c| !valid_cidr(c))
        .map(|c| {
            v(
                path,
                format!("{c:?}"),
                "must be a valid CIDR block (e.g. 10.100.0.0/16 or fde4:8dba:82e1::/48)",
            )
        })
        .collect();
    if out.is_empty() && cidrs.len() == 2 && is_ipv4_cidr(&cidrs[0]) == is_ipv4_cidr(&cidrs[1]) {
        return vec![v(path, shown, pair)];
    }
    out
}

fn is_ipv4_cidr(s: &str) -> bool {
    s.split('/')
        .next()
        .and_then(parse_ip_sloppy)
        .is_some_and(|i| i.is_ipv4())
}

/// component-base's `logsapi.Validate`, for the format (the only part that can be wrong
/// here).
fn validate_logging_format(format: &str, path: &str) -> Vec<Violation> {
    if format.is_empty() || LOGGING_FORMATS.contains(&format) {
        return Vec::new();
    }
    vec![v(
        path,
        format!("{format:?}"),
        "Unsupported value: supported values: \"json\", \"text\"",
    )]
}

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

/// The feature gates, applied before validating as upstream's `Complete` does (an unknown
/// gate, a locked one set to the other value or a missing dependency stops the start),
/// then upstream's validation, whose first error is reported with a count of the others.
pub(super) fn check(
    kp: &KubeProxyConfig,
    namer: &Namer,
    warnings: &mut Vec<String>,
) -> Result<gates::FeatureGates, ConfigError> {
    let (gates, gate_warnings) = gates::FeatureGates::from_map(&kp.feature_gates)
        .map_err(|e| bad(&namer.name("featureGates"), e.to_string()))?;
    warnings.extend(gate_warnings);
    let violations = validate(kp);
    if let Some(first) = violations.first() {
        let more = match violations.len() {
            1 => String::new(),
            n => format!(" (and {} more)", n - 1),
        };
        return Err(bad(
            &namer.name(&first.field),
            format!("{}: {}{more}", first.value, first.why),
        ));
    }
    // Upstream's validation accepts ipvs only while the (deprecated) KubeProxyIPVS gate
    // is on (pkg/proxy/apis/config/validation `validateProxyModeLinux`).
    if kp.mode == "ipvs" && !gates.enabled(gates::KUBE_PROXY_IPVS) {
        return Err(bad(
            &namer.name("mode"),
            "\"ipvs\": must be iptables, nftables, userspace or blank (blank means iptables, \
             served here by the nftables engine): ipvs needs the KubeProxyIPVS feature gate",
        ));
    }
    Ok(gates)
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
}
