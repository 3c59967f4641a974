//! The text form of a [`Report`]. Pure.

use super::*;

/// At most this many drift lines in the text form; `--json` lists all.
const DRIFT_LINES: usize = 50;

/// The text form: the ruleset's counts, then the daemon's figures and the drift (status),
/// or the operations a sync would send (diff).
pub fn render_text(r: &Report, diff: bool) -> String {
    let mut s = String::new();
    render_counts(&mut s, r);
    if diff {
        render_operations(&mut s, r);
    } else {
        render_daemon(&mut s, &r.daemon);
        render_drift(&mut s, r);
    }
    s
}

/// The mode, and per family and for IPVS what the kernel holds.
fn render_counts(s: &mut String, r: &Report) {
    if r.mode == r.engine {
        let _ = writeln!(s, "mode {}, state from {}", r.mode, r.source);
    } else {
        let _ = writeln!(
            s,
            "mode {} ({} engine), state from {}",
            r.mode, r.engine, r.source
        );
    }
    for f in &r.families {
        let c = &f.counts;
        // IPVS mode's table only filters and marks: its Services are the virtual servers.
        let services = if r.ipvs.is_some() {
            String::new()
        } else {
            format!(
                "{} Services ({} service ports, {} endpoints); ",
                c.services, c.service_ports, c.endpoints
            )
        };
        let _ = writeln!(
            s,
            "{} {}: generation {}, {services}{} chains, {} rules, {} elements",
            f.family, f.table, f.generation, c.chains, c.rules, c.elements
        );
    }
    if let Some(i) = &r.ipvs {
        let _ = writeln!(
            s,
            "IPVS: {} virtual servers, {} real servers",
            i.virtual_servers, i.real_servers
        );
    }
}

/// The daemon's sync figures from its metrics page, or why they could not be read.
fn render_daemon(s: &mut String, daemon: &Result<Daemon, String>) {
    let d = match daemon {
        Ok(d) => d,
        Err(why) => {
            let _ = writeln!(s, "daemon: not reachable ({why})");
            return;
        }
    };
    let last = match d.last_sync {
        Some(t) => {
            let ts = k8s_openapi::jiff::Timestamp::from_second(t as i64)
                .map(|t| t.to_string())
                .unwrap_or_else(|_| format!("{t}"));
            let ago = k8s_openapi::jiff::Timestamp::now().as_second() - t as i64;
            format!("last sync {ts} ({ago} s ago)")
        }
        None => "no sync yet".into(),
    };
    let latest = match (d.last_sync_seconds, d.last_sync_ok) {
        (Some(t), Some(ok)) => format!(
            "; the latest took {:.1} ms and {}",
            t * 1000.0,
            if ok { "succeeded" } else { "FAILED" }
        ),
        _ => String::new(),
    };
    let mean = d
        .mean_sync_seconds
        .map(|m| format!(", {:.1} ms on average", m * 1000.0))
        .unwrap_or_default();
    let _ = writeln!(
        s,
        "daemon ({}): {last}{latest}; {} syncs{mean}, {} failed; pending: {} service and {} endpoint changes",
        d.metrics_url, d.syncs, d.sync_failures, d.pending_service_changes, d.pending_endpoint_changes
    );
}

/// What a sync now would send, as `nft -f` and `ipvsadm -R` input.
fn render_operations(s: &mut String, r: &Report) {
    let nft: Vec<&String> = r.families.iter().flat_map(|f| &f.operations).collect();
    let ipvs: Vec<&String> = r.ipvs.iter().flat_map(|i| &i.operations).collect();
    if nft.is_empty() && ipvs.is_empty() {
        let _ = writeln!(s, "no changes: a sync now sends nothing");
        return;
    }
    let _ = writeln!(s, "a sync now sends {} operations:", nft.len() + ipvs.len());
    if !nft.is_empty() {
        let _ = writeln!(s, "# nft -f -");
        for o in nft {
            let _ = writeln!(s, "{o}");
        }
    }
    if !ipvs.is_empty() {
        let _ = writeln!(s, "# ipvsadm -R (and ip for addresses)");
        for o in ipvs {
            let _ = writeln!(s, "{o}");
        }
    }
}

/// How the kernel differs from what a full sync programs, the first [`DRIFT_LINES`].
fn render_drift(s: &mut String, r: &Report) {
    let diffs: Vec<&String> = r
        .families
        .iter()
        .flat_map(|f| &f.differences)
        .chain(r.ipvs.iter().flat_map(|i| &i.differences))
        .collect();
    if diffs.is_empty() {
        let _ = writeln!(
            s,
            "drift: none, the kernel holds what a full sync of the current sources programs"
        );
        return;
    }
    let _ = writeln!(
        s,
        "drift: {} differences from what a full sync of the current sources programs:",
        diffs.len()
    );
    for d in diffs.iter().take(DRIFT_LINES) {
        let _ = writeln!(s, "  {d}");
    }
    if diffs.len() > DRIFT_LINES {
        let _ = writeln!(
            s,
            "  … and {} more (--json lists all)",
            diffs.len() - DRIFT_LINES
        );
    }
}
