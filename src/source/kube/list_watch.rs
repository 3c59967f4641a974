//! Watch plumbing: streaming lists with client-go's fallbacks (a refused or ignored
//! `sendInitialEvents` falls back to list-then-watch, once per kind, with one line saying why) and
//! readable watch errors.

use super::*;

/// One line for a watcher failure. An API `Status` is shown by its fields, with what is
/// missing said so (a garbled one used to print as `ApiError: : (Status { code: 0 … })`).
pub fn describe_watch_error(e: &watcher::Error) -> String {
    pub(super) fn status(s: &kube::core::Status) -> String {
        let or = |v: &str, none: &str| {
            if v.is_empty() {
                none.to_string()
            } else {
                v.to_string()
            }
        };
        let code = if s.code == 0 {
            "no code".to_string()
        } else {
            format!("HTTP {}", s.code)
        };
        format!(
            "{code}, reason {}: {}",
            or(&s.reason, "(none)"),
            or(&s.message, "(no message)")
        )
    }
    match e {
        watcher::Error::WatchError(s) => format!("the API server ended the watch: {}", status(s)),
        watcher::Error::InitialListFailed(kube::Error::Api(s)) => {
            format!("list failed: {}", status(s))
        }
        watcher::Error::WatchStartFailed(kube::Error::Api(s)) => {
            format!("watch failed to start: {}", status(s))
        }
        watcher::Error::WatchFailed(kube::Error::Api(s)) => format!("watch failed: {}", status(s)),
        other => other.to_string(),
    }
}

/// A watcher's stream of objects, each decoded or named with why it was not.
pub(super) type EventStream<K> =
    futures::stream::BoxStream<'static, watcher::Result<Event<Lenient<K>>>>;

/// Whether `e`, before a streaming list finished, says the server does not serve watch-list:
/// an API server without the WatchList feature (before 1.32, 1.33 by default, or disabled)
/// refuses `sendInitialEvents` with 422 Invalid; 400 from older or proxying servers. A
/// connection error, 403, 429 or 5xx is retried as it is.
pub(super) fn watch_list_refused(e: &watcher::Error) -> bool {
    match e {
        watcher::Error::WatchStartFailed(kube::Error::Api(s)) => matches!(s.code, 400 | 422),
        _ => false,
    }
}

/// How long a streaming list may go without its end (the `k8s.io/initial-events-end`
/// bookmark) before the server is taken not to honour `sendInitialEvents`: an API server
/// before 1.27, or a proxy or aggregator that drops query parameters it does not know,
/// answers the watch with the current objects as ADDED events and then plain watch events,
/// never the end, and client-go's reflector then only warns every 10 s ("hasn't received
/// required bookmark event marking the end of initial events stream") and never syncs.
#[derive(Debug, Clone, Copy)]
pub struct EndWait {
    /// No initial object for this long: the list is over and its end will not come. A
    /// server that serves watch-list sends the end right after the last object
    /// (kubernetes#127012), and 10 s is client-go's period for the warning above.
    pub quiet: std::time::Duration,
    /// The end not within this long of the first streaming list, however busy: a server
    /// that ignores the parameter keeps sending ADDED and MODIFIED events for changes,
    /// which a 10k-Service cluster's churn does more often than `quiet`. A real server
    /// streams from its watch cache, ~100k objects in a few seconds; a false alarm costs
    /// one ordinary list.
    pub total: std::time::Duration,
}

/// The bounds the daemon uses.
pub const END_WAIT: EndWait = EndWait {
    quiet: std::time::Duration::from_secs(10),
    total: std::time::Duration::from_secs(60),
};

/// Why a streaming list is given up for list-then-watch.
pub(super) enum Fallback<'a> {
    Refused(&'a watcher::Error),
    NoEnd(std::time::Duration),
}

/// The initial list as a streaming list (a watch with `sendInitialEvents`, as upstream's
/// client-go does by default since 1.35: the server streams the objects from its watch cache
/// instead of building one list response), falling back to list-then-watch for the rest of
/// the run, as client-go's reflector does, when the server refuses it before the first list
/// completed, or when the list does not end within `wait` (a server that ignores the
/// parameter; client-go waits forever there). `streaming` and `listing` build the two
/// watchers; the only effects are the log line and the clock.
pub fn with_list_fallback<K: Send + 'static>(
    kind: &'static str,
    streaming: EventStream<K>,
    listing: impl FnOnce() -> EventStream<K> + Send + 'static,
    wait: EndWait,
) -> EventStream<K> {
    use tokio::time::Instant;
    let listing: Option<Box<dyn FnOnce() -> EventStream<K> + Send>> = Some(Box::new(listing));
    // (when the first streaming list started, the last initial object) while one runs.
    let clock: Option<(Instant, Instant)> = None;
    stream::unfold(
        (streaming, listing, clock),
        move |(mut s, mut listing, mut clock)| async move {
            loop {
                let item = match (listing.is_some(), clock) {
                    (true, Some((first, last))) => {
                        let due = (last + wait.quiet).min(first + wait.total);
                        match tokio::time::timeout_at(due, s.next()).await {
                            Ok(item) => item?,
                            Err(_) => {
                                if let Some(list_then_watch) = listing.take() {
                                    log_fallback(kind, Fallback::NoEnd(first.elapsed()), wait);
                                    s = list_then_watch();
                                }
                                clock = None;
                                continue;
                            }
                        }
                    }
                    _ => s.next().await?,
                };
                let now = Instant::now();
                match &item {
                    // The watcher starts a streaming list again after a stream ends: the
                    // total bound counts from the first.
                    Ok(Event::Init) if listing.is_some() => {
                        clock = Some((clock.map_or(now, |(first, _)| first), now))
                    }
                    Ok(Event::InitApply(_)) => {
                        if let Some((_, last)) = clock.as_mut() {
                            *last = now;
                        }
                    }
                    Ok(Event::InitDone) => {
                        listing = None;
                        clock = None;
                    }
                    Err(e) if watch_list_refused(e) => {
                        if let Some(list_then_watch) = listing.take() {
                            log_fallback(kind, Fallback::Refused(e), wait);
                            s = list_then_watch();
                            continue;
                        }
                    }
                    // The server is not answering: the wait starts again with the next
                    // streaming list it serves.
                    Err(_) => clock = None,
                    _ => {}
                }
                return Some((item, (s, listing, clock)));
            }
        },
    )
    .boxed()
}

pub(super) fn log_fallback(kind: &str, why: Fallback<'_>, wait: EndWait) {
    match why {
        Fallback::Refused(e) => tracing::info!(
            kind,
            reason = %describe_watch_error(e),
            "the API server does not serve streaming lists; listing then watching instead"
        ),
        Fallback::NoEnd(waited) => tracing::warn!(
            kind,
            waited_s = waited.as_secs(),
            quiet_s = wait.quiet.as_secs(),
            total_s = wait.total.as_secs(),
            "the API server never ended the streaming list (no k8s.io/initial-events-end \
             bookmark): it ignores sendInitialEvents; listing then watching instead"
        ),
    }
}

/// [`with_list_fallback`] over the API: `kind`'s objects selected by `cfg`, asked for in
/// the client's media types (protobuf by default, as upstream's) and read in whichever the
/// server answers.
pub(super) fn list_and_watch<K>(
    kind: &'static str,
    api: &super::ApiClient,
    cfg: watcher::Config,
) -> EventStream<K>
where
    K: super::protobuf::Watched + std::fmt::Debug,
{
    let (client, accept) = (api.client.clone(), api.accept.clone());
    let streaming = super::protobuf::watcher(client.clone(), accept.clone(), cfg.clone(), true);
    let listing = move || super::protobuf::watcher(client, accept, cfg, false);
    with_list_fallback(kind, streaming, listing, END_WAIT)
}
