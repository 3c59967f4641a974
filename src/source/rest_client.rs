//! client-go's REST client metrics for our API client, as a tower layer on kube-rs's
//! stack: `rest_client_requests_total{code,method,host}` and
//! `rest_client_request_duration_seconds{verb,host}` with component-base's buckets, so that
//! kubernetes-mixin's Proxy dashboard has them. A watch counts when its response headers
//! arrive, as client-go observes it. I/O-free apart from the clock.

use std::future::Future;
use std::pin::Pin;
use std::sync::LazyLock;
use std::task::{Context, Poll};
use std::time::Instant;

use http::{Request, Response};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::Histogram;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RequestLabels {
    pub code: String,
    pub method: String,
    pub host: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct LatencyLabels {
    pub verb: String,
    pub host: String,
}

/// component-base's `rest_client_request_duration_seconds` buckets.
pub const LATENCY_BUCKETS: [f64; 12] = [
    0.005, 0.025, 0.1, 0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 15.0, 30.0, 60.0,
];

fn latency_histogram() -> Histogram {
    Histogram::new(LATENCY_BUCKETS)
}

pub type LatencyFamily = Family<LatencyLabels, Histogram, fn() -> Histogram>;

pub static REQUESTS: LazyLock<Family<RequestLabels, Counter>> = LazyLock::new(Default::default);
pub static DURATION: LazyLock<LatencyFamily> =
    LazyLock::new(|| Family::new_with_constructor(latency_histogram as fn() -> Histogram));

/// Records every request of the client it wraps; `host` is the API server's `host:port`.
#[derive(Clone, Debug)]
pub struct MetricsLayer {
    pub host: String,
}

impl<S> tower::Layer<S> for MetricsLayer {
    type Service = MetricsService<S>;
    fn layer(&self, inner: S) -> MetricsService<S> {
        MetricsService {
            inner,
            host: self.host.clone(),
        }
    }
}

#[derive(Clone, Debug)]
pub struct MetricsService<S> {
    inner: S,
    host: String,
}

/// Records one finished request.
pub fn record(method: &str, host: &str, code: Option<u16>, secs: f64) {
    let code = code.map_or_else(|| "<error>".to_string(), |c| c.to_string());
    REQUESTS
        .get_or_create(&RequestLabels {
            code,
            method: method.into(),
            host: host.into(),
        })
        .inc();
    DURATION
        .get_or_create(&LatencyLabels {
            verb: method.into(),
            host: host.into(),
        })
        .observe(secs);
}

impl<S, B, R> tower::Service<Request<B>> for MetricsService<S>
where
    S: tower::Service<Request<B>, Response = Response<R>>,
    S::Future: Send + 'static,
    S::Error: 'static,
    R: 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<S::Response, S::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<B>) -> Self::Future {
        let method = req.method().as_str().to_string();
        let host = self.host.clone();
        let t0 = Instant::now();
        let fut = self.inner.call(req);
        Box::pin(async move {
            let r = fut.await;
            let code = r.as_ref().ok().map(|resp| resp.status().as_u16());
            record(&method, &host, code, t0.elapsed().as_secs_f64());
            r
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_code_method_and_host() {
        record("GET", "10.0.0.1:6443", Some(200), 0.01);
        record("GET", "10.0.0.1:6443", None, 0.01);
        let c = REQUESTS
            .get_or_create(&RequestLabels {
                code: "200".into(),
                method: "GET".into(),
                host: "10.0.0.1:6443".into(),
            })
            .get();
        assert!(c >= 1);
        assert!(
            REQUESTS
                .get_or_create(&RequestLabels {
                    code: "<error>".into(),
                    method: "GET".into(),
                    host: "10.0.0.1:6443".into(),
                })
                .get()
                >= 1
        );
    }
}
