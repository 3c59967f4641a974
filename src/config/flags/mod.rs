//! The command line, parsed as upstream kube-proxy's pflag/cobra command parses it: every
//! upstream flag (options.go `AddFlags`, component-base's logging flags, klog's legacy
//! flags, the deprecated `--healthz-port`/`--metrics-port`) plus our own. `--name=value`
//! and `--name value`, booleans as `--flag` or `--flag=true|false`, `_` and `-`
//! interchangeable, `-v 2`/`-v=2`/`-v2`, a repeated flag's last value wins (list flags
//! append, as pflag's do), `--` ends the flags. Values are checked as pflag checks them,
//! with pflag's error texts. Pure.
//!
//! The rest of this room: [`handles`] (typed handles on the flags, checked when the crate
//! compiles), [`fields`] (the one table of which file field each flag sets), [`defaults`]
//! (upstream's defaults, generated), [`options`] (the flags that are not file fields, read
//! once into a typed struct) and [`flagz`] (what `/flagz` lists).

pub(super) mod defaults;
pub(super) mod fields;
pub mod flagz;
mod handles;
pub mod options;

use crate::config::file::{duration, v1alpha1};

/// What a flag's value is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Bool,
    Str,
    Int32,
    Uint64,
    Float32,
    Duration,
    /// Comma-separated; repeated flags append.
    StrSlice,
    /// `key=bool,…`; repeated flags merge.
    MapBool,
    /// An IP address (empty: unchanged).
    Ip,
    /// An IP or IP:port (empty: the server is disabled).
    IpPort,
    /// `-v`: an unsigned level.
    Level,
    /// `pattern=N,…`; repeated flags append.
    VModule,
}

/// Where a flag's value goes, which decides what `--config` does to it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Target {
    /// A KubeProxyConfiguration field: ignored when `--config` is given (upstream replaces
    /// the flag values with the file), with a warning here.
    Config,
    /// A logging setting: the flag wins over the file (upstream's `copyLogsFromFlags`).
    Logging,
    /// Not part of the file (`--config`, `--master`, `--hostname-override`, our flags).
    Cli,
}

/// Whether the flag does something here.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Meaning {
    Implemented,
    /// Accepted and validated; a one-line warning says why it has no effect.
    NoEffect(&'static str),
}

#[derive(Debug, Clone, Copy)]
pub struct FlagSpec {
    pub name: &'static str,
    pub shorthand: Option<char>,
    pub kind: Kind,
    pub target: Target,
    pub meaning: Meaning,
    /// Only in kube-nlproxy.
    pub ours: bool,
    pub deprecated: Option<&'static str>,
    pub help: &'static str,
}

const fn f(name: &'static str, kind: Kind, target: Target, help: &'static str) -> FlagSpec {
    FlagSpec {
        name,
        shorthand: None,
        kind,
        target,
        meaning: Meaning::Implemented,
        ours: false,
        deprecated: None,
        help,
    }
}

const fn noop(name: &'static str, kind: Kind, target: Target, why: &'static str) -> FlagSpec {
    FlagSpec {
        name,
        shorthand: None,
        kind,
        target,
        meaning: Meaning::NoEffect(why),
        ours: false,
        deprecated: None,
        help: why,
    }
}

const fn ours(name: &'static str, kind: Kind, help: &'static str) -> FlagSpec {
    FlagSpec {
        name,
        shorthand: None,
        kind,
        target: Target::Cli,
        meaning: Meaning::Implemented,
        ours: true,
        deprecated: None,
        help,
    }
}

const KLOG: &str = "klog's legacy flag; logs go to stderr here";

use Kind::*;
use Target::*;

/// Every flag, upstream's first in options.go order. README's flag table is this list.
pub const FLAGS: &[FlagSpec] = &[
    f("config", Str, Cli, "The path to the configuration file (KubeProxyConfiguration v1alpha1, YAML or JSON)."),
    f("write-config-to", Str, Cli, "If set, write the effective configuration to this file in upstream's v1alpha1 format and exit."),
    f("cleanup", Bool, Cli, "If true, remove the rules of every proxy mode (ours and upstream kube-proxy's) and exit."),
    f("feature-gates", MapBool, Config, "key=value pairs of feature gates, applied as upstream applies them: an unknown gate or a locked one set to the other value is an error."),
    f("kubeconfig", Str, Config, "Path to kubeconfig file with authorization information (the master location can be overridden by the master flag)."),
    f("master", Str, Cli, "The address of the Kubernetes API server (overrides any value in kubeconfig)."),
    f("kube-api-content-type", Str, Config, "Content type of requests sent to apiserver (default application/vnd.kubernetes.protobuf; JSON is accepted where the server offers nothing else)."),
    noop("kube-api-burst", Int32, Config, "no client-side rate limit: the API source makes a handful of long-lived watch requests"),
    noop("kube-api-qps", Float32, Config, "no client-side rate limit: the API source makes a handful of long-lived watch requests"),
    f("hostname-override", Str, Cli, "If non-empty, used as the name of the Node this proxy runs on (the file's hostnameOverride otherwise, else the hostname)."),
    f("bind-address", Ip, Config, "The node's primary IP when not 0.0.0.0 or ::; its family picks the default health and metrics addresses."),
    f("healthz-bind-address", IpPort, Config, "IP[:port] of the health server (default 0.0.0.0:10256); empty disables it."),
    f("metrics-bind-address", IpPort, Config, "IP[:port] of the metrics server (default 127.0.0.1:10249); empty disables it."),
    f("bind-address-hard-fail", Bool, Config, "If true, failing to bind the health or metrics port is fatal."),
    noop("profiling", Bool, Config, "no /debug/pprof: this is not a Go binary"),
    noop("show-hidden-metrics-for-version", Str, Config, "no metric is hidden here"),
    f("init-only", Bool, Cli, "If true, do the initialization that needs full privileges (oom_score_adj, conntrack sysctls) and exit."),
    f("proxy-mode", Str, Config, "iptables (default; served by the nftables engine), nftables, ipvs, or userspace."),
    f("iptables-masquerade-bit", Int32, Config, "iptables and ipvs modes: the fwmark bit that requests SNAT, 0-31 (nftables mode reads nftables.masqueradeBit from the file)."),
    f("masquerade-all", Bool, Config, "SNAT all traffic sent via Service cluster IPs."),
    f("iptables-localhost-nodeports", Bool, Config, "iptables mode: if false, NodePorts are not served on 127.0.0.1 (default true)."),
    f("iptables-sync-period", Duration, Config, "Longest interval between syncs in every mode but ipvs (default 30s)."),
    f("iptables-min-sync-period", Duration, Config, "Shortest interval between syncs in every mode but ipvs (default 1s)."),
    f("ipvs-sync-period", Duration, Config, "ipvs mode: longest interval between syncs."),
    f("ipvs-min-sync-period", Duration, Config, "ipvs mode: shortest interval between syncs."),
    f("ipvs-scheduler", Str, Config, "ipvs mode: the scheduler (rr, wrr, lc, wlc, lblc, lblcr, dh, sh, sed, nq, mh)."),
    f("ipvs-exclude-cidrs", StrSlice, Config, "ipvs mode: virtual servers in these CIDRs are never touched."),
    f("ipvs-strict-arp", Bool, Config, "ipvs mode: set arp_ignore=1 and arp_announce=2."),
    f("ipvs-tcp-timeout", Duration, Config, "ipvs mode: idle timeout of TCP connections, 0 to leave as-is."),
    f("ipvs-tcpfin-timeout", Duration, Config, "ipvs mode: timeout of TCP connections after FIN, 0 to leave as-is."),
    f("ipvs-udp-timeout", Duration, Config, "ipvs mode: timeout of UDP flows, 0 to leave as-is."),
    f("detect-local-mode", Str, Config, "How local pod traffic is told apart: ClusterCIDR, NodeCIDR, BridgeInterface, InterfaceNamePrefix."),
    f("pod-bridge-interface", Str, Config, "The pods' bridge, for --detect-local-mode=BridgeInterface."),
    f("pod-interface-name-prefix", Str, Config, "The pods' interface name prefix, for --detect-local-mode=InterfaceNamePrefix."),
    f("cluster-cidr", Str, Config, "The pods' CIDRs (one, or a dual-stack pair), for --detect-local-mode=ClusterCIDR."),
    f("nodeport-addresses", StrSlice, Config, "CIDRs and the keywords primary, localhost, all: the node addresses that accept NodePorts (default: all in iptables and ipvs modes, primary in nftables mode)."),
    f("oom-score-adj", Int32, Config, "The oom_score_adj of this process, -1000 to 1000 (default -999)."),
    f("conntrack-max-per-core", Int32, Config, "Conntrack entries per CPU (0 leaves the limit and --conntrack-min alone; default 32768)."),
    f("conntrack-min", Int32, Config, "Least nf_conntrack_max (default 131072)."),
    f("conntrack-tcp-timeout-established", Duration, Config, "Idle timeout of established TCP connections, 0 to leave as-is (default 24h0m0s)."),
    f("conntrack-tcp-timeout-close-wait", Duration, Config, "Timeout of TCP connections in CLOSE_WAIT (default 1h0m0s)."),
    f("conntrack-tcp-be-liberal", Bool, Config, "Set nf_conntrack_tcp_be_liberal to 1."),
    f("conntrack-udp-timeout", Duration, Config, "Idle timeout of UNREPLIED UDP flows, 0 to leave as-is."),
    f("conntrack-udp-timeout-stream", Duration, Config, "Idle timeout of ASSURED UDP flows, 0 to leave as-is."),
    f("config-sync-period", Duration, Config, "How often the watchers' state is re-published (default 15m0s)."),
    FlagSpec {
        deprecated: Some("use --healthz-bind-address instead"),
        ..f("healthz-port", Int32, Cli, "The port of the health server; 0 disables it.")
    },
    FlagSpec {
        deprecated: Some("use --metrics-bind-address instead"),
        ..f("metrics-port", Int32, Cli, "The port of the metrics server; 0 disables it.")
    },
    f("logging-format", Str, Logging, "text or json."),
    noop("log-flush-frequency", Duration, Logging, "logs are written unbuffered"),
    FlagSpec {
        shorthand: Some('v'),
        ..f("v", Level, Logging, "Log verbosity: 0-1 info, 2-3 debug (per-sync summaries), 4+ trace.")
    },
    noop("vmodule", VModule, Logging, "per-file verbosity needs Go source files; -v applies to all"),
    noop("log-text-split-stream", Bool, Logging, "logs go to stderr"),
    noop("log-text-info-buffer-size", Str, Logging, "logs are written unbuffered"),
    noop("log-json-split-stream", Bool, Logging, "logs go to stderr"),
    noop("log-json-info-buffer-size", Str, Logging, "logs are written unbuffered"),
    noop("logtostderr", Bool, Cli, KLOG),
    noop("alsologtostderr", Bool, Cli, KLOG),
    noop("log-dir", Str, Cli, KLOG),
    noop("log-file", Str, Cli, KLOG),
    noop("log-file-max-size", Uint64, Cli, KLOG),
    noop("one-output", Bool, Cli, KLOG),
    noop("skip-headers", Bool, Cli, KLOG),
    noop("skip-log-headers", Bool, Cli, KLOG),
    noop("stderrthreshold", Str, Cli, KLOG),
    noop("add-dir-header", Bool, Cli, KLOG),
    noop("log-backtrace-at", Str, Cli, KLOG),
    noop("boot-id-file", Str, Cli, "a cAdvisor flag upstream's binary inherits"),
    noop("machine-id-file", Str, Cli, "a cAdvisor flag upstream's binary inherits"),
    f("version", Str, Cli, "Print the version and exit."),
    FlagSpec {
        shorthand: Some('h'),
        ..f("help", Bool, Cli, "Print this help and exit.")
    },
    // Ours.
    ours("manifests", Str, "Read Services, EndpointSlices, Nodes and ServiceCIDRs from this YAML/JSON file or directory (watched) instead of the API."),
    ours("service-cidrs", Str, "The cluster's service CIDRs, comma-separated, for clusters without ServiceCIDR objects: new connections to unallocated addresses in them are dropped."),
    ours("nftables-table", Str, "Name of our nftables table in the ip and ip6 families (default kube-nlproxy; kube-nlproxy-ipvs in ipvs mode)."),
    ours("localhost-nodeports", Bool, "Serve NodePorts on 127.0.0.1 in every mode (through a userspace forwarder)."),
    ours("no-conntrack-cleanup", Bool, "Do not delete stale UDP/SCTP conntrack entries after syncs (diagnosis only)."),
    ours("reset-dead-endpoint-connections", Bool, "Delete the TCP conntrack entries of endpoints that died (ready, then gone without terminating), so their clients get a reset instead of hanging (nftables and iptables modes)."),
    ours("load-balancing", Str, "How Services without the kube-nlproxy.io/load-balancing annotation pick an endpoint: random (upstream's) or maglev (consistent hashing; nftables and iptables modes, and ipvs mode's mh scheduler)."),
    ours("masquerade-bit", Int32, "The masquerade mark bit of the running mode, over the file and --iptables-masquerade-bit."),
    ours("sync-period", Duration, "The running mode's sync period, over the file and the mode's flag."),
    ours("min-sync-period", Duration, "The running mode's minimum sync period, over the file and the mode's flag."),
    ours("service-proxy-name", Str, "Serve only the Services (and their EndpointSlices) labelled service.kubernetes.io/service-proxy-name=NAME, beside a kube-proxy that serves all the others; empty: every Service without that label, as kube-proxy."),
    ours("once", Bool, "Do one full sync and exit."),
    ours("dry-run", Bool, "Print the ruleset that would be programmed and exit, touching nothing."),
    ours("no-exec-filter", Bool, "Do not install the seccomp filter with which the kernel refuses execve/execveat to this process (diagnosis only)."),
    ours("write-seccomp-profile", Str, "Write the container seccomp profile this binary is tested under (JSON, for a Localhost seccompProfile) to this file and exit."),
];

/// The flag called `name`.
pub fn spec(name: &str) -> Option<&'static FlagSpec> {
    FLAGS.iter().find(|s| s.name == name)
}

pub use handles::{cli, EveryValue, Flag, FlagValue};

/// A command-line error, worded as pflag/cobra word theirs.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct FlagError(pub String);

/// The flags that were given, in order, with their raw values (already checked).
#[derive(Debug, Default, Clone)]
pub struct Parsed {
    pub set: Vec<(&'static FlagSpec, String)>,
}

impl Parsed {
    /// The value of a flag that was given.
    pub fn get<T: FlagValue>(&self, flag: Flag<T>) -> Option<T> {
        self.read(flag.name)
    }
    fn read<T: FlagValue>(&self, name: &str) -> Option<T> {
        if !self.changed(name) {
            return None;
        }
        T::read(&self.all(name))
    }
    /// Whether a flag was given.
    pub fn given<T>(&self, flag: Flag<T>) -> bool {
        self.changed(flag.name)
    }
    /// Whether the flag called `name` was given (prefer [`Parsed::given`]).
    pub fn changed(&self, name: &str) -> bool {
        debug_assert!(spec(name).is_some(), "no flag --{name} in FLAGS");
        self.set.iter().any(|(s, _)| s.name == name)
    }
    /// Every value of the flag called `name`, in order (prefer [`Parsed::get`]).
    pub fn all(&self, name: &str) -> Vec<&str> {
        debug_assert!(spec(name).is_some(), "no flag --{name} in FLAGS");
        self.set
            .iter()
            .filter(|(s, _)| s.name == name)
            .map(|(_, v)| v.as_str())
            .collect()
    }
    /// The last value of the flag called `name` (prefer [`Parsed::get`]).
    pub fn last(&self, name: &str) -> Option<&str> {
        self.all(name).last().copied()
    }
}

/// Reads by name for the tests of the syntax.
#[cfg(test)]
impl Parsed {
    fn bool(&self, name: &str) -> Option<bool> {
        self.read(name)
    }
    fn i32(&self, name: &str) -> Option<i32> {
        self.read(name)
    }
    fn slice(&self, name: &str) -> Option<Vec<String>> {
        self.read(name)
    }
}

/// pflag's StringSlice reads a CSV record: an empty value is an empty list.
pub fn split_list(v: &str) -> Vec<String> {
    if v.is_empty() {
        return Vec::new();
    }
    v.split(',').map(|s| s.trim().to_string()).collect()
}

/// `strconv.ParseBool`.
pub fn parse_bool(s: &str) -> Result<bool, String> {
    match s {
        "1" | "t" | "T" | "TRUE" | "true" | "True" => Ok(true),
        "0" | "f" | "F" | "FALSE" | "false" | "False" => Ok(false),
        _ => Err(format!("strconv.ParseBool: parsing {s:?}: invalid syntax")),
    }
}

/// `strconv.ParseInt(s, 0, 64)`: sign, then `0x`, `0o`, `0b` or a leading `0` (octal).
fn parse_i64(s: &str) -> Result<i64, String> {
    let bad = || format!("strconv.ParseInt: parsing {s:?}: invalid syntax");
    let (neg, body) = match s.strip_prefix('-') {
        Some(b) => (true, b),
        None => (false, s.strip_prefix('+').unwrap_or(s)),
    };
    let (radix, digits) = if let Some(d) = body.strip_prefix("0x").or(body.strip_prefix("0X")) {
        (16, d)
    } else if let Some(d) = body.strip_prefix("0o").or(body.strip_prefix("0O")) {
        (8, d)
    } else if let Some(d) = body.strip_prefix("0b").or(body.strip_prefix("0B")) {
        (2, d)
    } else if body.len() > 1 && body.starts_with('0') {
        (8, &body[1..])
    } else {
        (10, body)
    };
    let digits = if radix != 10 {
        digits.replace('_', "")
    } else {
        digits.to_string()
    };
    if digits.is_empty() || digits.starts_with(['+', '-']) {
        return Err(bad());
    }
    let mag = i128::from_str_radix(&digits, radix).map_err(|_| bad())?;
    let v = if neg { -mag } else { mag };
    i64::try_from(v).map_err(|_| format!("strconv.ParseInt: parsing {s:?}: value out of range"))
}

pub fn parse_int(s: &str) -> Result<i32, String> {
    let v = parse_i64(s)?;
    i32::try_from(v).map_err(|_| format!("strconv.ParseInt: parsing {s:?}: value out of range"))
}

fn parse_uint(s: &str, bits: u32) -> Result<u64, String> {
    if s.starts_with(['+', '-']) {
        return Err(format!("strconv.ParseUint: parsing {s:?}: invalid syntax"));
    }
    let v = parse_i64(s).map_err(|e| e.replace("ParseInt", "ParseUint"))?;
    let v = u64::try_from(v)
        .map_err(|_| format!("strconv.ParseUint: parsing {s:?}: invalid syntax"))?;
    if bits < 64 && v >> bits != 0 {
        return Err(format!(
            "strconv.ParseUint: parsing {s:?}: value out of range"
        ));
    }
    Ok(v)
}

/// Checks a value as the flag's pflag.Value would in `Set`.
fn check(spec: &FlagSpec, v: &str) -> Result<(), String> {
    match spec.kind {
        Bool => parse_bool(v).map(|_| ()),
        Str | StrSlice => Ok(()),
        Int32 => parse_int(v).map(|_| ()),
        Uint64 => parse_uint(v, 64).map(|_| ()),
        Level => parse_uint(v, 32).map(|_| ()),
        Float32 => v
            .parse::<f32>()
            .ok()
            .filter(|x| x.is_finite() || v.eq_ignore_ascii_case("inf"))
            .map(|_| ())
            .ok_or_else(|| format!("strconv.ParseFloat: parsing {v:?}: invalid syntax")),
        Duration => duration::parse(v).map(|_| ()).map_err(|e| e.to_string()),
        MapBool => {
            for kv in v.split(',').map(str::trim).filter(|s| !s.is_empty()) {
                let Some((k, b)) = kv.split_once('=') else {
                    return Err(format!("missing bool value for {kv}"));
                };
                parse_bool(b.trim()).map_err(|e| {
                    format!("invalid value of {}: {}, err: {e}", k.trim(), b.trim())
                })?;
            }
            Ok(())
        }
        Ip => {
            if v.is_empty() || v1alpha1::parse_ip_sloppy(v).is_some() {
                Ok(())
            } else {
                Err(format!("{v:?} is not a valid IP address"))
            }
        }
        IpPort => {
            if v.is_empty() || v1alpha1::parse_ip_sloppy(v).is_some() {
                return Ok(());
            }
            let (host, port) = v1alpha1::split_host_port(v).ok_or_else(|| {
                format!("{v:?} is not in a valid format (ip or ip:port): missing port in address")
            })?;
            if v1alpha1::parse_ip_sloppy(host).is_none() {
                return Err(format!("{host:?} is not a valid IP address"));
            }
            port.parse::<u16>()
                .map(|_| ())
                .map_err(|_| format!("{port:?} is not a valid number"))
        }
        VModule => {
            for item in v.split(',').filter(|s| !s.is_empty()) {
                let Some((pat, n)) = item.split_once('=') else {
                    return Err(format!("{item:?} does not have the pattern=N format"));
                };
                if pat.is_empty() {
                    return Err(format!("{item:?} does not have the pattern=N format"));
                }
                parse_uint(n, 32).map_err(|e| format!("parsing verbosity in {item:?}: {e}"))?;
            }
            Ok(())
        }
    }
}

/// pflag's `WordSepNormalizeFunc`: `_` and `.` (for the klog names) read as `-`.
fn normalize(name: &str) -> String {
    name.replace(['_', '.'], "-")
}

/// Parses the arguments after the program name.
pub fn parse<I, S>(args: I) -> Result<Parsed, FlagError>
where
    I: IntoIterator<Item = S>,
    S: AsRef<std::ffi::OsStr>,
{
    let mut args: std::collections::VecDeque<String> = args
        .into_iter()
        .map(|a| {
            a.as_ref()
                .to_str()
                .map(str::to_string)
                .ok_or_else(|| FlagError(format!("argument {:?} is not UTF-8", a.as_ref())))
        })
        .collect::<Result<_, _>>()?;
    let mut out = Parsed::default();
    let mut positional = Vec::new();
    while let Some(a) = args.pop_front() {
        if a == "--" {
            positional.extend(args.drain(..));
            break;
        }
        let (spec, value) = if let Some(body) = a.strip_prefix("--") {
            parse_long(body, &mut args)?
        } else if let Some(body) = a.strip_prefix('-').filter(|b| !b.is_empty()) {
            parse_shorthand(body, &mut args)?
        } else {
            positional.push(a);
            continue;
        };
        check(spec, &value).map_err(|why| {
            FlagError(format!(
                "invalid argument {value:?} for \"--{}\" flag: {why}",
                spec.name
            ))
        })?;
        out.set.push((spec, value));
    }
    if positional.iter().any(|a| !a.is_empty()) {
        return Err(FlagError(format!(
            "\"kube-proxy\" does not take any arguments, got {positional:?}"
        )));
    }
    Ok(out)
}

/// `--name=value`, `--name value` or a bare boolean `--name`: the flag and its raw value.
fn parse_long(
    body: &str,
    args: &mut std::collections::VecDeque<String>,
) -> Result<(&'static FlagSpec, String), FlagError> {
    let (name, inline) = match body.split_once('=') {
        Some((n, v)) => (n, Some(v.to_string())),
        None => (body, None),
    };
    let norm = normalize(name);
    let spec = spec(&norm).ok_or_else(|| FlagError(format!("unknown flag: --{name}")))?;
    let value = match (inline, spec.kind) {
        (Some(v), _) => v,
        (None, Bool) => "true".into(),
        // `--version` alone means `--version=true`.
        (None, Str) if spec.name == "version" => "true".into(),
        (None, _) => args
            .pop_front()
            .ok_or_else(|| FlagError(format!("flag needs an argument: --{name}")))?,
    };
    Ok((spec, value))
}

/// `-v=2`, `-v2`, `-v 2`, `-h`: the flag and its raw value. Only -v and -h exist.
fn parse_shorthand(
    body: &str,
    args: &mut std::collections::VecDeque<String>,
) -> Result<(&'static FlagSpec, String), FlagError> {
    let mut chars = body.chars();
    let c = chars.next().unwrap_or('-');
    let rest: String = chars.collect();
    let spec = FLAGS
        .iter()
        .find(|s| s.shorthand == Some(c))
        .ok_or_else(|| FlagError(format!("unknown shorthand flag: '{c}' in -{body}")))?;
    let value = if let Some(v) = rest.strip_prefix('=') {
        v.to_string()
    } else if !rest.is_empty() {
        if spec.kind == Bool {
            return Err(FlagError(format!(
                "unknown shorthand flag: '{}' in -{body}",
                rest.chars().next().unwrap_or(' ')
            )));
        }
        rest
    } else if spec.kind == Bool {
        "true".into()
    } else {
        args.pop_front()
            .ok_or_else(|| FlagError(format!("flag needs an argument: '{c}' in -{body}")))?
    };
    Ok((spec, value))
}

/// `--help`: every flag with its kind, default and meaning here.
pub fn usage() -> String {
    let mut s = String::from(
        "kube-nlproxy: a Kubernetes service proxy that programs the kernel only through netlink.\n\
         A drop-in for kube-proxy: it takes upstream's flags and KubeProxyConfiguration file.\n\n\
         Usage:\n  kube-nlproxy [flags]\n\nFlags:\n",
    );
    for spec in FLAGS {
        let kind = match spec.kind {
            Bool => "",
            Str => " string",
            Int32 => " int32",
            Uint64 => " uint",
            Float32 => " float32",
            Duration => " duration",
            StrSlice => " strings",
            MapBool => " mapStringBool",
            Ip => " ip",
            IpPort => " ipport",
            Level => " Level",
            VModule => " pattern=N,...",
        };
        let short = match spec.shorthand {
            Some(c) => format!("-{c}, "),
            None => "    ".into(),
        };
        let mut help = spec.help.to_string();
        if let Meaning::NoEffect(why) = spec.meaning {
            help = format!("Accepted; no effect here: {why}.");
        }
        if let Some(d) = spec.deprecated {
            help.push_str(&format!(" (DEPRECATED: {d})"));
        }
        if spec.ours {
            help.push_str(" [kube-nlproxy]");
        }
        s.push_str(&format!("  {short}--{}{kind}\n        {help}\n", spec.name));
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(args: &[&str]) -> Result<Parsed, FlagError> {
        parse(args.iter())
    }

    /// A value every flag accepts, for the table test.
    fn sample(kind: Kind) -> &'static str {
        match kind {
            Bool => "false",
            Str | StrSlice => "x",
            Int32 | Uint64 | Level => "3",
            Float32 => "2.5",
            Duration => "90s",
            MapBool => "A=true",
            Ip => "10.0.0.1",
            IpPort => "10.0.0.1:99",
            VModule => "foo=2",
        }
    }

    #[test]
    fn every_flag_parses_in_each_syntax() {
        for spec in FLAGS {
            let v = sample(spec.kind);
            let forms = [
                vec![format!("--{}={v}", spec.name)],
                vec![format!("--{}", spec.name), v.to_string()],
                vec![format!("--{}={v}", spec.name.replace('-', "_"))],
            ];
            for form in forms {
                if (spec.kind == Bool || spec.name == "version") && form.len() == 2 {
                    // pflag: a bool's (and --version's) value must be joined with '='.
                    let r = parse(form.iter());
                    assert!(r.is_err(), "{form:?}: a loose value is an argument");
                    continue;
                }
                let r = parse(form.iter()).unwrap_or_else(|e| panic!("{form:?}: {e}"));
                assert_eq!(r.last(spec.name), Some(v), "{form:?}");
            }
        }
    }

    #[test]
    fn pflag_syntax() {
        let r = p(&[
            "--masquerade-all",
            "--ipvs-strict-arp=false",
            "-v=4",
            "--v",
            "5",
        ])
        .unwrap();
        assert_eq!(r.bool("masquerade-all"), Some(true));
        assert_eq!(r.bool("ipvs-strict-arp"), Some(false));
        assert_eq!(r.last("v"), Some("5"), "repeated: last wins");
        assert_eq!(p(&["-v2"]).unwrap().last("v"), Some("2"));
        assert_eq!(p(&["-v", "3"]).unwrap().last("v"), Some("3"));
        let r = p(&[
            "--nodeport-addresses=10.0.0.0/8,primary",
            "--nodeport-addresses",
            "localhost",
        ])
        .unwrap();
        assert_eq!(
            r.slice("nodeport-addresses").unwrap(),
            vec!["10.0.0.0/8", "primary", "localhost"],
            "slices append like pflag's"
        );
        assert_eq!(
            p(&["--oom-score-adj", "-998"])
                .unwrap()
                .i32("oom-score-adj"),
            Some(-998)
        );
        assert_eq!(
            p(&["--oom-score-adj=0x10"]).unwrap().i32("oom-score-adj"),
            Some(16)
        );
        assert_eq!(
            p(&["--log_file=/x", "--log_dir", "/y"])
                .unwrap()
                .last("log-dir"),
            Some("/y")
        );
        assert!(p(&["--", ""]).is_ok(), "empty arguments are allowed");
        assert_eq!(p(&["--version"]).unwrap().last("version"), Some("true"));
    }

    #[test]
    fn errors_read_like_pflags() {
        for (args, want) in [
            (&["--foo"][..], "unknown flag: --foo"),
            (&["-x"], "unknown shorthand flag: 'x' in -x"),
            (&["--config"], "flag needs an argument: --config"),
            (&["--kube-api-qps=abc"], "invalid argument \"abc\" for \"--kube-api-qps\" flag"),
            (&["--iptables-sync-period=5"], "invalid argument \"5\" for \"--iptables-sync-period\" flag: time: missing unit in duration \"5\""),
            (&["--masquerade-all=maybe"], "strconv.ParseBool"),
            (&["--oom-score-adj=99999999999"], "value out of range"),
            (&["--bind-address=1.2.3"], "is not a valid IP address"),
            (&["--healthz-bind-address=1.2.3.4:x"], "is not a valid number"),
            (&["--feature-gates=A"], "missing bool value for A"),
            (&["--feature-gates=A=yes"], "invalid value of A: yes"),
            (&["-v=-1"], "strconv.ParseUint"),
            (&["--vmodule=foo"], "pattern=N"),
            (&["stray"], "does not take any arguments"),
            (&["--masquerade-all", "false"], "does not take any arguments"),
        ] {
            let e = p(args).unwrap_err().0;
            assert!(e.contains(want), "{args:?}: {e}");
        }
    }

    #[test]
    fn the_deprecated_and_klog_flags_exist() {
        for name in [
            "healthz-port",
            "metrics-port",
            "logtostderr",
            "alsologtostderr",
            "log-dir",
            "log-file",
            "log-file-max-size",
            "one-output",
            "skip-headers",
            "skip-log-headers",
            "stderrthreshold",
            "add-dir-header",
            "vmodule",
            "log-flush-frequency",
            "bind-address-hard-fail",
            "init-only",
            "profiling",
            "show-hidden-metrics-for-version",
            "kube-api-content-type",
            "kube-api-qps",
            "kube-api-burst",
        ] {
            assert!(spec(name).is_some(), "{name}");
        }
        let names: std::collections::HashSet<_> = FLAGS.iter().map(|s| s.name).collect();
        assert_eq!(names.len(), FLAGS.len(), "no flag twice");
    }

    #[test]
    fn usage_lists_every_flag() {
        let u = usage();
        for spec in FLAGS {
            assert!(u.contains(&format!("--{}", spec.name)), "{}", spec.name);
        }
    }
}
