//! Lists and watches in protobuf, as upstream kube-proxy's informers ask for them
//! (`clientConnection.contentType`, default `application/vnd.kubernetes.protobuf`): a
//! 10-endpoint EndpointSlice is 1,562 bytes on the wire against 3,215 as JSON, and every
//! node watches every slice. kube-rs's watcher speaks JSON only and sends no `Accept`, so
//! this is its state machine (streaming list or paged list, then watch; 410 relists; a watch that ends resumes
//! from its resourceVersion) over requests that carry our `Accept` header and responses
//! decoded by their `Content-Type`: protobuf when the server chose it, JSON when it did
//! not (a server or aggregator that offers nothing else). It yields the same events and
//! errors as kube-rs's watcher, so the fallbacks and backoff around it are shared. I/O; the
//! decoding is in `wire.rs`, `objects.rs` and `decode.rs`, pure.

pub mod decode;
pub mod objects;
pub mod wire;

use std::collections::VecDeque;

use futures::{stream, StreamExt, TryStreamExt};
use http_body_util::BodyExt;
use kube::core::params::{ListParams, WatchParams};
use kube::runtime::watcher::{self, Event};
use kube::{Client, Resource};

use super::{EventStream, Lenient};
use decode::{ListPage, WatchEvent};
pub use objects::ProtobufKind;
use wire::PROTOBUF;

/// A kind the watcher watches: decodable in either encoding, with its API path.
pub trait Watched:
    ProtobufKind
    + Resource<DynamicType = ()>
    + serde::de::DeserializeOwned
    + Clone
    + Send
    + Sync
    + 'static
{
}

impl<K> Watched for K where
    K: ProtobufKind
        + Resource<DynamicType = ()>
        + serde::de::DeserializeOwned
        + Clone
        + Send
        + Sync
        + 'static
{
}

/// The `Accept` header upstream's client sends (client-go's `setAcceptHeader`):
/// `acceptContentTypes` when set, else `contentType` with `*/*` after it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Accept(pub String);

impl Accept {
    pub fn new(content_type: &str, accept_content_types: &str) -> Self {
        match (content_type, accept_content_types) {
            (_, a) if !a.is_empty() => Accept(a.to_string()),
            (c, _) if !c.is_empty() => Accept(format!("{c}, */*")),
            _ => Accept("application/json".into()),
        }
    }
}

/// The encoding a response came in, from its `Content-Type`.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Encoding {
    Protobuf,
    Json,
}

fn encoding(res: &http::Response<kube::client::Body>) -> Result<Encoding, kube::Error> {
    let ct = res
        .headers()
        .get(http::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    let media = ct.split(';').next().unwrap_or("").trim();
    match media {
        PROTOBUF => Ok(Encoding::Protobuf),
        "application/json" | "" => Ok(Encoding::Json),
        other => Err(service_error(format!(
            "the API server answered in {other:?}, neither protobuf nor JSON"
        ))),
    }
}

fn service_error(e: impl Into<Box<dyn std::error::Error + Send + Sync>>) -> kube::Error {
    kube::Error::Service(e.into())
}

/// Sends `req` with our `Accept`, and turns an error status into `kube::Error::Api` with
/// the server's `Status` (protobuf or JSON) or its text, as kube-rs does.
async fn send(
    client: &Client,
    accept: &Accept,
    mut req: http::Request<Vec<u8>>,
    watch: bool,
) -> Result<http::Response<kube::client::Body>, kube::Error> {
    let h = req.headers_mut();
    h.insert(
        http::header::ACCEPT,
        http::HeaderValue::from_str(&accept.0).map_err(service_error)?,
    );
    if watch {
        // As kube-rs: a 1.37 API server gzips watch streams one member per event.
        h.insert(
            http::header::ACCEPT_ENCODING,
            http::HeaderValue::from_static("identity"),
        );
    }
    let res = client.send(req.map(kube::client::Body::from)).await?;
    let code = res.status();
    if !(code.is_client_error() || code.is_server_error()) {
        return Ok(res);
    }
    let body = res.into_body().collect().await?.to_bytes();
    let status = decode::error_status(&body)
        .or_else(|| serde_json::from_slice::<kube::core::Status>(&body).ok())
        .unwrap_or_else(|| {
            kube::core::Status::failure(
                String::from_utf8_lossy(&body).trim(),
                "Failed to parse error data",
            )
            .with_code(code.as_u16())
        });
    Err(kube::Error::Api(status.boxed()))
}

/// One page of a list.
async fn list_page<K>(
    client: &Client,
    accept: &Accept,
    lp: &ListParams,
) -> Result<ListPage<K>, kube::Error>
where
    K: Watched,
{
    let req = kube::core::Request::new(K::url_path(&(), None))
        .list(lp)
        .map_err(kube::Error::BuildRequest)?;
    let res = send(client, accept, req, false).await?;
    let enc = encoding(&res)?;
    let body = res.into_body().collect().await?.to_bytes();
    match enc {
        Encoding::Protobuf => decode::list(&body).map_err(service_error),
        Encoding::Json => {
            let l: kube::core::ObjectList<Lenient<K>> =
                serde_json::from_slice(&body).map_err(kube::Error::SerdeError)?;
            Ok(ListPage {
                resource_version: l.metadata.resource_version.unwrap_or_default(),
                continue_token: l.metadata.continue_.unwrap_or_default(),
                items: l.items,
            })
        }
    }
}

type Events<K> = stream::BoxStream<'static, Result<WatchEvent<K>, kube::Error>>;

/// Starts a watch and returns its events, decoded by the response's encoding.
async fn watch<K>(
    client: &Client,
    accept: &Accept,
    wp: &WatchParams,
    version: &str,
) -> Result<Events<K>, kube::Error>
where
    K: Watched,
{
    let req = kube::core::Request::new(K::url_path(&(), None))
        .watch(wp, version)
        .map_err(kube::Error::BuildRequest)?;
    let res = send(client, accept, req, true).await?;
    let enc = encoding(&res)?;
    let data = res.into_body().into_data_stream().boxed();
    Ok(match enc {
        Encoding::Protobuf => protobuf_events(data),
        Encoding::Json => json_events(data),
    })
}

type Data = stream::BoxStream<'static, Result<prost::bytes::Bytes, kube::Error>>;

/// Whether a body error is the connection ending under a watch: resumed as the end of
/// the watch (kube-rs does the same for its JSON watches, after 300 s or more).
fn ended(e: &kube::Error) -> bool {
    let text = e.to_string();
    text.contains("unexpected EOF") || text.contains("connection closed")
}

fn protobuf_events<K: ProtobufKind + Send + 'static>(data: Data) -> Events<K> {
    let state = (data, wire::Frames::default(), VecDeque::new(), false);
    stream::unfold(
        state,
        |(mut data, mut frames, mut ready, mut done)| async move {
            loop {
                if let Some(item) = ready.pop_front() {
                    return Some((item, (data, frames, ready, done)));
                }
                if done {
                    return None;
                }
                match data.next().await {
                    Some(Ok(chunk)) => {
                        frames.push(&chunk);
                        loop {
                            match frames.next_frame() {
                                Ok(Some(f)) => {
                                    ready.push_back(decode::watch_event(f).map_err(service_error))
                                }
                                Ok(None) => break,
                                // The stream cannot be cut into frames any more: end it.
                                Err(e) => {
                                    ready.push_back(Err(service_error(e)));
                                    done = true;
                                    break;
                                }
                            }
                        }
                    }
                    Some(Err(e)) if ended(&e) => done = true,
                    Some(Err(e)) => {
                        ready.push_back(Err(e));
                        done = true;
                    }
                    None => {
                        if let Err(e) = frames.finish() {
                            tracing::debug!(error = %e, "watch stream ended inside a frame");
                        }
                        done = true;
                    }
                }
            }
        },
    )
    .boxed()
}

fn json_events<K>(data: Data) -> Events<K>
where
    K: ProtobufKind + Resource + serde::de::DeserializeOwned + Clone + Send + 'static,
{
    let lines = tokio_util::codec::FramedRead::new(
        tokio_util::io::StreamReader::new(data.map_err(std::io::Error::other)),
        tokio_util::codec::LinesCodec::new_with_max_length(wire::MAX_FRAME),
    );
    lines
        .filter_map(|line| async move {
            let line = match line {
                Ok(l) => l,
                Err(tokio_util::codec::LinesCodecError::Io(e))
                    if e.kind() == std::io::ErrorKind::UnexpectedEof =>
                {
                    return None
                }
                Err(e) => return Some(Err(service_error(e))),
            };
            if line.trim().is_empty() {
                return None;
            }
            let e = serde_json::from_str::<kube::core::WatchEvent<Lenient<K>>>(&line)
                .map_err(kube::Error::SerdeError);
            Some(e.map(|e| {
                match e {
                    kube::core::WatchEvent::Added(o) => WatchEvent::Added(o),
                    kube::core::WatchEvent::Modified(o) => WatchEvent::Modified(o),
                    kube::core::WatchEvent::Deleted(o) => WatchEvent::Deleted(o),
                    kube::core::WatchEvent::Bookmark(b) => WatchEvent::Bookmark {
                        resource_version: b.metadata.resource_version,
                        initial_events_end: b
                            .metadata
                            .annotations
                            .contains_key("k8s.io/initial-events-end"),
                    },
                    kube::core::WatchEvent::Error(s) => WatchEvent::Error(s),
                }
            }))
        })
        .boxed()
}

/// kube-rs's client-side bound on a quiet watch: the server's timeout and 5 s.
fn idle_timeout(cfg: &watcher::Config) -> std::time::Duration {
    std::time::Duration::from_secs(u64::from(cfg.timeout.unwrap_or(290)) + 5)
}

enum State<K> {
    Empty,
    InitPage {
        continue_token: Option<String>,
        objects: VecDeque<Lenient<K>>,
        resource_version: Option<String>,
    },
    InitialWatch(Events<K>),
    InitListed(String),
    Watching(String, Events<K>),
}

/// The watcher: `streaming` starts with a streaming list (`sendInitialEvents`), else with
/// a paged list; events and errors as kube-rs's `watcher` yields them.
pub fn watcher<K>(
    client: Client,
    accept: Accept,
    cfg: watcher::Config,
    streaming: bool,
) -> EventStream<K>
where
    K: Watched,
{
    let ctx = std::sync::Arc::new((client, accept, cfg, streaming));
    stream::unfold(State::Empty, move |mut state| {
        let ctx = ctx.clone();
        async move {
            loop {
                let (client, accept, cfg, streaming) = &*ctx;
                let (item, next) = step(client, accept, cfg, *streaming, state).await;
                state = next;
                if let Some(item) = item {
                    return Some((item, state));
                }
            }
        }
    })
    .boxed()
}

fn watch_params(cfg: &watcher::Config, initial: bool) -> WatchParams {
    WatchParams {
        label_selector: cfg.label_selector.clone(),
        field_selector: cfg.field_selector.clone(),
        timeout: cfg.timeout,
        bookmarks: cfg.bookmarks,
        send_initial_events: initial,
    }
}

type Step<K> = (Option<watcher::Result<Event<Lenient<K>>>>, State<K>);

/// One step of the state machine, as kube-rs's `step_trampolined`: `None` means call
/// again.
async fn step<K>(
    client: &Client,
    accept: &Accept,
    cfg: &watcher::Config,
    streaming: bool,
    state: State<K>,
) -> Step<K>
where
    K: Watched,
{
    match state {
        State::Empty if streaming => {
            match watch(client, accept, &watch_params(cfg, true), "0").await {
                Ok(s) => (Some(Ok(Event::Init)), State::InitialWatch(s)),
                Err(e) => (Some(Err(watcher::Error::WatchStartFailed(e))), State::Empty),
            }
        }
        State::Empty => (
            Some(Ok(Event::Init)),
            State::InitPage {
                continue_token: None,
                objects: VecDeque::new(),
                resource_version: None,
            },
        ),
        State::InitPage {
            continue_token,
            mut objects,
            resource_version,
        } => {
            if let Some(next) = objects.pop_front() {
                let state = State::InitPage {
                    continue_token,
                    objects,
                    resource_version,
                };
                return (Some(Ok(Event::InitApply(next))), state);
            }
            if let (None, Some(rv)) = (&continue_token, &resource_version) {
                return (Some(Ok(Event::InitDone)), State::InitListed(rv.clone()));
            }
            list_step(client, accept, cfg, continue_token).await
        }
        State::InitialWatch(mut s) => match tokio::time::timeout(idle_timeout(cfg), s.next()).await
        {
            Ok(Some(Ok(WatchEvent::Added(o) | WatchEvent::Modified(o)))) => {
                (Some(Ok(Event::InitApply(o))), State::InitialWatch(s))
            }
            // Impossible during a streaming list (Kubernetes' API concepts); ignored, as
            // kube-rs does.
            Ok(Some(Ok(WatchEvent::Deleted(_)))) => (None, State::InitialWatch(s)),
            Ok(Some(Ok(WatchEvent::Bookmark {
                resource_version,
                initial_events_end: true,
            }))) => (
                Some(Ok(Event::InitDone)),
                State::Watching(resource_version, s),
            ),
            Ok(Some(Ok(WatchEvent::Bookmark { .. }))) => (None, State::InitialWatch(s)),
            Ok(Some(Ok(WatchEvent::Error(e)))) => {
                let next = if e.code == 410 {
                    State::Empty
                } else {
                    State::InitialWatch(s)
                };
                (Some(Err(watcher::Error::WatchError(e))), next)
            }
            Ok(Some(Err(e))) => (
                Some(Err(watcher::Error::WatchFailed(e))),
                State::InitialWatch(s),
            ),
            Ok(None) | Err(_) => (None, State::Empty),
        },
        State::InitListed(rv) => {
            match watch(client, accept, &watch_params(cfg, false), &rv).await {
                Ok(s) => (None, State::Watching(rv, s)),
                Err(e) => (
                    Some(Err(watcher::Error::WatchStartFailed(e))),
                    State::InitListed(rv),
                ),
            }
        }
        State::Watching(rv, s) => watching_step(cfg, rv, s).await,
    }
}

async fn list_step<K>(
    client: &Client,
    accept: &Accept,
    cfg: &watcher::Config,
    continue_token: Option<String>,
) -> Step<K>
where
    K: Watched,
{
    let lp = ListParams {
        label_selector: cfg.label_selector.clone(),
        field_selector: cfg.field_selector.clone(),
        // kube-rs's ListSemantic::Any: served from the API server's watch cache.
        resource_version: continue_token.is_none().then(|| "0".to_string()),
        version_match: continue_token
            .is_none()
            .then_some(kube::core::params::VersionMatch::NotOlderThan),
        limit: cfg.page_size,
        continue_token,
        ..Default::default()
    };
    match list_page::<K>(client, accept, &lp).await {
        Ok(page) => {
            let rv = Some(page.resource_version).filter(|s| !s.is_empty());
            let token = Some(page.continue_token).filter(|s| !s.is_empty());
            if rv.is_none() && token.is_none() {
                return (Some(Err(watcher::Error::NoResourceVersion)), State::Empty);
            }
            let state = State::InitPage {
                continue_token: token,
                objects: page.items.into(),
                resource_version: rv,
            };
            (None, state)
        }
        Err(e) => (
            Some(Err(watcher::Error::InitialListFailed(e))),
            State::Empty,
        ),
    }
}

async fn watching_step<K>(cfg: &watcher::Config, rv: String, mut s: Events<K>) -> Step<K>
where
    K: Resource,
{
    let applied = |o: Lenient<K>, delete: bool, s: Events<K>| {
        let rv = o.meta().resource_version.clone().unwrap_or_default();
        if rv.is_empty() {
            return (Some(Err(watcher::Error::NoResourceVersion)), State::Empty);
        }
        let e = if delete {
            Event::Delete(o)
        } else {
            Event::Apply(o)
        };
        (Some(Ok(e)), State::Watching(rv, s))
    };
    match tokio::time::timeout(idle_timeout(cfg), s.next()).await {
        Ok(Some(Ok(WatchEvent::Added(o) | WatchEvent::Modified(o)))) => applied(o, false, s),
        Ok(Some(Ok(WatchEvent::Deleted(o)))) => applied(o, true, s),
        Ok(Some(Ok(WatchEvent::Bookmark {
            resource_version, ..
        }))) => (None, State::Watching(resource_version, s)),
        Ok(Some(Ok(WatchEvent::Error(e)))) => {
            let next = if e.code == 410 {
                State::Empty
            } else {
                State::Watching(rv, s)
            };
            (Some(Err(watcher::Error::WatchError(e))), next)
        }
        Ok(Some(Err(e))) => (
            Some(Err(watcher::Error::WatchFailed(e))),
            State::Watching(rv, s),
        ),
        Ok(None) | Err(_) => (None, State::InitListed(rv)),
    }
}

#[cfg(test)]
mod tests;
