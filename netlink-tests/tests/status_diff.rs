//! `kube-nlproxy status` and `kube-nlproxy diff` against the live kernel: status names a
//! foreign change to our table (made with the daemon stopped) and reports none after a
//! sync; diff's `nft` commands, applied with the real `nft -f` to a copy of the table,
//! give exactly the table the daemon's next sync leaves.

use std::time::{Duration, Instant};

use netlink_tests::cluster::{yaml, Cluster};
use netlink_tests::listing::nft_canonical;
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
    assert_eq!(json["inSync"], false);
    assert_eq!(json["apiVersion"], "kube-nlproxy.io/v1alpha1");
    assert_eq!(json["kind"], "ProxyStatus");
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
    let (ours, theirs) = (
        nft_canonical(&scratch, "ip", "kube-nlproxy"),
        nft_canonical(&c.node, "ip", "kube-nlproxy"),
    );
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

/// Issue #53.5: the tools over HTTP on the daemon's metrics server, for clusters without
/// `kubectl exec`. `services` and `explain` answer exactly what the CLI's `--json` prints;
/// `status` and `diff` compare the kernel with the daemon's last synced state (in sync here,
/// as the CLI says from the same manifests); a bad query is a 400 naming the parameter.
#[test]
fn the_tools_answer_over_http_as_the_cli_does() {
    let c = Cluster::new();
    let _d = c.start_daemon(&first_yaml(), &[]);
    let m = c.dir.join("cluster.yaml");
    // (status code, body) of a GET to the daemon's metrics server, bounded.
    let get = |path: &str| -> (String, String) {
        let out = c.node.sh(&format!(
            "curl -s -m 20 -o /dev/stdout -w '\\n%{{http_code}}' 'http://127.0.0.1:10249/debug/kube-nlproxy/{path}'"
        ));
        let (body, code) = out.trim_end().rsplit_once('\n').unwrap_or(("", out.trim()));
        (code.to_string(), body.to_string())
    };
    let json = |s: &str| -> serde_json::Value {
        serde_json::from_str(s).unwrap_or_else(|e| panic!("{e}: {s}"))
    };
    // services: the CLI's JSON, byte for byte.
    let (code, body) = get("services");
    assert_eq!(code, "200", "{body}");
    let cli = c.node.output(
        netlink_tests::cluster::proxy_bin().to_str().unwrap(),
        &["services", "--json"],
    );
    assert_eq!(
        body.trim_end(),
        String::from_utf8_lossy(&cli.stdout).trim_end()
    );
    assert_eq!(json(&body)["kind"], "ServiceList");
    // explain: the query's parameters are the CLI's flags.
    let (code, body) = get("explain?to=10.96.0.10%3A80&from=node");
    assert_eq!(code, "200", "{body}");
    let cli = c.node.output(
        netlink_tests::cluster::proxy_bin().to_str().unwrap(),
        &[
            "explain",
            "--to",
            "10.96.0.10:80",
            "--from",
            "node",
            "--json",
        ],
    );
    assert_eq!(
        body.trim_end(),
        String::from_utf8_lossy(&cli.stdout).trim_end()
    );
    let v = json(&body);
    assert_eq!(v["kind"], "PacketExplanation");
    assert_eq!(v["tables"][0]["outcomes"][0]["verdict"], "dnat");
    // status: in sync, as the CLI finds it; the daemon part reads the same metrics page.
    let (code, body) = get("status");
    assert_eq!(code, "200", "{body}");
    let http = json(&body);
    let cli = json(&tool(&c, "status", &m, &["--json"], 0));
    assert_eq!(http["kind"], "ProxyStatus");
    assert_eq!(http["inSync"], true, "{body}");
    assert_eq!(
        http["mode"], "iptables",
        "named as /proxyMode names it: {body}"
    );
    assert_eq!(http["engine"], "nftables");
    for k in ["mode", "engine", "source", "inSync", "ipvs"] {
        assert_eq!(http[k], cli[k], "{k}");
    }
    for (h, c) in http["families"]
        .as_array()
        .unwrap()
        .iter()
        .zip(cli["families"].as_array().unwrap())
    {
        assert_eq!(h["counts"], c["counts"]);
        assert_eq!(h["differences"], c["differences"]);
    }
    assert_eq!(http["daemon"]["reachable"], true, "{body}");
    let (code, body) = get("diff");
    assert_eq!(code, "200", "{body}");
    assert_eq!(json(&body)["kind"], "ProxyDiff");
    assert_eq!(
        json(&body)["families"][0]["operations"],
        serde_json::json!([])
    );
    // Bad queries: one line naming the parameter, 400.
    let (code, body) = get("explain?table=x");
    assert_eq!(code, "400");
    assert!(body.contains("unknown parameter \"table\""), "{body}");
    let (code, body) = get("explain?from=node");
    assert_eq!(
        code, "400",
        "no destination is explain's usage error: {body}"
    );
    assert!(body.starts_with("explain: "), "{body}");
}

/// Issue #53.5: in the daemon's pod `status` needs no flags. The daemon runs as PID 1 of its
/// own PID namespace (as in a container), told its node only by `NODE_NAME`; `status` entered
/// into that namespace takes PID 1's flags and `NODE_NAME`, and reads what the daemon reads.
#[test]
#[allow(clippy::disallowed_methods)] // unshare and nsenter make the pod's PID namespace
fn status_in_the_pod_takes_the_daemons_own_flags() {
    use std::process::{Command, Stdio};
    let c = Cluster::new();
    let m = c.write_manifests(&first_yaml());
    let log = c.dir.join("pid1.log");
    let bin = netlink_tests::cluster::proxy_bin();
    // Killed (and with it the daemon, --kill-child) however the test ends, before the
    // cluster's namespaces are removed.
    struct KillOnDrop(std::process::Child);
    impl Drop for KillOnDrop {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
    let unshare = netlink_tests::bounded::dies_with_parent(&mut Command::new("unshare"))
        .arg(format!("--net=/run/netns/{}", c.node.name))
        .args(["--pid", "--fork", "--mount-proc", "--kill-child"])
        .arg(&bin)
        .args(["--manifests", m.to_str().unwrap()])
        .args(["--cluster-cidr", netlink_tests::cluster::CLUSTER_CIDR])
        .env("NODE_NAME", "node1")
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    let unshare = KillOnDrop(unshare);
    // The daemon: unshare's one child, PID 1 inside.
    let t0 = Instant::now();
    let pid = loop {
        let children =
            std::fs::read_to_string(format!("/proc/{0}/task/{0}/children", unshare.0.id()))
                .unwrap_or_default();
        let synced = std::fs::read_to_string(&log)
            .unwrap_or_default()
            .contains("initial sync done");
        if let (Some(p), true) = (children.split_whitespace().next(), synced) {
            break p.to_string();
        }
        assert!(
            t0.elapsed() < Duration::from_secs(60),
            "no first sync: {}",
            std::fs::read_to_string(&log).unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    let out = Command::new("timeout")
        .args(["60", "nsenter", "-t", &pid, "-p", "-m", "-n", "--"])
        .arg(&bin)
        .arg("status")
        .env_remove("NODE_NAME")
        .output()
        .unwrap();
    drop(unshare);
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        text.starts_with(&format!(
            "mode iptables (nftables engine), state from --manifests {}",
            m.display()
        )),
        "{text}"
    );
    assert!(
        text.contains("2 Services (2 service ports, 3 endpoints)"),
        "{text}"
    );
    assert!(text.contains("drift: none"), "{text}");
}
