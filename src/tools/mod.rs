//! Operator subcommands of the same binary, so `kubectl exec ds/kube-nlproxy --
//! /kube-nlproxy explain …` works in the distroless image: `explain` (what the live kernel
//! does to one packet) and `services` (every Service port and where its connections go),
//! read-only, over netlink, text or `--json`; `status`, `diff` and `uninstall`. [`dispatch`] picks the
//! tool from the first argument; each tool keeps its pure logic apart from its kernel reads.

pub mod args;
pub mod drift;
pub mod explain;
pub mod services;
pub mod status;
pub mod uninstall;

/// The subcommands, by the first argument (upstream's kube-proxy takes no positional
/// arguments, so none of these can be a flag line of upstream's).
pub const TOOLS: &[(&str, &str)] = &[
    ("explain", "what the live kernel does to one packet"),
    (
        "services",
        "every Service port programmed here, its frontends and where each one's connections go",
    ),
    (
        "status",
        "what is programmed, the daemon's last sync, and drift from the current sources",
    ),
    (
        "diff",
        "the operations a sync would send now, without sending them",
    ),
    (
        "uninstall",
        "remove what kube-nlproxy programmed on this node, leaving upstream kube-proxy's rules",
    ),
];

/// The top-level `--help`: the daemon's flags (upstream's) and the subcommands.
pub fn top_level_help() -> String {
    let flags = crate::config::flags::usage();
    let mut commands = String::from(
        "Usage:\n  kube-nlproxy [flags]\n  kube-nlproxy COMMAND [flags]    (kube-nlproxy COMMAND --help: its flags, an example, its exit status)\n\nCommands:\n",
    );
    for (name, what) in TOOLS {
        commands.push_str(&format!("  {name:<10} {what}\n"));
    }
    flags.replacen("Usage:\n  kube-nlproxy [flags]\n", &commands, 1)
}

/// The `apiVersion` of the tools' JSON: objects with `apiVersion` and `kind` and camelCase
/// fields, as Kubernetes tools print them, so a script can tell a status from a listing.
pub const API_VERSION: &str = "kube-nlproxy.io/v1alpha1";

/// `value` (a struct) as the tools' JSON: `apiVersion` and `kind`, then its fields; pretty,
/// ending in a newline. The same text the CLI's `--json` prints and the daemon's
/// `/debug/kube-nlproxy/…` pages answer.
pub fn to_json(kind: &str, value: &impl serde::Serialize) -> String {
    let mut object = serde_json::Map::new();
    object.insert("apiVersion".into(), API_VERSION.into());
    object.insert("kind".into(), kind.into());
    match serde_json::to_value(value).expect("a report serializes") {
        serde_json::Value::Object(fields) => object.extend(fields),
        other => {
            object.insert("value".into(), other);
        }
    }
    serde_json::to_string_pretty(&object).expect("a JSON object serializes") + "\n"
}

/// What a tool printed, and whether it reported a finding. The exit status follows
/// `diff(1)`: 0 nothing found (in sync; the packet is delivered), [`EXIT_FINDING`] a finding
/// (`status`/`diff`: drift; `explain`: dropped or rejected, unless `--exit-zero`),
/// [`EXIT_TROUBLE`] trouble (a usage or kernel error).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Printed {
    pub text: String,
    pub finding: bool,
}

impl Printed {
    /// A report with nothing to flag.
    pub fn plain(text: String) -> Printed {
        Printed {
            text,
            finding: false,
        }
    }

    /// The process exit status for this report.
    pub fn exit_code(&self) -> u8 {
        if self.finding {
            EXIT_FINDING
        } else {
            0
        }
    }
}

/// Exit status of a tool that found drift, or a packet dropped or rejected.
pub const EXIT_FINDING: u8 = 1;
/// Exit status of a tool that could not answer (bad flags, a kernel read that failed).
pub const EXIT_TROUBLE: u8 = 2;

/// An operator tool's failure: one line naming the flag or the kernel operation.
#[derive(Debug, thiserror::Error)]
pub enum ToolError {
    #[error("{tool}: {msg}")]
    Usage { tool: &'static str, msg: String },
    /// `--help`: the usage text (printed, exit 0).
    #[error("{0}")]
    Help(String),
    #[error("{op}: {reason}")]
    Kernel { op: String, reason: String },
}

impl ToolError {
    pub fn kernel(op: impl Into<String>, e: impl std::fmt::Display) -> ToolError {
        ToolError::Kernel {
            op: op.into(),
            reason: e.to_string(),
        }
    }
}

/// What the first argument asks for.
pub enum Dispatch {
    /// Not a tool: the daemon's flag line.
    Daemon,
    /// A tool that ran: its output (or error), and its name.
    Done(Result<Printed, ToolError>, &'static str),
    /// `status` or `diff`: they run with the daemon's flags (`rest`), after its sources
    /// delivered the state.
    WithState(status::StateTool, Vec<String>),
}

/// Picks the tool named by `args[0]`, if it names one.
pub fn dispatch(args: &[String]) -> Dispatch {
    let Some((name, rest)) = args.split_first() else {
        return Dispatch::Daemon;
    };
    match name.as_str() {
        "explain" => Dispatch::Done(explain::run(rest), "explain"),
        "services" => Dispatch::Done(services::run(rest), "services"),
        "uninstall" => Dispatch::Done(uninstall::run(rest).map(Printed::plain), "uninstall"),
        "status" | "diff" => {
            let diff = name == "diff";
            if rest.iter().any(|a| a == "--help" || a == "-h") {
                return Dispatch::Done(
                    Err(ToolError::Help(format!(
                        "Usage: kube-nlproxy {name} [--json] [the daemon's flags: --config, --manifests, --kubeconfig, --proxy-mode, …]\n\n{}: it reads the same sources as the daemon with the same flags, and the kernel over netlink; it changes nothing.\n\nWith no flags it takes the running daemon's (PID 1's command line, with $NODE_NAME as --hostname-override if it has none), so in the DaemonSet's pod:\n  kubectl -n kube-system exec ds/kube-nlproxy -- /usr/local/bin/kube-proxy {name}\n\nExample, elsewhere:\n  kube-nlproxy {name} --config=/var/lib/kube-proxy/config.conf --hostname-override=$NODE\n\nThe daemon also answers it at http://METRICS-ADDRESS/debug/kube-nlproxy/{name} (JSON).\n\nExit status, as diff(1): 0 in sync, 1 drift, 2 trouble.\n",
                        TOOLS.iter().find(|(t, _)| t == name).map(|(_, h)| *h).unwrap_or("")
                    ))),
                    if diff { "diff" } else { "status" },
                );
            }
            let (tool, mut rest) = status::split_args(diff, rest);
            if rest.is_empty() {
                // In the daemon's pod, no flags means the daemon's own.
                rest = status::daemon_flags_here().unwrap_or_default();
            }
            Dispatch::WithState(tool, rest)
        }
        _ => Dispatch::Daemon,
    }
}

/// GET `http://addr{path}` from the daemon's own servers (plain HTTP/1.0, loopback; 2 s per
/// step): the body of a 200, else the status line or the error.
pub(crate) fn http_get(addr: std::net::SocketAddr, path: &str) -> Result<String, String> {
    use std::io::{Read, Write};
    let t = std::time::Duration::from_secs(2);
    let mut c = std::net::TcpStream::connect_timeout(&addr, t).map_err(|e| e.to_string())?;
    c.set_read_timeout(Some(t)).map_err(|e| e.to_string())?;
    c.set_write_timeout(Some(t)).map_err(|e| e.to_string())?;
    write!(c, "GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n").map_err(|e| e.to_string())?;
    let mut body = String::new();
    c.take(64 << 20)
        .read_to_string(&mut body)
        .map_err(|e| e.to_string())?;
    match body.split_once("\r\n\r\n") {
        Some((head, b)) if head.starts_with("HTTP/1.") && head.contains(" 200 ") => {
            Ok(b.to_string())
        }
        Some((head, _)) => Err(head.lines().next().unwrap_or("").to_string()),
        None => Err("no HTTP reply".into()),
    }
}

/// Compares `got` with `src/tools/testdata/NAME`; `UPDATE_GOLDEN=1` rewrites it instead.
#[cfg(test)]
pub(crate) fn golden(name: &str, got: &str) {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("src/tools/testdata")
        .join(name);
    if std::env::var_os("UPDATE_GOLDEN").is_some() {
        std::fs::write(&path, got).unwrap();
    }
    let want = std::fs::read_to_string(&path).unwrap_or_default();
    assert_eq!(got, want, "{name}; got:\n{got}");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn top_level_help_lists_the_subcommands_and_every_flag() {
        let h = top_level_help();
        assert!(h.contains("kube-nlproxy COMMAND [flags]"), "{h}");
        for (name, what) in TOOLS {
            assert!(h.contains(&format!("  {name:<10} {what}\n")), "{name}: {h}");
        }
        for spec in crate::config::flags::FLAGS {
            assert!(h.contains(&format!("--{}", spec.name)), "{}", spec.name);
        }
    }

    #[test]
    fn every_subcommand_help_has_an_example_and_its_exit_status() {
        for (name, _) in TOOLS {
            let args = [name.to_string(), "--help".into()];
            let Dispatch::Done(Err(ToolError::Help(h)), _) = dispatch(&args) else {
                panic!("{name} --help is not help");
            };
            assert!(
                h.starts_with(&format!("Usage: kube-nlproxy {name} ")),
                "{h}"
            );
            assert_eq!(h.matches("Usage:").count(), 1, "{h}");
            assert!(h.contains("Example"), "{name}: {h}");
            assert!(h.contains("Exit status"), "{name}: {h}");
        }
    }
}
