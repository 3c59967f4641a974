//! Migrating off upstream kube-proxy's iptables mode: its leftovers, written with the real
//! `iptables-nft-restore` (the oracle), are removed over nfnetlink by `--cleanup` and at
//! start-up, foreign rules and kubelet's chains in the same tables stay, and a connection
//! established through upstream's rules keeps working while ours take over.
#![allow(clippy::disallowed_methods)] // tests may run test-time tools

use std::time::Duration;

use netlink_tests::backend::{tcp_probes, OpenConn};
use netlink_tests::cluster::{sa, Cluster};
use netlink_tests::scenario::{self, names, Backends, LOCAL_EP, REMOTE_EP};

/// What upstream's iptables mode (and kubelet) leave in iptables-nft's tables for the web
/// Service (ClusterIP 10.96.0.10:80 → the local endpoint only), plus foreign rules.
const UPSTREAM_V4: &str = r#"*nat
:PREROUTING ACCEPT [0:0]
:INPUT ACCEPT [0:0]
:OUTPUT ACCEPT [0:0]
:POSTROUTING ACCEPT [0:0]
:KUBE-SERVICES - [0:0]
:KUBE-POSTROUTING - [0:0]
:KUBE-MARK-MASQ - [0:0]
:KUBE-NODEPORTS - [0:0]
:KUBE-SVC-ERIFXISQEP7F7OF4 - [0:0]
:KUBE-SEP-6E7XQMQ4RAYOWTTM - [0:0]
:KUBE-PROXY-CANARY - [0:0]
:KUBE-KUBELET-CANARY - [0:0]
:FOREIGN-NAT - [0:0]
-A PREROUTING -m comment --comment "kubernetes service portals" -j KUBE-SERVICES
-A PREROUTING -j FOREIGN-NAT
-A OUTPUT -m comment --comment "kubernetes service portals" -j KUBE-SERVICES
-A POSTROUTING -m comment --comment "kubernetes postrouting rules" -j KUBE-POSTROUTING
-A POSTROUTING -s 172.17.0.0/16 ! -o docker0 -j MASQUERADE
-A FOREIGN-NAT -d 198.51.100.1/32 -j RETURN
-A KUBE-POSTROUTING -m mark ! --mark 0x4000/0x4000 -j RETURN
-A KUBE-POSTROUTING -j MARK --set-xmark 0x4000/0x0
-A KUBE-POSTROUTING -m comment --comment "kubernetes service traffic requiring SNAT" -j MASQUERADE --random-fully
-A KUBE-MARK-MASQ -j MARK --set-xmark 0x4000/0x4000
-A KUBE-SERVICES -d 10.96.0.10/32 -p tcp -m comment --comment "default/web cluster IP" -m tcp --dport 80 -j KUBE-SVC-ERIFXISQEP7F7OF4
-A KUBE-SERVICES -m comment --comment "kubernetes service nodeports; NOTE: this must be the last rule in this chain" -m addrtype --dst-type LOCAL -j KUBE-NODEPORTS
-A KUBE-SVC-ERIFXISQEP7F7OF4 -m comment --comment "default/web -> 10.244.1.2:8080" -j KUBE-SEP-6E7XQMQ4RAYOWTTM
-A KUBE-SEP-6E7XQMQ4RAYOWTTM -s 10.244.1.2/32 -m comment --comment "default/web" -j KUBE-MARK-MASQ
-A KUBE-SEP-6E7XQMQ4RAYOWTTM -p tcp -m comment --comment "default/web" -m tcp -j DNAT --to-destination 10.244.1.2:8080
COMMIT
*filter
:INPUT ACCEPT [0:0]
:FORWARD ACCEPT [0:0]
:OUTPUT ACCEPT [0:0]
:KUBE-SERVICES - [0:0]
:KUBE-EXTERNAL-SERVICES - [0:0]
:KUBE-FORWARD - [0:0]
:KUBE-NODEPORTS - [0:0]
:KUBE-PROXY-FIREWALL - [0:0]
:KUBE-PROXY-CANARY - [0:0]
:KUBE-FIREWALL - [0:0]
-A INPUT -m conntrack --ctstate NEW -m comment --comment "kubernetes load balancer firewall" -j KUBE-PROXY-FIREWALL
-A INPUT -m comment --comment "kubernetes health check service ports" -j KUBE-NODEPORTS
-A INPUT -m conntrack --ctstate NEW -m comment --comment "kubernetes externally-visible service portals" -j KUBE-EXTERNAL-SERVICES
-A INPUT -j KUBE-FIREWALL
-A INPUT -p tcp -m tcp --dport 2222 -j ACCEPT
-A FORWARD -m conntrack --ctstate NEW -m comment --comment "kubernetes load balancer firewall" -j KUBE-PROXY-FIREWALL
-A FORWARD -m comment --comment "kubernetes forwarding rules" -j KUBE-FORWARD
-A FORWARD -m conntrack --ctstate NEW -m comment --comment "kubernetes service portals" -j KUBE-SERVICES
-A FORWARD -m conntrack --ctstate NEW -m comment --comment "kubernetes externally-visible service portals" -j KUBE-EXTERNAL-SERVICES
-A OUTPUT -m conntrack --ctstate NEW -m comment --comment "kubernetes load balancer firewall" -j KUBE-PROXY-FIREWALL
-A OUTPUT -m conntrack --ctstate NEW -m comment --comment "kubernetes service portals" -j KUBE-SERVICES
-A OUTPUT -j KUBE-FIREWALL
-A KUBE-FIREWALL ! -s 127.0.0.0/8 -d 127.0.0.0/8 -m comment --comment "block incoming localnet connections" -m conntrack ! --ctstate RELATED,ESTABLISHED,DNAT -j DROP
-A KUBE-FORWARD -m conntrack --ctstate INVALID -m nfacct --nfacct-name ct_state_invalid_dropped_pkts -j DROP
-A KUBE-FORWARD -m comment --comment "kubernetes forwarding rules" -m mark --mark 0x4000/0x4000 -j ACCEPT
-A KUBE-FORWARD -m comment --comment "kubernetes forwarding conntrack rule" -m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT
COMMIT
*mangle
:PREROUTING ACCEPT [0:0]
:KUBE-PROXY-CANARY - [0:0]
:KUBE-KUBELET-CANARY - [0:0]
COMMIT
"#;

const UPSTREAM_V6: &str = r#"*nat
:PREROUTING ACCEPT [0:0]
:OUTPUT ACCEPT [0:0]
:POSTROUTING ACCEPT [0:0]
:KUBE-SERVICES - [0:0]
:KUBE-POSTROUTING - [0:0]
:KUBE-MARK-MASQ - [0:0]
-A PREROUTING -m comment --comment "kubernetes service portals" -j KUBE-SERVICES
-A OUTPUT -m comment --comment "kubernetes service portals" -j KUBE-SERVICES
-A POSTROUTING -m comment --comment "kubernetes postrouting rules" -j KUBE-POSTROUTING
-A POSTROUTING -s fd00:17::/64 -j MASQUERADE
-A KUBE-MARK-MASQ -j MARK --set-xmark 0x4000/0x4000
COMMIT
"#;

/// Loads the leftovers with the real iptables-nft tools, in the node namespace.
fn program_upstream(c: &Cluster) {
    program_upstream_with(c, "nft");
}

/// The same with `flavour` "nft" or "legacy" (iptables-legacy: x_tables).
fn program_upstream_with(c: &Cluster, flavour: &str) {
    let v4 = c.dir.join("upstream-v4.rules");
    let v6 = c.dir.join("upstream-v6.rules");
    // nfacct is not always available; its rule is only there to be foreign-looking.
    std::fs::write(
        &v4,
        UPSTREAM_V4.replace(" -m nfacct --nfacct-name ct_state_invalid_dropped_pkts", ""),
    )
    .unwrap();
    std::fs::write(&v6, UPSTREAM_V6).unwrap();
    c.node
        .sh(&format!("iptables-{flavour}-restore < {}", v4.display()));
    c.node
        .sh(&format!("ip6tables-{flavour}-restore < {}", v6.display()));
    let saved = c.node.sh(&format!("iptables-{flavour}-save"));
    assert!(saved.contains("-j KUBE-SVC-ERIFXISQEP7F7OF4"), "{saved}");
}

fn assert_only_foreign_left(c: &Cluster) {
    assert_only_foreign_left_in(c, "nft");
}

/// `flavour`: "nft" or "legacy" (which iptables-*-save reads the tables).
fn assert_only_foreign_left_in(c: &Cluster, flavour: &str) {
    let v4 = c.node.sh(&format!("iptables-{flavour}-save"));
    let v6 = c.node.sh(&format!("ip6tables-{flavour}-save"));
    for gone in [
        "KUBE-SERVICES",
        "KUBE-SVC-",
        "KUBE-SEP-",
        "KUBE-POSTROUTING",
        "KUBE-MARK-MASQ",
        "KUBE-NODEPORTS",
        "KUBE-EXTERNAL-SERVICES",
        "KUBE-FORWARD",
        "KUBE-PROXY-FIREWALL",
        "KUBE-PROXY-CANARY",
    ] {
        assert!(!v4.contains(gone), "{gone} left:\n{v4}");
        assert!(!v6.contains(gone), "{gone} left (ip6):\n{v6}");
    }
    for kept in [
        "-A PREROUTING -j FOREIGN-NAT",
        "-A FOREIGN-NAT -d 198.51.100.1/32 -j RETURN",
        "-A POSTROUTING -s 172.17.0.0/16 ! -o docker0 -j MASQUERADE",
        "-A INPUT -p tcp -m tcp --dport 2222 -j ACCEPT",
        "-A INPUT -j KUBE-FIREWALL",
        "-A OUTPUT -j KUBE-FIREWALL",
        ":KUBE-FIREWALL",
        ":KUBE-KUBELET-CANARY",
        "block incoming localnet connections",
    ] {
        assert!(v4.contains(kept), "{kept} removed:\n{v4}");
    }
    assert!(
        v6.contains("-A POSTROUTING -s fd00:17::/64 -j MASQUERADE"),
        "{v6}"
    );
}

#[test]
fn cleanup_removes_upstream_iptables_mode_chains_only() {
    let c = Cluster::new();
    program_upstream(&c);
    let (ok, err) = c.run_proxy(&["--cleanup"]);
    assert!(ok, "{err}");
    assert!(err.contains("iptables-nft table ip nat"), "{err}");
    assert!(err.contains("iptables-nft table ip filter"), "{err}");
    assert!(err.contains("iptables-nft table ip6 nat"), "{err}");
    assert_only_foreign_left(&c);
    // A second run finds nothing of upstream's.
    let (ok, err) = c.run_proxy(&["--cleanup"]);
    assert!(ok && !err.contains("iptables-nft table"), "{err}");
}

/// The same leftovers in legacy x_tables (`iptables-legacy-restore`): removed through the
/// x_tables socket options, each table replaced in one go.
#[test]
fn cleanup_removes_upstream_chains_from_legacy_x_tables() {
    let c = Cluster::new();
    program_upstream_with(&c, "legacy");
    let (ok, err) = c.run_proxy(&["--cleanup"]);
    assert!(ok, "{err}");
    for t in ["ip nat", "ip filter", "ip mangle", "ip6 nat"] {
        assert!(
            err.contains(&format!("iptables-legacy table {t}")),
            "{t}: {err}"
        );
    }
    assert_only_foreign_left_in(&c, "legacy");
    // The rewritten tables still work: iptables-legacy can edit them.
    c.node
        .sh("iptables-legacy -t nat -A FOREIGN-NAT -d 198.51.100.2/32 -j RETURN");
    let (ok, err) = c.run_proxy(&["--cleanup"]);
    assert!(ok && !err.contains("iptables-legacy table"), "{err}");
}

#[test]
fn starting_over_upstream_iptables_mode_keeps_established_connections() {
    switch_keeps_established_connections("nft");
}

/// The same over upstream's rules in legacy x_tables (`iptables-legacy`).
#[test]
fn starting_over_upstream_iptables_legacy_keeps_established_connections() {
    switch_keeps_established_connections("legacy");
}

fn switch_keeps_established_connections(flavour: &str) {
    let c = scenario::web_cluster(Backends::default());
    program_upstream_with(&c, flavour);
    // Upstream's rules serve the Service now: only the local endpoint.
    let before = tcp_probes(&c.pods[1], sa("10.96.0.10", 80), 5);
    assert_eq!(
        names(&before),
        ["local"].map(String::from).into(),
        "{before:?}"
    );
    let mut conn = OpenConn::open(&c.pods[1], sa("10.96.0.10", 80));
    assert_eq!(conn.greeting.name(), Some("local"));
    let d = c.start_daemon(
        &scenario::web_yaml_with("", &[LOCAL_EP, REMOTE_EP], false),
        &[],
    );
    assert!(
        d.log_text()
            .contains(r#""removed a leftover" mode="upstream kube-proxy""#),
        "{}",
        d.log_text()
    );
    assert_only_foreign_left_in(&c, flavour);
    std::thread::sleep(Duration::from_millis(200));
    assert_eq!(
        conn.echo("through the switch").unwrap(),
        "through the switch"
    );
    let after = tcp_probes(&c.pods[1], sa("10.96.0.10", 80), 30);
    assert_eq!(
        names(&after),
        ["local", "remote"].map(String::from).into(),
        "ours now: {after:?}"
    );
}

/// IPVS mode's leftovers: its ipsets (made with the real `ipset`), referenced from its
/// iptables-nft rules; a foreign set referenced by a foreign rule stays.
#[test]
fn cleanup_removes_upstream_ipvs_mode_ipsets_after_their_rules() {
    let c = Cluster::new();
    for cmd in [
        "ipset create KUBE-CLUSTER-IP hash:ip,port",
        "ipset create KUBE-LOOP-BACK hash:ip,port,ip",
        "ipset create KUBE-NODE-PORT-TCP bitmap:port range 0-65535",
        "ipset create KUBE-6-CLUSTER-IP hash:ip,port family inet6",
        "ipset add KUBE-CLUSTER-IP 10.96.0.10,tcp:80",
        "ipset create cali40all-hosts hash:ip",
    ] {
        c.node.sh(cmd);
    }
    let rules = c.dir.join("ipvs-v4.rules");
    std::fs::write(
        &rules,
        "*nat\n:PREROUTING ACCEPT [0:0]\n:OUTPUT ACCEPT [0:0]\n:POSTROUTING ACCEPT [0:0]\n:KUBE-SERVICES - [0:0]\n:KUBE-MARK-MASQ - [0:0]\n:KUBE-NODE-PORT - [0:0]\n:KUBE-LOAD-BALANCER - [0:0]\n-A PREROUTING -m comment --comment \"kubernetes service portals\" -j KUBE-SERVICES\n-A OUTPUT -m comment --comment \"kubernetes service portals\" -j KUBE-SERVICES\n-A POSTROUTING -m set --match-set cali40all-hosts dst -j RETURN\n-A KUBE-SERVICES ! -s 10.244.0.0/16 -m comment --comment \"Kubernetes service cluster ip + port for masquerade purpose\" -m set --match-set KUBE-CLUSTER-IP dst,dst -j KUBE-MARK-MASQ\n-A KUBE-SERVICES -m addrtype --dst-type LOCAL -j KUBE-NODE-PORT\n-A KUBE-NODE-PORT -p tcp -m comment --comment \"Kubernetes nodeport TCP port for masquerade purpose\" -m set --match-set KUBE-NODE-PORT-TCP dst -j KUBE-MARK-MASQ\n-A KUBE-MARK-MASQ -j MARK --set-xmark 0x4000/0x4000\nCOMMIT\n",
    )
    .unwrap();
    c.node
        .sh(&format!("iptables-nft-restore < {}", rules.display()));
    let (ok, err) = c.run_proxy(&["--cleanup"]);
    assert!(ok, "{err}");
    let sets = c.node.sh("ipset list -n");
    assert_eq!(sets.trim(), "cali40all-hosts", "{sets}\n{err}");
    for set in [
        "KUBE-CLUSTER-IP",
        "KUBE-LOOP-BACK",
        "KUBE-NODE-PORT-TCP",
        "KUBE-6-CLUSTER-IP",
    ] {
        assert!(err.contains(&format!("ipset {set}")), "{set}: {err}");
    }
    let saved = c.node.sh("iptables-nft-save");
    assert!(
        saved.contains("-A POSTROUTING -m set --match-set cali40all-hosts dst -j RETURN"),
        "{saved}"
    );
    assert!(!saved.contains("KUBE-"), "{saved}");
}

/// Issue #50.3, the x_tables rewriter proven: random legacy tables (filter, nat, mangle, in
/// both families) mixing upstream's chains, jumps and gotos with kubelet's and other
/// programs' chains, rules, matches, targets and counters, laid down by
/// `iptables-legacy-restore -c`; after `--cleanup`, `iptables-legacy-save -c` equals the
/// input with only upstream's chains and the rules jumping into them removed
/// ([`xtables_gen::expected_after_cleanup`], which reads the saved text without our code),
/// counters included. `KNP_XTABLES_CASES` cases (default 200, CI's; thousands by hand) from
/// `KNP_XTABLES_SEED` (default 1); a failure names its seed.
#[test]
fn the_legacy_rewriter_removes_only_upstreams_chains_with_counters_kept() {
    use netlink_tests::xtables_gen::{self, Family, Rng};
    let env = |name: &str, default: u64| {
        std::env::var(name)
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(default)
    };
    let (cases, first) = (env("KNP_XTABLES_CASES", 200), env("KNP_XTABLES_SEED", 1));
    // A namespace with loopback alone: no packet moves a counter while a case runs (a
    // cluster's node namespace sends IPv6 neighbour discovery now and then).
    let ns = netlink_tests::ns::NetNs::new("xtprop");
    let dir = std::env::temp_dir().join(&ns.name);
    std::fs::create_dir_all(&dir).unwrap();
    let proxy = netlink_tests::cluster::proxy_bin();
    let (mut chains_removed, mut unchanged) = (0usize, 0usize);
    for seed in first..first + cases {
        let mut rng = Rng::new(seed);
        let tools = ["iptables", "ip6tables"];
        for (family, tool) in [Family::V4, Family::V6].into_iter().zip(tools) {
            let file = dir.join(format!("random-{tool}.rules"));
            std::fs::write(&file, xtables_gen::random_ruleset(&mut rng, family)).unwrap();
        }
        // One shell per step: a case is four iptables runs and ours.
        let restore = tools
            .map(|t| {
                format!(
                    "{t}-legacy-restore -c < {}",
                    dir.join(format!("random-{t}.rules")).display()
                )
            })
            .join(" && ");
        ns.sh(&restore);
        let save = || -> Vec<String> {
            ns.sh("iptables-legacy-save -c && echo '#split' && ip6tables-legacy-save -c")
                .split("#split\n")
                .map(xtables_gen::without_comments)
                .collect()
        };
        let before = save();
        let out = ns.output(proxy.to_str().unwrap(), &["--cleanup"]);
        assert!(
            out.status.success(),
            "seed {seed}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        for ((tool, saved), after) in tools.iter().zip(&before).zip(save()) {
            let want = xtables_gen::expected_after_cleanup(saved);
            assert_eq!(
                after, want,
                "seed {seed}, {tool}: the tables after --cleanup (left) and the input without upstream's chains (right); input:\n{saved}"
            );
            if after == *saved {
                unchanged += 1;
            } else {
                chains_removed += 1;
            }
        }
    }
    eprintln!("{cases} cases: {chains_removed} rulesets rewritten, {unchanged} without upstream's chains left as they were");
    assert!(
        chains_removed > cases as usize,
        "most rulesets hold upstream's chains"
    );
    assert!(
        cases < 30 || unchanged > 0,
        "some rulesets hold none of upstream's chains"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}
