//! Set-up of the process itself: the OOM score, the SIGTERM/SIGINT handlers. I/O (libc,
//! /proc/self, signals).

use tokio::sync::watch;

/// Writes /proc/self/oom_score_adj; lowering it needs CAP_SYS_RESOURCE, which a
/// NET_ADMIN-only container lacks. A failure is logged at `-v=2` as upstream logs it
/// (`logger.V(2).Info("Failed to apply OOMScore")` in cmd/kube-proxy): the proxy works the
/// same, only the kernel's OOM killer may pick it sooner.
pub(super) fn set_oom_score_adj(v: i32) {
    if let Err(e) = std::fs::write("/proc/self/oom_score_adj", v.to_string()) {
        tracing::debug!(value = v, err = %e, "Failed to apply OOMScore");
    }
}

/// SIGTERM or SIGINT, listened for from the first moment of [`super::run`]: a signal during
/// start-up (listing, opening sockets, the first sync) is kept and ends the daemon cleanly
/// as soon as start-up reaches a wait, instead of killing it with the rules half-written.
#[derive(Clone)]
pub(super) struct Shutdown(watch::Receiver<bool>);

impl Shutdown {
    /// Installs the handlers now (tokio registers them when the streams are created).
    pub(super) fn install() -> Shutdown {
        use tokio::signal::unix::{signal, SignalKind};
        let (tx, rx) = watch::channel(false);
        let term = signal(SignalKind::terminate());
        let int = signal(SignalKind::interrupt());
        match (term, int) {
            (Ok(mut term), Ok(mut int)) => {
                tokio::spawn(async move {
                    let term = tokio::select! {
                        _ = term.recv() => true,
                        _ = int.recv() => false,
                    };
                    // Shutdown first, the log line after: nothing here can lose the signal.
                    let _ = tx.send(true);
                    if term {
                        tracing::info!("SIGTERM received");
                    } else {
                        tracing::info!("SIGINT received");
                    }
                });
            }
            (Err(e), _) | (_, Err(e)) => {
                tracing::error!(err = %e, "cannot listen for SIGTERM/SIGINT")
            }
        }
        Shutdown(rx)
    }

    /// Resolves once a signal arrived (at once if it already had).
    pub(super) async fn signalled(mut self) {
        if self.0.wait_for(|s| *s).await.is_err() {
            std::future::pending::<()>().await;
        }
    }
}
