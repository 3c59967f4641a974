//! The kernel benchmark harness (root only, throwaway network namespaces). Measures our
//! netlink syncs against `nft -f` and `iptables-restore` of equivalent rulesets in the same
//! run, the data path's connect latency, and the daemon's memory, CPU and cold start.
//!
//! `cargo run --release -p netlink-tests --bin kernel-bench -- [--quick]`; the IPVS rows
//! need a kernel with IPVS, so they run in the test VM:
//! `netlink-tests/vm/run-in-vm.sh --share $PWD -- ./target/release/kernel-bench --ipvs-only`
//! Prints one Markdown table (BENCHMARKS.md holds the latest).
#![allow(clippy::disallowed_methods)] // the baselines are external tools by design
#![allow(unsafe_code)] // kill(2), setns(2), geteuid(2) and socket calls on test processes

use netlink_tests::bounded::{OutputWithin, TEST_LIMIT};
use std::fmt::Write as _;
use std::io::Write as _;
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use kube_nlproxy::config::DetectLocal;
use kube_nlproxy::kernel::nft::netlink::NetlinkNftables;
use kube_nlproxy::kernel::nft::render;
use kube_nlproxy::model::fixtures::synthetic_state;
use kube_nlproxy::model::{Protocol, ProxyState};
use kube_nlproxy::modes::nftables::build_ruleset;
use kube_nlproxy::modes::nftables::NftablesProxier;
use kube_nlproxy::proxy::{plan_full, LocalDetector, ProxierConfig};
use kube_nlproxy::source::kube::Stores;
use netlink_tests::baseline::{cluster_ip, endpoint_ip, upstream_iptables, upstream_nft};
use netlink_tests::cluster::proxy_bin;
use netlink_tests::ns::{require_root, sh, NetNs};

const EPS: usize = 10;

fn cfg() -> ProxierConfig {
    ProxierConfig {
        local_detector: LocalDetector::Cidrs(vec!["10.244.0.0/16".parse().unwrap()]),
        ..Default::default()
    }
}

fn state(services: usize) -> ProxyState {
    synthetic_state(services, EPS)
}

fn secs(d: Duration) -> String {
    if d < Duration::from_millis(10) {
        format!("{:.2} ms", d.as_secs_f64() * 1e3)
    } else if d < Duration::from_secs(1) {
        format!("{:.0} ms", d.as_secs_f64() * 1e3)
    } else {
        format!("{:.2} s", d.as_secs_f64())
    }
}

/// Whether an executable named `tool` is in a directory of `PATH`.
fn on_path(tool: &str) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::env::var_os("PATH").is_some_and(|p| {
        std::env::split_paths(&p).any(|d| {
            std::fs::metadata(d.join(tool))
                .is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        })
    })
}

/// Times `cmd` (with stdin from `input`) inside `ns`.
fn timed(ns: &NetNs, cmd: &[&str], input: &str) -> Duration {
    let path = std::env::temp_dir().join(format!("kbench-{}.in", ns.name));
    std::fs::write(&path, input).unwrap();
    let t0 = Instant::now();
    let out = Command::new("ip")
        .args(["netns", "exec", &ns.name])
        .args(cmd)
        .stdin(std::fs::File::open(&path).unwrap())
        .output_within(TEST_LIMIT)
        .unwrap();
    let d = t0.elapsed();
    let _ = std::fs::remove_file(&path);
    assert!(
        out.status.success(),
        "{cmd:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    d
}

struct Row {
    what: String,
    ours: String,
    baseline: String,
    ratio: String,
    target: String,
    met: String,
}

fn row(
    what: impl Into<String>,
    ours: impl Into<String>,
    baseline: impl Into<String>,
    ratio: impl Into<String>,
    target: impl Into<String>,
    met: Option<bool>,
) -> Row {
    Row {
        what: what.into(),
        ours: ours.into(),
        baseline: baseline.into(),
        ratio: ratio.into(),
        target: target.into(),
        met: match met {
            Some(true) => "yes".into(),
            Some(false) => "**no**".into(),
            None => "n/a".into(),
        },
    }
}

fn ours_full(n: usize) -> Duration {
    let ns = NetNs::new("kb");
    // The daemon hands the syncer a shared snapshot; so does the bench.
    let st = std::sync::Arc::new(state(n));
    ns.run(move || {
        let mut s = NftablesProxier::new(
            NetlinkNftables::open().unwrap(),
            cfg(),
            DetectLocal::ClusterCidr(vec![]),
        );
        let t0 = Instant::now();
        s.sync_shared(&st).unwrap();
        t0.elapsed()
    })
}

fn full_sync_rows(rows: &mut Vec<Row>, sizes: &[usize], upstream_sizes: &[usize]) {
    for &n in sizes {
        let ours = ours_full(n);
        let text = render::transaction(
            &plan_full(
                &build_ruleset(&state(n), &cfg(), kube_nlproxy::kernel::nft::Family::Ip),
                None,
                &[],
            )
            .tx,
        );
        let nft_ours = timed(&NetNs::new("kb"), &["nft", "-f", "-"], &text);
        let ipt = timed(
            &NetNs::new("kb"),
            &["iptables-restore"],
            &upstream_iptables(n, EPS),
        );
        let label = format!("full sync {}k services × {EPS} endpoints", n / 1000);
        let r = nft_ours.as_secs_f64() / ours.as_secs_f64();
        let target_ok = n != 10_000 || (ours <= Duration::from_secs(2) && r >= 1.5);
        rows.push(row(
            format!("{label}: ours vs `nft -f` of our ruleset"),
            secs(ours),
            secs(nft_ours),
            format!("{r:.1}×"),
            if n == 10_000 {
                "≤ 2 s and ≥ 1.5×".into()
            } else {
                "(≥ 1.5×)".to_string()
            },
            Some(if n == 10_000 { target_ok } else { r >= 1.5 }),
        ));
        rows.push(row(
            format!("{label}: ours vs `iptables-restore` (upstream iptables layout)"),
            secs(ours),
            secs(ipt),
            format!("{:.1}×", ipt.as_secs_f64() / ours.as_secs_f64()),
            "(comparison)",
            None,
        ));
        if upstream_sizes.contains(&n) {
            let up = timed(
                &NetNs::new("kb"),
                &["nft", "-f", "-"],
                &upstream_nft(n, EPS),
            );
            let r = up.as_secs_f64() / ours.as_secs_f64();
            rows.push(row(
                format!("{label}: ours vs `nft -f` of upstream's nftables layout"),
                secs(ours),
                secs(up),
                format!("{r:.0}×"),
                if n == 10_000 {
                    "≥ 50×"
                } else {
                    "(comparison)"
                },
                if n == 10_000 { Some(r >= 50.0) } else { None },
            ));
        }
        eprintln!("full sync {n}: done");
    }
}

/// CPU time the calling thread spent in the kernel so far: nf_tables handles a batch in
/// the sender's `sendmsg`, so this is the kernel's share of a sync.
fn thread_kernel_time() -> Duration {
    // SAFETY: getrusage(2) fills the zeroed struct we pass.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    unsafe { libc::getrusage(libc::RUSAGE_THREAD, &mut ru) };
    Duration::new(ru.ru_stime.tv_sec as u64, ru.ru_stime.tv_usec as u32 * 1000)
}

/// Issue #18's shapes, in process: 5k × 50 (kubernetes/kubernetes#135639), 45k × 1
/// (#139513), 100k × 10. Per shape: the full sync (with the kernel's share), `nft -f` of
/// the same ruleset, and the median one-endpoint change with the shape present.
fn scale_rows(rows: &mut Vec<Row>, shapes: &[(usize, usize, Duration, Duration)]) {
    for &(n, eps, full_goal, change_goal) in shapes {
        let label = if n % 1000 == 0 {
            format!("{}k services × {eps}", n / 1000)
        } else {
            format!("{n} services × {eps}")
        };
        let base = std::sync::Arc::new(synthetic_state(n, eps));
        // The states come from the API source's stores, as in the daemon: each shares
        // what did not change with the one before and names the service port it changed.
        let mut stores = Stores::listed_from(&base);
        let st = std::sync::Arc::new(stores.publish(&base.node.name, &mut Vec::new()));
        let changed = base.endpoints.keys().nth(n / 2).unwrap().clone();
        let endpoints = base.endpoints_of(&changed).to_vec();
        let ns = NetNs::new("kbs");
        let (full, kernel, mut changes) = ns.run(move || {
            let mut s = NftablesProxier::new(
                NetlinkNftables::open().unwrap(),
                cfg(),
                DetectLocal::ClusterCidr(vec![]),
            );
            let (t0, k0) = (Instant::now(), thread_kernel_time());
            s.sync_shared(&st).unwrap();
            let (full, kernel) = (t0.elapsed(), thread_kernel_time() - k0);
            let mut v = Vec::new();
            for round in 0..20 {
                let mut eps = endpoints.clone();
                eps[0].ip = format!("10.250.0.{}", 1 + round % 2).parse().unwrap();
                stores.set_endpoints(&changed, eps);
                let st = std::sync::Arc::new(stores.publish("node1", &mut Vec::new()));
                let t0 = Instant::now();
                let stats = s.sync_shared(&st).unwrap();
                v.push(t0.elapsed());
                assert!(!stats.full);
                assert!(stats.ops.values().sum::<usize>() > 0, "the change was sent");
            }
            (full, kernel, v)
        });
        drop(ns);
        changes.sort();
        let change = changes[changes.len() / 2];
        let text = render::transaction(
            &plan_full(
                &build_ruleset(&base, &cfg(), kube_nlproxy::kernel::nft::Family::Ip),
                None,
                &[],
            )
            .tx,
        );
        let nft = timed(&NetNs::new("kbs"), &["nft", "-f", "-"], &text);
        drop(text);
        rows.push(row(
            format!(
                "full sync {label}: ours (kernel's share: {}) vs `nft -f` of our ruleset",
                secs(kernel)
            ),
            secs(full),
            secs(nft),
            format!("{:.1}×", nft.as_secs_f64() / full.as_secs_f64()),
            format!("≤ {}", secs(full_goal)),
            Some(full <= full_goal),
        ));
        if (n, eps) == (5000, 50) {
            let up = timed(
                &NetNs::new("kbs"),
                &["nft", "-f", "-"],
                &upstream_nft(n, eps),
            );
            rows.push(row(
                format!(
                    "full sync {label}: ours vs `nft -f` of upstream's (older) nftables layout"
                ),
                secs(full),
                secs(up),
                format!("{:.0}×", up.as_secs_f64() / full.as_secs_f64()),
                "(comparison; #135639 reports 13 min)",
                None,
            ));
        }
        rows.push(row(
            format!("one-endpoint change with {label} present (median of 20)"),
            secs(change),
            "",
            "",
            format!("≤ {}", secs(change_goal)),
            Some(change <= change_goal),
        ));
        eprintln!("scale {label}: full {full:?} (kernel {kernel:?}), change {change:?}");
    }
}

fn partial_row(rows: &mut Vec<Row>, n: usize) {
    let with_ep = |ip: &str| {
        let mut st = state(n);
        let k = st.endpoints.keys().nth(n / 2).unwrap().clone();
        std::sync::Arc::make_mut(st.endpoints.get_mut(&k).unwrap())[3].ip = ip.parse().unwrap();
        st
    };
    let (x, y) = (with_ep("10.250.0.1"), with_ep("10.250.0.2"));
    // Ours: alternate between the two states, each round a real one-endpoint change.
    let ns = NetNs::new("kb");
    let (x1, y1) = (
        std::sync::Arc::new(x.clone()),
        std::sync::Arc::new(y.clone()),
    );
    let mut times = ns.run(move || {
        let mut s = NftablesProxier::new(
            NetlinkNftables::open().unwrap(),
            cfg(),
            DetectLocal::ClusterCidr(vec![]),
        );
        s.sync_shared(&x1).unwrap();
        let mut v = Vec::new();
        for round in 0..20 {
            let st = if round % 2 == 0 { &y1 } else { &x1 };
            let t0 = Instant::now();
            let stats = s.sync_shared(st).unwrap();
            v.push(t0.elapsed());
            assert!(!stats.full);
        }
        v
    });
    times.sort();
    let ours = times[times.len() / 2];
    // Baseline: the same change as nft text, applied with nft -f to a table holding x.
    let mut f = NftablesProxier::new(
        kube_nlproxy::kernel::nft::FakeNftables::new(),
        cfg(),
        DetectLocal::ClusterCidr(vec![]),
    );
    f.sync(&x).unwrap();
    f.sync(&y).unwrap();
    let text = render::transaction(f.nft().last_transaction.as_ref().unwrap());
    let ns2 = NetNs::new("kb");
    ns2.run(move || {
        let mut s = NftablesProxier::new(
            NetlinkNftables::open().unwrap(),
            cfg(),
            DetectLocal::ClusterCidr(vec![]),
        );
        s.sync(&x).unwrap();
    });
    let nft = timed(&ns2, &["nft", "-f", "-"], &text);
    rows.push(row(
        format!(
            "one-endpoint change with {}k services present (median of 20)",
            n / 1000
        ),
        secs(ours),
        format!("{} (`nft -f` of the same change)", secs(nft)),
        format!("{:.0}×", nft.as_secs_f64() / ours.as_secs_f64()),
        "≤ 10 ms",
        Some(ours <= Duration::from_millis(10)),
    ));
    eprintln!("partial: done");
}

/// p50/p99 of TCP connect latency to one ClusterIP with `n` services programmed.
fn connect_latency(n: usize, connects: usize, iptables: bool) -> (Duration, Duration) {
    let node = NetNs::new("dp");
    let pod = NetNs::new("dpp");
    sh(&format!(
        "ip link add v0 netns {} type veth peer name v1 netns {}",
        node.name, pod.name
    ));
    node.ip("link set v0 up");
    node.ip("addr add 192.168.77.1/30 dev v0");
    node.ip("route add 10.240.0.0/12 via 192.168.77.2");
    // A node has a default route; output routing happens before DNAT.
    node.ip("route add default via 192.168.77.2");
    pod.ip("link set v1 up");
    pod.ip("addr add 192.168.77.2/30 dev v1");
    pod.ip("route add default via 192.168.77.1");
    // Answer on every endpoint address (AnyIP).
    pod.ip("route add local 10.240.0.0/12 dev lo");
    let (tx, rx) = std::sync::mpsc::channel();
    pod.spawn(move || {
        let l = TcpListener::bind("0.0.0.0:8080").unwrap();
        tx.send(()).unwrap();
        for s in l.incoming() {
            drop(s);
        }
    });
    rx.recv().unwrap();
    if iptables {
        timed(&node, &["iptables-restore"], &upstream_iptables(n, EPS));
    } else {
        let st = state(n);
        node.run(move || {
            let mut s = NftablesProxier::new(
                NetlinkNftables::open().unwrap(),
                cfg(),
                DetectLocal::ClusterCidr(vec![]),
            );
            s.sync(&st).unwrap();
        });
    }
    let target = SocketAddr::new(cluster_ip(n / 2).into(), 80);
    let mut v = node.run(move || {
        let mut v = Vec::with_capacity(connects);
        for _ in 0..connects {
            let t0 = Instant::now();
            let s = TcpStream::connect_timeout(&target, Duration::from_secs(2)).expect("connect");
            v.push(t0.elapsed());
            drop(s);
        }
        v
    });
    v.sort();
    (v[v.len() / 2], v[v.len() * 99 / 100])
}

/// Runs of ours per size in the connect latency rows: the row gives their medians and the
/// spread of their p50s (one run's p50 moved by ~10% between runs on a shared host).
const LATENCY_RUNS: usize = 5;

fn latency_rows(rows: &mut Vec<Row>, sizes: &[usize], connects: usize) {
    let mut base_p50 = None;
    for &n in sizes {
        let mut runs: Vec<(Duration, Duration)> = (0..LATENCY_RUNS)
            .map(|_| connect_latency(n, connects, false))
            .collect();
        runs.sort();
        let (p50, lo, hi) = (runs[runs.len() / 2].0, runs[0].0, runs[runs.len() - 1].0);
        let mut p99s: Vec<Duration> = runs.iter().map(|r| r.1).collect();
        p99s.sort();
        let p99 = p99s[p99s.len() / 2];
        let (ip50, ip99) = connect_latency(n, connects, true);
        let b = *base_p50.get_or_insert(p50);
        let within = p50.as_secs_f64() <= b.as_secs_f64() * 1.10;
        let us = |d: Duration| format!("{:.0} µs", d.as_secs_f64() * 1e6);
        rows.push(row(
            format!("connect latency p50 / p99, {n} services ({connects} connects per run; ours: median of {LATENCY_RUNS} runs, p50 spread {}–{})", us(lo), us(hi)),
            format!("{} / {}", us(p50), us(p99)),
            format!("{} / {} (iptables)", us(ip50), us(ip99)),
            format!("{:.2}× p50", ip50.as_secs_f64() / p50.as_secs_f64()),
            if n == *sizes.last().unwrap() {
                "p50 within 10% of 1 service".into()
            } else {
                String::new()
            },
            if n == *sizes.last().unwrap() {
                Some(within)
            } else {
                None
            },
        ));
        eprintln!("latency {n}: done");
    }
}

fn manifests(n: usize, bump: usize) -> String {
    let mut s = String::with_capacity(n * 600);
    for i in 0..n {
        let cip = cluster_ip(i);
        writeln!(s, "---\napiVersion: v1\nkind: Service\nmetadata: {{name: svc-{i}, namespace: ns}}\nspec: {{clusterIP: {cip}, ports: [{{name: http, port: 80}}]}}").unwrap();
        let eps: Vec<String> = (0..EPS)
            .map(|j| {
                let ip = if i < bump && j == 0 {
                    Ipv4Addr::from(u32::from(endpoint_ip(i, j, EPS)) ^ 0x0001_0000)
                } else {
                    endpoint_ip(i, j, EPS)
                };
                format!("{{addresses: [{ip}]}}")
            })
            .collect();
        writeln!(s, "---\napiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata: {{name: svc-{i}-a, namespace: ns, labels: {{kubernetes.io/service-name: svc-{i}}}}}\naddressType: IPv4\nports: [{{name: http, port: 8080}}]\nendpoints: [{}]", eps.join(", ")).unwrap();
    }
    s
}

/// [`proc_stat`] once the RSS has settled after a first sync: the transaction and the
/// states it replaced are freed on another thread after the commit, which at 100k × 10 may
/// outlast a fixed wait (a 300 ms wait read 741 MiB in one run and 549 MiB in another; the
/// cause is likely, not shown). Polls every 250 ms until two reads in a row move less than
/// 1 MiB, for at most 10 s.
fn settled(pid: u32) -> (u64, f64) {
    let t0 = Instant::now();
    let mut last = proc_stat(pid);
    loop {
        std::thread::sleep(Duration::from_millis(250));
        let now = proc_stat(pid);
        if now.0.abs_diff(last.0) < 1024 || t0.elapsed() > Duration::from_secs(10) {
            return now;
        }
        last = now;
    }
}

fn proc_stat(pid: u32) -> (u64, f64) {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let rss_kb = status
        .lines()
        .find(|l| l.starts_with("VmRSS:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let f: Vec<&str> = stat
        .rsplit_once(") ")
        .map(|(_, r)| r)
        .unwrap_or("")
        .split_whitespace()
        .collect();
    let cpu = (f.get(11).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0)
        + f.get(12).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0))
        / 100.0;
    (rss_kb, cpu)
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

fn daemon_rows(rows: &mut Vec<Row>, sizes: &[usize], churn_secs: u64) {
    for &n in sizes {
        let ns = NetNs::new("kd");
        let dir = std::env::temp_dir().join(format!("kbench-{}", ns.name));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("cluster.yaml");
        std::fs::write(&file, manifests(n, 0)).unwrap();
        let (mut child, cold) = manifest_daemon_first_sync(&ns, &file, &dir);
        let (rss, cpu) = settled(child.id());
        if std::env::var_os("KBENCH_OURS_LOG").is_some() {
            let _ = std::fs::copy(dir.join("log"), "/tmp/kbench-daemon.log");
        }
        rows.push(row(
            format!(
                "daemon cold start to first sync, {}k services from manifests",
                n / 1000
            ),
            secs(cold),
            "",
            "",
            match n {
                10_000 => "≤ 2 s",
                100_000 => "≤ 15 s",
                _ => "",
            },
            match n {
                10_000 => Some(cold <= Duration::from_secs(2)),
                100_000 => Some(cold <= Duration::from_secs(15)),
                _ => None,
            },
        ));
        let mib = rss as f64 / 1024.0;
        rows.push(row(
            format!(
                "daemon RSS after full sync, {}k services (CPU {cpu:.2} s so far)",
                n / 1000
            ),
            format!("{mib:.0} MiB"),
            "",
            "",
            match n {
                10_000 => "≤ 64 MiB",
                100_000 => "≤ 384 MiB",
                _ => "",
            },
            match n {
                10_000 => Some(mib <= 64.0),
                100_000 => Some(mib <= 384.0),
                _ => None,
            },
        ));
        if churn_secs > 0 && n == sizes[0] {
            // 100 endpoint changes per second: ten rewrites a second changing ten slices each.
            let start = Instant::now();
            let (_, cpu0) = proc_stat(child.id());
            let mut k = 0;
            while start.elapsed() < Duration::from_secs(churn_secs) {
                k += 1;
                let text = manifests(n, (k % 100) * 10);
                let tmp = dir.join(".tmp");
                std::fs::write(&tmp, text).unwrap();
                std::fs::rename(&tmp, &file).unwrap();
                std::thread::sleep(Duration::from_millis(100));
            }
            let (rss2, cpu1) = proc_stat(child.id());
            rows.push(row(
                format!("daemon during {churn_secs} s of 100 endpoint changes/s ({}k services, manifest source)", n / 1000),
                format!("{:.0} MiB RSS, {:.0}% of a core", rss2 as f64 / 1024.0, (cpu1 - cpu0) * 100.0 / churn_secs as f64),
                "",
                "",
                "",
                None,
            ));
        }
        // SAFETY: signalling our own child.
        unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
        let _ = child.wait();
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

/// Cold start from realistic manifests (issue #18): `n` Services × 10 endpoints as
/// block-style YAML documents and as one JSON `List`; the daemon's start to its first sync.
fn realistic_cold_rows(rows: &mut Vec<Row>, n: usize) {
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
        let (_, peak, _) = proc_usage(child.id());
        rows.push(row(
            format!(
                "daemon cold start to first sync, {}k services × {EPS} from realistic manifests ({what}, {:.1} MB; peak RSS {:.0} MiB)",
                n / 1000,
                text.len() as f64 / 1e6,
                peak as f64 / 1024.0
            ),
            secs(cold),
            "",
            "",
            "≤ 2 s",
            Some(cold <= Duration::from_secs(2)),
        ));
        // SAFETY: signalling our own child.
        unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
        let _ =
            netlink_tests::bounded::wait_within(&mut child, Duration::from_secs(30), "our daemon");
        let _ = std::fs::remove_dir_all(&dir);
    }
    eprintln!("realistic cold start {n}: done");
}

/// Reconciling a conntrack table of 100k UDP entries of which 1k are stale: dump, decide,
/// delete (ours) against `conntrack -L` merely listing the same table.
fn conntrack_row(rows: &mut Vec<Row>) {
    use kube_nlproxy::kernel::conntrack::ctnetlink::NetlinkConntrack;
    use kube_nlproxy::kernel::conntrack::{Conntrack, Flow};
    use kube_nlproxy::proxy::conntrack::{service_destinations, stale_flows};
    let ns = NetNs::new("kc");
    let mut st = state(1000);
    let keys: Vec<_> = st.services.keys().cloned().collect();
    for k in keys {
        let mut sp = std::sync::Arc::unwrap_or_clone(st.services.remove(&k).unwrap());
        let eps = st.endpoints.remove(&k).unwrap();
        sp.name.protocol = Protocol::Udp;
        st.endpoints.insert(sp.name.clone(), eps);
        st.services.insert(sp.name.clone(), sp.into());
    }
    let (ours, deleted) = ns.run(move || {
        let mut ct = NetlinkConntrack::open().unwrap();
        let flows: Vec<(Flow, u32)> = (0..100_000u32)
            .map(|i| {
                let svc = (i % 1000) as usize;
                let ep = (i / 1000 % 10) as usize;
                let src = Ipv4Addr::from(0x0b00_0000 + i);
                let reply = if i % 100 == 0 {
                    Ipv4Addr::from(0x0c00_0000 + i)
                } else {
                    endpoint_ip(svc, ep, EPS)
                };
                (
                    Flow {
                        proto: 17,
                        orig_src: src.into(),
                        orig_dst: cluster_ip(svc).into(),
                        orig_sport: 40000,
                        orig_dport: 80,
                        reply_src: reply.into(),
                        reply_dst: src.into(),
                        reply_sport: 8080,
                        reply_dport: 40000,
                        zone: 0,
                        id: None,
                    },
                    600,
                )
            })
            .collect();
        ct.create(&flows).unwrap();
        let t0 = Instant::now();
        let dests = service_destinations(&st, kube_nlproxy::kernel::nft::Family::Ip, Protocol::Udp);
        let all = ct.list(kube_nlproxy::kernel::nft::Family::Ip, 17).unwrap();
        let n = ct.delete(&stale_flows(&dests, &all)).unwrap();
        (t0.elapsed(), n)
    });
    assert_eq!(deleted, 1000);
    let list = timed(&ns, &["conntrack", "-L", "-p", "udp"], "");
    rows.push(row(
        "conntrack reconcile: 100k UDP entries, 1k stale (dump + decide + delete)",
        secs(ours),
        format!("{} (`conntrack -L` listing only)", secs(list)),
        format!("{:.1}×", list.as_secs_f64() / ours.as_secs_f64()),
        "(issue 5 benchmark)",
        None,
    ));
    eprintln!("conntrack: done");
}

/// IPVS: a full sync of `n` services × 10 endpoints into an empty namespace, our genl
/// client against `ipvsadm -R` of the same virtual and real servers; and the whole IPVS-mode
/// sync (VIPs on kube-ipvs0 and the companion nftables table included). Needs a kernel
/// with IPVS: run inside the VM (see BENCHMARKS.md).
fn ipvs_rows(rows: &mut Vec<Row>, sizes: &[usize]) {
    use kube_nlproxy::kernel::ipvs::netlink::NetlinkIpvs;
    use kube_nlproxy::kernel::ipvs::Ipvs;
    use kube_nlproxy::kernel::rtnl::NetlinkLinks;
    use kube_nlproxy::modes::ipvs::plan::{build_plan, IpvsConfig};
    use kube_nlproxy::modes::ipvs::IpvsProxier;
    assert!(
        std::path::Path::new("/proc/net/ip_vs").exists(),
        "--ipvs-only needs a kernel with IPVS: netlink-tests/vm/run-in-vm.sh --share $PWD -- ./target/release/kernel-bench --ipvs-only"
    );
    for &n in sizes {
        let st = state(n);
        let plan = build_plan(&st, &IpvsConfig::default(), &[]);
        let mut text = String::new();
        for d in plan.services.values() {
            let vs = SocketAddr::new(d.vs.addr, d.vs.port);
            writeln!(text, "-A -t {vs} -s rr").unwrap();
            for rs in d.dests.values() {
                let r = SocketAddr::new(rs.addr, rs.port);
                writeln!(text, "-a -t {vs} -r {r} -m -w 1").unwrap();
            }
        }
        // One acknowledged request at a time (what the IPVS mode did before #18).
        let ns = NetNs::new("kbipvs");
        let p = plan.clone();
        let one_by_one = ns.run(move || {
            let mut ipvs = NetlinkIpvs::open().unwrap();
            let t0 = Instant::now();
            for d in p.services.values() {
                ipvs.add_service(&d.vs).unwrap();
                for rs in d.dests.values() {
                    ipvs.add_dest(&d.vs, rs).unwrap();
                }
            }
            t0.elapsed()
        });
        drop(ns);
        // Pipelined, as the IPVS mode sends them: the virtual servers, then the real ones.
        let ns = NetNs::new("kbipvsp");
        let p = plan.clone();
        let ours = ns.run(move || {
            use kube_nlproxy::kernel::ipvs::IpvsOp;
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
        });
        drop(ns);
        let ns = NetNs::new("kbipvsadm");
        let base = timed(&ns, &["ipvsadm", "-R"], &text);
        drop(ns);
        let ratio = base.as_secs_f64() / ours.as_secs_f64();
        rows.push(row(
            format!("IPVS full sync {n}×{EPS}: virtual + real servers, pipelined"),
            secs(ours),
            format!("{} (`ipvsadm -R`)", secs(base)),
            format!("{ratio:.1}× faster"),
            "faster than ipvsadm -R",
            Some(ratio > 1.0),
        ));
        rows.push(row(
            format!("IPVS full sync {n}×{EPS}: pipelined vs one acknowledged request at a time"),
            secs(ours),
            secs(one_by_one),
            format!("{:.1}×", one_by_one.as_secs_f64() / ours.as_secs_f64()),
            "(issue #18)",
            None,
        ));
        let ns = NetNs::new("kbipvsfull");
        let st2 = st.clone();
        let whole = ns.run(move || {
            let mut rec = IpvsProxier::new(
                NetlinkIpvs::open().unwrap(),
                NetlinkLinks::open().unwrap(),
                NetlinkNftables::open().unwrap(),
                IpvsConfig::default(),
                ProxierConfig {
                    table: kube_nlproxy::modes::ipvs::table::DEFAULT_TABLE.into(),
                    ..cfg()
                },
                DetectLocal::ClusterCidr(vec![]),
            );
            let t0 = Instant::now();
            rec.sync(&st2).unwrap();
            t0.elapsed()
        });
        drop(ns);
        let ratio = base.as_secs_f64() / whole.as_secs_f64();
        rows.push(row(
            format!("IPVS-mode full sync {n}×{EPS}: + VIPs on kube-ipvs0 + nftables table"),
            secs(whole),
            format!("{} (`ipvsadm -R`, servers only)", secs(base)),
            format!("{ratio:.1}×"),
            if n >= 10_000 { "≥ 4×" } else { "(reported)" },
            (n >= 10_000).then_some(ratio >= 4.0),
        ));
        // Where the rest of the whole sync goes: its other two parts alone, each in a
        // fresh namespace, as the IPVS mode sends them.
        let ns = NetNs::new("kbipvsvips");
        let vips: Vec<std::net::IpAddr> = plan.vips.iter().copied().collect();
        let vip_time = ns.run(move || {
            use kube_nlproxy::kernel::rtnl::{host_prefix, IfAddr, Links};
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
        });
        drop(ns);
        let ns = NetNs::new("kbipvstable");
        let (st3, p3) = (st.clone(), plan.clone());
        let table_time = ns.run(move || {
            use kube_nlproxy::kernel::nft::Family;
            use kube_nlproxy::proxy::{SyncStats, TableSync};
            let pcfg = ProxierConfig {
                table: kube_nlproxy::modes::ipvs::table::DEFAULT_TABLE.into(),
                ..cfg()
            };
            let mut nft = NetlinkNftables::open().unwrap();
            let mut sync = TableSync::new(pcfg.table.clone());
            let t0 = Instant::now();
            for family in Family::all() {
                let rs = kube_nlproxy::modes::ipvs::table::build_ruleset(&st3, &p3, &pcfg, family);
                sync.sync(&mut nft, rs, true, &mut SyncStats::default())
                    .unwrap();
            }
            t0.elapsed()
        });
        drop(ns);
        for (part, t) in [
            (
                format!("{} VIPs on kube-ipvs0, pipelined", plan.vips.len()),
                vip_time,
            ),
            (
                "the companion nftables table (both families)".to_string(),
                table_time,
            ),
        ] {
            rows.push(row(
                format!("IPVS-mode full sync {n}×{EPS}, one part alone: {part}"),
                secs(t),
                format!("{} (the whole sync)", secs(whole)),
                format!("{:.0}%", 100.0 * t.as_secs_f64() / whole.as_secs_f64()),
                "(where the time goes)",
                None,
            ));
        }
        eprintln!("ipvs {n}: done");
    }
}

/// How long a proxy may take to its first sync in the side-by-side rows: upstream's
/// iptables mode over iptables-nft needs minutes at 10k services (#126013 reports ~9 min).
const FIRST_SYNC_LIMIT: Duration = Duration::from_secs(600);

/// A proxy's first sync as seen from outside.
#[derive(Clone, Copy, Debug)]
struct FirstSync {
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

/// RSS and peak RSS (KiB) of `pid`, and its CPU seconds with its reaped children's.
fn proc_usage(pid: u32) -> (u64, u64, f64) {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let kb = |key: &str| {
        status
            .lines()
            .find(|l| l.starts_with(key))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|v| v.parse().ok())
            .unwrap_or(0)
    };
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let f: Vec<f64> = stat
        .rsplit_once(") ")
        .map(|(_, r)| r)
        .unwrap_or("")
        .split_whitespace()
        .map(|v| v.parse().unwrap_or(0.0))
        .collect();
    // utime, stime, cutime, cstime: fields 14-17 of proc(5), in clock ticks (100 Hz).
    let cpu = f.get(11..15).map_or(0.0, |t| t.iter().sum::<f64>()) / 100.0;
    (kb("VmRSS:"), kb("VmHWM:"), cpu)
}

/// [`FirstSync`] of the proxy `pid` in `ns` (both families: two sync-duration samples);
/// None past [`FIRST_SYNC_LIMIT`].
fn first_sync(ns: &NetNs, pid: u32, what: &str) -> Option<FirstSync> {
    use netlink_tests::differential::{metrics, sample};
    let t0 = Instant::now();
    loop {
        let m = metrics(ns, "127.0.0.1:10249");
        if sample(&m, "kubeproxy_sync_proxy_rules_duration_seconds_count") >= 2.0 {
            let reported = sample(
                &m,
                "kubeproxy_sync_proxy_rules_duration_seconds_sum{ip_family=\"IPv4\"}",
            );
            let (rss, peak, cpu) = proc_usage(pid);
            // A diagnostic: where the resident memory is (heap, arenas, stacks, text).
            if let Some(dir) = std::env::var_os("KBENCH_SMAPS_DIR") {
                let to =
                    std::path::Path::new(&dir).join(format!("{}.smaps", what.replace(' ', "_")));
                let _ = std::fs::copy(format!("/proc/{pid}/smaps"), to);
            }
            return Some(FirstSync {
                wall: t0.elapsed(),
                reported,
                cpu,
                rss: rss as f64 / 1024.0,
                peak_rss: peak as f64 / 1024.0,
            });
        }
        if t0.elapsed() > FIRST_SYNC_LIMIT {
            let (_, peak, cpu) = proc_usage(pid);
            eprintln!(
                "side by side: {what} did not finish its first sync in {FIRST_SYNC_LIMIT:?} \
                 ({cpu:.0} CPU s, peak RSS {} MiB)",
                peak / 1024
            );
            return None;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// `changes` one-endpoint changes (`apply(c)` makes change `c`), each after every proxy
/// has been idle for longer than its minimum sync period (1 s for all), so that none is
/// caught waiting out the previous change's period. Returns per proxy the median of the
/// network programming latency it reports (`kubeproxy_network_programming_duration_seconds`,
/// from the slice's `endpoints.kubernetes.io/last-change-trigger-time`).
fn change_latencies(
    proxies: &[(&str, &NetNs)],
    changes: usize,
    mut apply: impl FnMut(usize),
) -> Vec<Option<f64>> {
    use netlink_tests::differential::{metrics, sample};
    let npl = |ns: &NetNs| {
        let m = metrics(ns, "127.0.0.1:10249");
        (
            sample(&m, "kubeproxy_network_programming_duration_seconds_sum"),
            sample(&m, "kubeproxy_network_programming_duration_seconds_count"),
        )
    };
    let mut reported: Vec<Vec<f64>> = vec![Vec::new(); proxies.len()];
    for c in 0..changes {
        std::thread::sleep(Duration::from_millis(1500));
        let before: Vec<(f64, f64)> = proxies.iter().map(|(_, ns)| npl(ns)).collect();
        apply(c);
        let t0 = Instant::now();
        for (k, (what, ns)) in proxies.iter().enumerate() {
            loop {
                let (sum, count) = npl(ns);
                if count > before[k].1 {
                    reported[k].push((sum - before[k].0) / (count - before[k].1));
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
    reported
        .into_iter()
        .map(|mut v| {
            v.sort_by(f64::total_cmp);
            v.get(v.len() / 2).copied()
        })
        .collect()
}

/// The rows of one side-by-side run, ours against each upstream mode: start to first
/// sync, the first sync as each reports it, CPU seconds and peak RSS to the first sync,
/// RSS after it, and the change latency.
fn side_by_side_push(
    rows: &mut Vec<Row>,
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
    for (k, (mode, t)) in theirs.iter().enumerate() {
        let (o, u) = (ours, *t);
        rows.push(row(
            format!("side by side, {setting}: start to first sync, vs upstream {mode} mode"),
            o.map_or_else(none, |o| secs(o.wall)),
            u.map_or_else(|| format!("> {}", secs(FIRST_SYNC_LIMIT)), |u| secs(u.wall)),
            match (o, u) {
                (Some(o), Some(u)) => {
                    format!("{:.1}×", u.wall.as_secs_f64() / o.wall.as_secs_f64())
                }
                (Some(o), None) => format!(
                    "> {:.0}×",
                    FIRST_SYNC_LIMIT.as_secs_f64() / o.wall.as_secs_f64()
                ),
                _ => String::new(),
            },
            "(comparison)",
            None,
        ));
        for (what, value, show) in &measures {
            rows.push(row(
                format!("side by side, {setting}: {what}, vs upstream {mode} mode"),
                o.map_or_else(none, |o| show(value(&o))),
                u.map_or_else(none, |u| show(value(&u))),
                match (o, u) {
                    (Some(o), Some(u)) => format!("{:.1}×", value(&u) / value(&o)),
                    _ => String::new(),
                },
                "(comparison)",
                None,
            ));
        }
        let ms = |v: Option<f64>| {
            v.map_or_else(|| "n/a".to_string(), |v| format!("{:.0} ms", v * 1000.0))
        };
        rows.push(row(
            format!("side by side, {setting}: one-endpoint change, network programming latency as each reports it (median of {changes}), vs upstream {mode} mode"),
            ms(latencies[0]),
            ms(latencies.get(k + 1).copied().flatten()),
            match (latencies[0], latencies.get(k + 1).copied().flatten()) {
                (Some(o), Some(u)) => format!("{:.1}×", u / o),
                _ => String::new(),
            },
            "(comparison)",
            None,
        ));
    }
}

/// An EndpointSlice of service `i` of the side-by-side clusters (`eps` ready endpoints;
/// with `bump` the first one moved), stamped with the trigger time now.
fn bench_slice(i: usize, eps: usize, bump: bool) -> serde_json::Value {
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
fn spawn_ours(ns: &NetNs, args: &[&str], dir: &std::path::Path) -> std::process::Child {
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
            // Each sync's network programming latencies (one line per sync): the churn row.
            std::env::var("KBENCH_OURS_LOG")
                .unwrap_or_else(|_| "info,network_programming=debug".into()),
        )
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(dir.join("ours.log")).unwrap())
        .spawn()
        .unwrap()
}

/// Ours beside upstream kube-proxy in each of `modes`, each on its own node namespace, all
/// against one real kube-apiserver holding `n` Services × `eps` endpoints. Returns the
/// modes whose first sync finished within [`FIRST_SYNC_LIMIT`].
fn side_by_side_rows(
    rows: &mut Vec<Row>,
    n: usize,
    eps: usize,
    modes: &[&'static str],
    changes: usize,
    churn_secs: u64,
) -> Vec<&'static str> {
    use k8s_openapi::api::core::v1::{Node, Service};
    use k8s_openapi::api::discovery::v1::EndpointSlice;
    use kube::api::{Api, PostParams};
    use netlink_tests::cluster::Cluster;
    use netlink_tests::controlplane::ControlPlane;
    use netlink_tests::differential::{twin_link_n, Upstream};

    let a = Cluster::new();
    let cp = ControlPlane::start(&a.node);
    let t_create = Instant::now();
    for chunk in (0..n).collect::<Vec<_>>().chunks(1000) {
        let (chunk, per) = (chunk.to_vec(), eps);
        cp.with_admin(&a.node, move |client| {
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
    cp.with_admin(&a.node, |client| {
        Box::pin(async move {
            let node: Node = serde_json::from_value(serde_json::json!({
                "apiVersion": "v1", "kind": "Node", "metadata": {"name": "node1"},
                "status": {"addresses": [{"type": "InternalIP", "address": netlink_tests::cluster::NODE_IP}]},
            }))
            .unwrap();
            Api::<Node>::all(client).create(&PostParams::default(), &node).await.unwrap();
        })
    });
    // Each proxy alone until its first sync.
    let mut upstreams = Vec::new();
    let mut cold = Vec::new();
    for (k, &mode) in (1u8..).zip(modes) {
        let b = Cluster::new();
        let via = twin_link_n(&a, &b, k);
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
            let out = b.node.sh(
                "nft list table ip kube-proxy > /tmp/kbench-upstream.nft; \
                 grep -c 'chain service-' /tmp/kbench-upstream.nft || true; \
                 grep -o ' [.] 8080' /tmp/kbench-upstream.nft | wc -l; rm -f /tmp/kbench-upstream.nft",
            );
            let mut it = out.split_whitespace();
            eprintln!(
                "side by side: upstream nftables holds {} service chains, {} endpoints in their maps (want {n}, {})",
                it.next().unwrap_or("?"),
                it.next().unwrap_or("?"),
                n * eps
            );
        }
        cold.push((mode, t));
        if t.is_some() {
            upstreams.push((mode, b, up));
        } else {
            // Stopped: it would keep a core busy in `iptables-restore` for the rest.
            drop(up);
        }
    }
    let admin = cp.admin_kubeconfig();
    let mut ours = spawn_ours(&a.node, &["--kubeconfig", admin.to_str().unwrap()], &cp.dir);
    let t_ours = first_sync(&a.node, ours.id(), "ours");
    eprintln!("side by side: ours: {t_ours:?}");
    let proxies: Vec<(&str, &NetNs)> = std::iter::once(("ours", &a.node))
        .chain(upstreams.iter().map(|(m, b, _)| (*m, &b.node)))
        .collect();
    let lat = change_latencies(&proxies, changes, |c| {
        let i = 100 + c;
        let sl: EndpointSlice = serde_json::from_value(bench_slice(i, eps, true)).unwrap();
        cp.with_admin(&a.node, move |client| {
            Box::pin(async move {
                let api = Api::<EndpointSlice>::namespaced(client, "default");
                let mut cur = api.get(&format!("svc-{i}-a")).await.unwrap();
                cur.endpoints = sl.endpoints;
                cur.metadata.annotations = sl.metadata.annotations;
                api.replace(&format!("svc-{i}-a"), &PostParams::default(), &cur)
                    .await
                    .unwrap();
            })
        });
    });
    eprintln!(
        "side by side: ours: one-endpoint change, median of {changes}: {:?} s",
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
    side_by_side_push(
        rows,
        &format!("real apiserver, {}k services × {eps}", n / 1000),
        t_ours,
        &cold,
        &lats,
        changes,
    );
    // Ours alone, by source (issue #18): RSS after the first sync and after the changes,
    // against the 64 MiB goal at 10k × 10 and peak ≤ 1.5× steady.
    let (rss_now, peak, _) = proc_usage(ours.id());
    if let Some(t) = t_ours {
        let mib = |kb: u64| kb as f64 / 1024.0;
        let goal = n == 10_000 && eps == EPS;
        rows.push(row(
            format!(
                "daemon RSS, API source (real apiserver), {}k services × {eps}: after the first sync / after {changes} changes (peak)",
                n / 1000
            ),
            format!("{:.0} / {:.0} MiB (peak {:.0})", t.rss, mib(rss_now), mib(peak)),
            "",
            format!("peak {:.1}× steady", mib(peak) / t.rss),
            if goal { "≤ 64 MiB, peak ≤ 1.5×" } else { "" },
            goal.then_some(t.rss <= 64.0 && mib(peak) <= 1.5 * t.rss),
        ));
    }
    // Churn with ours alone: the upstreams would share the two cores.
    drop(upstreams);
    if churn_secs > 0 && t_ours.is_some() {
        let log = cp.dir.join("ours.log");
        api_churn_row(rows, &cp, &a.node, (ours.id(), &log), n, eps, churn_secs);
    }
    // SAFETY: signalling our own child.
    unsafe { libc::kill(ours.id() as i32, libc::SIGTERM) };
    let _ = netlink_tests::bounded::wait_within(&mut ours, Duration::from_secs(30), "our daemon");
    if std::env::var_os("KBENCH_OURS_LOG").is_some() {
        let _ = std::fs::copy(cp.dir.join("ours.log"), "/tmp/kbench-ours.log");
    }
    eprintln!("side by side: done");
    cold.iter()
        .filter(|(_, t)| t.is_some())
        .map(|(m, _)| *m)
        .collect()
}

/// The network programming latency histogram from a metrics text: (upper bound, cumulative
/// count) per bucket, summed over label sets.
fn programming_buckets(text: &str) -> Vec<(f64, f64)> {
    let name = "kubeproxy_network_programming_duration_seconds_bucket{";
    let mut b: std::collections::BTreeMap<u64, (f64, f64)> = Default::default();
    for l in text.lines().filter(|l| l.starts_with(name)) {
        let Some(le) = l.split("le=\"").nth(1).and_then(|r| r.split('"').next()) else {
            continue;
        };
        let le = if le == "+Inf" {
            f64::INFINITY
        } else {
            le.parse().unwrap_or(f64::NAN)
        };
        let count: f64 = l
            .rsplit(' ')
            .next()
            .and_then(|v| v.parse().ok())
            .unwrap_or(0.0);
        let e = b.entry(le.to_bits()).or_insert((le, 0.0));
        e.1 += count;
    }
    let mut v: Vec<(f64, f64)> = b.into_values().filter(|(le, _)| !le.is_nan()).collect();
    v.sort_by(|x, y| x.0.total_cmp(&y.0));
    v
}

/// The `q` quantile of the observations between two snapshots of a cumulative histogram,
/// interpolated linearly inside its bucket (as Prometheus' `histogram_quantile` does).
fn histogram_quantile(before: &[(f64, f64)], after: &[(f64, f64)], q: f64) -> Option<f64> {
    let delta: Vec<(f64, f64)> = after
        .iter()
        .map(|&(le, c)| {
            let c0 = before
                .iter()
                .find(|(l, _)| *l == le)
                .map_or(0.0, |(_, c)| *c);
            (le, c - c0)
        })
        .collect();
    let total = delta.last()?.1;
    if total <= 0.0 {
        return None;
    }
    let rank = q * total;
    let mut lower = (0.0, 0.0);
    for &(le, c) in &delta {
        if c >= rank {
            if le.is_infinite() {
                return Some(lower.0);
            }
            let within = if c > lower.1 {
                (rank - lower.1) / (c - lower.1)
            } else {
                1.0
            };
            return Some(lower.0 + (le - lower.0) * within);
        }
        lower = (le, c);
    }
    None
}

/// Issue #18's churn through the API source: `secs` seconds of 100 endpoint changes per
/// second (one EndpointSlice of a different Service every 10 ms, each moving one endpoint
/// and stamping the trigger time) against the real apiserver, while ours (`pid` in `ns`,
/// synced with `n` Services) follows. Reports ours' CPU share over the window, the p50 and
/// p99 network programming latency it reported for those changes (from its histogram), and
/// its RSS before, after and at peak. The latencies are each one ours logged (`log`), the
/// histogram's quantile beside them: its buckets are 1 s apart around the 1.5 s goal.
fn api_churn_row(
    rows: &mut Vec<Row>,
    cp: &netlink_tests::controlplane::ControlPlane,
    ns: &NetNs,
    (pid, log): (u32, &std::path::Path),
    n: usize,
    eps: usize,
    secs: u64,
) {
    use k8s_openapi::api::discovery::v1::EndpointSlice;
    use kube::api::{Api, Patch, PatchParams};
    use netlink_tests::differential::metrics;
    const RATE: u64 = 100;
    // with_admin bounds each call to 60 s: the window goes in 10 s parts.
    const PART: u64 = 10;
    let before = programming_buckets(&metrics(ns, "127.0.0.1:10249"));
    let log_from = std::fs::metadata(log).map_or(0, |m| m.len() as usize);
    let (rss0, _, cpu0) = proc_usage(pid);
    let t0 = Instant::now();
    let (mut sent, mut failed) = (0u64, 0u64);
    let mut next = 0u64;
    while t0.elapsed() < Duration::from_secs(secs) {
        let part = PART.min(secs.saturating_sub(t0.elapsed().as_secs())).max(1);
        let first = next;
        next += part * RATE;
        let (ok, bad) = cp.with_admin(ns, move |client| {
            Box::pin(async move {
                let api = Api::<EndpointSlice>::namespaced(client, "default");
                let sem = std::sync::Arc::new(tokio::sync::Semaphore::new(64));
                let mut tick = tokio::time::interval(Duration::from_millis(1000 / RATE));
                tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
                let mut tasks = Vec::new();
                for k in first..first + part * RATE {
                    tick.tick().await;
                    // Every change hits a Service not changed before in this window
                    // (the side-by-side changes used services 100..105 only).
                    let i = (200 + k as usize) % n;
                    let bump = ((200 + k as usize) / n).is_multiple_of(2);
                    let sl = bench_slice(i, eps, bump);
                    let patch = serde_json::json!({
                        "metadata": {"annotations": sl["metadata"]["annotations"]},
                        "endpoints": sl["endpoints"],
                    });
                    let (api, permit) = (api.clone(), sem.clone().acquire_owned().await);
                    tasks.push(tokio::spawn(async move {
                        let _permit = permit;
                        api.patch(
                            &format!("svc-{i}-a"),
                            &PatchParams::default(),
                            &Patch::Merge(&patch),
                        )
                        .await
                        .is_ok()
                    }));
                }
                let (mut ok, mut bad) = (0u64, 0u64);
                for t in tasks {
                    if t.await.unwrap_or(false) {
                        ok += 1;
                    } else {
                        bad += 1;
                    }
                }
                (ok, bad)
            })
        });
        sent += ok;
        failed += bad;
    }
    let window = t0.elapsed();
    let (_, _, cpu1) = proc_usage(pid);
    // The last changes' syncs: ours waits out its 1 s minimum sync period.
    std::thread::sleep(Duration::from_secs(3));
    let after = programming_buckets(&metrics(ns, "127.0.0.1:10249"));
    let (rss1, peak, _) = proc_usage(pid);
    let (h50, h99) = (
        histogram_quantile(&before, &after, 0.5),
        histogram_quantile(&before, &after, 0.99),
    );
    // Each latency ours logged during the window and the settling after it.
    let text = std::fs::read(log).unwrap_or_default();
    let mut each: Vec<f64> = String::from_utf8_lossy(text.get(log_from..).unwrap_or_default())
        .lines()
        .filter_map(|l| l.split("latencies_ms=").nth(1))
        .flat_map(|v| {
            v.trim_matches('"')
                .split_whitespace()
                .filter_map(|ms| ms.trim_matches('"').parse::<f64>().ok())
                .map(|ms| ms / 1000.0)
                .collect::<Vec<_>>()
        })
        .collect();
    each.sort_by(f64::total_cmp);
    let quantile = |q: f64| {
        (!each.is_empty()).then(|| each[((q * each.len() as f64) as usize).min(each.len() - 1)])
    };
    let (p50, p99) = (quantile(0.5), quantile(0.99));
    let observed = after.last().map_or(0.0, |l| l.1) - before.last().map_or(0.0, |l| l.1);
    let cpu = (cpu1 - cpu0) / window.as_secs_f64();
    let mib = |kb: u64| kb as f64 / 1024.0;
    eprintln!(
        "churn: {sent} changes ({failed} failed) in {window:?}, {observed} latencies observed, \
         p50 {p50:?} p99 {p99:?} ({} logged; histogram: p50 {h50:?} p99 {h99:?}), \
         CPU {:.1}%, RSS {:.0} -> {:.0} MiB (peak {:.0})",
        each.len(),
        cpu * 100.0,
        mib(rss0),
        mib(rss1),
        mib(peak)
    );
    let flat = mib(rss1) <= mib(rss0) * 1.1;
    let ok = cpu <= 0.15 && p99.is_some_and(|p| p <= 1.5) && flat;
    let show = |v: Option<f64>| v.map_or_else(|| "n/a".into(), |v| format!("{v:.2} s"));
    rows.push(row(
        format!(
            "daemon during {} s of {RATE} endpoint changes/s through the API source (real apiserver, {}k services × {eps}; {sent} changes made, {failed} refused): CPU, network programming latency p50 / p99 (of the {} it logged; its histogram's buckets are 1 s apart), RSS before → after (peak)",
            window.as_secs(),
            n / 1000,
            each.len()
        ),
        format!(
            "{:.1}% of a core; {} / {}; {:.0} → {:.0} MiB (peak {:.0})",
            cpu * 100.0,
            show(p50),
            show(p99),
            mib(rss0),
            mib(rss1),
            mib(peak)
        ),
        "",
        "",
        "CPU ≤ 15%, p99 ≤ 1.5 s, RSS flat (≤ +10%)",
        Some(ok),
    ));
}

/// IPVS mode side by side, in the VM: ours and upstream's IPVS mode, each node served `n`
/// Services × 10 endpoints by one of our fake API servers (no real apiserver runs under the
/// VM's emulated CPU).
fn ipvs_side_by_side_rows(rows: &mut Vec<Row>, n: usize, changes: usize) {
    use netlink_tests::apiserver::ApiServer;
    use netlink_tests::cluster::Cluster;
    use netlink_tests::differential::Upstream;
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
        rows,
        &format!(
            "IPVS mode in the VM, fake API server, {}k services × {EPS}",
            n / 1000
        ),
        t_ours,
        &[("ipvs", t_up)],
        &lats,
        changes,
    );
    // SAFETY: signalling our own child.
    unsafe { libc::kill(ours.id() as i32, libc::SIGTERM) };
    let _ = netlink_tests::bounded::wait_within(&mut ours, Duration::from_secs(30), "our daemon");
    drop(up);
}

/// The side-by-side workloads of issue #17: 1k × 10 and 10k × 10 against upstream's
/// nftables and iptables modes, and 5k × 50 (the shape of kubernetes/kubernetes#135639).
fn side_by_side_all(rows: &mut Vec<Row>, quick: bool) {
    const BOTH: &[&str] = &["nftables", "iptables"];
    side_by_side_rows(rows, 1000, EPS, BOTH, 5, 0);
    if quick {
        return;
    }
    // Issue #18's churn row follows the 10k × 10 comparison, with ours alone.
    let finished = side_by_side_rows(rows, 10_000, EPS, BOTH, 5, 60);
    if finished.contains(&"iptables") {
        side_by_side_rows(rows, 5000, 50, BOTH, 5, 0);
    } else {
        side_by_side_rows(rows, 5000, 50, &["nftables"], 5, 0);
        rows.push(row(
            "side by side, real apiserver, 5k services × 50: vs upstream iptables mode",
            "not run",
            format!(
                "not run: it did not finish 10k × 10 (110k chains) within {} above, \
                 and 5k × 50 has 2.3× the chains",
                secs(FIRST_SYNC_LIMIT)
            ),
            "",
            "(comparison)",
            None,
        ));
    }
}

/// Issue #18's shapes and goals: (services, endpoints each, full sync, one-endpoint change).
const SCALE_SHAPES: &[(usize, usize, Duration, Duration)] = &[
    (5000, 50, Duration::from_secs(2), Duration::from_millis(10)),
    (45_000, 1, Duration::from_secs(5), Duration::from_millis(5)),
    (
        100_000,
        10,
        Duration::from_secs(15),
        Duration::from_millis(10),
    ),
];

/// The modes and options `main` understands; anything else prints this and exits, so a
/// mistyped flag (or `--help`) never starts the ~35-minute full run.
const USAGE: &str = "usage: kernel-bench [--quick] [MODE]
modes (default: the full run, ~35 min):
  --side-by-side-only            ours vs upstream for each source
  --side-by-side-shape NxE [--ours-only]
  --churn-only [SECONDS]         10k x 10 through the real apiserver, then the churn row
  --daemon-only [SERVICES]       the daemon rows from manifests
  --scale-only [NxE]             the in-process scale shapes
  --partial-only | --latency-only | --conntrack-only
  --ipvs-only [--ours-only]      IPVS rows (run inside the VM); --ours-only: without upstream";

fn main() {
    const KNOWN: &[&str] = &[
        "--quick",
        "--ipvs-only",
        "--daemon-only",
        "--scale-only",
        "--partial-only",
        "--latency-only",
        "--conntrack-only",
        "--side-by-side-shape",
        "--ours-only",
        "--churn-only",
        "--side-by-side-only",
    ];
    if let Some(bad) = std::env::args()
        .skip(1)
        .find(|a| a.starts_with('-') && !KNOWN.contains(&a.as_str()))
    {
        if bad != "--help" && bad != "-h" {
            eprintln!("kernel-bench: unknown option {bad}");
        }
        eprintln!("{USAGE}");
        std::process::exit(2);
    }
    require_root();
    // One side-by-side run keeps its namespaces for up to ~13 minutes (FIRST_SYNC_LIMIT).
    netlink_tests::deadline::set_limit(Duration::from_secs(3600));
    let args: Vec<String> = std::env::args().collect();
    let quick = args.iter().any(|a| a == "--quick");
    let (sizes, upstream, lat, daemon, churn, connects): (
        Vec<usize>,
        Vec<usize>,
        Vec<usize>,
        Vec<usize>,
        u64,
        usize,
    ) = if quick {
        (
            vec![1000, 10_000],
            vec![1000],
            vec![1, 1000, 10_000],
            vec![10_000],
            10,
            2000,
        )
    } else {
        (
            vec![1000, 10_000, 30_000],
            vec![1000, 10_000],
            vec![1, 1000, 10_000, 30_000],
            vec![10_000, 30_000, 100_000],
            60,
            5000,
        )
    };
    // The baselines each mode execs, checked before anything runs: a missing one found when
    // its row comes up loses every row measured before it (the full run prints its table
    // at the end, ~35 min in).
    let needs: &[&str] = if args.iter().any(|a| a == "--ipvs-only") {
        &["ipvsadm"]
    } else if args.iter().any(|a| a == "--conntrack-only") {
        &["conntrack"]
    } else if args.iter().any(|a| a == "--latency-only") {
        &["iptables-restore"]
    } else if args
        .iter()
        .any(|a| a == "--daemon-only" || a == "--scale-only" || a == "--partial-only")
        || args
            .iter()
            .any(|a| a.starts_with("--side-by-side") || a == "--churn-only")
    {
        &["nft"]
    } else {
        &["nft", "iptables-restore", "conntrack"]
    };
    let missing: Vec<&str> = needs.iter().copied().filter(|t| !on_path(t)).collect();
    if !missing.is_empty() {
        eprintln!(
            "kernel-bench: baseline tools not found on PATH: {} (apt-get install nftables iptables conntrack ipvsadm)",
            missing.join(", ")
        );
        std::process::exit(2);
    }
    let mut rows = Vec::new();
    if args.iter().any(|a| a == "--ipvs-only") {
        // 1k: upstream's IPVS mode needs about 2 min for it under the VM's emulated CPU.
        if !args.iter().any(|a| a == "--ours-only") {
            ipvs_side_by_side_rows(&mut rows, 1000, 5);
        }
        ipvs_rows(&mut rows, if quick { &[1000] } else { &[1000, 10_000] });
    } else if let Some(i) = args.iter().position(|a| a == "--daemon-only") {
        // `--daemon-only [SERVICES]`: 10k with 10 s of churn and the realistic manifests,
        // or one other size alone.
        match args.get(i + 1).and_then(|s| s.parse::<usize>().ok()) {
            Some(n) => daemon_rows(&mut rows, &[n], 0),
            None => {
                daemon_rows(&mut rows, &[10_000], 10);
                realistic_cold_rows(&mut rows, 10_000);
            }
        }
    } else if args.iter().any(|a| a == "--scale-only") {
        // `--scale-only [SERVICESxENDPOINTS]`: one of the shapes, or all.
        let pick = args
            .iter()
            .position(|a| a == "--scale-only")
            .and_then(|i| args.get(i + 1))
            .and_then(|s| s.split_once('x'))
            .and_then(|(n, e)| Some((n.parse::<usize>().ok()?, e.parse::<usize>().ok()?)));
        let shapes: Vec<_> = SCALE_SHAPES
            .iter()
            .copied()
            .filter(|&(n, e, _, _)| pick.is_none_or(|p| p == (n, e)))
            .collect();
        scale_rows(&mut rows, &shapes);
    } else if args.iter().any(|a| a == "--partial-only") {
        partial_row(&mut rows, 10_000);
    } else if args.iter().any(|a| a == "--latency-only") {
        latency_rows(&mut rows, &lat, connects);
    } else if args.iter().any(|a| a == "--conntrack-only") {
        conntrack_row(&mut rows);
    } else if let Some(shape) = args
        .iter()
        .position(|a| a == "--side-by-side-shape")
        .and_then(|i| args.get(i + 1))
    {
        // One workload against upstream's nftables mode, e.g. `5000x50`.
        let (n, e) = shape
            .split_once('x')
            .and_then(|(n, e)| Some((n.parse().ok()?, e.parse().ok()?)))
            .expect("--side-by-side-shape SERVICESxENDPOINTS");
        // `--ours-only`: no upstream (ours' own rows by source, in a few minutes).
        let modes: &[&str] = if args.iter().any(|a| a == "--ours-only") {
            &[]
        } else {
            &["nftables"]
        };
        side_by_side_rows(&mut rows, n, e, modes, 3, 0);
    } else if let Some(i) = args.iter().position(|a| a == "--churn-only") {
        // `--churn-only [SECONDS]`: ours alone at 10k × 10 against the real apiserver, then
        // the churn row (60 s unless given).
        let secs = args.get(i + 1).and_then(|s| s.parse().ok()).unwrap_or(60);
        side_by_side_rows(&mut rows, 10_000, EPS, &[], 3, secs);
    } else if args.iter().any(|a| a == "--side-by-side-only") {
        side_by_side_all(&mut rows, quick);
    } else {
        // The comparison a user makes comes first.
        side_by_side_all(&mut rows, quick);
        full_sync_rows(&mut rows, &sizes, &upstream);
        partial_row(&mut rows, 10_000);
        scale_rows(&mut rows, SCALE_SHAPES);
        latency_rows(&mut rows, &lat, connects);
        conntrack_row(&mut rows);
        daemon_rows(&mut rows, &daemon, churn);
        realistic_cold_rows(&mut rows, 10_000);
    }
    let mut out = String::new();
    writeln!(
        out,
        "| measurement | ours | baseline (same run) | ratio | target | met |"
    )
    .unwrap();
    writeln!(out, "| --- | --- | --- | --- | --- | --- |").unwrap();
    for r in rows {
        writeln!(
            out,
            "| {} | {} | {} | {} | {} | {} |",
            r.what, r.ours, r.baseline, r.ratio, r.target, r.met
        )
        .unwrap();
    }
    print!("{out}");
    std::io::stdout().flush().unwrap();
}
