//! Upstream's e2e suite against three real nodes running a proxy, the one documented command
//! for the full proxy focus (CI runs the Services conformance specs and the kube-proxy ones
//! in `tests/real_nodes.rs`):
//!
//! ```text
//! cargo xtask image && netlink-tests/upstream/build.sh --node
//! cargo run -p netlink-tests --bin real-node-e2e -- --proxy ours --mode ""
//! cargo run -p netlink-tests --bin real-node-e2e -- --proxy upstream --mode nftables
//! ```
//!
//! `--focus RE` and `--skip RE` replace the proxy focus and its skips; `--out FILE` writes
//! the report (one line per spec); `--nodes N` (default 3) brings up N nodes, zones
//! assigned in turn: 6 gives the two schedulable nodes per zone that two Traffic
//! Distribution specs need; `--procs P` runs P Ginkgo processes (default 3); `--family
//! ipv4|dual|ipv6` (default ipv4) gives nodes, pods and Services IPv4 only, both families
//! (IPv4 primary) or IPv6 only: a dual-stack run without `--focus` adds upstream's
//! `[Feature:IPv6DualStack]` specs to the proxy focus, and neither dual-stack nor IPv6
//! skips the IPv6 and DualStack specs. `--cni flannel-iptables|flannel-nftables` runs
//! Flannel (host-gw, masquerade through iptables or nftables; `build.sh --flannel` first)
//! instead of the bridge plugin, and fails the run when Flannel's rules changed between the
//! proxy's start and the run's end. `--kustomize DIR` deploys ours with `kubectl apply -k
//! DIR` (a copy of the root kustomization with a component added, say) instead of the root
//! kustomization; `--host-sysctl KEY=VALUE` (repeatable; KEY under /proc/sys, as
//! `net/netfilter/nf_conntrack_tcp_timeout_close_wait`) sets it in every node before the
//! proxy starts, as a host's sysctl.d would (what a NET_ADMIN-only proxy cannot write);
//! `--config FIELD=YAML` (repeatable) sets a top-level field of the config file in kubeadm's
//! ConfigMap (`--config 'featureGates={KubeProxyNFTablesLocalhostNodePorts: true}'`); `--ci`
//! runs CI's focus instead of the whole proxy focus. `--beside` runs upstream kube-proxy
//! (kubeadm's addon, in `--mode`) and ours beside it (the root kustomization with
//! `deploy/components/beside-kube-proxy`, IPv4 only), with a MutatingAdmissionPolicy that
//! labels every Service outside `kube-system` and `default` for ours: the specs' Services are
//! ours', `kubernetes` and `kube-dns` upstream's; the report adds each proxy's count of
//! Service changes. The report lists the warnings our pods logged. Exits 1 when a spec
//! failed. As root.

use std::path::PathBuf;
use std::time::Duration;

use netlink_tests::realnode::{
    e2e, proxies, proxies::Proxy, workspace_root, Cluster, ClusterConfig, Cni, Family,
};

fn usage() -> ! {
    eprintln!(
        "usage: real-node-e2e [--proxy ours|upstream] [--mode MODE] [--focus RE] [--skip RE] [--out FILE] [--timeout SECONDS] [--nodes N] [--procs P] [--family ipv4|dual|ipv6] [--cni bridge|flannel-iptables|flannel-nftables] [--kustomize DIR] [--host-sysctl KEY=VALUE]... [--config FIELD=YAML]... [--ci] [--beside]"
    );
    std::process::exit(2)
}

fn main() {
    let mut proxy = Proxy::Ours;
    let mut mode = String::new();
    let mut focus: Option<String> = None;
    let mut skip: Option<String> = None;
    let mut family = Family::Ipv4;
    let mut cni = Cni::Bridge;
    let mut out: Option<PathBuf> = None;
    let mut timeout = Duration::from_secs(3600);
    let mut nodes = 3usize;
    let mut procs = e2e::PROCS;
    let mut kustomization: Option<PathBuf> = None;
    let mut ci = false;
    let mut beside = false;
    let mut host_sysctls: Vec<(String, String)> = Vec::new();
    let mut fields: Vec<(String, String)> = Vec::new();
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let mut val = || args.next().unwrap_or_else(|| usage());
        match a.as_str() {
            "--proxy" => {
                proxy = match val().as_str() {
                    "ours" => Proxy::Ours,
                    "upstream" => Proxy::Upstream,
                    _ => usage(),
                }
            }
            "--mode" => mode = val(),
            "--focus" => focus = Some(val()),
            "--skip" => skip = Some(val()),
            "--family" => family = Family::parse(&val()).unwrap_or_else(|| usage()),
            "--cni" => cni = Cni::parse(&val()).unwrap_or_else(|| usage()),
            "--out" => out = Some(PathBuf::from(val())),
            "--procs" => match val().parse() {
                Ok(n) if (1..=16).contains(&n) => procs = n,
                _ => usage(),
            },
            "--nodes" => match val().parse() {
                Ok(n) if (1..=9).contains(&n) => nodes = n,
                _ => usage(),
            },
            "--timeout" => timeout = Duration::from_secs(val().parse().unwrap_or_else(|_| usage())),
            "--kustomize" => kustomization = Some(PathBuf::from(val())),
            "--ci" => ci = true,
            "--beside" => beside = true,
            "--config" => match val().split_once('=') {
                Some((k, v)) if !k.is_empty() => fields.push((k.to_string(), v.to_string())),
                _ => usage(),
            },
            "--host-sysctl" => match val().split_once('=') {
                Some((k, v)) if !k.is_empty() && !k.contains("..") => {
                    host_sysctls.push((k.to_string(), v.to_string()))
                }
                _ => usage(),
            },
            _ => usage(),
        }
    }
    let focus = focus.unwrap_or_else(|| {
        if ci {
            proxies::ci_focus_for(family)
        } else {
            proxies::focus_for(family)
        }
    });
    let skip = skip.unwrap_or_else(|| proxies::skip_regex_for(family));
    if kustomization.is_some() && proxy != Proxy::Ours
        || beside && (proxy != Proxy::Ours || kustomization.is_some() || family != Family::Ipv4)
    {
        usage();
    }
    assert!(netlink_tests::ns::is_root(), "real-node-e2e needs root");
    netlink_tests::deadline::set_limit(timeout + Duration::from_secs(900));
    let ours = workspace_root().join("target/kube-nlproxy-v0.1.0.oci.tar");
    let extra = if proxy == Proxy::Ours {
        assert!(
            ours.exists(),
            "{} missing: run `cargo xtask image` first",
            ours.display()
        );
        vec![ours]
    } else {
        vec![]
    };
    let c = Cluster::start_with(ClusterConfig { nodes, family, cni }, &extra);
    // Flannel's rules before the proxy starts (its start-up cleanup of other modes' rules
    // must leave them alone) and after the run.
    let flannel_before = c.flannel_rules();
    for node in &c.nodes {
        for (key, value) in &host_sysctls {
            node.ns.write_sysctl(key, value);
        }
    }
    let configmap =
        proxies::with_config_fields(&proxies::kubeadm_configmap_for(&mode, family), &fields);
    let limit = Duration::from_secs(180);
    let took = match &kustomization {
        _ if beside => proxies::deploy_beside(&c, &configmap, limit),
        Some(dir) => proxies::deploy_ours_from(&c, dir, &configmap, limit),
        None => proxies::deploy_configured(&c, proxy, &configmap, limit),
    };
    eprintln!("{proxy:?} proxy (mode {mode:?}, beside kube-proxy: {beside}) Ready on every node in {took:?}");
    let warnings = match proxy {
        Proxy::Ours => our_warnings(&c),
        Proxy::Upstream => String::new(),
    };
    c.install_coredns(Duration::from_secs(180));
    let log = c.dir.join("e2e.log");
    let report = e2e::run_in(&c, &focus, &skip, timeout, &log, procs);
    let changes = if beside {
        service_changes(&c)
    } else {
        String::new()
    };
    let flannel_after = c.flannel_rules();
    let flannel = match cni {
        Cni::Bridge => String::new(),
        _ if flannel_before == flannel_after => format!(
            "# Flannel's rules unchanged across the run, handles included ({} rules on {} nodes)\n",
            flannel_before.iter().map(Vec::len).sum::<usize>(),
            flannel_before.len()
        ),
        _ => format!(
            "# Flannel's rules CHANGED across the run:\n# before: {flannel_before:#?}\n# after: {flannel_after:#?}\n"
        ),
    };
    let gates_text: String = fields.iter().map(|(k, v)| format!(", {k}: {v}")).collect();
    let from = match &kustomization {
        _ if beside => ", ours with deploy/components/beside-kube-proxy beside upstream kube-proxy in that mode, every Service outside kube-system and default labelled for ours".to_string(),
        Some(d) => format!(", deployed with kubectl apply -k {}", d.display()),
        None => String::new(),
    };
    let text = format!(
        "# {proxy:?} proxy, mode {mode:?}{gates_text}{from}, {nodes} nodes ({family:?}, CNI {}), {procs} Ginkgo processes\n# focus: {focus}\n# skip: {skip}\n{flannel}{changes}{warnings}# passed {}, failed {}, skipped {}\n{}",
        cni.name(),
        report.passed().count(),
        report.failed().count(),
        report.skipped().count(),
        report.render()
    );
    print!("{text}");
    if let Some(p) = out {
        std::fs::write(&p, &text).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
    }
    let failed = report.failed().count() + usize::from(flannel_before != flannel_after);
    drop(c);
    std::process::exit(i32::from(failed > 0));
}

/// Each proxy's `kubeproxy_sync_proxy_rules_service_changes_total`, summed over the nodes
/// (ours on the component's 10349, upstream's on 10249): beside each other, ours counts the
/// specs' Services and upstream the few of `kube-system` and `default`.
fn service_changes(c: &netlink_tests::realnode::Cluster) -> String {
    let name = "kubeproxy_sync_proxy_rules_service_changes_total";
    let sum = |addr: &str| -> f64 {
        c.nodes
            .iter()
            .map(|n| {
                netlink_tests::differential::sample(
                    &netlink_tests::differential::metrics(&n.ns, addr),
                    name,
                )
            })
            .sum()
    };
    format!(
        "# Service changes seen ({name}, all nodes): ours {}, upstream kube-proxy {}\n",
        sum("127.0.0.1:10349"),
        sum("127.0.0.1:10249")
    )
}

/// The warning lines (klog's `W…`) our pods logged by the time they were Ready, each as a
/// `# ` line of the report.
fn our_warnings(c: &Cluster) -> String {
    let logs = String::from_utf8_lossy(&c.our_pod_logs(-1).stdout).into_owned();
    let lines: Vec<&str> = logs
        .lines()
        .filter(|l| {
            let text = l.split_once("] ").map_or(*l, |(_, t)| t);
            text.starts_with('W') && text[1..].starts_with(|c: char| c.is_ascii_digit())
        })
        .collect();
    let mut out = format!("# our pods' warnings at start: {}\n", lines.len());
    for l in lines {
        out.push_str(&format!("#   {l}\n"));
    }
    out
}
