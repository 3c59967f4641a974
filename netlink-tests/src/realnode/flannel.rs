//! Flannel as the real nodes' CNI (issue #49, item 2): flanneld v0.28.10 with its host-gw
//! backend and `--kube-subnet-mgr` on every node, and the `flannel` CNI plugin delegating to
//! the bridge plugin, as kube-flannel.yml deploys them. Built from their Go modules by
//! `netlink-tests/upstream/build.sh --flannel`: flanneld from `github.com/flannel-io/flannel`
//! (`netlink-tests/flannel/`, one SDK Flannel links for a cloud backend stubbed because the
//! module proxy does not serve it), and the CNI plugin from
//! `github.com/containernetworking/plugins` v0.9.1 `plugins/meta/flannel`, the code
//! flannel-io/cni-plugin was forked from (the proxy does not serve flannel-io/cni-plugin).
//! Pure (the configuration files and the rule snapshot), except [`binaries`].

use std::path::PathBuf;

use super::{Family, IpFamily};

/// Flannel's release the nodes run.
pub const VERSION: &str = "v0.28.10";
/// The containernetworking/plugins release whose `flannel` meta-plugin the nodes run.
pub const CNI_PLUGIN_VERSION: &str = "v0.9.1";

/// How Flannel writes its masquerade and forward rules (`EnableNFTables` in net-conf.json):
/// through the `iptables` binary (default) or `nft` (tables `flannel-ipv4`/`flannel-ipv6`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Masquerade {
    Iptables,
    Nftables,
}

/// The pod network of the nodes: the bridge plugin with routes the harness adds, or Flannel.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Cni {
    #[default]
    Bridge,
    Flannel(Masquerade),
}

impl Cni {
    /// `bridge`, `flannel-iptables` or `flannel-nftables`.
    pub fn parse(s: &str) -> Option<Cni> {
        match s {
            "bridge" => Some(Cni::Bridge),
            "flannel-iptables" => Some(Cni::Flannel(Masquerade::Iptables)),
            "flannel-nftables" => Some(Cni::Flannel(Masquerade::Nftables)),
            _ => None,
        }
    }

    /// The name [`parse`](Self::parse) reads.
    pub fn name(self) -> &'static str {
        match self {
            Cni::Bridge => "bridge",
            Cni::Flannel(Masquerade::Iptables) => "flannel-iptables",
            Cni::Flannel(Masquerade::Nftables) => "flannel-nftables",
        }
    }
}

/// Where build.sh --flannel puts flanneld and the CNI plugin.
pub struct Binaries {
    pub flanneld: PathBuf,
    /// A directory holding the `flannel` CNI plugin (a second CNI bin dir for containerd).
    pub cni_dir: PathBuf,
}

/// The cached binaries, panicking with what to run when they are missing.
pub fn binaries() -> Binaries {
    let dir = PathBuf::from(format!(
        "/var/tmp/kube-nlproxy-upstream/flannel-{VERSION}-cni-{CNI_PLUGIN_VERSION}"
    ));
    let b = Binaries {
        flanneld: dir.join("flanneld"),
        cni_dir: dir.join("cni"),
    };
    for p in [&b.flanneld, &b.cni_dir.join("flannel")] {
        assert!(
            p.exists(),
            "{} missing: run netlink-tests/upstream/build.sh --flannel",
            p.display()
        );
    }
    b
}

/// flanneld's `net-conf.json` for a cluster in `family` whose pod network is
/// `cluster_cidrs` (one per family): host-gw, IPv6 when the cluster has it, nftables rules
/// when asked (kube-flannel.yml's ConfigMap with these keys).
pub fn net_conf(family: Family, masquerade: Masquerade) -> serde_json::Value {
    let mut conf = serde_json::json!({
        "Backend": {"Type": "host-gw"},
        "EnableNFTables": masquerade == Masquerade::Nftables,
    });
    for s in family.stacks() {
        match s {
            IpFamily::V4 => {
                conf["Network"] = s.cluster_cidr().into();
                conf["EnableIPv4"] = true.into();
            }
            IpFamily::V6 => {
                conf["IPv6Network"] = s.cluster_cidr().into();
                conf["EnableIPv6"] = true.into();
            }
        }
    }
    if !family.stacks().contains(&IpFamily::V4) {
        conf["EnableIPv4"] = false.into();
    }
    conf
}

/// The CNI configuration kube-flannel.yml installs (`cni-conf.json`): the flannel plugin,
/// which reads flanneld's `/run/flannel/subnet.env` and delegates to the bridge plugin with
/// hairpin mode and the pod's default route through the bridge, then portmap.
pub fn cni_conflist() -> serde_json::Value {
    serde_json::json!({
        "name": "cbr0",
        "cniVersion": "0.3.1",
        "plugins": [
            {
                "type": "flannel",
                "delegate": {"hairpinMode": true, "isDefaultGateway": true},
            },
            {"type": "portmap", "capabilities": {"portMappings": true}},
        ],
    })
}

/// Flannel's own rules in `nft -a list ruleset` output: every line of a chain whose name
/// starts with `FLANNEL` (iptables mode, through iptables-nft) or of a table named
/// `flannel-ipv4`/`flannel-ipv6` (nftables mode), and every jump to a FLANNEL chain from
/// the built-in ones, with its table and chain, handles
/// included, so a rule deleted and re-added by Flannel's resync shows as a change.
pub fn flannel_rules(ruleset: &str) -> Vec<String> {
    let mut out = Vec::new();
    let (mut table, mut chain) = (String::new(), String::new());
    let (mut flannel_table, mut flannel_chain) = (false, false);
    for line in ruleset.lines() {
        let t = line.trim();
        let words: Vec<&str> = t.split_whitespace().collect();
        match words.as_slice() {
            ["table", family, name, ..] => {
                table = format!("{family} {name}");
                // A table's own lines (its comment, flags) come before its first chain.
                chain.clear();
                flannel_table = name.starts_with("flannel-");
                flannel_chain = false;
            }
            ["chain", name, ..] => {
                chain = (*name).to_string();
                flannel_chain = name.starts_with("FLANNEL");
            }
            ["}"] | [] => {}
            _ if flannel_table || flannel_chain || t.contains("FLANNEL") => {
                out.push(format!("{table} / {chain}: {}", without_counters(t)));
            }
            _ => {}
        }
    }
    out
}

/// `rule` with its counters' values dropped (`counter packets 3 bytes 180` is `counter`):
/// traffic changes them, not a rewrite.
fn without_counters(rule: &str) -> String {
    let words: Vec<&str> = rule.split_whitespace().collect();
    let mut out = Vec::with_capacity(words.len());
    let mut i = 0;
    while i < words.len() {
        out.push(words[i]);
        if words[i] == "counter" && words.get(i + 1) == Some(&"packets") {
            i += 5; // counter packets N bytes M
        } else {
            i += 1;
        }
    }
    out.join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_versions_are_those_build_sh_builds() {
        let go_mod = include_str!("../../flannel/go.mod");
        assert!(
            go_mod.contains(&format!(
                "require github.com/flannel-io/flannel {VERSION}\n"
            )),
            "{go_mod}"
        );
        let build = include_str!("../../upstream/build.sh");
        assert!(build.contains(&format!("cni_ver={CNI_PLUGIN_VERSION}\n")));
    }

    #[test]
    fn names_round_trip_and_bridge_is_the_default() {
        for c in [
            Cni::Bridge,
            Cni::Flannel(Masquerade::Iptables),
            Cni::Flannel(Masquerade::Nftables),
        ] {
            assert_eq!(Cni::parse(c.name()), Some(c));
        }
        assert_eq!(Cni::default(), Cni::Bridge);
        assert_eq!(Cni::parse("flannel"), None);
    }

    #[test]
    fn net_conf_is_host_gw_in_the_cluster_families() {
        let v4 = net_conf(Family::Ipv4, Masquerade::Iptables);
        assert_eq!(
            v4,
            serde_json::json!({
                "Backend": {"Type": "host-gw"},
                "EnableNFTables": false,
                "Network": "10.244.0.0/16",
                "EnableIPv4": true,
            })
        );
        let dual = net_conf(Family::Dual, Masquerade::Nftables);
        assert_eq!(dual["EnableNFTables"], true);
        assert_eq!(dual["IPv6Network"], "fd00:10:244::/56");
        assert_eq!(dual["EnableIPv6"], true);
        assert_eq!(dual["Network"], "10.244.0.0/16");
        let v6 = net_conf(Family::Ipv6, Masquerade::Iptables);
        assert_eq!(v6["EnableIPv4"], false);
        assert!(v6.get("Network").is_none());
    }

    #[test]
    fn the_cni_configuration_delegates_to_the_bridge_plugin_as_kube_flannel_does() {
        let c = cni_conflist();
        assert_eq!(c["plugins"][0]["type"], "flannel");
        assert_eq!(c["plugins"][0]["delegate"]["hairpinMode"], true);
        assert_eq!(c["plugins"][1]["type"], "portmap");
    }

    #[test]
    fn flannels_rules_are_picked_out_with_their_handles_and_without_counters() {
        // As `nft -a list ruleset` prints iptables-nft's tables and Flannel's own.
        let ruleset = "table ip nat { # handle 3\n\tchain POSTROUTING { # handle 1\n\t\ttype nat hook postrouting priority srcnat; policy accept;\n\t\tcounter packets 35 bytes 2184 jump FLANNEL-POSTRTG # handle 9\n\t}\n\tchain FLANNEL-POSTRTG { # handle 7\n\t\tip saddr 10.244.1.0/24 ip daddr 10.244.0.0/16  counter packets 11 bytes 784 return # handle 10\n\t}\n\tchain KUBE-POSTROUTING { # handle 8\n\t\tmasquerade # handle 11\n\t}\n}\ntable ip flannel-ipv4 { # handle 5\n\tcomment \"rules for flannel-ipv4\"\n\tchain postrtg { # handle 1\n\t\tmasquerade # handle 2\n\t}\n}\n";
        assert_eq!(
            flannel_rules(ruleset),
            [
                "ip nat / POSTROUTING: counter jump FLANNEL-POSTRTG # handle 9",
                "ip nat / FLANNEL-POSTRTG: ip saddr 10.244.1.0/24 ip daddr 10.244.0.0/16 counter return # handle 10",
                "ip flannel-ipv4 / : comment \"rules for flannel-ipv4\"",
                "ip flannel-ipv4 / postrtg: masquerade # handle 2",
            ]
        );
        assert!(flannel_rules("table ip nat {\n}\n").is_empty());
    }
}
