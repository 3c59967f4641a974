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
        include_str!("../../src/config/file/testdata/kubeadm_config.conf"),
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

/// One klog text line split as klog's header defines it (`Lmmdd hh:mm:ss.uuuuuu threadid
/// file:line] msg`), with an InfoS message (`"quoted"`) and its `key=value` pairs. `None`
/// when the line is not in that shape.
fn klog_text(line: &str) -> Option<(char, String, Vec<String>)> {
    let sev = line.chars().next().filter(|c| "IWEF".contains(*c))?;
    let (head, rest) = line.split_once("] ")?;
    let mut h = head[1..].split_whitespace();
    let (date, time, tid, caller) = (h.next()?, h.next()?, h.next()?, h.next()?);
    let ok = date.len() == 4
        && date.bytes().all(|b| b.is_ascii_digit())
        && time.len() == 15
        && time.as_bytes()[8] == b'.'
        && tid.bytes().all(|b| b.is_ascii_digit())
        && caller.split_once(':').is_some_and(|(f, l)| {
            !f.contains('/') && l.bytes().all(|b| b.is_ascii_digit()) && !l.is_empty()
        })
        && h.next().is_none();
    if !ok || !rest.starts_with('"') {
        return None;
    }
    // The quoted message, then ` key=value` pairs (a value quoted, a bare token or {…}).
    let mut chars = rest[1..].char_indices();
    let mut end = None;
    while let Some((i, c)) = chars.next() {
        match c {
            '\\' => {
                chars.next();
            }
            '"' => {
                end = Some(i + 1);
                break;
            }
            _ => {}
        }
    }
    let end = end?;
    let msg = rest[1..end].to_string();
    let keys = rest[end + 1..]
        .split_whitespace()
        .filter_map(|kv| kv.split_once('=').map(|(k, _)| k.to_string()))
        .filter(|k| k.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_'))
        .collect();
    Some((sev, msg, keys))
}

/// The kinds of a component-base JSON line's fields: name → "number", "string", ….
fn json_kinds(line: &str) -> Option<std::collections::BTreeMap<String, &'static str>> {
    let v: serde_json::Value = serde_json::from_str(line).ok()?;
    Some(
        v.as_object()?
            .iter()
            .map(|(k, v)| {
                let kind = match v {
                    serde_json::Value::Number(_) => "number",
                    serde_json::Value::String(_) => "string",
                    serde_json::Value::Object(_) => "object",
                    serde_json::Value::Array(_) => "array",
                    serde_json::Value::Bool(_) => "bool",
                    serde_json::Value::Null => "null",
                };
                (k.clone(), kind)
            })
            .collect(),
    )
}

/// Our log lines read by the same parsers as upstream's own (v1.37.2, `--cleanup` in a
/// throwaway namespace, text and `--logging-format=json`): klog's header and InfoS shape for
/// text; component-base's JSON keys with the same kinds (`ts` a number of milliseconds since
/// the epoch, `caller` `dir/file:line`, `msg` a string, `v` a number), field by field.
#[test]
fn our_log_lines_parse_as_upstreams_do() {
    netlink_tests::ns::require_root();
    let ns = netlink_tests::ns::NetNs::new("logs");
    let run = |bin: &std::path::Path, json: bool| -> Vec<String> {
        let mut args = vec!["--cleanup", "--v=2"];
        if json {
            args.push("--logging-format=json");
        }
        let out = ns.output(bin.to_str().unwrap(), &args);
        String::from_utf8_lossy(&out.stderr)
            .lines()
            .map(str::to_string)
            .collect()
    };
    let (up, ours) = (upstream(), proxy_bin());
    // Text: upstream's structured lines and ours all have klog's header and InfoS shape.
    let theirs_text = run(&up, false);
    let theirs_infos: Vec<_> = theirs_text.iter().filter_map(|l| klog_text(l)).collect();
    assert!(
        theirs_infos
            .iter()
            .any(|(_, m, k)| m == "Updated" && k == &["featureGates"]),
        "the parser reads upstream's own line: {theirs_text:?}"
    );
    let ours_text = run(&ours, false);
    assert!(!ours_text.is_empty());
    for l in &ours_text {
        assert!(klog_text(l).is_some(), "not klog's shape: {l:?}");
    }
    // JSON: the keys upstream's lines always carry, with the same kinds, in ours.
    let now_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as f64;
    let theirs_json = run(&up, true);
    let theirs_kinds: Vec<_> = theirs_json.iter().filter_map(|l| json_kinds(l)).collect();
    assert!(!theirs_kinds.is_empty(), "{theirs_json:?}");
    let common: Vec<(&str, &str)> = ["ts", "caller", "msg", "v"]
        .into_iter()
        .map(|k| (k, theirs_kinds[0][k]))
        .collect();
    assert!(theirs_kinds
        .iter()
        .all(|t| common.iter().all(|(k, kind)| t.get(*k) == Some(kind))));
    for l in run(&ours, true) {
        let kinds = json_kinds(&l).unwrap_or_else(|| panic!("not JSON: {l:?}"));
        for (k, kind) in &common {
            assert_eq!(kinds.get(*k), Some(kind), "{k} in {l}");
        }
        let v: serde_json::Value = serde_json::from_str(&l).unwrap();
        let ts = v["ts"].as_f64().unwrap();
        assert!((ts - now_ms).abs() < 600_000.0, "ts in milliseconds: {l}");
        let caller = v["caller"].as_str().unwrap();
        let (path, line) = caller.rsplit_once(':').unwrap();
        assert!(
            path.split('/').count() == 2 && line.parse::<u32>().is_ok(),
            "caller as dir/file:line: {l}"
        );
        if let Some(e) = v.get("error") {
            panic!("errors go in err, not error ({e}): {l}");
        }
    }
}
