//! The daemon itself from manifests: cold start to the first sync, RSS after it and under
//! churn, for the synthetic manifests and for realistic ones as `kubectl` shows real
//! objects (I/O: runs our binary in a namespace, reads `/proc`).

use std::fmt::Write as _;
use std::net::Ipv4Addr;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use netlink_tests::baseline::{cluster_ip, endpoint_ip};
use netlink_tests::cluster::proxy_bin;
use netlink_tests::ns::NetNs;

use crate::args::EPS;
use crate::harness::stop;
use crate::procfs::{mib, settled, usage, Usage};
use crate::table::{render_time, Goal, Row, Table, Target, Unit};

/// The manifest daemon's goals at one size.
#[derive(Clone, Copy, Debug)]
struct Goals {
    cold_start: Duration,
    rss_mib: f64,
}

/// The goals by size: 10k and 100k services are held to them, other sizes reported.
fn goals_at(services: usize) -> Option<Goals> {
    match services {
        10_000 => Some(Goals {
            cold_start: Duration::from_secs(2),
            rss_mib: 64.0,
        }),
        100_000 => Some(Goals {
            cold_start: Duration::from_secs(15),
            rss_mib: 384.0,
        }),
        _ => None,
    }
}

/// The cold start goal from realistic manifests (10k × 10).
const REALISTIC_COLD_START: Duration = Duration::from_secs(2);

/// `n` Services × [`EPS`] endpoints as flow-style YAML documents; the first endpoint of the
/// first `bump` slices moved.
fn manifests(n: usize, bump: usize) -> String {
    manifests_of(n, EPS, bump)
}

/// `n` Services × `eps` endpoints, as [`manifests`].
fn manifests_of(n: usize, eps_per: usize, bump: usize) -> String {
    let mut s = String::with_capacity(n * (100 + 30 * eps_per));
    for i in 0..n {
        let cip = cluster_ip(i);
        writeln!(s, "---\napiVersion: v1\nkind: Service\nmetadata: {{name: svc-{i}, namespace: ns}}\nspec: {{clusterIP: {cip}, ports: [{{name: http, port: 80}}]}}").unwrap();
        let eps: Vec<String> = (0..eps_per)
            .map(|j| {
                let ip = if i < bump && j == 0 {
                    Ipv4Addr::from(u32::from(endpoint_ip(i, j, eps_per)) ^ 0x0001_0000)
                } else {
                    endpoint_ip(i, j, eps_per)
                };
                format!("{{addresses: [{ip}]}}")
            })
            .collect();
        writeln!(s, "---\napiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata: {{name: svc-{i}-a, namespace: ns, labels: {{kubernetes.io/service-name: svc-{i}}}}}\naddressType: IPv4\nports: [{{name: http, port: 8080}}]\nendpoints: [{}]", eps.join(", ")).unwrap();
    }
    s
}

/// Starts our daemon in `ns` on the manifest `file` (its log in `dir`) and waits for its
/// first sync (at most 120 s): the child and its start to first sync.
fn manifest_daemon_first_sync(
    ns: &NetNs,
    file: &std::path::Path,
    dir: &std::path::Path,
) -> (std::process::Child, Duration) {
    let log = dir.join("log");
    let t0 = Instant::now();
    let child = Command::new("ip")
        .args(["netns", "exec", &ns.name])
        .arg(proxy_bin())
        .args([
            "--manifests",
            file.to_str().unwrap(),
            "--hostname-override",
            "node1",
        ])
        .args([
            "--healthz-bind-address",
            "127.0.0.1:10256",
            "--min-sync-period",
            "1s",
        ])
        // KBENCH_OURS_LOG adds directives (e.g. `kube_nlproxy::proxy::runner=debug`: the
        // allocator's in-use and free bytes after each sync).
        .env(
            "RUST_LOG",
            match std::env::var("KBENCH_OURS_LOG") {
                Ok(more) => format!("{},{more}", netlink_tests::cluster::DAEMON_LOG),
                Err(_) => netlink_tests::cluster::DAEMON_LOG.to_string(),
            },
        )
        .env("NO_COLOR", "1")
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    let synced = || {
        std::fs::read_to_string(&log)
            .unwrap_or_default()
            .contains("] \"synced\"")
    };
    while !synced() {
        assert!(
            t0.elapsed() < Duration::from_secs(120),
            "daemon never synced"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    (child, t0.elapsed())
}

/// Per size: the daemon's cold start from manifests to its first sync and its RSS after
/// it; at the first size, `churn_secs` of 100 endpoint changes a second (none when zero).
pub fn daemon_rows(table: &mut Table, sizes: &[usize], churn_secs: u64) {
    for &n in sizes {
        let ns = NetNs::new("kd");
        let dir = std::env::temp_dir().join(format!("kbench-{}", ns.name));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("cluster.yaml");
        std::fs::write(&file, manifests(n, 0)).unwrap();
        let (mut child, cold) = manifest_daemon_first_sync(&ns, &file, &dir);
        let Usage { rss_kb, cpu, .. } = settled(child.id());
        if std::env::var_os("KBENCH_OURS_LOG").is_some() {
            let _ = std::fs::copy(dir.join("log"), "/tmp/kbench-daemon.log");
        }
        let goals = goals_at(n);
        table.push(
            Row::new(
                format!(
                    "daemon cold start to first sync, {}k services from manifests",
                    n / 1000
                ),
                render_time(cold),
            )
            .target(goals.map_or(Target::Note(""), |g| {
                Target::goal(Goal::time_at_most(cold, g.cold_start))
            })),
        );
        let rss = mib(rss_kb);
        table.push(
            Row::new(
                format!(
                    "daemon RSS after full sync, {}k services (CPU {cpu:.2} s so far)",
                    n / 1000
                ),
                format!("{rss:.0} MiB"),
            )
            .target(goals.map_or(Target::Note(""), |g| {
                Target::goal(Goal::at_most(rss, g.rss_mib, Unit::MiB))
            })),
        );
        if churn_secs > 0 && n == sizes[0] {
            // 100 endpoint changes per second: ten rewrites a second changing ten slices each.
            let start = Instant::now();
            let cpu0 = usage(child.id()).cpu;
            let mut k = 0;
            while start.elapsed() < Duration::from_secs(churn_secs) {
                k += 1;
                let text = manifests(n, (k % 100) * 10);
                let tmp = dir.join(".tmp");
                std::fs::write(&tmp, text).unwrap();
                std::fs::rename(&tmp, &file).unwrap();
                std::thread::sleep(Duration::from_millis(100));
            }
            let after = usage(child.id());
            table.push(Row::new(
                format!("daemon during {churn_secs} s of 100 endpoint changes/s ({}k services, manifest source)", n / 1000),
                format!("{:.0} MiB RSS, {:.0}% of a core", mib(after.rss_kb), (after.cpu - cpu0) * 100.0 / churn_secs as f64),
            ));
        }
        stop(&mut child, "our daemon");
        let _ = std::fs::remove_dir_all(&dir);
        eprintln!("daemon {n}: done");
    }
}

/// Service `i` and its slice as `kubectl get -o yaml/json` shows real ones: uid,
/// resourceVersion, labels, annotations, owner reference, and conditions and nodeName on
/// every endpoint.
fn realistic_objects(i: usize, eps: usize) -> [serde_json::Value; 2] {
    let ns = format!("team-{}", i % 50);
    let ip = cluster_ip(i).to_string();
    let svc = serde_json::json!({"apiVersion": "v1", "kind": "Service",
        "metadata": {"name": format!("svc-{i}"), "namespace": ns, "uid": format!("8d3c1f2a-{i:04x}-4b5e-9a7d-1c2e3f4a5b6c"),
            "resourceVersion": (100_000 + i).to_string(), "creationTimestamp": "2026-11-01T10:00:00Z",
            "labels": {"app.kubernetes.io/name": format!("svc-{i}"), "app.kubernetes.io/part-of": "shop"},
            "annotations": {"meta.helm.sh/release-name": format!("rel-{i}"), "meta.helm.sh/release-namespace": ns}},
        "spec": {"type": "ClusterIP", "clusterIP": ip, "clusterIPs": [ip], "ipFamilies": ["IPv4"],
            "ipFamilyPolicy": "SingleStack", "internalTrafficPolicy": "Cluster", "sessionAffinity": "None",
            "selector": {"app.kubernetes.io/name": format!("svc-{i}")},
            "ports": [{"name": "http", "port": 80, "protocol": "TCP", "targetPort": 8080}]},
        "status": {"loadBalancer": {}}});
    let endpoints: Vec<serde_json::Value> = (0..eps)
        .map(|j| {
            serde_json::json!({"addresses": [endpoint_ip(i, j, eps).to_string()],
            "conditions": {"ready": true, "serving": true, "terminating": false},
            "nodeName": format!("node-{}", (i * eps + j) % 100)})
        })
        .collect();
    let slice = serde_json::json!({"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
        "metadata": {"name": format!("svc-{i}-abcde"), "namespace": ns, "generateName": format!("svc-{i}-"),
            "uid": format!("5e6f7a8b-{i:04x}-4c5d-8e9f-0a1b2c3d4e5f"), "resourceVersion": (200_000 + i).to_string(),
            "labels": {"endpointslice.kubernetes.io/managed-by": "endpointslice-controller.k8s.io",
                "kubernetes.io/service-name": format!("svc-{i}")},
            "annotations": {"endpoints.kubernetes.io/last-change-trigger-time": "2026-11-01T10:00:05Z"},
            "ownerReferences": [{"apiVersion": "v1", "kind": "Service", "name": format!("svc-{i}"),
                "uid": format!("8d3c1f2a-{i:04x}-4b5e-9a7d-1c2e3f4a5b6c"), "controller": true, "blockOwnerDeletion": true}]},
        "addressType": "IPv4", "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}], "endpoints": endpoints});
    [svc, slice]
}

/// The goal of issue #36's 5k × 50 from manifests: start to first sync.
const SHAPE_5K_50_COLD: Duration = Duration::from_secs(2);

/// The daemon's cold start to its first sync from manifests of 5k Services × 50 endpoints
/// (kubernetes/kubernetes#135639's shape).
pub fn manifest_5k_50_row(table: &mut Table) {
    let ns = NetNs::new("kd");
    let dir = std::env::temp_dir().join(format!("kbench-{}", ns.name));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("cluster.yaml");
    std::fs::write(&file, manifests_of(5000, 50, 0)).unwrap();
    let (mut child, cold) = manifest_daemon_first_sync(&ns, &file, &dir);
    stop(&mut child, "our daemon");
    let _ = std::fs::remove_dir_all(&dir);
    table.push(
        Row::new(
            "daemon cold start to first sync, 5k services × 50 from manifests",
            render_time(cold),
        )
        .target(Target::goal(Goal::time_at_most(cold, SHAPE_5K_50_COLD))),
    );
}

/// Cold start from realistic manifests (issue #18): `n` Services × 10 endpoints as
/// block-style YAML documents and as one JSON `List`; the daemon's start to its first sync.
pub fn realistic_cold_rows(table: &mut Table, n: usize) {
    let objects: Vec<serde_json::Value> = (0..n).flat_map(|i| realistic_objects(i, EPS)).collect();
    let yaml: String = objects
        .iter()
        .map(|o| format!("---\n{}", serde_saphyr::to_string(o).unwrap()))
        .collect();
    let json =
        serde_json::json!({"apiVersion": "v1", "kind": "List", "items": objects}).to_string();
    for (what, name, text) in [
        ("YAML", "cluster.yaml", yaml),
        ("JSON List", "cluster.json", json),
    ] {
        let ns = NetNs::new("kr");
        let dir = std::env::temp_dir().join(format!("kbench-{}", ns.name));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join(name);
        std::fs::write(&file, &text).unwrap();
        let (mut child, cold) = manifest_daemon_first_sync(&ns, &file, &dir);
        let peak = mib(usage(child.id()).peak_kb);
        table.push(
            Row::new(
                format!(
                    "daemon cold start to first sync, {}k services × {EPS} from realistic manifests ({what}, {:.1} MB; peak RSS {peak:.0} MiB)",
                    n / 1000,
                    text.len() as f64 / 1e6,
                ),
                render_time(cold),
            )
            .target(Target::goal(Goal::time_at_most(cold, REALISTIC_COLD_START))),
        );
        stop(&mut child, "our daemon");
        let _ = std::fs::remove_dir_all(&dir);
    }
    eprintln!("realistic cold start {n}: done");
}
