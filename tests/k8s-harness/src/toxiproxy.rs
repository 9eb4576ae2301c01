//! toxiproxy (built by build-peers.sh) on loopback: one server, any number of
//! proxies each in front of a TCP upstream (an apiserver, an etcd member), and
//! toxics added to and removed from them through its HTTP API while traffic
//! flows. [`crate::latency_proxy`] is one use (a fixed latency in front of an
//! apiserver); the fault trials ([`crate::faults`]) are another (a slow, reset
//! or black-holed network for a random span).
//!
//! toxiproxy forwards bytes: TLS stays end to end between the client and the
//! upstream, whose certificate names `127.0.0.1` and so still matches.
//! The server is stopped when the value is dropped.

use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddrV4, TcpStream};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use serde_json::{Value, json};

use crate::free_ports;
use crate::process::{Proc, Spawner};

const START_ATTEMPTS: usize = 3;
const READY_TIMEOUT: Duration = Duration::from_secs(30);

/// One toxic as toxiproxy's API takes it. `stream` is `upstream` (client to
/// server) or `downstream` (server to client).
#[derive(Clone, Debug)]
pub struct Toxic {
    pub name: String,
    pub kind: &'static str,
    pub stream: &'static str,
    pub attributes: Value,
}

impl Toxic {
    /// `latency` (whole milliseconds, toxiproxy's resolution) on `stream`.
    pub fn latency(name: &str, stream: &'static str, latency: Duration) -> Result<Toxic> {
        if !latency.subsec_nanos().is_multiple_of(1_000_000) {
            bail!("toxiproxy's latency has millisecond resolution; {latency:?} is not whole milliseconds");
        }
        Ok(Toxic { name: name.into(), kind: "latency", stream, attributes: json!({"latency": latency.as_millis() as u64, "jitter": 0}) })
    }

    /// `reset_peer`: every connection (new or open) is closed with a TCP RST
    /// once it carries data (`timeout` 0), as a crashed peer or a middlebox does.
    pub fn reset_peer(name: &str) -> Toxic {
        Toxic { name: name.into(), kind: "reset_peer", stream: "upstream", attributes: json!({"timeout": 0}) }
    }

    /// `timeout` 0: a black hole. Data is dropped and connections stay open
    /// until the toxic is removed, as behind a partitioned network.
    pub fn black_hole(name: &str, stream: &'static str) -> Toxic {
        Toxic { name: name.into(), kind: "timeout", stream, attributes: json!({"timeout": 0}) }
    }

    fn body(&self) -> Value {
        json!({"name": self.name, "type": self.kind, "stream": self.stream, "toxicity": 1.0, "attributes": self.attributes})
    }
}

/// A toxiproxy server; dropped = stopped.
pub struct Toxiproxy {
    // Field order matters for Drop: the process first, then its spawner thread.
    proc: Proc,
    _spawner: Spawner,
    api_port: u16,
    log: PathBuf,
}

impl Toxiproxy {
    /// A server with no proxy yet, logging to `toxiproxy-<api port>.log` in `dir`.
    pub fn start(dir: &Path) -> Result<Toxiproxy> {
        let bin = crate::peers::toxiproxy_server()?;
        retry_port_race("toxiproxy start", || Self::try_start(&bin, dir))
    }

    fn try_start(bin: &Path, dir: &Path) -> Result<Toxiproxy> {
        let spawner = Spawner::new()?;
        let [api_port] = free_ports::<1>()?;
        let log = dir.join(format!("toxiproxy-{api_port}.log"));
        let args = vec!["-host=127.0.0.1".to_string(), format!("-port={api_port}")];
        let proc = spawner.spawn("toxiproxy-server", bin, &args, &log)?;
        let mut server = Toxiproxy { proc, _spawner: spawner, api_port, log };
        server.wait_ready()?;
        Ok(server)
    }

    /// A proxy named `name` in front of `127.0.0.1:<upstream>`; answers the
    /// loopback port it listens on.
    pub fn add_proxy(&self, name: &str, upstream: u16) -> Result<u16> {
        retry_port_race("toxiproxy proxy", || {
            let [listen] = free_ports::<1>()?;
            let body = json!({"name": name, "listen": format!("127.0.0.1:{listen}"), "upstream": format!("127.0.0.1:{upstream}"), "enabled": true});
            self.api("POST", "/proxies", Some(&body))?;
            Ok(listen)
        })
    }

    pub fn add_toxic(&self, proxy: &str, toxic: &Toxic) -> Result<()> {
        self.api("POST", &format!("/proxies/{proxy}/toxics"), Some(&toxic.body())).map(|_| ())
    }

    /// Changes the attributes of a toxic in place (open connections included).
    pub fn update_toxic(&self, proxy: &str, name: &str, attributes: &Value) -> Result<()> {
        self.api("POST", &format!("/proxies/{proxy}/toxics/{name}"), Some(&json!({"attributes": attributes}))).map(|_| ())
    }

    pub fn remove_toxic(&self, proxy: &str, name: &str) -> Result<()> {
        // No body: toxiproxy answers a DELETE before reading one, and the
        // unread bytes make the kernel reset the connection under its answer.
        self.api("DELETE", &format!("/proxies/{proxy}/toxics/{name}"), None).map(|_| ())
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
    fn api(&self, method: &str, path: &str, body: Option<&Value>) -> Result<String> {
        let (code, text) = http(self.api_port, method, path, body.map(Value::to_string).as_deref()).with_context(|| format!("toxiproxy {method} {path}"))?;
        if !(200..300).contains(&code) {
            bail!("toxiproxy {method} {path} answered {code}: {} (log {})", text.trim(), self.log.display());
        }
        Ok(text)
    }
}

/// Free ports are found by binding :0 and closing; another process may take
/// one first. Tries `work` again then; any other failure is final.
fn retry_port_race<T>(what: &str, mut work: impl FnMut() -> Result<T>) -> Result<T> {
    let mut last = None;
    for attempt in 1..=START_ATTEMPTS {
        match work() {
            Ok(value) => return Ok(value),
            Err(e) if format!("{e:#}").contains("address already in use") => {
                eprintln!("k8s-harness: {what} attempt {attempt}/{START_ATTEMPTS} lost a port race: {e:#}");
                last = Some(e);
            }
            Err(e) => return Err(e),
        }
    }
    Err(last.expect("at least one attempt"))
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
