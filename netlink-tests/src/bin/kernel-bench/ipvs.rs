//! The IPVS rows, inside the test VM (a kernel with IPVS): our IPVS full sync against
//! `ipvsadm -R` of the same servers, where the whole IPVS-mode sync's time goes, and ours
//! beside upstream's IPVS mode (I/O: genetlink, rtnetlink, nftables, `ipvsadm`).

use std::fmt::Write as _;
use std::net::{IpAddr, SocketAddr};
use std::time::{Duration, Instant};

use kube_nlproxy::config::DetectLocal;
use kube_nlproxy::kernel::ipvs::netlink::NetlinkIpvs;
use kube_nlproxy::kernel::ipvs::{Ipvs, IpvsOp};
use kube_nlproxy::kernel::nft::netlink::NetlinkNftables;
use kube_nlproxy::kernel::nft::Family;
use kube_nlproxy::kernel::rtnl::{host_prefix, IfAddr, Links, NetlinkLinks};
use kube_nlproxy::model::ProxyState;
use kube_nlproxy::modes::ipvs::plan::{build_plan, IpvsConfig, IpvsPlan};
use kube_nlproxy::modes::ipvs::{table, IpvsProxier};
use kube_nlproxy::proxy::{ProxierConfig, SyncStats, TableSync};
use netlink_tests::apiserver::ApiServer;
use netlink_tests::baseline::cluster_ip;
use netlink_tests::cluster::Cluster;
use netlink_tests::differential::Upstream;
use netlink_tests::ns::NetNs;

use crate::args::EPS;
use crate::harness::{cfg, state, stop, timed};
use crate::side_by_side::{
    bench_slice, change_latencies, first_sync, side_by_side_push, spawn_ours,
};
use crate::table::{render_ratio, render_time, render_time_ratio, Goal, Row, Table, Target, Unit};

/// The goal of the whole IPVS-mode full sync against `ipvsadm -R` of the servers alone, at
/// 10k services and above.
const WHOLE_SYNC_RATIO: f64 = 4.0;

/// The configuration of the IPVS mode's companion nftables table.
fn ipvs_table_cfg() -> ProxierConfig {
    ProxierConfig {
        table: table::DEFAULT_TABLE.into(),
        ..cfg()
    }
}

/// `plan`'s virtual and real servers as `ipvsadm -R` input.
fn render_ipvsadm(plan: &IpvsPlan) -> String {
    let mut text = String::new();
    for d in plan.services.values() {
        let vs = SocketAddr::new(d.vs.addr, d.vs.port);
        let _ = writeln!(text, "-A -t {vs} -s rr");
        for rs in d.dests.values() {
            let r = SocketAddr::new(rs.addr, rs.port);
            let _ = writeln!(text, "-a -t {vs} -r {r} -m -w 1");
        }
    }
    text
}

/// `plan`'s servers added one acknowledged request at a time (what the IPVS mode did
/// before #18), in a fresh namespace.
fn add_one_by_one(plan: &IpvsPlan) -> Duration {
    let p = plan.clone();
    NetNs::new("kbipvs").run(move || {
        let mut ipvs = NetlinkIpvs::open().unwrap();
        let t0 = Instant::now();
        for d in p.services.values() {
            ipvs.add_service(&d.vs).unwrap();
            for rs in d.dests.values() {
                ipvs.add_dest(&d.vs, rs).unwrap();
            }
        }
        t0.elapsed()
    })
}

/// `plan`'s servers pipelined, as the IPVS mode sends them: the virtual servers, then the
/// real ones; in a fresh namespace.
fn add_pipelined(plan: &IpvsPlan) -> Duration {
    let p = plan.clone();
    NetNs::new("kbipvsp").run(move || {
        let mut ipvs = NetlinkIpvs::open().unwrap();
        let t0 = Instant::now();
        let vss: Vec<IpvsOp> = p
            .services
            .values()
            .map(|d| IpvsOp::AddService(d.vs.clone()))
            .collect();
        let rss: Vec<IpvsOp> = p
            .services
            .values()
            .flat_map(|d| {
                d.dests
                    .values()
                    .map(|rs| IpvsOp::AddDest(d.vs.clone(), rs.clone()))
            })
            .collect();
        for r in ipvs.apply(&vss).into_iter().chain(ipvs.apply(&rss)) {
            r.unwrap();
        }
        t0.elapsed()
    })
}

/// The whole IPVS-mode full sync of `st` (servers, VIPs on kube-ipvs0, the companion
/// table), in a fresh namespace.
fn whole_sync(st: &ProxyState) -> Duration {
    let st = st.clone();
    NetNs::new("kbipvsfull").run(move || {
        let mut rec = IpvsProxier::new(
            NetlinkIpvs::open().unwrap(),
            NetlinkLinks::open().unwrap(),
            NetlinkNftables::open().unwrap(),
            IpvsConfig::default(),
            ipvs_table_cfg(),
            DetectLocal::ClusterCidr(vec![]),
        );
        let t0 = Instant::now();
        rec.sync(&st).unwrap();
        t0.elapsed()
    })
}

/// `plan`'s VIPs added to kube-ipvs0, pipelined, in a fresh namespace.
fn add_vips(plan: &IpvsPlan) -> Duration {
    let vips: Vec<IpAddr> = plan.vips.iter().copied().collect();
    NetNs::new("kbipvsvips").run(move || {
        let mut links = NetlinkLinks::open().unwrap();
        links.add_dummy("kube-ipvs0").unwrap();
        let index = links.link("kube-ipvs0").unwrap().unwrap().index;
        let addrs: Vec<IfAddr> = vips
            .iter()
            .map(|a| IfAddr {
                index,
                addr: *a,
                prefix_len: host_prefix(a),
            })
            .collect();
        let t0 = Instant::now();
        for r in links.change_addresses(true, &addrs) {
            r.unwrap();
        }
        t0.elapsed()
    })
}

/// The companion nftables table of `st` and `plan` (both families), in a fresh namespace.
fn sync_companion_table(st: &ProxyState, plan: &IpvsPlan) -> Duration {
    let (st, plan) = (st.clone(), plan.clone());
    NetNs::new("kbipvstable").run(move || {
        let pcfg = ipvs_table_cfg();
        let mut nft = NetlinkNftables::open().unwrap();
        let mut sync = TableSync::new(pcfg.table.clone());
        let t0 = Instant::now();
        for family in Family::all() {
            let rs = table::build_ruleset(&st, &plan, &pcfg, family);
            sync.sync(&mut nft, rs, true, &mut SyncStats::default())
                .unwrap();
        }
        t0.elapsed()
    })
}

/// IPVS: a full sync of `n` services × 10 endpoints into an empty namespace, our genl
/// client against `ipvsadm -R` of the same virtual and real servers; and the whole IPVS-mode
/// sync (VIPs on kube-ipvs0 and the companion nftables table included) with each of its
/// other two parts alone. Needs a kernel with IPVS: run inside the VM (see BENCHMARKS.md).
pub fn ipvs_rows(table: &mut Table, sizes: &[usize]) {
    assert!(
        std::path::Path::new("/proc/net/ip_vs").exists(),
        "--ipvs-only needs a kernel with IPVS: netlink-tests/vm/run-in-vm.sh --share $PWD -- ./target/release/kernel-bench --ipvs-only"
    );
    for &n in sizes {
        let st = state(n);
        let plan = build_plan(&st, &IpvsConfig::default(), &[]);
        let one_by_one = add_one_by_one(&plan);
        let ours = add_pipelined(&plan);
        let base = timed(
            &NetNs::new("kbipvsadm"),
            &["ipvsadm", "-R"],
            &render_ipvsadm(&plan),
        );
        let ratio = base.as_secs_f64() / ours.as_secs_f64();
        table.push(
            Row::new(
                format!("IPVS full sync {n}×{EPS}: virtual + real servers, pipelined"),
                render_time(ours),
            )
            .baseline(format!("{} (`ipvsadm -R`)", render_time(base)))
            .ratio(format!("{} faster", render_time_ratio(base, ours, 1)))
            .target(Target::goal(Goal::FasterThan {
                baseline: "ipvsadm -R",
                ratio,
            })),
        );
        table.push(
            Row::new(
                format!(
                    "IPVS full sync {n}×{EPS}: pipelined vs one acknowledged request at a time"
                ),
                render_time(ours),
            )
            .baseline(render_time(one_by_one))
            .ratio(render_time_ratio(one_by_one, ours, 1))
            .target(Target::Note("(issue #18)")),
        );
        let whole = whole_sync(&st);
        let ratio = base.as_secs_f64() / whole.as_secs_f64();
        table.push(
            Row::new(
                format!("IPVS-mode full sync {n}×{EPS}: + VIPs on kube-ipvs0 + nftables table"),
                render_time(whole),
            )
            .baseline(format!(
                "{} (`ipvsadm -R`, servers only)",
                render_time(base)
            ))
            .ratio(render_ratio(base.as_secs_f64(), whole.as_secs_f64(), 1))
            .target(if n >= 10_000 {
                Target::goal(Goal::at_least(ratio, WHOLE_SYNC_RATIO, Unit::Times))
            } else {
                Target::Note("(reported)")
            }),
        );
        // Where the rest of the whole sync goes: its other two parts alone, each in a
        // fresh namespace, as the IPVS mode sends them.
        for (part, t) in [
            (
                format!("{} VIPs on kube-ipvs0, pipelined", plan.vips.len()),
                add_vips(&plan),
            ),
            (
                "the companion nftables table (both families)".to_string(),
                sync_companion_table(&st, &plan),
            ),
        ] {
            table.push(
                Row::new(
                    format!("IPVS-mode full sync {n}×{EPS}, one part alone: {part}"),
                    render_time(t),
                )
                .baseline(format!("{} (the whole sync)", render_time(whole)))
                .ratio(format!(
                    "{:.0}%",
                    100.0 * t.as_secs_f64() / whole.as_secs_f64()
                ))
                .target(Target::Note("(where the time goes)")),
            );
        }
        eprintln!("ipvs {n}: done");
    }
}

/// IPVS mode side by side, in the VM: ours and upstream's IPVS mode, each node served `n`
/// Services × 10 endpoints by one of our fake API servers (no real apiserver runs under the
/// VM's emulated CPU).
pub fn ipvs_side_by_side_rows(table: &mut Table, n: usize, changes: usize) {
    let objects = |api: &ApiServer| {
        api.apply(serde_json::json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "node1"},
            "status": {"addresses": [{"type": "InternalIP", "address": netlink_tests::cluster::NODE_IP}]}}));
        for i in 0..n {
            let ip = cluster_ip(i).to_string();
            api.apply(serde_json::json!({"apiVersion": "v1", "kind": "Service",
                "metadata": {"name": format!("svc-{i}"), "namespace": "default"},
                "spec": {"type": "ClusterIP", "clusterIP": ip, "clusterIPs": [ip], "ipFamilies": ["IPv4"],
                    "ipFamilyPolicy": "SingleStack", "sessionAffinity": "None", "internalTrafficPolicy": "Cluster",
                    "ports": [{"name": "http", "port": 80, "targetPort": 8080, "protocol": "TCP"}]}}));
            api.apply(bench_slice(i, EPS, false));
        }
    };
    let (a, b) = (Cluster::new(), Cluster::new());
    let api_a = a.node.run(ApiServer::start);
    let api_b = b.node.run(ApiServer::start);
    objects(&api_a);
    objects(&api_b);
    let master = format!("--master={}", api_b.url());
    let up = Upstream::start(
        &b.node,
        "ipvs",
        &[&master, "--kube-api-content-type=application/json"],
        &b.dir,
    );
    let t_up = first_sync(&b.node, up.child.id(), "upstream ipvs");
    eprintln!("ipvs side by side: upstream: {t_up:?}");
    let url = api_a.url();
    let mut ours = spawn_ours(&a.node, &["--master", &url, "--proxy-mode", "ipvs"], &a.dir);
    let t_ours = first_sync(&a.node, ours.id(), "ours");
    eprintln!("ipvs side by side: ours: {t_ours:?}");
    let mut proxies = vec![("ours", &a.node)];
    if t_up.is_some() {
        proxies.push(("upstream ipvs", &b.node));
    }
    let lat = change_latencies(&proxies, changes, |c| {
        let sl = bench_slice(100 + c, EPS, true);
        api_a.apply(sl.clone());
        api_b.apply(sl);
    });
    let lats = vec![lat[0], lat.get(1).copied().flatten()];
    side_by_side_push(
        table,
        &format!(
            "IPVS mode in the VM, fake API server, {}k services × {EPS}",
            n / 1000
        ),
        t_ours,
        &[("ipvs", t_up)],
        &lats,
        changes,
    );
    stop(&mut ours, "our daemon");
    drop(up);
}
