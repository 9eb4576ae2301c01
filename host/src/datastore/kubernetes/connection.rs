//! The HTTP stack under the Kubernetes client: kube's own layers (base URL,
//! credentials, extra headers) over a hyper client whose TCP connections set
//! `TCP_NODELAY`.
//!
//! Why not `kube::Client::try_from(config)`: its connector leaves Nagle's
//! algorithm on. The client's first write after the TLS handshake then waits for
//! the server's delayed ACK, 40 ms on Linux, on every new connection: the
//! first request of every CNI call, and the first after each watch (HTTP/1.1:
//! a watch ends its connection). Measured in `docs/benchmarks.md`.

use hyper_util::client::legacy::Client as HyperClient;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use kube::client::ConfigExt;
use tower::ServiceBuilder;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// A client for `config`; must be called inside the runtime it will run on.
pub fn client(config: &kube::Config) -> Result<kube::Client, kube::Error> {
    let mut http = HttpConnector::new();
    http.enforce_http(false);
    http.set_nodelay(true);
    http.set_connect_timeout(config.connect_timeout);
    let https = config.rustls_https_connector_with_connector(http)?;
    let hyper = HyperClient::builder(TokioExecutor::new()).build(https);
    let service = ServiceBuilder::new()
        .layer(config.base_uri_layer())
        .option_layer(config.auth_layer()?)
        .layer(config.extra_headers_layer()?)
        .map_err(BoxError::from)
        .service(hyper);
    Ok(kube::Client::new(service, config.default_namespace.clone()))
}
