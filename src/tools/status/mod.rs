//! `kube-nlproxy status` and `kube-nlproxy diff`: both take the daemon's own flags (so that
//! they read the same sources and config as the daemon: `--config`, `--manifests`,
//! `--kubeconfig`, `--proxy-mode`, …), load the current state once, and compare what a
//! sync of it would program with what the kernel holds. `status` adds what is programmed
//! (counts per family) and the running daemon's last sync (its metrics endpoint, when
//! reachable); `diff` prints the operations a sync would send, as `nft` commands and IPVS
//! changes, without sending them. The comparisons and renderers are pure; [`run`] reads.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::net::IpAddr;

use crate::config::{Config, ProxyMode};
use crate::kernel::ipvs::{Ipvs, RealServer, VirtualServer, VsKey};
use crate::kernel::nft::live::LiveTable;
use crate::kernel::nft::lower::KExpr;
use crate::kernel::nft::render;
use crate::model::ProxyState;
use crate::modes::ipvs::plan::IpvsPlan;

mod ipvs;
mod scrape;
mod text;

pub use ipvs::ipvs_drift;
use scrape::daemon_json;
pub use scrape::{daemon_from_metrics, Daemon};
pub use text::render_text;

use super::drift::{drift, Drift};
use super::explain::LiveKernel;
use super::ToolError;

pub use crate::config::StateTool;

/// The tool's own flags taken out of `args`; the rest are the daemon's.
pub fn split_args(diff: bool, args: &[String]) -> (StateTool, Vec<String>) {
    let mut json = false;
    let rest = args
        .iter()
        .filter(|a| {
            let mine = matches!(a.as_str(), "--json" | "--json=true");
            json |= mine;
            !mine && a.as_str() != "--json=false"
        })
        .cloned()
        .collect();
    (StateTool { diff, json }, rest)
}

/// The daemon's own flags for a `status` or `diff` given none, in the daemon's pod: PID 1's
/// command line (`cmdline`, NUL-separated, as `/proc/1/cmdline` holds it) when PID 1 is our
/// daemon (`kube-proxy` or `kube-nlproxy`, not one of our tools), without the flags that
/// change what a run does (`--cleanup`, `--init-only`, `--once`, `--write-config-to`), and
/// `--hostname-override=NODE_NAME` when it has none (the Downward API's variable that
/// deploy/ and kubeadm set). `None` otherwise. Pure.
pub fn daemon_flags(cmdline: &[u8], node_name: Option<&str>) -> Option<Vec<String>> {
    let mut args = cmdline
        .split(|b| *b == 0)
        .map(|a| String::from_utf8_lossy(a).into_owned());
    let argv0 = args.next()?;
    let program = argv0.rsplit('/').next().unwrap_or(&argv0);
    if program != "kube-proxy" && program != "kube-nlproxy" {
        return None;
    }
    let mut flags: Vec<String> = args.filter(|a| !a.is_empty()).collect();
    if flags
        .first()
        .is_some_and(|f| super::TOOLS.iter().any(|(t, _)| t == f))
    {
        return None;
    }
    let changes_the_run = |f: &str| {
        let name = f.split('=').next().unwrap_or(f);
        matches!(
            name,
            "--cleanup" | "--init-only" | "--once" | "--write-config-to" | "--dry-run"
        )
    };
    flags.retain(|f| !changes_the_run(f));
    let has_hostname = flags
        .iter()
        .any(|f| f == "--hostname-override" || f.starts_with("--hostname-override="));
    if let Some(node) = node_name.filter(|n| !n.is_empty() && !has_hostname) {
        flags.push(format!("--hostname-override={node}"));
    }
    Some(flags)
}

/// [`daemon_flags`] of this machine: `/proc/1/cmdline` and `$NODE_NAME`.
pub fn daemon_flags_here() -> Option<Vec<String>> {
    let cmdline = std::fs::read("/proc/1/cmdline").ok()?;
    daemon_flags(&cmdline, std::env::var("NODE_NAME").ok().as_deref())
}

/// What is programmed in one table, counted from the kernel's own listing.
#[derive(Debug, Clone, Default, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Counts {
    pub services: usize,
    pub service_ports: usize,
    pub endpoints: usize,
    pub chains: usize,
    pub rules: usize,
    pub elements: usize,
}

/// Counts of one of our tables: service ports are the `service-…-ns/name/proto/port`
/// chains, endpoints the slots their `numgen` picks from (or their DNATs), and each element
/// of the one-endpoint map one service port with one endpoint (its comment names it).
pub fn counts(t: &LiveTable) -> Counts {
    let mut services = BTreeSet::new();
    let mut c = Counts {
        chains: t.chains.len(),
        rules: t.rule_count(),
        elements: t.element_count(),
        ..Default::default()
    };
    for (name, chain) in &t.chains {
        // service-HASH-ns/name/proto/port (static chains like service-endpoints-check
        // have no slash).
        let Some((_, spn)) = name
            .strip_prefix("service-")
            .and_then(|r| r.split_once('-'))
            .filter(|(_, spn)| spn.contains('/'))
        else {
            continue;
        };
        c.service_ports += 1;
        let mut parts = spn.splitn(3, '/');
        if let (Some(ns), Some(n)) = (parts.next(), parts.next()) {
            services.insert(format!("{ns}/{n}"));
        }
        let exprs = chain.rules.iter().filter_map(|r| r.exprs.as_ref().ok());
        let numgen: Option<u32> = exprs.clone().flatten().find_map(|e| match e {
            KExpr::Numgen { modulus, .. } => Some(*modulus),
            _ => None,
        });
        c.endpoints += match numgen {
            Some(n) => n as usize,
            None => exprs
                .flatten()
                .filter(|e| matches!(e, KExpr::Nat { .. }))
                .count(),
        };
    }
    // Service ports without a chain of their own: their ClusterIP goes to a shared chain,
    // `one-endpoint` or `balance-N`, whose N is their endpoint count.
    if let Some(ips) = t.sets.get(crate::proxy::names::SERVICE_IPS) {
        use crate::kernel::nft::{live::LiveData, Verdict};
        for (key, data) in &ips.elements {
            let LiveData::Verdict(Verdict::Goto(chain)) = data else {
                continue;
            };
            let n = if &**chain == crate::proxy::names::ONE_ENDPOINT_CHAIN {
                1
            } else if let Some(n) = crate::proxy::names::balance_width(chain) {
                n
            } else {
                continue;
            };
            c.service_ports += 1;
            c.endpoints += n;
            // `ns/name:port`, or `ns/name` for an unnamed port.
            if let Some(comment) = ips.comments.get(key) {
                let service = comment.split_once(':').map_or(comment.as_str(), |(s, _)| s);
                services.insert(service.to_string());
            }
        }
    }
    c.services = services.len();
    c
}

/// One family's part of the report.
#[derive(Debug, Clone, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct FamilyReport {
    pub family: &'static str,
    pub table: String,
    pub generation: u32,
    pub counts: Counts,
    pub differences: Vec<String>,
    /// `diff`: the operations, one `nft` command each.
    pub operations: Vec<String>,
}

#[derive(Debug, Clone, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct IpvsReport {
    pub virtual_servers: usize,
    pub real_servers: usize,
    pub differences: Vec<String>,
    /// `diff`: the changes, in `ipvsadm` notation.
    pub operations: Vec<String>,
}

#[derive(Debug, Clone, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Report {
    /// The mode as configured, as `/proxyMode` names it (`iptables` when the configuration
    /// left it empty) ...
    pub mode: String,
    /// ... and the engine serving it (`nftables` for iptables mode, `ipvs`).
    pub engine: &'static str,
    pub source: String,
    pub families: Vec<FamilyReport>,
    pub ipvs: Option<IpvsReport>,
    /// The daemon's figures, or why its metrics endpoint could not be read. In JSON:
    /// `{"reachable": true, "metrics_url": …, …}` or `{"reachable": false, "error": "…"}`.
    #[serde(serialize_with = "daemon_json")]
    pub daemon: Result<Daemon, String>,
    pub in_sync: bool,
}

/// `status` or `diff` of `state` (from the daemon's sources) against the live kernel.
/// A finding (exit 1) when the live kernel differs from the plan.
pub fn run(tool: StateTool, cfg: &Config, state: &ProxyState) -> Result<super::Printed, ToolError> {
    let opts = cfg.proxy_options();
    let mut kernel = LiveKernel::new();
    let mut families = Vec::new();
    let mut ipvs = None;
    let plan_for = |live: &LiveTable, ipvs_plan: Option<&IpvsPlan>| match ipvs_plan {
        None => crate::modes::nftables::plan_against(&opts, state, live),
        Some(p) => {
            let mut local = crate::proxy::LocalDetectorResolver::new(opts.detect_local.clone());
            let pcfg = local.resolve(&opts.proxier, &state.node);
            crate::modes::ipvs::table::build_ruleset(state, p, &pcfg, live.family)
        }
    };
    let ipvs_plan = match cfg.mode {
        ProxyMode::Nftables => None,
        ProxyMode::Ipvs => Some(read_ipvs_plan(cfg, state)?),
        _ => {
            return Err(ToolError::Usage {
                tool: if tool.diff { "diff" } else { "status" },
                msg: format!(
                    "--proxy-mode {}: the userspace mode's table names listener ports the daemon picks at run time; status and diff cover the nftables and ipvs modes",
                    cfg.mode.name()
                ),
            })
        }
    };
    for &family in &cfg.families {
        let (live, generation) = kernel.read_table(family, &cfg.proxier.table)?;
        let rs = plan_for(&live, ipvs_plan.as_ref().map(|(p, _, _)| p));
        let d: Drift = drift(&rs, &live);
        families.push(FamilyReport {
            family: family.name(),
            table: cfg.proxier.table.clone(),
            generation,
            counts: counts(&live),
            operations: if tool.diff {
                d.tx.ops
                    .iter()
                    .map(|o| render::op(o, family, &d.tx.table))
                    .collect()
            } else {
                Vec::new()
            },
            differences: d.differences,
        });
    }
    if let Some((plan, live, vips)) = &ipvs_plan {
        let (differences, operations) = ipvs_drift(plan, live, vips, &cfg.ipvs.dummy_link);
        ipvs = Some(IpvsReport {
            virtual_servers: live.len(),
            real_servers: live.iter().map(|(_, d)| d.len()).sum(),
            differences,
            operations: if tool.diff { operations } else { Vec::new() },
        });
    }
    let daemon = match cfg.metrics_bind_address {
        None => Err("metrics are off (--metrics-bind-address)".into()),
        Some(mut a) if !tool.diff => {
            if a.ip().is_unspecified() {
                a.set_ip(IpAddr::from([127, 0, 0, 1]));
            }
            super::http_get(a, "/metrics")
                .map(|t| daemon_from_metrics(format!("http://{a}/metrics"), &t))
        }
        Some(_) => Err("not read by diff".into()),
    };
    let in_sync = families.iter().all(|f| f.differences.is_empty())
        && ipvs.as_ref().is_none_or(|i| i.differences.is_empty());
    let report = Report {
        mode: cfg.requested_mode.clone(),
        engine: cfg.mode.name(),
        source: match (&cfg.manifests, &cfg.kubeconfig, &cfg.master) {
            (Some(m), _, _) => format!("--manifests {}", m.display()),
            (None, Some(k), _) => format!("the API server of {}", k.display()),
            (None, None, Some(m)) => format!("the API server at {m}"),
            _ => "the API server (in-cluster config)".into(),
        },
        families,
        ipvs,
        daemon,
        in_sync,
    };
    let text = if tool.json {
        super::to_json(
            if tool.diff {
                "ProxyDiff"
            } else {
                "ProxyStatus"
            },
            &report,
        )
    } else {
        render_text(&report, tool.diff)
    };
    Ok(super::Printed {
        text,
        finding: !report.in_sync,
    })
}

type LiveIpvs = (
    IpvsPlan,
    Vec<(VirtualServer, Vec<RealServer>)>,
    BTreeSet<IpAddr>,
);

/// The IPVS plan for `state` on this node, and the kernel's virtual servers and VIPs.
fn read_ipvs_plan(cfg: &Config, state: &ProxyState) -> Result<LiveIpvs, ToolError> {
    use crate::kernel::rtnl::Links;
    let mut links = crate::kernel::rtnl::NetlinkLinks::open()
        .map_err(|e| ToolError::kernel("open the rtnetlink socket", e))?;
    let dummy = links
        .link(&cfg.ipvs.dummy_link)
        .map_err(|e| ToolError::kernel(format!("look up link {}", cfg.ipvs.dummy_link), e))?
        .map(|l| l.index);
    let addrs = links
        .addresses()
        .map_err(|e| ToolError::kernel("list addresses", e))?;
    let node: Vec<IpAddr> = addrs
        .iter()
        .filter(|a| Some(a.index) != dummy)
        .map(|a| a.addr)
        .collect();
    let vips: BTreeSet<IpAddr> = addrs
        .iter()
        .filter(|a| Some(a.index) == dummy)
        .map(|a| a.addr)
        .collect();
    let node_addrs = crate::modes::ipvs::plan::nodeport_addresses(
        &node,
        &cfg.proxier.nodeport_addresses,
        &state.node.addresses,
    );
    let plan = crate::modes::ipvs::plan::build_plan(state, &cfg.ipvs, &node_addrs);
    let mut ipvs = crate::kernel::ipvs::netlink::NetlinkIpvs::open()
        .map_err(|e| ToolError::kernel("open the IPVS netlink socket", e))?;
    let mut live = Vec::new();
    for vs in ipvs
        .services()
        .map_err(|e| ToolError::kernel("list IPVS virtual servers", e))?
    {
        let d = ipvs
            .dests(&vs)
            .map_err(|e| ToolError::kernel(format!("list the real servers of {}", vs.key()), e))?;
        live.push((vs, d));
    }
    Ok((plan, live, vips))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernel::nft::Family;

    #[test]
    fn in_the_pod_the_daemons_own_flags_are_used() {
        let kubeadm = b"/usr/local/bin/kube-proxy\0--config=/var/lib/kube-proxy/config.conf\0--hostname-override=node-a\0";
        assert_eq!(
            daemon_flags(kubeadm, Some("ignored")).unwrap(),
            [
                "--config=/var/lib/kube-proxy/config.conf",
                "--hostname-override=node-a"
            ]
        );
        // No --hostname-override: NODE_NAME's; run-changing flags dropped.
        let ours = b"/kube-nlproxy\0--config=/c.yaml\0--cleanup=false\0--v=2\0";
        assert_eq!(
            daemon_flags(ours, Some("node-b")).unwrap(),
            ["--config=/c.yaml", "--v=2", "--hostname-override=node-b"]
        );
        assert_eq!(
            daemon_flags(ours, None).unwrap(),
            ["--config=/c.yaml", "--v=2"]
        );
        // Not our daemon: a host's init, or one of our tools as PID 1.
        assert_eq!(daemon_flags(b"/sbin/init\0splash\0", Some("n")), None);
        assert_eq!(
            daemon_flags(b"/usr/local/bin/kube-proxy\0uninstall\0", None),
            None
        );
        assert_eq!(daemon_flags(b"", None), None);
    }

    #[test]
    fn daemon_figures_from_the_metrics_page() {
        let page = "# HELP x\n\
kubeproxy_sync_proxy_rules_last_timestamp_seconds{ip_family=\"IPv4\"} 1700000010\n\
kubeproxy_sync_proxy_rules_last_timestamp_seconds{ip_family=\"IPv6\"} 1700000012\n\
kubeproxy_sync_proxy_rules_duration_seconds_sum{ip_family=\"IPv4\"} 0.3\n\
kubeproxy_sync_proxy_rules_duration_seconds_sum{ip_family=\"IPv6\"} 0.1\n\
kubeproxy_sync_proxy_rules_duration_seconds_count{ip_family=\"IPv4\"} 3\n\
kubeproxy_sync_proxy_rules_duration_seconds_count{ip_family=\"IPv6\"} 1\n\
kubeproxy_sync_proxy_rules_endpoint_changes_pending 2\n\
kube_nlproxy_sync_last_duration_seconds 0.05\n\
kube_nlproxy_sync_last_result 0\n";
        let d = daemon_from_metrics("u".into(), page);
        assert_eq!(
            d.last_sync,
            Some(1700000012.0),
            "the latest family, not a sum"
        );
        assert_eq!(d.syncs, 4);
        assert!((d.mean_sync_seconds.unwrap() - 0.1).abs() < 1e-9);
        assert_eq!(d.pending_endpoint_changes, 2.0);
        assert_eq!(d.pending_service_changes, 0.0);
        assert_eq!(
            (d.last_sync_seconds, d.last_sync_ok),
            (Some(0.05), Some(false))
        );
    }

    /// A report on `examples/cluster.yaml`'s node, as `run` builds it: the drift comes from
    /// comparing a live table with one element removed against the plan.
    fn report(diff: bool) -> Report {
        let st = crate::model::fixtures::web_state(None);
        let cfg = crate::proxy::ProxierConfig::default();
        let plan = crate::modes::nftables::plan::build_ruleset(&st, &cfg, Family::Ip);
        let mut live = plan.as_live();
        let ips = live.sets.get_mut("service-ips").unwrap();
        let k = ips.elements.keys().next().unwrap().clone();
        ips.elements.remove(&k);
        let d = drift(&plan, &live);
        Report {
            mode: "nftables".into(),
            engine: "nftables",
            source: "--manifests examples/cluster.yaml".into(),
            families: vec![FamilyReport {
                family: "ip",
                table: "kube-nlproxy".into(),
                generation: 12,
                counts: counts(&live),
                operations: if diff {
                    d.tx.ops
                        .iter()
                        .map(|o| render::op(o, Family::Ip, &d.tx.table))
                        .collect()
                } else {
                    Vec::new()
                },
                differences: d.differences,
            }],
            ipvs: None,
            daemon: Err("Connection refused (os error 111)".into()),
            in_sync: false,
        }
    }

    /// The `--json` schema (docs/operating.md): its field names pinned, and no Rust
    /// `Ok`/`Err` wrapper anywhere.
    #[test]
    fn json_schema_is_pinned() {
        fn keys(v: &serde_json::Value) -> Vec<&str> {
            let mut k: Vec<&str> = v.as_object().unwrap().keys().map(String::as_str).collect();
            k.sort_unstable();
            k
        }
        fn no_wrappers(v: &serde_json::Value) {
            match v {
                serde_json::Value::Object(m) => {
                    assert!(!m.contains_key("Ok") && !m.contains_key("Err"), "{v}");
                    m.values().for_each(no_wrappers);
                }
                serde_json::Value::Array(a) => a.iter().for_each(no_wrappers),
                _ => {}
            }
        }
        let mut r = report(true);
        let down = serde_json::to_value(&r).unwrap();
        assert_eq!(
            keys(&down),
            ["daemon", "engine", "families", "inSync", "ipvs", "mode", "source"]
        );
        assert_eq!(
            down["daemon"],
            serde_json::json!({"reachable": false, "error": "Connection refused (os error 111)"})
        );
        assert_eq!(
            keys(&down["families"][0]),
            [
                "counts",
                "differences",
                "family",
                "generation",
                "operations",
                "table"
            ]
        );
        no_wrappers(&down);
        r.daemon = Ok(Daemon {
            metrics_url: "http://127.0.0.1:10249/metrics".into(),
            syncs: 3,
            ..Daemon::default()
        });
        let up = serde_json::to_value(&r).unwrap();
        assert_eq!(
            keys(&up["daemon"]),
            [
                "lastSync",
                "lastSyncOk",
                "lastSyncSeconds",
                "meanSyncSeconds",
                "metricsUrl",
                "pendingEndpointChanges",
                "pendingServiceChanges",
                "reachable",
                "syncFailures",
                "syncs"
            ]
        );
        assert_eq!(up["daemon"]["reachable"], true);
        assert_eq!(up["daemon"]["syncs"], 3);
        no_wrappers(&up);
    }

    /// Service ports with chains and those without (one endpoint, or several through a
    /// `balance-N` chain) are all counted, with their Services and endpoints.
    #[test]
    fn counts_include_service_ports_without_chains() {
        use crate::model::{Endpoint, ServicePort, ServicePortName};
        let mut st = crate::model::fixtures::synthetic_state(2, 2);
        // One keeps a chain of its own (a NodePort), the other goes through `balance-2`.
        crate::model::fixtures::first_service_mut(&mut st).node_port = Some(30001);
        let spn = ServicePortName {
            namespace: "ns".into(),
            name: "one".into(),
            port: "dns".into(),
            protocol: crate::model::Protocol::Udp,
        };
        let sp = ServicePort::new(spn.clone(), "10.96.9.9".parse().unwrap(), 53);
        st.services.insert(spn.clone(), sp.into());
        let ep = Endpoint::ready("10.244.9.9".parse().unwrap(), 53, false);
        st.endpoints.insert(spn, vec![ep].into());
        let cfg = crate::proxy::ProxierConfig::default();
        let live = crate::modes::nftables::plan::build_ruleset(&st, &cfg, Family::Ip).as_live();
        assert!(live.chains.contains_key("balance-2"));
        assert_eq!(
            live.chains
                .keys()
                .filter(|c| c.starts_with("service-") && c.contains('/'))
                .count(),
            1,
            "{:?}",
            live.chains.keys()
        );
        let c = counts(&live);
        assert_eq!((c.services, c.service_ports, c.endpoints), (3, 3, 5));
    }

    #[test]
    fn golden_text_for_status_with_drift_and_diff() {
        super::super::golden("status-drift.txt", &render_text(&report(false), false));
        super::super::golden("diff-drift.txt", &render_text(&report(true), true));
    }

    /// default/web:http, TCP.
    fn web_http() -> crate::model::ServicePortName {
        crate::model::ServicePortName {
            namespace: "default".into(),
            name: "web".into(),
            port: "http".into(),
            protocol: crate::model::Protocol::Tcp,
        }
    }

    #[test]
    fn ipvs_drift_of_a_scheduler_names_its_flags_as_ipvsadm_does() {
        use crate::kernel::ipvs::uapi::{IP_VS_SVC_F_SCHED1, IP_VS_SVC_F_SCHED2};
        use crate::modes::ipvs::plan::{DesiredVs, VsKind};
        let live = VirtualServer {
            addr: "10.96.0.10".parse().unwrap(),
            port: 80,
            protocol: 6,
            scheduler: "rr".into(),
            persistence: 0,
            sched_flags: 0,
        };
        let want = VirtualServer {
            scheduler: "mh".into(),
            sched_flags: IP_VS_SVC_F_SCHED1 | IP_VS_SVC_F_SCHED2,
            ..live.clone()
        };
        let mut plan = IpvsPlan::default();
        plan.services.insert(
            want.key(),
            DesiredVs {
                vs: want.clone(),
                kind: VsKind::ClusterIp,
                service: web_http(),
                dests: Default::default(),
            },
        );
        let vips: BTreeSet<IpAddr> = plan.vips.clone();
        let (diffs, ops) = ipvs_drift(&plan, &[(live, vec![])], &vips, "kube-ipvs0");
        assert_eq!(
            diffs,
            ["virtual server tcp 10.96.0.10:80: -s rr, planned -s mh -b mh-fallback,mh-port"]
        );
        assert_eq!(ops, ["-E -t 10.96.0.10:80 -s mh -b mh-fallback,mh-port"]);
    }

    #[test]
    fn ipvs_drift_names_each_difference_and_its_ipvsadm_change() {
        use crate::modes::ipvs::plan::{DesiredVs, VsKind};
        let vs = |port| VirtualServer {
            addr: "10.96.0.10".parse().unwrap(),
            port,
            protocol: 6,
            scheduler: "rr".into(),
            persistence: 0,
            sched_flags: 0,
        };
        let rs = |a: &str, w| RealServer {
            weight: w,
            ..RealServer::masq(a.parse().unwrap(), 8080)
        };
        let mut plan = IpvsPlan::default();
        plan.services.insert(
            vs(80).key(),
            DesiredVs {
                vs: vs(80),
                kind: VsKind::ClusterIp,
                service: web_http(),
                dests: [("10.244.1.2", 1), ("10.244.2.2", 1)]
                    .iter()
                    .map(|(a, w)| ((a.parse().unwrap(), 8080), rs(a, *w)))
                    .collect(),
            },
        );
        plan.vips.insert("10.96.0.10".parse().unwrap());
        let live = vec![(vs(80), vec![rs("10.244.1.2", 0)]), (vs(81), vec![])];
        let (diffs, ops) = ipvs_drift(&plan, &live, &BTreeSet::new(), "kube-ipvs0");
        assert_eq!(
            diffs,
            [
                "virtual server tcp 10.96.0.10:80: real server 10.244.1.2:8080 weight 0, planned 1",
                "virtual server tcp 10.96.0.10:80: real server 10.244.2.2:8080 missing",
                "virtual server tcp 10.96.0.10:81: not in the plan",
                "address 10.96.0.10 on kube-ipvs0: missing",
            ]
        );
        assert_eq!(
            ops,
            [
                "-e -t 10.96.0.10:80 -r 10.244.1.2:8080 -m -w 1",
                "-a -t 10.96.0.10:80 -r 10.244.2.2:8080 -m -w 1",
                "-D -t 10.96.0.10:81",
                "address add 10.96.0.10 dev kube-ipvs0",
            ]
        );
    }

    #[test]
    fn tool_flags_are_split_from_the_daemons() {
        let a: Vec<String> = ["--json", "--manifests", "m.yaml", "--json=false"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        let (t, rest) = split_args(true, &a);
        assert!(t.json && t.diff);
        assert_eq!(rest, ["--manifests", "m.yaml"]);
    }
}
