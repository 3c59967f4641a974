//! The binary's command line: exit codes, error lines, and the `--dry-run` golden output.
//! Needs no root.
#![allow(clippy::disallowed_methods)] // tests may run test-time tools

use std::process::Command;

fn bin() -> Command {
    Command::new(netlink_tests::cluster::proxy_bin())
}

fn example() -> String {
    format!("{}/../examples/cluster.yaml", env!("CARGO_MANIFEST_DIR"))
}

#[test]
fn bad_flag_value_is_one_line_and_exit_code_2() {
    let out = bin()
        .args(["--cluster-cidr", "10.0.0.0/40", "--hostname-override", "n"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.contains("--cluster-cidr"), "{err}");
}

#[test]
fn unknown_flag_exits_2() {
    let out = bin().arg("--no-such-flag").output().unwrap();
    assert_eq!(out.status.code(), Some(2));
}

#[test]
fn missing_source_is_explained() {
    let out = bin()
        .args(["--hostname-override", "n", "--dry-run"])
        .env_remove("KUBECONFIG")
        .env("HOME", "/nonexistent")
        .env_remove("KUBERNETES_SERVICE_HOST")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("--kubeconfig") && err.contains("--manifests"),
        "{err}"
    );
}

#[test]
fn bad_master_url_exits_2() {
    let out = bin()
        .args(["--hostname-override", "n", "--master", "nope"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--master"));
}

#[test]
fn dry_run_matches_golden_output() {
    let out = bin()
        .args([
            "--manifests",
            &example(),
            "--hostname-override",
            "node1",
            "--cluster-cidr",
            "10.244.0.0/16",
            "--dry-run",
        ])
        .env("RUST_LOG", "off")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let got = String::from_utf8(out.stdout).unwrap();
    let golden_path = format!("{}/tests/golden/cluster.nft", env!("CARGO_MANIFEST_DIR"));
    if std::env::var_os("UPDATE_GOLDEN").is_some() {
        std::fs::write(&golden_path, &got).unwrap();
    }
    let want = std::fs::read_to_string(&golden_path).unwrap();
    assert_eq!(
        got, want,
        "dry-run output changed; rerun with UPDATE_GOLDEN=1 if intended"
    );
}
