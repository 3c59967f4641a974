//! What the proxy sets on the host before its proxier opens: the privileged steps
//! (`--init-only` does only these), the conntrack sysctl that decides the INVALID drop, and
//! `route_localnet`; and which IP families run, with upstream's start-up checks. I/O (/proc/sys,
//! /proc/net, /proc/self).

use crate::config::{startup_checks, Config};
use crate::kernel::conntrack::tuning;
use crate::model::NodeInfo;
use crate::proxy::families::{self, ip_family_name, Ipv6Kernel};

use super::AppError;

use super::process;

/// The steps that need full privileges, so that the daemon itself can run with
/// CAP_NET_ADMIN only: the OOM score and the conntrack sysctls. Failures are warnings.
pub(super) fn apply_privileged(cfg: &Config) {
    process::set_oom_score_adj(cfg.oom_score_adj);
    crate::kernel::sysctl::log_failures(
        &tuning::apply(&cfg.conntrack),
        "without privilege /proc/sys is read-only: set these on the host (sysctl.d)",
    );
}

/// Before a proxier over the kernel opens: the privileged steps, then what reads or goes
/// with them (the INVALID drop, `route_localnet`).
pub(super) fn prepare(cfg: &mut Config) {
    apply_privileged(cfg);
    resolve_drop_invalid(&mut cfg.proxier);
    if cfg.proxier.localnet_guard {
        set_route_localnet();
    }
}

/// Which IP families to program (upstream's `platformCheckSupported` and `detectNodeIPs`,
/// with their log lines): IPv4 alone when the host has no usable IPv6, which is an error
/// when IPv6 is the primary family (from `--bind-address`, else the Node's first address).
/// Then upstream's checks of the configuration against those families
/// ([`startup_checks`]): logged as errors, or fatal where upstream's are.
pub(super) fn choose_families(cfg: &mut Config, node: &NodeInfo) -> Result<(), AppError> {
    let ipv6 = read_ipv6_kernel();
    match ipv6 {
        Ipv6Kernel::Usable => {}
        Ipv6Kernel::Absent => tracing::info!(ipFamily = "IPv6", "No kernel support for family"),
        Ipv6Kernel::Disabled => {
            tracing::info!(ipFamily = "IPv6", "Kernel support disabled for family")
        }
    }
    let bind = cfg.upstream.bind_address.parse().ok();
    let primary = families::primary_family(bind, &node.addresses);
    cfg.families = families::families(primary, ipv6).map_err(AppError::StartUp)?;
    let dual_stack = cfg.families.len() > 1;
    if dual_stack {
        tracing::info!(
            "primary ipFamily" = ip_family_name(primary),
            "kube-proxy running in dual-stack mode"
        );
    } else {
        tracing::info!(
            ipFamily = ip_family_name(primary),
            "kube-proxy running in single-stack mode"
        );
    }
    // Upstream's checkBadConfig and checkBadIPConfig, over the Node's addresses and pod CIDRs.
    let pod_cidrs: Vec<String> = node.pod_cidrs.iter().map(ToString::to_string).collect();
    let found = startup_checks::check_startup_config(
        &cfg.upstream,
        primary,
        dual_stack,
        &node.addresses,
        &pod_cidrs,
    );
    for err in &found.warnings {
        tracing::error!(err = %err, "Kube-proxy configuration may be incomplete or incorrect");
    }
    found.fatal.map_or(Ok(()), |f| Err(AppError::StartUp(f)))
}

/// What `/proc` says of IPv6 in this network namespace.
fn read_ipv6_kernel() -> Ipv6Kernel {
    let disable = std::fs::read_to_string("/proc/sys/net/ipv6/conf/all/disable_ipv6").ok();
    Ipv6Kernel::from_proc(
        std::path::Path::new("/proc/net/if_inet6").exists(),
        disable.as_deref(),
    )
}

/// Upstream's iptables mode reads nf_conntrack_tcp_be_liberal once its conntrack tuning is
/// applied and drops INVALID packets only when it reads 0 (`NewProxier`). The tuning only
/// ever sets the sysctl to 1, so a second call after it can only turn the drop off.
pub(super) fn resolve_drop_invalid(p: &mut crate::proxy::ProxierConfig) {
    if !p.drop_invalid {
        return;
    }
    let liberal = tuning::read_tcp_be_liberal();
    p.drop_invalid = tuning::drops_invalid(true, &liberal);
    match liberal {
        Ok(_) if !p.drop_invalid => tracing::info!(
            sysctl = tuning::TCP_BE_LIBERAL,
            "nf_conntrack_tcp_be_liberal set, not installing DROP rules for INVALID packets"
        ),
        Ok(_) => {}
        Err(e) => tracing::debug!(sysctl = tuning::TCP_BE_LIBERAL, err = %e,
            "cannot read nf_conntrack_tcp_be_liberal; dropping INVALID packets as upstream does"),
    }
}

/// Upstream's iptables mode with localhost NodePorts sets
/// `net.ipv4.conf.all.route_localnet=1` (kubernetes#90259, with its log line) and our table
/// carries the guard it comes with ([`crate::proxy::ProxierConfig::localnet_guard`]). Our
/// forwarder does not need it; the node is left as upstream leaves it (scripts and upstream's
/// e2e spec "[Feature:KubeProxyNFAcct]" read it). A failure is a warning, where upstream's
/// proxier stops: the forwarder works without it.
fn set_route_localnet() {
    const ROUTE_LOCALNET: &str = "/proc/sys/net/ipv4/conf/all/route_localnet";
    tracing::info!("Setting route_localnet=1 to allow node-ports on localhost; to change this either disable iptables.localhostNodePorts (--iptables-localhost-nodeports) or set nodePortAddresses (--nodeport-addresses) to filter loopback addresses");
    if std::fs::read_to_string(ROUTE_LOCALNET).is_ok_and(|v| v.trim() == "1") {
        return;
    }
    if let Err(e) = std::fs::write(ROUTE_LOCALNET, "1") {
        tracing::warn!(sysctl = ROUTE_LOCALNET, err = %e, "cannot set route_localnet");
    }
}
