//! Maglev against random load balancing (issue #39): the same cluster with every Service
//! annotated `maglev` and with none, each synced in a throwaway namespace: the full sync,
//! a one-endpoint change, the elements programmed, and the memory each costs the kernel
//! and our process (I/O: netlink, `/proc`).

use std::sync::Arc;
use std::time::{Duration, Instant};

use kube_nlproxy::model::fixtures::synthetic_state;
use kube_nlproxy::model::{LoadBalancing, ProxyState};
use netlink_tests::ns::NetNs;

use crate::args::Shape;
use crate::harness::{median, netlink_proxier};
use crate::procfs::{kernel_kb, mib, settle};
use crate::table::{render_time, Row, Table, Target};

/// How many times random's cost Maglev's is ("61× random"): the ratio column of these rows
/// reads the other way round from the table's usual "times faster", as Maglev costs more.
fn times_random(random: f64, maglev: f64) -> String {
    format!("{:.0}× random", maglev / random.max(f64::MIN_POSITIVE))
}

/// What one variant cost.
struct Cost {
    full: Duration,
    change: Duration,
    elements: usize,
    /// Growth of the kernel's slab and vmalloc memory with the table in place, KiB.
    kernel_kb: u64,
    /// Growth of our heap in use (glibc's `mallinfo2`) with the table in place, KiB: what
    /// the proxier keeps of it.
    process_kb: u64,
}

/// `shape` with every Service's load balancing set to `lb`, and the same with endpoint 0
/// of the middle Service moved to `moved` (the one-endpoint change).
fn states(shape: Shape, lb: LoadBalancing) -> (ProxyState, ProxyState) {
    let mut st = synthetic_state(shape.services, shape.endpoints);
    st.services = st
        .services
        .iter()
        .map(|(k, sp)| {
            let mut sp = (**sp).clone();
            sp.load_balancing = Some(lb);
            (k.clone(), Arc::new(sp))
        })
        .collect();
    let mut changed = st.clone();
    let k = changed
        .endpoints
        .keys()
        .nth(shape.services / 2)
        .unwrap()
        .clone();
    Arc::make_mut(changed.endpoints.get_mut(&k).unwrap())[0].ip = "10.250.0.1".parse().unwrap();
    (st, changed)
}

/// Heap bytes in use (glibc), KiB: exact, where RSS would count freed pages kept by the
/// allocator and pages an earlier row left behind.
fn heap_kb() -> u64 {
    // SAFETY: mallinfo2(3) only reads the allocator's counters.
    let m = unsafe { libc::mallinfo2() };
    (m.uordblks / 1024) as u64
}

/// [`kernel_kb`] once the kernel has finished freeing what earlier rows' namespaces held
/// (their teardown runs on a workqueue after RCU grace periods): read every 500 ms, for at
/// most 15 s.
fn settled_kernel_kb() -> u64 {
    settle(
        Duration::from_millis(500),
        Duration::from_secs(15),
        kernel_kb,
        |kb| *kb,
    )
}

fn measure(shape: Shape, lb: LoadBalancing) -> Cost {
    let (st, changed) = states(shape, lb);
    let (st, changed) = (Arc::new(st), Arc::new(changed));
    let kernel0 = settled_kernel_kb();
    let heap0 = heap_kb();
    let ns = NetNs::new("kbm");
    let (full, elements, kernel, heap, mut changes) = ns.run(move || {
        let mut s = netlink_proxier();
        let t0 = Instant::now();
        let stats = s.sync_shared(&st).unwrap();
        let full = t0.elapsed();
        let elements = stats.elements;
        let kernel = settled_kernel_kb().saturating_sub(kernel0);
        let heap = heap_kb().saturating_sub(heap0);
        let mut v = Vec::new();
        for round in 0..20 {
            let next = if round % 2 == 0 { &changed } else { &st };
            let t0 = Instant::now();
            let stats = s.sync_shared(next).unwrap();
            v.push(t0.elapsed());
            assert!(!stats.full, "a one-endpoint change is a partial sync");
        }
        (full, elements, kernel, heap, v)
    });
    drop(ns);
    Cost {
        full,
        change: median(&mut changes),
        elements,
        kernel_kb: kernel,
        process_kb: heap,
    }
}

/// Random first, then Maglev, on `shape`: four rows, each with random as the baseline.
pub fn maglev_rows(table: &mut Table, shape: Shape) {
    let label = shape.label();
    let random = measure(shape, LoadBalancing::Random);
    eprintln!("maglev bench {label}: random done");
    let maglev = measure(shape, LoadBalancing::Maglev);
    eprintln!("maglev bench {label}: maglev done");
    let note = Target::Note("(the price of Maglev: a table of ~100 entries per endpoint)");
    table.push(
        Row::new(
            format!("full sync {label}, every Service Maglev: ours vs the same with random"),
            render_time(maglev.full),
        )
        .baseline(render_time(random.full))
        .ratio(times_random(
            random.full.as_secs_f64(),
            maglev.full.as_secs_f64(),
        ))
        .target(note),
    );
    table.push(
        Row::new(
            format!("one-endpoint change with {label} Maglev present (median of 20) vs random"),
            render_time(maglev.change),
        )
        .baseline(render_time(random.change))
        .ratio(times_random(
            random.change.as_secs_f64(),
            maglev.change.as_secs_f64(),
        ))
        .target(Target::Note(
            "(only the entries that change owner are rewritten)",
        )),
    );
    table.push(
        Row::new(
            format!("elements programmed, {label}: Maglev vs random"),
            maglev.elements.to_string(),
        )
        .baseline(random.elements.to_string())
        .ratio(times_random(random.elements as f64, maglev.elements as f64))
        .target(Target::Note(
            "(1021 table entries per Service of 10 endpoints)",
        )),
    );
    table.push(
        Row::new(
            format!("memory with {label} programmed, Maglev vs random: kernel (slab + vmalloc, settled) / our heap in use (mallinfo2)"),
            format!(
                "{:.0} / {:.0} MiB",
                mib(maglev.kernel_kb),
                mib(maglev.process_kb)
            ),
        )
        .baseline(format!(
            "{:.0} / {:.0} MiB",
            mib(random.kernel_kb),
            mib(random.process_kb)
        ))
        .ratio(times_random(
            (random.kernel_kb + random.process_kb) as f64,
            (maglev.kernel_kb + maglev.process_kb) as f64,
        ))
        .target(Target::Note("(growth over the sync; the kernel's is system-wide)")),
    );
}
