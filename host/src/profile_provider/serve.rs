//! The profile provider's HTTP/1 server (hyper), on a unix socket as DRANET's
//! `--webhook-url=unix:///…` dials it, or on a TCP address. One task per
//! connection; each call runs on a thread of its own, since the datastores
//! block (the Kubernetes one drives a runtime of its own).

use std::convert::Infallible;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::{Bytes, Incoming};
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::io::{AsyncRead, AsyncWrite};

use super::Provider;
use super::wire::Refusal;
use crate::http_reply::{JSON, TEXT, reply};

/// DRANET's request bodies are a few hundred bytes; this bounds a stray client.
const BODY_LIMIT: usize = 1 << 20;

/// Where to listen: `unix:///path`, or `tcp://host:port` (also `http://`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Listen {
    Unix(std::path::PathBuf),
    Tcp(String),
}

impl std::str::FromStr for Listen {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        if let Some(path) = s.strip_prefix("unix://") {
            if !path.starts_with('/') {
                return Err(format!("{s}: a unix socket needs an absolute path (unix:///run/thereabouts/profile.sock)"));
            }
            return Ok(Listen::Unix(path.into()));
        }
        match s.strip_prefix("tcp://").or_else(|| s.strip_prefix("http://")) {
            Some(address) if !address.is_empty() => Ok(Listen::Tcp(address.trim_end_matches('/').to_string())),
            _ => Err(format!("{s}: expected unix:///path or tcp://host:port")),
        }
    }
}

/// Serves until the process ends.
pub fn run(provider: Provider, listen: &Listen) -> Result<()> {
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().context("starting the server's runtime")?;
    let provider = Arc::new(provider);
    runtime.block_on(async move {
        match listen {
            Listen::Unix(path) => {
                let listener = bind_unix(path)?;
                crate::logging::verbose(format!("profile-provider: serving on unix://{}", path.display()));
                loop {
                    match listener.accept().await {
                        Ok((stream, _)) => connection(stream, provider.clone()),
                        Err(e) => pause(e).await,
                    }
                }
            }
            Listen::Tcp(address) => {
                let listener = tokio::net::TcpListener::bind(address).await.with_context(|| format!("listening on {address}"))?;
                crate::logging::verbose(format!("profile-provider: serving on {}", listener.local_addr()?));
                loop {
                    match listener.accept().await {
                        Ok((stream, _)) => {
                            let _ = stream.set_nodelay(true);
                            connection(stream, provider.clone())
                        }
                        Err(e) => pause(e).await,
                    }
                }
            }
        }
    })
}

/// Binds the socket, replacing one a previous run left (a socket nobody
/// answers on); anything else at the path is left alone.
fn bind_unix(path: &Path) -> Result<tokio::net::UnixListener> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    match std::fs::symlink_metadata(path) {
        Ok(meta) if std::os::unix::fs::FileTypeExt::is_socket(&meta.file_type()) => {
            if std::os::unix::net::UnixStream::connect(path).is_ok() {
                bail!("{} is served by another process", path.display());
            }
            std::fs::remove_file(path).with_context(|| format!("removing the stale socket {}", path.display()))?;
        }
        Ok(_) => bail!("{} exists and is not a socket", path.display()),
        Err(_) => {}
    }
    tokio::net::UnixListener::bind(path).with_context(|| format!("listening on {}", path.display()))
}

async fn pause(e: std::io::Error) {
    // Out of file descriptors and the like pass; retrying at once would only spin.
    crate::logging::error(format!("profile-provider: accepting a connection: {e}"));
    tokio::time::sleep(Duration::from_millis(100)).await;
}

fn connection<S: AsyncRead + AsyncWrite + Unpin + Send + 'static>(stream: S, provider: Arc<Provider>) {
    tokio::spawn(async move {
        let service = hyper::service::service_fn(move |request| {
            let provider = provider.clone();
            async move { Ok::<_, Infallible>(respond(request, provider).await) }
        });
        let connection = hyper::server::conn::http1::Builder::new().timer(TokioTimer::new()).serve_connection(TokioIo::new(stream), service);
        if let Err(e) = connection.await {
            crate::logging::error(format!("profile-provider: connection: {e}"));
        }
    });
}

async fn respond(request: Request<Incoming>, provider: Arc<Provider>) -> Response<Full<Bytes>> {
    let path = request.uri().path().to_string();
    let method = request.method().clone();
    match (method, path.as_str()) {
        (Method::GET, "/health") => json(StatusCode::OK, r#"{"cloudProvider":false,"profileProvider":true}"#.to_string()),
        (Method::POST, "/GetProfileConfig" | "/ReleaseProfileConfig") => {
            let body = match Limited::new(request.into_body(), BODY_LIMIT).collect().await {
                Ok(collected) => collected.to_bytes(),
                Err(e) => return refusal(Refusal::bad_request(format!("reading the request body: {e}"))),
            };
            let releasing = path == "/ReleaseProfileConfig";
            // The calls block (datastores, a mutex): off the server's thread.
            let (tx, rx) = tokio::sync::oneshot::channel();
            std::thread::spawn(move || {
                let answer = if releasing {
                    provider.release(&body).map(|()| "{}".to_string())
                } else {
                    provider.get(&body).map(|a| crate::json::pretty(&serde_json::json!(a)))
                };
                let _ = tx.send(answer);
            });
            match rx.await {
                Ok(Ok(body)) => json(StatusCode::OK, body),
                Ok(Err(refused)) => refusal(refused),
                Err(_) => refusal(Refusal { status: 500, message: "the call ended without an answer".into() }),
            }
        }
        // The cloud-provider calls: this server does not provide them (its /health says so).
        (_, "/health" | "/GetProfileConfig" | "/ReleaseProfileConfig") => text(StatusCode::METHOD_NOT_ALLOWED, "method not allowed\n".into()),
        _ => text(StatusCode::NOT_FOUND, "not found\n".into()),
    }
}

fn refusal(refused: Refusal) -> Response<Full<Bytes>> {
    let status = StatusCode::from_u16(refused.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    text(status, format!("{}\n", refused.message))
}

fn json(status: StatusCode, body: String) -> Response<Full<Bytes>> {
    reply(status, JSON, body)
}

fn text(status: StatusCode, body: String) -> Response<Full<Bytes>> {
    reply(status, TEXT, body)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn listen_addresses() {
        assert_eq!("unix:///run/thereabouts/profile.sock".parse(), Ok(Listen::Unix("/run/thereabouts/profile.sock".into())));
        assert_eq!("tcp://127.0.0.1:8080".parse(), Ok(Listen::Tcp("127.0.0.1:8080".into())));
        assert_eq!("http://127.0.0.1:8080/".parse(), Ok(Listen::Tcp("127.0.0.1:8080".into())));
        assert!("unix://relative.sock".parse::<Listen>().is_err());
        assert!("/run/x.sock".parse::<Listen>().is_err());
    }
}
