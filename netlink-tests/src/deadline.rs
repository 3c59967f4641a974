//! A per-test deadline for the kernel tests: every test that makes a network namespace holds
//! a [`Deadline`] for as long as it runs; a watchdog thread ends the test binary with a
//! message naming the test when one overruns, so a hung test fails in minutes instead of
//! holding CI (one once held it for seven).

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

/// How long one test may run: the slowest (a 30k-Service churn run, the IPVS guest tests
/// under TCG emulation) take about a minute.
pub const PER_TEST: Duration = Duration::from_secs(600);

struct Running {
    name: String,
    started: Instant,
    limit: Duration,
}

static ACTIVE: Mutex<BTreeMap<u64, Running>> = Mutex::new(BTreeMap::new());
/// [`PER_TEST`] unless [`set_limit`] changed it, in seconds.
static LIMIT_SECS: AtomicU64 = AtomicU64::new(PER_TEST.as_secs());

/// Changes the limit that namespaces made from now on get: for the benchmark harness,
/// whose runs (an upstream proxy's first sync at 10k Services) legitimately take longer.
pub fn set_limit(limit: Duration) {
    LIMIT_SECS.store(limit.as_secs(), Ordering::Relaxed);
}

/// The limit a namespace made now gets.
pub fn limit() -> Duration {
    Duration::from_secs(LIMIT_SECS.load(Ordering::Relaxed))
}
static NEXT: AtomicU64 = AtomicU64::new(0);
static WATCHDOG: OnceLock<()> = OnceLock::new();

/// Held while a test runs; dropping it ends the deadline.
#[derive(Debug)]
pub struct Deadline(u64);

impl Drop for Deadline {
    fn drop(&mut self) {
        ACTIVE
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&self.0);
    }
}

/// The first overdue entry at `now`, described.
fn overdue(active: &BTreeMap<u64, Running>, now: Instant) -> Option<String> {
    active.values().find_map(|r| {
        let ran = now.saturating_duration_since(r.started);
        (ran > r.limit).then(|| format!("{} ran {ran:?}, past its {:?} deadline", r.name, r.limit))
    })
}

/// Starts a deadline of `limit` for the calling test (named after its thread, as the test
/// harness names them).
pub fn start(limit: Duration) -> Deadline {
    WATCHDOG.get_or_init(|| {
        std::thread::Builder::new()
            .name("test-deadline".into())
            .spawn(|| loop {
                std::thread::sleep(Duration::from_secs(1));
                let active = ACTIVE.lock().unwrap_or_else(|p| p.into_inner());
                if let Some(what) = overdue(&active, Instant::now()) {
                    eprintln!("test deadline: {what}; ending the test binary");
                    std::process::exit(124);
                }
            })
            .expect("deadline watchdog thread");
    });
    let id = NEXT.fetch_add(1, Ordering::Relaxed);
    let name = std::thread::current()
        .name()
        .unwrap_or("a test")
        .to_string();
    ACTIVE.lock().unwrap_or_else(|p| p.into_inner()).insert(
        id,
        Running {
            name,
            started: Instant::now(),
            limit,
        },
    );
    Deadline(id)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn overdue_tests_are_found_by_name() {
        let t0 = Instant::now();
        let mut m = BTreeMap::new();
        m.insert(
            1,
            Running {
                name: "slow".into(),
                started: t0,
                limit: Duration::from_secs(5),
            },
        );
        assert_eq!(overdue(&m, t0 + Duration::from_secs(4)), None);
        let msg = overdue(&m, t0 + Duration::from_secs(6)).unwrap();
        assert!(msg.starts_with("slow ran 6s"), "{msg}");
        // A dropped deadline is no longer watched.
        let d = start(Duration::from_secs(3600));
        assert!(ACTIVE.lock().unwrap().contains_key(&d.0));
        let id = d.0;
        drop(d);
        assert!(!ACTIVE.lock().unwrap().contains_key(&id));
    }
}
