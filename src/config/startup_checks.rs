//! Upstream kube-proxy's start-up configuration checks (cmd/kube-proxy/app/server.go,
//! v1.37.2): `checkBadConfig` and `checkBadIPConfig` with their helpers `badCIDRs` and
//! `badBindAddress`, and `expandNodePortAddressKeywords`, which upstream runs just before
//! them and whose result they read. Once the node's primary IP family, its IPs and its pod
//! CIDRs are known, they say which settings look wrong for that family: most findings are
//! only logged, a wrong-family CIDR that the local-traffic detector relies on stops the
//! start. Addresses are read as upstream's `netutils` reads them: sloppily (leading zeros),
//! an unparseable value belongs to no family, and an IPv4-mapped IPv6 address is IPv4.
//! Messages are upstream's, word for word. Pure.

use std::net::IpAddr;

use super::file::internal::KubeProxyConfig;
use super::file::v1alpha1::{parse_ip_sloppy, split_host_port};
use crate::model::net::{Cidr, Family};

/// What upstream logs each non-fatal finding with (the finding is the logged error).
pub const INCOMPLETE_OR_INCORRECT: &str = "Kube-proxy configuration may be incomplete or incorrect";

/// Upstream's `LocalModeClusterCIDR` and `LocalModeNodeCIDR`: the detect-local modes whose
/// CIDRs must be of the primary family.
const LOCAL_MODE_CLUSTER_CIDR: &str = "ClusterCIDR";
const LOCAL_MODE_NODE_CIDR: &str = "NodeCIDR";

/// Both checks as upstream's `newProxyServer` acts on them, for a caller that has the
/// whole picture at once.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StartupFindings {
    /// Errors to log with [`INCOMPLETE_OR_INCORRECT`], one per check that found something
    /// (each is that check's findings joined as [`aggregate_error`] joins them).
    pub warnings: Vec<String>,
    /// `kube-proxy configuration is incorrect: <err>`: start-up fails with this.
    pub fatal: Option<String>,
}

/// [`check_bad_config`] then [`check_bad_ip_config`], turned into what upstream logs and
/// what it fails with. Upstream runs them on either side of its dual-stack probe; the
/// results do not depend on that order.
pub fn check_startup_config(
    cfg: &KubeProxyConfig,
    primary: Family,
    dual_stack_supported: bool,
    node_ips: &[IpAddr],
    pod_cidrs: &[String],
) -> StartupFindings {
    let mut findings = StartupFindings::default();
    let bad = check_bad_config(cfg, primary, node_ips, pod_cidrs);
    if !bad.is_empty() {
        findings.warnings.push(aggregate_error(&bad));
    }
    let (bad_ip, fatal) = check_bad_ip_config(cfg, primary, dual_stack_supported, pod_cidrs);
    if !bad_ip.is_empty() {
        let err = aggregate_error(&bad_ip);
        if fatal {
            findings.fatal = Some(format!("kube-proxy configuration is incorrect: {err}"));
        } else {
            findings.warnings.push(err);
        }
    }
    findings
}

/// Upstream's `checkBadConfig`: whether `nodePortAddresses` leaves NodePorts open on every
/// local IP of a family that seems to be in use. `nodePortAddresses` is first expanded as
/// upstream expands it ([`expand_node_port_address_keywords`], with `node_ips`), so the
/// default `primary` counts as the node's IPs and not as an unknown word. Each message is
/// one finding; an empty list is no error.
pub fn check_bad_config(
    cfg: &KubeProxyConfig,
    primary: Family,
    node_ips: &[IpAddr],
    pod_cidrs: &[String],
) -> Vec<String> {
    let node_port_addresses = expand_node_port_address_keywords(
        cfg.node_port_addresses.as_deref().unwrap_or_default(),
        node_ips,
    );
    // No Services are known yet, so whether the cluster is dual-stack is only guessed
    // from explicitly dual-stack configuration.
    let any_dual_stack_config = [
        cfg.detect_local.cluster_cidrs.as_slice(),
        node_port_addresses.as_slice(),
        cfg.ipvs.exclude_cidrs.as_deref().unwrap_or_default(),
        pod_cidrs,
    ]
    .into_iter()
    .any(is_dual_stack_cidr_strings);

    // `proxyutil.MapCIDRsByIPFamily(...)[primary]`: trimmed, non-CIDRs left out.
    let primary_cidrs = node_port_addresses
        .iter()
        .filter_map(|a| parse_cidr_sloppy(a.trim()))
        .filter(|(_, net)| go_family(net.addr()) == primary)
        .count();

    let (p, other) = (family_name(primary), family_name(other_family(primary)));
    let mut errors = Vec::new();
    if node_port_addresses.is_empty() {
        errors.push(
            "nodePortAddresses is unset; NodePort connections will be accepted on all local \
             IPs. Consider using `--nodeport-addresses primary`"
                .to_string(),
        );
    } else if any_dual_stack_config && primary_cidrs == node_port_addresses.len() {
        errors.push(format!(
            "cluster appears to be dual-stack but nodePortAddresses contains only {p} \
             addresses; NodePort connections will be accepted on all local {other} IPs"
        ));
    } else if primary_cidrs == 0 {
        errors.push(format!(
            "cluster appears to be {p}-primary but nodePortAddresses contains only {other} \
             addresses; NodePort connections will be accepted on all local {p} IPs"
        ));
    }
    errors
}

/// Upstream's `checkBadIPConfig`: settings whose addresses are all of the other family than
/// the primary one. Returns the findings and whether they are fatal. Fatal are only the
/// mistakes that always were (upstream keeps later checks non-fatal so that clusters that
/// started before keep starting): cluster CIDRs of the wrong family in single-stack
/// ClusterCIDR mode, pod CIDRs of the wrong family in NodeCIDR mode.
pub fn check_bad_ip_config(
    cfg: &KubeProxyConfig,
    primary: Family,
    dual_stack_supported: bool,
    pod_cidrs: &[String],
) -> (Vec<String>, bool) {
    let bad_family = other_family(primary);
    let bad = family_name(bad_family);
    let cluster_type = if dual_stack_supported {
        format!("{}-primary", family_name(primary))
    } else {
        format!("{}-only", family_name(primary))
    };
    let mut errors = Vec::new();
    let mut fatal = false;

    if bad_cidrs(&cfg.detect_local.cluster_cidrs, bad_family) {
        errors.push(format!(
            "cluster is {cluster_type} but clusterCIDRs contains only {bad} addresses"
        ));
        if cfg.detect_local_mode == LOCAL_MODE_CLUSTER_CIDR && !dual_stack_supported {
            fatal = true;
        }
    }
    if bad_cidrs(pod_cidrs, bad_family) {
        errors.push(format!(
            "cluster is {cluster_type} but node.spec.podCIDRs contains only {bad} addresses"
        ));
        if cfg.detect_local_mode == LOCAL_MODE_NODE_CIDR {
            fatal = true;
        }
    }
    if parse_ip_sloppy(&cfg.winkernel.source_vip).map(go_family) == Some(bad_family) {
        errors.push(format!(
            "cluster is {cluster_type} but winkernel.sourceVip is {bad}"
        ));
    }
    // These only matter when the other family is not there at all.
    if !dual_stack_supported {
        let exclude = cfg.ipvs.exclude_cidrs.as_deref().unwrap_or_default();
        if bad_cidrs(exclude, bad_family) {
            errors.push(format!(
                "cluster is {cluster_type} but ipvs.excludeCIDRs contains only {bad} addresses"
            ));
        }
        if bad_bind_address(&cfg.healthz_bind_address, bad_family) {
            errors.push(format!(
                "cluster is {cluster_type} but healthzBindAddress is {bad}"
            ));
        }
        if bad_bind_address(&cfg.metrics_bind_address, bad_family) {
            errors.push(format!(
                "cluster is {cluster_type} but metricsBindAddress is {bad}"
            ));
        }
    }
    (errors, fatal)
}

/// Upstream's `expandNodePortAddressKeywords`: `primary` becomes the node IP of each family
/// (`/32`, `/128`) unless it is loopback (no routable address to pin NodePorts to),
/// `localhost` the loopback CIDRs, `all` the zero CIDRs; anything else stays as written.
/// `node_ips` are the node's IPs as upstream's `detectNodeIPs` found them: the first of
/// each family is that family's node IP.
pub fn expand_node_port_address_keywords(addresses: &[String], node_ips: &[IpAddr]) -> Vec<String> {
    let node_ip = |family| {
        node_ips
            .iter()
            .map(|ip| ip.to_canonical())
            .find(|ip| go_family(*ip) == family)
    };
    let mut expanded = Vec::new();
    for addr in addresses {
        match addr.as_str() {
            "primary" => {
                if let Some(ip) = node_ip(Family::Ip).filter(|ip| !ip.is_loopback()) {
                    expanded.push(format!("{ip}/32"));
                }
                if let Some(ip) = node_ip(Family::Ip6).filter(|ip| !ip.is_loopback()) {
                    expanded.push(format!("{ip}/128"));
                }
            }
            "localhost" => expanded.extend(["127.0.0.0/8".into(), "::1/128".into()]),
            "all" => expanded.extend(["0.0.0.0/0".into(), "::/0".into()]),
            _ => expanded.push(addr.clone()),
        }
    }
    expanded
}

/// An error list as Go's `utilerrors.NewAggregate(errs).Error()` prints it, which is what
/// upstream logs: one error as it is, several as `[a, b]` with repeats left out. Empty for
/// none (upstream then has no error at all).
pub fn aggregate_error(messages: &[String]) -> String {
    match messages {
        [] => String::new(),
        [one] => one.clone(),
        _ => {
            let mut seen: Vec<&str> = Vec::new();
            for m in messages {
                if !seen.contains(&m.as_str()) {
                    seen.push(m);
                }
            }
            match seen.as_slice() {
                [one] => one.to_string(),
                _ => format!("[{}]", seen.join(", ")),
            }
        }
    }
}

/// Upstream's `badCIDRs`: a non-empty list whose every entry is of `wrong` (an unparseable
/// entry is of no family, so it clears the list).
fn bad_cidrs(cidrs: &[String], wrong: Family) -> bool {
    !cidrs.is_empty()
        && cidrs
            .iter()
            .all(|c| parse_cidr_sloppy(c).map(|(ip, _)| go_family(ip)) == Some(wrong))
}

/// Upstream's `badBindAddress`: an `IP:port` whose IP is of `wrong` and not the zero
/// address (which binds every family's addresses anyway).
fn bad_bind_address(bind_address: &str, wrong: Family) -> bool {
    let Some((host, _)) = go_split_host_port(bind_address) else {
        return false;
    };
    parse_ip_sloppy(host)
        .map(|ip| ip.to_canonical())
        .is_some_and(|ip| go_family(ip) == wrong && !ip.is_unspecified())
}

/// Go's `net.SplitHostPort`. Ours agrees with it except that Go also refuses a `[` or `]`
/// in the port.
fn go_split_host_port(s: &str) -> Option<(&str, &str)> {
    split_host_port(s).filter(|(_, port)| !port.contains(['[', ']']))
}

/// `netutils.ParseCIDRSloppy`: the address as written and the network. Our
/// [`super::cidr_sloppy`] also trims and reads the prefix with Rust's integer parser (which
/// takes `+8`); upstream's does neither, so those are refused first.
fn parse_cidr_sloppy(s: &str) -> Option<(IpAddr, Cidr)> {
    let (ip, len) = s.split_once('/')?;
    if s.trim() != s || len.is_empty() || !len.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let net = super::cidr_sloppy(s)?;
    Some((parse_ip_sloppy(ip)?, net))
}

/// `netutils.IsDualStackCIDRStrings`: every entry a CIDR, and both families present.
fn is_dual_stack_cidr_strings(cidrs: &[String]) -> bool {
    let mut families = Vec::with_capacity(cidrs.len());
    for c in cidrs {
        match parse_cidr_sloppy(c) {
            Some((_, net)) => families.push(go_family(net.addr())),
            None => return false,
        }
    }
    families.contains(&Family::Ip) && families.contains(&Family::Ip6)
}

/// `netutils.IPFamilyOf`: Go holds IPv4 addresses as IPv4-mapped IPv6 ones, so a mapped
/// address is IPv4.
fn go_family(ip: IpAddr) -> Family {
    Family::of(&ip.to_canonical())
}

/// A family as `v1.IPFamily` prints it (and `IPv%s` with `netutils.IPFamily`).
fn family_name(f: Family) -> &'static str {
    match f {
        Family::Ip => "IPv4",
        Family::Ip6 => "IPv6",
    }
}

fn other_family(f: Family) -> Family {
    match f {
        Family::Ip => Family::Ip6,
        Family::Ip6 => Family::Ip,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const V4: Family = Family::Ip;
    const V6: Family = Family::Ip6;

    fn strings(list: &[&str]) -> Vec<String> {
        list.iter().map(|s| s.to_string()).collect()
    }

    fn config(edit: impl FnOnce(&mut KubeProxyConfig)) -> KubeProxyConfig {
        let mut c = KubeProxyConfig::default();
        edit(&mut c);
        c
    }

    fn ip(s: &str) -> IpAddr {
        s.parse().expect("test address")
    }

    /// Upstream's `Test_checkBadConfig` table (no node IPs: no entry is a keyword).
    #[test]
    fn bad_config_upstream_table() {
        // (name, clusterCIDRs, nodePortAddresses, primary family, error expected)
        type Case = (
            &'static str,
            &'static [&'static str],
            Option<&'static [&'static str]>,
            Family,
            bool,
        );
        let cases: &[Case] = &[
            (
                "single-stack NodePortAddresses with single-stack config",
                &["10.0.0.0/8"],
                Some(&["192.168.0.0/24"]),
                V4,
                false,
            ),
            (
                "dual-stack NodePortAddresses with dual-stack config",
                &["10.0.0.0/8", "fd09::/64"],
                Some(&["192.168.0.0/24", "fd03::/64"]),
                V4,
                false,
            ),
            ("empty NodePortAddresses", &[], Some(&[]), V4, true),
            (
                "single-stack NodePortAddresses with dual-stack config",
                &["10.0.0.0/8", "fd09::/64"],
                Some(&["192.168.0.0/24"]),
                V4,
                true,
            ),
            (
                "wrong-single-stack NodePortAddresses",
                &["fd09::/64"],
                Some(&["192.168.0.0/24"]),
                V6,
                true,
            ),
        ];
        for (name, cluster_cidrs, npa, primary, err) in cases {
            let cfg = config(|c| {
                c.detect_local.cluster_cidrs = strings(cluster_cidrs);
                c.node_port_addresses = npa.map(strings);
            });
            let got = check_bad_config(&cfg, *primary, &[], &[]);
            assert_eq!(!got.is_empty(), *err, "{name}: {got:?}");
        }
    }

    /// Upstream's `Test_checkBadIPConfig` table, each case single-stack then dual-stack.
    #[test]
    fn bad_ip_config_upstream_table() {
        type Edit = fn(&mut KubeProxyConfig);
        struct Case {
            name: &'static str,
            edit: Edit,
            pod_cidrs: &'static [&'static str],
            primary: Family,
            ss: (bool, bool),
            ds: (bool, bool),
        }
        let case = |name, edit: Edit, pod_cidrs, primary, ss, ds| Case {
            name,
            edit,
            pod_cidrs,
            primary,
            ss,
            ds,
        };
        let ok = (false, false);
        let cases = [
            case("empty config", |_| {}, &[], V4, ok, ok),
            case(
                "ok single-stack clusterCIDR",
                |c| c.detect_local.cluster_cidrs = strings(&["10.0.0.0/8"]),
                &[],
                V4,
                ok,
                ok,
            ),
            case(
                "ok dual-stack clusterCIDR",
                |c| c.detect_local.cluster_cidrs = strings(&["10.0.0.0/8", "fd01:2345::/64"]),
                &[],
                V4,
                ok,
                ok,
            ),
            case(
                "ok reversed dual-stack clusterCIDR",
                |c| c.detect_local.cluster_cidrs = strings(&["fd01:2345::/64", "10.0.0.0/8"]),
                &[],
                V4,
                ok,
                ok,
            ),
            case(
                "wrong-family clusterCIDR",
                |c| c.detect_local.cluster_cidrs = strings(&["fd01:2345::/64"]),
                &[],
                V4,
                (true, false),
                (true, false),
            ),
            case(
                "wrong-family clusterCIDR when using ClusterCIDR LocalDetector",
                |c| {
                    c.detect_local.cluster_cidrs = strings(&["fd01:2345::/64"]);
                    c.detect_local_mode = "ClusterCIDR".into();
                },
                &[],
                V4,
                (true, true),
                (true, false),
            ),
            case(
                "ok single-stack node.spec.podCIDRs",
                |c| c.detect_local_mode = "NodeCIDR".into(),
                &["10.0.0.0/8"],
                V4,
                ok,
                ok,
            ),
            case(
                "ok dual-stack node.spec.podCIDRs",
                |c| c.detect_local_mode = "NodeCIDR".into(),
                &["10.0.0.0/8", "fd01:2345::/64"],
                V4,
                ok,
                ok,
            ),
            case(
                "ok reversed dual-stack node.spec.podCIDRs",
                |c| c.detect_local_mode = "NodeCIDR".into(),
                &["fd01:2345::/64", "10.0.0.0/8"],
                V4,
                ok,
                ok,
            ),
            case(
                "wrong-family node.spec.podCIDRs",
                |c| c.detect_local_mode = "NodeCIDR".into(),
                &["fd01:2345::/64"],
                V4,
                (true, true),
                (true, true),
            ),
            case(
                "ok winkernel.sourceVip",
                |c| c.winkernel.source_vip = "10.0.0.1".into(),
                &[],
                V4,
                ok,
                ok,
            ),
            case(
                "wrong family winkernel.sourceVip",
                |c| c.winkernel.source_vip = "fd01:2345::1".into(),
                &[],
                V4,
                (true, false),
                (true, false),
            ),
            case(
                "ok IPv4 metricsBindAddress",
                |c| c.metrics_bind_address = "10.0.0.1:9999".into(),
                &[],
                V4,
                ok,
                ok,
            ),
            case(
                "ok IPv6 metricsBindAddress",
                |c| c.metrics_bind_address = "[fd01:2345::1]:9999".into(),
                &[],
                V6,
                ok,
                ok,
            ),
            case(
                "ok unspecified wrong-family metricsBindAddress",
                |c| c.metrics_bind_address = "0.0.0.0:9999".into(),
                &[],
                V6,
                ok,
                ok,
            ),
            case(
                "wrong family metricsBindAddress",
                |c| c.metrics_bind_address = "10.0.0.1:9999".into(),
                &[],
                V6,
                (true, false),
                ok,
            ),
            case(
                "ok ipvs.excludeCIDRs",
                |c| c.ipvs.exclude_cidrs = Some(strings(&["10.0.0.0/8"])),
                &[],
                V4,
                ok,
                ok,
            ),
            case(
                "wrong family ipvs.excludeCIDRs",
                |c| c.ipvs.exclude_cidrs = Some(strings(&["10.0.0.0/8", "192.168.0.0/24"])),
                &[],
                V6,
                (true, false),
                ok,
            ),
        ];
        for c in cases {
            let cfg = config(c.edit);
            let pods = strings(c.pod_cidrs);
            for (dual, (err, fatal)) in [(false, c.ss), (true, c.ds)] {
                let (got, got_fatal) = check_bad_ip_config(&cfg, c.primary, dual, &pods);
                assert_eq!(!got.is_empty(), err, "{} (dual {dual}): {got:?}", c.name);
                assert_eq!(got_fatal, fatal, "{} (dual {dual})", c.name);
            }
        }
    }

    /// Upstream's `Test_expandNodePortAddressKeywords` table.
    #[test]
    fn keywords_expand_as_upstream_expands_them() {
        let dual = [ip("192.168.1.1"), ip("fd00::1")];
        let v4_only = [ip("192.168.1.1"), ip("::1")];
        let v6_only = [ip("127.0.0.1"), ip("fd00::1")];
        // (name, nodePortAddresses, node IPs, expanded)
        type Case<'a> = (&'a str, &'a [&'a str], &'a [IpAddr], &'a [&'a str]);
        let cases: &[Case] = &[
            (
                "literal CIDRs pass through unchanged",
                &["10.0.0.0/8", "fd01::/64"],
                &dual,
                &["10.0.0.0/8", "fd01::/64"],
            ),
            (
                "primary on dual-stack node",
                &["primary"],
                &dual,
                &["192.168.1.1/32", "fd00::1/128"],
            ),
            (
                "primary on IPv4-only node",
                &["primary"],
                &v4_only,
                &["192.168.1.1/32"],
            ),
            (
                "localhost on dual-stack node",
                &["localhost"],
                &dual,
                &["127.0.0.0/8", "::1/128"],
            ),
            (
                "localhost on IPv6-only node",
                &["localhost"],
                &v6_only,
                &["127.0.0.0/8", "::1/128"],
            ),
            (
                "all on dual-stack node",
                &["all"],
                &dual,
                &["0.0.0.0/0", "::/0"],
            ),
            (
                "primary combined with localhost",
                &["primary", "localhost"],
                &dual,
                &["192.168.1.1/32", "fd00::1/128", "127.0.0.0/8", "::1/128"],
            ),
            (
                "keyword combined with literal CIDR",
                &["localhost", "10.0.0.0/8"],
                &v4_only,
                &["127.0.0.0/8", "::1/128", "10.0.0.0/8"],
            ),
        ];
        for (name, addresses, node_ips, expected) in cases {
            let got = expand_node_port_address_keywords(&strings(addresses), node_ips);
            assert_eq!(got, strings(expected), "{name}");
        }
    }

    #[test]
    fn default_primary_node_port_addresses_warn_only_without_a_node_ip() {
        let cfg = config(|c| c.node_port_addresses = Some(strings(&["primary"])));
        assert_eq!(
            check_bad_config(&cfg, V4, &[ip("10.1.0.5")], &[]),
            Vec::<String>::new()
        );
        assert_eq!(
            check_bad_config(&cfg, V4, &[ip("127.0.0.1")], &[]),
            strings(&[
                "nodePortAddresses is unset; NodePort connections will be accepted on all \
                 local IPs. Consider using `--nodeport-addresses primary`"
            ])
        );
        // Dual-stack pod CIDRs with only the IPv4 node IP known.
        assert_eq!(
            check_bad_config(
                &cfg,
                V4,
                &[ip("10.1.0.5")],
                &strings(&["10.0.0.0/16", "fd00::/64"])
            ),
            strings(&[
                "cluster appears to be dual-stack but nodePortAddresses contains only IPv4 \
                 addresses; NodePort connections will be accepted on all local IPv6 IPs"
            ])
        );
    }

    #[test]
    fn bad_config_messages_are_upstreams() {
        let cfg = config(|c| c.node_port_addresses = Some(strings(&["192.168.0.0/24"])));
        assert_eq!(
            check_bad_config(&cfg, V6, &[], &[]),
            strings(&[
                "cluster appears to be IPv6-primary but nodePortAddresses contains only IPv4 \
                 addresses; NodePort connections will be accepted on all local IPv6 IPs"
            ])
        );
        let unset = check_bad_config(&KubeProxyConfig::default(), V4, &[], &[]);
        assert_eq!(unset.len(), 1);
    }

    #[test]
    fn bad_ip_config_messages_are_upstreams() {
        let cfg = config(|c| {
            c.detect_local.cluster_cidrs = strings(&["fd01::/64"]);
            c.detect_local_mode = "ClusterCIDR".into();
            c.winkernel.source_vip = "fd01::1".into();
            c.ipvs.exclude_cidrs = Some(strings(&["fd02::/64"]));
            c.healthz_bind_address = "[fd01::1]:10256".into();
            c.metrics_bind_address = "[fd01::1]:10249".into();
        });
        let (got, fatal) = check_bad_ip_config(&cfg, V4, false, &strings(&["fd03::/64"]));
        assert!(fatal);
        assert_eq!(
            got,
            strings(&[
                "cluster is IPv4-only but clusterCIDRs contains only IPv6 addresses",
                "cluster is IPv4-only but node.spec.podCIDRs contains only IPv6 addresses",
                "cluster is IPv4-only but winkernel.sourceVip is IPv6",
                "cluster is IPv4-only but ipvs.excludeCIDRs contains only IPv6 addresses",
                "cluster is IPv4-only but healthzBindAddress is IPv6",
                "cluster is IPv4-only but metricsBindAddress is IPv6",
            ])
        );
        let (got, fatal) = check_bad_ip_config(&cfg, V4, true, &[]);
        assert!(!fatal);
        assert_eq!(
            got,
            strings(&[
                "cluster is IPv4-primary but clusterCIDRs contains only IPv6 addresses",
                "cluster is IPv4-primary but winkernel.sourceVip is IPv6",
            ])
        );
    }

    #[test]
    fn findings_split_into_logged_and_fatal_as_upstream_acts_on_them() {
        let cfg = config(|c| {
            c.node_port_addresses = Some(strings(&["10.0.0.0/8"]));
            c.detect_local_mode = "NodeCIDR".into();
            c.winkernel.source_vip = "10.0.0.1".into();
        });
        let got = check_startup_config(&cfg, V6, true, &[], &strings(&["10.0.0.0/16"]));
        assert_eq!(
            got.warnings,
            strings(&[
                "cluster appears to be IPv6-primary but nodePortAddresses contains only IPv4 \
                 addresses; NodePort connections will be accepted on all local IPv6 IPs"
            ])
        );
        assert_eq!(
            got.fatal.as_deref(),
            Some(
                "kube-proxy configuration is incorrect: [cluster is IPv6-primary but \
                 node.spec.podCIDRs contains only IPv4 addresses, cluster is IPv6-primary \
                 but winkernel.sourceVip is IPv4]"
            )
        );
        let clean = config(|c| c.node_port_addresses = Some(strings(&["10.0.0.0/8"])));
        assert_eq!(
            check_startup_config(&clean, V4, false, &[], &[]),
            StartupFindings::default()
        );
    }

    #[test]
    fn aggregate_prints_as_go_does() {
        assert_eq!(aggregate_error(&[]), "");
        assert_eq!(aggregate_error(&strings(&["a"])), "a");
        assert_eq!(aggregate_error(&strings(&["a", "b"])), "[a, b]");
        assert_eq!(aggregate_error(&strings(&["a", "a"])), "a");
        assert_eq!(aggregate_error(&strings(&["a", "b", "a"])), "[a, b]");
    }

    #[test]
    fn addresses_are_read_as_netutils_reads_them() {
        let v4 = |s: &str| bad_cidrs(&strings(&[s]), V4);
        assert!(v4("010.000.0.0/8"), "leading zeros are allowed");
        assert!(!v4(" 10.0.0.0/8"), "ParseCIDRSloppy does not trim");
        assert!(!v4("10.0.0.0/+8"), "nor take a sign");
        assert!(!v4("10.0.0.0/"), "nor an empty prefix");
        assert!(!v4("10.0.0.0/33"));
        assert!(!v4("10.0.0.0"), "an address is not a CIDR");
        assert!(
            v4("::ffff:10.0.0.0/64"),
            "the address as written is IPv4-mapped"
        );
        assert!(!bad_cidrs(&strings(&["10.0.0.0/8", "junk"]), V4));
        assert!(!bad_cidrs(&[], V4));
        // The network decides in IsDualStackCIDRStrings and MapCIDRsByIPFamily.
        assert!(is_dual_stack_cidr_strings(&strings(&[
            "10.0.0.0/8",
            "::ffff:10.0.0.0/64"
        ])));
        assert!(!is_dual_stack_cidr_strings(&strings(&[
            "10.0.0.0/8",
            "::ffff:10.0.0.0/104"
        ])));
        assert!(!is_dual_stack_cidr_strings(&strings(&[
            "10.0.0.0/8",
            "fd00::/64",
            "x"
        ])));
        // MapCIDRsByIPFamily trims.
        let cfg = config(|c| c.node_port_addresses = Some(strings(&[" 10.0.0.0/8 "])));
        assert_eq!(check_bad_config(&cfg, V4, &[], &[]), Vec::<String>::new());

        let bind = |s: &str| bad_bind_address(s, V4);
        assert!(bind("10.0.0.1:9999"));
        assert!(bind("010.0.0.1:9999"));
        assert!(bind("[::ffff:10.0.0.1]:9999"));
        assert!(!bind("0.0.0.0:9999"));
        assert!(!bind("[::ffff:0.0.0.0]:9999"), "Go's zero IPv4 address");
        assert!(!bind("10.0.0.1"), "no port");
        assert!(!bind("10.0.0.1:99]"), "Go refuses a bracket in the port");
        assert!(!bind(":9999"));
        assert!(!bind(""));
        assert!(bad_bind_address("[fd00::1]:9999", V6));
    }

    proptest! {
        #[test]
        fn any_input_gives_findings_never_a_panic(
            fields in proptest::collection::vec(".{0,40}", 6),
            pods in proptest::collection::vec(".{0,40}", 0..3),
            dual in any::<bool>(),
            v6 in any::<bool>(),
        ) {
            let cfg = config(|c| {
                c.detect_local.cluster_cidrs = vec![fields[0].clone()];
                c.node_port_addresses = Some(vec![fields[1].clone(), "primary".into()]);
                c.ipvs.exclude_cidrs = Some(vec![fields[2].clone()]);
                c.healthz_bind_address = fields[3].clone();
                c.metrics_bind_address = fields[4].clone();
                c.winkernel.source_vip = fields[5].clone();
            });
            let primary = if v6 { V6 } else { V4 };
            let _ = check_startup_config(&cfg, primary, dual, &[ip("::ffff:1.2.3.4")], &pods);
        }
    }
}
