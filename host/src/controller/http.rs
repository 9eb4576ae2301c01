//! The controller's HTTP endpoints: `/metrics` for Prometheus, `/healthz` for the
//! liveness probe (the process serves) and `/readyz` for the readiness probe (the
//! controller said it reached the API server). Plain HTTP/1 on hyper, one task per
//! connection, so a slow scraper never holds up another.

use std::convert::Infallible;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use http_body_util::Full;
use hyper::body::{Bytes, Incoming};
use hyper::header::{ALLOW, HeaderValue};
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::TcpListener;

use super::metrics::Metrics;
use crate::http_reply::{TEXT, reply};

pub const DEFAULT_ADDRESS: &str = "0.0.0.0:9402";

const OPENMETRICS: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// Whether the controller is ready, shared between the controller (which sets it) and
/// `/readyz` (which reads it). Cheap to clone.
#[derive(Clone, Debug, Default)]
pub struct Health {
    ready: Arc<AtomicBool>,
}

impl Health {
    /// Not ready until [`Health::set_ready`] says so.
    pub fn new() -> Self {
        Self::default()
    }

    pub fn set_ready(&self, ready: bool) {
        self.ready.store(ready, Ordering::Release);
    }

    pub fn is_ready(&self) -> bool {
        self.ready.load(Ordering::Acquire)
    }
}

pub async fn bind(address: &str) -> std::io::Result<TcpListener> {
    TcpListener::bind(address).await
}

/// Serves `/metrics`, `/healthz` and `/readyz` on `listener` until the process ends.
pub async fn serve(listener: TcpListener, metrics: Metrics, health: Health) -> std::io::Result<()> {
    loop {
        let (stream, peer) = match listener.accept().await {
            Ok(accepted) => accepted,
            Err(e) => {
                // Out of file descriptors and the like pass; retrying at once would only spin.
                crate::logging::error(format!("controller http: accepting a connection: {e}"));
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let _ = stream.set_nodelay(true);
        let (metrics, health) = (metrics.clone(), health.clone());
        tokio::spawn(async move {
            let service = hyper::service::service_fn(move |request| {
                let response = respond(&request, &metrics, &health);
                async move { Ok::<_, Infallible>(response) }
            });
            // The timer enables hyper's header read timeout (30 s), so an idle client cannot
            // hold a connection and its task forever.
            let connection = hyper::server::conn::http1::Builder::new().timer(TokioTimer::new()).serve_connection(TokioIo::new(stream), service);
            if let Err(e) = connection.await {
                crate::logging::error(format!("controller http: connection from {peer}: {e}"));
            }
        });
    }
}

fn respond(request: &Request<Incoming>, metrics: &Metrics, health: &Health) -> Response<Full<Bytes>> {
    let path = request.uri().path();
    if !matches!(path, "/metrics" | "/healthz" | "/readyz") {
        return reply(StatusCode::NOT_FOUND, TEXT, "not found\n".to_string());
    }
    if request.method() != Method::GET && request.method() != Method::HEAD {
        let mut response = reply(StatusCode::METHOD_NOT_ALLOWED, TEXT, "method not allowed\n".to_string());
        response.headers_mut().insert(ALLOW, HeaderValue::from_static("GET, HEAD"));
        return response;
    }
    match path {
        "/metrics" => reply(StatusCode::OK, OPENMETRICS, metrics.encode()),
        "/readyz" if !health.is_ready() => {
            reply(StatusCode::SERVICE_UNAVAILABLE, TEXT, "not ready: the controller has not yet read the cluster state from the API server\n".to_string())
        }
        _ => reply(StatusCode::OK, TEXT, "ok\n".to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    async fn request(address: std::net::SocketAddr, method: &str, path: &str) -> (u16, String) {
        let mut stream = tokio::net::TcpStream::connect(address).await.unwrap();
        let text = format!("{method} {path} HTTP/1.1\r\nHost: localhost\r\nContent-Length: 0\r\nConnection: close\r\n\r\n");
        stream.write_all(text.as_bytes()).await.unwrap();
        let mut answer = String::new();
        stream.read_to_string(&mut answer).await.unwrap();
        let status = answer.split(' ').nth(1).and_then(|code| code.parse().ok()).unwrap_or(0);
        (status, answer)
    }

    #[tokio::test(flavor = "current_thread")]
    async fn endpoints() {
        let listener = bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap();
        let (metrics, health) = (Metrics::new(), Health::new());
        metrics.set_leader(true);
        let server = tokio::spawn(serve(listener, metrics, health.clone()));

        let (status, answer) = request(address, "GET", "/metrics").await;
        assert_eq!(status, 200, "{answer}");
        assert!(answer.contains("thereabouts_leader 1"), "{answer}");
        assert!(answer.to_ascii_lowercase().contains(&format!("content-type: {OPENMETRICS}")), "{answer}");

        let (status, answer) = request(address, "GET", "/healthz").await;
        assert_eq!(status, 200, "{answer}");
        assert!(answer.ends_with("\r\n\r\nok\n"), "{answer}");

        assert_eq!(request(address, "GET", "/readyz").await.0, 503);
        health.set_ready(true);
        assert_eq!(request(address, "GET", "/readyz").await.0, 200);
        assert_eq!(request(address, "HEAD", "/readyz").await.0, 200);

        assert_eq!(request(address, "GET", "/nope").await.0, 404);
        let (status, answer) = request(address, "POST", "/metrics").await;
        assert_eq!(status, 405, "{answer}");
        assert!(answer.to_ascii_lowercase().contains("allow: get, head"), "{answer}");
        server.abort();
    }
}
