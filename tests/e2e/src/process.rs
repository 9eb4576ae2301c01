//! One CNI call as a process, the way a container runtime makes it: the `CNI_*`
//! environment ([`Call`]), the network config on stdin, extra environment such
//! as the plugin's budget ([`Invocation`]), and what came back ([`Outcome`]).
//! [`Invocation::run`] is the one runner every suite and benchmark uses.

use serde_json::Value;
use std::io::{Read, Write};
use std::path::Path;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// Default per-call limit: a call that takes this long is a hang (e.g. a stale lock).
/// Generous on purpose: with 16 writers on 2 busy cores single calls have been seen
/// to take ~15 s, and the plugin's own budget is 60 s (DEL) / 120 s (ADD).
pub const CALL_TIMEOUT: Duration = Duration::from_secs(90);

/// Kubernetes-style CNI_ARGS for a pod in namespace `default`.
pub fn k8s_args(pod: &str) -> String {
    format!("IgnoreUnknown=1;K8S_POD_NAMESPACE=default;K8S_POD_NAME={pod}")
}

/// The environment a runtime passes for one call.
#[derive(Clone, Debug)]
pub struct Call {
    pub command: String,
    pub container_id: String,
    pub netns: String,
    pub ifname: String,
    pub cni_args: String,
    pub cni_path: String,
}

impl Call {
    /// ADD/DEL/CHECK for a pod attachment (netns is a dummy path: pure IPAM needs none).
    pub fn pod(command: &str, container_id: &str, pod: &str) -> Call {
        Call {
            command: command.into(),
            container_id: container_id.into(),
            netns: "/var/run/netns/thab-e2e-dummy".into(),
            ifname: "eth0".into(),
            cni_args: k8s_args(pod),
            cni_path: "/nonexistent-thab-e2e".into(),
        }
    }

    /// GC / STATUS the way libcni sends them: empty CONTAINERID/NETNS/IFNAME/ARGS.
    pub fn global(command: &str) -> Call {
        Call {
            command: command.into(),
            container_id: String::new(),
            netns: String::new(),
            ifname: String::new(),
            cni_args: String::new(),
            cni_path: "/nonexistent-thab-e2e".into(),
        }
    }

    /// The pod name of a call made with [`Call::pod`] (`K8S_POD_NAME`).
    pub fn pod_name(&self) -> &str {
        self.cni_args.split(';').find_map(|kv| kv.strip_prefix("K8S_POD_NAME=")).unwrap_or("")
    }

    /// Runs to completion with `stdin` (killed after [`CALL_TIMEOUT`]).
    pub fn run(&self, bin: &Path, stdin: &str) -> Outcome {
        Invocation::new(self.clone(), stdin).run(bin)
    }
}

/// One plugin run: the call, the config on stdin, extra environment
/// (`THEREABOUTS_TIMEOUT_MS`, ...) and how long the runner lets it take.
#[derive(Clone, Debug)]
pub struct Invocation {
    pub call: Call,
    pub stdin: String,
    pub env: Vec<(String, String)>,
    /// Killed (and reported `timed_out`) when still running after this long.
    pub watchdog: Duration,
}

impl Invocation {
    pub fn new(call: Call, stdin: impl Into<String>) -> Self {
        Invocation { call, stdin: stdin.into(), env: Vec::new(), watchdog: CALL_TIMEOUT }
    }

    pub fn env(mut self, key: &str, value: &str) -> Self {
        self.env.push((key.to_string(), value.to_string()));
        self
    }

    /// `THEREABOUTS_TIMEOUT_MS`: the plugin's own budget for the call.
    pub fn budget(self, budget: Duration) -> Self {
        let ms = budget.as_millis().to_string();
        self.env("THEREABOUTS_TIMEOUT_MS", &ms)
    }

    pub fn watchdog(mut self, watchdog: Duration) -> Self {
        self.watchdog = watchdog;
        self
    }

    fn spawn(&self, bin: &Path) -> Child {
        let call = &self.call;
        let mut command = Command::new(bin);
        command
            .env_clear()
            .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")
            .env("CNI_COMMAND", &call.command)
            .env("CNI_CONTAINERID", &call.container_id)
            .env("CNI_NETNS", &call.netns)
            .env("CNI_IFNAME", &call.ifname)
            .env("CNI_ARGS", &call.cni_args)
            .env("CNI_PATH", &call.cni_path)
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut child = command.spawn().unwrap_or_else(|e| panic!("spawning {}: {e}", bin.display()));
        // The config is far below the pipe buffer size, so this never blocks; a
        // plugin that exits without reading gives EPIPE: its answer tells.
        let _ = child.stdin.take().expect("stdin").write_all(self.stdin.as_bytes());
        child
    }

    /// Runs the plugin to completion, or kills it after the watchdog. The time
    /// runs from just before the spawn to the exit. The exit is seen as the end
    /// of both output pipes (the plugin starts no process of its own that would
    /// hold them), so nothing polls while a call runs: timings stay clean with
    /// hundreds of calls at once.
    pub fn run(&self, bin: &Path) -> Outcome {
        let started = Instant::now();
        let deadline = started + self.watchdog;
        let mut child = self.spawn(bin);
        let (closed, pipes_closed) = mpsc::channel();
        let stdout = read_to_end(child.stdout.take().expect("stdout"), closed.clone());
        let stderr = read_to_end(child.stderr.take().expect("stderr"), closed);
        let mut timed_out = false;
        for _ in 0..2 {
            if pipes_closed.recv_timeout(deadline.saturating_duration_since(Instant::now())).is_err() {
                timed_out = true;
                break;
            }
        }
        // The pipes close a moment before the process becomes reapable.
        let status = loop {
            if !timed_out && let Some(status) = child.try_wait().expect("try_wait") {
                break status;
            }
            if timed_out || Instant::now() >= deadline {
                timed_out = true;
                let _ = child.kill();
                break child.wait().expect("wait");
            }
            std::thread::sleep(Duration::from_micros(100));
        };
        let elapsed = started.elapsed();
        let text = |h: std::thread::JoinHandle<Vec<u8>>| String::from_utf8_lossy(&h.join().expect("pipe reader")).into_owned();
        Outcome { call: self.call.clone(), status, stdout: text(stdout), stderr: text(stderr), started, elapsed, timed_out }
    }
}

/// Reads a pipe to its end on a thread of its own, then says so on `closed`.
fn read_to_end(mut pipe: impl Read + Send + 'static, closed: mpsc::Sender<()>) -> std::thread::JoinHandle<Vec<u8>> {
    std::thread::Builder::new()
        .stack_size(64 * 1024)
        .spawn(move || {
            let mut bytes = Vec::new();
            let _ = pipe.read_to_end(&mut bytes);
            let _ = closed.send(());
            bytes
        })
        .expect("starting a pipe reader")
}

/// What one plugin run produced.
#[derive(Debug)]
pub struct Outcome {
    pub call: Call,
    pub status: ExitStatus,
    pub stdout: String,
    pub stderr: String,
    /// When the process was started (for a history of calls, [`crate::history`]).
    pub started: Instant,
    pub elapsed: Duration,
    pub timed_out: bool,
}

impl Outcome {
    pub fn ok(&self) -> bool {
        self.status.success() && !self.timed_out
    }
    /// Panics (with everything needed to reproduce) unless the call succeeded.
    pub fn expect_ok(&self, what: &str) -> &Self {
        assert!(self.ok(), "{what} failed: {}", self.describe());
        self
    }
    pub fn describe(&self) -> String {
        format!(
            "CNI_COMMAND={} CNI_CONTAINERID={} CNI_IFNAME={} CNI_ARGS={:?} -> exit {:?}{} after {:?}\nstdout: {}\nstderr: {}",
            self.call.command,
            self.call.container_id,
            self.call.ifname,
            self.call.cni_args,
            self.status.code(),
            if self.timed_out { " (TIMED OUT, killed)" } else { "" },
            self.elapsed,
            self.stdout.trim(),
            self.stderr.trim()
        )
    }
    pub fn json(&self) -> Value {
        serde_json::from_str(&self.stdout).unwrap_or_else(|e| panic!("stdout is not JSON ({e}): {}", self.describe()))
    }
    /// `ips[].address` of a CNI result, in order.
    pub fn ips(&self) -> Vec<String> {
        crate::result_ips(&self.json())
    }
    /// A failed call must print a CNI error object (`code`, `msg`) on stdout.
    pub fn expect_cni_error(&self, what: &str) -> Value {
        assert!(!self.status.success(), "{what}: expected failure, got success: {}", self.describe());
        assert!(!self.timed_out, "{what}: timed out: {}", self.describe());
        let v: Value = serde_json::from_str(&self.stdout).unwrap_or_else(|e| panic!("{what}: error output is not a CNI error JSON ({e}): {}", self.describe()));
        assert!(
            v.get("code").and_then(Value::as_u64).is_some() && v.get("msg").and_then(Value::as_str).is_some(),
            "{what}: error JSON lacks code/msg: {}",
            self.describe()
        );
        v
    }
}
