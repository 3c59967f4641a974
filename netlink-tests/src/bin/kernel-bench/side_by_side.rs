//! Ours beside upstream kube-proxy itself, each on its own node namespace, against one real
//! kube-apiserver: start to first sync, the first sync as each reports it, CPU and memory
//! to it, and the change latency; then ours alone, its RSS and the churn row (I/O: runs the
//! control plane, upstream's binaries and ours).

use std::net::Ipv4Addr;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Node, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::{Api, PostParams};
use netlink_tests::baseline::endpoint_ip;
use netlink_tests::cluster::{proxy_bin, Cluster};
use netlink_tests::controlplane::ControlPlane;
use netlink_tests::differential::{twin_link_n, Upstream};
use netlink_tests::ns::NetNs;

use crate::args::{Shape, Workload, EPS};
use crate::churn::api_churn_row;
use crate::harness::stop;
use crate::procfs::{mib, process_cpu_precise, usage, Usage};
use crate::table::{
    render_ratio, render_time, render_time_ratio, spread, Goal, Row, Table, Target, Unit,
};

/// The goals of ours' RSS from the API source at 10k × 10: after the first sync, and its
/// peak over that.
const API_RSS_MIB: f64 = 64.0;
const API_PEAK_TIMES: f64 = 1.5;

/// How long a proxy may take to its first sync in the side-by-side rows: upstream's
/// iptables mode over iptables-nft needs minutes at 10k services (#126013 reports ~9 min).
pub const FIRST_SYNC_LIMIT: Duration = Duration::from_secs(600);

/// A proxy's first sync as seen from outside.
#[derive(Clone, Copy, Debug)]
pub struct FirstSync {
    /// From its start to both families synced.
    wall: Duration,
    /// Its own IPv4 sync duration (`kubeproxy_sync_proxy_rules_duration_seconds`), seconds.
    reported: f64,
    /// CPU seconds to then, its reaped children's (upstream's `nft`/`iptables-restore`)
    /// included.
    cpu: f64,
    /// RSS then, and its peak to then (`VmHWM`), MiB; the proxy process only.
    rss: f64,
    peak_rss: f64,
}

/// [`FirstSync`] of the proxy `pid` in `ns` (both families: two sync-duration samples);
/// None past [`FIRST_SYNC_LIMIT`].
pub fn first_sync(ns: &NetNs, pid: u32, what: &str) -> Option<FirstSync> {
    use netlink_tests::differential::{metrics, sample};
    let t0 = Instant::now();
    loop {
        let m = metrics(ns, "127.0.0.1:10249");
        if sample(&m, "kubeproxy_sync_proxy_rules_duration_seconds_count") >= 2.0 {
            let reported = sample(
                &m,
                "kubeproxy_sync_proxy_rules_duration_seconds_sum{ip_family=\"IPv4\"}",
            );
            let now = usage(pid);
            // A diagnostic: where the resident memory is (heap, arenas, stacks, text).
            if let Some(dir) = std::env::var_os("KBENCH_SMAPS_DIR") {
                let to =
                    std::path::Path::new(&dir).join(format!("{}.smaps", what.replace(' ', "_")));
                let _ = std::fs::copy(format!("/proc/{pid}/smaps"), to);
            }
            return Some(FirstSync {
                wall: t0.elapsed(),
                reported,
                cpu: now.cpu_with_children,
                rss: mib(now.rss_kb),
                peak_rss: mib(now.peak_kb),
            });
        }
        if t0.elapsed() > FIRST_SYNC_LIMIT {
            let now = usage(pid);
            eprintln!(
                "side by side: {what} did not finish its first sync in {FIRST_SYNC_LIMIT:?} \
                 ({:.0} CPU s, peak RSS {} MiB)",
                now.cpu_with_children,
                now.peak_kb / 1024
            );
            return None;
        }
        // 50 ms: the start-to-first-sync goal at 10k is 0.5 s.
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// `changes` one-endpoint changes (`apply(c)` makes change `c`), each after every proxy
/// has been idle for longer than its minimum sync period (1 s for all), so that none is
/// caught waiting out the previous change's period. Returns per proxy the median of the
/// network programming latency it reports (`kubeproxy_network_programming_duration_seconds`,
/// from the slice's `endpoints.kubernetes.io/last-change-trigger-time`).
pub fn change_latencies(
    proxies: &[(&str, &NetNs)],
    changes: usize,
    apply: impl FnMut(usize),
) -> Vec<Option<f64>> {
    let (samples, _) = change_samples(proxies, changes, None, apply);
    samples.into_iter().map(|v| quantile(&v, 0.5)).collect()
}

/// The `q` quantile of `v` (nearest rank; `None` when empty).
pub fn quantile(v: &[f64], q: f64) -> Option<f64> {
    let mut v = v.to_vec();
    v.sort_by(f64::total_cmp);
    (!v.is_empty()).then(|| v[((q * v.len() as f64).ceil() as usize).clamp(1, v.len()) - 1])
}

/// [`change_latencies`]' changes: per proxy each latency it reported (seconds, one per
/// change), and, with `cpu_of`, the CPU time that process spent from each change's write
/// until the first proxy reported it, summed over the changes (its scheduler run time; the
/// bench's metric polls, every 20 ms meanwhile, are in it).
pub fn change_samples(
    proxies: &[(&str, &NetNs)],
    changes: usize,
    cpu_of: Option<u32>,
    mut apply: impl FnMut(usize),
) -> (Vec<Vec<f64>>, Duration) {
    use netlink_tests::differential::{metrics, sample};
    let npl = |ns: &NetNs| {
        let m = metrics(ns, "127.0.0.1:10249");
        (
            sample(&m, "kubeproxy_network_programming_duration_seconds_sum"),
            sample(&m, "kubeproxy_network_programming_duration_seconds_count"),
        )
    };
    let cpu = || cpu_of.map_or(Duration::ZERO, process_cpu_precise);
    let mut reported: Vec<Vec<f64>> = vec![Vec::new(); proxies.len()];
    let mut cpu_total = Duration::ZERO;
    for c in 0..changes {
        std::thread::sleep(Duration::from_millis(1500));
        let before: Vec<(f64, f64)> = proxies.iter().map(|(_, ns)| npl(ns)).collect();
        let cpu0 = cpu();
        apply(c);
        let t0 = Instant::now();
        for (k, (what, ns)) in proxies.iter().enumerate() {
            loop {
                let (sum, count) = npl(ns);
                if count > before[k].1 {
                    reported[k].push((sum - before[k].0) / (count - before[k].1));
                    if k == 0 {
                        cpu_total += cpu() - cpu0;
                    }
                    break;
                }
                if t0.elapsed() > Duration::from_secs(300) {
                    eprintln!("side by side: {what} never reported change {c}");
                    break;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        }
    }
    (reported, cpu_total)
}

/// The rows of one side-by-side run, ours against each upstream mode: start to first
/// sync, the first sync as each reports it, CPU seconds and peak RSS to the first sync,
/// RSS after it, and the change latency.
pub fn side_by_side_push(
    table: &mut Table,
    setting: &str,
    ours: Option<FirstSync>,
    theirs: &[(&str, Option<FirstSync>)],
    latencies: &[Option<f64>],
    changes: usize,
) {
    let none = || "did not finish".to_string();
    // (what, value of one first sync, how it is shown).
    type Measure = (&'static str, fn(&FirstSync) -> f64, fn(f64) -> String);
    let measures: [Measure; 4] = [
        (
            "first full sync as each reports it (`kubeproxy_sync_proxy_rules_duration_seconds`, IPv4)",
            |t| t.reported,
            |v| format!("{v:.2} s"),
        ),
        (
            "CPU seconds to the first sync (with reaped children: upstream's `nft`/`iptables-restore`)",
            |t| t.cpu,
            |v| format!("{v:.1} s"),
        ),
        (
            "peak RSS to the first sync (the proxy process)",
            |t| t.peak_rss,
            |v| format!("{v:.0} MiB"),
        ),
        (
            "RSS after the first sync",
            |t| t.rss,
            |v| format!("{v:.0} MiB"),
        ),
    ];
    let comparison = |what: String, ours: String, theirs: String, ratio: String| {
        Row::new(what, ours)
            .baseline(theirs)
            .ratio(ratio)
            .target(Target::Note("(comparison)"))
    };
    for (k, (mode, t)) in theirs.iter().enumerate() {
        let (o, u) = (ours, *t);
        table.push(comparison(
            format!("side by side, {setting}: start to first sync, vs upstream {mode} mode"),
            o.map_or_else(none, |o| render_time(o.wall)),
            u.map_or_else(
                || format!("> {}", render_time(FIRST_SYNC_LIMIT)),
                |u| render_time(u.wall),
            ),
            match (o, u) {
                (Some(o), Some(u)) => render_time_ratio(u.wall, o.wall, 1),
                (Some(o), None) => format!("> {}", render_time_ratio(FIRST_SYNC_LIMIT, o.wall, 0)),
                _ => String::new(),
            },
        ));
        for (what, value, show) in &measures {
            table.push(comparison(
                format!("side by side, {setting}: {what}, vs upstream {mode} mode"),
                o.map_or_else(none, |o| show(value(&o))),
                u.map_or_else(none, |u| show(value(&u))),
                match (o, u) {
                    (Some(o), Some(u)) => render_ratio(value(&u), value(&o), 1),
                    _ => String::new(),
                },
            ));
        }
        let ms = |v: Option<f64>| {
            v.map_or_else(|| "n/a".to_string(), |v| format!("{:.0} ms", v * 1000.0))
        };
        let theirs = latencies.get(k + 1).copied().flatten();
        table.push(comparison(
            format!("side by side, {setting}: one-endpoint change, network programming latency as each reports it (median of {changes}), vs upstream {mode} mode"),
            ms(latencies[0]),
            ms(theirs),
            match (latencies[0], theirs) {
                (Some(o), Some(u)) => render_ratio(u, o, 1),
                _ => String::new(),
            },
        ));
    }
}

/// An EndpointSlice of service `i` of the side-by-side clusters (`eps` ready endpoints;
/// with `bump` the first one moved), stamped with the trigger time now.
pub fn bench_slice(i: usize, eps: usize, bump: bool) -> serde_json::Value {
    let endpoints: Vec<serde_json::Value> = (0..eps)
        .map(|j| {
            let ip = endpoint_ip(i, j, eps);
            let ip = if bump && j == 0 {
                Ipv4Addr::from(u32::from(ip) ^ 0x0001_0000)
            } else {
                ip
            };
            serde_json::json!({"addresses": [ip.to_string()], "conditions": {"ready": true, "serving": true, "terminating": false}})
        })
        .collect();
    serde_json::json!({
        "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
        "metadata": {"name": format!("svc-{i}-a"), "namespace": "default",
            "labels": {"kubernetes.io/service-name": format!("svc-{i}")},
            "annotations": {"endpoints.kubernetes.io/last-change-trigger-time": jiff::Timestamp::now().to_string()}},
        "addressType": "IPv4", "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}],
        "endpoints": endpoints,
    })
}

/// Starts ours in `ns` with `args` (its log in `dir`).
pub fn spawn_ours(ns: &NetNs, args: &[&str], dir: &std::path::Path) -> std::process::Child {
    // Each sync's network programming latencies (one line per sync): the churn row.
    let filter = "info,network_programming=debug";
    spawn_ours_logging(ns, args, dir, filter)
}

/// [`spawn_ours`] with `filter` as its `RUST_LOG` unless `KBENCH_OURS_LOG` says otherwise.
pub fn spawn_ours_logging(
    ns: &NetNs,
    args: &[&str],
    dir: &std::path::Path,
    filter: &str,
) -> std::process::Child {
    let mut cmd = Command::new("ip");
    cmd.args(["netns", "exec", &ns.name]);
    // A diagnostic: KBENCH_OURS_WRAP="heaptrack -o /tmp/ours" runs ours under a profiler
    // (its rows then measure the profiler too). The wrapper gets the SIGTERM: kill ours
    // by hand afterwards, since a leftover subscribed to nf_tables notifications makes the
    // kernel build one for every element anyone commits, in every namespace (the
    // listener bitmap is per protocol, not per namespace): a 100k × 10 full sync then
    // took 35 s instead of ~8.
    if let Ok(wrap) = std::env::var("KBENCH_OURS_WRAP") {
        cmd.args(wrap.split_whitespace());
    }
    cmd.arg(proxy_bin())
        .args(["--hostname-override", "node1"])
        .args(args)
        // KBENCH_OURS_LOG=kube_nlproxy=debug says where a change's time goes.
        .env(
            "RUST_LOG",
            std::env::var("KBENCH_OURS_LOG").unwrap_or_else(|_| filter.into()),
        )
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(dir.join("ours.log")).unwrap())
        .spawn()
        .unwrap()
}

/// Creates `shape`'s Services and EndpointSlices through the API (32 at a time, 1000 per
/// admin session), then the Node.
pub fn create_workload(cp: &ControlPlane, node: &NetNs, shape: Shape) {
    let Shape {
        services: n,
        endpoints: eps,
    } = shape;
    let t_create = Instant::now();
    // Each admin session's calls are bounded to 300 s: 1000 creates took ~31 s here, and
    // once over 60 s (the soak's bring-up, its API server freshly started).
    let per_session = 1000;
    for chunk in (0..n).collect::<Vec<_>>().chunks(per_session) {
        let (chunk, per) = (chunk.to_vec(), eps);
        cp.with_admin_within(node, Duration::from_secs(300), move |client| {
            Box::pin(async move {
                use futures::StreamExt;
                let svcs = Api::<Service>::namespaced(client.clone(), "default");
                let slices = Api::<EndpointSlice>::namespaced(client, "default");
                let pp = PostParams::default();
                futures::stream::iter(chunk)
                    .for_each_concurrent(32, |i| {
                        let (svcs, slices, pp) = (svcs.clone(), slices.clone(), pp.clone());
                        async move {
                            let svc: Service = serde_json::from_value(serde_json::json!({
                                "apiVersion": "v1", "kind": "Service",
                                "metadata": {"name": format!("svc-{i}"), "namespace": "default"},
                                "spec": {"ports": [{"name": "http", "port": 80, "targetPort": 8080}]},
                            }))
                            .unwrap();
                            svcs.create(&pp, &svc).await.unwrap();
                            let sl: EndpointSlice = serde_json::from_value(bench_slice(i, per, false)).unwrap();
                            slices.create(&pp, &sl).await.unwrap();
                        }
                    })
                    .await;
            })
        });
    }
    eprintln!(
        "side by side: {n} Services and slices created in {:?}",
        t_create.elapsed()
    );
    create_node(cp, node);
}

/// Above this many Services the workload is written to etcd ([`seed_workload`]), not
/// created through the API: 100k creates would take hours here.
const SEED_ABOVE: usize = 20_000;

/// Writes `shape`'s Services (each with its ClusterIP's IPAddress, as the allocator would
/// have made it) and EndpointSlices straight into etcd (`ControlPlane::seed_etcd`), then
/// creates the Node through the API. The ClusterIPs are 10.97.0.0 + i, in
/// [`LARGE_SERVICE_CIDR`](netlink_tests::controlplane::LARGE_SERVICE_CIDR) and clear of
/// the `kubernetes` Service's 10.96.0.1.
fn seed_workload(cp: &ControlPlane, node: &NetNs, shape: Shape) {
    let Shape {
        services: n,
        endpoints: eps,
    } = shape;
    let t0 = Instant::now();
    let created = jiff::Timestamp::now().to_string();
    let objects = (0..n).flat_map(|i| {
        let name = format!("svc-{i}");
        let ip = Ipv4Addr::from(u32::from(Ipv4Addr::new(10, 97, 0, 0)) + i as u32).to_string();
        let meta = |kind: u8, name: &str| {
            serde_json::json!({"name": name, "uid": format!("00000000-0000-4000-800{kind}-{i:012}"),
                "creationTimestamp": created})
        };
        let mut address = serde_json::json!({
            "apiVersion": "networking.k8s.io/v1", "kind": "IPAddress",
            "metadata": meta(0, &ip),
            "spec": {"parentRef": {"group": "", "resource": "services", "namespace": "default", "name": name}},
        });
        address["metadata"]["labels"] = serde_json::json!({
            "ipaddress.kubernetes.io/ip-family": "IPv4",
            "ipaddress.kubernetes.io/managed-by": "ipallocator.k8s.io",
        });
        let mut service = serde_json::json!({
            "apiVersion": "v1", "kind": "Service",
            "metadata": meta(1, &name),
            "spec": {
                "ports": [{"name": "http", "protocol": "TCP", "port": 80, "targetPort": 8080}],
                "clusterIP": ip, "clusterIPs": [ip], "type": "ClusterIP",
                "sessionAffinity": "None", "ipFamilies": ["IPv4"],
                "ipFamilyPolicy": "SingleStack", "internalTrafficPolicy": "Cluster",
            },
            "status": {"loadBalancer": {}},
        });
        service["metadata"]["namespace"] = "default".into();
        let mut slice = bench_slice(i, eps, false);
        let slice_name = format!("{name}-a");
        for (k, v) in meta(2, &slice_name).as_object().unwrap() {
            slice["metadata"][k] = v.clone();
        }
        [
            (format!("/registry/ipaddresses/{ip}"), address),
            (format!("/registry/services/specs/default/{name}"), service),
            (format!("/registry/endpointslices/default/{slice_name}"), slice),
        ]
    });
    let written = cp.seed_etcd(node, objects);
    // What the API server serves from them once its watch caches have caught up (at most
    // 180 s): every Service and slice, or the run stops here.
    let count = || {
        cp.with_admin(node, |client| {
            Box::pin(async move {
                let lp = kube::api::ListParams::default();
                let svcs = Api::<Service>::namespaced(client.clone(), "default");
                let slices = Api::<EndpointSlice>::namespaced(client, "default");
                (
                    svcs.list_metadata(&lp).await.unwrap().items.len(),
                    slices.list_metadata(&lp).await.unwrap().items.len(),
                )
            })
        })
    };
    let mut counts = count();
    while (counts.0 <= n || counts.1 < n) && t0.elapsed() < Duration::from_secs(180) {
        std::thread::sleep(Duration::from_secs(2));
        counts = count();
    }
    assert!(
        counts.0 > n && counts.1 >= n,
        "the API server serves {} Services and {} slices of the {n} written to etcd",
        counts.0,
        counts.1
    );
    eprintln!(
        "side by side: {n} Services, their IPAddresses and slices written to etcd ({written} keys) and served in {:?}",
        t0.elapsed()
    );
    create_node(cp, node);
}

/// The Node `node1`, with the node's InternalIP.
fn create_node(cp: &ControlPlane, node: &NetNs) {
    cp.with_admin(node, |client| {
        Box::pin(async move {
            let node: Node = serde_json::from_value(serde_json::json!({
                "apiVersion": "v1", "kind": "Node", "metadata": {"name": "node1"},
                "status": {"addresses": [{"type": "InternalIP", "address": netlink_tests::cluster::NODE_IP}]},
            }))
            .unwrap();
            Api::<Node>::all(client).create(&PostParams::default(), &node).await.unwrap();
        })
    });
}

/// Upstream in `mode` on a node namespace of its own (the `k`th twin of `a`), alone until
/// its first sync: the first sync, and the running proxy when it finished.
pub fn start_upstream(
    a: &Cluster,
    cp: &ControlPlane,
    k: u8,
    mode: &'static str,
    shape: Shape,
) -> (Option<FirstSync>, Option<(Cluster, Upstream)>) {
    let Shape {
        services: n,
        endpoints: eps,
    } = shape;
    let b = Cluster::new();
    let via = twin_link_n(a, &b, k);
    let kc = cp.admin_kubeconfig_via(&format!("https://{via}:6443"));
    let kc_k = cp.dir.join(format!("admin-via-{k}.kubeconfig"));
    std::fs::rename(&kc, &kc_k).unwrap();
    let arg = format!("--kubeconfig={}", kc_k.display());
    let up = Upstream::start(&b.node, mode, &[&arg], &cp.dir);
    let t = first_sync(&b.node, up.child.id(), mode);
    eprintln!("side by side: upstream {mode}: {t:?}");
    if mode == "nftables" && t.is_some() {
        // What it programmed: 1.37 DNATs through an anonymous numgen map in each
        // service chain (no per-endpoint chains without affinity).
        let out = b
            .node
            .sh("nft list table ip kube-proxy > /tmp/kbench-upstream.nft; \
             grep -c 'chain service-' /tmp/kbench-upstream.nft || true; \
             grep -o ' [.] 8080' /tmp/kbench-upstream.nft | wc -l; rm -f /tmp/kbench-upstream.nft");
        let mut it = out.split_whitespace();
        eprintln!(
            "side by side: upstream nftables holds {} service chains, {} endpoints in their maps (want {n}, {})",
            it.next().unwrap_or("?"),
            it.next().unwrap_or("?"),
            n * eps
        );
    }
    if t.is_some() {
        (t, Some((b, up)))
    } else {
        // Stopped: it would keep a core busy in `iptables-restore` for the rest.
        drop(up);
        (t, None)
    }
}

/// Ours beside upstream kube-proxy in each of `modes`, each on its own node namespace, all
/// against one real kube-apiserver holding `shape`'s Services and endpoints; then, with
/// ours alone, its RSS row and (`churn_secs` > 0) the churn row. Returns the modes whose
/// first sync finished within [`FIRST_SYNC_LIMIT`], and ours' CPU per change through the
/// API (none when ours did not sync).
pub fn side_by_side_rows(
    table: &mut Table,
    shape: Shape,
    modes: &[&'static str],
    changes: usize,
    churn_secs: u64,
) -> (Vec<&'static str>, Option<Duration>) {
    let eps = shape.endpoints;
    let a = Cluster::new();
    // 100k Services need more ClusterIPs than the usual /16 holds; written to etcd.
    let cp = if shape.services > SEED_ABOVE {
        let cp = ControlPlane::start_with_service_cidr(
            &a.node,
            netlink_tests::controlplane::LARGE_SERVICE_CIDR,
        );
        seed_workload(&cp, &a.node, shape);
        cp
    } else {
        let cp = ControlPlane::start(&a.node);
        create_workload(&cp, &a.node, shape);
        cp
    };
    // Each proxy alone until its first sync.
    let mut upstreams = Vec::new();
    let mut cold = Vec::new();
    for (k, &mode) in (1u8..).zip(modes) {
        let (t, running) = start_upstream(&a, &cp, k, mode, shape);
        cold.push((mode, t));
        if let Some((b, up)) = running {
            upstreams.push((mode, b, up));
        }
    }
    // The floor of ours' start: the API server's own list of what ours lists.
    let listed = list_time(&cp, &a.node);
    let admin = cp.admin_kubeconfig();
    let spawned = std::time::SystemTime::now();
    let mut ours = spawn_ours(&a.node, &["--kubeconfig", admin.to_str().unwrap()], &cp.dir);
    let t_ours = first_sync(&a.node, ours.id(), "ours");
    let start = start_steps(&cp.dir.join("ours.log"), spawned);
    eprintln!("side by side: ours: {t_ours:?} (the API server lists in {listed:?})");
    let proxies: Vec<(&str, &NetNs)> = std::iter::once(("ours", &a.node))
        .chain(upstreams.iter().map(|(m, b, _)| (*m, &b.node)))
        .collect();
    let (samples, cpu) = change_samples(&proxies, changes, Some(ours.id()), |c| {
        let i = 100 + c;
        cp.with_admin(&a.node, move |client| {
            Box::pin(async move {
                let api = Api::<EndpointSlice>::namespaced(client, "default");
                let mut cur = api.get(&format!("svc-{i}-a")).await.unwrap();
                // Stamped now, just before the write, as the EndpointSlice controller
                // stamps the change it writes: the latency is the API server's write, the
                // watch and the proxy, not this client's connection.
                let sl: EndpointSlice = serde_json::from_value(bench_slice(i, eps, true)).unwrap();
                cur.endpoints = sl.endpoints;
                cur.metadata.annotations = sl.metadata.annotations;
                api.replace(&format!("svc-{i}-a"), &PostParams::default(), &cur)
                    .await
                    .unwrap();
            })
        });
    });
    let lat: Vec<Option<f64>> = samples.iter().map(|v| quantile(v, 0.5)).collect();
    let per_change = (!samples[0].is_empty()).then(|| cpu / samples[0].len() as u32);
    eprintln!(
        "side by side: ours: one-endpoint change, p50 of {changes}: {:?} s, CPU per change {per_change:?}",
        lat[0]
    );
    // Latencies of the upstreams that synced, in `cold`'s order (n/a for one that did not).
    let mut it = lat[1..].iter();
    let mut lats = vec![lat[0]];
    for (_, t) in &cold {
        lats.push(if t.is_some() {
            it.next().copied().flatten()
        } else {
            None
        });
    }
    let setting = format!("real apiserver, {}", shape.label());
    side_by_side_push(table, &setting, t_ours, &cold, &lats, changes);
    if let Some(t) = t_ours {
        ours_api_rows(table, shape, t, (listed, start), &samples[0], per_change);
        api_rss_row(table, shape, t, usage(ours.id()), changes);
    }
    // Churn with ours alone: the upstreams would share the two cores.
    drop(upstreams);
    if churn_secs > 0 && t_ours.is_some() {
        let log = cp.dir.join("ours.log");
        api_churn_row(table, &cp, &a.node, (ours.id(), &log), shape, churn_secs);
    }
    stop(&mut ours, "our daemon");
    if std::env::var_os("KBENCH_OURS_LOG").is_some() {
        let _ = std::fs::copy(cp.dir.join("ours.log"), "/tmp/kbench-ours.log");
    }
    eprintln!("side by side: done");
    let finished = cold
        .iter()
        .filter(|(_, t)| t.is_some())
        .map(|(m, _)| *m)
        .collect();
    (finished, per_change.filter(|_| t_ours.is_some()))
}

/// The goals of issue #36 for ours through the API at 10k × 10 and 100k × 10: a
/// one-endpoint change's network programming latency at p50 and p99, and start to first
/// sync.
const LATENCY_P50: f64 = 0.010;
const LATENCY_P99: f64 = 0.025;
fn start_goal(shape: Shape) -> Option<Duration> {
    match (shape.services, shape.endpoints) {
        (10_000, EPS) => Some(Duration::from_millis(500)),
        (100_000, EPS) => Some(Duration::from_secs(5)),
        _ => None,
    }
}

/// Ours' own rows through the API (issue #36): start to first sync beside the API server's
/// list of the same objects and ours' first sync as it reports it; the one-endpoint
/// change's latency at p50 and p99 (`latencies`, seconds); and its CPU per change.
fn ours_api_rows(
    table: &mut Table,
    shape: Shape,
    first: FirstSync,
    (listed, steps): (Duration, Option<(Duration, Duration)>),
    latencies: &[f64],
    per_change: Option<Duration>,
) {
    let goal = start_goal(shape);
    let steps = steps.map_or_else(
        || "n/a".to_string(),
        |(list, sync)| format!("{} / {}", render_time(list), render_time(sync)),
    );
    table.push(
        Row::new(
            format!(
                "ours, real apiserver, {}: start to first sync (both families); where it goes, from ours' log: start to its lists complete / lists complete to its first sync done (IPv4 and IPv6), and ours' IPv4 sync as it reports it; the API server's own list of the same objects (the floor, read by a client beside it)",
                shape.label()
            ),
            format!(
                "{}; {steps}, {}; {}",
                render_time(first.wall),
                render_time(Duration::from_secs_f64(first.reported)),
                render_time(listed),
            ),
        )
        .target(goal.map_or(Target::Note(""), |g| {
            Target::goal(Goal::time_at_most(first.wall, g))
        })),
    );
    let (p50, p99) = (quantile(latencies, 0.5), quantile(latencies, 0.99));
    let ms = |v: Option<f64>| v.map_or_else(|| "n/a".into(), |v| format!("{:.1} ms", v * 1000.0));
    table.push(
        Row::new(
            format!(
                "ours, real apiserver, {}: one-endpoint change, network programming latency p50 / p99 (of {}; each after 1.5 s idle)",
                shape.label(),
                latencies.len()
            ),
            format!("{} / {}", ms(p50), ms(p99)),
        )
        .target(if goal.is_some() {
            Target::Goals(vec![
                Goal::at_most(p50.unwrap_or(f64::INFINITY), LATENCY_P50, Unit::Seconds)
                    .named("p50"),
                Goal::at_most(p99.unwrap_or(f64::INFINITY), LATENCY_P99, Unit::Seconds)
                    .named("p99"),
            ])
        } else {
            Target::Note("")
        }),
    );
    if let Some(cpu) = per_change {
        table.push(
            Row::new(
                format!(
                    "ours, real apiserver, {}: CPU per one-endpoint change (all its threads, from the write until it reported the change; the bench's metric polls included)",
                    shape.label()
                ),
                render_time(cpu),
            )
            .target(Target::Note("")),
        );
    }
}

/// From ours' `log`: the time from `spawned` to its "initial list complete" line, and from
/// there to its "initial sync done" line (klog's UTC `mmdd hh:mm:ss.uuuuuu`).
fn start_steps(
    log: &std::path::Path,
    spawned: std::time::SystemTime,
) -> Option<(Duration, Duration)> {
    let text = std::fs::read_to_string(log).ok()?;
    // Seconds into the UTC day of a klog line.
    let at = |needle: &str| -> Option<f64> {
        let line = text.lines().find(|l| l.contains(needle))?;
        let clock = line.split_whitespace().nth(1)?;
        let mut it = clock.split(':');
        let (h, m, s) = (it.next()?, it.next()?, it.next()?);
        Some(
            h.parse::<f64>().ok()? * 3600.0
                + m.parse::<f64>().ok()? * 60.0
                + s.parse::<f64>().ok()?,
        )
    };
    let day = spawned
        .duration_since(std::time::UNIX_EPOCH)
        .ok()?
        .as_secs_f64()
        % 86_400.0;
    let (listed, synced) = (at("initial list complete")?, at("initial sync done")?);
    let secs = |a: f64, b: f64| Duration::from_secs_f64((b - a).rem_euclid(86_400.0));
    Some((secs(day, listed), secs(listed, synced)))
}

/// How long the API server takes to list what ours lists at start (Services and
/// EndpointSlices with upstream's selector), read whole but not decoded: the floor under
/// ours' start to first sync.
fn list_time(cp: &ControlPlane, ns: &NetNs) -> Duration {
    cp.with_admin(ns, |client| {
        Box::pin(async move {
            let selector = kube_nlproxy::source::convert::ServiceSelection::default()
                .service_label_selector()
                .replace(',', "%2C");
            let t0 = Instant::now();
            for path in [
                format!("/api/v1/services?labelSelector={selector}"),
                format!("/apis/discovery.k8s.io/v1/endpointslices?labelSelector={selector}"),
            ] {
                let req = http::Request::get(path).body(Vec::new()).unwrap();
                let text = client.request_text(req).await.unwrap();
                assert!(text.contains("\"items\""), "a list");
            }
            t0.elapsed()
        })
    })
}

/// Ours alone, by source (issue #18): RSS after the first sync (`first`) and after the
/// changes (`now`), held at 10k × 10 to [`API_RSS_MIB`] and a peak within
/// [`API_PEAK_TIMES`] the steady RSS.
fn api_rss_row(table: &mut Table, shape: Shape, first: FirstSync, now: Usage, changes: usize) {
    let (rss_now, peak) = (mib(now.rss_kb), mib(now.peak_kb));
    let held = shape
        == (Shape {
            services: 10_000,
            endpoints: EPS,
        });
    table.push(
        Row::new(
            format!(
                "daemon RSS, API source (real apiserver), {}: after the first sync / after {changes} changes (peak)",
                shape.label()
            ),
            format!("{:.0} / {rss_now:.0} MiB (peak {peak:.0})", first.rss),
        )
        .ratio(format!("peak {} steady", render_ratio(peak, first.rss, 1)))
        .target(if held {
            Target::Goals(vec![
                Goal::at_most(first.rss, API_RSS_MIB, Unit::MiB),
                Goal::at_most(peak / first.rss, API_PEAK_TIMES, Unit::Times).named("peak"),
            ])
        } else {
            Target::Note("")
        }),
    );
}

/// One-endpoint changes per side-by-side workload: the p99 of issue #36 is the slowest of
/// them.
pub const CHANGES: usize = 30;
/// How far apart ours' CPU per change through the API may be across the sizes.
const CPU_SPREAD: f64 = 2.0;

/// The side-by-side workloads of issue #17 in order, against upstream's nftables and
/// iptables modes (a workload without upstream: ours alone). A mode that did not finish a
/// workload's first sync within [`FIRST_SYNC_LIMIT`] is not run at a later one with at
/// least as many iptables chains (a row says so): it would only use up the limit again.
/// Then ours' CPU per change through the API across the sizes of [`EPS`] endpoints.
pub fn side_by_side_all(table: &mut Table, workloads: &[Workload]) {
    const BOTH: &[&str] = &["nftables", "iptables"];
    // The modes given up on, and the workload each did not finish; upstream's iptables
    // mode did not finish 10k × 10 within the limit in the runs of 2026-12-03 and
    // 2026-12-04 (110k chains over iptables-nft), so it is not run there again.
    let mut gave_up: Vec<(&str, Shape)> = vec![(
        "iptables",
        Shape {
            services: 10_000,
            endpoints: EPS,
        },
    )];
    let mut cpu_per_change: Vec<(Shape, Duration)> = Vec::new();
    for &Workload {
        shape,
        churn_secs,
        with_upstream,
    } in workloads
    {
        let skipped: Vec<(&str, Shape)> = gave_up
            .iter()
            .copied()
            .filter(|&(_, at)| iptables_chains(shape) >= iptables_chains(at))
            .collect();
        let modes: Vec<&'static str> = BOTH
            .iter()
            .copied()
            .filter(|m| with_upstream && !skipped.iter().any(|(s, _)| s == m))
            .collect();
        // A workload of ours alone (100k × 10: 300k objects written to etcd) is
        // the last and longest: its failure is a row, not the loss of every row before.
        let run = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            let mut rows = Table::default();
            let out = side_by_side_rows(&mut rows, shape, &modes, CHANGES, churn_secs);
            (rows, out)
        }));
        let (finished, cpu) = match run {
            Ok((rows, out)) => {
                table.extend(rows);
                out
            }
            Err(e) => {
                let why = e
                    .downcast_ref::<String>()
                    .cloned()
                    .or_else(|| e.downcast_ref::<&str>().map(|s| s.to_string()))
                    .unwrap_or_default();
                table.push(
                    Row::new(
                        format!("real apiserver, {}: ours", shape.label()),
                        format!("did not finish: {why}"),
                    )
                    .target(Target::Note("")),
                );
                (Vec::new(), None)
            }
        };
        if let Some(cpu) = cpu {
            cpu_per_change.push((shape, cpu));
        }
        if !with_upstream {
            continue;
        }
        for mode in modes.iter().filter(|m| !finished.contains(m)) {
            gave_up.push((mode, shape));
        }
        for (mode, at) in skipped {
            table.push(
                Row::new(
                    format!(
                        "side by side, real apiserver, {}: vs upstream {mode} mode",
                        shape.label()
                    ),
                    "not run",
                )
                .baseline(format!(
                    "not run: it did not finish {} ({}k chains) within {} (in this run or, \
                     at 10k × 10, in the runs of 2026-12-03 and 2026-12-04), \
                     and {} has {} the chains",
                    short_label(at),
                    iptables_chains(at) / 1000,
                    render_time(FIRST_SYNC_LIMIT),
                    short_label(shape),
                    render_ratio(iptables_chains(shape) as f64, iptables_chains(at) as f64, 1),
                ))
                .target(Target::Note("(comparison)")),
            );
        }
    }
    let same: Vec<(Shape, Duration)> = cpu_per_change
        .into_iter()
        .filter(|(s, _)| s.endpoints == EPS)
        .collect();
    if same.len() > 1 {
        let secs: Vec<f64> = same.iter().map(|(_, c)| c.as_secs_f64()).collect();
        let spread = spread(&secs);
        table.push(
            Row::new(
                format!(
                    "ours, real apiserver: CPU per one-endpoint change at {} (rows above)",
                    same.iter()
                        .map(|(s, _)| short_label(*s))
                        .collect::<Vec<_>>()
                        .join(" / ")
                ),
                same.iter()
                    .map(|(_, c)| render_time(*c))
                    .collect::<Vec<_>>()
                    .join(" / "),
            )
            .ratio(format!("{spread:.2}× largest / smallest"))
            .target(Target::goal(
                Goal::at_most(spread, CPU_SPREAD, Unit::Times).named("spread"),
            )),
        );
    }
}

/// The chains of upstream's iptables layout for `shape`: one per service and per endpoint.
fn iptables_chains(shape: Shape) -> usize {
    shape.services * (shape.endpoints + 1)
}

/// "10k × 10".
fn short_label(shape: Shape) -> String {
    format!("{}k × {}", shape.services / 1000, shape.endpoints)
}
