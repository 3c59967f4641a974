//! The command line and the KubeProxyConfiguration file, merged as upstream kube-proxy
//! merges them (cmd/kube-proxy/app/options.go `Complete`), validated with upstream's rules,
//! and turned into the one [`Config`] the daemon runs with. With `--config` the file
//! replaces the flag values (a warning names each flag so ignored), except the logging
//! flags and `--hostname-override`; without it the flags apply over upstream's defaults.
//! Errors name the file field when the value came from the file, the flag otherwise.
//!
//! Laid out as upstream separates `options.go` from `apis/config/{types,v1alpha1,validation}`:
//! [`flags`] (the command line), [`file`] (the configuration file's types, decoder and
//! internal form) and [`gates`] (feature gates) are the rooms; the phases
//! [`Config::from_parsed_with`] runs sit here: load (`load.rs`: the file or the flags, our
//! overrides, and the other flags as a typed `CliOptions`), validation (`validation.rs`),
//! resolve (`resolve.rs`, which never sees the raw flags). `startup_checks` are upstream's
//! checks once the node is known. Pure apart from reading the config file.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

pub mod file;
pub mod flags;
pub mod gates;
mod load;
#[cfg(test)]
mod proptests;
mod resolve;
pub mod startup_checks;
mod validation;

use crate::kernel::conntrack::tuning::ConntrackConfig;
use crate::kernel::nft::Cidr;
use crate::proxy::{LoopbackListeners, ProxierConfig};
use file::internal::KubeProxyConfig;
use file::{duration, v1alpha1};
use flags::{cli, Parsed};
// What the configuration tests (`tests.rs`, `use super::*`) name.
#[cfg(test)]
use {
    crate::model::Protocol,
    crate::proxy::{LocalDetector, LoopbackNodePorts, NodePortAddresses},
    file::decode,
    v1alpha1::GoDuration,
};

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
    /// `--service-proxy-name`: the Services ours serves.
    pub service_selection: crate::source::convert::ServiceSelection,
    pub kubeconfig: Option<PathBuf>,
    /// `clientConnection.contentType` and `acceptContentTypes`: the API client's `Accept`.
    pub content_type: String,
    pub accept_content_types: String,
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
    /// The IP families to program, primary first: both until start-up has read the host
    /// and the Node (`crate::proxy::families`), which may leave IPv4 alone.
    pub families: Vec<crate::model::net::Family>,
    pub conntrack: ConntrackConfig,
    pub json_logs: bool,
    /// The loopback listeners that forward NodePorts in userspace (none: no forwarder).
    pub localhost_listeners: LoopbackListeners,
    pub oom_score_adj: i32,
    pub write_config_to: Option<PathBuf>,
    /// `--write-seccomp-profile`: write the container's seccomp profile there and exit.
    pub write_seccomp_profile: Option<PathBuf>,
    /// Install the seccomp filter that refuses exec (not `--no-exec-filter`).
    pub exec_filter: bool,
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

impl Config {
    /// The options every mode's proxier is opened with (the daemon's, and what `status` and
    /// `diff` plan with, so that both plan the same).
    pub fn proxy_options(&self) -> crate::proxy::Options {
        crate::proxy::Options {
            proxier: self.proxier.clone(),
            detect_local: self.detect_local.clone(),
            sync_period: self.sync_period,
            conntrack_cleanup: self.conntrack_cleanup,
            reset_dead_endpoint_connections: self.reset_dead_endpoint_connections,
            families: self.families.clone(),
        }
    }
}

/// The upstream kube-proxy release this one tracks: its flags, configuration, feature gates
/// and metrics (CHANGELOG.md's versioning policy).
pub const TRACKED_KUBE_PROXY: &str = "v1.37.2";

/// What `--version` prints, in upstream's shape (component-base's verflag: `Kubernetes
/// GITVERSION`, the release this one tracks) with our version and the commit it was built
/// from (build.rs) beside it. `raw` prints upstream's `version.Info` as Go's `%#v` shows it,
/// our version as GitVersion's build metadata.
pub fn version_text(git_commit: &str, raw: bool) -> String {
    let ours = env!("CARGO_PKG_VERSION");
    if raw {
        let (major, minor) = gates::BINARY_VERSION;
        let platform = format!("linux/{}", go_arch());
        return format!(
            "version.Info{{Major:\"{major}\", Minor:\"{minor}\", EmulationMajor:\"\", \
             EmulationMinor:\"\", MinCompatibilityMajor:\"\", MinCompatibilityMinor:\"\", \
             GitVersion:\"{TRACKED_KUBE_PROXY}+kube-nlproxy-{ours}\", GitCommit:\"{git_commit}\", \
             GitTreeState:\"\", BuildDate:\"\", GoVersion:\"\", Compiler:\"rustc\", \
             Platform:\"{platform}\"}}\n"
        );
    }
    let commit = if git_commit.is_empty() {
        String::new()
    } else {
        format!("git commit {git_commit}, ")
    };
    format!(
        "Kubernetes {TRACKED_KUBE_PROXY} (kube-nlproxy {ours}, {commit}kube-proxy v1alpha1 configuration)\n"
    )
}

/// The architecture as Go names it (GOARCH).
fn go_arch() -> &'static str {
    match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        other => other,
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
        if parsed.get(cli::HELP) == Some(true) {
            return Ok(Command::Help);
        }
        match parsed.get(cli::VERSION).as_deref() {
            Some(v @ ("true" | "raw")) => {
                return Ok(Command::Print(version_text(
                    env!("KUBE_NLPROXY_GIT_COMMIT"),
                    v == "raw",
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
            .get(cli::CONFIG)
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

    /// [`Config::from_parsed`] with the `--config` file already read. The phases: load
    /// (the file or the flags, with their warnings), apply our overrides, validate, resolve
    /// the values the daemon runs with.
    pub fn from_parsed_with(
        p: &Parsed,
        file: Option<(PathBuf, Vec<u8>)>,
    ) -> Result<Config, ConfigError> {
        let mut loaded = load::load(p, file)?;
        let gates = validation::check(&loaded.config, &loaded.namer, &mut loaded.warnings)?;
        resolve::resolve(loaded, gates)
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

#[cfg(test)]
mod tests;
