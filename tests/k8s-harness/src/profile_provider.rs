//! `thereabouts profile-provider` as DRANET meets it: the server started on a
//! unix socket with a directory of profiles, an HTTP/1 client that keeps its
//! connection (as Go's transport does), and request bodies in the shape
//! DRANET's `webhook.ProfileRequest` marshals.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use hyper_util::rt::TokioIo;
use serde_json::{Value, json};

/// The server, stopped when dropped.
pub struct ProfileProvider {
    child: Child,
    pub socket: PathBuf,
}

impl ProfileProvider {
    /// Starts `binary profile-provider` on `socket` with the profiles of
    /// `profiles`, its log in `log`, and waits until `/health` answers.
    pub fn start(binary: &Path, profiles: &Path, socket: &Path, log: &Path) -> Result<ProfileProvider> {
        let log = std::fs::File::create(log).with_context(|| format!("creating {}", log.display()))?;
        let child = Command::new(binary)
            .arg("profile-provider")
            .arg(format!("--listen=unix://{}", socket.display()))
            .arg("--profiles")
            .arg(profiles)
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()
            .context("starting thereabouts profile-provider")?;
        let mut provider = ProfileProvider { child, socket: socket.to_path_buf() };
        let started = Instant::now();
        let mut client = Client::new(socket)?;
        while client.call("GET", "/health", None).is_err() {
            if let Some(status) = provider.child.try_wait()? {
                bail!("profile-provider exited ({status}) before serving");
            }
            if started.elapsed() > Duration::from_secs(20) {
                bail!("profile-provider did not serve /health within 20 s");
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        Ok(provider)
    }
}

impl Drop for ProfileProvider {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// An HTTP/1 client of one unix socket, on one kept connection (opened
/// again when the server closed it).
pub struct Client {
    runtime: tokio::runtime::Runtime,
    socket: PathBuf,
    sender: Option<hyper::client::conn::http1::SendRequest<Full<Bytes>>>,
}

impl Client {
    pub fn new(socket: &Path) -> Result<Client> {
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
        Ok(Client { runtime, socket: socket.to_path_buf(), sender: None })
    }

    /// One request: the status and the body's text.
    pub fn call(&mut self, method: &str, path: &str, body: Option<&Value>) -> Result<(u16, String)> {
        let socket = self.socket.clone();
        let sender = &mut self.sender;
        self.runtime.block_on(async move {
            if sender.as_ref().is_none_or(|s| s.is_closed()) {
                let stream = tokio::net::UnixStream::connect(&socket).await.with_context(|| format!("connecting to {}", socket.display()))?;
                let (send, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream)).await?;
                tokio::spawn(connection);
                *sender = Some(send);
            }
            let send = sender.as_mut().context("no connection")?;
            send.ready().await?;
            let bytes = body.map(serde_json::to_vec).transpose()?.unwrap_or_default();
            let request = hyper::Request::builder()
                .method(method)
                .uri(path)
                .header("host", "localhost")
                .header("content-type", "application/json")
                .body(Full::new(Bytes::from(bytes)))?;
            let response = send.send_request(request).await?;
            let status = response.status().as_u16();
            let text = String::from_utf8(response.into_body().collect().await?.to_bytes().to_vec())?;
            Ok((status, text))
        })
    }

    /// `POST /GetProfileConfig`: the status and the answer's JSON (`Null` when not JSON).
    pub fn get_profile(&mut self, request: &Value) -> Result<(u16, Value)> {
        let (status, text) = self.call("POST", "/GetProfileConfig", Some(request))?;
        Ok((status, serde_json::from_str(&text).unwrap_or(Value::Null)))
    }

    pub fn release_profile(&mut self, request: &Value) -> Result<u16> {
        Ok(self.call("POST", "/ReleaseProfileConfig", Some(request))?.0)
    }
}

/// A request body as DRANET sends it (`webhook.ProfileRequest`): the device
/// (name, MAC, PCI address), the claim's UID, and the merged NetworkConfig
/// naming the profile and the interface's name in the pod.
pub fn request(claim_uid: &str, device: &str, profile: &str) -> Value {
    json!({
        "device": {"mac_address": "02:00:5e:00:53:01", "pci_address": "0000:8a:00.0", "name": device},
        "claim_uid": claim_uid,
        "config": {"profile": profile, "interface": {"name": "net1"}},
    })
}

/// The ResourceClaims' API group and version (DRA, GA).
pub const RESOURCE_CLAIMS: &str = "resource.k8s.io/v1";

/// A ResourceClaim asking for one device of class `dranet`, as a user writes it.
pub fn resource_claim(name: &str) -> Value {
    json!({"apiVersion": RESOURCE_CLAIMS, "kind": "ResourceClaim", "metadata": {"name": name},
        "spec": {"devices": {"requests": [{"name": "nic", "exactly": {"deviceClassName": "dranet"}}]}}})
}

/// The `status` a scheduler writes: the device allocated on `node`, and
/// reserved for `pod` (none: the claim is no pod's any more).
pub fn claim_status(node: &str, pod: Option<(&str, &str)>) -> Value {
    let reserved: Vec<Value> = pod.into_iter().map(|(name, uid)| json!({"resource": "pods", "name": name, "uid": uid})).collect();
    json!({"status": {
        "allocation": {"devices": {"results": [{"request": "nic", "driver": "dra.net", "pool": node, "device": "eth1"}]}},
        "reservedFor": reserved,
    }})
}
