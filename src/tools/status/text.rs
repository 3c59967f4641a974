//! The text form of a [`Report`]. Pure.

use super::*;

/// The text form.
pub fn render_text(r: &Report, diff: bool) -> String {
    let mut s = String::new();
    let _ = writeln!(s, "mode {}, state from {}", r.mode, r.source);
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
    if !diff {
        match &r.daemon {
            Ok(d) => {
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
            Err(why) => {
                let _ = writeln!(s, "daemon: not reachable ({why})");
            }
        }
    }
    let diffs: Vec<&String> = r
        .families
        .iter()
        .flat_map(|f| &f.differences)
        .chain(r.ipvs.iter().flat_map(|i| &i.differences))
        .collect();
    if diff {
        let ops: Vec<(&str, &String)> = r
            .families
            .iter()
            .flat_map(|f| f.operations.iter().map(|o| ("nft", o)))
            .chain(
                r.ipvs
                    .iter()
                    .flat_map(|i| i.operations.iter().map(|o| ("ipvs", o))),
            )
            .collect();
        if ops.is_empty() {
            let _ = writeln!(s, "no changes: a sync now sends nothing");
        } else {
            let _ = writeln!(s, "a sync now sends {} operations:", ops.len());
            let nft: Vec<&String> = ops.iter().filter(|o| o.0 == "nft").map(|o| o.1).collect();
            if !nft.is_empty() {
                let _ = writeln!(s, "# nft -f -");
                for o in nft {
                    let _ = writeln!(s, "{o}");
                }
            }
            let ipvs: Vec<&String> = ops.iter().filter(|o| o.0 == "ipvs").map(|o| o.1).collect();
            if !ipvs.is_empty() {
                let _ = writeln!(s, "# ipvsadm -R (and ip for addresses)");
                for o in ipvs {
                    let _ = writeln!(s, "{o}");
                }
            }
        }
    } else if diffs.is_empty() {
        let _ = writeln!(
            s,
            "drift: none, the kernel holds what a full sync of the current sources programs"
        );
    } else {
        let _ = writeln!(
            s,
            "drift: {} differences from what a full sync of the current sources programs:",
            diffs.len()
        );
        for d in diffs.iter().take(50) {
            let _ = writeln!(s, "  {d}");
        }
        if diffs.len() > 50 {
            let _ = writeln!(s, "  … and {} more (--json lists all)", diffs.len() - 50);
        }
    }
    s
}
