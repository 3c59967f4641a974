//! The data path's connect latency: TCP connects to one ClusterIP through a veth pair,
//! with `n` services programmed by ours or by `iptables-restore` of upstream's iptables
//! layout (I/O: namespaces, netlink, sockets).

use std::net::{SocketAddr, TcpListener, TcpStream};
use std::time::{Duration, Instant};

use netlink_tests::baseline::{cluster_ip, upstream_iptables};
use netlink_tests::ns::{sh, NetNs};

use crate::args::EPS;
use crate::harness::{netlink_proxier, state, timed};
use crate::table::{render_time_ratio, Goal, Row, Table, Target};

/// How much the p50 at the largest size may exceed the p50 at the first (one service).
const P50_GROWTH_PERCENT: f64 = 10.0;

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
            netlink_proxier().sync(&st).unwrap();
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

/// Per size: ours' p50 and p99 (medians of [`LATENCY_RUNS`] runs) against the iptables
/// layout's; the largest size is held to a p50 within [`P50_GROWTH_PERCENT`] of the first's.
pub fn latency_rows(table: &mut Table, sizes: &[usize], connects: usize) {
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
        let us = |d: Duration| format!("{:.0} µs", d.as_secs_f64() * 1e6);
        let target = if sizes.last() == Some(&n) {
            Target::goal(Goal::Within {
                name: "p50",
                of: Some("1 service"),
                measured: p50.as_secs_f64(),
                reference: b.as_secs_f64(),
                percent: P50_GROWTH_PERCENT,
            })
        } else {
            Target::Note("")
        };
        table.push(
            Row::new(
                format!("connect latency p50 / p99, {n} services ({connects} connects per run; ours: median of {LATENCY_RUNS} runs, p50 spread {}–{})", us(lo), us(hi)),
                format!("{} / {}", us(p50), us(p99)),
            )
            .baseline(format!("{} / {} (iptables)", us(ip50), us(ip99)))
            .ratio(format!("{} p50", render_time_ratio(ip50, p50, 2)))
            .target(target),
        );
        eprintln!("latency {n}: done");
    }
}
