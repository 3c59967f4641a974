//! CPU time of one one-endpoint change at 1k, 10k and 100k Services × 10, in process, the
//! whole way the daemon takes it after the watch event is decoded: the API source's stores
//! apply the slice and publish a state (collisions checked), the sync loop's hooks see it,
//! the nftables proxier syncs it to the kernel, and the hooks take the sync's results
//! (network programming latency, no-local-endpoint counts, health-check plans). Issue #36's
//! goal: the same change within 2× at every size (I/O: a namespace, netlink).

use std::sync::Arc;
use std::time::{Duration, Instant};

use kube_nlproxy::app::hooks::Hooks;
use kube_nlproxy::model::collisions::CollisionTracker;
use kube_nlproxy::model::fixtures::synthetic_state;
use kube_nlproxy::proxy::runner::SyncHooks;
use kube_nlproxy::serve::admin::Shared;
use kube_nlproxy::source::kube::Stores;
use netlink_tests::ns::NetNs;

use crate::args::EPS;
use crate::harness::{median, netlink_proxier};
use crate::procfs::thread_cpu_time;
use crate::table::{render_time, spread, Goal, Row, Table, Target, Unit};

/// The sizes, Services × [`EPS`].
pub const SIZES: &[usize] = &[1000, 10_000, 100_000];

/// Changes measured per size (the median is reported).
const ROUNDS: usize = 50;
/// How far apart the sizes' CPU per change may be.
const SPREAD: f64 = 2.0;

/// What one size measured: CPU and wall medians of [`ROUNDS`] changes, and the CPU of the
/// baseline: the state built whole from the same stores, with its collisions (what each
/// change cost the source before issue #36, before any sync).
struct PerChange {
    cpu: Duration,
    wall: Duration,
    whole: Duration,
}

/// [`PerChange`] of one-endpoint changes with `n` Services × [`EPS`].
fn per_change(n: usize) -> PerChange {
    let base = synthetic_state(n, EPS);
    let mut stores = Stores::listed_from(&base);
    let node = base.node.name.clone();
    let changed = base.endpoints.keys().nth(n / 2).unwrap().clone();
    let endpoints = base.endpoints_of(&changed).to_vec();
    drop(base);
    let ns = NetNs::new("kpc");
    ns.run(move || {
        // The hooks' health-check servers are tokio tasks (none here: no Service has one).
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let _rt = rt.enter();
        let mut hooks = Hooks::new(Shared::detached());
        let mut collisions = CollisionTracker::default();
        let mut proxier = netlink_proxier();
        let first = Arc::new(stores.publish(&node, &mut Vec::new()));
        collisions.new_in(&first);
        hooks.state_changed(&first);
        let res = proxier.sync_shared(&first);
        hooks.synced(&first, &res, Duration::ZERO);
        res.unwrap();
        drop(first);
        let (mut cpu, mut wall) = (Vec::new(), Vec::new());
        for round in 0..ROUNDS {
            let mut eps = endpoints.clone();
            eps[0].ip = format!("10.250.0.{}", 1 + round % 2).parse().unwrap();
            let (c0, t0) = (thread_cpu_time(), Instant::now());
            stores.set_endpoints(&changed, eps);
            let st = Arc::new(stores.publish(&node, &mut Vec::new()));
            collisions.new_in(&st);
            hooks.state_changed(&st);
            let t_sync = Instant::now();
            let res = proxier.sync_shared(&st);
            hooks.synced(&st, &res, t_sync.elapsed());
            let stats = res.unwrap();
            cpu.push(thread_cpu_time() - c0);
            wall.push(t0.elapsed());
            assert!(!stats.full, "a partial sync");
            assert!(stats.ops.values().sum::<usize>() > 0, "the change was sent");
        }
        let mut whole: Vec<Duration> = (0..5)
            .map(|_| {
                let c0 = thread_cpu_time();
                let st = stores.state(&node, &mut Vec::new());
                kube_nlproxy::model::collisions::collisions_of(&st);
                thread_cpu_time() - c0
            })
            .collect();
        PerChange {
            cpu: median(&mut cpu),
            wall: median(&mut wall),
            whole: median(&mut whole),
        }
    })
}

/// One row: CPU (and wall) per change at each of `sizes` Services × [`EPS`], held to
/// within [`SPREAD`] of each other.
pub fn per_change_rows(table: &mut Table, sizes: &[usize]) {
    let measured: Vec<(usize, PerChange)> = sizes
        .iter()
        .map(|&n| {
            let m = per_change(n);
            eprintln!(
                "per change, {n} services: CPU {:?}, wall {:?}, whole state {:?}",
                m.cpu, m.wall, m.whole
            );
            (n, m)
        })
        .collect();
    let list = |f: &dyn Fn(&PerChange) -> String| {
        measured
            .iter()
            .map(|(_, m)| f(m))
            .collect::<Vec<_>>()
            .join(" / ")
    };
    let cpus: Vec<f64> = measured.iter().map(|m| m.1.cpu.as_secs_f64()).collect();
    let spread = spread(&cpus);
    table.push(
        Row::new(
            format!(
                "CPU per one-endpoint change in process (stores publish, collisions, hooks, nftables sync to the kernel), {} services × {EPS} (median of {ROUNDS}; wall: {}), vs building that state whole with its collisions (the source's share before issue #36, no sync)",
                measured.iter().map(|m| format!("{}k", m.0 / 1000)).collect::<Vec<_>>().join(" / "),
                list(&|m| render_time(m.wall)),
            ),
            list(&|m| render_time(m.cpu)),
        )
        .baseline(list(&|m| render_time(m.whole)))
        .ratio(format!("{spread:.2}× largest / smallest"))
        .target(Target::goal(
            Goal::at_most(spread, SPREAD, Unit::Times).named("spread"),
        )),
    );
}
