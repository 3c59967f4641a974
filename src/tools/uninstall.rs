//! `kube-nlproxy uninstall`: removes what kube-nlproxy programmed on this node and nothing
//! else, for going back to upstream kube-proxy (whose modes do not know our tables: they
//! would stay and, at the same hook priority and registered first, keep DNATing new
//! connections to the endpoints of the moment we stopped). Unlike `--cleanup`, upstream's
//! rules are left alone, so it can run while upstream kube-proxy already serves the node.
//!
//! Established connections are not affected: their conntrack entries, NAT included, stay.
//!
//! I/O: nftables, and IPVS with `--ipvs`.

use crate::kernel::nft::netlink::NetlinkNftables;
use crate::modes::{ipvs, nftables, userspace};
use crate::proxy::{DetectLocal, Options, ProxierConfig, DEFAULT_TABLE};

use super::args::{self, Flag};
use super::ToolError;

const USAGE: &str = "[--ipvs]

Removes what kube-nlproxy programmed on this node: its nftables tables (every mode's, IPv4
and IPv6, only those carrying kube-nlproxy's comment). Upstream kube-proxy's rules are left
alone, so this runs after upstream's image is back on the node (README, \"Going back\").
Established connections keep working: their conntrack entries stay.

Example, on every node once upstream's DaemonSet is rolled out again:
  kubectl apply -k deploy/uninstall/ && kubectl -n kube-system rollout status ds/kube-nlproxy-uninstall

Exit status: 0 done, 2 trouble (a flag, a kernel operation that failed).";

const FLAGS: &[Flag] = &[Flag {
    name: "ipvs",
    value: false,
    help: "also remove the IPVS virtual servers on kube-ipvs0 and the link (not when going back to upstream's IPVS mode, which adopts them)",
}];

/// Runs the tool: the lines it prints.
pub fn run(argv: &[String]) -> Result<String, ToolError> {
    let a = args::parse("uninstall", USAGE, FLAGS, argv)?;
    let opts = Options {
        proxier: ProxierConfig::default(),
        detect_local: DetectLocal::ClusterCidr(Vec::new()),
        sync_period: std::time::Duration::from_secs(30),
        conntrack_cleanup: false,
        reset_dead_endpoint_connections: false,
        families: crate::model::net::Family::all().to_vec(),
    };
    let open = || NetlinkNftables::open().map_err(|e| ToolError::kernel("open nftables", e));
    let mut removed = nftables::cleanup(&mut open()?, &opts)
        .map_err(|e| ToolError::kernel("remove the nftables mode's table", e))?;
    removed.extend(
        userspace::cleanup(&mut open()?, &opts)
            .map_err(|e| ToolError::kernel("remove the userspace mode's table", e))?,
    );
    if a.has("ipvs") {
        removed.extend(
            ipvs::cleanup(open()?, &opts, &ipvs::IpvsConfig::default())
                .map_err(|e| ToolError::kernel("remove the IPVS mode's state", e))?,
        );
    } else {
        removed.extend(
            crate::proxy::cleanup::delete_tables(&mut open()?, &[ipvs::table::DEFAULT_TABLE])
                .map_err(|e| ToolError::kernel("remove the IPVS mode's companion table", e))?,
        );
    }
    debug_assert!(opts.proxier.table == DEFAULT_TABLE);
    Ok(render(&removed))
}

/// What `run` prints for what it removed.
pub fn render(removed: &[String]) -> String {
    if removed.is_empty() {
        return "nothing of kube-nlproxy's on this node\n".into();
    }
    removed.iter().map(|r| format!("removed {r}\n")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn help_and_unknown_flags() {
        match run(&["--help".into()]) {
            Err(ToolError::Help(t)) => assert!(t.contains("--ipvs"), "{t}"),
            other => panic!("{other:?}"),
        }
        match run(&["--all".into()]) {
            Err(ToolError::Usage { msg, .. }) => assert_eq!(msg, "unknown flag: --all"),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn rendering() {
        assert_eq!(render(&[]), "nothing of kube-nlproxy's on this node\n");
        assert_eq!(
            render(&["table ip kube-nlproxy".into()]),
            "removed table ip kube-nlproxy\n"
        );
    }
}
