//! A cluster's network on one machine: toxiproxy ([`crate::toxiproxy`]) on
//! loopback in front of a [`Cluster`]'s kube-apiserver, with a latency toxic on
//! each direction, so every API round trip costs what it would across a real
//! network. On loopback a round trip is nearly free, which hides what
//! turn-taking on a cluster-wide Lease costs (issue 12).
//!
//! A client reaches the apiserver through the proxy with a kubeconfig from
//! [`LatencyProxy::kubeconfig`]. The toxiproxy process is stopped when the
//! value is dropped.

use std::path::Path;
use std::time::Duration;

use anyhow::{Context, Result};
use serde_json::json;

use crate::Cluster;
use crate::plugin::kubeconfig_variant;
use crate::toxiproxy::{Toxic, Toxiproxy};

/// The proxy's name inside toxiproxy.
const PROXY: &str = "kube-apiserver";
/// The two directions of a connection, as toxiproxy names them: client to server
/// and server to client.
const STREAMS: [&str; 2] = ["upstream", "downstream"];

/// toxiproxy in front of one apiserver; dropped = stopped.
pub struct LatencyProxy {
    server: Toxiproxy,
    listen_port: u16,
}

impl LatencyProxy {
    /// What a round trip between nodes of a cluster costs, each way.
    pub const DEFAULT_LATENCY: Duration = Duration::from_millis(1);

    /// A proxy in front of `cluster`'s apiserver adding [`Self::DEFAULT_LATENCY`]
    /// to each direction of every connection.
    pub fn start(cluster: &Cluster) -> Result<LatencyProxy> {
        Self::with_latency(cluster, Self::DEFAULT_LATENCY)
    }

    /// A proxy adding `latency` (whole milliseconds: toxiproxy's resolution) to each
    /// direction. Logs go to `toxiproxy-<port>.log` in the cluster's directory.
    pub fn with_latency(cluster: &Cluster, latency: Duration) -> Result<LatencyProxy> {
        let upstream = apiserver_port(cluster)?;
        let server = Toxiproxy::start(cluster.dir())?;
        let listen_port = server.add_proxy(PROXY, upstream)?;
        for stream in STREAMS {
            server.add_toxic(PROXY, &Toxic::latency(&toxic_name(stream), stream, latency)?)?;
        }
        Ok(LatencyProxy { server, listen_port })
    }

    /// `https://127.0.0.1:<port>`: the apiserver, through the proxy.
    pub fn server_url(&self) -> String {
        format!("https://127.0.0.1:{}", self.listen_port)
    }

    /// Writes a copy of the kubeconfig `source` (one of the cluster's) to `dest`,
    /// pointing at the proxy instead of the apiserver.
    pub fn kubeconfig(&self, source: &Path, dest: &Path) -> Result<()> {
        let url = self.server_url();
        kubeconfig_variant(source, dest, |doc| doc["clusters"][0]["cluster"]["server"] = json!(url))
    }

    /// Changes the latency of both directions (existing connections included).
    pub fn set_latency(&self, latency: Duration) -> Result<()> {
        for stream in STREAMS {
            let toxic = Toxic::latency(&toxic_name(stream), stream, latency)?;
            self.server.update_toxic(PROXY, &toxic.name, &toxic.attributes)?;
        }
        Ok(())
    }
}

/// The port of `cluster`'s apiserver, the proxy's upstream.
pub fn apiserver_port(cluster: &Cluster) -> Result<u16> {
    cluster.server_url().rsplit_once(':').and_then(|(_, p)| p.parse::<u16>().ok()).context("the apiserver's port")
}

fn toxic_name(stream: &str) -> String {
    format!("latency-{stream}")
}
