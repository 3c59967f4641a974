//! Which KubeProxyConfiguration field each flag sets, and how: the one table that says it.
//! Applying the flags and naming a flag in an error (a field's value came from the command
//! line) both read these tables, grouped by when upstream applies them: bound into the
//! config object without `--config`, `processV1Alpha1Flags`, `copyLogsFromFlags`, and our
//! own overrides of the running mode's settings. Each row's flag and type are checked when
//! the crate compiles ([`Flag::new`]). Pure.

use std::collections::BTreeSet;

use crate::config::file::internal::KubeProxyConfig;
use crate::config::file::v1alpha1::{self, GoDuration};
use crate::config::flags::{self, EveryValue, Flag, Parsed};

/// A flag, the v1alpha1 fields (JSON paths) it sets, and the setter for its value.
pub(in crate::config) struct Binding {
    /// Every field the flag can set (some depend on the mode), for naming it in errors.
    fields: &'static [&'static str],
    set: Set,
}

/// The flag with its typed setter.
enum Set {
    Bool(Flag<bool>, fn(&mut KubeProxyConfig, bool)),
    I32(Flag<i32>, fn(&mut KubeProxyConfig, i32)),
    Duration(Flag<GoDuration>, fn(&mut KubeProxyConfig, GoDuration)),
    Text(Flag<String>, fn(&mut KubeProxyConfig, &str)),
    List(Flag<Vec<String>>, fn(&mut KubeProxyConfig, Vec<String>)),
    Every(Flag<EveryValue>, fn(&mut KubeProxyConfig, &[String])),
}

type Fields = &'static [&'static str];

const fn bool(name: &'static str, fields: Fields, f: fn(&mut KubeProxyConfig, bool)) -> Binding {
    Binding {
        fields,
        set: Set::Bool(Flag::new(name), f),
    }
}

const fn i32(name: &'static str, fields: Fields, f: fn(&mut KubeProxyConfig, i32)) -> Binding {
    Binding {
        fields,
        set: Set::I32(Flag::new(name), f),
    }
}

const fn duration(
    name: &'static str,
    fields: Fields,
    f: fn(&mut KubeProxyConfig, GoDuration),
) -> Binding {
    Binding {
        fields,
        set: Set::Duration(Flag::new(name), f),
    }
}

const fn text(name: &'static str, fields: Fields, f: fn(&mut KubeProxyConfig, &str)) -> Binding {
    Binding {
        fields,
        set: Set::Text(Flag::new(name), f),
    }
}

const fn list(
    name: &'static str,
    fields: Fields,
    f: fn(&mut KubeProxyConfig, Vec<String>),
) -> Binding {
    Binding {
        fields,
        set: Set::List(Flag::new(name), f),
    }
}

const fn every(
    name: &'static str,
    fields: Fields,
    f: fn(&mut KubeProxyConfig, &[String]),
) -> Binding {
    Binding {
        fields,
        set: Set::Every(Flag::new(name), f),
    }
}

/// The flags upstream binds straight into the config object (options.go `AddFlags`):
/// applied over the defaults when there is no `--config`.
pub(in crate::config) const CONFIG_FLAGS: &[Binding] = &[
    every("feature-gates", &["featureGates"], |c, values| {
        for v in values {
            for kv in v.split(',').map(str::trim).filter(|s| !s.is_empty()) {
                if let Some((k, b)) = kv.split_once('=') {
                    c.feature_gates.insert(
                        k.trim().to_string(),
                        flags::parse_bool(b.trim()).unwrap_or(false),
                    );
                }
            }
        }
    }),
    text("kubeconfig", &["clientConnection.kubeconfig"], |c, v| {
        c.client_connection.kubeconfig = v.into()
    }),
    text(
        "kube-api-content-type",
        &["clientConnection.contentType"],
        |c, v| c.client_connection.content_type = v.into(),
    ),
    i32("kube-api-burst", &["clientConnection.burst"], |c, v| {
        c.client_connection.burst = v
    }),
    text("kube-api-qps", &["clientConnection.qps"], |c, v| {
        if let Ok(v) = v.parse() {
            c.client_connection.qps = v;
        }
    }),
    // IPVar: an empty value leaves the address alone.
    text("bind-address", &["bindAddress"], |c, v| {
        if !v.is_empty() {
            c.bind_address = v.into();
        }
    }),
    text("healthz-bind-address", &["healthzBindAddress"], |c, v| {
        c.healthz_bind_address = v.into()
    }),
    text("metrics-bind-address", &["metricsBindAddress"], |c, v| {
        c.metrics_bind_address = v.into()
    }),
    bool(
        "bind-address-hard-fail",
        &["bindAddressHardFail"],
        |c, v| c.bind_address_hard_fail = v,
    ),
    bool("profiling", &["enableProfiling"], |c, v| {
        c.enable_profiling = v
    }),
    text(
        "show-hidden-metrics-for-version",
        &["showHiddenMetricsForVersion"],
        |c, v| c.show_hidden_metrics_for_version = v.into(),
    ),
    text("proxy-mode", &["mode"], |c, v| c.mode = v.into()),
    i32(
        "iptables-masquerade-bit",
        &["iptables.masqueradeBit"],
        |c, v| c.iptables.masquerade_bit = Some(v),
    ),
    bool("masquerade-all", &["iptables.masqueradeAll"], |c, v| {
        c.masquerade_all = v
    }),
    bool(
        "iptables-localhost-nodeports",
        &["iptables.localhostNodePorts"],
        |c, v| c.iptables.localhost_node_ports = Some(v),
    ),
    text("ipvs-scheduler", &["ipvs.scheduler"], |c, v| {
        c.ipvs.scheduler = v.into()
    }),
    list("ipvs-exclude-cidrs", &["ipvs.excludeCIDRs"], |c, v| {
        c.ipvs.exclude_cidrs = Some(v)
    }),
    bool("ipvs-strict-arp", &["ipvs.strictARP"], |c, v| {
        c.ipvs.strict_arp = v
    }),
    duration("ipvs-tcp-timeout", &["ipvs.tcpTimeout"], |c, v| {
        c.ipvs.tcp_timeout = v
    }),
    duration("ipvs-tcpfin-timeout", &["ipvs.tcpFinTimeout"], |c, v| {
        c.ipvs.tcp_fin_timeout = v
    }),
    duration("ipvs-udp-timeout", &["ipvs.udpTimeout"], |c, v| {
        c.ipvs.udp_timeout = v
    }),
    text("detect-local-mode", &["detectLocalMode"], |c, v| {
        c.detect_local_mode = v.into()
    }),
    text(
        "pod-bridge-interface",
        &["detectLocal.bridgeInterface"],
        |c, v| c.detect_local.bridge_interface = v.into(),
    ),
    text(
        "pod-interface-name-prefix",
        &["detectLocal.interfaceNamePrefix"],
        |c, v| c.detect_local.interface_name_prefix = v.into(),
    ),
    list("nodeport-addresses", &["nodePortAddresses"], |c, v| {
        c.node_port_addresses = Some(v)
    }),
    i32("oom-score-adj", &["oomScoreAdj"], |c, v| {
        c.oom_score_adj = Some(v)
    }),
    i32(
        "conntrack-max-per-core",
        &["conntrack.maxPerCore"],
        |c, v| c.conntrack.max_per_core = Some(v),
    ),
    i32("conntrack-min", &["conntrack.min"], |c, v| {
        c.conntrack.min = Some(v)
    }),
    duration(
        "conntrack-tcp-timeout-established",
        &["conntrack.tcpEstablishedTimeout"],
        |c, v| c.conntrack.tcp_established_timeout = Some(v),
    ),
    duration(
        "conntrack-tcp-timeout-close-wait",
        &["conntrack.tcpCloseWaitTimeout"],
        |c, v| c.conntrack.tcp_close_wait_timeout = Some(v),
    ),
    bool(
        "conntrack-tcp-be-liberal",
        &["conntrack.tcpBeLiberal"],
        |c, v| c.conntrack.tcp_be_liberal = v,
    ),
    duration(
        "conntrack-udp-timeout",
        &["conntrack.udpTimeout"],
        |c, v| c.conntrack.udp_timeout = v,
    ),
    duration(
        "conntrack-udp-timeout-stream",
        &["conntrack.udpStreamTimeout"],
        |c, v| c.conntrack.udp_stream_timeout = v,
    ),
    duration("config-sync-period", &["configSyncPeriod"], |c, v| {
        c.config_sync_period = v
    }),
];

/// `processV1Alpha1Flags` (without `--config`, after the bound flags): the sync-period
/// flags of the other mode are ignored, the cluster CIDRs are split. The iptables flags set
/// the internal sync periods in every mode but ipvs, so they name nftables' fields too.
pub(in crate::config) const V1ALPHA1_FLAGS: &[Binding] = &[
    duration(
        "iptables-sync-period",
        &["iptables.syncPeriod", "nftables.syncPeriod"],
        |c, v| {
            if c.mode != "ipvs" {
                c.sync_period = v;
            }
        },
    ),
    duration(
        "iptables-min-sync-period",
        &["iptables.minSyncPeriod", "nftables.minSyncPeriod"],
        |c, v| {
            if c.mode != "ipvs" {
                c.min_sync_period = v;
            }
        },
    ),
    duration("ipvs-sync-period", &["ipvs.syncPeriod"], |c, v| {
        if c.mode == "ipvs" {
            c.sync_period = v;
        }
    }),
    duration("ipvs-min-sync-period", &["ipvs.minSyncPeriod"], |c, v| {
        if c.mode == "ipvs" {
            c.min_sync_period = v;
        }
    }),
    text("cluster-cidr", &["clusterCIDR"], |c, v| {
        c.detect_local.cluster_cidrs = v.split(',').map(str::to_string).collect()
    }),
];

/// `copyLogsFromFlags`: the logging flags win over the file too; `--vmodule` entries come
/// first.
pub(in crate::config) const LOGGING_FLAGS: &[Binding] = &[
    text("logging-format", &["logging.format"], |c, v| {
        c.logging.format = v.into()
    }),
    duration(
        "log-flush-frequency",
        &["logging.flushFrequency"],
        |c, v| {
            c.logging.flush_frequency = v1alpha1::TimeOrMetaDuration {
                duration: v,
                as_string: true,
            }
        },
    ),
    text("v", &["logging.verbosity"], |c, v| {
        if let Ok(v) = v.parse() {
            c.logging.verbosity = v;
        }
    }),
    every("vmodule", &["logging.vmodule"], |c, values| {
        let mut items: Vec<v1alpha1::VModuleItem> = values
            .iter()
            .flat_map(|v| v.split(',').filter(|s| !s.is_empty()))
            .filter_map(|item| {
                let (pat, n) = item.split_once('=')?;
                Some(v1alpha1::VModuleItem {
                    file_pattern: pat.to_string(),
                    verbosity: n.parse().ok()?,
                })
            })
            .collect();
        items.append(&mut c.logging.vmodule);
        c.logging.vmodule = items;
    }),
    bool(
        "log-text-split-stream",
        &["logging.options.text.splitStream"],
        |c, v| c.logging.options.text.split_stream = v,
    ),
    text(
        "log-text-info-buffer-size",
        &["logging.options.text.infoBufferSize"],
        |c, v| c.logging.options.text.info_buffer_size = v1alpha1::Quantity(v.into()),
    ),
    bool(
        "log-json-split-stream",
        &["logging.options.json.splitStream"],
        |c, v| c.logging.options.json.split_stream = v,
    ),
    text(
        "log-json-info-buffer-size",
        &["logging.options.json.infoBufferSize"],
        |c, v| c.logging.options.json.info_buffer_size = v1alpha1::Quantity(v.into()),
    ),
];

/// Our own flags over the file and upstream's flags: the running mode's settings, applied
/// once the mode is known.
pub(in crate::config) const OVERRIDES: &[Binding] = &[
    i32(
        "masquerade-bit",
        &["iptables.masqueradeBit", "nftables.masqueradeBit"],
        |c, b| match c.mode.as_str() {
            "nftables" => c.nftables_masquerade_bit = Some(b),
            _ => c.iptables.masquerade_bit = Some(b),
        },
    ),
    duration(
        "sync-period",
        &[
            "iptables.syncPeriod",
            "nftables.syncPeriod",
            "ipvs.syncPeriod",
        ],
        |c, d| c.sync_period = d,
    ),
    duration(
        "min-sync-period",
        &[
            "iptables.minSyncPeriod",
            "nftables.minSyncPeriod",
            "ipvs.minSyncPeriod",
        ],
        |c, d| c.min_sync_period = d,
    ),
];

const TABLES: [&[Binding]; 4] = [CONFIG_FLAGS, V1ALPHA1_FLAGS, LOGGING_FLAGS, OVERRIDES];

impl Binding {
    /// The flag's name.
    pub(super) fn flag(&self) -> &'static str {
        match self.set {
            Set::Bool(f, _) => f.name,
            Set::I32(f, _) => f.name,
            Set::Duration(f, _) => f.name,
            Set::Text(f, _) => f.name,
            Set::List(f, _) => f.name,
            Set::Every(f, _) => f.name,
        }
    }

    /// Sets the field from the flag, if the flag was given.
    fn apply(&self, c: &mut KubeProxyConfig, p: &Parsed) {
        match self.set {
            Set::Bool(f, set) => p.get(f).into_iter().for_each(|v| set(c, v)),
            Set::I32(f, set) => p.get(f).into_iter().for_each(|v| set(c, v)),
            Set::Duration(f, set) => p.get(f).into_iter().for_each(|v| set(c, v)),
            Set::Text(f, set) => p.get(f).into_iter().for_each(|v| set(c, &v)),
            Set::List(f, set) => p.get(f).into_iter().for_each(|v| set(c, v)),
            Set::Every(f, set) => p.get(f).into_iter().for_each(|v| set(c, &v.0)),
        }
    }

    fn ours(&self) -> bool {
        flags::spec(self.flag()).is_some_and(|s| s.ours)
    }
}

/// Applies every given flag of `table`, in the table's order.
pub(in crate::config) fn apply(table: &[Binding], c: &mut KubeProxyConfig, p: &Parsed) {
    for b in table {
        b.apply(c, p);
    }
}

/// The flag that sets a v1alpha1 field, for error messages (no `--config`): ours when it
/// was given, else upstream's; the field itself when no flag sets it.
fn flag_of(field: &str, given: &BTreeSet<&str>) -> String {
    let base = field.split('[').next().unwrap_or(field);
    let setters = || {
        TABLES
            .iter()
            .flat_map(|t| t.iter())
            .filter(|b| b.fields.contains(&base))
    };
    setters()
        .find(|b| b.ours() && given.contains(b.flag()))
        .or_else(|| setters().find(|b| !b.ours()))
        .or_else(|| setters().next())
        .map(|b| format!("--{}", b.flag()))
        .unwrap_or_else(|| field.to_string())
}

/// Where an error about a field points: the file's field, or the flag.
pub(in crate::config) struct Namer {
    /// The `--config` file as shown, when there is one.
    pub file: Option<String>,
    /// The flags given, by name.
    pub given: BTreeSet<&'static str>,
}

impl Namer {
    /// `config file F field X`, or the flag that sets X (always the flag for a logging
    /// field when `--logging-format` was given: the logging flags win over the file).
    pub fn name(&self, field: &str) -> String {
        let logging_flag =
            field.starts_with("logging.") && self.given.contains(flags::cli::LOGGING_FORMAT.name);
        match &self.file {
            Some(f) if !logging_flag => format!("config file {f} field {field}"),
            _ => flag_of(field, &self.given),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::flags::{Target, FLAGS};

    /// Every flag that sets a file field has exactly one row, and every row's flag sets one
    /// (upstream's, or ours).
    #[test]
    fn each_config_and_logging_flag_has_one_row() {
        let rows: Vec<&str> = TABLES
            .iter()
            .flat_map(|t| t.iter())
            .map(Binding::flag)
            .collect();
        for spec in FLAGS {
            let n = rows.iter().filter(|r| **r == spec.name).count();
            let bound = matches!(spec.target, Target::Config | Target::Logging);
            let overrides = OVERRIDES.iter().any(|b| b.flag() == spec.name);
            assert_eq!(n, usize::from(bound || overrides), "--{}", spec.name);
        }
        for (table, target) in [
            (CONFIG_FLAGS, Target::Config),
            (V1ALPHA1_FLAGS, Target::Config),
            (LOGGING_FLAGS, Target::Logging),
        ] {
            for b in table {
                assert_eq!(flags::spec(b.flag()).map(|s| s.target), Some(target));
            }
        }
        assert!(OVERRIDES.iter().all(Binding::ours));
    }

    #[test]
    fn errors_name_ours_when_given_else_upstreams() {
        let p = BTreeSet::from(["masquerade-bit"]);
        assert_eq!(flag_of("iptables.masqueradeBit", &p), "--masquerade-bit");
        assert_eq!(flag_of("nftables.masqueradeBit", &p), "--masquerade-bit");
        assert_eq!(flag_of("ipvs.syncPeriod", &p), "--ipvs-sync-period");
        let p = BTreeSet::new();
        assert_eq!(
            flag_of("iptables.masqueradeBit", &p),
            "--iptables-masquerade-bit"
        );
        assert_eq!(flag_of("nftables.masqueradeBit", &p), "--masquerade-bit");
        assert_eq!(flag_of("nftables.syncPeriod", &p), "--iptables-sync-period");
        assert_eq!(flag_of("nodePortAddresses[2]", &p), "--nodeport-addresses");
        assert_eq!(flag_of("portRange", &p), "portRange");
    }
}
