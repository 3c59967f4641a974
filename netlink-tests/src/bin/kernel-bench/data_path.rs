//! Issue #52's data path: what each new connection costs. A client namespace (a pod on
//! 10.244.0.0/16) opens TCP connections through the node namespace, where N Services × 10
//! are programmed, to one ClusterIP among them, and the same client to that Service's
//! endpoint directly (no Service: the limit, through the same node and hooks). Each
//! connection is a connect, one answer read and a close; measured: connections a second,
//! connect latency p50/p99 and CPU per connection (every core, softirq included, from
//! `/proc/stat`). Ours is programmed in process (`NftablesProxier` over netlink), upstream
//! nftables mode's layout by `nft -f` (I/O: namespaces, sockets, `/proc/stat`; the
//! arithmetic is pure).

use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use netlink_tests::baseline::{cluster_ip, endpoint_ip, upstream_nft};
use netlink_tests::ns::{sh, NetNs};

use crate::args::EPS;
use crate::harness::{netlink_proxier, state, timed};
use crate::table::{spread, Goal, Row, Table, Target, Unit};

/// The client pod's address: in the pod CIDR, so that neither ruleset masquerades it.
const CLIENT: &str = "10.244.255.250";
/// How long each measured load runs, after a warm-up of [`WARMUP`], and how many rounds of
/// the three paths in turn.
const WINDOW: Duration = Duration::from_secs(4);
const WARMUP: Duration = Duration::from_secs(1);
const ROUNDS: usize = 5;
/// Client threads: each a blocking connect, read and close loop. Two cores: four keep both
/// busy while one waits on the handshake.
const CLIENTS: usize = 4;

/// One load's result.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Load {
    pub connections: u64,
    pub failures: u64,
    pub per_second: f64,
    pub p50: Duration,
    pub p99: Duration,
    /// CPU (all cores, softirq included) per connection.
    pub cpu_per_connection: Duration,
}

/// The three namespaces: client —veth— node —veth— backend.
struct Topology {
    client: NetNs,
    node: NetNs,
    /// Kept for its lifetime: dropping a namespace deletes it.
    _backend: NetNs,
}

/// Builds the topology; the backend answers on `answers` (AnyIP) port 8080.
fn topology(answers: &[Ipv4Addr]) -> Topology {
    let (client, node, backend) = (NetNs::new("dpc"), NetNs::new("dpn"), NetNs::new("dpb"));
    sh(&format!(
        "ip link add c0 netns {} type veth peer name c1 netns {} && \
         ip link add b0 netns {} type veth peer name b1 netns {}",
        node.name, client.name, node.name, backend.name
    ));
    node.write_sysctl("net/ipv4/ip_forward", "1");
    // A short CLOSE timeout: each connection ends in a reset, and at ~10k a second the
    // default 10 s would fill the conntrack table in both measured paths alike.
    node.write_sysctl("net/netfilter/nf_conntrack_tcp_timeout_close", "1");
    node.ip_batch(&[
        "link set c0 up".into(),
        "link set b0 up".into(),
        "addr add 192.168.201.1/30 dev b0".into(),
        format!("route add {CLIENT}/32 dev c0"),
        "route add 10.0.0.0/8 via 192.168.201.2".into(),
        "addr add 192.168.200.1/32 dev c0".into(),
    ]);
    client.ip_batch(&[
        "link set c1 up".into(),
        format!("addr add {CLIENT}/32 dev c1"),
        "route add 192.168.200.1 dev c1".into(),
        "route add default via 192.168.200.1".into(),
    ]);
    let mut lines: Vec<String> = vec![
        "link set b1 up".into(),
        "addr add 192.168.201.2/30 dev b1".into(),
        "route add default via 192.168.201.1".into(),
    ];
    lines.extend(
        answers
            .iter()
            .map(|a| format!("route add local {a}/32 dev lo")),
    );
    backend.ip_batch(&lines);
    serve(&backend);
    Topology {
        client,
        node,
        _backend: backend,
    }
}

/// Four acceptors on port 8080 of every address of `ns`: each connection gets "ok\n" and a
/// close, until the process ends.
fn serve(ns: &NetNs) {
    let listener = ns.run(|| Arc::new(TcpListener::bind("0.0.0.0:8080").expect("bind 8080")));
    for _ in 0..4 {
        let l = listener.clone();
        std::thread::spawn(move || {
            for s in l.incoming().flatten() {
                let mut s = s;
                let _ = s.write_all(b"ok\n");
            }
        });
    }
}

/// Busy and total jiffies of every core (`/proc/stat`'s first line). Niced time is left
/// out of busy: nothing measured here runs niced, and background work started with `nice`
/// (a fuzzing run) is not the data path's.
fn cpu_jiffies() -> (u64, u64) {
    let stat = std::fs::read_to_string("/proc/stat").unwrap_or_default();
    let v: Vec<u64> = stat
        .lines()
        .next()
        .unwrap_or("")
        .split_whitespace()
        .skip(1)
        .filter_map(|x| x.parse().ok())
        .collect();
    let total: u64 = v.iter().take(8).sum();
    // user nice system idle iowait irq softirq steal
    let not_busy = [1, 3, 4]
        .iter()
        .map(|&k| v.get(k).copied().unwrap_or(0))
        .sum::<u64>();
    (total - not_busy, total)
}

/// One connection to `dst`: its connect latency, or None when it failed.
fn connect_once(dst: SocketAddr) -> Option<Duration> {
    let t0 = Instant::now();
    let mut s = TcpStream::connect_timeout(&dst, Duration::from_secs(1)).ok()?;
    let took = t0.elapsed();
    s.set_read_timeout(Some(Duration::from_secs(1))).ok()?;
    let mut buf = [0u8; 3];
    s.read_exact(&mut buf).ok()?;
    // A reset, not a FIN: no TIME_WAIT to exhaust the client's ports at this rate.
    let _ = socket2_linger_zero(&s);
    Some(took)
}

/// SO_LINGER {on, 0} on `s`, so that dropping it sends a reset.
#[allow(unsafe_code)] // setsockopt(2) has no std wrapper for SO_LINGER
fn socket2_linger_zero(s: &TcpStream) -> std::io::Result<()> {
    use std::os::fd::AsRawFd;
    let l = libc::linger {
        l_onoff: 1,
        l_linger: 0,
    };
    // SAFETY: a valid socket fd and a linger struct of the size given.
    let r = unsafe {
        libc::setsockopt(
            s.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_LINGER,
            (&l as *const libc::linger).cast(),
            std::mem::size_of::<libc::linger>() as libc::socklen_t,
        )
    };
    if r == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// [`CLIENTS`] threads in `client` connecting to `dst` for `window` after a warm-up.
fn load(client: &NetNs, dst: SocketAddr, window: Duration) -> Load {
    let measuring = Arc::new(AtomicBool::new(false));
    let stop = Arc::new(AtomicBool::new(false));
    let threads: Vec<_> = (0..CLIENTS)
        .map(|_| {
            let (measuring, stop) = (measuring.clone(), stop.clone());
            client.spawn(move || {
                let (mut lat, mut failures) = (Vec::with_capacity(200_000), 0u64);
                while !stop.load(Ordering::Relaxed) {
                    let r = connect_once(dst);
                    if measuring.load(Ordering::Relaxed) {
                        match r {
                            Some(d) => lat.push(d),
                            None => failures += 1,
                        }
                    }
                }
                (lat, failures)
            })
        })
        .collect();
    std::thread::sleep(WARMUP);
    let cpu0 = cpu_jiffies();
    measuring.store(true, Ordering::SeqCst);
    let t0 = Instant::now();
    std::thread::sleep(window);
    measuring.store(false, Ordering::SeqCst);
    let (elapsed, cpu1) = (t0.elapsed(), cpu_jiffies());
    stop.store(true, Ordering::SeqCst);
    let (mut lat, mut failures) = (Vec::new(), 0);
    for t in threads {
        let (l, f) = t.join().expect("client thread");
        lat.extend(l);
        failures += f;
    }
    summarize(lat, failures, elapsed, (cpu1.0 - cpu0.0, cpu1.1 - cpu0.1))
}

/// The load's figures from its latencies, failures, window and CPU jiffies (busy, total:
/// 100 a second per core).
fn summarize(
    mut lat: Vec<Duration>,
    failures: u64,
    elapsed: Duration,
    (busy, _total): (u64, u64),
) -> Load {
    lat.sort();
    let n = lat.len() as u64;
    let at = |q: f64| lat.get(((lat.len() as f64 * q) as usize).min(lat.len().saturating_sub(1)));
    Load {
        connections: n,
        failures,
        per_second: n as f64 / elapsed.as_secs_f64(),
        p50: at(0.5).copied().unwrap_or_default(),
        p99: at(0.99).copied().unwrap_or_default(),
        cpu_per_connection: if n == 0 {
            Duration::ZERO
        } else {
            Duration::from_secs_f64(busy as f64 / 100.0 / n as f64)
        },
    }
}

/// The Service every size probes, and its endpoints (the backend answers on them).
fn probed(n: usize) -> (usize, Vec<Ipv4Addr>) {
    let i = n / 2;
    (i, (0..EPS).map(|j| endpoint_ip(i, j, EPS)).collect())
}

/// At `n` Services: direct, ours and upstream nftables mode's layout, in two topologies
/// that live side by side, measured in turn for [`ROUNDS`] rounds of [`WINDOW`] each so
/// that the machine's other work falls on all three alike; per path, the round of median
/// rate.
fn measure_size(n: usize) -> (Load, Load, Option<Load>) {
    let (i, eps) = probed(n);
    let vip = SocketAddr::new(cluster_ip(i).into(), 80);
    let direct_to = SocketAddr::new(eps[0].into(), 8080);
    let ours = topology(&eps);
    let st = state(n);
    ours.node
        .run(move || netlink_proxier().sync(&st).expect("our sync"));
    let upstream = (n <= UPSTREAM_MAX).then(|| {
        let t = topology(&eps);
        let took = timed(&t.node, &["nft", "-f", "-"], &upstream_nft(n, EPS));
        eprintln!("data path {n}: upstream's layout loaded by nft -f in {took:?}");
        t
    });
    let mut runs: [Vec<Load>; 3] = Default::default();
    for _ in 0..ROUNDS {
        runs[0].push(load(&ours.client, direct_to, WINDOW));
        runs[1].push(load(&ours.client, vip, WINDOW));
        if let Some(u) = &upstream {
            runs[2].push(load(&u.client, vip, WINDOW));
        }
    }
    let upstream_runs = !runs[2].is_empty();
    let [direct, ours, upstream] = runs.map(median_rate);
    let upstream = upstream_runs.then_some(upstream);
    eprintln!(
        "data path {n}: direct {:.0}/s, ours {:.0}/s, upstream nftables {:?}/s",
        direct.per_second,
        ours.per_second,
        upstream.map(|u| u.per_second.round())
    );
    (direct, ours, upstream)
}

/// Above this many Services upstream's layout is not loaded: `nft -f` of it took 228–246 s
/// at 10k × 10 on this machine (BENCHMARKS.md), and its chains grow with the endpoints.
const UPSTREAM_MAX: usize = 10_000;

/// The load of median rate.
fn median_rate(mut v: Vec<Load>) -> Load {
    v.sort_by(|a, b| a.per_second.total_cmp(&b.per_second));
    v.get(v.len() / 2).copied().unwrap_or_default()
}

/// "12,345/s; p50 / p99 60 / 250 µs; 95 µs CPU".
fn render(l: &Load) -> String {
    let us = |d: Duration| d.as_secs_f64() * 1e6;
    format!(
        "{:.0}/s; p50 / p99 {:.0} / {:.0} µs; {:.0} µs CPU{}",
        l.per_second,
        us(l.p50),
        us(l.p99),
        us(l.cpu_per_connection),
        if l.failures > 0 {
            format!("; {} failed", l.failures)
        } else {
            String::new()
        }
    )
}

/// Issue #52's goals: a ClusterIP's rate at least 0.95× direct and flat (≤ 5% spread) from
/// the smallest size to the largest; its p99 within 1.1× direct's; at least upstream
/// nftables mode's rate.
const RATE_OF_DIRECT: f64 = 0.95;
const FLAT_PERCENT: f64 = 5.0;
const P99_OF_DIRECT: f64 = 1.1;

/// The data-path rows for each of `sizes` (Services × 10).
pub fn data_path_rows(table: &mut Table, sizes: &[usize]) {
    let mut rates = Vec::new();
    for &n in sizes {
        let (direct, ours, upstream) = measure_size(n);
        rates.push(ours.per_second);
        table.push(size_row(n, &direct, &ours, upstream.as_ref()));
    }
    if rates.len() > 1 {
        let s = spread(&rates);
        table.push(
            Row::new(
                format!(
                    "new TCP connections a second through a ClusterIP across {} services × 10: largest over smallest",
                    sizes
                        .iter()
                        .map(|n| n.to_string())
                        .collect::<Vec<_>>()
                        .join(" / ")
                ),
                format!("{s:.3}×"),
            )
            .target(Target::goal(
                Goal::at_most(s, 1.0 + FLAT_PERCENT / 100.0, Unit::Times).named("spread"),
            )),
        );
    }
}

/// One size's row: ours against direct and against upstream nftables mode.
fn size_row(n: usize, direct: &Load, ours: &Load, upstream: Option<&Load>) -> Row {
    let of_direct = ours.per_second / direct.per_second;
    let p99 = ours.p99.as_secs_f64() / direct.p99.as_secs_f64();
    let mut goals = vec![
        Goal::at_least(of_direct, RATE_OF_DIRECT, Unit::Times).named("rate of direct"),
        Goal::at_most(p99, P99_OF_DIRECT, Unit::Times).named("p99 of direct"),
    ];
    let (up_text, up_ratio) = match upstream {
        Some(u) => {
            let r = ours.per_second / u.per_second;
            goals.push(Goal::at_least(r, 1.0, Unit::Times).named("rate of upstream"));
            (render(u), format!(", {r:.2}× upstream"))
        }
        None => (
            format!("not loaded above {UPSTREAM_MAX} services (nft -f of its layout)"),
            String::new(),
        ),
    };
    Row::new(
        format!(
            "new TCP connections through a ClusterIP, {n} services × 10, pod to Service (connect, read, reset; {CLIENTS} client threads; the median of {ROUNDS} rounds of {} s, the three paths in turn): rate, connect latency, CPU per connection; baseline: the same pod to the endpoint directly / upstream nftables mode's layout",
            WINDOW.as_secs()
        ),
        render(ours),
    )
    .baseline(format!("{} / {up_text}", render(direct)))
    .ratio(format!(
        "{of_direct:.2}× direct, p99 {p99:.2}× direct{up_ratio}"
    ))
    .target(Target::Goals(goals))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_load_is_summarized_per_second_and_per_connection() {
        let lat: Vec<Duration> = (1..=100).map(Duration::from_micros).collect();
        let l = summarize(lat, 2, Duration::from_secs(10), (50, 2000));
        assert_eq!(l.connections, 100);
        assert_eq!(l.failures, 2);
        assert_eq!(l.per_second, 10.0);
        assert_eq!(l.p50, Duration::from_micros(51));
        assert_eq!(l.p99, Duration::from_micros(100));
        // 50 jiffies = 0.5 CPU seconds over 100 connections.
        assert_eq!(l.cpu_per_connection, Duration::from_millis(5));
        assert_eq!(
            summarize(vec![], 0, Duration::from_secs(1), (0, 0)),
            Load::default()
        );
    }

    #[test]
    fn the_probed_service_is_the_middle_one_with_its_ten_endpoints() {
        let (i, eps) = probed(1000);
        assert_eq!(i, 500);
        assert_eq!(eps.len(), EPS);
        assert_eq!(eps[0], endpoint_ip(500, 0, EPS));
    }
}
