//! The agent's HTTP endpoint (HTTP/1.1, hyper): `/metrics`, `/healthz`,
//! `/readyz`. Every answer that reads the kernel is computed on the blocking
//! pool, so a slow scrape never stalls the event loop.
//!
//! Bounded as a node agent must be, whoever connects: at most
//! [`MAX_CONNECTIONS`] connections are served at once (more wait in the
//! kernel's accept queue), one request each (no keep-alive), whose headers
//! must come within [`HEADER_TIMEOUT`], each cut off after
//! [`REQUEST_TIMEOUT`]; the kernel is read once however many scrapes
//! and probes overlap ([`SingleFlight`]), so memory does not grow with
//! them.
//! Where it listens is `--listen`: the node's loopback by default, as
//! kube-proxy serves its metrics (README: "Metrics").

use std::{convert::Infallible, sync::Arc, time::Duration};

use http_body_util::Full;
use hyper::{
    Method, Request, Response, StatusCode,
    body::{Bytes, Incoming},
    header::{ACCEPT, CONTENT_TYPE},
    server::conn::http1,
    service::service_fn,
};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::TcpListener;

use super::{
    metrics::{Collections, Exposition, Format},
    single_flight::SingleFlight,
    worker::Shared,
};
use crate::ops::inspect;

/// `/healthz` fails when the worker has not turned for this long: it is
/// stuck (a lock never released, a syscall that never returns), and a
/// restart is the cure.
pub const STUCK_AFTER: Duration = Duration::from_secs(30);

/// Connections served at once; more wait to be accepted.
pub const MAX_CONNECTIONS: usize = 8;

/// How long a connection may take, from accept to the end of its answer:
/// a client that sends nothing, or reads nothing, is dropped then. Above a
/// read of a loaded node (a second or two), below Prometheus' default
/// scrape timeout (10 s).
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(8);

/// How long a connection may take to send its request's headers (a probe
/// or a scrape sends them at once): a client that holds a connection
/// without asking frees its slot after this.
pub const HEADER_TIMEOUT: Duration = Duration::from_secs(2);

/// What the endpoint serves from.
#[derive(Debug)]
pub struct Endpoint {
    pub shared: Arc<Shared>,
    /// Series per mapping in `/metrics` (`--metrics-per-mapping`).
    pub per_mapping: bool,
    metrics: Collections,
    readiness: SingleFlight<Vec<String>>,
}

impl Endpoint {
    pub fn new(shared: Arc<Shared>, per_mapping: bool) -> Endpoint {
        Endpoint {
            shared,
            per_mapping,
            metrics: SingleFlight::default(),
            readiness: SingleFlight::default(),
        }
    }
}

fn text(status: StatusCode, body: String) -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(Bytes::from(body)));
    *response.status_mut() = status;
    response.headers_mut().insert(
        CONTENT_TYPE,
        hyper::header::HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    response
}

/// Alive: the worker's loop turns.
fn healthz(shared: &Shared) -> Response<Full<Bytes>> {
    let age = shared.heartbeat_age();
    if age < STUCK_AFTER {
        text(StatusCode::OK, "ok\n".into())
    } else {
        text(
            StatusCode::SERVICE_UNAVAILABLE,
            format!("the worker has not turned for {}s\n", age.as_secs()),
        )
    }
}

/// What keeps the node from ready: the last pass's failure, and every
/// problem `status` finds (nothing installed, an interface without the
/// programs, an address the socket hooks do not know ...).
pub fn readiness_problems(shared: &Shared) -> Vec<String> {
    let mut problems = Vec::new();
    if let Some(error) = shared
        .last_error
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .clone()
    {
        problems.push(format!("the last reconciliation failed: {error}"));
    }
    match shared.layout() {
        Ok(layout) => problems.extend(inspect::status(&layout).problems),
        Err(error) => problems.push(error.to_string()),
    }
    problems
}

async fn blocking<T: Send + 'static>(work: impl FnOnce() -> T + Send + 'static) -> Option<T> {
    tokio::task::spawn_blocking(work).await.ok()
}

async fn serve(endpoint: Arc<Endpoint>, request: Request<Incoming>) -> Response<Full<Bytes>> {
    let asked = std::time::Instant::now();
    if request.method() != Method::GET && request.method() != Method::HEAD {
        return text(StatusCode::METHOD_NOT_ALLOWED, "GET only\n".into());
    }
    match request.uri().path() {
        "/healthz" => healthz(&endpoint.shared),
        "/readyz" => {
            let problems = blocking(move || {
                endpoint
                    .readiness
                    .get(asked, || readiness_problems(&endpoint.shared))
            })
            .await;
            match problems.as_deref() {
                Some(problems) if problems.is_empty() => text(StatusCode::OK, "ready\n".into()),
                Some(problems) => text(
                    StatusCode::SERVICE_UNAVAILABLE,
                    format!("not ready:\n{}\n", problems.join("\n")),
                ),
                None => text(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    "readiness check panicked\n".into(),
                ),
            }
        }
        "/metrics" => {
            let format = Format::of_accept(
                request
                    .headers()
                    .get(ACCEPT)
                    .and_then(|value| value.to_str().ok()),
            );
            let rendered = blocking(move || {
                endpoint
                    .metrics
                    .get(asked, || {
                        Exposition::read(&endpoint.shared, endpoint.per_mapping)
                    })
                    .text(format)
            })
            .await;
            match rendered {
                Some(Some(body)) => {
                    let mut response = Response::new(Full::new(body));
                    response.headers_mut().insert(
                        CONTENT_TYPE,
                        hyper::header::HeaderValue::from_static(format.content_type()),
                    );
                    response
                }
                _ => text(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    "the metrics could not be encoded\n".into(),
                ),
            }
        }
        _ => text(
            StatusCode::NOT_FOUND,
            "not found; try /metrics, /healthz or /readyz\n".into(),
        ),
    }
}

/// Serves connections on `listener` for ever.
pub async fn run(listener: TcpListener, endpoint: Arc<Endpoint>) {
    let slots = Arc::new(tokio::sync::Semaphore::new(MAX_CONNECTIONS));
    loop {
        // A slot first: past the bound, connections wait unaccepted.
        let Ok(slot) = slots.clone().acquire_owned().await else {
            return;
        };
        let stream = match listener.accept().await {
            Ok((stream, _)) => stream,
            Err(error) => {
                // Out of file descriptors, typically: wait, do not spin.
                log::warn!("accepting a connection failed: {error}");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let endpoint = endpoint.clone();
        tokio::spawn(async move {
            let service = service_fn(move |request| {
                let endpoint = endpoint.clone();
                async move { Ok::<_, Infallible>(serve(endpoint, request).await) }
            });
            let connection = http1::Builder::new()
                .keep_alive(false)
                .timer(TokioTimer::new())
                .header_read_timeout(HEADER_TIMEOUT)
                .serve_connection(TokioIo::new(stream), service);
            match tokio::time::timeout(REQUEST_TIMEOUT, connection).await {
                Ok(Ok(())) => {}
                Ok(Err(error)) => log::debug!("HTTP connection ended with an error: {error}"),
                Err(_) => log::debug!("HTTP connection cut off after {REQUEST_TIMEOUT:?}"),
            }
            drop(slot);
        });
    }
}
