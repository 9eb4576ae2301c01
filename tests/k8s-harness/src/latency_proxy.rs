//! A cluster's network on one machine: toxiproxy (built by build-peers.sh) on
//! loopback in front of a [`Cluster`]'s kube-apiserver, with a latency toxic on each
//! direction, so every API round trip costs what it would across a real network.
//! On loopback a round trip is nearly free, which hides what turn-taking on a
//! cluster-wide Lease costs (issue 12).
//!
//! The proxy forwards TCP: TLS is end to end between the client and the apiserver,
//! whose certificate holds `127.0.0.1` and therefore still matches. A client reaches
//! the apiserver through the proxy with a kubeconfig from [`LatencyProxy::kubeconfig`].
//! The toxiproxy process is stopped when the value is dropped.

use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddrV4, TcpStream};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use serde_json::json;

use crate::plugin::kubeconfig_variant;
use crate::process::{Proc, Spawner};
use crate::{Cluster, free_ports};

/// The proxy's name inside toxiproxy.
const PROXY: &str = "kube-apiserver";
/// The two directions of a connection, as toxiproxy names them: client to server
/// and server to client.
const STREAMS: [&str; 2] = ["upstream", "downstream"];
const START_ATTEMPTS: usize = 3;
const READY_TIMEOUT: Duration = Duration::from_secs(30);

/// toxiproxy in front of one apiserver; dropped = stopped.
pub struct LatencyProxy {
    // Field order matters for Drop: the process first, then its spawner thread.
    proc: Proc,
    _spawner: Spawner,
    api_port: u16,
    listen_port: u16,
    log: PathBuf,
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
        let bin = crate::peers::toxiproxy_server()?;
        let upstream = cluster.server_url().rsplit_once(':').and_then(|(_, p)| p.parse::<u16>().ok()).context("the apiserver's port")?;
        let mut last = None;
        for attempt in 1..=START_ATTEMPTS {
            match Self::try_start(&bin, cluster.dir(), upstream, latency) {
                Ok(proxy) => return Ok(proxy),
                // Free ports are found by binding :0 and closing; another process may
                // take one first. Any other failure is final.
                Err(e) if format!("{e:#}").contains("address already in use") => {
                    eprintln!("k8s-harness: toxiproxy start attempt {attempt}/{START_ATTEMPTS} lost a port race: {e:#}");
                    last = Some(e);
                }
                Err(e) => return Err(e),
            }
        }
        Err(last.expect("at least one attempt"))
    }

    fn try_start(bin: &Path, dir: &Path, upstream: u16, latency: Duration) -> Result<LatencyProxy> {
        let spawner = Spawner::new()?;
        let [api_port, listen_port] = free_ports::<2>()?;
        let log = dir.join(format!("toxiproxy-{listen_port}.log"));
        let args = vec!["-host=127.0.0.1".to_string(), format!("-port={api_port}")];
        let proc = spawner.spawn("toxiproxy-server", bin, &args, &log)?;
        let mut proxy = LatencyProxy { proc, _spawner: spawner, api_port, listen_port, log };
        proxy.wait_ready()?;
        proxy.api(
            "POST",
            "/proxies",
            &json!({"name": PROXY, "listen": format!("127.0.0.1:{listen_port}"), "upstream": format!("127.0.0.1:{upstream}"), "enabled": true}),
        )?;
        for stream in STREAMS {
            let toxic = json!({"name": toxic_name(stream), "type": "latency", "stream": stream, "toxicity": 1.0, "attributes": latency_attributes(latency)?});
            proxy.api("POST", &format!("/proxies/{PROXY}/toxics"), &toxic)?;
        }
        Ok(proxy)
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
            self.api("POST", &format!("/proxies/{PROXY}/toxics/{}", toxic_name(stream)), &json!({"attributes": latency_attributes(latency)?}))?;
        }
        Ok(())
    }

    fn wait_ready(&mut self) -> Result<()> {
        let deadline = Instant::now() + READY_TIMEOUT;
        loop {
            if let Some(status) = self.proc.exited() {
                bail!("toxiproxy-server exited ({status}); last log lines:\n{}", self.proc.log_tail(20));
            }
            match http(self.api_port, "GET", "/version", None) {
                Ok((200, _)) => return Ok(()),
                Ok((code, body)) => bail!("toxiproxy-server answered GET /version with {code}: {body}"),
                Err(e) if Instant::now() > deadline => return Err(e).context(format!("toxiproxy-server not ready within {READY_TIMEOUT:?}")),
                Err(_) => std::thread::sleep(Duration::from_millis(50)),
            }
        }
    }

    /// One call to toxiproxy's HTTP API; anything but 2xx is an error with its body.
    fn api(&self, method: &str, path: &str, body: &serde_json::Value) -> Result<String> {
        let (code, text) = http(self.api_port, method, path, Some(&body.to_string())).with_context(|| format!("toxiproxy {method} {path}"))?;
        if !(200..300).contains(&code) {
            bail!("toxiproxy {method} {path} answered {code}: {} (log {})", text.trim(), self.log.display());
        }
        Ok(text)
    }
}

fn toxic_name(stream: &str) -> String {
    format!("latency-{stream}")
}

fn latency_attributes(latency: Duration) -> Result<serde_json::Value> {
    if !latency.subsec_nanos().is_multiple_of(1_000_000) {
        bail!("toxiproxy's latency has millisecond resolution; {latency:?} is not whole milliseconds");
    }
    Ok(json!({"latency": latency.as_millis() as u64, "jitter": 0}))
}

/// Minimal HTTP/1.0 request over loopback (toxiproxy's API is plain HTTP): the
/// status code and the body.
fn http(port: u16, method: &str, path: &str, body: Option<&str>) -> Result<(u16, String)> {
    let addr = SocketAddrV4::new(Ipv4Addr::LOCALHOST, port);
    let mut s = TcpStream::connect_timeout(&addr.into(), Duration::from_secs(1))?;
    s.set_read_timeout(Some(Duration::from_secs(10)))?;
    let body = body.unwrap_or("");
    write!(s, "{method} {path} HTTP/1.0\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}", body.len())?;
    let mut answer = String::new();
    s.read_to_string(&mut answer)?;
    let code = answer.split_whitespace().nth(1).and_then(|c| c.parse().ok()).with_context(|| format!("not an HTTP answer: {answer:?}"))?;
    let text = answer.split_once("\r\n\r\n").map_or("", |(_, b)| b).to_string();
    Ok((code, text))
}
