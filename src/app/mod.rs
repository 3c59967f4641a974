//! Wiring of the binary: picks the entry point the configuration asks for and runs it. Each
//! entry point reads top to bottom in its own file: `--cleanup` in `cleanup.rs`, the one-shot
//! runs (`--init-only`, `status`/`diff`, `--dry-run`, `--once`) in `oneshot.rs`, the
//! long-running proxy in `daemon.rs`. What they share: the sources (`sources.rs`), the one
//! `match` on the mode (`mode.rs`), other modes' leftovers (`leftovers.rs`), host and process
//! set-up (`host.rs`, `process.rs`), the health and metrics servers (`admin.rs`). Nothing
//! here names a mode's tables, chains or constants. I/O.

mod admin;
mod cleanup;
mod daemon;
mod diagnostics;
pub mod exec_filter;
pub mod hooks;
mod host;
mod leftovers;
pub mod logging;
mod mode;
mod oneshot;
pub mod process;
mod sources;

use crate::config::Config;
use crate::proxy::SyncError;
use crate::source::manifest;

/// A failure that ends the daemon: exit 1, except [`AppError::is_usage`] (exit 2, as flag
/// and configuration errors found before [`run`]).
#[derive(Debug, thiserror::Error)]
pub enum AppError {
    /// The manifests cannot be read at start: a usage error (exit 2), since running would
    /// program an empty cluster.
    #[error(transparent)]
    Manifests(#[from] manifest::ManifestError),
    #[error("cannot open the nftables netlink socket: {0}")]
    Netlink(crate::kernel::nft::Error),
    #[error(transparent)]
    Sync(#[from] SyncError),
    #[error("the configuration file changed; exiting so that the new one is used on restart")]
    ConfigChanged,
    #[error("cannot configure the Kubernetes client: {0} (give --kubeconfig or --master, or --manifests PATH to run from files)")]
    Kube(#[from] crate::source::kube::ClientError),
    #[error("the source ended before delivering a state")]
    SourceEnded,
    #[error("cannot start the {0} thread: {1}")]
    Thread(&'static str, std::io::Error),
    /// This node's Node object was deleted (upstream exits too; the DaemonSet restarts us).
    #[error("Node {0} was deleted; exiting so that the DaemonSet restarts the proxy (rules stay in place)")]
    NodeDeleted(String),
    /// `bindAddressHardFail`: a server could not bind its address.
    #[error("cannot serve {0} on {1} and bindAddressHardFail is set")]
    Bind(&'static str, std::net::SocketAddr),
    #[error(transparent)]
    Tool(#[from] crate::tools::ToolError),
    /// Upstream's start-up checks refuse to run: the primary IP family is one the host
    /// cannot run (IPv6 absent or disabled), or the configuration's CIDRs are of the wrong
    /// family where upstream makes that fatal.
    #[error("{0}")]
    StartUp(String),
    /// IPVS mode on a kernel that cannot serve it: found before anything is changed.
    #[error("cannot use the IPVS proxier: {0}")]
    Ipvs(crate::kernel::ipvs::Error),
}

impl AppError {
    /// The command line points at something unusable (exit code 2).
    pub fn is_usage(&self) -> bool {
        matches!(
            self,
            AppError::Manifests(_) | AppError::Tool(crate::tools::ToolError::Usage { .. })
        )
    }
}

/// Exit status of the daemon (and `--once`, `--cleanup`) when it fails: kube-proxy's.
pub const EXIT_FAILED: u8 = 1;
/// Exit status for a command line or configuration that cannot run (a bad flag or field,
/// named on the one line printed). Upstream exits 1 for every error (component-base's
/// `cli.Run`); 2 here, as the tools' [`crate::tools::EXIT_TROUBLE`], so that scripts tell a
/// typo from a failure.
pub const EXIT_USAGE: u8 = 2;

/// How a run ended without an error.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Finished {
    /// Stopped (a signal, a dry run, a tool with nothing to report).
    Stopped,
    /// `status` or `diff` reported drift (exit 1, as `diff(1)`).
    DriftReported,
}

/// Runs the proxy as configured: the first entry point the configuration asks for, in this
/// order (`status` and `diff` come with `--dry-run` set, and `--dry-run` wins over `--once`).
pub async fn run(cfg: Config) -> Result<Finished, AppError> {
    // Signals are listened for from the first moment (see [`process::Shutdown`]).
    let shutdown = process::Shutdown::install();
    for n in &cfg.notices {
        tracing::info!("{n}");
    }
    for w in &cfg.warnings {
        tracing::warn!("{w}");
    }
    if cfg.cleanup {
        return cleanup::run(&cfg).map(|()| Finished::Stopped);
    }
    if cfg.init_only {
        oneshot::init_only(&cfg);
        return Ok(Finished::Stopped);
    }
    if let Some(tool) = cfg.state_tool {
        return oneshot::report(tool, cfg, shutdown).await;
    }
    if cfg.dry_run {
        return oneshot::dry_run(&cfg, shutdown).await;
    }
    if cfg.once {
        return oneshot::once(cfg, shutdown).await;
    }
    daemon::run(cfg, shutdown).await
}
