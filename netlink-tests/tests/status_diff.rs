//! `kube-nlproxy status` and `kube-nlproxy diff` against the live kernel: status names a
//! foreign change to our table (made with the daemon stopped) and reports none after a
//! sync; diff's `nft` commands, applied with the real `nft -f` to a copy of the table,
//! give exactly the table the daemon's next sync leaves.

use std::time::{Duration, Instant};

use netlink_tests::cluster::{yaml, Cluster};
use netlink_tests::ns::NetNs;
use netlink_tests::scenario::{dns_yaml, web_yaml_with, LOCAL_EP, REMOTE_EP};

/// Runs `kube-nlproxy TOOL --manifests M EXTRA` with the daemon's node flags; its exit
/// status must be `code` (0 in sync, 1 drift).
fn tool(c: &Cluster, tool: &str, manifests: &std::path::Path, extra: &[&str], code: i32) -> String {
    let mut args = vec![tool, "--manifests", manifests.to_str().unwrap()];
    args.extend_from_slice(extra);
    c.proxy_report(&args, code)
}

fn first_yaml() -> String {
    web_yaml_with("", &[LOCAL_EP, REMOTE_EP], false) + &dns_yaml("default", 0, &[LOCAL_EP])
}

/// `web`'s remote endpoint moved; `dns` grows to two endpoints; a new Service `api`.
fn second_yaml() -> String {
    web_yaml_with("", &[LOCAL_EP, "10.244.2.3"], false)
        + &dns_yaml("default", 0, &[LOCAL_EP, REMOTE_EP])
        + &yaml::service(
            "default",
            "api",
            &["10.96.0.30"],
            &[("http", "TCP", 80, 0)],
            "",
        )
        + &yaml::slice(
            "default",
            "api",
            "api-1",
            "IPv4",
            ("http", "TCP", 8080),
            &[
                yaml::ready(LOCAL_EP, "node1"),
                yaml::ready(REMOTE_EP, "node2"),
            ],
        )
}

/// Our IPv4 table as `nft -j` lists it, with what two equal tables may list differently
/// taken out: handles, and the order of set elements (hash order).
fn canonical_table(ns: &NetNs) -> Vec<String> {
    let out = ns.sh("nft -j list table ip kube-nlproxy");
    let v: serde_json::Value = serde_json::from_str(&out).expect("nft -j prints JSON");
    let mut lines = Vec::new();
    let mut pos = std::collections::BTreeMap::<String, usize>::new();
    for item in v["nftables"].as_array().expect("nftables array") {
        let mut item = item.clone();
        let Some((kind, body)) = item.as_object_mut().and_then(|o| o.iter_mut().next()) else {
            continue;
        };
        if kind == "metainfo" {
            continue;
        }
        let kind = kind.clone();
        let body = body.as_object_mut().expect("object");
        body.remove("handle");
        if let Some(serde_json::Value::Array(elems)) = body.get_mut("elem") {
            elems.sort_by_key(|e| e.to_string());
        }
        let key = if kind == "rule" {
            let chain = body["chain"].as_str().unwrap_or("").to_string();
            let n = pos.entry(chain.clone()).or_default();
            *n += 1;
            format!("rule {chain} #{n:04}")
        } else {
            kind.clone()
        };
        lines.push(format!("{key} {}", serde_json::Value::Object(body.clone())));
    }
    lines.sort();
    lines
}

#[test]
fn status_names_a_foreign_change_and_diff_repairs_it() {
    let c = Cluster::new();
    let mut d = c.start_daemon(&first_yaml(), &[]);
    let m = c.dir.join("cluster.yaml");
    let s = tool(&c, "status", &m, &[], 0);
    assert!(s.contains("drift: none"), "{s}");
    assert!(
        s.contains("2 Services (2 service ports, 3 endpoints)"),
        "counts: {s}"
    );
    assert!(
        s.contains("daemon (http://127.0.0.1:10249/metrics): last sync"),
        "{s}"
    );
    d.terminate();
    // Someone else edits our table while the daemon is stopped.
    c.node
        .sh("nft delete element ip kube-nlproxy service-ips '{ 10.96.0.10 . tcp . 80 }'");
    c.node
        .sh("nft insert rule ip kube-nlproxy services ip saddr 192.0.2.1 drop");
    let s = tool(&c, "status", &m, &[], 1);
    assert!(s.contains("daemon: not reachable"), "{s}");
    assert!(s.contains("drift: 2 differences"), "{s}");
    assert!(
        s.contains("set service-ips: 1 elements missing, 0 not in the plan, 0 with other data (e.g. 10.96.0.10 . tcp . 80 missing)"),
        "{s}"
    );
    assert!(
        s.contains("chain services: 3 rules, planned 2; from rule 1:"),
        "{s}"
    );
    let json: serde_json::Value =
        serde_json::from_str(&tool(&c, "status", &m, &["--json"], 1)).unwrap();
    assert_eq!(json["in_sync"], false);
    // diff's commands, through the real nft, undo both.
    let ops = tool(&c, "diff", &m, &[], 1);
    let script: String = ops
        .lines()
        .filter(|l| l.starts_with("add ") || l.starts_with("flush ") || l.starts_with("delete "))
        .map(|l| format!("{l}\n"))
        .collect();
    assert!(
        script.contains("flush chain ip kube-nlproxy services"),
        "{ops}"
    );
    assert!(
        script.contains("add element ip kube-nlproxy service-ips"),
        "{ops}"
    );
    std::fs::write(c.dir.join("repair.nft"), &script).unwrap();
    c.node
        .sh(&format!("nft -f {}", c.dir.join("repair.nft").display()));
    let s = tool(&c, "status", &m, &[], 0);
    assert!(
        s.contains("drift: none"),
        "after applying diff:\n{s}\n{ops}"
    );
    assert!(tool(&c, "diff", &m, &[], 0).contains("no changes"));
}

#[test]
fn diff_shows_exactly_what_the_next_sync_does() {
    let c = Cluster::new();
    let d = c.start_daemon(&first_yaml(), &[]);
    let next = c.dir.join("next.yaml");
    std::fs::write(&next, second_yaml()).unwrap();
    let ops = tool(&c, "diff", &next, &[], 1);
    let script: String = ops
        .lines()
        .filter(|l| l.starts_with("add ") || l.starts_with("flush ") || l.starts_with("delete "))
        .filter(|l| l.contains(" ip kube-nlproxy "))
        .map(|l| format!("{l}\n"))
        .collect();
    assert!(script.contains("10.96.0.30"), "the new Service: {ops}");
    assert!(script.contains("10.244.2.3"), "the moved endpoint: {ops}");
    // A copy of the table as it is now, in a scratch namespace, with diff's commands applied.
    let scratch = NetNs::new("dcopy");
    let before = c.node.sh("nft list table ip kube-nlproxy");
    std::fs::write(c.dir.join("before.nft"), &before).unwrap();
    std::fs::write(c.dir.join("ops.nft"), &script).unwrap();
    scratch.sh(&format!("nft -f {}", c.dir.join("before.nft").display()));
    scratch.sh(&format!("nft -f {}", c.dir.join("ops.nft").display()));
    // The daemon's own next sync.
    c.write_manifests(&second_yaml());
    let t0 = Instant::now();
    while !c
        .node
        .sh("nft list table ip kube-nlproxy")
        .contains("10.96.0.30")
    {
        assert!(
            t0.elapsed() < Duration::from_secs(15),
            "the daemon never synced the change:\n{}",
            d.log_text()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    std::thread::sleep(Duration::from_millis(500));
    let (ours, theirs) = (canonical_table(&scratch), canonical_table(&c.node));
    let only = |a: &[String], b: &[String]| -> Vec<String> {
        a.iter().filter(|l| !b.contains(l)).cloned().collect()
    };
    assert!(
        ours == theirs,
        "diff + nft -f differs from the daemon's sync:\nonly after diff: {:#?}\nonly after the sync: {:#?}\ndiff:\n{ops}",
        only(&ours, &theirs),
        only(&theirs, &ours)
    );
    assert!(tool(&c, "diff", &next, &[], 0).contains("no changes"));
}

#[test]
fn a_table_loaded_by_nft_from_our_dry_run_is_in_sync() {
    // nft compiles the same rules its own way (shorter prefix loads, other registers);
    // status compares what rules do, not how they were compiled.
    let c = Cluster::new();
    let m = c.write_manifests(&second_yaml());
    let plan = c.proxy_stdout(&["--manifests", m.to_str().unwrap(), "--dry-run"]);
    std::fs::write(c.dir.join("plan.nft"), plan).unwrap();
    c.node
        .sh(&format!("nft -f {}", c.dir.join("plan.nft").display()));
    let s = tool(&c, "status", &m, &[], 0);
    assert!(s.contains("drift: none"), "{s}");
    // …and a rule nft changed is still seen.
    c.node.sh("nft flush chain ip kube-nlproxy nat-output");
    let s = tool(&c, "status", &m, &[], 1);
    assert!(s.contains("chain nat-output: 0 rules, planned 1"), "{s}");
}
