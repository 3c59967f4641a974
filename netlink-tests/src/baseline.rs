//! Baseline rulesets for the benchmark harness, as text for the test-time tools: upstream
//! nftables mode's layout (`nft -f`) and upstream iptables mode's layout
//! (`iptables-restore`). Both describe the same Services as our synthetic state: service i has
//! ClusterIP 10.96.0.0 + i, port 80/TCP, and endpoints 10.244.0.0 + i*eps + j, port 8080.

use std::fmt::Write;

pub use kube_nlproxy::model::fixtures::{cluster_ip, endpoint_ip};

/// Upstream nftables mode: a chain per service and per endpoint, an anonymous
/// `numgen random mod N vmap` per service (KEP-3866 layout as of 1.33).
pub fn upstream_nft(services: usize, eps: usize) -> String {
    let t = "ip kube-proxy";
    let mut s = String::new();
    writeln!(s, "add table {t} {{ comment \"rules for kube-proxy\" ; }}").unwrap();
    for (c, spec) in [
        (
            "nat-prerouting",
            "{ type nat hook prerouting priority -100 ; }",
        ),
        ("nat-output", "{ type nat hook output priority -100 ; }"),
        (
            "nat-postrouting",
            "{ type nat hook postrouting priority 100 ; }",
        ),
        ("services", ""),
        ("masquerading", ""),
        ("mark-for-masquerade", ""),
    ] {
        writeln!(s, "add chain {t} {c} {spec}").unwrap();
    }
    writeln!(
        s,
        "add map {t} service-ips {{ type ipv4_addr . inet_proto . inet_service : verdict ; }}"
    )
    .unwrap();
    writeln!(s, "add rule {t} nat-prerouting jump services").unwrap();
    writeln!(s, "add rule {t} nat-output jump services").unwrap();
    writeln!(s, "add rule {t} nat-postrouting jump masquerading").unwrap();
    writeln!(
        s,
        "add rule {t} mark-for-masquerade meta mark set meta mark | 0x4000"
    )
    .unwrap();
    writeln!(
        s,
        "add rule {t} masquerading meta mark & 0x4000 == 0 return"
    )
    .unwrap();
    writeln!(
        s,
        "add rule {t} masquerading meta mark set meta mark ^ 0x4000"
    )
    .unwrap();
    writeln!(s, "add rule {t} masquerading masquerade fully-random").unwrap();
    writeln!(
        s,
        "add rule {t} services ip daddr . meta l4proto . th dport vmap @service-ips"
    )
    .unwrap();
    for i in 0..services {
        let svc = format!("service-{i:08}-ns/svc-{i}/tcp/http");
        writeln!(s, "add chain {t} {svc}").unwrap();
        writeln!(
            s,
            "add rule {t} {svc} ip daddr {} ip saddr != 10.244.0.0/16 jump mark-for-masquerade",
            cluster_ip(i)
        )
        .unwrap();
        let mut vmap = Vec::new();
        for j in 0..eps {
            let ep = endpoint_ip(i, j, eps);
            let c = format!("endpoint-{i:08}-ns/svc-{i}/tcp/http__{ep}/8080");
            writeln!(s, "add chain {t} {c}").unwrap();
            writeln!(s, "add rule {t} {c} ip saddr {ep} jump mark-for-masquerade").unwrap();
            writeln!(s, "add rule {t} {c} meta l4proto tcp dnat to {ep}:8080").unwrap();
            vmap.push(format!("{j} : goto {c}"));
        }
        writeln!(
            s,
            "add rule {t} {svc} numgen random mod {eps} vmap {{ {} }}",
            vmap.join(", ")
        )
        .unwrap();
        writeln!(
            s,
            "add element {t} service-ips {{ {} . tcp . 80 : goto {svc} }}",
            cluster_ip(i)
        )
        .unwrap();
    }
    s
}

/// Upstream iptables mode (nat table): KUBE-SERVICES, KUBE-SVC-* with `statistic` cascades,
/// KUBE-SEP-* with hairpin mark and DNAT.
pub fn upstream_iptables(services: usize, eps: usize) -> String {
    let mut s = String::from("*nat\n:PREROUTING ACCEPT [0:0]\n:INPUT ACCEPT [0:0]\n:OUTPUT ACCEPT [0:0]\n:POSTROUTING ACCEPT [0:0]\n:KUBE-SERVICES - [0:0]\n:KUBE-MARK-MASQ - [0:0]\n:KUBE-POSTROUTING - [0:0]\n");
    for i in 0..services {
        writeln!(s, ":KUBE-SVC-{i:016X} - [0:0]").unwrap();
        for j in 0..eps {
            writeln!(s, ":KUBE-SEP-{i:012X}{j:04X} - [0:0]").unwrap();
        }
    }
    s.push_str("-A PREROUTING -j KUBE-SERVICES\n-A OUTPUT -j KUBE-SERVICES\n-A POSTROUTING -j KUBE-POSTROUTING\n");
    s.push_str("-A KUBE-MARK-MASQ -j MARK --set-xmark 0x4000/0x4000\n");
    s.push_str("-A KUBE-POSTROUTING -m mark ! --mark 0x4000/0x4000 -j RETURN\n-A KUBE-POSTROUTING -j MARK --set-xmark 0x4000/0x0\n-A KUBE-POSTROUTING -j MASQUERADE --random-fully\n");
    for i in 0..services {
        let cip = cluster_ip(i);
        writeln!(
            s,
            "-A KUBE-SERVICES -d {cip}/32 -p tcp -m tcp --dport 80 -j KUBE-SVC-{i:016X}"
        )
        .unwrap();
        writeln!(s, "-A KUBE-SVC-{i:016X} -d {cip}/32 -p tcp -m tcp --dport 80 ! -s 10.244.0.0/16 -j KUBE-MARK-MASQ").unwrap();
        for j in 0..eps {
            let sep = format!("KUBE-SEP-{i:012X}{j:04X}");
            if j + 1 < eps {
                let p = 1.0 / (eps - j) as f64;
                writeln!(s, "-A KUBE-SVC-{i:016X} -m statistic --mode random --probability {p:.11} -j {sep}").unwrap();
            } else {
                writeln!(s, "-A KUBE-SVC-{i:016X} -j {sep}").unwrap();
            }
            let ep = endpoint_ip(i, j, eps);
            writeln!(s, "-A {sep} -s {ep}/32 -j KUBE-MARK-MASQ").unwrap();
            writeln!(
                s,
                "-A {sep} -p tcp -m tcp -j DNAT --to-destination {ep}:8080"
            )
            .unwrap();
        }
    }
    s.push_str("COMMIT\n");
    s
}
