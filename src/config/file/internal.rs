//! Upstream's internal `KubeProxyConfiguration` (pkg/proxy/apis/config/types.go): one sync
//! period pair and one masqueradeAll, taken from the section of the mode, the cluster CIDRs
//! as a list. The conversions to and from v1alpha1 are upstream's (v1alpha1/conversion.go);
//! validation is in [`crate::config::validation`]. Pure.

use std::collections::BTreeMap;

use super::v1alpha1::{self, ClientConnection, Conntrack, GoDuration, Logging, Winkernel};

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

#[cfg(test)]
mod tests {
    use super::*;

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
