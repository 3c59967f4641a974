//! Configuration tests: upstream's options_test.go tables (TestLoadConfig,
//! TestProcessV1Alpha1Flags, TestOptionsComplete, TestProcessHostnameOverrideFlag,
//! TestAddressFromDeprecatedFlags) and the exact inputs of real installers
//! (../shared/reference/installers.md). Pure.

use std::path::PathBuf;
use std::time::Duration;

use super::*;

fn run(args: &[&str]) -> Result<Config, ConfigError> {
    let mut v = vec!["--hostname-override", "n"];
    v.extend(args);
    Config::from_flag_list(&v)
}

fn with_file(text: &str, args: &[&str]) -> Result<Config, ConfigError> {
    let mut v = vec!["--hostname-override", "n"];
    v.extend(args);
    let p = flags::parse(&v).map_err(|e| bad("command line", e.0))?;
    Config::from_parsed_with(
        &p,
        Some((PathBuf::from("kp.yaml"), text.as_bytes().to_vec())),
    )
}

const HEAD: &str = "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\n";

/// TestLoadConfig's template.
fn load_config_yaml(mode: &str, bind: &str, cidr: &str, healthz: &str, metrics: &str) -> String {
    format!(
        r#"apiVersion: kubeproxy.config.k8s.io/v1alpha1
bindAddress: {bind}
clientConnection:
  acceptContentTypes: "abc"
  burst: 100
  contentType: content-type
  kubeconfig: "/path/to/kubeconfig"
  qps: 7
clusterCIDR: "{cidr}"
configSyncPeriod: 15s
conntrack:
  maxPerCore: 2
  min: 1
  tcpCloseWaitTimeout: 10s
  tcpEstablishedTimeout: 20s
healthzBindAddress: "{healthz}"
hostnameOverride: "foo"
iptables:
  masqueradeAll: true
  masqueradeBit: 17
  minSyncPeriod: 10s
  syncPeriod: 60s
  localhostNodePorts: true
ipvs:
  minSyncPeriod: 10s
  syncPeriod: 60s
  excludeCIDRs:
    - "10.20.30.40/16"
    - "fd00:1::0/64"
nftables:
  masqueradeAll: true
  masqueradeBit: 18
  minSyncPeriod: 10s
  syncPeriod: 60s
kind: KubeProxyConfiguration
metricsBindAddress: "{metrics}"
mode: "{mode}"
oomScoreAdj: 17
portRange: "2-7"
detectLocalMode: "ClusterCIDR"
detectLocal:
  bridgeInterface: "cbr0"
  interfaceNamePrefix: "veth"
nodePortAddresses:
  - "10.20.30.40/16"
  - "fd00:1::0/64"
"#
    )
}

#[test]
fn upstream_load_config_rows() {
    for (name, mode, bind, cidr, healthz, metrics, extra) in [
        (
            "iptables v4 zeros",
            "iptables",
            "0.0.0.0",
            "1.2.3.0/24",
            "1.2.3.4:12345",
            "2.3.4.5:23456",
            "",
        ),
        (
            "iptables v4",
            "iptables",
            "9.8.7.6",
            "1.2.3.0/24",
            "1.2.3.4:12345",
            "2.3.4.5:23456",
            "",
        ),
        (
            "v6 ::",
            "iptables",
            "\"::\"",
            "fd00:1::0/64",
            "[fd00:1::5]:12345",
            "[fd00:2::5]:23456",
            "",
        ),
        (
            "v6 [::]",
            "iptables",
            "\"[::]\"",
            "fd00:1::0/64",
            "[fd00:1::5]:12345",
            "[fd00:2::5]:23456",
            "",
        ),
        (
            "v6 ::0",
            "iptables",
            "::0",
            "fd00:1::0/64",
            "[fd00:1::5]:12345",
            "[fd00:2::5]:23456",
            "",
        ),
        (
            "ipvs v6",
            "ipvs",
            "2001:db8::1",
            "fd00:1::0/64",
            "[fd00:1::5]:12345",
            "[fd00:2::5]:23456",
            "",
        ),
        (
            "unknown field",
            "iptables",
            "9.8.7.6",
            "1.2.3.0/24",
            "1.2.3.4:12345",
            "2.3.4.5:23456",
            "foo: bar",
        ),
        (
            "duplicate field",
            "iptables",
            "9.8.7.6",
            "1.2.3.0/24",
            "1.2.3.4:12345",
            "2.3.4.5:23456",
            "bindAddress: 9.8.7.6",
        ),
    ] {
        let text = format!(
            "{}\n{extra}",
            load_config_yaml(mode, bind, cidr, healthz, metrics)
        );
        let d = decode::decode(&text).unwrap_or_else(|e| panic!("{name}: {e:?}"));
        assert_eq!(d.strict_errors.is_empty(), extra.is_empty(), "{name}");
        let mut v = d.config;
        v1alpha1::set_defaults(&mut v);
        let k = KubeProxyConfig::from_v1alpha1(&v);
        // upstream's `expected` object, field by field
        assert_eq!(k.bind_address, bind.trim_matches('"'), "{name}");
        assert_eq!(k.client_connection.accept_content_types, "abc");
        assert_eq!(k.client_connection.burst, 100);
        assert_eq!(k.client_connection.content_type, "content-type");
        assert_eq!(k.client_connection.kubeconfig, "/path/to/kubeconfig");
        assert_eq!(k.client_connection.qps, 7.0);
        assert_eq!(k.min_sync_period, GoDuration::secs(10), "{name}");
        assert_eq!(k.sync_period, GoDuration::secs(60), "{name}");
        assert_eq!(k.config_sync_period, GoDuration::secs(15));
        assert_eq!(k.conntrack.max_per_core, Some(2));
        assert_eq!(k.conntrack.min, Some(1));
        assert_eq!(
            k.conntrack.tcp_close_wait_timeout,
            Some(GoDuration::secs(10))
        );
        assert_eq!(
            k.conntrack.tcp_established_timeout,
            Some(GoDuration::secs(20))
        );
        assert!(k.masquerade_all);
        assert_eq!(k.oom_score_adj, Some(17));
        assert_eq!(k.healthz_bind_address, healthz);
        assert_eq!(k.metrics_bind_address, metrics);
        assert_eq!(k.hostname_override, "foo");
        assert_eq!(k.iptables.masquerade_bit, Some(17));
        assert_eq!(k.iptables.localhost_node_ports, Some(true));
        assert_eq!(
            k.ipvs.exclude_cidrs,
            Some(vec!["10.20.30.40/16".to_string(), "fd00:1::0/64".into()])
        );
        assert_eq!(k.nftables_masquerade_bit, Some(18));
        assert_eq!(k.mode, mode);
        assert_eq!(
            k.node_port_addresses,
            Some(vec!["10.20.30.40/16".to_string(), "fd00:1::0/64".into()])
        );
        assert_eq!(k.detect_local_mode, "ClusterCIDR");
        assert_eq!(k.detect_local.bridge_interface, "cbr0");
        assert_eq!(k.detect_local.cluster_cidrs, vec![cidr.to_string()]);
        assert_eq!(k.detect_local.interface_name_prefix, "veth");
        assert_eq!(k.logging.format, "text");
        assert_eq!(k.logging.flush_frequency.duration, GoDuration::secs(5));
        assert_eq!(k.port_range, "2-7");
        // and the whole pipeline starts with it, except "[::]", which upstream's loader
        // takes and its validation refuses (ParseIPSloppy("[::]") fails)
        if bind == "\"[::]\"" {
            let e = with_file(&text, &[]).unwrap_err().to_string();
            assert!(e.contains("field bindAddress"), "{e}");
            continue;
        }
        let c = with_file(&text, &[]).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(c.node_name, "n", "--hostname-override wins over the file");
        assert_eq!(
            c.warnings.is_empty(),
            extra.is_empty(),
            "{name}: {:?}",
            c.warnings
        );
    }
}

#[test]
fn upstream_process_v1alpha1_flags_rows() {
    let sp = |args: &[&str]| {
        let c = run(args).unwrap();
        (c.sync_period, c.min_sync_period)
    };
    let s = Duration::from_secs;
    assert_eq!(
        sp(&[
            "--iptables-sync-period=36s",
            "--iptables-min-sync-period=3s",
            "--proxy-mode=iptables"
        ]),
        (s(36), s(3))
    );
    assert_eq!(
        sp(&[
            "--iptables-sync-period=36s",
            "--iptables-min-sync-period=3s",
            "--ipvs-sync-period=16s",
            "--ipvs-min-sync-period=7s",
            "--proxy-mode=iptables"
        ]),
        (s(36), s(3))
    );
    assert_eq!(
        sp(&[
            "--iptables-sync-period=36s",
            "--iptables-min-sync-period=3s",
            "--ipvs-sync-period=16s",
            "--ipvs-min-sync-period=7s",
            "--proxy-mode=ipvs"
        ]),
        (s(16), s(7))
    );
    assert_eq!(
        sp(&[
            "--ipvs-sync-period=16s",
            "--ipvs-min-sync-period=7s",
            "--proxy-mode=ipvs"
        ]),
        (s(16), s(7))
    );
    // nftables mode takes the iptables flags too (upstream: "mode != ipvs").
    assert_eq!(
        sp(&["--iptables-sync-period=36s", "--proxy-mode=nftables"]),
        (s(36), s(1))
    );
    let c = run(&["--cluster-cidr=2002:0:0:1234::/64,10.0.0.0/14"]).unwrap();
    assert_eq!(
        c.upstream.detect_local.cluster_cidrs,
        vec!["2002:0:0:1234::/64", "10.0.0.0/14"]
    );
}

#[test]
fn upstream_options_complete_rows() {
    let logging = format!(
        "{HEAD}logging:\n  format: json\n  flushFrequency: 1s\n  verbosity: 10\n  vmodule:\n  - filePattern: foo.go\n    verbosity: 6\n  - filePattern: bar.go\n    verbosity: 8\n"
    );
    let empty = run(&[]).unwrap().upstream;
    // "conntrack": zeros from flags stay zeros
    let c = run(&[
        "--conntrack-max-per-core=0",
        "--conntrack-min=0",
        "--conntrack-tcp-timeout-established=0",
        "--conntrack-tcp-timeout-close-wait=0",
    ])
    .unwrap();
    assert_eq!(c.upstream.conntrack.max_per_core, Some(0));
    assert_eq!(c.upstream.conntrack.min, Some(0));
    assert_eq!(
        c.upstream.conntrack.tcp_established_timeout,
        Some(GoDuration(0))
    );
    assert_eq!(
        c.upstream.conntrack.tcp_close_wait_timeout,
        Some(GoDuration(0))
    );
    assert_eq!(c.conntrack.max_per_core, Some(0));
    assert_eq!(
        c.conntrack.tcp_established_timeout, None,
        "0 leaves the kernel's"
    );
    // "empty-config" equals no config at all
    let e = with_file(HEAD, &[]).unwrap().upstream;
    assert_eq!(e, empty);
    // "logging-config"
    let l = with_file(&logging, &[]).unwrap();
    assert_eq!(l.upstream.logging.format, "json");
    assert_eq!(l.upstream.logging.verbosity, 10);
    assert_eq!(l.upstream.logging.vmodule.len(), 2);
    assert!(l.json_logs);
    // "flags"
    let f = run(&["-v=7", "--vmodule", "goo.go=8"]).unwrap();
    assert_eq!(f.upstream.logging.verbosity, 7);
    assert_eq!(f.upstream.logging.vmodule[0].file_pattern, "goo.go");
    // "both": the flag wins, vmodule merged flags first, --ipvs-scheduler overwritten by
    // the file.
    let b = with_file(
        &logging,
        &[
            "-v=7",
            "--vmodule",
            "goo.go=8",
            "--ipvs-scheduler",
            "some-scheduler",
        ],
    )
    .unwrap();
    assert_eq!(b.upstream.logging.verbosity, 7);
    let pats: Vec<_> = b
        .upstream
        .logging
        .vmodule
        .iter()
        .map(|v| v.file_pattern.as_str())
        .collect();
    assert_eq!(pats, ["goo.go", "foo.go", "bar.go"]);
    assert_eq!(b.upstream.ipvs.scheduler, "");
    assert!(
        b.warnings
            .iter()
            .any(|w| w.starts_with("--ipvs-scheduler is ignored")),
        "{:?}",
        b.warnings
    );
}

#[test]
fn upstream_hostname_override_rows() {
    let file = format!("{HEAD}hostnameOverride: foo\n");
    let p = |args: &[&str]| {
        let p = flags::parse(args).unwrap();
        Config::from_parsed_with(
            &p,
            Some((PathBuf::from("kp.yaml"), file.as_bytes().to_vec())),
        )
    };
    assert_eq!(p(&[]).unwrap().node_name, "foo");
    assert_eq!(
        p(&["--hostname-override", "  bar "]).unwrap().node_name,
        "bar"
    );
    assert!(p(&["--hostname-override", "   "]).is_err());
    assert_eq!(
        p(&["--hostname-override", "Node1"]).unwrap().node_name,
        "node1"
    );
}

#[test]
fn deprecated_ports_and_bare_bind_addresses() {
    let a = |args: &[&str]| {
        let c = run(args).unwrap();
        (
            c.healthz_bind_address.map(|a| a.to_string()),
            c.metrics_bind_address.map(|a| a.to_string()),
        )
    };
    assert_eq!(
        a(&[]),
        (Some("0.0.0.0:10256".into()), Some("127.0.0.1:10249".into()))
    );
    // k3s: a bare IP gets the default port
    assert_eq!(
        a(&["--healthz-bind-address=127.0.0.1"]).0,
        Some("127.0.0.1:10256".into())
    );
    assert_eq!(
        a(&["--healthz-bind-address=fd00:1::5", "--healthz-port=12345"]).0,
        Some("[fd00:1::5]:12345".into())
    );
    assert_eq!(
        a(&[
            "--healthz-bind-address=1.2.3.4:12345",
            "--healthz-port=23456"
        ])
        .0,
        Some("1.2.3.4:12345".into())
    );
    assert_eq!(a(&["--healthz-port=0"]).0, None, "port 0 disables");
    assert_eq!(a(&["--metrics-port=0"]).1, None);
    assert_eq!(a(&["--healthz-bind-address="]).0, None, "empty disables");
    assert_eq!(a(&["--metrics-bind-address", ""]).1, None);
    let c = run(&["--healthz-port=9"]).unwrap();
    assert!(c
        .warnings
        .iter()
        .any(|w| w.contains("--healthz-port is deprecated")));
    // a v6 bind address moves the defaults only in the file (flags come after defaulting)
    let c = with_file(&format!("{HEAD}bindAddress: \"::\"\n"), &[]).unwrap();
    assert_eq!(c.healthz_bind_address.unwrap().to_string(), "[::]:10256");
    assert_eq!(c.metrics_bind_address.unwrap().to_string(), "[::1]:10249");
}

#[test]
fn errors_name_the_flag_or_the_file_field() {
    for (args, what) in [
        (
            &["--iptables-masquerade-bit=40"][..],
            "invalid --iptables-masquerade-bit: 40",
        ),
        (&["--masquerade-bit=32"], "invalid --masquerade-bit"),
        (&["--proxy-mode=kernelspace"], "invalid --proxy-mode"),
        (&["--cluster-cidr=10.0.0.0/99"], "invalid --cluster-cidr"),
        (
            &["--iptables-sync-period=0s"],
            "invalid --iptables-sync-period",
        ),
        (
            &["--iptables-min-sync-period=1m"],
            "invalid --iptables-sync-period",
        ),
        (&["--sync-period=0s"], "invalid --sync-period"),
        (&["--oom-score-adj=1001"], "invalid --oom-score-adj"),
        (
            &["--nodeport-addresses=primary,foo"],
            "invalid --nodeport-addresses",
        ),
        (
            &["--detect-local-mode=BridgeInterface"],
            "invalid --pod-bridge-interface",
        ),
        (
            &["--metrics-bind-address=1.2.3.4:99999"],
            "invalid command line",
        ),
        (
            &["--proxy-mode=ipvs", "--ipvs-scheduler=fastest"],
            "invalid --ipvs-scheduler",
        ),
        (&["--logging-format=xml"], "invalid --logging-format"),
        (&["--config-sync-period=0s"], "invalid --config-sync-period"),
        (&["--master=api:6443"], "invalid --master"),
        (&["--nftables-table=a b"], "invalid --nftables-table"),
        (&["--bind-address=1.2.3.4:5"], "invalid command line"),
    ] {
        let e = run(args).unwrap_err().to_string();
        assert!(e.starts_with(what), "{args:?}: {e}");
        assert!(!e.contains('\n'), "one line: {e}");
    }
    for (body, what) in [
        (
            "iptables: {masqueradeBit: 40}",
            "invalid config file kp.yaml field iptables.masqueradeBit: 40",
        ),
        (
            "mode: nftables\nnftables: {masqueradeBit: 32}",
            "field nftables.masqueradeBit",
        ),
        (
            "mode: ipvs\nipvs: {syncPeriod: -1s}",
            "field ipvs.syncPeriod",
        ),
        ("conntrack: {min: -1}", "field conntrack.min"),
        ("mode: bpf", "field mode"),
        ("clusterCIDR: 10.0.0.0/8,11.0.0.0/8", "field clusterCIDR"),
        ("healthzBindAddress: 1.2.3.4:x", "field healthzBindAddress"),
        (
            "nodePortAddresses: [all, all]",
            "field nodePortAddresses[1]",
        ),
        (
            "iptables: {masqueradeBit: x}",
            "field iptables.masqueradeBit",
        ),
    ] {
        let e = with_file(&format!("{HEAD}{body}\n"), &[])
            .unwrap_err()
            .to_string();
        assert!(e.contains(what), "{body}: {e}");
    }
}

#[test]
fn modes_map_onto_our_engines() {
    let c = run(&[]).unwrap();
    assert_eq!(
        (c.mode, c.requested_mode.as_str()),
        (ProxyMode::Nftables, "iptables")
    );
    assert!(
        c.notices[0].contains("no proxy mode specified"),
        "{:?}",
        c.notices
    );
    let c = run(&["--proxy-mode=iptables"]).unwrap();
    assert_eq!(c.mode, ProxyMode::Nftables);
    assert!(c.notices[0].contains("proxy mode iptables"));
    assert!(
        !c.localhost_listeners.is_empty(),
        "iptables mode: localhostNodePorts defaults to true"
    );
    assert_eq!(c.proxier.nodeport_addresses, NodePortAddresses::all());
    let c = run(&[
        "--proxy-mode=iptables",
        "--iptables-localhost-nodeports=false",
    ])
    .unwrap();
    assert!(c.localhost_listeners.is_empty());
    let c = run(&[
        "--proxy-mode=iptables",
        "--nodeport-addresses=192.168.0.0/16",
    ])
    .unwrap();
    assert!(c.localhost_listeners.is_empty(), "127.0.0.1 not covered");
    let c = run(&["--proxy-mode=nftables"]).unwrap();
    assert_eq!((c.mode, c.notices.len()), (ProxyMode::Nftables, 0));
    assert!(c.localhost_listeners.is_empty());
    assert_eq!(
        c.proxier.nodeport_addresses,
        NodePortAddresses::primary(),
        "nftables default"
    );
    let c = run(&[
        "--proxy-mode=nftables",
        "--nodeport-addresses=primary,localhost",
        "--feature-gates=KubeProxyNFTablesLocalhostNodePorts=true",
    ])
    .unwrap();
    assert!(!c.localhost_listeners.is_empty());
    assert!(c.warnings.is_empty(), "{:?}", c.warnings);
    assert_eq!(run(&["--proxy-mode=ipvs"]).unwrap().mode, ProxyMode::Ipvs);
    assert_eq!(
        run(&["--proxy-mode=userspace"]).unwrap().mode,
        ProxyMode::Userspace
    );
    // the masquerade bit of the mode's own section
    let file = format!("{HEAD}iptables: {{masqueradeBit: 5}}\nnftables: {{masqueradeBit: 9}}\n");
    assert_eq!(with_file(&file, &[]).unwrap().proxier.masquerade_bit, 5);
    let nft = format!("{file}mode: nftables\n");
    assert_eq!(with_file(&nft, &[]).unwrap().proxier.masquerade_bit, 9);
    let ipvs = format!("{file}mode: ipvs\n");
    assert_eq!(with_file(&ipvs, &[]).unwrap().proxier.masquerade_bit, 5);
    assert_eq!(
        with_file(&nft, &["--masquerade-bit=3"])
            .unwrap()
            .proxier
            .masquerade_bit,
        3
    );
    // masqueradeAll: nftables mode reads its own section, the others iptables'
    let m = format!("{HEAD}iptables: {{masqueradeAll: true}}\n");
    assert!(with_file(&m, &[]).unwrap().proxier.masquerade_all);
    assert!(
        with_file(&format!("{m}mode: ipvs\n"), &[])
            .unwrap()
            .proxier
            .masquerade_all
    );
    assert!(
        !with_file(&format!("{m}mode: nftables\n"), &[])
            .unwrap()
            .proxier
            .masquerade_all
    );
}

/// Upstream installs the INVALID drop in its iptables mode only (an empty mode is iptables);
/// the sysctl decides the rest at start.
#[test]
fn only_iptables_mode_asks_to_drop_invalid_packets() {
    for (args, want) in [
        (&[][..], true),
        (&["--proxy-mode=iptables"][..], true),
        (&["--proxy-mode=nftables"][..], false),
        (&["--proxy-mode=ipvs"][..], false),
        (&["--proxy-mode=userspace"][..], false),
    ] {
        assert_eq!(run(args).unwrap().proxier.drop_invalid, want, "{args:?}");
    }
}

#[test]
fn nodeport_address_keywords() {
    let np = |v: &str| {
        run(&["--nodeport-addresses", v])
            .unwrap()
            .proxier
            .nodeport_addresses
    };
    let n = np("primary,localhost,10.0.0.0/8");
    assert!(n.primary);
    assert_eq!(
        n.cidrs,
        ["127.0.0.0/8", "::1/128", "10.0.0.0/8"].map(|c| c.parse().unwrap())
    );
    assert_eq!(
        np("all").cidrs,
        ["0.0.0.0/0", "::/0"].map(|c| c.parse().unwrap())
    );
    assert_eq!(
        np("010.020.030.040/16").cidrs,
        ["10.20.0.0/16".parse().unwrap()]
    );
}

#[test]
fn flags_with_config_are_ignored_with_a_warning_but_ours_and_logging_apply() {
    let c = with_file(
        &format!("{HEAD}mode: ipvs\nipvs: {{scheduler: wlc, syncPeriod: 20s}}\n"),
        &[
            "--proxy-mode=nftables",
            "--masquerade-all",
            "-v=4",
            "--sync-period=45s",
            "--manifests=/m",
        ],
    )
    .unwrap();
    assert_eq!(c.mode, ProxyMode::Ipvs);
    assert!(!c.proxier.masquerade_all);
    assert_eq!(c.verbosity, 4);
    assert_eq!(c.sync_period, Duration::from_secs(45), "ours overrides");
    assert_eq!(c.manifests, Some(PathBuf::from("/m")));
    assert_eq!(c.ipvs.scheduler, "wlc");
    let ignored: Vec<_> = c
        .warnings
        .iter()
        .filter(|w| w.contains("is ignored"))
        .collect();
    assert_eq!(ignored.len(), 2, "{:?}", c.warnings);
}

#[test]
fn no_effect_flags_warn_once_each() {
    let c = run(&[
        "--kube-api-qps=20",
        "--kube-api-burst=30",
        "--profiling",
        "--logtostderr=false",
        "--alsologtostderr",
        "--log_file=/var/log/kube-proxy.log",
        "--log-flush-frequency=5s",
        "--vmodule=proxier*=4",
    ])
    .unwrap();
    assert_eq!(c.warnings.len(), 8, "{:#?}", c.warnings);
    assert!(c.warnings.iter().all(|w| w.contains("has no effect here")));
}

#[test]
fn write_config_round_trips_and_is_upstream_shaped() {
    let c = run(&[
        "--proxy-mode=ipvs",
        "--ipvs-scheduler=wlc",
        "--ipvs-sync-period=45s",
        "--ipvs-min-sync-period=250ms",
        "--ipvs-exclude-cidrs=10.200.0.0/16",
        "--cluster-cidr=10.244.0.0/16,fd00::/48",
        "--iptables-masquerade-bit=9",
        "--oom-score-adj=-500",
        "--conntrack-max-per-core=0",
        "--feature-gates=KubeProxyNFTablesLocalhostNodePorts=false",
    ])
    .unwrap();
    let text = c.to_yaml();
    for line in [
        "mode: ipvs\n",
        "  scheduler: wlc\n",
        "  syncPeriod: 45s\n",
        "  minSyncPeriod: 250ms\n",
        "  excludeCIDRs:\n  - 10.200.0.0/16\n",
        "clusterCIDR: 10.244.0.0/16,fd00::/48\n",
        "  masqueradeBit: 9\n",
        "oomScoreAdj: -500\n",
        "configSyncPeriod: 15m0s\n",
        "hostnameOverride: \"n\"\n", // YAML 1.1 reads a plain n as false
        "featureGates:\n  KubeProxyNFTablesLocalhostNodePorts: false\n",
        "  maxPerCore: 0\n",
        "  tcpEstablishedTimeout: 24h0m0s\n",
    ] {
        assert!(text.contains(line), "{line:?} in\n{text}");
    }
    assert!(!text.contains("tableName") && !text.contains("manifests"));
    let back = with_file(&text, &[]).unwrap();
    assert!(back.warnings.is_empty(), "{:?}", back.warnings);
    assert_eq!(back.to_yaml(), text);
    assert_eq!(back.ipvs, c.ipvs);
    assert_eq!(back.proxier, c.proxier);
    assert_eq!(
        (back.sync_period, back.min_sync_period),
        (c.sync_period, c.min_sync_period)
    );
}

/// kubeadm's ConfigMap as shipped (undefaulted v1alpha1) with kubeadm's command line.
#[test]
fn kubeadm_configmap_starts_with_upstreams_defaults() {
    let text = include_str!("file/testdata/kubeadm_config.conf");
    let p = flags::parse([
        "--config=/var/lib/kube-proxy/config.conf",
        "--hostname-override=node-1",
    ])
    .unwrap();
    let c = Config::from_parsed_with(
        &p,
        Some((
            "/var/lib/kube-proxy/config.conf".into(),
            text.as_bytes().to_vec(),
        )),
    )
    .unwrap();
    assert!(c.warnings.is_empty(), "{:?}", c.warnings);
    assert_eq!(c.node_name, "node-1");
    assert_eq!(c.mode, ProxyMode::Nftables);
    assert_eq!(c.requested_mode, "iptables");
    assert_eq!(
        c.kubeconfig,
        Some(PathBuf::from("/var/lib/kube-proxy/kubeconfig.conf"))
    );
    assert_eq!(c.oom_score_adj, -999);
    assert_eq!(c.config_sync_period, Duration::from_secs(900));
    assert_eq!(
        (c.sync_period, c.min_sync_period),
        (Duration::from_secs(30), Duration::from_secs(1))
    );
    assert_eq!(c.proxier.masquerade_bit, 14);
    assert_eq!(c.healthz_bind_address.unwrap().to_string(), "0.0.0.0:10256");
    assert_eq!(
        c.metrics_bind_address.unwrap().to_string(),
        "127.0.0.1:10249"
    );
    assert_eq!(c.conntrack.max_per_core, Some(32768));
    assert_eq!(c.conntrack.min, Some(131072));
    assert_eq!(
        c.conntrack.tcp_established_timeout,
        Some(Duration::from_secs(86400))
    );
    assert_eq!(
        c.conntrack.tcp_close_wait_timeout,
        Some(Duration::from_secs(3600))
    );
    assert!(!c.localhost_listeners.is_empty());
    assert_eq!(
        c.proxier.local_detector,
        LocalDetector::Cidrs(vec!["10.244.0.0/16".parse().unwrap()])
    );
    let text = c.to_yaml();
    for line in [
        "oomScoreAdj: -999\n",
        "configSyncPeriod: 15m0s\n",
        "  localhostNodePorts: true\n",
        "  syncPeriod: 30s\n",
        "mode: iptables\n",
    ] {
        assert!(text.contains(line), "{line:?} in\n{text}");
    }
}

/// k3s's kubeProxyArgs, as its agent passes them.
#[test]
fn k3s_command_line() {
    let c = Config::from_flag_list(&[
        "--healthz-bind-address=127.0.0.1",
        "--kubeconfig=/var/lib/rancher/k3s/agent/kubeproxy.kubeconfig",
        "--cluster-cidr=10.42.0.0/16",
        "--conntrack-max-per-core=0",
        "--conntrack-tcp-timeout-established=0s",
        "--conntrack-tcp-timeout-close-wait=0s",
        "--hostname-override=k3s-node",
        "--v=2",
        "--vmodule=proxier=4",
        "--log_file=/var/log/kube-proxy.log",
        "--alsologtostderr",
    ])
    .unwrap();
    assert_eq!(
        c.healthz_bind_address.unwrap().to_string(),
        "127.0.0.1:10256"
    );
    assert_eq!(c.conntrack.max_per_core, Some(0));
    assert_eq!(c.conntrack.tcp_established_timeout, None);
    assert_eq!(c.conntrack.tcp_close_wait_timeout, None);
    assert_eq!(c.node_name, "k3s-node");
    assert_eq!((c.verbosity, c.log_level), (2, "debug"));
    assert_eq!(c.mode, ProxyMode::Nftables);
}

/// kops's flag builder: booleans as --flag=true|false, --master, a mode.
#[test]
fn kops_command_line() {
    let c = Config::from_flag_list(&[
        "--cluster-cidr=100.96.0.0/11",
        "--conntrack-max-per-core=131072",
        "--hostname-override=ip-172-20-1-1.ec2.internal",
        "--kubeconfig=/var/lib/kube-proxy/kubeconfig",
        "--master=https://api.internal.example.k8s.local:443",
        "--oom-score-adj=-998",
        "--v=2",
        "--proxy-mode=iptables",
        "--masquerade-all=false",
    ])
    .unwrap();
    assert_eq!(
        c.master.as_deref(),
        Some("https://api.internal.example.k8s.local:443")
    );
    assert_eq!(c.oom_score_adj, -998);
    assert_eq!(c.conntrack.max_per_core, Some(131072));
    assert!(!c.proxier.masquerade_all);
    assert_eq!(c.mode, ProxyMode::Nftables);
}

/// kubespray's IPVS-mode file: masquerade settings in the iptables section.
#[test]
fn kubespray_ipvs_file() {
    let text = format!(
        "{HEAD}bindAddress: 0.0.0.0\nclientConnection:\n  acceptContentTypes: \"\"\n  burst: 10\n  contentType: application/vnd.kubernetes.protobuf\n  kubeconfig: /etc/kubernetes/kube-proxy-kubeconfig.yaml\n  qps: 5\nclusterCIDR: 10.233.64.0/18\nconfigSyncPeriod: 15m0s\nconntrack:\n  maxPerCore: 32768\n  min: 131072\n  tcpCloseWaitTimeout: 1h0m0s\n  tcpEstablishedTimeout: 24h0m0s\nenableProfiling: false\nhealthzBindAddress: 0.0.0.0:10256\nhostnameOverride: node1\niptables:\n  masqueradeAll: true\n  masqueradeBit: 14\n  minSyncPeriod: 0s\n  syncPeriod: 30s\nipvs:\n  excludeCIDRs: []\n  minSyncPeriod: 0s\n  scheduler: rr\n  strictARP: true\n  syncPeriod: 30s\n  tcpFinTimeout: 0s\n  tcpTimeout: 0s\n  udpTimeout: 0s\nmetricsBindAddress: 127.0.0.1:10249\nmode: ipvs\nnodePortAddresses: []\noomScoreAdj: -999\nportRange: \"\"\n"
    );
    let c = with_file(&text, &[]).unwrap();
    assert!(c.warnings.is_empty(), "{:?}", c.warnings);
    assert_eq!(c.mode, ProxyMode::Ipvs);
    assert!(c.proxier.masquerade_all);
    assert_eq!(c.proxier.masquerade_bit, 14);
    assert!(c.ipvs.strict_arp);
    assert_eq!(c.ipvs.scheduler, "rr");
    assert_eq!(c.min_sync_period, Duration::ZERO);
    assert_eq!(c.proxier.nodeport_addresses, NodePortAddresses::all());
    assert!(c.localhost_listeners.is_empty());
}

#[test]
fn version_names_the_commit_when_the_build_knew_it() {
    let v = env!("CARGO_PKG_VERSION");
    assert_eq!(
        super::version_text("0123456789abcdef0123456789abcdef01234567", false),
        format!("Kubernetes v1.37.2 (kube-nlproxy {v}, git commit 0123456789abcdef0123456789abcdef01234567, kube-proxy v1alpha1 configuration)\n")
    );
    assert_eq!(
        super::version_text("", false),
        format!("Kubernetes v1.37.2 (kube-nlproxy {v}, kube-proxy v1alpha1 configuration)\n")
    );
    // --version=raw: upstream's version.Info, as `kube-proxy --version=raw` of v1.37.2
    // prints it, with ours as GitVersion's build metadata.
    assert_eq!(
        super::version_text("0123456789abcdef0123456789abcdef01234567", true),
        format!(
            "version.Info{{Major:\"1\", Minor:\"37\", EmulationMajor:\"\", EmulationMinor:\"\", \
             MinCompatibilityMajor:\"\", MinCompatibilityMinor:\"\", GitVersion:\"v1.37.2+kube-nlproxy-{v}\", \
             GitCommit:\"0123456789abcdef0123456789abcdef01234567\", GitTreeState:\"\", BuildDate:\"\", \
             GoVersion:\"\", Compiler:\"rustc\", Platform:\"linux/amd64\"}}\n"
        )
    );
}

#[test]
fn help_and_version() {
    assert!(matches!(Config::from_args(["--help"]), Ok(Command::Help)));
    assert!(matches!(Config::from_args(["-h"]), Ok(Command::Help)));
    assert!(
        matches!(Config::from_args(["--version"]), Ok(Command::Print(t)) if t.starts_with("Kubernetes v1.37.2 (kube-nlproxy "))
    );
    assert!(matches!(
        Config::from_args(["--version=false", "--hostname-override=n"]),
        Ok(Command::Run(_))
    ));
}

#[test]
fn durations() {
    assert_eq!(parse_duration("30s").unwrap(), Duration::from_secs(30));
    assert_eq!(parse_duration("1m30s").unwrap(), Duration::from_secs(90));
    assert_eq!(parse_duration("250ms").unwrap(), Duration::from_millis(250));
    assert!(parse_duration("10").is_err());
    assert!(parse_duration("5x").is_err());
}

#[test]
fn unknown_feature_gate_is_an_error_naming_the_flag() {
    let e = Config::from_flag_list(&["--feature-gates=NoSuchGate=true"]).unwrap_err();
    assert_eq!(
        e.to_string(),
        "invalid --feature-gates: unrecognized feature gate: NoSuchGate"
    );
}

#[test]
fn locked_feature_gate_set_to_the_other_value_is_an_error() {
    let e = Config::from_flag_list(&["--feature-gates=PreferSameTrafficDistribution=false"])
        .unwrap_err();
    assert!(e.to_string().contains("feature is locked to true"), "{e}");
}

#[test]
fn deprecated_gate_warns_and_kube_proxy_ipvs_off_refuses_ipvs_mode() {
    let c = Config::from_flag_list(&["--feature-gates=KubeProxyIPVS=true"]).unwrap();
    assert!(c
        .warnings
        .iter()
        .any(|w| w.contains("deprecated feature gate KubeProxyIPVS")));
    let e = Config::from_flag_list(&["--feature-gates=KubeProxyIPVS=false", "--proxy-mode=ipvs"])
        .unwrap_err();
    assert!(
        e.to_string()
            .starts_with("invalid --proxy-mode: \"ipvs\": must be"),
        "{e}"
    );
    assert!(Config::from_flag_list(&["--feature-gates=KubeProxyIPVS=false"]).is_ok());
}

#[test]
fn flagz_shows_upstreams_defaults_and_given_values() {
    let c = Config::from_flag_list(&[
        "--proxy-mode=nftables",
        "--sync-period=90s",
        "--feature-gates=KubeProxyIPVS=true",
        "--nodeport-addresses=primary",
    ])
    .unwrap();
    assert_eq!(c.flagz["proxy-mode"], "nftables");
    assert_eq!(c.flagz["sync-period"], "1m30s");
    assert_eq!(c.flagz["feature-gates"], "KubeProxyIPVS=true");
    assert_eq!(c.flagz["nodeport-addresses"], "[primary]");
    assert_eq!(c.flagz["config-sync-period"], "15m0s");
    assert_eq!(c.flagz["metrics-bind-address"], "127.0.0.1:10249");
}

/// Localhost NodePorts as upstream 1.37 decides them per mode, gate and family
/// (`localhostNodePortRejectProtocols`, `useLocalhostNodePortProxy` per family's
/// `ContainsExplicitLoopback`, iptables mode's `localhostNodePorts` on 127.0.0.1).
#[test]
fn localhost_node_ports_per_mode_gate_and_family() {
    use crate::model::Protocol::{Tcp, Udp};
    use crate::proxy::LoopbackNodePorts::{RejectAll, ServeTcp, Untouched};
    const GATE: &str = "--feature-gates=KubeProxyNFTablesLocalhostNodePorts=true";
    type Case<'a> = (&'a [&'a str], [Vec<Protocol>; 2], [LoopbackNodePorts; 2]);
    let cases: &[Case] = &[
        (
            &["--proxy-mode=nftables"],
            [vec![], vec![]],
            [Untouched, Untouched],
        ),
        (
            &["--proxy-mode=nftables", "--nodeport-addresses=localhost"],
            [vec![], vec![]],
            [Untouched, Untouched],
        ),
        (
            &["--proxy-mode=nftables", GATE],
            [vec![], vec![]],
            [RejectAll, RejectAll],
        ),
        (
            &[
                "--proxy-mode=nftables",
                GATE,
                "--nodeport-addresses=localhost",
            ],
            [vec![Tcp], vec![Tcp]],
            [ServeTcp, ServeTcp],
        ),
        (
            &[
                "--proxy-mode=nftables",
                GATE,
                "--nodeport-addresses=127.0.0.0/8",
            ],
            [vec![Tcp], vec![]],
            [ServeTcp, RejectAll],
        ),
        (
            &[
                "--proxy-mode=nftables",
                GATE,
                "--nodeport-addresses=primary,::1/128",
            ],
            [vec![], vec![Tcp]],
            [RejectAll, ServeTcp],
        ),
        (
            &[
                "--proxy-mode=nftables",
                GATE,
                "--nodeport-addresses=0.0.0.0/0,::/0",
            ],
            [vec![], vec![]],
            [RejectAll, RejectAll],
        ),
        (
            &[
                "--proxy-mode=nftables",
                GATE,
                "--nodeport-addresses=localhost",
                "--localhost-nodeports",
            ],
            [vec![Tcp, Udp], vec![Tcp]],
            [Untouched, ServeTcp],
        ),
        (
            &["--proxy-mode=iptables", GATE],
            [vec![Tcp, Udp], vec![]],
            [Untouched, Untouched],
        ),
        (
            &["--proxy-mode=iptables", "--nodeport-addresses=10.0.0.0/8"],
            [vec![], vec![]],
            [Untouched, Untouched],
        ),
        (
            &["--proxy-mode=ipvs", GATE, "--nodeport-addresses=localhost"],
            [vec![], vec![]],
            [Untouched, Untouched],
        ),
    ];
    // Upstream's iptables mode sets route_localnet=1 (and its guard) exactly when it serves
    // localhost NodePorts.
    for (args, guard) in [
        (&["--proxy-mode=iptables"][..], true),
        (
            &[
                "--proxy-mode=iptables",
                "--iptables-localhost-nodeports=false",
            ],
            false,
        ),
        (
            &["--proxy-mode=iptables", "--nodeport-addresses=10.0.0.0/8"],
            false,
        ),
        (
            &[
                "--proxy-mode=nftables",
                GATE,
                "--nodeport-addresses=localhost",
            ],
            false,
        ),
        (&["--proxy-mode=ipvs"], false),
    ] {
        assert_eq!(run(args).unwrap().proxier.localnet_guard, guard, "{args:?}");
    }
    for (args, [v4, v6], [p4, p6]) in cases {
        let c = run(args).unwrap();
        assert_eq!(
            (&c.localhost_listeners.v4, &c.localhost_listeners.v6),
            (v4, v6),
            "listeners of {args:?}"
        );
        assert_eq!(
            (
                c.proxier.loopback_nodeports.v4,
                c.proxier.loopback_nodeports.v6
            ),
            (*p4, *p6),
            "rejects of {args:?}"
        );
    }
}

#[test]
fn load_balancing_is_random_by_default_maglev_on_request_and_an_unknown_value_is_an_error() {
    use crate::model::LoadBalancing;
    let c = run(&[]).unwrap();
    assert_eq!(c.proxier.load_balancing, LoadBalancing::Random);
    assert_eq!(c.ipvs.load_balancing, LoadBalancing::Random);
    for mode in ["iptables", "nftables", "ipvs"] {
        let c = run(&["--load-balancing", "maglev", "--proxy-mode", mode]).unwrap();
        assert_eq!(c.proxier.load_balancing, LoadBalancing::Maglev, "{mode}");
        assert_eq!(c.ipvs.load_balancing, LoadBalancing::Maglev, "{mode}");
        assert!(c.warnings.is_empty(), "{mode}: {:?}", c.warnings);
    }
    let c = run(&["--load-balancing=maglev", "--proxy-mode", "userspace"]).unwrap();
    assert!(
        c.warnings
            .iter()
            .any(|w| w == "--load-balancing=maglev has no effect in userspace mode: its listeners pick endpoints in turn"),
        "{:?}",
        c.warnings
    );
    let e = run(&["--load-balancing", "ring"]).unwrap_err().to_string();
    assert!(
        e.contains("--load-balancing") && e.contains("\"ring\"") && e.contains("random or maglev"),
        "{e}"
    );
}

#[test]
fn reset_dead_endpoint_connections_is_off_by_default_and_warned_where_it_cannot_work() {
    let warned = |c: &Config| {
        c.warnings
            .iter()
            .any(|w| w.contains("--reset-dead-endpoint-connections has no effect"))
    };
    let off = run(&[]).unwrap();
    assert!(!off.reset_dead_endpoint_connections);
    for mode in ["iptables", "nftables"] {
        let c = run(&["--reset-dead-endpoint-connections", "--proxy-mode", mode]).unwrap();
        assert!(c.reset_dead_endpoint_connections, "{mode}");
        assert!(!warned(&c), "{mode}: {:?}", c.warnings);
    }
    for mode in ["ipvs", "userspace"] {
        let c = run(&["--reset-dead-endpoint-connections", "--proxy-mode", mode]).unwrap();
        assert!(warned(&c), "{mode}: {:?}", c.warnings);
    }
}

/// `--service-proxy-name` (issue #55): upstream's selection when empty; a label value
/// otherwise, with no unallocated-ClusterIP drop (kube-proxy's ClusterIPs share the CIDRs);
/// not in ipvs mode; a bad value is one line naming the flag.
#[test]
fn service_proxy_name_selects_a_label_value_beside_kube_proxy() {
    use crate::source::convert::ServiceSelection;
    let c = run(&["--service-cidrs", "10.96.0.0/16"]).unwrap();
    assert_eq!(c.service_selection, ServiceSelection::Unlabelled);
    assert!(c.proxier.drop_unallocated);
    for mode in ["iptables", "nftables", "userspace"] {
        let c = run(&["--service-proxy-name", "kube-nlproxy", "--proxy-mode", mode]).unwrap();
        assert_eq!(
            c.service_selection.proxy_name(),
            Some("kube-nlproxy"),
            "{mode}"
        );
        assert!(!c.proxier.drop_unallocated, "{mode}");
        assert!(c.warnings.is_empty(), "{mode}: {:?}", c.warnings);
    }
    let c = run(&[
        "--service-proxy-name=kube-nlproxy",
        "--service-cidrs=10.96.0.0/16",
    ])
    .unwrap();
    assert!(
        c.warnings
            .iter()
            .any(|w| w.starts_with("--service-cidrs has no effect with --service-proxy-name")),
        "{:?}",
        c.warnings
    );
    let e = run(&["--service-proxy-name", "not/a-label"])
        .unwrap_err()
        .to_string();
    assert_eq!(
        e,
        "invalid --service-proxy-name: \"not/a-label\": a label value has only letters, digits, '-', '_' and '.'"
    );
    let e = run(&["--service-proxy-name=x", "--proxy-mode=ipvs"])
        .unwrap_err()
        .to_string();
    assert!(
        e.starts_with("invalid --service-proxy-name: not in ipvs mode"),
        "{e}"
    );
}
