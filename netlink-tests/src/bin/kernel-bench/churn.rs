//! Issue #18's churn row: ours alone under 100 endpoint changes a second through the real
//! apiserver, its CPU, network programming latency and RSS (I/O: the API, `/proc`, ours'
//! log and metrics); and the histogram arithmetic it needs (pure).

use std::time::{Duration, Instant};

use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::{Api, Patch, PatchParams};
use netlink_tests::controlplane::ControlPlane;
use netlink_tests::differential::metrics;
use netlink_tests::ns::NetNs;

use crate::args::Shape;
use crate::procfs::{mib, usage};
use crate::side_by_side::bench_slice;
use crate::table::{Goal, Row, Table, Target, Unit};

/// The network programming latency histogram from a metrics text: (upper bound, cumulative
/// count) per bucket, summed over label sets.
fn programming_buckets(text: &str) -> Vec<(f64, f64)> {
    metric_buckets(text, "kubeproxy_network_programming_duration_seconds")
}

/// Histogram `metric`'s buckets in a metrics text: (upper bound, cumulative count) per
/// bucket, summed over label sets.
pub fn metric_buckets(text: &str, metric: &str) -> Vec<(f64, f64)> {
    let name = format!("{metric}_bucket{{");
    let mut b: std::collections::BTreeMap<u64, (f64, f64)> = Default::default();
    for l in text.lines().filter(|l| l.starts_with(&name)) {
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
pub fn histogram_quantile(before: &[(f64, f64)], after: &[(f64, f64)], q: f64) -> Option<f64> {
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

/// The churn row's rate, endpoint changes per second.
const RATE: u64 = 100;
/// The churn row's goals (issue #36, at 100k × 10): ours' share of a core, its p99 network
/// programming latency (seconds: the minimum sync period, 1 s, and 100 ms), and how much its
/// RSS may grow over the window.
const CPU_PERCENT: f64 = 15.0;
const P99_SECS: f64 = 1.1;
const RSS_GROWTH_PERCENT: f64 = 10.0;

/// Issue #18's churn through the API source: `secs` seconds of 100 endpoint changes per
/// second (one EndpointSlice of a different Service every 10 ms, each moving one endpoint
/// and stamping the trigger time) against the real apiserver, while ours (`pid` in `ns`,
/// synced with `shape`) follows. Reports ours' CPU share over the window, the p50 and
/// p99 network programming latency it reported for those changes (from its histogram), and
/// its RSS before, after and at peak. The latencies are each one ours logged (`log`), the
/// histogram's quantile beside them: its buckets are 1 s apart around the 1.5 s goal.
pub fn api_churn_row(
    table: &mut Table,
    cp: &ControlPlane,
    ns: &NetNs,
    (pid, log): (u32, &std::path::Path),
    shape: Shape,
    secs: u64,
) {
    let before = programming_buckets(&metrics(ns, "127.0.0.1:10249"));
    let log_from = std::fs::metadata(log).map_or(0, |m| m.len() as usize);
    let start = usage(pid);
    let t0 = Instant::now();
    let (sent, failed) = send_changes(cp, ns, shape, secs);
    let window = t0.elapsed();
    let cpu1 = usage(pid).cpu_with_children;
    // The last changes' syncs: ours waits out its 1 s minimum sync period.
    std::thread::sleep(Duration::from_secs(3));
    let after = programming_buckets(&metrics(ns, "127.0.0.1:10249"));
    let end = usage(pid);
    let (h50, h99) = (
        histogram_quantile(&before, &after, 0.5),
        histogram_quantile(&before, &after, 0.99),
    );
    let mut each = logged_latencies(log, log_from);
    each.sort_by(f64::total_cmp);
    let quantile = |q: f64| {
        (!each.is_empty()).then(|| each[((q * each.len() as f64) as usize).min(each.len() - 1)])
    };
    let (p50, p99) = (quantile(0.5), quantile(0.99));
    let observed = after.last().map_or(0.0, |l| l.1) - before.last().map_or(0.0, |l| l.1);
    let cpu = (cpu1 - start.cpu_with_children) / window.as_secs_f64();
    let (rss0, rss1, peak) = (mib(start.rss_kb), mib(end.rss_kb), mib(end.peak_kb));
    eprintln!(
        "churn: {sent} changes ({failed} failed) in {window:?}, {observed} latencies observed, \
         p50 {p50:?} p99 {p99:?} ({} logged; histogram: p50 {h50:?} p99 {h99:?}), \
         CPU {:.1}%, RSS {rss0:.0} -> {rss1:.0} MiB (peak {peak:.0})",
        each.len(),
        cpu * 100.0,
    );
    let show = |v: Option<f64>| v.map_or_else(|| "n/a".into(), |v| format!("{v:.2} s"));
    table.push(
        Row::new(
            format!(
                "daemon during {} s of {RATE} endpoint changes/s through the API source (real apiserver, {}; {sent} changes made, {failed} refused): CPU, network programming latency p50 / p99 (of the {} it logged; its histogram's buckets are 1 s apart), RSS before → after (peak)",
                window.as_secs(),
                shape.label(),
                each.len()
            ),
            format!(
                "{:.1}% of a core; {} / {}; {rss0:.0} → {rss1:.0} MiB (peak {peak:.0})",
                cpu * 100.0,
                show(p50),
                show(p99),
            ),
        )
        .target(Target::Goals(vec![
            Goal::at_most(cpu * 100.0, CPU_PERCENT, Unit::Percent).named("CPU"),
            // No latency logged is a miss.
            Goal::at_most(p99.unwrap_or(f64::INFINITY), P99_SECS, Unit::Seconds).named("p99"),
            Goal::Within {
                name: "RSS",
                of: None,
                measured: rss1,
                reference: rss0,
                percent: RSS_GROWTH_PERCENT,
            },
        ])),
    );
}

/// Makes [`RATE`] endpoint changes a second for `secs` seconds, each to a Service not
/// changed before in the window: the changes the apiserver took and those it refused.
fn send_changes(cp: &ControlPlane, ns: &NetNs, shape: Shape, secs: u64) -> (u64, u64) {
    // with_admin bounds each call to 60 s: the window goes in 10 s parts.
    const PART: u64 = 10;
    let Shape {
        services: n,
        endpoints: eps,
    } = shape;
    let t0 = Instant::now();
    let (mut sent, mut failed) = (0u64, 0u64);
    let mut next = 0u64;
    while t0.elapsed() < Duration::from_secs(secs) {
        let part = PART.min(secs.saturating_sub(t0.elapsed().as_secs())).max(1);
        let first = next;
        next += part * RATE;
        // Every change hits a Service not changed before in this window (the side-by-side
        // changes used services 100..105 only).
        let changes = (first..first + part * RATE).map(move |k| {
            let j = 200 + k as usize;
            (j % n, (j / n).is_multiple_of(2))
        });
        let (ok, bad) = cp.with_admin(ns, move |client| {
            Box::pin(patch_slices(
                Api::<EndpointSlice>::namespaced(client, "default"),
                changes,
                eps,
                RATE,
            ))
        });
        sent += ok;
        failed += bad;
    }
    (sent, failed)
}

/// Patches one bench slice (`bench_slice`) every `1 / rate` seconds: for each `(i, bump)` of
/// `changes`, Service `i`'s slice with its first endpoint moved or back, stamped with the
/// trigger time now; up to 64 in flight, as the EndpointSlice controller's workers would be,
/// each bounded to 5 s. The patches the API server took, and those it refused or did not
/// answer in time.
pub async fn patch_slices(
    api: Api<EndpointSlice>,
    changes: impl Iterator<Item = (usize, bool)>,
    eps: usize,
    rate: u64,
) -> (u64, u64) {
    let sem = std::sync::Arc::new(tokio::sync::Semaphore::new(64));
    let mut tick = tokio::time::interval(Duration::from_millis(1000 / rate));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
    let mut tasks = Vec::new();
    for (i, bump) in changes {
        tick.tick().await;
        let sl = bench_slice(i, eps, bump);
        let patch = serde_json::json!({
            "metadata": {"annotations": sl["metadata"]["annotations"]},
            "endpoints": sl["endpoints"],
        });
        let (api, permit) = (api.clone(), sem.clone().acquire_owned().await);
        tasks.push(tokio::spawn(async move {
            let _permit = permit;
            let (pp, merge) = (PatchParams::default(), Patch::Merge(&patch));
            let name = format!("svc-{i}-a");
            let call = api.patch(&name, &pp, &merge);
            matches!(
                tokio::time::timeout(Duration::from_secs(5), call).await,
                Ok(Ok(_))
            )
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
}

/// Each network programming latency (seconds) ours logged from byte `from` of its `log` on:
/// one `latencies_ms="..."` field per sync.
pub fn logged_latencies(log: &std::path::Path, from: usize) -> Vec<f64> {
    log_since(log, from)
        .lines()
        .filter_map(|l| l.split("latencies_ms=").nth(1))
        .flat_map(|v| {
            v.trim_matches('"')
                .split_whitespace()
                .filter_map(|ms| ms.trim_matches('"').parse::<f64>().ok())
                .map(|ms| ms / 1000.0)
                .collect::<Vec<_>>()
        })
        .collect()
}

/// Ours' log from byte `from` on.
pub fn log_since(log: &std::path::Path, from: usize) -> String {
    let text = std::fs::read(log).unwrap_or_default();
    String::from_utf8_lossy(text.get(from..).unwrap_or_default()).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_quantile_interpolates_inside_its_bucket_between_two_snapshots() {
        let before = [(0.5, 10.0), (1.0, 10.0), (2.0, 10.0), (f64::INFINITY, 10.0)];
        let after = [
            (0.5, 10.0),
            (1.0, 60.0),
            (2.0, 110.0),
            (f64::INFINITY, 110.0),
        ];
        assert_eq!(histogram_quantile(&before, &after, 0.5), Some(1.0));
        assert_eq!(histogram_quantile(&before, &after, 0.25), Some(0.75));
        assert_eq!(
            histogram_quantile(&before, &before, 0.5),
            None,
            "nothing observed"
        );
    }

    #[test]
    fn buckets_sum_over_label_sets() {
        let text = "kubeproxy_network_programming_duration_seconds_bucket{ip_family=\"IPv4\",le=\"1\"} 3\n\
                    kubeproxy_network_programming_duration_seconds_bucket{ip_family=\"IPv6\",le=\"1\"} 2\n\
                    kubeproxy_network_programming_duration_seconds_bucket{ip_family=\"IPv4\",le=\"+Inf\"} 4\n";
        assert_eq!(
            programming_buckets(text),
            vec![(1.0, 5.0), (f64::INFINITY, 4.0)]
        );
    }
}
