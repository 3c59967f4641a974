//! A process's memory and CPU time as `/proc` shows them (I/O: reads `/proc/PID`).

use std::time::{Duration, Instant};

/// One reading of a process.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Usage {
    /// Resident set (`VmRSS`) and its peak so far (`VmHWM`), KiB.
    pub rss_kb: u64,
    pub peak_kb: u64,
    /// CPU seconds of the process itself (utime + stime).
    pub cpu: f64,
    /// CPU seconds with its reaped children's (upstream's `nft`/`iptables-restore`).
    pub cpu_with_children: f64,
}

/// KiB as MiB.
pub fn mib(kb: u64) -> f64 {
    kb as f64 / 1024.0
}

/// [`Usage`] of `pid` now (zeros for a process that is gone).
pub fn usage(pid: u32) -> Usage {
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
    let ticks = |fields: std::ops::Range<usize>| {
        f.get(fields).map_or(0.0, |t| t.iter().sum::<f64>()) / 100.0
    };
    Usage {
        rss_kb: kb("VmRSS:"),
        peak_kb: kb("VmHWM:"),
        cpu: ticks(11..13),
        cpu_with_children: ticks(11..15),
    }
}

/// [`usage`] once the RSS has settled after a first sync: the transaction and the states it
/// replaced are freed on another thread after the commit, which at 100k × 10 may outlast a
/// fixed wait (a 300 ms wait read 741 MiB in one run and 549 MiB in another; the cause is
/// likely, not shown). Polls every 250 ms until two reads in a row move less than 1 MiB,
/// for at most 10 s.
pub fn settled(pid: u32) -> Usage {
    settle(
        Duration::from_millis(250),
        Duration::from_secs(10),
        || usage(pid),
        |u| u.rss_kb,
    )
}

/// `read` once what `kb` says of it has settled: read every `every` until two reads in a row
/// differ by less than 1 MiB, or `limit` has passed.
pub fn settle<T>(
    every: Duration,
    limit: Duration,
    read: impl Fn() -> T,
    kb: impl Fn(&T) -> u64,
) -> T {
    let t0 = Instant::now();
    let mut last = read();
    loop {
        std::thread::sleep(every);
        let now = read();
        if kb(&now).abs_diff(kb(&last)) < 1024 || t0.elapsed() > limit {
            return now;
        }
        last = now;
    }
}

/// `Slab` + `VmallocUsed` of `/proc/meminfo`, KiB: where nftables keeps sets and elements.
pub fn kernel_kb() -> u64 {
    let m = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
    ["Slab:", "VmallocUsed:"]
        .iter()
        .filter_map(|k| {
            m.lines()
                .find(|l| l.starts_with(k))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|v| v.parse::<u64>().ok())
        })
        .sum()
}

/// CPU time the calling thread has used so far, to the nanosecond
/// (`CLOCK_THREAD_CPUTIME_ID`: the scheduler's own account; `getrusage` counts in ticks,
/// and a whole one-endpoint change takes less than one).
pub fn thread_cpu_time() -> Duration {
    // SAFETY: clock_gettime(2) fills the zeroed struct we pass.
    let mut ts: libc::timespec = unsafe { std::mem::zeroed() };
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}

/// User and system CPU time of the calling thread so far (`getrusage(RUSAGE_THREAD)`).
pub fn thread_times() -> (Duration, Duration) {
    // SAFETY: getrusage(2) fills the zeroed struct we pass.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    unsafe { libc::getrusage(libc::RUSAGE_THREAD, &mut ru) };
    let d = |t: libc::timeval| Duration::new(t.tv_sec as u64, t.tv_usec as u32 * 1000);
    (d(ru.ru_utime), d(ru.ru_stime))
}

/// CPU time of every thread of `pid` so far, to the nanosecond: the sum of
/// `/proc/PID/task/*/schedstat`'s first field (the scheduler's run time; `/proc/PID/stat`
/// counts 10 ms ticks, more than a one-endpoint change takes). Threads that have exited
/// are not counted: measure across windows in which none does.
pub fn process_cpu_precise(pid: u32) -> Duration {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return Duration::ZERO;
    };
    let ns: u64 = tasks
        .flatten()
        .filter_map(|t| std::fs::read_to_string(t.path().join("schedstat")).ok())
        .filter_map(|s| s.split_whitespace().next()?.parse::<u64>().ok())
        .sum();
    Duration::from_nanos(ns)
}
