//! `cargo xtask fuzz`: builds the libFuzzer targets of `fuzz/` with coverage instrumentation
//! (what `cargo fuzz build -s none` passes to rustc, so neither cargo-fuzz nor a nightly
//! toolchain is needed), runs each over its seeds for a bounded time and
//! reports executions and coverage. A crash, a timeout or an out-of-memory input fails the
//! run and is left in `target/fuzz/artifacts/TARGET/`, to be copied into
//! `fuzz/regressions/TARGET/` with its fix.
//!
//! The stats parser is pure; the rest runs processes.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// rustc flags of cargo-fuzz's `--sanitizer none` build: sancov's inline 8-bit counters, the
/// PC table and compare tracing that libFuzzer's feedback reads, `cfg(fuzzing)`, and the
/// debug assertions and overflow checks that turn silent wrong arithmetic into a crash.
const RUSTFLAGS: &str = "-Cpasses=sancov-module \
    -Cllvm-args=-sanitizer-coverage-level=4 \
    -Cllvm-args=-sanitizer-coverage-inline-8bit-counters \
    -Cllvm-args=-sanitizer-coverage-pc-table \
    -Cllvm-args=-sanitizer-coverage-trace-compares \
    --cfg fuzzing -Cdebug-assertions -Coverflow-checks";

/// The target triple: given explicitly so the flags reach only the target's crates, not
/// build scripts and proc macros (which libFuzzer's runtime would not link into).
const TRIPLE: &str = "x86_64-unknown-linux-gnu";

/// libFuzzer's own limits per input: 10 s is a hang (our decoders take microseconds), 2 GiB
/// of RSS is an unbounded allocation (the daemon itself stays under 100 MiB at 10k Services).
const INPUT_TIMEOUT_S: u32 = 10;
const RSS_LIMIT_MB: u32 = 2048;

/// What one target's run did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunStats {
    pub target: String,
    pub seconds: u64,
    /// `stat::number_of_executed_units`.
    pub executions: u64,
    /// The last `cov:` (edges covered) and `ft:` (features) libFuzzer printed.
    pub coverage: u64,
    pub features: u64,
    pub corpus: u64,
}

/// Reads libFuzzer's output (`-print_final_stats=1`): the executions from the final stats,
/// coverage, features and corpus size from its last status line (`#N ... cov: C ft: F
/// corp: K/...`). Pure.
pub fn parse_stats(target: &str, seconds: u64, output: &str) -> RunStats {
    let field = |line: &str, key: &str| -> Option<u64> {
        let mut words = line.split_whitespace();
        while let Some(w) = words.next() {
            if w == key {
                let v = words.next()?;
                return v.split('/').next()?.parse().ok();
            }
        }
        None
    };
    let mut s = RunStats {
        target: target.to_string(),
        seconds,
        executions: 0,
        coverage: 0,
        features: 0,
        corpus: 0,
    };
    for line in output.lines() {
        if let Some(v) = line
            .strip_prefix("stat::number_of_executed_units:")
            .and_then(|v| v.trim().parse().ok())
        {
            s.executions = v;
        }
        if line.starts_with('#') {
            s.coverage = field(line, "cov:").unwrap_or(s.coverage);
            s.features = field(line, "ft:").unwrap_or(s.features);
            s.corpus = field(line, "corp:").unwrap_or(s.corpus);
        }
    }
    s
}

/// The results as a Markdown table (docs/testing.md's).
pub fn render(stats: &[RunStats]) -> String {
    let mut t = String::from(
        "| target | seconds | executions | edges covered | features | corpus |\n|---|---|---|---|---|---|\n",
    );
    for s in stats {
        t.push_str(&format!(
            "| `{}` | {} | {} | {} | {} | {} |\n",
            s.target, s.seconds, s.executions, s.coverage, s.features, s.corpus
        ));
    }
    t
}

/// Builds the targets into `target/fuzz`.
pub fn build(root: &Path) -> Result<PathBuf, String> {
    let target_dir = root.join("target/fuzz");
    #[allow(clippy::disallowed_methods)] // a build task runs cargo
    let status = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()))
        .args([
            "build",
            "--locked",
            "--release",
            "--bins",
            "--target",
            TRIPLE,
        ])
        .arg("--manifest-path")
        .arg(root.join("fuzz/Cargo.toml"))
        .env("CARGO_TARGET_DIR", &target_dir)
        .env("RUSTFLAGS", RUSTFLAGS)
        .status()
        .map_err(|e| format!("cargo build of fuzz/: {e}"))?;
    if !status.success() {
        return Err(format!("cargo build of fuzz/ failed ({status})"));
    }
    Ok(target_dir.join(TRIPLE).join("release"))
}

/// Runs `target` for `seconds` over its corpus (its seeds, written by the binary itself from
/// `KNP_FUZZ_SEEDS`, and what earlier runs added) and its regressions. libFuzzer stops itself at `-max_total_time`; the process is killed 60 s
/// after that if it has not.
pub fn run_target(
    root: &Path,
    bin_dir: &Path,
    target: &str,
    seconds: u64,
) -> Result<RunStats, String> {
    let corpus = root.join("target/fuzz/corpus").join(target);
    let regressions = root.join("fuzz/regressions").join(target);
    let artifacts = root.join("target/fuzz/artifacts").join(target);
    let log = root.join("target/fuzz/logs").join(format!("{target}.log"));
    for d in [&corpus, &regressions, &artifacts] {
        std::fs::create_dir_all(d).map_err(|e| format!("{}: {e}", d.display()))?;
    }
    std::fs::create_dir_all(log.parent().unwrap()).map_err(|e| e.to_string())?;
    let log_file = std::fs::File::create(&log).map_err(|e| format!("{}: {e}", log.display()))?;
    #[allow(clippy::disallowed_methods)] // a test task runs the fuzz binaries it built
    let mut child = Command::new(bin_dir.join(target))
        .arg(&corpus)
        .arg(&regressions)
        .arg(format!("-max_total_time={seconds}"))
        .arg(format!("-timeout={INPUT_TIMEOUT_S}"))
        .arg(format!("-rss_limit_mb={RSS_LIMIT_MB}"))
        .arg(format!("-artifact_prefix={}/", artifacts.display()))
        .arg("-print_final_stats=1")
        .env("KNP_FUZZ_SEEDS", &corpus)
        .stdin(Stdio::null())
        .stdout(log_file.try_clone().map_err(|e| e.to_string())?)
        .stderr(log_file)
        .spawn()
        .map_err(|e| format!("{target}: {e}"))?;
    let t0 = Instant::now();
    let limit = Duration::from_secs(seconds + 60);
    let status = loop {
        if let Some(st) = child.try_wait().map_err(|e| e.to_string())? {
            break st;
        }
        if t0.elapsed() > limit {
            let _ = child.kill();
            let _ = child.wait();
            return Err(format!(
                "{target}: still running {}s after its {seconds}s; log {}",
                limit.as_secs() - seconds,
                log.display()
            ));
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    let output = std::fs::read_to_string(&log).unwrap_or_default();
    if !status.success() {
        let tail: Vec<&str> = output.lines().rev().take(30).collect();
        return Err(format!(
            "{target}: libFuzzer found an input that fails ({status}); artifacts in {}; log {}:\n{}",
            artifacts.display(),
            log.display(),
            tail.into_iter().rev().collect::<Vec<_>>().join("\n")
        ));
    }
    Ok(parse_stats(target, seconds, &output))
}

/// Runs `targets` for `seconds` each, `jobs` at a time, in the given order: the stats of
/// those that passed, and a paragraph per failure.
pub fn run_all(
    root: &Path,
    bin_dir: &Path,
    targets: &[String],
    seconds: u64,
    jobs: usize,
) -> (Vec<RunStats>, Vec<String>) {
    let mut stats = Vec::new();
    let mut failures = Vec::new();
    for batch in targets.chunks(jobs.max(1)) {
        let results: Vec<Result<RunStats, String>> = std::thread::scope(|s| {
            let handles: Vec<_> = batch
                .iter()
                .map(|t| {
                    eprintln!("fuzz: {t} for {seconds}s");
                    s.spawn(move || run_target(root, bin_dir, t, seconds))
                })
                .collect();
            handles
                .into_iter()
                .map(|h| {
                    h.join()
                        .unwrap_or_else(|_| Err("a fuzz runner panicked".into()))
                })
                .collect()
        });
        for r in results {
            match r {
                Ok(s) => stats.push(s),
                Err(e) => failures.push(e),
            }
        }
    }
    (stats, failures)
}

#[cfg(test)]
mod tests {
    use super::*;

    const OUTPUT: &str = "INFO: Seed: 1234
INFO: Loaded 1 modules   (80512 inline 8-bit counters): 80512 [0x55, 0x56),
#2\tINITED cov: 310 ft: 311 corp: 2/1234b exec/s: 0 rss: 40Mb
#4096\tpulse  cov: 512 ft: 900 corp: 40/9Kb lim: 43 exec/s: 2048 rss: 52Mb
#8191\tNEW    cov: 520 ft: 917 corp: 41/9Kb lim: 43 exec/s: 2730 rss: 52Mb L: 12/40 MS: 1 ChangeBit-
Done 9000 runs in 3 second(s)
stat::number_of_executed_units: 9000
stat::average_exec_per_sec:     3000
stat::new_units_added:          39
stat::slowest_unit_time_sec:    0
stat::peak_rss_mb:              52
";

    #[test]
    fn stats_come_from_the_last_status_line_and_the_final_stats() {
        let s = parse_stats("nft_reply", 3, OUTPUT);
        assert_eq!(
            s,
            RunStats {
                target: "nft_reply".into(),
                seconds: 3,
                executions: 9000,
                coverage: 520,
                features: 917,
                corpus: 41,
            }
        );
    }

    #[test]
    fn output_without_stats_reads_as_zero() {
        let s = parse_stats("x", 1, "INFO: Seed: 1\n");
        assert_eq!((s.executions, s.coverage, s.corpus), (0, 0, 0));
    }

    #[test]
    fn the_table_has_a_row_per_target() {
        let s = parse_stats("nft_reply", 3, OUTPUT);
        let t = render(&[
            s.clone(),
            RunStats {
                target: "flags".into(),
                ..s
            },
        ]);
        assert_eq!(t.lines().count(), 4);
        assert!(t.contains("| `nft_reply` | 3 | 9000 | 520 | 917 | 41 |"));
    }
}
