//! What the fault trials ([`crate::fault_trial`]) run against, for one
//! datastore: the servers ([`Servers`]: a control plane, for the Kubernetes
//! datastore and for the Pods the controller reads; a 3-member etcd cluster
//! for the etcd datastore; one toxiproxy with a proxy in front of the
//! apiserver and of each etcd member) and what the trials ask of them
//! ([`World`]): the plugin's network config (straight to the servers, or
//! through the proxies), Pod objects, a fault injected and healed, what the
//! datastore holds, one controller pass and `thereabouts pools --check`.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DeleteParams, PostParams};
use serde_json::{Value, json};
use thereabouts_e2e::{TempDir, thereabouts_bin};

use crate::addresses::pool_name;
use crate::etcd::{Access, etcd_conf};
use crate::etcd_cluster::EtcdCluster;
use crate::faults::{Datastore, Fault, Plan};
use crate::held::{PoolEntry, pool_entries, reservations_in};
use crate::latency_proxy::apiserver_port;
use crate::plugin::{Objects, kubeconfig_variant, kubernetes_conf};
use crate::toxiproxy::{Toxic, Toxiproxy};
use crate::{Cluster, NAMESPACE};

/// The network the trials of `datastore` allocate from: its name and dual-stack ranges.
pub fn network_of(datastore: Datastore) -> (&'static str, [&'static str; 2]) {
    match datastore {
        Datastore::Kubernetes => ("faults-k8s", ["192.0.2.0/24", "2001:db8:f0::/64"]),
        Datastore::Etcd => ("faults-etcd", ["198.51.100.0/24", "2001:db8:f1::/64"]),
    }
}

/// The etcd datastore's default `etcd_prefix`.
pub const ETCD_PREFIX: &str = "/thereabouts/";
/// The namespace of the trials' pods.
const POD_NAMESPACE: &str = "default";

/// The servers a fault is injected into; shared with the thread that injects it.
pub struct Servers {
    pub cluster: Arc<Cluster>,
    pub etcd: Option<EtcdCluster>,
    toxiproxy: Toxiproxy,
    /// toxiproxy's proxy names and listen ports: the apiserver's, or one per etcd member.
    proxies: Vec<(String, u16)>,
}

impl Servers {
    /// Sleeps until `plan.at`, injects the fault, sleeps `plan.span`, heals it
    /// (a server started and ready again, the toxics removed). Answers what
    /// it hit (the etcd member), for the trial's line.
    pub fn inject_and_heal(&self, plan: &Plan) -> Result<String> {
        std::thread::sleep(plan.at);
        match plan.fault {
            Fault::PluginKill | Fault::Failpoint => Ok(String::new()),
            Fault::ServerRestart => {
                self.cluster.stop_apiserver();
                std::thread::sleep(plan.span);
                self.cluster.start_apiserver().context("starting the apiserver again")?;
                Ok(String::new())
            }
            Fault::LeaderLoss | Fault::FollowerLoss => {
                let etcd = self.etcd.as_ref().context("an etcd fault without an etcd cluster")?;
                let leader = etcd.leader()?;
                let member = match plan.fault {
                    Fault::LeaderLoss => leader,
                    // The follower after the leader: any follower serves.
                    _ => (leader + 1) % crate::etcd_cluster::MEMBERS,
                };
                etcd.kill(member);
                std::thread::sleep(plan.span);
                etcd.restart(member).with_context(|| format!("restarting etcd member m{member}"))?;
                Ok(format!("m{member} (leader m{leader})"))
            }
            Fault::Latency | Fault::ResetPeer | Fault::BlackHole => {
                let proxies = self.proxies_of(plan);
                let toxics = toxics(plan)?;
                for proxy in &proxies {
                    for toxic in &toxics {
                        self.toxiproxy.add_toxic(proxy, toxic)?;
                    }
                }
                std::thread::sleep(plan.span);
                for proxy in &proxies {
                    for toxic in &toxics {
                        self.toxiproxy.remove_toxic(proxy, &toxic.name)?;
                    }
                }
                Ok(String::new())
            }
        }
    }

    /// The proxies a proxy fault of `plan` goes through: the apiserver's, or
    /// those of the planned etcd members.
    fn proxies_of(&self, plan: &Plan) -> Vec<String> {
        match self.etcd {
            None => vec![self.proxies[0].0.clone()],
            Some(_) => plan.proxied_members.iter().map(|m| self.proxies[*m].0.clone()).collect(),
        }
    }
}

/// The toxics of a proxy fault (none for the others).
fn toxics(plan: &Plan) -> Result<Vec<Toxic>> {
    Ok(match plan.fault {
        Fault::Latency => vec![Toxic::latency("fault-up", "upstream", plan.latency)?, Toxic::latency("fault-down", "downstream", plan.latency)?],
        Fault::ResetPeer => vec![Toxic::reset_peer("fault-reset")],
        Fault::BlackHole => vec![Toxic::black_hole("fault-up", "upstream"), Toxic::black_hole("fault-down", "downstream")],
        _ => Vec::new(),
    })
}

pub struct World {
    pub datastore: Datastore,
    pub servers: Servers,
    pub ranges: Vec<&'static str>,
    name: String,
    objects: Objects,
    runtime: tokio::runtime::Runtime,
    pods: Api<Pod>,
    /// The apiserver through its proxy, for the plugin.
    proxied_kubeconfig: PathBuf,
    /// The controller's identity (deploy/controller.yaml).
    controller_kubeconfig: PathBuf,
    /// The network config straight to the datastore, for the tools: the
    /// controller's `--etcd-config` and `pools --check`.
    tools_conf: PathBuf,
    files: TempDir,
}

impl World {
    /// The servers of `datastore` on `cluster` (the control plane the
    /// Kubernetes datastore writes and the controller reads pods from), and
    /// the network `name` allocating from `ranges`.
    pub fn start(datastore: Datastore, cluster: Arc<Cluster>, name: &str, ranges: &[&'static str]) -> Result<World> {
        let files = TempDir::new(&format!("faults-{name}"));
        let toxiproxy = Toxiproxy::start(files.path())?;
        let (etcd, proxies) = match datastore {
            Datastore::Kubernetes => (None, vec![("kube-apiserver".to_string(), toxiproxy.add_proxy("kube-apiserver", apiserver_port(&cluster)?)?)]),
            Datastore::Etcd => {
                let etcd = EtcdCluster::start()?;
                let mut proxies = Vec::new();
                for (i, port) in etcd.client_ports().into_iter().enumerate() {
                    let proxy = format!("etcd-m{i}");
                    let listen = toxiproxy.add_proxy(&proxy, port)?;
                    proxies.push((proxy, listen));
                }
                (Some(etcd), proxies)
            }
        };
        let proxied_kubeconfig = files.path().join("plugin-proxied.kubeconfig");
        let url = format!("https://127.0.0.1:{}", proxies[0].1);
        if datastore == Datastore::Kubernetes {
            kubeconfig_variant(&cluster.plugin_kubeconfig(), &proxied_kubeconfig, |doc| doc["clusters"][0]["cluster"]["server"] = json!(url))?;
        }
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
        let controller_kubeconfig = runtime.block_on(crate::controller::install(&cluster))?;
        let client = runtime.block_on(cluster.admin_client())?;
        let objects = Objects::admin(&cluster)?;
        let servers = Servers { cluster, etcd, toxiproxy, proxies };
        let mut world = World {
            datastore,
            servers,
            ranges: ranges.to_vec(),
            name: name.to_string(),
            objects,
            pods: Api::namespaced(client, POD_NAMESPACE),
            runtime,
            proxied_kubeconfig,
            controller_kubeconfig,
            tools_conf: PathBuf::new(),
            files,
        };
        // The tools read as the admin does (Kubernetes) or straight from etcd.
        let mut tools = world.conf(None);
        if datastore == Datastore::Kubernetes {
            tools["ipam"]["kubernetes"]["kubeconfig"] = json!(world.servers.cluster.admin_kubeconfig());
        }
        world.tools_conf = world.files.path().join("tools.conf");
        std::fs::write(&world.tools_conf, serde_json::to_vec_pretty(&tools)?)?;
        Ok(world)
    }

    /// The plugin's network config for a trial of `plan` (`None`: straight to
    /// the datastore): through toxiproxy for a proxy fault (for etcd, the
    /// planned members' proxies, the others straight), else straight.
    pub fn conf(&self, plan: Option<&Plan>) -> Value {
        let proxied = plan.is_some_and(|p| p.fault.proxied());
        match &self.servers.etcd {
            None => {
                let kubeconfig = if proxied { self.proxied_kubeconfig.clone() } else { self.servers.cluster.plugin_kubeconfig() };
                kubernetes_conf(&self.name, &kubeconfig, None, &self.ranges)
            }
            Some(etcd) => {
                let through: &[usize] = match plan {
                    Some(p) if proxied => &p.proxied_members,
                    _ => &[],
                };
                let endpoints: Vec<String> = etcd
                    .endpoints()
                    .into_iter()
                    .enumerate()
                    .map(|(i, direct)| if through.contains(&i) { format!("http://127.0.0.1:{}", self.servers.proxies[i].1) } else { direct })
                    .collect();
                etcd_conf(&Access { endpoint: endpoints.join(","), user: None, tls: None }, &self.name, &self.ranges)
            }
        }
    }

    /// Pod objects `default/<name>` (no node: `Pending`, as before a kubelet
    /// runs them), so that the controller sees their holders alive.
    pub fn create_pods(&self, names: &[String]) -> Result<()> {
        for name in names {
            let pod: Pod = serde_json::from_value(json!({
                "apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": name, "namespace": POD_NAMESPACE},
                "spec": {"containers": [{"name": "app", "image": "registry.invalid/app:1"}]},
            }))?;
            self.runtime.block_on(self.pods.create(&PostParams::default(), &pod)).with_context(|| format!("creating pod {name}"))?;
        }
        Ok(())
    }

    /// Deletes the Pod objects at once, as when their pods are deleted.
    pub fn delete_pods(&self, names: &[String]) -> Result<()> {
        let now = DeleteParams { grace_period_seconds: Some(0), ..DeleteParams::default() };
        for name in names {
            match self.runtime.block_on(self.pods.delete(name, &now)) {
                Ok(_) => {}
                Err(kube::Error::Api(s)) if s.code == 404 => {}
                Err(e) => return Err(e).with_context(|| format!("deleting pod {name}")),
            }
        }
        Ok(())
    }

    /// The entries of each range's pool, in range order, as the admin reads them.
    pub fn entries(&self) -> Result<Vec<BTreeMap<IpAddr, PoolEntry>>> {
        self.ranges
            .iter()
            .map(|range| match &self.servers.etcd {
                None => pool_entries(&self.objects, &pool_name(range), range),
                Some(etcd) => etcd.pool_entries(ETCD_PREFIX, &pool_name(range), range),
            })
            .collect()
    }

    /// The reservations of addresses in the ranges, by name: `{podref, containerid, ifname}`.
    pub fn reservations(&self) -> Result<BTreeMap<String, Value>> {
        match &self.servers.etcd {
            None => reservations_in(&self.objects, &self.ranges),
            Some(etcd) => {
                let all = etcd.reservations(ETCD_PREFIX)?;
                Ok(all.into_iter().filter(|(name, _)| crate::held::reserves_in(name, &self.ranges)).collect())
            }
        }
    }

    /// One pass of the controller, without leader election
    /// (`thereabouts controller --once`), over this datastore.
    pub fn controller_pass(&self) -> Result<()> {
        let mut command = Command::new(thereabouts_bin());
        command.args(["controller", "--once", "--namespace", NAMESPACE, "--metrics-address", "", "--identity", "fault-trials", "--kubeconfig"]);
        command.arg(&self.controller_kubeconfig);
        if self.datastore == Datastore::Etcd {
            command.arg("--etcd-config").arg(&self.tools_conf);
        }
        let (code, stdout, stderr) = run_tool(&mut command, Duration::from_secs(60))?;
        if code != Some(0) {
            bail!("thereabouts controller --once exited {code:?}:\n{stdout}{stderr}");
        }
        Ok(())
    }

    /// `thereabouts pools --check` on this datastore: its findings (each a
    /// line), or an error when the check itself failed (exit status 2).
    pub fn pools_check(&self) -> Result<Vec<String>> {
        let mut command = Command::new(thereabouts_bin());
        command.args(["pools", "--check", "--output", "json", "--config"]).arg(&self.tools_conf);
        let (code, output, stderr) = run_tool(&mut command, Duration::from_secs(60))?;
        let report: Value = serde_json::from_str(&output).with_context(|| format!("pools --check answered no JSON (exit {code:?}): {output}{stderr}"))?;
        let findings: Vec<String> = report["findings"].as_array().into_iter().flatten().map(Value::to_string).collect();
        match code {
            Some(0) if findings.is_empty() => Ok(findings),
            Some(1) if !findings.is_empty() => Ok(findings),
            _ => bail!("pools --check exited {code:?} with {} findings: {output}", findings.len()),
        }
    }

    pub fn dir(&self) -> &Path {
        self.files.path()
    }
}

/// Runs a tool to completion (its environment without `CNI_COMMAND`, so it
/// is the CLI, not the plugin): its exit code (`None`: killed), stdout, stderr.
/// Killed after `limit`: a tool that hangs fails the trial, not the run.
fn run_tool(command: &mut Command, limit: Duration) -> Result<(Option<i32>, String, String)> {
    command.env_remove("CNI_COMMAND").stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped());
    let child = command.spawn().context("starting thereabouts")?;
    let pid = child.id();
    let (done, waited) = std::sync::mpsc::channel::<()>();
    let watchdog = std::thread::spawn(move || {
        if waited.recv_timeout(limit).is_err() {
            // SAFETY: plain syscall on our own child's PID, not reaped before
            // wait_with_output returns (and this thread is told first).
            unsafe {
                libc::kill(pid as libc::pid_t, libc::SIGKILL);
            }
        }
    });
    let out = child.wait_with_output().context("waiting for thereabouts");
    let _ = done.send(());
    let _ = watchdog.join();
    let out = out?;
    Ok((out.status.code(), String::from_utf8_lossy(&out.stdout).into_owned(), String::from_utf8_lossy(&out.stderr).into_owned()))
}
