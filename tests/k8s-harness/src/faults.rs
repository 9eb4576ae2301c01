//! The faults a trial injects ([`Fault`]), per datastore ([`Datastore`]), and
//! the plan of one injection ([`Plan`]): what, when, for how long, and which
//! plugin processes, all drawn from the trial's seeded generator so that the
//! printed plan replays. Injecting is [`crate::fault_world::World`]'s job; a
//! trial around it is [`crate::fault_trial`]'s.

use std::fmt;
use std::time::Duration;

use crate::trial_rng::TrialRng;

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Datastore {
    Kubernetes,
    Etcd,
}

impl Datastore {
    pub fn parse(text: &str) -> Option<Datastore> {
        match text {
            "kubernetes" => Some(Datastore::Kubernetes),
            "etcd" => Some(Datastore::Etcd),
            _ => None,
        }
    }

    pub fn label(self) -> &'static str {
        match self {
            Datastore::Kubernetes => "kubernetes",
            Datastore::Etcd => "etcd",
        }
    }

    /// The faults trials of this datastore take turns with.
    pub fn faults(self) -> &'static [Fault] {
        match self {
            Datastore::Kubernetes => &[Fault::PluginKill, Fault::Failpoint, Fault::ServerRestart, Fault::Latency, Fault::ResetPeer, Fault::BlackHole],
            Datastore::Etcd => {
                &[Fault::PluginKill, Fault::Failpoint, Fault::LeaderLoss, Fault::FollowerLoss, Fault::Latency, Fault::ResetPeer, Fault::BlackHole]
            }
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Fault {
    /// Some plugin processes SIGKILLed, each at a random delay after its start.
    PluginKill,
    /// Some plugin processes armed to SIGKILL themselves at one named point
    /// of the plugin (`host/src/failpoint.rs`), drawn per trial.
    Failpoint,
    /// The kube-apiserver SIGKILLed, then started again.
    ServerRestart,
    /// The etcd member that leads SIGKILLed, then restarted.
    LeaderLoss,
    /// An etcd member that follows SIGKILLed, then restarted.
    FollowerLoss,
    /// toxiproxy between plugin and server: latency on both directions.
    Latency,
    /// toxiproxy: every connection reset (TCP RST) once it carries data.
    ResetPeer,
    /// toxiproxy: data dropped, connections left open (a partition).
    BlackHole,
}

impl Fault {
    const ALL: [Fault; 8] =
        [Fault::PluginKill, Fault::Failpoint, Fault::ServerRestart, Fault::LeaderLoss, Fault::FollowerLoss, Fault::Latency, Fault::ResetPeer, Fault::BlackHole];

    /// The fault named `slug` (`fault_trials --fault`).
    pub fn parse(slug: &str) -> Option<Fault> {
        Fault::ALL.into_iter().find(|f| f.slug() == slug)
    }

    pub fn slug(self) -> &'static str {
        match self {
            Fault::PluginKill => "plugin-kill",
            Fault::Failpoint => "failpoint",
            Fault::ServerRestart => "server-restart",
            Fault::LeaderLoss => "leader-loss",
            Fault::FollowerLoss => "follower-loss",
            Fault::Latency => "latency",
            Fault::ResetPeer => "reset-peer",
            Fault::BlackHole => "black-hole",
        }
    }

    pub fn label(self) -> &'static str {
        match self {
            Fault::PluginKill => "plugin SIGKILL",
            Fault::Failpoint => "plugin SIGKILL at a failpoint",
            Fault::ServerRestart => "apiserver killed + restarted",
            Fault::LeaderLoss => "etcd leader killed + restarted",
            Fault::FollowerLoss => "etcd follower killed + restarted",
            Fault::Latency => "toxiproxy latency",
            Fault::ResetPeer => "toxiproxy reset_peer",
            Fault::BlackHole => "toxiproxy black hole (timeout)",
        }
    }

    /// Whether the plugin reaches its datastore through toxiproxy for it.
    pub fn proxied(self) -> bool {
        matches!(self, Fault::Latency | Fault::ResetPeer | Fault::BlackHole)
    }
}

/// One injection, as drawn.
#[derive(Clone, Debug)]
pub struct Plan {
    pub fault: Fault,
    /// From the release of the burst to the injection.
    pub at: Duration,
    /// How long the fault lasts before it is healed (a server restarted,
    /// a toxic removed); for a restart, the wait before the start.
    pub span: Duration,
    /// [`Fault::Latency`]: each way.
    pub latency: Duration,
    /// For an etcd proxy fault: which members' proxies get the toxic (all
    /// of them, or one), and the plugin's endpoints are those proxies.
    pub proxied_members: Vec<usize>,
    /// [`Fault::PluginKill`]: per call of the burst, the delay after its
    /// start at which it is SIGKILLed (`None`: left alone).
    pub kills: Vec<Option<Duration>>,
    /// [`Fault::Failpoint`]: the point, and per call whether it is armed.
    pub failpoint: Option<&'static str>,
    pub armed: Vec<bool>,
}

/// The variable that arms a plugin failpoint (`host/src/failpoint.rs`).
pub const FAILPOINT_ENV: &str = "THEREABOUTS_FAILPOINT";

/// The plugin's failpoints a trial of the Kubernetes datastore (`members` 0)
/// or of etcd can reach (the names of `host/src/failpoint.rs`).
pub fn failpoints(members: usize) -> &'static [&'static str] {
    match members {
        0 => &["kubernetes/reserved", "kubernetes/pools-written", "cni/before-answer"],
        _ => &["etcd/before-commit", "etcd/after-commit", "cni/before-answer"],
    }
}

/// Per call, with probability ½ and at least one, whether it is chosen.
fn some_of(calls: usize, rng: &mut TrialRng) -> Vec<bool> {
    let mut chosen: Vec<bool> = (0..calls).map(|_| rng.chance(0.5)).collect();
    if !chosen.contains(&true) && calls > 0 {
        chosen[rng.below(calls)] = true;
    }
    chosen
}

impl Plan {
    /// Draws the plan of `fault` for a burst of `calls` processes against
    /// `members` etcd members (0 for the Kubernetes datastore).
    pub fn draw(fault: Fault, calls: usize, members: usize, rng: &mut TrialRng) -> Plan {
        let at = rng.millis(0, 250);
        let span = match fault {
            Fault::ServerRestart => rng.millis(0, 1500),
            Fault::ResetPeer => rng.millis(100, 1500),
            _ => rng.millis(200, 2500),
        };
        let latency = rng.millis(20, 1000);
        let proxied_members = match members {
            0 => Vec::new(),
            n if rng.chance(0.5) => (0..n).collect(),
            n => vec![rng.below(n)],
        };
        let kills = if fault == Fault::PluginKill {
            let mut kills: Vec<Option<Duration>> = (0..calls).map(|_| rng.chance(0.5).then(|| rng.millis(2, 150))).collect();
            if kills.iter().all(Option::is_none) && calls > 0 {
                let i = rng.below(calls);
                kills[i] = Some(rng.millis(2, 150));
            }
            kills
        } else {
            vec![None; calls]
        };
        let (failpoint, armed) = if fault == Fault::Failpoint {
            let points = failpoints(members);
            (Some(points[rng.below(points.len())]), some_of(calls, rng))
        } else {
            (None, vec![false; calls])
        };
        Plan { fault, at, span, latency, proxied_members, kills, failpoint, armed }
    }
}

impl fmt::Display for Plan {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.fault.label())?;
        match self.fault {
            Fault::PluginKill => {
                let killed: Vec<String> = self.kills.iter().enumerate().filter_map(|(i, k)| k.map(|d| format!("#{i}@{}ms", d.as_millis()))).collect();
                write!(f, ": {} of {} calls killed ({})", killed.len(), self.kills.len(), killed.join(" "))
            }
            Fault::Failpoint => {
                let armed: Vec<String> = self.armed.iter().enumerate().filter(|(_, a)| **a).map(|(i, _)| format!("#{i}")).collect();
                write!(f, " {}: {} of {} calls armed ({})", self.failpoint.unwrap_or_default(), armed.len(), self.armed.len(), armed.join(" "))
            }
            _ => {
                write!(f, " at {} ms for {} ms", self.at.as_millis(), self.span.as_millis())?;
                if self.fault == Fault::Latency {
                    write!(f, ", {} ms each way", self.latency.as_millis())?;
                }
                if self.fault.proxied() && !self.proxied_members.is_empty() {
                    write!(f, ", etcd members {:?} proxied", self.proxied_members)?;
                }
                Ok(())
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_plugin_kill_plan_kills_at_least_one_call_and_others_kill_none() {
        for seed in 0..200 {
            let plan = Plan::draw(Fault::PluginKill, 3, 0, &mut TrialRng::new(seed));
            assert!(plan.kills.iter().any(Option::is_some), "seed {seed}");
            let plan = Plan::draw(Fault::BlackHole, 3, 3, &mut TrialRng::new(seed));
            assert!(plan.kills.iter().all(Option::is_none));
            assert!(!plan.proxied_members.is_empty() && plan.proxied_members.iter().all(|m| *m < 3));
        }
    }

    #[test]
    fn a_failpoint_plan_arms_at_least_one_call_at_a_point_of_its_datastore() {
        for (seed, members) in (0..200).zip([0, 3].into_iter().cycle()) {
            let plan = Plan::draw(Fault::Failpoint, 3, members, &mut TrialRng::new(seed));
            assert!(plan.armed.contains(&true), "seed {seed}");
            assert!(failpoints(members).contains(&plan.failpoint.unwrap()));
        }
    }

    /// The names armed are the plugin's (its one list of them).
    #[test]
    fn every_failpoint_armed_is_declared_by_the_plugin() {
        let source = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../../host/src/failpoint.rs")).unwrap();
        assert!(source.contains(&format!("ENV: &str = \"{FAILPOINT_ENV}\";")));
        for point in failpoints(0).iter().chain(failpoints(3)) {
            assert!(source.contains(&format!("= \"{point}\";")), "{point} is not a failpoint of host/src/failpoint.rs");
        }
    }
}
