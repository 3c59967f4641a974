//! Upstream kube-proxy itself (built from k8s.io/kubernetes by `netlink-tests/upstream/
//! build.sh`, which `.ci/run` runs) as the oracle for the configuration: what we write with
//! `--write-config-to`, upstream reads back and writes unchanged, and the other way round.
//! `--write-config-to` needs no cluster and no root on either side. Never skipped: a missing
//! binary fails the test with the command that builds it.
#![allow(clippy::disallowed_methods)] // tests may run test-time tools

use std::path::PathBuf;
use std::process::Command;

use netlink_tests::bounded::{OutputWithin, TEST_LIMIT};
use netlink_tests::cluster::proxy_bin;

const VERSION: &str = "v1.37.2";

fn upstream() -> PathBuf {
    let p = std::env::var_os("KUBE_PROXY_UPSTREAM")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(format!(
                "/var/tmp/kube-nlproxy-upstream/{VERSION}/kube-proxy"
            ))
        });
    assert!(
        p.exists(),
        "upstream kube-proxy {VERSION} missing at {}: run netlink-tests/upstream/build.sh",
        p.display()
    );
    p
}

fn dir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("nlp-upstream-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// Runs `bin args… --write-config-to OUT` and returns OUT's text.
fn write_config(bin: &std::path::Path, args: &[&str], out: &std::path::Path) -> String {
    let o = Command::new(bin)
        .args(args)
        .arg(format!("--write-config-to={}", out.display()))
        .output_within(TEST_LIMIT)
        .unwrap();
    assert!(
        o.status.success(),
        "{} {args:?}: {}",
        bin.display(),
        String::from_utf8_lossy(&o.stderr)
    );
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        !err.contains("strict decoding error") && !err.contains("lenient decoding"),
        "{} read the file only leniently: {err}",
        bin.display()
    );
    std::fs::read_to_string(out).unwrap()
}

/// Ours → upstream → ours: upstream kube-proxy reads our file strictly and writes the same
/// text back; so do we with its file.
#[test]
fn upstream_reads_back_what_we_write_unchanged() {
    let up = upstream();
    let d = dir("rt");
    for (case, args) in [
        ("defaults", vec!["--hostname-override=node1"]),
        (
            "ipvs flags",
            vec![
                "--hostname-override=node1",
                "--proxy-mode=ipvs",
                "--ipvs-scheduler=wlc",
                "--ipvs-sync-period=45s",
                "--ipvs-min-sync-period=2s",
                "--ipvs-exclude-cidrs=10.200.0.0/16",
                "--cluster-cidr=10.244.0.0/16,fd00:10:244::/48",
                "--iptables-masquerade-bit=9",
                "--masquerade-all",
                "--oom-score-adj=-500",
                "--conntrack-max-per-core=0",
            ],
        ),
        (
            "nftables flags",
            vec![
                "--hostname-override=node1",
                "--proxy-mode=nftables",
                "--nodeport-addresses=primary,10.0.0.0/8",
                "--detect-local-mode=InterfaceNamePrefix",
                "--pod-interface-name-prefix=veth",
                "--metrics-bind-address=0.0.0.0:10249",
                "--config-sync-period=20m",
                "--feature-gates=KubeProxyNFTablesLocalhostNodePorts=true",
            ],
        ),
    ] {
        let ours = d.join(format!("{}-ours.yaml", case.replace(' ', "-")));
        let theirs = d.join(format!("{}-theirs.yaml", case.replace(' ', "-")));
        let again = d.join(format!("{}-again.yaml", case.replace(' ', "-")));
        let a = write_config(&proxy_bin(), &args, &ours);
        let b = write_config(&up, &[&format!("--config={}", ours.display())], &theirs);
        assert_eq!(a, b, "{case}: upstream wrote back something else");
        let c = write_config(
            &proxy_bin(),
            &[&format!("--config={}", theirs.display())],
            &again,
        );
        assert_eq!(b, c, "{case}: we wrote back something else");
    }
    std::fs::remove_dir_all(&d).unwrap();
}

/// Upstream's own defaults and kubeadm's undefaulted file, read by us: the file we write is
/// the one upstream writes.
#[test]
fn we_read_upstreams_files_as_upstream_does() {
    let up = upstream();
    let d = dir("defaults");
    let kubeadm = d.join("kubeadm.conf");
    std::fs::write(
        &kubeadm,
        include_str!("../../src/config/testdata/kubeadm_config.conf"),
    )
    .unwrap();
    for (case, input) in [
        ("upstream defaults", None),
        ("kubeadm's config.conf", Some(&kubeadm)),
    ] {
        let mut args = vec!["--hostname-override=node1".to_string()];
        if let Some(f) = input {
            args.push(format!("--config={}", f.display()));
        }
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let theirs = write_config(&up, &args, &d.join("theirs.yaml"));
        let ours = write_config(&proxy_bin(), &args, &d.join("ours.yaml"));
        assert_eq!(ours, theirs, "{case}");
    }
    std::fs::remove_dir_all(&d).unwrap();
}
