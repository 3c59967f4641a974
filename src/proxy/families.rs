//! Which IP families the proxy runs, as upstream kube-proxy decides at start-up
//! (`cmd/kube-proxy/app/server.go` `detectNodeIPs`, `server_linux.go`
//! `platformCheckSupported`, since 1.34 with kubernetes#131265/#133711): the primary family
//! is that of `--bind-address` when it is set, else of the Node's first address, else IPv4;
//! IPv6 runs beside it only when the kernel has it (`/proc/net/if_inet6` exists) and it is not
//! disabled (`net.ipv6.conf.all.disable_ipv6` is not `1`). A host without usable IPv6 runs
//! single-stack: no IPv6 table, health or metrics series. Pure: the caller reads `/proc`.

use std::net::IpAddr;

use crate::model::net::Family;

/// What the kernel says of IPv6.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ipv6Kernel {
    Usable,
    /// `/proc/net/if_inet6` is missing (`ipv6.disable=1`, or a kernel built without IPv6).
    Absent,
    /// `net.ipv6.conf.all.disable_ipv6` reads `1`.
    Disabled,
}

impl Ipv6Kernel {
    /// From whether `/proc/net/if_inet6` exists and what
    /// `/proc/sys/net/ipv6/conf/all/disable_ipv6` holds (`None`: unreadable, which upstream
    /// takes as enabled).
    pub fn from_proc(if_inet6_exists: bool, disable_ipv6: Option<&str>) -> Ipv6Kernel {
        if !if_inet6_exists {
            Ipv6Kernel::Absent
        } else if disable_ipv6.is_some_and(|v| v.trim() == "1") {
            Ipv6Kernel::Disabled
        } else {
            Ipv6Kernel::Usable
        }
    }
}

/// The family upstream's `v1.IPFamily` names: `IPv4` or `IPv6`.
pub fn ip_family_name(f: Family) -> &'static str {
    match f {
        Family::Ip => "IPv4",
        Family::Ip6 => "IPv6",
    }
}

/// The primary family (upstream's `detectNodeIPs`): a `--bind-address` that is not `0.0.0.0`
/// or `::` decides; else the Node's first address (its addresses come primary first);
/// else IPv4.
pub fn primary_family(bind_address: Option<IpAddr>, node_addresses: &[IpAddr]) -> Family {
    match bind_address.filter(|a| !a.is_unspecified()) {
        Some(a) => Family::of(&a),
        None => node_addresses.first().map_or(Family::Ip, Family::of),
    }
}

/// The families to run, primary first, or the error upstream's start-up fails with. IPv4 is
/// always there: nf_tables serves both families wherever it serves one.
pub fn families(primary: Family, ipv6: Ipv6Kernel) -> Result<Vec<Family>, String> {
    match (primary, ipv6) {
        (Family::Ip, Ipv6Kernel::Usable) => Ok(vec![Family::Ip, Family::Ip6]),
        (Family::Ip6, Ipv6Kernel::Usable) => Ok(vec![Family::Ip6, Family::Ip]),
        (Family::Ip, _) => Ok(vec![Family::Ip]),
        (Family::Ip6, _) => Err(format!(
            "no support for primary IP family {:?}",
            ip_family_name(primary)
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn ipv6_is_usable_unless_absent_or_disabled() {
        assert_eq!(Ipv6Kernel::from_proc(true, Some("0\n")), Ipv6Kernel::Usable);
        // Unreadable: upstream only turns IPv6 off on a read of "1".
        assert_eq!(Ipv6Kernel::from_proc(true, None), Ipv6Kernel::Usable);
        assert_eq!(
            Ipv6Kernel::from_proc(true, Some("1\n")),
            Ipv6Kernel::Disabled
        );
        assert_eq!(Ipv6Kernel::from_proc(false, Some("0")), Ipv6Kernel::Absent);
        assert_eq!(Ipv6Kernel::from_proc(false, None), Ipv6Kernel::Absent);
    }

    /// Upstream's `Test_detectNodeIPs` in its shape: the bind address wins unless it is
    /// unspecified, then the Node's first address, then IPv4.
    #[test]
    fn the_primary_family_follows_detect_node_ips() {
        let cases: &[(Option<&str>, &[&str], Family)] = &[
            (None, &[], Family::Ip),
            (Some("0.0.0.0"), &[], Family::Ip),
            (Some("::"), &[], Family::Ip),
            (None, &["10.0.0.1"], Family::Ip),
            (None, &["fd00::1", "10.0.0.1"], Family::Ip6),
            (Some("0.0.0.0"), &["fd00::1"], Family::Ip6),
            (Some("::"), &["10.0.0.1", "fd00::1"], Family::Ip),
            (Some("10.0.0.2"), &["fd00::1"], Family::Ip),
            (Some("fd00::2"), &["10.0.0.1"], Family::Ip6),
        ];
        for (bind, node, want) in cases {
            let node: Vec<IpAddr> = node.iter().map(|s| ip(s)).collect();
            assert_eq!(
                primary_family(bind.map(ip), &node),
                *want,
                "bind {bind:?}, node {node:?}"
            );
        }
    }

    #[test]
    fn a_host_without_usable_ipv6_runs_ipv4_alone_and_refuses_an_ipv6_primary() {
        assert_eq!(
            families(Family::Ip, Ipv6Kernel::Usable),
            Ok(vec![Family::Ip, Family::Ip6])
        );
        assert_eq!(
            families(Family::Ip6, Ipv6Kernel::Usable),
            Ok(vec![Family::Ip6, Family::Ip])
        );
        for off in [Ipv6Kernel::Absent, Ipv6Kernel::Disabled] {
            assert_eq!(families(Family::Ip, off), Ok(vec![Family::Ip]));
            assert_eq!(
                families(Family::Ip6, off),
                Err("no support for primary IP family \"IPv6\"".into())
            );
        }
    }
}
