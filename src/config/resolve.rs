//! The last phase of reading the configuration: the validated upstream configuration and our
//! own flags turned into the values the daemon runs with, one small function per derived
//! value (mode, node name, service CIDRs, detect-local, NodePort addresses, nftables table,
//! API server, servers, IPVS, localhost NodePorts, conntrack). Each error names the flag or
//! the file field the value came from. It reads what loading handed on (the configuration
//! and the typed [`CliOptions`]), never the raw flags. Pure apart from reading the kernel's
//! host name.

use std::net::{IpAddr, SocketAddr};

use super::file::internal::KubeProxyConfig;
use super::file::v1alpha1::{self, GoDuration};
use super::flags::fields::Namer;
use super::flags::options::CliOptions;
use super::load::Loaded;
use super::{bad, cidr_sloppy, gates, hostname, valid_ifname, Config, ConfigError, ProxyMode};
use crate::kernel::conntrack::tuning::ConntrackConfig;
use crate::kernel::nft::Cidr;
use crate::model::{LoadBalancing, Protocol};
use crate::modes::ipvs::plan::{IpvsConfig, SCHEDULERS};
use crate::proxy::{
    names, DetectLocal, LocalDetector, LoopbackListeners, LoopbackNodePorts, LoopbackPolicy,
    NodePortAddresses, ProxierConfig,
};

/// The effective configuration, from the loaded and validated upstream one, the other
/// flags and the feature gates.
pub(super) fn resolve(loaded: Loaded, gates: gates::FeatureGates) -> Result<Config, ConfigError> {
    let Loaded {
        config: kp,
        options: o,
        namer,
        mode_defaulted,
        file,
        mut warnings,
    } = loaded;
    let mut notices = Vec::new();
    let mode = resolve_mode(&kp, mode_defaulted, &mut notices);
    let node_name = resolve_node_name(&kp)?;
    let mut rules = resolve_rules(&o, &kp, mode, &gates, &namer)?;
    rules.proxier.load_balancing = resolve_load_balancing(&o, &kp, mode, &mut warnings)?;
    let master = resolve_master(&o)?;
    let service_selection = resolve_service_selection(&o, mode, &mut warnings)?;
    rules.proxier.drop_unallocated = service_selection.proxy_name().is_none();
    let healthz_bind_address =
        resolve_server("healthzBindAddress", &kp.healthz_bind_address, &namer)?;
    let metrics_bind_address =
        resolve_server("metricsBindAddress", &kp.metrics_bind_address, &namer)?;
    let mut ipvs = resolve_ipvs(&kp, &namer)?;
    ipvs.load_balancing = rules.proxier.load_balancing;
    let reset_dead_endpoint_connections = resolve_dead_endpoint_reset(&o, &kp, mode, &mut warnings);
    let (config_path, config_bytes) = file.unzip();
    Ok(Config {
        families: crate::model::net::Family::all().to_vec(),
        oom_score_adj: kp
            .oom_score_adj
            .unwrap_or(v1alpha1::KUBE_PROXY_OOM_SCORE_ADJ),
        write_config_to: o.write_config_to,
        write_seccomp_profile: o.write_seccomp_profile,
        exec_filter: o.exec_filter,
        state_tool: None,
        config_path,
        config_bytes,
        manifests: o.manifests,
        service_selection,
        kubeconfig: non_empty(Some(kp.client_connection.kubeconfig.clone())).map(Into::into),
        content_type: kp.client_connection.content_type.clone(),
        accept_content_types: kp.client_connection.accept_content_types.clone(),
        master,
        node_name,
        mode,
        requested_mode: kp.mode.clone(),
        mode_defaulted,
        ipvs,
        proxier: rules.proxier,
        sync_period: kp.sync_period.std(),
        min_sync_period: kp.min_sync_period.std(),
        config_sync_period: kp.config_sync_period.std(),
        healthz_bind_address,
        metrics_bind_address,
        bind_address_hard_fail: kp.bind_address_hard_fail,
        cleanup: o.cleanup,
        once: o.once,
        dry_run: o.dry_run,
        init_only: o.init_only,
        conntrack_cleanup: o.conntrack_cleanup,
        reset_dead_endpoint_connections,
        json_logs: kp.logging.format == "json",
        localhost_listeners: rules.localhost_listeners,
        verbosity: kp.logging.verbosity,
        log_level: log_level(kp.logging.verbosity),
        conntrack: resolve_conntrack(&kp),
        notices,
        warnings,
        detect_local: rules.detect_local,
        gates,
        flagz: o.flagz,
        upstream: kp,
    })
}

/// `--reset-dead-endpoint-connections`; warned about where the mode cannot honour it.
fn resolve_dead_endpoint_reset(
    o: &CliOptions,
    kp: &KubeProxyConfig,
    mode: ProxyMode,
    warnings: &mut Vec<String>,
) -> bool {
    let on = o.reset_dead_endpoint_connections;
    let why = match mode {
        ProxyMode::Ipvs => "IPVS forwards by its own connection table, not by conntrack's",
        ProxyMode::Userspace => "the userspace proxy's own sessions are the connections",
        ProxyMode::Nftables => return on,
    };
    if on {
        warnings.push(format!(
            "--reset-dead-endpoint-connections has no effect in {} mode: {why}",
            kp.mode
        ));
    }
    on
}

fn non_empty(s: Option<String>) -> Option<String> {
    s.filter(|s| !s.is_empty())
}

/// The engine that serves the configured mode, with a notice saying how.
fn resolve_mode(kp: &KubeProxyConfig, defaulted: bool, notices: &mut Vec<String>) -> ProxyMode {
    match kp.mode.as_str() {
        "ipvs" => {
            notices.push(
                "ipvs mode: upstream kube-proxy deprecates its ipvs proxier (disabled by default \
                 in 1.40, removed in 1.43); kube-nlproxy keeps serving IPVS mode"
                    .into(),
            );
            ProxyMode::Ipvs
        }
        "userspace" => ProxyMode::Userspace,
        "nftables" => ProxyMode::Nftables,
        _ => {
            notices.push(if defaulted {
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
    }
}

/// `hostnameOverride`, else the kernel's host name.
fn resolve_node_name(kp: &KubeProxyConfig) -> Result<String, ConfigError> {
    let node_name = if kp.hostname_override.trim().is_empty() {
        hostname()
    } else {
        kp.hostname_override.trim().to_lowercase()
    };
    if node_name.is_empty() {
        return Err(bad("--hostname-override", "empty node name"));
    }
    Ok(node_name)
}

/// What the rules are planned from: the planner's settings, the detect-local mode they
/// came from and the loopback listeners that go with them.
struct RuleSettings {
    proxier: ProxierConfig,
    detect_local: DetectLocal,
    localhost_listeners: LoopbackListeners,
}

/// The planner's settings, in the order their values are checked.
fn resolve_rules(
    o: &CliOptions,
    kp: &KubeProxyConfig,
    mode: ProxyMode,
    gates: &gates::FeatureGates,
    namer: &Namer,
) -> Result<RuleSettings, ConfigError> {
    let service_cidrs = resolve_service_cidrs(o)?;
    let detect_local = resolve_detect_local(kp, namer)?;
    let nodeport_addresses = resolve_nodeport_addresses(kp, namer)?;
    let table = resolve_table(o, mode)?;
    let (localhost_listeners, loopback_nodeports) =
        localhost_nodeports(kp, &nodeport_addresses, gates, o.localhost_nodeports);
    // Upstream's iptables mode sets route_localnet=1 for its localhost NodePorts and
    // guards it; ours forwards them in userspace but leaves the node as upstream does.
    let localnet_guard = iptables_localhost_nodeports(kp, &nodeport_addresses);
    let proxier = ProxierConfig {
        table,
        masquerade_bit: masquerade_bit(kp),
        masquerade_all: kp.masquerade_all,
        local_detector: local_detector(&detect_local),
        nodeport_addresses,
        service_cidrs,
        // Upstream's; `--service-proxy-name` turns it off (resolved after this).
        drop_unallocated: true,
        // Upstream's iptables mode (also what an empty mode means); whether the kernel is
        // liberal is read once the conntrack tuning is applied.
        drop_invalid: kp.mode == "iptables",
        loopback_nodeports,
        localnet_guard,
        load_balancing: LoadBalancing::Random,
    };
    Ok(RuleSettings {
        proxier,
        detect_local,
        localhost_listeners,
    })
}

/// `--load-balancing`: `random` (the default, upstream's) or `maglev`. Userspace mode picks
/// endpoints in turn whatever is asked, which is not an error (the flag may be shared by
/// every node of a cluster) but is said.
fn resolve_load_balancing(
    o: &CliOptions,
    kp: &KubeProxyConfig,
    mode: ProxyMode,
    warnings: &mut Vec<String>,
) -> Result<LoadBalancing, ConfigError> {
    let Some(s) = &o.load_balancing else {
        return Ok(LoadBalancing::Random);
    };
    let lb = LoadBalancing::parse(s.trim()).ok_or_else(|| {
        bad(
            "--load-balancing",
            format!("unknown value {s:?} (want random or maglev)"),
        )
    })?;
    if lb == LoadBalancing::Maglev && mode == ProxyMode::Userspace {
        warnings.push(format!(
            "--load-balancing=maglev has no effect in {} mode: its listeners pick endpoints in turn",
            kp.mode
        ));
    }
    Ok(lb)
}

/// `--service-proxy-name`: a label value, or empty for upstream's selection. Beside
/// kube-proxy no address of the service CIDRs is dropped as unallocated (the other proxy's
/// ClusterIPs are in them): `--service-cidrs` is then said to have no effect.
/// IPVS mode is refused: ours would share `kube-ipvs0` and the IPVS table with kube-proxy's
/// IPVS mode and take its virtual servers for stale ones of its own.
fn resolve_service_selection(
    o: &CliOptions,
    mode: ProxyMode,
    warnings: &mut Vec<String>,
) -> Result<crate::source::convert::ServiceSelection, ConfigError> {
    let selection =
        crate::source::convert::ServiceSelection::from_flag(o.service_proxy_name.trim())
            .map_err(|why| bad("--service-proxy-name", why))?;
    if selection.proxy_name().is_some() && mode == ProxyMode::Ipvs {
        return Err(bad(
            "--service-proxy-name",
            "not in ipvs mode, whose kube-ipvs0 link and virtual servers kube-proxy's ipvs mode would share; run ours in nftables or iptables mode beside kube-proxy",
        ));
    }
    if selection.proxy_name().is_some() && o.given("service-cidrs") {
        warnings.push(
            "--service-cidrs has no effect with --service-proxy-name: beside kube-proxy, no address of the service CIDRs is dropped as unallocated".into(),
        );
    }
    Ok(selection)
}

/// `--service-cidrs`: comma-separated CIDRs.
fn resolve_service_cidrs(o: &CliOptions) -> Result<Vec<Cidr>, ConfigError> {
    match &o.service_cidrs {
        Some(s) if !s.trim().is_empty() => s
            .split(',')
            .map(str::trim)
            .filter(|x| !x.is_empty())
            .map(|x| x.parse::<Cidr>().map_err(|e| bad("--service-cidrs", e)))
            .collect(),
        _ => Ok(Vec::new()),
    }
}

/// The detect-local mode with what it needs: the cluster CIDRs (always parsed) or the
/// interface name or prefix.
fn resolve_detect_local(kp: &KubeProxyConfig, namer: &Namer) -> Result<DetectLocal, ConfigError> {
    let cluster_cidrs: Vec<Cidr> = kp
        .detect_local
        .cluster_cidrs
        .iter()
        .map(|c| {
            cidr_sloppy(c)
                .ok_or_else(|| bad(&namer.name("clusterCIDR"), format!("{c:?} is not a CIDR")))
        })
        .collect::<Result<_, _>>()?;
    let interface = |field: &str, name: &String, what: &str| {
        if valid_ifname(name) {
            Ok(name.clone())
        } else {
            Err(bad(
                &namer.name(field),
                format!("{name:?} is not a valid interface {what}"),
            ))
        }
    };
    Ok(match kp.detect_local_mode.as_str() {
        "NodeCIDR" => DetectLocal::NodeCidr,
        "BridgeInterface" => DetectLocal::BridgeInterface(interface(
            "detectLocal.bridgeInterface",
            &kp.detect_local.bridge_interface,
            "name",
        )?),
        "InterfaceNamePrefix" => DetectLocal::InterfaceNamePrefix(interface(
            "detectLocal.interfaceNamePrefix",
            &kp.detect_local.interface_name_prefix,
            "name prefix",
        )?),
        _ => DetectLocal::ClusterCidr(cluster_cidrs),
    })
}

/// What the rules match as local traffic (NodeCIDR resolves once the Node is known).
fn local_detector(detect_local: &DetectLocal) -> LocalDetector {
    match detect_local {
        DetectLocal::ClusterCidr(c) if !c.is_empty() => LocalDetector::Cidrs(c.clone()),
        DetectLocal::BridgeInterface(b) => LocalDetector::Bridge(b.clone()),
        DetectLocal::InterfaceNamePrefix(p) => LocalDetector::InterfacePrefix(p.clone()),
        _ => LocalDetector::None,
    }
}

/// `nodePortAddresses`: CIDRs and the keywords `primary`, `localhost`, `all`.
fn resolve_nodeport_addresses(
    kp: &KubeProxyConfig,
    namer: &Namer,
) -> Result<NodePortAddresses, ConfigError> {
    let mut addresses = NodePortAddresses::default();
    let cidrs = |list: [&'static str; 2]| list.into_iter().filter_map(cidr_sloppy);
    for a in kp.node_port_addresses.iter().flatten() {
        match a.as_str() {
            "primary" => addresses.primary = true,
            "localhost" => addresses.cidrs.extend(cidrs(["127.0.0.0/8", "::1/128"])),
            "all" => addresses.cidrs.extend(cidrs(["0.0.0.0/0", "::/0"])),
            c => addresses.cidrs.push(cidr_sloppy(c).ok_or_else(|| {
                bad(
                    &namer.name("nodePortAddresses"),
                    format!("{c:?} is not a CIDR"),
                )
            })?),
        }
    }
    Ok(addresses)
}

/// The running mode's masquerade bit (14 unless configured).
fn masquerade_bit(kp: &KubeProxyConfig) -> u8 {
    let bit = match kp.mode.as_str() {
        "nftables" => kp.nftables_masquerade_bit,
        _ => kp.iptables.masquerade_bit,
    }
    .unwrap_or(14);
    u8::try_from(bit).unwrap_or(14)
}

/// `--nftables-table`, else the mode's default table.
fn resolve_table(o: &CliOptions, mode: ProxyMode) -> Result<String, ConfigError> {
    let table = match &o.nftables_table {
        Some(t) => t.clone(),
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
    Ok(table)
}

/// `--master`: an http(s) URL, or none.
fn resolve_master(o: &CliOptions) -> Result<Option<String>, ConfigError> {
    let master = o.master.clone();
    if let Some(m) = &master {
        if !(m.starts_with("http://") || m.starts_with("https://")) {
            return Err(bad("--master", format!("{m:?} is not an http(s) URL")));
        }
    }
    Ok(master)
}

/// A server's `IP:port`; empty disables the server.
fn resolve_server(field: &str, s: &str, namer: &Namer) -> Result<Option<SocketAddr>, ConfigError> {
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
}

/// The IPVS settings, checked.
fn resolve_ipvs(kp: &KubeProxyConfig, namer: &Namer) -> Result<IpvsConfig, ConfigError> {
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
    ours: bool,
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
    if ours || iptables_localhost_nodeports(kp, addresses) {
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

/// The conntrack tuning: negative counts and non-positive timeouts leave the kernel alone.
fn resolve_conntrack(kp: &KubeProxyConfig) -> ConntrackConfig {
    let ct = &kp.conntrack;
    let pos = |d: Option<GoDuration>| d.filter(|d| d.0 > 0).map(GoDuration::std);
    ConntrackConfig {
        max_per_core: ct.max_per_core.and_then(|v| u32::try_from(v).ok()),
        min: ct.min.and_then(|v| u32::try_from(v).ok()),
        tcp_established_timeout: pos(ct.tcp_established_timeout),
        tcp_close_wait_timeout: pos(ct.tcp_close_wait_timeout),
        tcp_be_liberal: ct.tcp_be_liberal,
        udp_timeout: pos(Some(ct.udp_timeout)),
        udp_stream_timeout: pos(Some(ct.udp_stream_timeout)),
    }
}

/// The default log filter for upstream's `-v`.
fn log_level(verbosity: u32) -> &'static str {
    match verbosity {
        0 | 1 => "info",
        2 | 3 => "debug",
        _ => "trace",
    }
}
