//! Command-line flags and the KubeProxyConfiguration file, merged into one validated
//! [`Config`]. Flag names follow upstream kube-proxy where the meaning is the same; flags
//! override the file. Pure apart from reading the config file.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::Parser;

pub mod duration;
#[cfg(test)]
mod proptests;
use serde_yaml::Value;

use crate::kernel::conntrack::tuning::ConntrackConfig;
use crate::kernel::nft::Cidr;
use crate::proxy::{names, LocalDetector, NodePortAddresses, ProxierConfig};

/// A Kubernetes service proxy that programs the kernel only through netlink.
#[derive(Debug, Clone, Parser, Default)]
#[command(name = "kube-nlproxy", version, about)]
pub struct Flags {
    /// KubeProxyConfiguration file (kubeproxy.config.k8s.io/v1alpha1, YAML or JSON).
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Read Services, EndpointSlices and Nodes from this YAML file or directory (watched).
    #[arg(long, value_name = "PATH")]
    pub manifests: Option<PathBuf>,
    /// kubeconfig file for the API server (default: in-cluster service account, or
    /// $KUBECONFIG / ~/.kube/config when present).
    #[arg(long, value_name = "FILE")]
    pub kubeconfig: Option<PathBuf>,
    /// The API server's address (overrides the kubeconfig). Point it at the real API server:
    /// the `kubernetes` ClusterIP is programmed by this proxy itself.
    #[arg(long, value_name = "URL")]
    pub master: Option<String>,
    /// This node's name (default: the kernel's hostname).
    #[arg(long, value_name = "NAME")]
    pub hostname_override: Option<String>,
    /// Pod CIDRs of the cluster, comma-separated, both families allowed.
    #[arg(long, value_name = "CIDRS")]
    pub cluster_cidr: Option<String>,
    /// The cluster's service CIDRs, comma-separated, for clusters without ServiceCIDR
    /// objects (before Kubernetes 1.33, or manifests without them): new connections to
    /// addresses inside them that no Service owns are dropped. Added to those of ServiceCIDR
    /// objects. Ours: upstream learns them from ServiceCIDR objects only.
    #[arg(long, value_name = "CIDRS")]
    pub service_cidrs: Option<String>,
    /// How to tell local pod traffic apart: ClusterCIDR, NodeCIDR, BridgeInterface or
    /// InterfaceNamePrefix.
    #[arg(long, value_name = "MODE")]
    pub detect_local_mode: Option<String>,
    /// The pods' bridge, for `--detect-local-mode BridgeInterface`.
    #[arg(long, value_name = "NAME")]
    pub pod_bridge_interface: Option<String>,
    /// The pods' interface name prefix, for `--detect-local-mode InterfaceNamePrefix`.
    #[arg(long, value_name = "PREFIX")]
    pub pod_interface_name_prefix: Option<String>,
    /// Addresses that accept NodePorts: comma-separated CIDRs, or `primary`.
    #[arg(long, value_name = "CIDRS")]
    pub nodeport_addresses: Option<String>,
    /// Masquerade all traffic sent to ClusterIPs.
    #[arg(long)]
    pub masquerade_all: bool,
    /// Bit of the packet mark used to request masquerading (0-31).
    #[arg(long, value_name = "BIT")]
    pub masquerade_bit: Option<u8>,
    /// Longest interval between two syncs when nothing changes (e.g. 30s, 1m).
    #[arg(long, value_name = "DURATION")]
    pub sync_period: Option<String>,
    /// Shortest interval between syncs; changes arriving faster are batched.
    #[arg(long, value_name = "DURATION")]
    pub min_sync_period: Option<String>,
    /// How often the watchers' state is re-published (upstream's informer resync period).
    #[arg(long, value_name = "DURATION")]
    pub config_sync_period: Option<String>,
    /// Proxy mode: nftables, ipvs or userspace.
    #[arg(long, value_name = "MODE")]
    pub proxy_mode: Option<String>,
    /// IPVS mode: scheduler of every virtual server (rr, wrr, lc, wlc, sh, mh, …).
    #[arg(long, value_name = "NAME")]
    pub ipvs_scheduler: Option<String>,
    /// IPVS mode: longest interval between syncs (overrides --sync-period).
    #[arg(long, value_name = "DURATION")]
    pub ipvs_sync_period: Option<String>,
    /// IPVS mode: shortest interval between syncs (overrides --min-sync-period).
    #[arg(long, value_name = "DURATION")]
    pub ipvs_min_sync_period: Option<String>,
    /// IPVS mode: virtual servers in these CIDRs are never deleted by us (comma-separated).
    #[arg(long, value_name = "CIDRS")]
    pub ipvs_exclude_cidrs: Option<String>,
    /// IPVS mode: set arp_ignore=1 and arp_announce=2 so only real interfaces answer ARP.
    #[arg(long)]
    pub ipvs_strict_arp: bool,
    /// IPVS mode: idle timeout of TCP connections (0: leave the kernel's).
    #[arg(long, value_name = "DURATION")]
    pub ipvs_tcp_timeout: Option<String>,
    /// IPVS mode: timeout of TCP connections after FIN (0: leave the kernel's).
    #[arg(long, value_name = "DURATION")]
    pub ipvs_tcpfin_timeout: Option<String>,
    /// IPVS mode: timeout of UDP flows (0: leave the kernel's).
    #[arg(long, value_name = "DURATION")]
    pub ipvs_udp_timeout: Option<String>,
    /// Name of our nftables table in the ip and ip6 families.
    #[arg(long, value_name = "NAME")]
    pub nftables_table: Option<String>,
    /// Address of the /healthz and /livez server.
    #[arg(long, value_name = "ADDR")]
    pub healthz_bind_address: Option<String>,
    /// Address of the /metrics server.
    #[arg(long, value_name = "ADDR")]
    pub metrics_bind_address: Option<String>,
    /// Serve NodePorts on 127.0.0.1 too, through a userspace proxy (nftables DNAT cannot
    /// reach loopback without route_localnet).
    #[arg(long)]
    pub localhost_nodeports: bool,
    /// Do not delete stale UDP/SCTP conntrack entries after syncs (for diagnosis only: clients
    /// of a removed endpoint then keep sending into the void).
    #[arg(long)]
    pub no_conntrack_cleanup: bool,
    /// Value written to /proc/self/oom_score_adj at start-up (-1000 to 1000).
    #[arg(long, value_name = "N", allow_hyphen_values = true)]
    pub oom_score_adj: Option<i32>,
    /// Write the effective configuration as a KubeProxyConfiguration file and exit.
    #[arg(long, value_name = "FILE")]
    pub write_config_to: Option<PathBuf>,
    /// Log format: text or json.
    #[arg(long, value_name = "FORMAT")]
    pub logging_format: Option<String>,
    /// Log verbosity as kube-proxy users know it: 0-1 info, 2-3 debug, 4+ trace (RUST_LOG
    /// overrides).
    #[arg(short = 'v', long = "v", value_name = "N")]
    pub verbosity: Option<u8>,
    /// Remove our tables from the kernel and exit.
    #[arg(long)]
    pub cleanup: bool,
    /// Do one full sync and exit.
    #[arg(long)]
    pub once: bool,
    /// Print the ruleset that would be programmed and exit, touching nothing.
    #[arg(long)]
    pub dry_run: bool,
}

/// The proxy mode.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProxyMode {
    Nftables,
    Ipvs,
    Userspace,
}

impl ProxyMode {
    pub fn name(self) -> &'static str {
        match self {
            ProxyMode::Nftables => "nftables",
            ProxyMode::Ipvs => "ipvs",
            ProxyMode::Userspace => "userspace",
        }
    }
}

/// The effective, validated configuration.
#[derive(Debug, Clone)]
pub struct Config {
    pub manifests: Option<PathBuf>,
    pub kubeconfig: Option<PathBuf>,
    pub master: Option<String>,
    pub node_name: String,
    pub mode: ProxyMode,
    pub proxier: ProxierConfig,
    /// IPVS mode settings (used with `ProxyMode::Ipvs`).
    pub ipvs: crate::modes::ipvs::plan::IpvsConfig,
    pub sync_period: Duration,
    pub min_sync_period: Duration,
    pub config_sync_period: Duration,
    pub healthz_bind_address: SocketAddr,
    pub metrics_bind_address: SocketAddr,
    pub cleanup: bool,
    pub once: bool,
    pub dry_run: bool,
    pub conntrack_cleanup: bool,
    pub conntrack: ConntrackConfig,
    pub json_logs: bool,
    pub localhost_nodeports: bool,
    pub oom_score_adj: i32,
    pub write_config_to: Option<PathBuf>,
    /// The `--config` file, watched: when it changes the daemon exits so that it is
    /// restarted with the new file (kube-proxy's behaviour).
    pub config_path: Option<PathBuf>,
    /// The bytes the configuration was read from: the file watcher compares against them,
    /// so an edit made at any time after loading is noticed.
    pub config_bytes: Option<Vec<u8>>,
    /// Default log filter (`info`, `debug`, `trace`).
    pub log_level: &'static str,
    /// Settings from the file that were not understood, to be logged.
    pub warnings: Vec<String>,
    /// Detect-local mode and the CIDRs it was given (NodeCIDR resolves once the Node is known).
    pub detect_local: DetectLocal,
}

pub use crate::proxy::DetectLocal;

/// A configuration error: one line naming the flag or field.
#[derive(Debug, thiserror::Error)]
#[error("invalid {what}: {why}")]
pub struct ConfigError {
    pub what: String,
    pub why: String,
}

fn bad(what: &str, why: impl Into<String>) -> ConfigError {
    ConfigError {
        what: what.into(),
        why: why.into(),
    }
}

/// Parses a duration as Go's `time.ParseDuration` does (`30s`, `1m30s`, `500ms`, `1h`);
/// overflow and negative values are errors, never a panic.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let ns = duration::parse(s.trim()).map_err(|e| e.to_string())?;
    u64::try_from(ns)
        .map(Duration::from_nanos)
        .map_err(|_| format!("{s:?}: must not be negative"))
}

fn parse_cidrs(what: &str, s: &str) -> Result<Vec<Cidr>, ConfigError> {
    s.split(',')
        .map(str::trim)
        .filter(|x| !x.is_empty())
        .map(|x| x.parse::<Cidr>().map_err(|e| bad(what, e)))
        .collect()
}

fn parse_addr(what: &str, s: &str) -> Result<SocketAddr, ConfigError> {
    // Upstream accepts a bare IP (port defaulted) or IP:port.
    if let Ok(a) = s.parse::<SocketAddr>() {
        return Ok(a);
    }
    Err(bad(what, format!("{s:?} is not IP:port")))
}

/// Values read from a KubeProxyConfiguration file.
#[derive(Debug, Default)]
struct FileConfig {
    hostname_override: Option<String>,
    cluster_cidr: Option<String>,
    detect_local_mode: Option<String>,
    nodeport_addresses: Option<Vec<String>>,
    masquerade_all: Option<bool>,
    masquerade_bit: Option<u8>,
    localhost_nodeports: Option<bool>,
    sync_period: Option<String>,
    min_sync_period: Option<String>,
    config_sync_period: Option<String>,
    mode: Option<String>,
    table: Option<String>,
    healthz: Option<String>,
    metrics: Option<String>,
    kubeconfig: Option<String>,
    oom_score_adj: Option<i32>,
    bridge_interface: Option<String>,
    interface_name_prefix: Option<String>,
    conntrack: ConntrackConfig,
    ipvs: FileIpvs,
    warnings: Vec<String>,
}

/// The `ipvs` section of a KubeProxyConfiguration.
#[derive(Debug, Default)]
struct FileIpvs {
    scheduler: Option<String>,
    sync_period: Option<String>,
    min_sync_period: Option<String>,
    exclude_cidrs: Option<Vec<String>>,
    strict_arp: Option<bool>,
    tcp_timeout: Option<String>,
    tcp_fin_timeout: Option<String>,
    udp_timeout: Option<String>,
}

fn as_str(v: &Value) -> Option<String> {
    match v {
        Value::String(s) => Some(s.clone()),
        Value::Number(n) => Some(n.to_string()),
        _ => None,
    }
}

/// The one KubeProxyConfiguration version read (and written).
pub const API_VERSION: &str = "kubeproxy.config.k8s.io/v1alpha1";

fn parse_file(text: &str, path: &str) -> Result<FileConfig, ConfigError> {
    let what = format!("config file {path}");
    if let Err(line) = crate::source::yaml::check_depth(text) {
        return Err(bad(
            &what,
            format!(
                "line {line}: nests deeper than {} levels",
                crate::source::yaml::MAX_DEPTH
            ),
        ));
    }
    let v: Value = serde_yaml::from_str(text).map_err(|e| bad(&what, e.to_string()))?;
    let Value::Mapping(m) = v else {
        return Err(bad(&what, "not a mapping"));
    };
    let mut fc = FileConfig::default();
    let kind = m.get("kind").and_then(as_str);
    if kind.as_deref() != Some("KubeProxyConfiguration") {
        return Err(bad(&what, "kind is not KubeProxyConfiguration"));
    }
    // Upstream decodes strictly by group/version: a missing or other apiVersion is an error.
    match m.get("apiVersion").and_then(as_str).as_deref() {
        Some(API_VERSION) => {}
        None => {
            return Err(bad(
                &format!("{what} field apiVersion"),
                format!("missing (use {API_VERSION})"),
            ))
        }
        Some(other) => {
            return Err(bad(
                &format!("{what} field apiVersion"),
                format!("{other:?} is not supported (use {API_VERSION})"),
            ))
        }
    }
    let field_err = |f: &str| bad(&format!("{what} field {f}"), "wrong type");
    // A boolean field: `true` or `false`, nothing else (upstream's decoder rejects the rest).
    let bool_field = |f: &str, v: &Value| -> Result<Option<bool>, ConfigError> {
        match v {
            Value::Null => Ok(None),
            Value::Bool(b) => Ok(Some(*b)),
            _ => Err(bad(&format!("{what} field {f}"), "not true or false")),
        }
    };
    // A duration field, checked here so that an error names the field, not a flag.
    let dur_field = |f: &str, v: &Value| -> Result<Option<String>, ConfigError> {
        match v {
            Value::Null => Ok(None),
            v => {
                let s = as_str(v).ok_or_else(|| field_err(f))?;
                parse_duration(&s).map_err(|e| bad(&format!("{what} field {f}"), e))?;
                Ok(Some(s))
            }
        }
    };
    for (k, val) in &m {
        let Some(key) = k.as_str() else { continue };
        match key {
            "apiVersion" | "kind" => {}
            "hostnameOverride" => fc.hostname_override = as_str(val),
            "oomScoreAdj" => {
                fc.oom_score_adj = Some(
                    val.as_i64()
                        .and_then(|v| i32::try_from(v).ok())
                        .ok_or_else(|| field_err(key))?,
                )
            }
            "clusterCIDR" => fc.cluster_cidr = as_str(val),
            "detectLocalMode" => fc.detect_local_mode = as_str(val),
            "mode" => fc.mode = as_str(val),
            "configSyncPeriod" => fc.config_sync_period = dur_field(key, val)?,
            "healthzBindAddress" => fc.healthz = as_str(val),
            "metricsBindAddress" => fc.metrics = as_str(val),
            "nodePortAddresses" => match val {
                Value::Sequence(s) => {
                    fc.nodeport_addresses = Some(s.iter().filter_map(as_str).collect())
                }
                Value::Null => {}
                _ => return Err(field_err(key)),
            },
            "detectLocal" => {
                let Value::Mapping(n) = val else {
                    return Err(field_err(key));
                };
                for (k2, v2) in n {
                    match k2.as_str().unwrap_or("") {
                        "bridgeInterface" => {
                            fc.bridge_interface = as_str(v2).filter(|s| !s.is_empty())
                        }
                        "interfaceNamePrefix" => {
                            fc.interface_name_prefix = as_str(v2).filter(|s| !s.is_empty())
                        }
                        other => fc.warnings.push(format!(
                            "config field detectLocal.{other} is not supported; ignored"
                        )),
                    }
                }
            }
            "clientConnection" => {
                let Value::Mapping(n) = val else {
                    return Err(field_err(key));
                };
                for (k2, v2) in n {
                    match k2.as_str().unwrap_or("") {
                        "kubeconfig" => fc.kubeconfig = as_str(v2).filter(|s| !s.is_empty()),
                        // kube-rs has no client-side rate limiter; the watchers make a handful
                        // of long-lived requests, so these limits are not needed.
                        other @ ("qps" | "burst" | "contentType" | "acceptContentTypes") => {
                            fc.warnings.push(format!(
                                "config field clientConnection.{other} has no effect here; ignored"
                            ))
                        }
                        other => fc.warnings.push(format!(
                            "config field clientConnection.{other} is not supported; ignored"
                        )),
                    }
                }
            }
            "conntrack" => {
                let Value::Mapping(n) = val else {
                    return Err(field_err(key));
                };
                let c = &mut fc.conntrack;
                for (k2, v2) in n {
                    let name = k2.as_str().unwrap_or("");
                    let what = format!("{what} field conntrack.{name}");
                    let dur = |v: &Value| -> Result<Option<Duration>, ConfigError> {
                        match v {
                            Value::Null => Ok(None),
                            v => as_str(v)
                                .ok_or_else(|| bad(&what, "not a duration"))
                                .and_then(|s| {
                                    parse_duration(&s).map(Some).map_err(|e| bad(&what, e))
                                }),
                        }
                    };
                    let int = |v: &Value| -> Result<Option<u32>, ConfigError> {
                        match v {
                            Value::Null => Ok(None),
                            v => v
                                .as_u64()
                                .and_then(|n| u32::try_from(n).ok())
                                .map(Some)
                                .ok_or_else(|| bad(&what, "not a non-negative integer")),
                        }
                    };
                    match name {
                        "maxPerCore" => c.max_per_core = int(v2)?,
                        "min" => c.min = int(v2)?,
                        "tcpEstablishedTimeout" => c.tcp_established_timeout = dur(v2)?,
                        "tcpCloseWaitTimeout" => c.tcp_close_wait_timeout = dur(v2)?,
                        "tcpBeLiberal" => {
                            c.tcp_be_liberal =
                                bool_field("conntrack.tcpBeLiberal", v2)?.unwrap_or(false)
                        }
                        "udpTimeout" => c.udp_timeout = dur(v2)?,
                        "udpStreamTimeout" => c.udp_stream_timeout = dur(v2)?,
                        other => fc.warnings.push(format!(
                            "config field conntrack.{other} is not supported; ignored"
                        )),
                    }
                }
            }
            "ipvs" => {
                let Value::Mapping(n) = val else {
                    return Err(field_err(key));
                };
                let i = &mut fc.ipvs;
                for (k2, v2) in n {
                    match k2.as_str().unwrap_or("") {
                        "scheduler" => i.scheduler = as_str(v2).filter(|s| !s.is_empty()),
                        "syncPeriod" => i.sync_period = dur_field("ipvs.syncPeriod", v2)?,
                        "minSyncPeriod" => i.min_sync_period = dur_field("ipvs.minSyncPeriod", v2)?,
                        "excludeCIDRs" => match v2 {
                            Value::Sequence(s) => {
                                i.exclude_cidrs = Some(s.iter().filter_map(as_str).collect())
                            }
                            Value::Null => {}
                            _ => return Err(field_err("ipvs.excludeCIDRs")),
                        },
                        "strictARP" => i.strict_arp = bool_field("ipvs.strictARP", v2)?,
                        "tcpTimeout" => i.tcp_timeout = dur_field("ipvs.tcpTimeout", v2)?,
                        "tcpFinTimeout" => i.tcp_fin_timeout = dur_field("ipvs.tcpFinTimeout", v2)?,
                        "udpTimeout" => i.udp_timeout = dur_field("ipvs.udpTimeout", v2)?,
                        other => fc.warnings.push(format!(
                            "config field ipvs.{other} is not supported; ignored"
                        )),
                    }
                }
            }
            "nftables" => {
                let Value::Mapping(n) = val else {
                    return Err(field_err(key));
                };
                for (k2, v2) in n {
                    match k2.as_str().unwrap_or("") {
                        "masqueradeBit" => {
                            fc.masquerade_bit = match v2 {
                                Value::Null => None,
                                v => Some(
                                    v.as_u64()
                                        .and_then(|b| u8::try_from(b).ok())
                                        .filter(|b| *b <= 31)
                                        .ok_or_else(|| {
                                            bad(
                                                &format!("{what} field nftables.masqueradeBit"),
                                                "must be an integer from 0 to 31",
                                            )
                                        })?,
                                ),
                            }
                        }
                        "masqueradeAll" => {
                            fc.masquerade_all = bool_field("nftables.masqueradeAll", v2)?
                        }
                        "syncPeriod" => fc.sync_period = dur_field("nftables.syncPeriod", v2)?,
                        "minSyncPeriod" => {
                            fc.min_sync_period = dur_field("nftables.minSyncPeriod", v2)?
                        }
                        "tableName" => fc.table = as_str(v2),
                        "localhostNodePorts" => {
                            fc.localhost_nodeports = bool_field("nftables.localhostNodePorts", v2)?
                        }
                        other => fc.warnings.push(format!(
                            "config field nftables.{other} is not supported; ignored"
                        )),
                    }
                }
            }
            other => fc
                .warnings
                .push(format!("config field {other} is not supported; ignored")),
        }
    }
    Ok(fc)
}

fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_lowercase())
        .unwrap_or_default()
}

impl Config {
    /// Merges flags over the config file (if any) and validates everything.
    pub fn from_flags(f: Flags) -> Result<Config, ConfigError> {
        let mut config_bytes = None;
        let fc = match &f.config {
            Some(p) => {
                let bytes = std::fs::read(p)
                    .map_err(|e| bad("--config", format!("{}: {e}", p.display())))?;
                let text = String::from_utf8(bytes.clone()).map_err(|e| {
                    bad(
                        &format!("config file {}", p.display()),
                        format!("not UTF-8 (byte {})", e.utf8_error().valid_up_to()),
                    )
                })?;
                config_bytes = Some(bytes);
                parse_file(&text, &p.display().to_string())?
            }
            None => FileConfig::default(),
        };
        let mode = match f.proxy_mode.clone().or(fc.mode.clone()).as_deref() {
            None | Some("") | Some("nftables") => ProxyMode::Nftables,
            Some("ipvs") => ProxyMode::Ipvs,
            Some("userspace") => ProxyMode::Userspace,
            Some(m) => {
                return Err(bad(
                    "--proxy-mode",
                    format!("unknown mode {m:?} (nftables, ipvs, userspace)"),
                ))
            }
        };
        let node_name = f
            .hostname_override
            .clone()
            .or(fc.hostname_override)
            .filter(|s| !s.trim().is_empty())
            .map(|s| s.trim().to_lowercase())
            .unwrap_or_else(hostname);
        if node_name.is_empty() {
            return Err(bad("--hostname-override", "empty node name"));
        }
        let service_cidrs = match &f.service_cidrs {
            Some(s) if !s.trim().is_empty() => parse_cidrs("--service-cidrs", s)?,
            _ => Vec::new(),
        };
        let cluster_cidrs = match f.cluster_cidr.clone().or(fc.cluster_cidr) {
            Some(s) => parse_cidrs("--cluster-cidr", &s)?,
            None => vec![],
        };
        let detect_local = match f
            .detect_local_mode
            .clone()
            .or(fc.detect_local_mode)
            .as_deref()
        {
            None | Some("") | Some("ClusterCIDR") => {
                DetectLocal::ClusterCidr(cluster_cidrs.clone())
            }
            Some("NodeCIDR") => DetectLocal::NodeCidr,
            Some("BridgeInterface") => DetectLocal::BridgeInterface(
                f.pod_bridge_interface
                    .clone()
                    .or(fc.bridge_interface.clone())
                    .filter(|n| valid_ifname(n))
                    .ok_or_else(|| bad("--pod-bridge-interface", "BridgeInterface mode needs a valid interface name"))?,
            ),
            Some("InterfaceNamePrefix") => DetectLocal::InterfaceNamePrefix(
                f.pod_interface_name_prefix
                    .clone()
                    .or(fc.interface_name_prefix.clone())
                    .filter(|n| valid_ifname(n))
                    .ok_or_else(|| bad("--pod-interface-name-prefix", "InterfaceNamePrefix mode needs a valid interface name prefix"))?,
            ),
            Some(m) => {
                return Err(bad(
                    "--detect-local-mode",
                    format!("unknown mode {m:?} (ClusterCIDR, NodeCIDR, BridgeInterface, InterfaceNamePrefix)"),
                ))
            }
        };
        let np = match (f.nodeport_addresses.clone(), fc.nodeport_addresses) {
            (Some(s), _) => s.split(',').map(|x| x.trim().to_string()).collect(),
            (None, Some(v)) => v,
            (None, None) => vec![],
        };
        let nodeport_addresses = if np.iter().all(|s| s.is_empty()) {
            NodePortAddresses::All
        } else if np.iter().any(|s| s == "primary") {
            if np.len() > 1 {
                return Err(bad(
                    "--nodeport-addresses",
                    "`primary` cannot be mixed with CIDRs",
                ));
            }
            NodePortAddresses::Primary
        } else {
            NodePortAddresses::Cidrs(parse_cidrs("--nodeport-addresses", &np.join(","))?)
        };
        let masquerade_bit = f.masquerade_bit.or(fc.masquerade_bit).unwrap_or(14);
        if masquerade_bit > 31 {
            return Err(bad(
                "--masquerade-bit",
                format!("{masquerade_bit} is not in 0-31"),
            ));
        }
        let dur =
            |what: &str, v: Option<String>, default: Duration| -> Result<Duration, ConfigError> {
                match v {
                    Some(s) => parse_duration(&s).map_err(|e| bad(what, e)),
                    None => Ok(default),
                }
            };
        let ipvs_mode = mode == ProxyMode::Ipvs;
        let sync_period = match (
            ipvs_mode,
            f.ipvs_sync_period.clone().or(fc.ipvs.sync_period.clone()),
        ) {
            (true, Some(s)) => dur("--ipvs-sync-period", Some(s), Duration::ZERO)?,
            _ => dur(
                "--sync-period",
                f.sync_period.clone().or(fc.sync_period),
                Duration::from_secs(30),
            )?,
        };
        let min_sync_period = match (
            ipvs_mode,
            f.ipvs_min_sync_period
                .clone()
                .or(fc.ipvs.min_sync_period.clone()),
        ) {
            (true, Some(s)) => dur("--ipvs-min-sync-period", Some(s), Duration::ZERO)?,
            _ => dur(
                "--min-sync-period",
                f.min_sync_period.clone().or(fc.min_sync_period),
                Duration::from_secs(1),
            )?,
        };
        let ipvs = ipvs_config(&f, &fc.ipvs)?;
        let config_sync_period = dur(
            "--config-sync-period",
            f.config_sync_period.clone().or(fc.config_sync_period),
            Duration::from_secs(15 * 60),
        )?;
        if config_sync_period.is_zero() {
            return Err(bad("--config-sync-period", "must be greater than 0"));
        }
        if sync_period.is_zero() {
            return Err(bad("--sync-period", "must be greater than 0"));
        }
        if min_sync_period > sync_period {
            return Err(bad("--min-sync-period", "must not exceed --sync-period"));
        }
        let healthz_bind_address = parse_addr(
            "--healthz-bind-address",
            &f.healthz_bind_address
                .clone()
                .or(fc.healthz)
                .unwrap_or_else(|| "0.0.0.0:10256".into()),
        )?;
        let metrics_bind_address = parse_addr(
            "--metrics-bind-address",
            &f.metrics_bind_address
                .clone()
                .or(fc.metrics)
                .unwrap_or_else(|| "127.0.0.1:10249".into()),
        )?;
        let table = f
            .nftables_table
            .clone()
            .or(fc.table)
            .unwrap_or_else(|| match mode {
                ProxyMode::Nftables | ProxyMode::Userspace => names::DEFAULT_TABLE.into(),
                ProxyMode::Ipvs => crate::modes::ipvs::table::DEFAULT_TABLE.into(),
            });
        if table.is_empty()
            || table.len() > 200
            || !table
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
        {
            return Err(bad(
                "--nftables-table",
                format!("{table:?} is not a valid table name"),
            ));
        }
        let json_logs = match f.logging_format.as_deref() {
            None | Some("text") => false,
            Some("json") => true,
            Some(o) => {
                return Err(bad(
                    "--logging-format",
                    format!("unknown format {o:?} (text, json)"),
                ))
            }
        };
        let local_detector = match &detect_local {
            DetectLocal::ClusterCidr(c) if !c.is_empty() => LocalDetector::Cidrs(c.clone()),
            DetectLocal::BridgeInterface(b) => LocalDetector::Bridge(b.clone()),
            DetectLocal::InterfaceNamePrefix(p) => LocalDetector::InterfacePrefix(p.clone()),
            _ => LocalDetector::None,
        };
        let master = f.master.clone();
        if let Some(m) = &master {
            if !(m.starts_with("http://") || m.starts_with("https://")) {
                return Err(bad("--master", format!("{m:?} is not an http(s) URL")));
            }
        }
        let oom_score_adj = f.oom_score_adj.or(fc.oom_score_adj).unwrap_or(-999);
        if !(-1000..=1000).contains(&oom_score_adj) {
            return Err(bad(
                "--oom-score-adj",
                format!("{oom_score_adj} is not in -1000..1000"),
            ));
        }
        Ok(Config {
            oom_score_adj,
            write_config_to: f.write_config_to.clone(),
            config_path: f.config.clone(),
            config_bytes,
            manifests: f.manifests,
            kubeconfig: f.kubeconfig.clone().or(fc.kubeconfig.map(PathBuf::from)),
            master,
            node_name,
            mode,
            ipvs,
            proxier: ProxierConfig {
                table,
                masquerade_bit,
                masquerade_all: f.masquerade_all || fc.masquerade_all.unwrap_or(false),
                local_detector,
                nodeport_addresses,
                service_cidrs,
            },
            sync_period,
            min_sync_period,
            config_sync_period,
            healthz_bind_address,
            metrics_bind_address,
            cleanup: f.cleanup,
            once: f.once,
            dry_run: f.dry_run,
            conntrack_cleanup: !f.no_conntrack_cleanup,
            json_logs,
            localhost_nodeports: f.localhost_nodeports || fc.localhost_nodeports.unwrap_or(false),
            log_level: match f.verbosity.unwrap_or(0) {
                0 | 1 => "info",
                2 | 3 => "debug",
                _ => "trace",
            },
            conntrack: fc.conntrack,
            warnings: fc.warnings,
            detect_local,
        })
    }
}

/// The IPVS settings from flags over the file's `ipvs` section.
fn ipvs_config(
    f: &Flags,
    fc: &FileIpvs,
) -> Result<crate::modes::ipvs::plan::IpvsConfig, ConfigError> {
    use crate::modes::ipvs::plan::{IpvsConfig, SCHEDULERS};
    let mut c = IpvsConfig::default();
    if let Some(s) = f.ipvs_scheduler.clone().or(fc.scheduler.clone()) {
        if !SCHEDULERS.contains(&s.as_str()) {
            return Err(bad(
                "--ipvs-scheduler",
                format!("unknown scheduler {s:?} ({})", SCHEDULERS.join(", ")),
            ));
        }
        c.scheduler = s;
    }
    c.exclude_cidrs = match (&f.ipvs_exclude_cidrs, &fc.exclude_cidrs) {
        (Some(s), _) => parse_cidrs("--ipvs-exclude-cidrs", s)?,
        (None, Some(v)) => parse_cidrs("--ipvs-exclude-cidrs", &v.join(","))?,
        (None, None) => vec![],
    };
    c.strict_arp = f.ipvs_strict_arp || fc.strict_arp.unwrap_or(false);
    let secs = |what: &str, v: Option<String>| -> Result<u32, ConfigError> {
        let d = match v {
            Some(s) => parse_duration(&s).map_err(|e| bad(what, e))?,
            None => Duration::ZERO,
        };
        u32::try_from(d.as_secs()).map_err(|_| bad(what, "too long"))
    };
    c.tcp_timeout = secs(
        "--ipvs-tcp-timeout",
        f.ipvs_tcp_timeout.clone().or(fc.tcp_timeout.clone()),
    )?;
    c.tcp_fin_timeout = secs(
        "--ipvs-tcpfin-timeout",
        f.ipvs_tcpfin_timeout.clone().or(fc.tcp_fin_timeout.clone()),
    )?;
    c.udp_timeout = secs(
        "--ipvs-udp-timeout",
        f.ipvs_udp_timeout.clone().or(fc.udp_timeout.clone()),
    )?;
    Ok(c)
}

/// An interface name: 1 to 15 bytes, no '/', whitespace or NUL.
fn valid_ifname(n: &str) -> bool {
    !n.is_empty()
        && n.len() < 16
        && !n
            .chars()
            .any(|c| c == '/' || c.is_whitespace() || c == '\0')
}

/// A duration as Go prints it (`15m0s`, `250ms`), which [`parse_duration`] and upstream
/// read back; beyond Go's range (292 years) it saturates.
pub fn format_duration(d: Duration) -> String {
    duration::format(i64::try_from(d.as_nanos()).unwrap_or(i64::MAX))
}

impl Config {
    /// The effective configuration as a KubeProxyConfiguration: what `--write-config-to`
    /// writes and `/configz` serves. Reading it back with `--config` gives the same Config.
    pub fn to_kube_proxy_configuration(&self) -> serde_json::Value {
        use serde_json::json;
        let cidrs = |c: &[Cidr]| {
            c.iter()
                .map(|c| c.to_string())
                .collect::<Vec<_>>()
                .join(",")
        };
        let (mode, cluster_cidr) = match &self.detect_local {
            DetectLocal::ClusterCidr(c) => ("ClusterCIDR", cidrs(c)),
            DetectLocal::NodeCidr => ("NodeCIDR", String::new()),
            DetectLocal::BridgeInterface(_) => ("BridgeInterface", String::new()),
            DetectLocal::InterfaceNamePrefix(_) => ("InterfaceNamePrefix", String::new()),
        };
        let np: Vec<String> = match &self.proxier.nodeport_addresses {
            NodePortAddresses::All => vec![],
            NodePortAddresses::Primary => vec!["primary".into()],
            NodePortAddresses::Cidrs(c) => c.iter().map(|c| c.to_string()).collect(),
        };
        let d = |d: Option<Duration>| d.map(format_duration);
        let c = &self.conntrack;
        let mut v = json!({
            "apiVersion": "kubeproxy.config.k8s.io/v1alpha1",
            "kind": "KubeProxyConfiguration",
            "mode": self.mode.name(),
            "hostnameOverride": self.node_name,
            "detectLocalMode": mode,
            "nodePortAddresses": np,
            "healthzBindAddress": self.healthz_bind_address.to_string(),
            "metricsBindAddress": self.metrics_bind_address.to_string(),
            "oomScoreAdj": self.oom_score_adj,
            "configSyncPeriod": format_duration(self.config_sync_period),
            "nftables": {
                "masqueradeBit": self.proxier.masquerade_bit,
                "masqueradeAll": self.proxier.masquerade_all,
                "syncPeriod": format_duration(self.sync_period),
                "minSyncPeriod": format_duration(self.min_sync_period),
                "tableName": self.proxier.table,
                "localhostNodePorts": self.localhost_nodeports,
            },
            "conntrack": {
                "maxPerCore": c.max_per_core,
                "min": c.min,
                "tcpEstablishedTimeout": d(c.tcp_established_timeout),
                "tcpCloseWaitTimeout": d(c.tcp_close_wait_timeout),
                "tcpBeLiberal": c.tcp_be_liberal,
                "udpTimeout": d(c.udp_timeout),
                "udpStreamTimeout": d(c.udp_stream_timeout),
            },
        });
        if !cluster_cidr.is_empty() {
            v["clusterCIDR"] = json!(cluster_cidr);
        }
        if self.mode == ProxyMode::Ipvs {
            let i = &self.ipvs;
            let secs = |n: u32| format_duration(Duration::from_secs(n.into()));
            v["ipvs"] = json!({
                "scheduler": i.scheduler,
                "syncPeriod": format_duration(self.sync_period),
                "minSyncPeriod": format_duration(self.min_sync_period),
                "excludeCIDRs": i.exclude_cidrs.iter().map(|c| c.to_string()).collect::<Vec<_>>(),
                "strictARP": i.strict_arp,
                "tcpTimeout": secs(i.tcp_timeout),
                "tcpFinTimeout": secs(i.tcp_fin_timeout),
                "udpTimeout": secs(i.udp_timeout),
            });
        }
        match &self.detect_local {
            DetectLocal::BridgeInterface(b) => v["detectLocal"] = json!({"bridgeInterface": b}),
            DetectLocal::InterfaceNamePrefix(p) => {
                v["detectLocal"] = json!({"interfaceNamePrefix": p})
            }
            _ => {}
        }
        if let Some(k) = &self.kubeconfig {
            v["clientConnection"] = json!({"kubeconfig": k.display().to_string()});
        }
        v
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn flags(args: &[&str]) -> Flags {
        let mut v = vec!["kube-nlproxy"];
        v.extend(args);
        Flags::parse_from(v)
    }

    #[test]
    fn written_config_round_trips() {
        let c = Config::from_flags(flags(&[
            "--hostname-override",
            "n1",
            "--cluster-cidr",
            "10.244.0.0/16,fd00::/48",
            "--nodeport-addresses",
            "192.168.0.0/24",
            "--masquerade-bit",
            "9",
            "--min-sync-period",
            "250ms",
            "--oom-score-adj",
            "-500",
        ]))
        .unwrap();
        let dir = std::env::temp_dir().join(format!("nlp-rt-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join("c.yaml");
        std::fs::write(
            &p,
            serde_yaml::to_string(&c.to_kube_proxy_configuration()).unwrap(),
        )
        .unwrap();
        let back = Config::from_flags(flags(&["--config", p.to_str().unwrap()])).unwrap();
        assert!(back.warnings.is_empty(), "{:?}", back.warnings);
        assert_eq!(
            back.to_kube_proxy_configuration(),
            c.to_kube_proxy_configuration()
        );
        assert_eq!(back.proxier, c.proxier);
        assert_eq!(back.min_sync_period, Duration::from_millis(250));
        assert_eq!(back.oom_score_adj, -500);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn verbosity_and_log_format() {
        let lvl = |v: &str| {
            Config::from_flags(flags(&["--hostname-override", "n", "-v", v]))
                .unwrap()
                .log_level
        };
        assert_eq!((lvl("0"), lvl("2"), lvl("4")), ("info", "debug", "trace"));
        let c = Config::from_flags(flags(&[
            "--hostname-override",
            "n",
            "--logging-format",
            "json",
        ]))
        .unwrap();
        assert!(c.json_logs);
        let e = Config::from_flags(flags(&[
            "--hostname-override",
            "n",
            "--logging-format",
            "xml",
        ]))
        .unwrap_err();
        assert!(e.to_string().contains("--logging-format"), "{e}");
    }

    #[test]
    fn durations() {
        assert_eq!(parse_duration("30s").unwrap(), Duration::from_secs(30));
        assert_eq!(parse_duration("1m30s").unwrap(), Duration::from_secs(90));
        assert_eq!(parse_duration("250ms").unwrap(), Duration::from_millis(250));
        assert!(parse_duration("10").is_err());
        assert!(parse_duration("5x").is_err());
    }

    #[test]
    fn defaults_match_upstream() {
        let c = Config::from_flags(flags(&["--hostname-override", "Node1"])).unwrap();
        assert_eq!(c.node_name, "node1");
        assert_eq!(c.sync_period, Duration::from_secs(30));
        assert_eq!(c.min_sync_period, Duration::from_secs(1));
        assert_eq!(c.proxier.masquerade_mark(), 0x4000);
        assert_eq!(c.healthz_bind_address.to_string(), "0.0.0.0:10256");
        assert_eq!(c.metrics_bind_address.to_string(), "127.0.0.1:10249");
        assert_eq!(c.proxier.local_detector, LocalDetector::None);
    }

    #[test]
    fn bad_values_name_the_flag() {
        let e = Config::from_flags(flags(&[
            "--hostname-override",
            "n",
            "--cluster-cidr",
            "10.0.0.0/99",
        ]))
        .unwrap_err();
        assert!(e.to_string().starts_with("invalid --cluster-cidr"), "{e}");
        let e = Config::from_flags(flags(&[
            "--hostname-override",
            "n",
            "--masquerade-bit",
            "40",
        ]))
        .unwrap_err();
        assert!(e.to_string().contains("--masquerade-bit"), "{e}");
        let e = Config::from_flags(flags(&[
            "--hostname-override",
            "n",
            "--proxy-mode",
            "iptables",
        ]))
        .unwrap_err();
        assert!(e.to_string().contains("--proxy-mode"), "{e}");
    }

    #[test]
    fn ipvs_section_flags_and_round_trip() {
        let dir = std::env::temp_dir().join(format!("nlp-ipvs-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join("c.yaml");
        std::fs::write(
            &p,
            concat!(
                "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\n",
                "mode: ipvs\nipvs:\n  scheduler: wlc\n  syncPeriod: 20s\n  minSyncPeriod: 2s\n",
                "  excludeCIDRs: [10.200.0.0/16]\n  strictARP: true\n  tcpTimeout: 900s\n",
                "  tcpFinTimeout: 120s\n  udpTimeout: 300s\n",
            ),
        )
        .unwrap();
        let c = Config::from_flags(flags(&[
            "--hostname-override",
            "n",
            "--config",
            p.to_str().unwrap(),
        ]))
        .unwrap();
        assert!(c.warnings.is_empty(), "{:?}", c.warnings);
        assert_eq!(c.mode, ProxyMode::Ipvs);
        assert_eq!(c.ipvs.scheduler, "wlc");
        assert_eq!(c.sync_period, Duration::from_secs(20));
        assert_eq!(c.min_sync_period, Duration::from_secs(2));
        assert_eq!(c.ipvs.exclude_cidrs, vec!["10.200.0.0/16".parse().unwrap()]);
        assert!(c.ipvs.strict_arp);
        assert_eq!(
            (
                c.ipvs.tcp_timeout,
                c.ipvs.tcp_fin_timeout,
                c.ipvs.udp_timeout
            ),
            (900, 120, 300)
        );
        assert_eq!(c.proxier.table, "kube-nlproxy-ipvs");
        // Flags override the file.
        let f = Config::from_flags(flags(&[
            "--hostname-override",
            "n",
            "--config",
            p.to_str().unwrap(),
            "--ipvs-scheduler",
            "sh",
            "--ipvs-sync-period",
            "45s",
        ]))
        .unwrap();
        assert_eq!(
            (f.ipvs.scheduler.as_str(), f.sync_period),
            ("sh", Duration::from_secs(45))
        );
        // --write-config-to output reads back to the same configuration.
        let out = dir.join("out.yaml");
        std::fs::write(
            &out,
            serde_yaml::to_string(&c.to_kube_proxy_configuration()).unwrap(),
        )
        .unwrap();
        let back = Config::from_flags(flags(&["--config", out.to_str().unwrap()])).unwrap();
        assert_eq!(
            back.to_kube_proxy_configuration(),
            c.to_kube_proxy_configuration()
        );
        assert_eq!(back.ipvs, c.ipvs);
        // An unknown scheduler names the flag.
        let e = Config::from_flags(flags(&[
            "--hostname-override",
            "n",
            "--ipvs-scheduler",
            "fastest",
        ]))
        .unwrap_err();
        assert!(
            e.to_string().contains("--ipvs-scheduler") && e.to_string().contains("wlc"),
            "{e}"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn modes() {
        let m = |v: &str| {
            Config::from_flags(flags(&["--hostname-override", "n", "--proxy-mode", v]))
                .unwrap()
                .mode
        };
        assert_eq!(m("nftables"), ProxyMode::Nftables);
        assert_eq!(m("ipvs"), ProxyMode::Ipvs);
        assert_eq!(m("userspace"), ProxyMode::Userspace);
    }

    #[test]
    fn file_values_apply_and_flags_override() {
        let dir = std::env::temp_dir().join(format!("nlp-cfg-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join("c.yaml");
        std::fs::write(
            &p,
            "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\n\
             clusterCIDR: 10.244.0.0/16\nnodePortAddresses: [primary]\n\
             nftables:\n  masqueradeBit: 10\n  syncPeriod: 10s\nfeatureGates: {}\n\
             conntrack:\n  maxPerCore: 0\n  tcpBeLiberal: true\n  udpTimeout: 30s\n",
        )
        .unwrap();
        let c = Config::from_flags(flags(&[
            "--config",
            p.to_str().unwrap(),
            "--hostname-override",
            "n",
            "--masquerade-bit",
            "12",
        ]))
        .unwrap();
        assert_eq!(c.proxier.masquerade_bit, 12);
        assert_eq!(c.sync_period, Duration::from_secs(10));
        assert_eq!(c.proxier.nodeport_addresses, NodePortAddresses::Primary);
        assert_eq!(
            c.proxier.local_detector,
            LocalDetector::Cidrs(vec!["10.244.0.0/16".parse().unwrap()])
        );
        assert_eq!(c.conntrack.max_per_core, Some(0));
        assert!(c.conntrack.tcp_be_liberal);
        assert_eq!(c.conntrack.udp_timeout, Some(Duration::from_secs(30)));
        assert_eq!(c.warnings.len(), 1);
        assert!(c.warnings[0].contains("featureGates"));
    }

    #[test]
    fn wrong_types_and_ranges_in_the_file_name_the_field() {
        let hdr = "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\n";
        for (body, field) in [
            ("nftables: {masqueradeBit: abc}", "nftables.masqueradeBit"),
            ("nftables: {masqueradeBit: -1}", "nftables.masqueradeBit"),
            ("nftables: {masqueradeBit: 300}", "nftables.masqueradeBit"),
            ("nftables: {masqueradeBit: 32}", "nftables.masqueradeBit"),
            (
                "nftables: {masqueradeAll: yes-please}",
                "nftables.masqueradeAll",
            ),
            (
                "nftables: {localhostNodePorts: 1}",
                "nftables.localhostNodePorts",
            ),
            ("ipvs: {strictARP: maybe}", "ipvs.strictARP"),
            (
                "conntrack: {tcpBeLiberal: \"true\"}",
                "conntrack.tcpBeLiberal",
            ),
        ] {
            let e = parse_file(&format!("{hdr}{body}\n"), "kp.yaml").unwrap_err();
            assert!(
                e.to_string().contains(&format!("field {field}")),
                "{body}: {e}"
            );
        }
        let ok = parse_file(
            &format!("{hdr}nftables: {{masqueradeBit: 31}}\n"),
            "kp.yaml",
        );
        assert_eq!(ok.unwrap().masquerade_bit, Some(31));
    }

    #[test]
    fn api_version_must_be_v1alpha1() {
        for (text, says) in [
            ("kind: KubeProxyConfiguration\n", "missing"),
            (
                "apiVersion: kubeproxy.config.k8s.io/v1alpha2\nkind: KubeProxyConfiguration\n",
                "v1alpha2\" is not supported",
            ),
            (
                "apiVersion: v1\nkind: KubeProxyConfiguration\n",
                "is not supported",
            ),
        ] {
            let e = parse_file(text, "kp.yaml").unwrap_err().to_string();
            assert!(e.contains("field apiVersion") && e.contains(says), "{e}");
        }
    }
}
