//! The kernel benchmark harness (root only, throwaway network namespaces). Measures our
//! netlink syncs against `nft -f` and `iptables-restore` of equivalent rulesets in the same
//! run, the data path's connect latency, the daemon's memory, CPU and cold start, and ours
//! beside upstream kube-proxy itself.
//!
//! `cargo run --release -p netlink-tests --bin kernel-bench -- [--quick]`; the IPVS rows
//! need a kernel with IPVS, so they run in the test VM:
//! `netlink-tests/vm/run-in-vm.sh --share $PWD -- ./target/release/kernel-bench --ipvs-only`
//! Prints one Markdown table (BENCHMARKS.md holds the latest).
//!
//! The command line becomes an [`args::Mode`] and [`args::Sizes`] (`args`); each
//! measurement family is a module that pushes its rows to one [`table::Table`], whose rows
//! carry their goals (`table`).
#![allow(clippy::disallowed_methods)] // the baselines are external tools by design
#![allow(unsafe_code)] // kill(2), setns(2), geteuid(2) and socket calls on test processes

mod args;
mod churn;
mod conntrack;
mod daemon;
mod data_path;
mod fleet;
mod harness;
mod ipvs;
mod latency;
mod maglev;
mod nftables;
mod per_change;
#[cfg(feature = "plot")]
mod plot;
mod procfs;
mod side_by_side;
mod soak;
mod table;

use std::io::Write as _;
use std::time::Duration;

use args::{Args, ArgsError, Mode, Sizes, USAGE};
use netlink_tests::ns::require_root;
use table::Table;

fn main() {
    // Benchmarks measure the daemon as it is: no test seccomp filter on it (the tests hold it
    // to the profile), unless KNP_SECCOMP asks. Set before any thread starts.
    if std::env::var_os("KNP_SECCOMP").is_none() {
        std::env::set_var("KNP_SECCOMP", "off");
    }
    let argv: Vec<String> = std::env::args().skip(1).collect();
    let args = match args::parse(&argv) {
        Ok(args) => args,
        Err(e) => {
            if e != ArgsError::Help {
                eprintln!("{e}");
            }
            eprintln!("{USAGE}");
            std::process::exit(2);
        }
    };
    require_root();
    // One side-by-side run keeps its namespaces for up to ~13 minutes (FIRST_SYNC_LIMIT).
    netlink_tests::deadline::set_limit(Duration::from_secs(3600));
    let missing: Vec<&str> = args
        .mode
        .tools()
        .iter()
        .copied()
        .filter(|t| !harness::on_path(t))
        .collect();
    if !missing.is_empty() {
        eprintln!(
            "kernel-bench: baseline tools not found on PATH: {} (apt-get install nftables iptables conntrack ipvsadm)",
            missing.join(", ")
        );
        std::process::exit(2);
    }
    let mut table = Table::default();
    measure(args, &mut table);
    print!("{}", table.render());
    std::io::stdout().flush().unwrap();
    // The soak is a check as well as a measurement (CI runs a short one): a missed goal
    // fails it. The other modes' misses are findings BENCHMARKS.md reports.
    if matches!(args.mode, Mode::Soak { .. }) && !table.all_met() {
        eprintln!("kernel-bench: the soak missed a goal (the rows marked missed above)");
        std::process::exit(1);
    }
}

/// Runs what `args` asks for, pushing the rows to `table` in the order measured.
fn measure(args: Args, table: &mut Table) {
    let sizes = Sizes::of(args);
    match args.mode {
        Mode::Full => {
            // The comparison a user makes comes first.
            side_by_side::side_by_side_all(table, sizes.side_by_side);
            nftables::full_sync_rows(table, sizes.full_sync, sizes.upstream_layout);
            nftables::partial_row(table, 10_000);
            nftables::scale_rows(table, nftables::SCALE_SHAPES);
            per_change::per_change_rows(table, per_change::SIZES);
            maglev::maglev_rows(table, args::MAGLEV_SHAPE);
            latency::latency_rows(table, sizes.latency, sizes.connects);
            conntrack::conntrack_row(table);
            daemon::daemon_rows(table, sizes.daemon, sizes.daemon_churn_secs);
            daemon::realistic_cold_rows(table, 10_000);
            daemon::manifest_5k_50_row(table);
        }
        Mode::SideBySide => side_by_side::side_by_side_all(table, sizes.side_by_side),
        Mode::SideBySideShape { shape, ours_only } => {
            // `--ours-only`: no upstream (ours' own rows by source, in a few minutes).
            let modes: &[&str] = if ours_only { &[] } else { &["nftables"] };
            side_by_side::side_by_side_rows(table, shape, modes, 3, 0);
        }
        Mode::Churn { secs, shape } => {
            side_by_side::side_by_side_rows(table, shape, &[], side_by_side::CHANGES, secs);
        }
        Mode::Daemon { services: Some(n) } => daemon::daemon_rows(table, &[n], 0),
        Mode::Daemon { services: None } => {
            daemon::daemon_rows(table, &[10_000], 10);
            daemon::realistic_cold_rows(table, 10_000);
            daemon::manifest_5k_50_row(table);
        }
        Mode::Scale { shape } => {
            let shapes: Vec<_> = nftables::SCALE_SHAPES
                .iter()
                .copied()
                .filter(|s| shape.is_none_or(|p| p == s.shape))
                .collect();
            nftables::scale_rows(table, &shapes);
        }
        Mode::Partial => nftables::partial_row(table, 10_000),
        Mode::PerChange => per_change::per_change_rows(table, per_change::SIZES),
        Mode::Maglev { shape } => maglev::maglev_rows(table, shape),
        Mode::Latency => latency::latency_rows(table, sizes.latency, sizes.connects),
        Mode::Fleet { shape } => fleet::fleet_rows(table, shape, sizes.fleet_watchers),
        Mode::Conntrack => conntrack::conntrack_row(table),
        Mode::Soak { minutes, shape } => soak::soak_rows(table, minutes, shape),
        Mode::DataPath { services } => {
            let all = [1000, 10_000, 100_000];
            let one = services.map(|n| [n]);
            data_path::data_path_rows(table, one.as_ref().map_or(&all[..], |o| &o[..]));
        }
        Mode::Ipvs { ours_only } => {
            // 1k: upstream's IPVS mode needs about 2 min for it under the VM's emulated CPU.
            if !ours_only {
                ipvs::ipvs_side_by_side_rows(table, 1000, 5);
            }
            ipvs::ipvs_rows(table, sizes.ipvs);
        }
    }
}
