//! The HTTP stack under the Kubernetes client: kube's own layers (base URL,
//! credentials, extra headers) over a hyper client that speaks HTTP/2 when the
//! apiserver does and whose TCP connections set `TCP_NODELAY`.
//!
//! Why not `kube::Client::try_from(config)`:
//! - its connector leaves Nagle's algorithm on. The client's first write after
//!   the TLS handshake then waits for the server's delayed ACK, 40 ms on Linux:
//!   the first request of every CNI call;
//! - it speaks HTTP/1.1 only, where a watch holds its connection and ends it
//!   when dropped, so the request after a turn's watch (`turn.rs`), and a
//!   ticket renewal during one, each opened a connection of their own: a TCP
//!   and TLS handshake, three round trips, on the turn's critical path.
//!
//! With HTTP/2 a call keeps one connection, whatever runs on it at once.
//! Measured in `docs/benchmarks.md`.

use hyper_rustls::{FixedServerNameResolver, HttpsConnectorBuilder};
use hyper_util::client::legacy::Client as HyperClient;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use kube::client::ConfigExt;
use tower::ServiceBuilder;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// A client for `config`; must be called inside the runtime it will run on.
pub fn client(config: &kube::Config) -> Result<kube::Client, String> {
    let text = |e: &dyn std::error::Error| super::kubeconfig::error_text(e);
    let mut http = HttpConnector::new();
    http.enforce_http(false);
    http.set_nodelay(true);
    http.set_connect_timeout(config.connect_timeout);
    let mut https = HttpsConnectorBuilder::new().with_tls_config(config.rustls_client_config().map_err(|e| text(&e))?).https_or_http();
    if let Some(name) = &config.tls_server_name {
        let name = name.clone().try_into().map_err(|e| format!("tls-server-name {name:?}: {e}"))?;
        https = https.with_server_name_resolver(FixedServerNameResolver::new(name));
    }
    let https = https.enable_http1().enable_http2().wrap_connector(http);
    let hyper = HyperClient::builder(TokioExecutor::new()).build(https);
    let service = ServiceBuilder::new()
        .layer(config.base_uri_layer())
        .option_layer(config.auth_layer().map_err(|e| text(&e))?)
        .layer(config.extra_headers_layer().map_err(|e| text(&e))?)
        .map_err(BoxError::from)
        .service(hyper);
    Ok(kube::Client::new(service, config.default_namespace.clone()))
}
