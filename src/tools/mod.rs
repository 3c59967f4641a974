//! Operator subcommands of the same binary, so `kubectl exec ds/kube-nlproxy --
//! /kube-nlproxy explain …` works in the distroless image: `explain` (what the live kernel
//! does to one packet), read-only, over netlink, text or `--json`. [`dispatch`] picks the
//! tool from the first argument; each tool keeps its pure logic apart from its kernel reads.

pub mod args;
pub mod drift;
pub mod explain;
pub mod status;

/// The subcommands, by the first argument (upstream's kube-proxy takes no positional
/// arguments, so none of these can be a flag line of upstream's).
pub const TOOLS: &[(&str, &str)] = &[
    ("explain", "what the live kernel does to one packet"),
    (
        "status",
        "what is programmed, the daemon's last sync, and drift from the current sources",
    ),
    (
        "diff",
        "the operations a sync would send now, without sending them",
    ),
];

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
    Done(Result<String, ToolError>, &'static str),
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
        "status" | "diff" => {
            let diff = name == "diff";
            if rest.iter().any(|a| a == "--help" || a == "-h") {
                return Dispatch::Done(
                    Err(ToolError::Help(format!(
                        "Usage: kube-nlproxy {name} [--json] [the daemon's flags: --config, --manifests, --kubeconfig, --proxy-mode, …]\n\n{}\n",
                        TOOLS.iter().find(|(t, _)| t == name).map(|(_, h)| *h).unwrap_or("")
                    ))),
                    if diff { "diff" } else { "status" },
                );
            }
            let (tool, rest) = status::split_args(diff, rest);
            Dispatch::WithState(tool, rest)
        }
        _ => Dispatch::Daemon,
    }
}
