//! A 3-member etcd cluster on loopback (plain HTTP, no auth), for the fault
//! trials of the etcd datastore: a member can be killed (SIGKILL) and
//! restarted on its data, and the current leader is found by asking each
//! member for its status (the Maintenance API's `Status`, what `etcdctl
//! endpoint status` shows). With one member down the other two keep a quorum,
//! so a client that knows all three endpoints can carry on once they have
//! elected a leader.
//!
//! Dropped = every member killed and the directory removed (as [`crate::etcd::Etcd`]).

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use etcd_client::{Client, ConnectOptions, GetOptions};

use crate::etcd::{pool_key_entries, reservation_keys, wait_healthy};
use crate::held::PoolEntry;
use crate::process::{Proc, Spawner};
use crate::{DirGuard, binaries, block_on, free_ports, lock, make_temp_dir, sweep_orphans};

pub const MEMBERS: usize = 3;

/// One member: its command line (to restart it on the same data) and ports.
struct Member {
    name: String,
    process: Mutex<Option<Proc>>,
    args: Vec<String>,
    client_port: u16,
    metrics_port: u16,
}

pub struct EtcdCluster {
    // Field order matters for Drop: the members' processes, then the spawner thread.
    members: Vec<Member>,
    spawner: Spawner,
    bin: PathBuf,
    dir: PathBuf,
}

impl EtcdCluster {
    /// Three members forming one cluster (`--initial-cluster` names all three),
    /// each healthy (it sees a leader) before this returns.
    pub fn start() -> Result<EtcdCluster> {
        sweep_orphans();
        let bins = binaries()?;
        let dir = make_temp_dir()?;
        let guard = DirGuard { dir: dir.clone(), keep: false };
        let spawner = Spawner::new()?;
        let ports = free_ports::<{ 3 * MEMBERS }>()?;
        let name = |i: usize| format!("m{i}");
        let peer = |i: usize| format!("http://127.0.0.1:{}", ports[3 * i + 1]);
        let initial: Vec<String> = (0..MEMBERS).map(|i| format!("{}={}", name(i), peer(i))).collect();
        let mut members = Vec::new();
        for i in 0..MEMBERS {
            let (client_port, metrics_port) = (ports[3 * i], ports[3 * i + 2]);
            let client = format!("http://127.0.0.1:{client_port}");
            let args = vec![
                format!("--name={}", name(i)),
                format!("--data-dir={}", dir.join(name(i)).display()),
                format!("--listen-client-urls={client}"),
                format!("--advertise-client-urls={client}"),
                format!("--listen-peer-urls={}", peer(i)),
                format!("--initial-advertise-peer-urls={}", peer(i)),
                format!("--initial-cluster={}", initial.join(",")),
                "--initial-cluster-state=new".to_string(),
                "--initial-cluster-token=thereabouts-faults".to_string(),
                format!("--listen-metrics-urls=http://127.0.0.1:{metrics_port}"),
                "--unsafe-no-fsync".to_string(),
                "--log-level=warn".to_string(),
            ];
            let process = spawner.spawn(&format!("etcd-{}", name(i)), &bins.etcd, &args, &dir.join(format!("{}.log", name(i))))?;
            members.push(Member { name: name(i), process: Mutex::new(Some(process)), args, client_port, metrics_port });
        }
        let cluster = EtcdCluster { members, spawner, bin: bins.etcd.clone(), dir };
        std::mem::forget(guard); // EtcdCluster's Drop owns the directory now
        for i in 0..MEMBERS {
            cluster.wait_member(i)?;
        }
        eprintln!("etcd-harness: 3-member cluster {} ready (dir {})", cluster.endpoints().join(","), cluster.dir.display());
        Ok(cluster)
    }

    /// `http://127.0.0.1:<port>` of each member, in member order.
    pub fn endpoints(&self) -> Vec<String> {
        self.members.iter().map(|m| format!("http://127.0.0.1:{}", m.client_port)).collect()
    }

    /// The client port of each member (a proxy's upstream).
    pub fn client_ports(&self) -> Vec<u16> {
        self.members.iter().map(|m| m.client_port).collect()
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The member that leads now, as the running members report it: each
    /// member's status names the leader's ID, and the header its own.
    /// Retries while an election is under way (no member names a leader).
    pub fn leader(&self) -> Result<usize> {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let mut ids = BTreeMap::new();
            let mut leader = 0;
            for i in (0..MEMBERS).filter(|i| self.running(*i)) {
                if let Ok((own, said)) = self.status(i) {
                    ids.insert(own, i);
                    leader = leader.max(said);
                }
            }
            if let Some(i) = ids.get(&leader).filter(|_| leader != 0) {
                return Ok(*i);
            }
            if Instant::now() > deadline {
                bail!("no etcd member named a running leader within 30 s (members' IDs {ids:?}, leader {leader:x})");
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// (its own member ID, the leader's ID) as member `i` reports them.
    fn status(&self, i: usize) -> Result<(u64, u64)> {
        let endpoint = format!("http://127.0.0.1:{}", self.members[i].client_port);
        block_on(async {
            let options = ConnectOptions::new().with_connect_timeout(Duration::from_secs(1)).with_timeout(Duration::from_secs(2));
            let mut c = Client::connect([endpoint.as_str()], Some(options)).await.context("connecting to a member")?;
            let status = c.status().await.context("status")?;
            let own = status.header().map(|h| h.member_id()).context("a status without a header")?;
            Ok((own, status.leader()))
        })
    }

    pub fn running(&self, i: usize) -> bool {
        lock(&self.members[i].process).is_some()
    }

    /// Kills member `i` (SIGKILL, like a crash); its data stays. Idempotent.
    pub fn kill(&self, i: usize) {
        if let Some(mut p) = lock(&self.members[i].process).take() {
            p.kill();
        }
    }

    /// Starts member `i` again on its data and waits until it is healthy
    /// (back in the cluster, seeing a leader). Only the wait if it runs.
    pub fn restart(&self, i: usize) -> Result<()> {
        let m = &self.members[i];
        {
            let mut slot = lock(&m.process);
            if slot.is_none() {
                *slot = Some(self.spawner.spawn(&format!("etcd-{}", m.name), &self.bin, &m.args, &self.dir.join(format!("{}.log", m.name)))?);
            }
        }
        self.wait_member(i)
    }

    fn wait_member(&self, i: usize) -> Result<()> {
        let m = &self.members[i];
        let mut slot = lock(&m.process);
        let process = slot.as_mut().with_context(|| format!("member {} is not running", m.name))?;
        wait_healthy(process, m.metrics_port).with_context(|| format!("etcd member {}", m.name))
    }

    /// Every key under `prefix` with its value (as text), in key order, read
    /// through any running member.
    pub fn dump(&self, prefix: &str) -> Result<Vec<(String, String)>> {
        let endpoints: Vec<String> = (0..MEMBERS).filter(|i| self.running(*i)).map(|i| self.endpoints()[i].clone()).collect();
        block_on(async {
            let options = ConnectOptions::new().with_connect_timeout(Duration::from_secs(2)).with_timeout(Duration::from_secs(10));
            let mut c = Client::connect(endpoints, Some(options)).await.context("connecting to etcd")?;
            let response = c.get(prefix, Some(GetOptions::new().with_prefix())).await.context("reading keys")?;
            Ok(response.kvs().iter().map(|kv| (String::from_utf8_lossy(kv.key()).into_owned(), String::from_utf8_lossy(kv.value()).into_owned())).collect())
        })
    }

    /// The entries of pool key `<prefix>pools/<pool>` (of `range`) by
    /// address; empty when the key is absent.
    pub fn pool_entries(&self, prefix: &str, pool: &str, range: &str) -> Result<BTreeMap<IpAddr, PoolEntry>> {
        let key = format!("{prefix}pools/{pool}");
        match self.dump(&key)?.into_iter().find(|(k, _)| *k == key) {
            Some((_, text)) => pool_key_entries(&key, &text, pool, range),
            None => Ok(BTreeMap::new()),
        }
    }

    /// The reservation keys `<prefix>reservations/<name>`: their values by name.
    pub fn reservations(&self, prefix: &str) -> Result<BTreeMap<String, serde_json::Value>> {
        let under = format!("{prefix}reservations/");
        reservation_keys(&under, self.dump(&under)?)
    }
}

impl Drop for EtcdCluster {
    fn drop(&mut self) {
        for m in &self.members {
            if let Some(mut p) = lock(&m.process).take() {
                p.kill();
            }
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
