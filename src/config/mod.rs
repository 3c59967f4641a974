//! The command line and the KubeProxyConfiguration file, merged as upstream kube-proxy
//! merges them (cmd/kube-proxy/app/options.go `Complete`), validated with upstream's rules,
//! and turned into the one [`Config`] the daemon runs with. With `--config` the file
//! replaces the flag values (a warning names each flag so ignored), except the logging
//! flags and `--hostname-override`; without it the flags apply over upstream's defaults.
//! Errors name the file field when the value came from the file, the flag otherwise.
//! Pure apart from reading the config file.

use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::time::Duration;

pub mod decode;
pub mod duration;
mod flag_defaults;
pub mod flags;
pub mod gates;
mod gates_table;
pub mod internal;
#[cfg(test)]
mod proptests;
pub mod v1alpha1;
pub mod validation;
pub mod yaml_out;

use crate::kernel::conntrack::tuning::ConntrackConfig;
use crate::kernel::nft::Cidr;
use crate::model::Protocol;
use crate::proxy::{
    names, LocalDetector, LoopbackListeners, LoopbackNodePorts, LoopbackPolicy, NodePortAddresses,
    ProxierConfig,
};
use flags::{Parsed, Target};
use internal::KubeProxyConfig;
use v1alpha1::GoDuration;

pub use crate::proxy::DetectLocal;
pub use v1alpha1::API_VERSION;

/// The proxy mode that runs.
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

/// `kube-nlproxy status` (or `diff`, with `diff`) in place of the daemon: which, and
/// whether to print JSON. Set by the binary, never by a flag of upstream's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StateTool {
    pub diff: bool,
    pub json: bool,
}

/// The effective, validated configuration.
#[derive(Debug, Clone)]
pub struct Config {
    pub manifests: Option<PathBuf>,
    pub kubeconfig: Option<PathBuf>,
    pub master: Option<String>,
    pub node_name: String,
    pub mode: ProxyMode,
    /// The mode as configured (`iptables` for an empty one): what `/proxyMode` answers and
    /// `--write-config-to` writes, so that upstream reads back what it was given.
    pub requested_mode: String,
    /// No mode was configured (upstream warns with a `KubeProxyDefaultMode` event).
    pub mode_defaulted: bool,
    pub proxier: ProxierConfig,
    /// IPVS mode settings (used with `ProxyMode::Ipvs`).
    pub ipvs: crate::modes::ipvs::plan::IpvsConfig,
    pub sync_period: Duration,
    pub min_sync_period: Duration,
    pub config_sync_period: Duration,
    /// `None`: the server is disabled.
    pub healthz_bind_address: Option<SocketAddr>,
    pub metrics_bind_address: Option<SocketAddr>,
    /// A failure to bind either server is fatal (`bindAddressHardFail`).
    pub bind_address_hard_fail: bool,
    pub cleanup: bool,
    pub once: bool,
    pub dry_run: bool,
    pub init_only: bool,
    pub conntrack_cleanup: bool,
    /// `--reset-dead-endpoint-connections` (ours): delete the TCP conntrack entries of
    /// endpoints that died (nftables and iptables modes).
    pub reset_dead_endpoint_connections: bool,
    pub conntrack: ConntrackConfig,
    pub json_logs: bool,
    /// The loopback listeners that forward NodePorts in userspace (none: no forwarder).
    pub localhost_listeners: LoopbackListeners,
    pub oom_score_adj: i32,
    pub write_config_to: Option<PathBuf>,
    /// `kube-nlproxy status` / `diff`: report instead of syncing (set by the binary).
    pub state_tool: Option<StateTool>,
    /// The `--config` file, watched: when it changes the daemon exits so that it is
    /// restarted with the new file (kube-proxy's behaviour).
    pub config_path: Option<PathBuf>,
    /// The bytes the configuration was read from: the file watcher compares against them,
    /// so an edit made at any time after loading is noticed.
    pub config_bytes: Option<Vec<u8>>,
    /// Log verbosity as upstream's `-v`.
    pub verbosity: u32,
    /// Default log filter (`info`, `debug`, `trace`).
    pub log_level: &'static str,
    /// One-line notices for the log (how upstream settings map onto this binary).
    pub notices: Vec<String>,
    /// Settings that were not understood or have no effect, to be logged as warnings.
    pub warnings: Vec<String>,
    /// Detect-local mode and the CIDRs it was given (NodeCIDR resolves once the Node is known).
    pub detect_local: DetectLocal,
    /// The feature gates, resolved as upstream resolves them.
    pub gates: gates::FeatureGates,
    /// Every flag and its value as upstream's `/flagz` lists them (pflag's printing).
    pub flagz: std::collections::BTreeMap<String, String>,
    /// The resolved upstream configuration (internal form): `/configz` and
    /// `--write-config-to` show it in upstream's v1alpha1 shape.
    pub upstream: KubeProxyConfig,
}

/// What the command line asks for.
#[derive(Debug)]
pub enum Command {
    Run(Box<Config>),
    /// `--help`: the binary prints the flags' usage ([`flags::usage`]) with its
    /// subcommands, and exits 0.
    Help,
    /// `--version`: print this and exit 0.
    Print(String),
}

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

/// A duration as Go prints it (`15m0s`, `250ms`), which [`parse_duration`] and upstream
/// read back; beyond Go's range (292 years) it saturates.
pub fn format_duration(d: Duration) -> String {
    duration::format(i64::try_from(d.as_nanos()).unwrap_or(i64::MAX))
}

/// A CIDR as upstream's `ParseCIDRSloppy` reads it (leading zeros allowed, host bits
/// cleared).
fn cidr_sloppy(s: &str) -> Option<Cidr> {
    let (ip, len) = s.trim().split_once('/')?;
    let ip = v1alpha1::parse_ip_sloppy(ip)?;
    Cidr::new(ip, len.parse().ok()?).ok()
}

/// The kernel's host name (upstream's `os.Hostname`), lower-cased.
pub fn host_name() -> String {
    hostname()
}

fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_lowercase())
        .unwrap_or_default()
}

/// An interface name: 1 to 15 bytes, no '/', whitespace or NUL.
fn valid_ifname(n: &str) -> bool {
    !n.is_empty()
        && n.len() < 16
        && !n
            .chars()
            .any(|c| c == '/' || c.is_whitespace() || c == '\0')
}

/// The flag that sets a v1alpha1 field, for error messages (no `--config`).
fn flag_of(field: &str, p: &Parsed) -> String {
    let base = field.split('[').next().unwrap_or(field);
    let ours = |name: &str, upstream: &str| {
        if p.changed(name) {
            format!("--{name}")
        } else {
            format!("--{upstream}")
        }
    };
    match base {
        "iptables.masqueradeBit" => ours("masquerade-bit", "iptables-masquerade-bit"),
        "nftables.masqueradeBit" => "--masquerade-bit".into(),
        "iptables.syncPeriod" | "nftables.syncPeriod" => {
            ours("sync-period", "iptables-sync-period")
        }
        "iptables.minSyncPeriod" | "nftables.minSyncPeriod" => {
            ours("min-sync-period", "iptables-min-sync-period")
        }
        "ipvs.syncPeriod" => ours("sync-period", "ipvs-sync-period"),
        "ipvs.minSyncPeriod" => ours("min-sync-period", "ipvs-min-sync-period"),
        "ipvs.scheduler" => "--ipvs-scheduler".into(),
        "ipvs.excludeCIDRs" => "--ipvs-exclude-cidrs".into(),
        "ipvs.tcpTimeout" => "--ipvs-tcp-timeout".into(),
        "ipvs.tcpFinTimeout" => "--ipvs-tcpfin-timeout".into(),
        "ipvs.udpTimeout" => "--ipvs-udp-timeout".into(),
        "configSyncPeriod" => "--config-sync-period".into(),
        "bindAddress" => "--bind-address".into(),
        "healthzBindAddress" => "--healthz-bind-address".into(),
        "metricsBindAddress" => "--metrics-bind-address".into(),
        "oomScoreAdj" => "--oom-score-adj".into(),
        "conntrack.maxPerCore" => "--conntrack-max-per-core".into(),
        "conntrack.min" => "--conntrack-min".into(),
        "conntrack.tcpEstablishedTimeout" => "--conntrack-tcp-timeout-established".into(),
        "conntrack.tcpCloseWaitTimeout" => "--conntrack-tcp-timeout-close-wait".into(),
        "conntrack.udpTimeout" => "--conntrack-udp-timeout".into(),
        "conntrack.udpStreamTimeout" => "--conntrack-udp-timeout-stream".into(),
        "mode" => "--proxy-mode".into(),
        "clientConnection.burst" => "--kube-api-burst".into(),
        "nodePortAddresses" => "--nodeport-addresses".into(),
        "showHiddenMetricsForVersion" => "--show-hidden-metrics-for-version".into(),
        "detectLocalMode" => "--detect-local-mode".into(),
        "detectLocal.bridgeInterface" => "--pod-bridge-interface".into(),
        "detectLocal.interfaceNamePrefix" => "--pod-interface-name-prefix".into(),
        "clusterCIDR" => "--cluster-cidr".into(),
        "logging.format" => "--logging-format".into(),
        "featureGates" => "--feature-gates".into(),
        other => other.to_string(),
    }
}

/// Where an error about `field` points: the file's field, or the flag.
struct Namer<'a> {
    file: Option<String>,
    parsed: &'a Parsed,
}

impl Namer<'_> {
    fn name(&self, field: &str) -> String {
        let logging_flag = field.starts_with("logging.") && self.parsed.changed("logging-format");
        match &self.file {
            Some(f) if !logging_flag => format!("config file {f} field {field}"),
            _ => flag_of(field, self.parsed),
        }
    }
}

/// Applies the flags bound to KubeProxyConfiguration fields (upstream binds them straight
/// into the config object; `processV1Alpha1Flags` then places the sync periods).
fn apply_config_flags(c: &mut KubeProxyConfig, p: &Parsed) {
    for v in p.all("feature-gates") {
        for kv in v.split(',').map(str::trim).filter(|s| !s.is_empty()) {
            if let Some((k, b)) = kv.split_once('=') {
                c.feature_gates.insert(
                    k.trim().to_string(),
                    flags::parse_bool(b.trim()).unwrap_or(false),
                );
            }
        }
    }
    let s = |name: &str| p.last(name).map(str::to_string);
    if let Some(v) = s("kubeconfig") {
        c.client_connection.kubeconfig = v;
    }
    if let Some(v) = s("kube-api-content-type") {
        c.client_connection.content_type = v;
    }
    if let Some(v) = p.i32("kube-api-burst") {
        c.client_connection.burst = v;
    }
    if let Some(v) = p.last("kube-api-qps").and_then(|v| v.parse().ok()) {
        c.client_connection.qps = v;
    }
    // IPVar: an empty value leaves the address alone.
    if let Some(v) = s("bind-address").filter(|v| !v.is_empty()) {
        c.bind_address = v;
    }
    if let Some(v) = s("healthz-bind-address") {
        c.healthz_bind_address = v;
    }
    if let Some(v) = s("metrics-bind-address") {
        c.metrics_bind_address = v;
    }
    if let Some(v) = p.bool("bind-address-hard-fail") {
        c.bind_address_hard_fail = v;
    }
    if let Some(v) = p.bool("profiling") {
        c.enable_profiling = v;
    }
    if let Some(v) = s("show-hidden-metrics-for-version") {
        c.show_hidden_metrics_for_version = v;
    }
    if let Some(v) = s("proxy-mode") {
        c.mode = v;
    }
    if let Some(v) = p.i32("iptables-masquerade-bit") {
        c.iptables.masquerade_bit = Some(v);
    }
    if let Some(v) = p.bool("masquerade-all") {
        c.masquerade_all = v;
    }
    if let Some(v) = p.bool("iptables-localhost-nodeports") {
        c.iptables.localhost_node_ports = Some(v);
    }
    if let Some(v) = s("ipvs-scheduler") {
        c.ipvs.scheduler = v;
    }
    if let Some(v) = p.slice("ipvs-exclude-cidrs") {
        c.ipvs.exclude_cidrs = Some(v);
    }
    if let Some(v) = p.bool("ipvs-strict-arp") {
        c.ipvs.strict_arp = v;
    }
    let d = |name: &str| p.duration(name).map(GoDuration);
    if let Some(v) = d("ipvs-tcp-timeout") {
        c.ipvs.tcp_timeout = v;
    }
    if let Some(v) = d("ipvs-tcpfin-timeout") {
        c.ipvs.tcp_fin_timeout = v;
    }
    if let Some(v) = d("ipvs-udp-timeout") {
        c.ipvs.udp_timeout = v;
    }
    if let Some(v) = s("detect-local-mode") {
        c.detect_local_mode = v;
    }
    if let Some(v) = s("pod-bridge-interface") {
        c.detect_local.bridge_interface = v;
    }
    if let Some(v) = s("pod-interface-name-prefix") {
        c.detect_local.interface_name_prefix = v;
    }
    if let Some(v) = p.slice("nodeport-addresses") {
        c.node_port_addresses = Some(v);
    }
    if let Some(v) = p.i32("oom-score-adj") {
        c.oom_score_adj = Some(v);
    }
    let ct = &mut c.conntrack;
    if let Some(v) = p.i32("conntrack-max-per-core") {
        ct.max_per_core = Some(v);
    }
    if let Some(v) = p.i32("conntrack-min") {
        ct.min = Some(v);
    }
    if let Some(v) = d("conntrack-tcp-timeout-established") {
        ct.tcp_established_timeout = Some(v);
    }
    if let Some(v) = d("conntrack-tcp-timeout-close-wait") {
        ct.tcp_close_wait_timeout = Some(v);
    }
    if let Some(v) = p.bool("conntrack-tcp-be-liberal") {
        ct.tcp_be_liberal = v;
    }
    if let Some(v) = d("conntrack-udp-timeout") {
        ct.udp_timeout = v;
    }
    if let Some(v) = d("conntrack-udp-timeout-stream") {
        ct.udp_stream_timeout = v;
    }
    if let Some(v) = d("config-sync-period") {
        c.config_sync_period = v;
    }
}

/// `processV1Alpha1Flags`: the sync-period flags of the other mode are ignored.
fn apply_v1alpha1_flags(c: &mut KubeProxyConfig, p: &Parsed) {
    let ipvs = c.mode == "ipvs";
    let d = |name: &str| p.duration(name).map(GoDuration);
    if let (false, Some(v)) = (ipvs, d("iptables-sync-period")) {
        c.sync_period = v;
    }
    if let (false, Some(v)) = (ipvs, d("iptables-min-sync-period")) {
        c.min_sync_period = v;
    }
    if let (true, Some(v)) = (ipvs, d("ipvs-sync-period")) {
        c.sync_period = v;
    }
    if let (true, Some(v)) = (ipvs, d("ipvs-min-sync-period")) {
        c.min_sync_period = v;
    }
    if let Some(v) = p.last("cluster-cidr") {
        c.detect_local.cluster_cidrs = v.split(',').map(str::to_string).collect();
    }
}

/// `copyLogsFromFlags`: logging flags win over the file; `--vmodule` entries come first.
fn apply_logging_flags(c: &mut KubeProxyConfig, p: &Parsed) {
    let l = &mut c.logging;
    if let Some(v) = p.last("logging-format") {
        l.format = v.to_string();
    }
    if let Some(v) = p.duration("log-flush-frequency") {
        l.flush_frequency = v1alpha1::TimeOrMetaDuration {
            duration: GoDuration(v),
            as_string: true,
        };
    }
    if let Some(v) = p.last("v").and_then(|v| v.parse().ok()) {
        l.verbosity = v;
    }
    if p.changed("vmodule") {
        let mut items: Vec<v1alpha1::VModuleItem> = p
            .all("vmodule")
            .into_iter()
            .flat_map(|v| {
                v.split(',')
                    .filter(|s| !s.is_empty())
                    .map(str::to_string)
                    .collect::<Vec<_>>()
            })
            .filter_map(|item| {
                let (pat, n) = item.split_once('=')?;
                Some(v1alpha1::VModuleItem {
                    file_pattern: pat.to_string(),
                    verbosity: n.parse().ok()?,
                })
            })
            .collect();
        items.append(&mut l.vmodule);
        l.vmodule = items;
    }
    if let Some(v) = p.bool("log-text-split-stream") {
        l.options.text.split_stream = v;
    }
    if let Some(v) = p.last("log-text-info-buffer-size") {
        l.options.text.info_buffer_size = v1alpha1::Quantity(v.into());
    }
    if let Some(v) = p.bool("log-json-split-stream") {
        l.options.json.split_stream = v;
    }
    if let Some(v) = p.last("log-json-info-buffer-size") {
        l.options.json.info_buffer_size = v1alpha1::Quantity(v.into());
    }
}

/// `addressFromDeprecatedFlags`: `--healthz-port`/`--metrics-port` (default 10256/10249)
/// fill in a missing port; 0 disables the server.
fn address_from_deprecated_port(addr: &str, port: i32) -> String {
    if port == 0 {
        return String::new();
    }
    match u16::try_from(port) {
        Ok(p) => v1alpha1::append_port_if_needed(addr, p),
        Err(_) => addr.to_string(),
    }
}

impl Config {
    /// Parses the arguments after the program name into what to do.
    pub fn from_args<I, S>(args: I) -> Result<Command, ConfigError>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<std::ffi::OsStr>,
    {
        let parsed = flags::parse(args).map_err(|e| ConfigError {
            what: "command line".into(),
            why: e.0,
        })?;
        if parsed.bool("help") == Some(true) {
            return Ok(Command::Help);
        }
        match parsed.last("version") {
            Some("true") | Some("raw") => {
                return Ok(Command::Print(format!(
                    "kube-nlproxy {} (kube-proxy v1alpha1 configuration)\n",
                    env!("CARGO_PKG_VERSION")
                )))
            }
            Some("false") | None => {}
            Some(other) => {
                return Err(bad(
                    "--version",
                    format!("{other:?}: use true, false or raw"),
                ))
            }
        }
        Config::from_parsed(&parsed).map(|c| Command::Run(Box::new(c)))
    }

    /// Test helper and library entry: flags as a slice of strings.
    pub fn from_flag_list(args: &[&str]) -> Result<Config, ConfigError> {
        match Config::from_args(args)? {
            Command::Run(c) => Ok(*c),
            Command::Help | Command::Print(_) => {
                Err(bad("command line", "asked for --help or --version"))
            }
        }
    }

    /// Merges the file (if any) and the flags as upstream does and validates everything.
    pub fn from_parsed(p: &Parsed) -> Result<Config, ConfigError> {
        let config_path = p
            .last("config")
            .filter(|s| !s.is_empty())
            .map(PathBuf::from);
        let file = match config_path {
            Some(path) => {
                let bytes = std::fs::read(&path)
                    .map_err(|e| bad("--config", format!("{}: {e}", path.display())))?;
                Some((path, bytes))
            }
            None => None,
        };
        Config::from_parsed_with(p, file)
    }

    /// [`Config::from_parsed`] with the `--config` file already read.
    pub fn from_parsed_with(
        p: &Parsed,
        file: Option<(PathBuf, Vec<u8>)>,
    ) -> Result<Config, ConfigError> {
        let mut warnings = Vec::new();
        let mut notices = Vec::new();
        let config_path = file.as_ref().map(|(p, _)| p.clone());
        let write_config_to = p
            .last("write-config-to")
            .filter(|s| !s.is_empty())
            .map(PathBuf::from);
        let mut config_bytes = None;
        let mut kp = match file {
            Some((path, bytes)) => {
                let shown = path.display().to_string();
                let text = std::str::from_utf8(&bytes).map_err(|e| {
                    bad(
                        &format!("config file {shown}"),
                        format!("not UTF-8 (byte {})", e.valid_up_to()),
                    )
                })?;
                let decoded = decode::decode(text).map_err(|e| match e.field {
                    Some(f) => bad(&format!("config file {shown} field {f}"), e.why),
                    None => bad(&format!("config file {shown}"), e.why),
                })?;
                for s in decoded.strict_errors {
                    warnings.push(format!(
                        "config file {shown}: using lenient decoding as strict decoding failed: {s}"
                    ));
                }
                config_bytes = Some(bytes);
                let mut v = decoded.config;
                v1alpha1::set_defaults(&mut v);
                let mut kp = KubeProxyConfig::from_v1alpha1(&v);
                apply_logging_flags(&mut kp, p);
                for (spec, _) in &p.set {
                    if spec.target == Target::Config
                        && !warnings
                            .iter()
                            .any(|w: &String| w.starts_with(&format!("--{} ", spec.name)))
                    {
                        warnings.push(format!(
                            "--{} is ignored: --config is set and, as upstream, the file replaces \
                             the flag values (set it in the file)",
                            spec.name
                        ));
                    }
                }
                kp
            }
            None => {
                let mut kp = KubeProxyConfig::defaulted();
                apply_config_flags(&mut kp, p);
                apply_logging_flags(&mut kp, p);
                if write_config_to.is_none() {
                    let hp = p
                        .i32("healthz-port")
                        .unwrap_or(v1alpha1::PROXY_HEALTHZ_PORT.into());
                    let mp = p
                        .i32("metrics-port")
                        .unwrap_or(v1alpha1::PROXY_STATUS_PORT.into());
                    kp.healthz_bind_address =
                        address_from_deprecated_port(&kp.healthz_bind_address, hp);
                    kp.metrics_bind_address =
                        address_from_deprecated_port(&kp.metrics_bind_address, mp);
                }
                apply_v1alpha1_flags(&mut kp, p);
                kp
            }
        };
        for (spec, _) in &p.set {
            if let Some(d) = spec.deprecated {
                warnings.push(format!("--{} is deprecated: {d}", spec.name));
            }
            if let flags::Meaning::NoEffect(why) = spec.meaning {
                let w = format!("--{} has no effect here: {why}", spec.name);
                if !warnings.contains(&w) {
                    warnings.push(w);
                }
            }
        }
        let mode_defaulted = kp.apply_platform_defaults();
        // Our own overrides of the running mode's settings.
        if let Some(b) = p.i32("masquerade-bit") {
            match kp.mode.as_str() {
                "nftables" => kp.nftables_masquerade_bit = Some(b),
                _ => kp.iptables.masquerade_bit = Some(b),
            }
        }
        if let Some(d) = p.duration("sync-period") {
            kp.sync_period = GoDuration(d);
        }
        if let Some(d) = p.duration("min-sync-period") {
            kp.min_sync_period = GoDuration(d);
        }
        if let Some(h) = p.last("hostname-override").filter(|h| !h.is_empty()) {
            let h = h.trim();
            if h.is_empty() {
                return Err(bad(
                    "--hostname-override",
                    "empty hostname-override is invalid",
                ));
            }
            kp.hostname_override = h.to_lowercase();
        }
        let namer = Namer {
            file: config_path.as_ref().map(|p| p.display().to_string()),
            parsed: p,
        };
        // Upstream applies the gates in `Complete`, before validating: an unknown gate, a
        // locked one set to the other value or a missing dependency stops the start.
        let (gates, gate_warnings) = gates::FeatureGates::from_map(&kp.feature_gates)
            .map_err(|e| bad(&namer.name("featureGates"), e.to_string()))?;
        warnings.extend(gate_warnings);
        let violations = validation::validate(&kp);
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
        if kp.mode == "ipvs" {
            notices.push(
                "ipvs mode: upstream kube-proxy deprecates its ipvs proxier (disabled by default \
                 in 1.40, removed in 1.43); kube-nlproxy keeps serving IPVS mode"
                    .into(),
            );
        }
        let mode = match kp.mode.as_str() {
            "ipvs" => ProxyMode::Ipvs,
            "userspace" => ProxyMode::Userspace,
            "nftables" => ProxyMode::Nftables,
            _ => {
                notices.push(if mode_defaulted {
                    "no proxy mode specified: upstream defaults to iptables; kube-nlproxy serves \
                     iptables mode with its nftables engine (iptables settings honoured)"
                        .to_string()
                } else {
                    "proxy mode iptables: served by kube-nlproxy's nftables engine (iptables \
                     settings honoured)"
                        .to_string()
                });
                ProxyMode::Nftables
            }
        };
        let node_name = if kp.hostname_override.trim().is_empty() {
            hostname()
        } else {
            kp.hostname_override.trim().to_lowercase()
        };
        if node_name.is_empty() {
            return Err(bad("--hostname-override", "empty node name"));
        }
        let service_cidrs = match p.last("service-cidrs") {
            Some(s) if !s.trim().is_empty() => s
                .split(',')
                .map(str::trim)
                .filter(|x| !x.is_empty())
                .map(|x| x.parse::<Cidr>().map_err(|e| bad("--service-cidrs", e)))
                .collect::<Result<Vec<_>, _>>()?,
            _ => Vec::new(),
        };
        let cluster_cidrs: Vec<Cidr> = kp
            .detect_local
            .cluster_cidrs
            .iter()
            .map(|c| {
                cidr_sloppy(c)
                    .ok_or_else(|| bad(&namer.name("clusterCIDR"), format!("{c:?} is not a CIDR")))
            })
            .collect::<Result<_, _>>()?;
        let detect_local = match kp.detect_local_mode.as_str() {
            "NodeCIDR" => DetectLocal::NodeCidr,
            "BridgeInterface" => {
                let b = &kp.detect_local.bridge_interface;
                if !valid_ifname(b) {
                    return Err(bad(
                        &namer.name("detectLocal.bridgeInterface"),
                        format!("{b:?} is not a valid interface name"),
                    ));
                }
                DetectLocal::BridgeInterface(b.clone())
            }
            "InterfaceNamePrefix" => {
                let b = &kp.detect_local.interface_name_prefix;
                if !valid_ifname(b) {
                    return Err(bad(
                        &namer.name("detectLocal.interfaceNamePrefix"),
                        format!("{b:?} is not a valid interface name prefix"),
                    ));
                }
                DetectLocal::InterfaceNamePrefix(b.clone())
            }
            _ => DetectLocal::ClusterCidr(cluster_cidrs.clone()),
        };
        let mut nodeport_addresses = NodePortAddresses::default();
        for a in kp.node_port_addresses.iter().flatten() {
            match a.as_str() {
                "primary" => nodeport_addresses.primary = true,
                "localhost" => nodeport_addresses.cidrs.extend(
                    ["127.0.0.0/8", "::1/128"]
                        .iter()
                        .filter_map(|c| cidr_sloppy(c)),
                ),
                "all" => nodeport_addresses
                    .cidrs
                    .extend(["0.0.0.0/0", "::/0"].iter().filter_map(|c| cidr_sloppy(c))),
                c => nodeport_addresses.cidrs.push(cidr_sloppy(c).ok_or_else(|| {
                    bad(
                        &namer.name("nodePortAddresses"),
                        format!("{c:?} is not a CIDR"),
                    )
                })?),
            }
        }
        let masquerade_bit = match kp.mode.as_str() {
            "nftables" => kp.nftables_masquerade_bit,
            _ => kp.iptables.masquerade_bit,
        }
        .unwrap_or(14);
        let masquerade_bit = u8::try_from(masquerade_bit).unwrap_or(14);
        let table = match p.last("nftables-table") {
            Some(t) => t.to_string(),
            None => match mode {
                ProxyMode::Nftables | ProxyMode::Userspace => names::DEFAULT_TABLE.into(),
                ProxyMode::Ipvs => crate::modes::ipvs::table::DEFAULT_TABLE.into(),
            },
        };
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
        let local_detector = match &detect_local {
            DetectLocal::ClusterCidr(c) if !c.is_empty() => LocalDetector::Cidrs(c.clone()),
            DetectLocal::BridgeInterface(b) => LocalDetector::Bridge(b.clone()),
            DetectLocal::InterfaceNamePrefix(p) => LocalDetector::InterfacePrefix(p.clone()),
            _ => LocalDetector::None,
        };
        let master = p
            .last("master")
            .filter(|m| !m.is_empty())
            .map(str::to_string);
        if let Some(m) = &master {
            if !(m.starts_with("http://") || m.starts_with("https://")) {
                return Err(bad("--master", format!("{m:?} is not an http(s) URL")));
            }
        }
        let server_addr = |field: &str, s: &str| -> Result<Option<SocketAddr>, ConfigError> {
            if s.is_empty() {
                return Ok(None);
            }
            let (host, port) = v1alpha1::split_host_port(s)
                .ok_or_else(|| bad(&namer.name(field), format!("{s:?}: must be IP:port")))?;
            let ip: IpAddr = v1alpha1::parse_ip_sloppy(host)
                .ok_or_else(|| bad(&namer.name(field), format!("{host:?}: must be a valid IP")))?;
            let port: u16 = port.parse().map_err(|_| {
                bad(
                    &namer.name(field),
                    format!("{port:?}: must be a valid port"),
                )
            })?;
            Ok(Some(SocketAddr::new(ip, port)))
        };
        let healthz_bind_address = server_addr("healthzBindAddress", &kp.healthz_bind_address)?;
        let metrics_bind_address = server_addr("metricsBindAddress", &kp.metrics_bind_address)?;
        let ipvs = ipvs_config(&kp, &namer)?;
        let (localhost_listeners, loopback_nodeports) = localhost_nodeports(
            &kp,
            &nodeport_addresses,
            &gates,
            p.bool("localhost-nodeports"),
        );
        // Upstream's iptables mode sets route_localnet=1 for its localhost NodePorts and
        // guards it; ours forwards them in userspace but leaves the node as upstream does.
        let localnet_guard = iptables_localhost_nodeports(&kp, &nodeport_addresses);
        let ct = &kp.conntrack;
        let pos = |d: Option<GoDuration>| d.filter(|d| d.0 > 0).map(GoDuration::std);
        let conntrack = ConntrackConfig {
            max_per_core: ct.max_per_core.and_then(|v| u32::try_from(v).ok()),
            min: ct.min.and_then(|v| u32::try_from(v).ok()),
            tcp_established_timeout: pos(ct.tcp_established_timeout),
            tcp_close_wait_timeout: pos(ct.tcp_close_wait_timeout),
            tcp_be_liberal: ct.tcp_be_liberal,
            udp_timeout: pos(Some(ct.udp_timeout)),
            udp_stream_timeout: pos(Some(ct.udp_stream_timeout)),
        };
        let verbosity = kp.logging.verbosity;
        if !kp.logging.vmodule.is_empty() && !p.changed("vmodule") {
            warnings.push(
                "config field logging.vmodule has no effect here: per-file verbosity needs Go \
                 source files; logging.verbosity applies to all"
                    .into(),
            );
        }
        if kp.enable_profiling && !p.changed("profiling") {
            warnings
                .push("config field enableProfiling has no effect here: no /debug/pprof".into());
        }
        let reset_dead_endpoint_connections =
            p.bool("reset-dead-endpoint-connections").unwrap_or(false);
        if reset_dead_endpoint_connections && matches!(mode, ProxyMode::Ipvs | ProxyMode::Userspace)
        {
            warnings.push(format!(
                "--reset-dead-endpoint-connections has no effect in {} mode: {}",
                kp.mode,
                if mode == ProxyMode::Ipvs {
                    "IPVS forwards by its own connection table, not by conntrack's"
                } else {
                    "the userspace proxy's own sessions are the connections"
                }
            ));
        }
        let oom_score_adj = kp
            .oom_score_adj
            .unwrap_or(v1alpha1::KUBE_PROXY_OOM_SCORE_ADJ);
        let kubeconfig = Some(kp.client_connection.kubeconfig.clone())
            .filter(|k| !k.is_empty())
            .map(PathBuf::from);
        Ok(Config {
            oom_score_adj,
            write_config_to,
            state_tool: None,
            config_path,
            config_bytes,
            manifests: p
                .last("manifests")
                .filter(|m| !m.is_empty())
                .map(PathBuf::from),
            kubeconfig,
            master,
            node_name,
            mode,
            requested_mode: kp.mode.clone(),
            mode_defaulted,
            ipvs,
            proxier: ProxierConfig {
                table,
                masquerade_bit,
                masquerade_all: kp.masquerade_all,
                local_detector,
                nodeport_addresses,
                service_cidrs,
                // Upstream's iptables mode (also what an empty mode means); whether the
                // kernel is liberal is read once the conntrack tuning is applied.
                drop_invalid: kp.mode == "iptables",
                loopback_nodeports,
                localnet_guard,
            },
            sync_period: kp.sync_period.std(),
            min_sync_period: kp.min_sync_period.std(),
            config_sync_period: kp.config_sync_period.std(),
            healthz_bind_address,
            metrics_bind_address,
            bind_address_hard_fail: kp.bind_address_hard_fail,
            cleanup: p.bool("cleanup").unwrap_or(false),
            once: p.bool("once").unwrap_or(false),
            dry_run: p.bool("dry-run").unwrap_or(false),
            init_only: p.bool("init-only").unwrap_or(false),
            conntrack_cleanup: !p.bool("no-conntrack-cleanup").unwrap_or(false),
            reset_dead_endpoint_connections,
            json_logs: kp.logging.format == "json",
            localhost_listeners,
            verbosity,
            log_level: match verbosity {
                0 | 1 => "info",
                2 | 3 => "debug",
                _ => "trace",
            },
            conntrack,
            notices,
            warnings,
            detect_local,
            gates,
            flagz: flagz_values(p),
            upstream: kp,
        })
    }

    /// The effective configuration in upstream's v1alpha1 shape: what `--write-config-to`
    /// writes and `/configz` serves.
    pub fn to_kube_proxy_configuration(&self) -> v1alpha1::KubeProxyConfiguration {
        self.upstream.to_v1alpha1()
    }

    /// `--write-config-to`'s text.
    pub fn to_yaml(&self) -> String {
        v1alpha1::to_yaml(&self.to_kube_proxy_configuration())
    }
}

/// What upstream's `/flagz` lists: every flag of upstream's command line with the value it
/// holds (its default unless given: with `--config` the flags still hold their own values,
/// as upstream's flag set does), plus each of our flags that was given. Values are printed
/// as pflag's `String()` prints them. Pure.
pub fn flagz_values(p: &Parsed) -> std::collections::BTreeMap<String, String> {
    let mut out: std::collections::BTreeMap<String, String> = flag_defaults::FLAG_DEFAULTS
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    for (spec, _) in &p.set {
        let all = p.all(spec.name);
        let last = all.last().copied().unwrap_or_default();
        let v = match spec.kind {
            flags::Kind::Bool => flags::parse_bool(last).unwrap_or(false).to_string(),
            flags::Kind::Int32 | flags::Kind::Level => match flags::parse_int(last) {
                Ok(n) => n.to_string(),
                Err(_) => last.to_string(),
            },
            flags::Kind::Duration => match duration::parse(last) {
                Ok(ns) => duration::format(ns),
                Err(_) => last.to_string(),
            },
            // pflag's stringSlice prints `[a,b]`.
            flags::Kind::StrSlice => format!(
                "[{}]",
                all.iter()
                    .flat_map(|v| flags::split_list(v))
                    .collect::<Vec<_>>()
                    .join(",")
            ),
            // cliflag's MapStringBool prints its sorted `k=v` pairs.
            flags::Kind::MapBool => {
                let mut m = std::collections::BTreeMap::new();
                for kv in all.iter().flat_map(|v| v.split(',')) {
                    if let Some((k, b)) = kv.split_once('=') {
                        m.insert(k.trim(), flags::parse_bool(b.trim()).unwrap_or(false));
                    }
                }
                m.iter()
                    .map(|(k, v)| format!("{k}={v}"))
                    .collect::<Vec<_>>()
                    .join(",")
            }
            flags::Kind::VModule => all.join(","),
            _ => last.to_string(),
        };
        out.insert(spec.name.to_string(), v);
    }
    out
}

/// Localhost NodePorts: which loopback listeners forward them, and which loopback NodePort
/// traffic the rules reject and count.
/// - iptables mode (upstream's default `iptables.localhostNodePorts`, IPv4 only, when the
///   NodePort addresses cover 127.0.0.1; upstream DNATs with route_localnet): TCP and UDP on
///   127.0.0.1.
/// - nftables mode with upstream's gate `KubeProxyNFTablesLocalhostNodePorts`, per family:
///   loopback listed explicitly, TCP on 127.0.0.1 or ::1 and UDP and SCTP rejected;
///   otherwise every protocol rejected.
/// - ours, `--localhost-nodeports`: TCP and UDP on 127.0.0.1 in every mode (IPv4 then
///   rejects nothing).
fn localhost_nodeports(
    kp: &KubeProxyConfig,
    addresses: &NodePortAddresses,
    gates: &gates::FeatureGates,
    ours: Option<bool>,
) -> (LoopbackListeners, LoopbackPolicy) {
    let gate =
        kp.mode == "nftables" && gates.enabled(gates::KUBE_PROXY_NFTABLES_LOCALHOST_NODE_PORTS);
    let mut policy = LoopbackPolicy {
        v4: LoopbackNodePorts::of(gate, addresses.explicit_loopback_of(true)),
        v6: LoopbackNodePorts::of(gate, addresses.explicit_loopback_of(false)),
    };
    let served = |p: LoopbackNodePorts| match p {
        LoopbackNodePorts::ServeTcp => vec![Protocol::Tcp],
        _ => Vec::new(),
    };
    let mut listeners = LoopbackListeners {
        v4: served(policy.v4),
        v6: served(policy.v6),
    };
    if ours.unwrap_or(false) || iptables_localhost_nodeports(kp, addresses) {
        listeners.v4 = vec![Protocol::Tcp, Protocol::Udp];
        policy.v4 = LoopbackNodePorts::Untouched;
    }
    (listeners, policy)
}

/// Whether iptables mode serves localhost NodePorts (upstream's `NewProxier`:
/// `iptables.localhostNodePorts`, default true, and 127.0.0.1 among the NodePort addresses).
fn iptables_localhost_nodeports(kp: &KubeProxyConfig, addresses: &NodePortAddresses) -> bool {
    kp.mode == "iptables"
        && kp.iptables.localhost_node_ports.unwrap_or(true)
        && addresses.contains_ipv4_loopback()
}

/// The IPVS settings, checked.
fn ipvs_config(
    kp: &KubeProxyConfig,
    namer: &Namer,
) -> Result<crate::modes::ipvs::plan::IpvsConfig, ConfigError> {
    use crate::modes::ipvs::plan::{IpvsConfig, SCHEDULERS};
    let mut c = IpvsConfig::default();
    let i = &kp.ipvs;
    if !i.scheduler.is_empty() {
        if kp.mode == "ipvs" && !SCHEDULERS.contains(&i.scheduler.as_str()) {
            return Err(bad(
                &namer.name("ipvs.scheduler"),
                format!(
                    "unknown scheduler {:?} ({})",
                    i.scheduler,
                    SCHEDULERS.join(", ")
                ),
            ));
        }
        c.scheduler = i.scheduler.clone();
    }
    c.exclude_cidrs = i
        .exclude_cidrs
        .iter()
        .flatten()
        .map(|s| {
            cidr_sloppy(s).ok_or_else(|| {
                bad(
                    &namer.name("ipvs.excludeCIDRs"),
                    format!("{s:?} is not a CIDR"),
                )
            })
        })
        .collect::<Result<_, _>>()?;
    c.strict_arp = i.strict_arp;
    let secs = |field: &str, d: GoDuration| -> Result<u32, ConfigError> {
        u32::try_from(d.std().as_secs()).map_err(|_| bad(&namer.name(field), "too long"))
    };
    c.tcp_timeout = secs("ipvs.tcpTimeout", i.tcp_timeout)?;
    c.tcp_fin_timeout = secs("ipvs.tcpFinTimeout", i.tcp_fin_timeout)?;
    c.udp_timeout = secs("ipvs.udpTimeout", i.udp_timeout)?;
    Ok(c)
}

#[cfg(test)]
mod tests;
