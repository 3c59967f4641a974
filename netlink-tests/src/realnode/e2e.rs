//! Upstream's e2e suite (`e2e.test`, built from the same Kubernetes version as the nodes) run
//! against a [`Cluster`](super::Cluster), and its JUnit report read back spec by spec.
//!
//! I/O: runs e2e.test; the report parser is pure.

use std::collections::BTreeMap;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use super::Cluster;

/// How a spec ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    Passed,
    Failed(String),
    /// Skipped, with the suite's reason (a spec that skips itself says why).
    Skipped(String),
}

/// One run: every spec the focus selected, by its full name.
#[derive(Clone, Debug, Default)]
pub struct Report {
    pub specs: BTreeMap<String, Outcome>,
}

impl Report {
    pub fn passed(&self) -> impl Iterator<Item = &str> {
        self.specs
            .iter()
            .filter(|(_, o)| **o == Outcome::Passed)
            .map(|(n, _)| n.as_str())
    }

    pub fn failed(&self) -> impl Iterator<Item = (&str, &str)> {
        self.specs.iter().filter_map(|(n, o)| match o {
            Outcome::Failed(m) => Some((n.as_str(), m.as_str())),
            _ => None,
        })
    }

    pub fn skipped(&self) -> impl Iterator<Item = (&str, &str)> {
        self.specs.iter().filter_map(|(n, o)| match o {
            Outcome::Skipped(m) => Some((n.as_str(), m.as_str())),
            _ => None,
        })
    }

    /// One line per spec: `passed|failed|skipped  NAME  (reason)`.
    pub fn render(&self) -> String {
        let mut s = String::new();
        for (name, o) in &self.specs {
            match o {
                Outcome::Passed => s.push_str(&format!("passed   {name}\n")),
                Outcome::Failed(m) => s.push_str(&format!(
                    "FAILED   {name}\n         {}\n",
                    m.lines().next().unwrap_or("")
                )),
                Outcome::Skipped(m) => s.push_str(&format!(
                    "skipped  {name}  ({})\n",
                    m.lines().next().unwrap_or("")
                )),
            }
        }
        s
    }
}

fn unescape(s: &str) -> String {
    s.replace("&#xA;", "\n")
        .replace("&#10;", "\n")
        .replace("&#x9;", "\t")
        .replace("&quot;", "\"")
        .replace("&apos;", "'")
        .replace("&#39;", "'")
        .replace("&#34;", "\"")
        .replace("&lt;", "<")
        .replace("&gt;", ">")
        .replace("&amp;", "&")
}

/// The value of attribute `name` in the tag text `tag` (`<testcase name="…" …>`).
fn attr(tag: &str, name: &str) -> Option<String> {
    let key = format!(" {name}=\"");
    let start = tag.find(&key)? + key.len();
    let end = tag[start..].find('"')? + start;
    Some(unescape(&tag[start..end]))
}

/// The specs of a Ginkgo v2 JUnit report. The suite's setup and teardown nodes
/// (`[SynchronizedBeforeSuite]`, `[ReportAfterSuite]`, …) are not specs and are left out;
/// one that failed is reported as the spec named by it, so a broken suite never reads as
/// zero failures.
pub fn parse_junit(xml: &str) -> Report {
    let mut report = Report::default();
    let mut rest = xml;
    while let Some(i) = rest.find("<testcase ") {
        rest = &rest[i..];
        let tag_end = rest.find('>').unwrap_or(rest.len());
        let tag = &rest[..tag_end];
        let self_closing = tag.ends_with('/');
        let body_end = if self_closing {
            tag_end
        } else {
            rest.find("</testcase>").unwrap_or(rest.len())
        };
        let body = &rest[tag_end..body_end];
        let name = attr(tag, "name").unwrap_or_default();
        let status = attr(tag, "status").unwrap_or_default();
        let child_msg = |child: &str| {
            body.find(&format!("<{child}"))
                .map(|j| {
                    let t = &body[j..];
                    let end = t.find('>').unwrap_or(t.len());
                    let msg = attr(&t[..end], "message").unwrap_or_default();
                    let text_end = t.find(&format!("</{child}>")).unwrap_or(end);
                    let text = if text_end > end + 1 {
                        unescape(&t[end + 1..text_end])
                    } else {
                        String::new()
                    };
                    if msg.is_empty() {
                        text
                    } else {
                        msg
                    }
                })
                .unwrap_or_default()
        };
        let outcome = match status.as_str() {
            "passed" => Outcome::Passed,
            "skipped" | "pending" => Outcome::Skipped(child_msg("skipped")),
            _ => {
                let mut m = child_msg("failure");
                if m.is_empty() {
                    m = child_msg("error");
                }
                if m.is_empty() {
                    m = format!("status {status:?}");
                }
                Outcome::Failed(m)
            }
        };
        let is_suite_node = name.starts_with('[')
            && [
                "[SynchronizedBeforeSuite]",
                "[SynchronizedAfterSuite]",
                "[BeforeSuite]",
                "[AfterSuite]",
                "[ReportAfterSuite]",
                "[ReportBeforeSuite]",
                "[DeferCleanup (Suite)]",
            ]
            .iter()
            .any(|p| name.starts_with(p));
        // A spec the focus did not select is reported as skipped with the bare message
        // "skipped"; a spec that skipped itself says why ("skipped - requires …").
        let not_selected = outcome == Outcome::Skipped("skipped".into());
        let name = name.strip_prefix("[It] ").unwrap_or(&name).to_string();
        if (!is_suite_node || matches!(outcome, Outcome::Failed(_))) && !not_selected {
            report.specs.insert(name, outcome);
        }
        rest = &rest[body_end.max(1)..];
    }
    report
}

/// How many Ginkgo processes run specs at once: the specs mostly wait (pods starting,
/// 30 s affinity loops), so three share two cores without slowing each other much.
pub const PROCS: usize = 3;

/// Runs e2e.test against `cluster` from the control plane's namespace with `focus` and
/// `skip` (Ginkgo regular expressions) in [`PROCS`] parallel processes (Ginkgo's CLI, as
/// upstream's `hack/ginkgo-e2e.sh`), at most `limit`, and returns the report. Its output
/// goes to `log`.
pub fn run(cluster: &Cluster, focus: &str, skip: &str, limit: Duration, log: &Path) -> Report {
    run_in(cluster, focus, skip, limit, log, PROCS)
}

/// [`run`] with `procs` Ginkgo processes.
pub fn run_in(
    cluster: &Cluster,
    focus: &str,
    skip: &str,
    limit: Duration,
    log: &Path,
    procs: usize,
) -> Report {
    let bins = super::binaries();
    let report_dir = cluster.dir.join(format!(
        "e2e-report-{}",
        log.file_stem().and_then(|s| s.to_str()).unwrap_or("run")
    ));
    let _ = std::fs::remove_dir_all(&report_dir);
    std::fs::create_dir_all(&report_dir).unwrap();
    let kc = cluster.cp.admin_kubeconfig();
    let out = std::fs::File::create(log).unwrap();
    let mut cmd = Command::new("nsenter");
    cmd.arg(format!("--net=/run/netns/{}", cluster.cp.ns.name))
        .arg("--")
        .arg(bins.node.join("ginkgo"))
        .arg(format!("--procs={procs}"))
        .arg("--no-color")
        .arg("-v")
        .arg(format!("--timeout={}s", limit.as_secs()))
        .arg(format!("--focus={focus}"))
        .arg(format!("--skip={skip}"))
        .arg(bins.node.join("e2e.test"))
        .arg("--")
        .arg(format!("--kubeconfig={}", kc.display()))
        .arg("--provider=skeleton")
        // Without it the suite counts -1 nodes and every multi-node spec skips itself.
        .arg(format!("--num-nodes={}", cluster.nodes.len()))
        .arg(format!(
            "--kubectl-path={}",
            bins.node.join("kubectl").display()
        ))
        .arg(format!("--report-dir={}", report_dir.display()))
        .current_dir(&report_dir)
        .stdin(Stdio::null())
        .stdout(out.try_clone().unwrap())
        .stderr(out);
    let mut child = crate::bounded::dies_with_parent(&mut cmd)
        .spawn()
        .expect("start ginkgo e2e.test");
    // Ginkgo stops itself at --timeout; the extra minutes are for its reports.
    crate::bounded::wait_within(&mut child, limit + Duration::from_secs(180), "e2e.test");
    let xml = std::fs::read_dir(&report_dir)
        .ok()
        .and_then(|rd| {
            rd.flatten()
                .map(|e| e.path())
                .find(|p| p.extension().is_some_and(|x| x == "xml"))
        })
        .and_then(|p| std::fs::read_to_string(p).ok())
        .unwrap_or_else(|| {
            panic!(
                "e2e.test wrote no JUnit report in {}; its log ends:\n{}",
                report_dir.display(),
                tail(log, 60)
            )
        });
    // Keep the report and the log where a failed run can be read after teardown.
    let keep = super::workspace_root().join("target/real-node/reports");
    let _ = std::fs::create_dir_all(&keep);
    let stem = log.file_stem().and_then(|s| s.to_str()).unwrap_or("run");
    let _ = std::fs::write(keep.join(format!("{stem}.xml")), &xml);
    let _ = std::fs::copy(log, keep.join(format!("{stem}.log")));
    parse_junit(&xml)
}

/// The last `n` lines of a file.
pub fn tail(path: &Path, n: usize) -> String {
    let t = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = t.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn junit_specs_with_their_outcomes() {
        let xml = r#"<?xml version="1.0" encoding="UTF-8"?>
<testsuites tests="4" disabled="0" errors="0" failures="1" time="10">
  <testsuite name="Kubernetes e2e suite" package="/" tests="4">
    <testcase name="[SynchronizedBeforeSuite]" classname="Kubernetes e2e suite" status="passed" time="1"></testcase>
    <testcase name="[It] [sig-network] Services should serve a basic endpoint from pods  [Conformance]" classname="Kubernetes e2e suite" status="passed" time="5">
      <system-err>log</system-err>
    </testcase>
    <testcase name="[sig-network] Conntrack should drop INVALID conntrack entries [Privileged]" classname="Kubernetes e2e suite" status="skipped" time="0">
      <skipped message="skipped - requires at least 2 nodes (not 1)"></skipped>
    </testcase>
    <testcase name="[sig-network] Services should be rejected when no endpoints exist" classname="Kubernetes e2e suite" status="failed" time="3">
      <failure message="[FAILED] service is not reachable within 2m0s &quot;x&quot;" type="failed">details</failure>
    </testcase>
    <testcase name="[It] [sig-windows] Services should be able to create a functioning NodePort service for Windows" classname="Kubernetes e2e suite" status="skipped" time="0">
      <skipped message="skipped"></skipped>
    </testcase>
    <testcase name="[ReportAfterSuite] Kubernetes e2e suite report" classname="Kubernetes e2e suite" status="passed" time="0"/>
  </testsuite>
</testsuites>"#;
        let r = parse_junit(xml);
        assert_eq!(r.specs.len(), 3, "{r:?}");
        assert_eq!(
            r.passed().collect::<Vec<_>>(),
            vec!["[sig-network] Services should serve a basic endpoint from pods  [Conformance]"]
        );
        assert_eq!(
            r.skipped().collect::<Vec<_>>(),
            vec![(
                "[sig-network] Conntrack should drop INVALID conntrack entries [Privileged]",
                "skipped - requires at least 2 nodes (not 1)"
            )]
        );
        assert_eq!(
            r.failed().collect::<Vec<_>>(),
            vec![(
                "[sig-network] Services should be rejected when no endpoints exist",
                "[FAILED] service is not reachable within 2m0s \"x\""
            )]
        );
    }

    #[test]
    fn a_failed_suite_node_is_reported() {
        let xml = r#"<testcase name="[SynchronizedBeforeSuite]" status="failed"><failure message="nodes not ready"></failure></testcase>"#;
        let r = parse_junit(xml);
        assert_eq!(
            r.failed().collect::<Vec<_>>(),
            vec![("[SynchronizedBeforeSuite]", "nodes not ready")]
        );
    }
}
