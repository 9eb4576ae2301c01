//! Child processes that cannot outlive the test: each runs in its own process
//! group (so the whole group is killed), and is spawned from a dedicated thread
//! with `PR_SET_PDEATHSIG = SIGKILL`, so the kernel kills it if the test process
//! dies without unwinding (SIGKILL, abort, a static cluster at exit).
//!
//! Why a dedicated thread: the parent-death signal fires when the *thread* that
//! forked the child exits, not the process. Test threads come and go; the spawner
//! thread lives exactly as long as the [`Spawner`] (owned by the cluster).

use std::fs::File;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};

type Request = (Command, mpsc::Sender<std::io::Result<Child>>);

pub(crate) struct Spawner {
    tx: Option<mpsc::Sender<Request>>,
    thread: Option<JoinHandle<()>>,
}

impl Spawner {
    pub(crate) fn new() -> Result<Self> {
        let (tx, rx) = mpsc::channel::<Request>();
        let thread = std::thread::Builder::new()
            .name("k8s-harness-spawner".into())
            .spawn(move || {
                for (mut cmd, reply) in rx {
                    let _ = reply.send(cmd.spawn());
                }
            })
            .context("starting the spawner thread")?;
        Ok(Spawner { tx: Some(tx), thread: Some(thread) })
    }

    /// Spawns `bin args...` with stdout and stderr appended to `log`.
    pub(crate) fn spawn(&self, name: &str, bin: &Path, args: &[String], log: &Path) -> Result<Proc> {
        self.spawn_env(name, bin, args, &[], log)
    }

    /// [`Spawner::spawn`] with `env` added to (or replacing in) the environment.
    pub(crate) fn spawn_env(&self, name: &str, bin: &Path, args: &[String], env: &[(&str, std::ffi::OsString)], log: &Path) -> Result<Proc> {
        let out = File::options().create(true).append(true).open(log).with_context(|| format!("opening {}", log.display()))?;
        let err = out.try_clone()?;
        let mut cmd = Command::new(bin);
        cmd.args(args).stdin(Stdio::null()).stdout(out).stderr(err).process_group(0);
        for (key, value) in env {
            cmd.env(key, value);
        }
        let parent = std::process::id() as libc::pid_t;
        // SAFETY: only async-signal-safe calls (prctl, getppid, _exit) between fork and exec.
        unsafe {
            cmd.pre_exec(move || {
                if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL as libc::c_ulong, 0, 0, 0) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                // The parent may have died between fork and prctl.
                if libc::getppid() != parent {
                    libc::_exit(1);
                }
                Ok(())
            });
        }
        let (reply_tx, reply_rx) = mpsc::channel();
        self.tx.as_ref().expect("spawner is alive").send((cmd, reply_tx)).map_err(|_| anyhow::anyhow!("spawner thread is gone"))?;
        let child = reply_rx.recv().context("spawner thread is gone")?.with_context(|| format!("starting {name} ({})", bin.display()))?;
        Ok(Proc { name: name.to_string(), child, log: log.to_path_buf() })
    }
}

impl Drop for Spawner {
    fn drop(&mut self) {
        self.tx.take();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// A running control-plane process, leader of its own process group.
pub(crate) struct Proc {
    pub(crate) name: String,
    pub(crate) child: Child,
    pub(crate) log: PathBuf,
}

impl Proc {
    pub(crate) fn pid(&self) -> u32 {
        self.child.id()
    }

    /// `Some(status)` when the process has exited.
    pub(crate) fn exited(&mut self) -> Option<std::process::ExitStatus> {
        self.child.try_wait().ok().flatten()
    }

    /// SIGKILLs the whole process group and reaps the leader. Idempotent.
    pub(crate) fn kill(&mut self) {
        let pgid = self.child.id() as libc::pid_t;
        // SAFETY: plain syscall; a negative pid addresses the process group.
        unsafe {
            libc::kill(-pgid, libc::SIGKILL);
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
        // Anything else left in the group (none expected: etcd and kube-apiserver
        // do not fork) is gone once kill(-pgid) has been delivered; wait briefly
        // until the group is empty so callers can rely on "no leftovers".
        let deadline = Instant::now() + Duration::from_secs(5);
        while group_alive(pgid) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// The last `n` lines of the process's log, for error messages.
    pub(crate) fn log_tail(&self, n: usize) -> String {
        log_tail(&self.log, n)
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        self.kill();
    }
}

pub(crate) fn log_tail(path: &Path, n: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

fn group_alive(pgid: libc::pid_t) -> bool {
    // SAFETY: signal 0 only checks for existence/permission.
    unsafe { libc::kill(-pgid, 0) == 0 }
}

/// Whether a process with this pid exists (and is not a zombie we could reap).
pub fn pid_alive(pid: u32) -> bool {
    // SAFETY: signal 0 only checks for existence/permission.
    if unsafe { libc::kill(pid as libc::pid_t, 0) } != 0 {
        return false;
    }
    // A zombie still "exists" for kill(0); treat it as dead.
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => !stat.rsplit(')').next().is_some_and(|rest| rest.trim_start().starts_with('Z')),
        Err(_) => false,
    }
}
