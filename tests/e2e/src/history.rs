//! A history checker: every call of a run as the runtime saw it (what was
//! asked, when it started and ended, what it answered), checked against the
//! model of an allocator whatever the interleaving, as etcd's robustness tests
//! and Jepsen check theirs:
//!
//! - **No address held twice.** An ADD certainly holds its addresses from the
//!   moment it returned (its commit came before) until the first DEL of its
//!   attachment that could have freed them started (any DEL that had not
//!   ended before the ADD began). Two attachments whose certain windows
//!   overlap on one address held it at once.
//! - **What is left is what the history leaves.** After the run the datastore
//!   holds exactly the addresses of each attachment's last successful ADD
//!   with no DEL after it: one such address not held is lost (the next pod may
//!   get it twice), one held by an attachment whose ADD failed or whose DEL
//!   succeeded is a leak. An attachment whose calls overlap, or whose DEL
//!   failed, has no certain end state and is not judged.
//!
//! An attachment is a pod's interface (`K8S_POD_NAMESPACE/K8S_POD_NAME` and
//! CNI_IFNAME), or without pod names a container's, as thereabouts and
//! whereabouts key their entries.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::time::Instant;

use crate::{Outcome, addr_of};

/// Who holds an address: `namespace/pod` (or the container ID) and interface.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Attachment {
    pub holder: String,
    pub ifname: String,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Op {
    Add,
    Del,
}

/// One call, as recorded.
#[derive(Clone, Debug)]
pub struct Event {
    pub op: Op,
    pub attachment: Attachment,
    pub start: Instant,
    pub end: Instant,
    pub ok: bool,
    /// A successful ADD's addresses.
    pub addresses: Vec<IpAddr>,
}

/// What the checker found wrong.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Violation {
    /// Two attachments certainly held `address` at once.
    HeldTwice { address: IpAddr, first: Attachment, second: Attachment },
    /// The history leaves `address` held by `by`; the datastore does not
    /// (`found`: who holds it there instead, if anyone).
    Lost { address: IpAddr, by: Attachment, found: Option<Attachment> },
    /// The datastore holds `address` for `by`, whose history leaves it nothing there.
    Leaked { address: IpAddr, by: Attachment },
}

/// When an ADD certainly held an address: from its return until the first
/// DEL of its attachment that could have freed it started (`None`: never).
struct Window<'h> {
    from: Instant,
    until: Option<Instant>,
    by: &'h Attachment,
}

#[derive(Clone, Debug, Default)]
pub struct History {
    pub events: Vec<Event>,
}

impl History {
    /// The ADDs and DELs among `outcomes` (other commands are not about holding).
    pub fn of(outcomes: &[&Outcome]) -> History {
        let events = outcomes
            .iter()
            .filter_map(|o| {
                let op = match o.call.command.as_str() {
                    "ADD" => Op::Add,
                    "DEL" => Op::Del,
                    _ => return None,
                };
                let addresses = if op == Op::Add && o.ok() { o.ips().iter().map(|ip| addr_of(ip)).collect() } else { Vec::new() };
                Some(Event { op, attachment: attachment_of(o), start: o.started, end: o.started + o.elapsed, ok: o.ok(), addresses })
            })
            .collect();
        History { events }
    }

    /// The pairs of attachments that certainly held one address at once.
    pub fn held_twice(&self) -> Vec<Violation> {
        let mut windows: BTreeMap<IpAddr, Vec<Window>> = BTreeMap::new();
        for add in self.events.iter().filter(|e| e.op == Op::Add && e.ok) {
            let released = self.events.iter().filter(|d| d.op == Op::Del && d.attachment == add.attachment && d.end > add.start).map(|d| d.start).min();
            if released.is_some_and(|r| r <= add.end) {
                continue; // a DEL ran beside it: nothing is certain
            }
            for address in &add.addresses {
                windows.entry(*address).or_default().push(Window { from: add.end, until: released, by: &add.attachment });
            }
        }
        let mut found = Vec::new();
        for (address, held) in windows {
            for (i, a) in held.iter().enumerate() {
                for b in &held[i + 1..] {
                    let from = a.from.max(b.from);
                    let overlap = a.until.is_none_or(|e| from < e) && b.until.is_none_or(|e| from < e);
                    if a.by != b.by && overlap {
                        found.push(Violation::HeldTwice { address, first: a.by.clone(), second: b.by.clone() });
                    }
                }
            }
        }
        found
    }

    /// What each attachment of the history holds at its end, where that is
    /// certain: its last call (by start) a successful ADD (its addresses) or
    /// DEL (nothing), no two of its calls overlapping, no DEL of it failed.
    pub fn left_held(&self) -> BTreeMap<&Attachment, Vec<IpAddr>> {
        let mut by_attachment: BTreeMap<&Attachment, Vec<&Event>> = BTreeMap::new();
        for e in &self.events {
            by_attachment.entry(&e.attachment).or_default().push(e);
        }
        let mut left = BTreeMap::new();
        for (attachment, mut calls) in by_attachment {
            calls.sort_by_key(|e| e.start);
            let overlapping = calls.windows(2).any(|w| w[1].start < w[0].end);
            if overlapping || calls.iter().any(|e| e.op == Op::Del && !e.ok) {
                continue;
            }
            let mut holds = Vec::new();
            for e in calls {
                match (e.op, e.ok) {
                    (Op::Add, true) => holds = e.addresses.clone(),
                    (Op::Del, true) => holds.clear(),
                    // A failed ADD adds nothing, and the runtime DELs it; what it held before stays.
                    _ => {}
                }
            }
            left.insert(attachment, holds);
        }
        left
    }

    /// The datastore after the run (`held`: every address of the ranges the
    /// history used, with its holder) against what the history leaves held.
    /// Holders the history does not know (another client's) are not judged,
    /// but one holding an address the history leaves to one of its own is.
    pub fn against(&self, held: &BTreeMap<IpAddr, Attachment>) -> Vec<Violation> {
        let left = self.left_held();
        let mut found = Vec::new();
        for (attachment, addresses) in &left {
            for address in addresses {
                let holder = held.get(address);
                if holder != Some(*attachment) {
                    found.push(Violation::Lost { address: *address, by: (*attachment).clone(), found: holder.cloned() });
                }
            }
        }
        for (address, holder) in held {
            if left.get(holder).is_some_and(|addresses| !addresses.contains(address)) {
                found.push(Violation::Leaked { address: *address, by: holder.clone() });
            }
        }
        found
    }

    /// Every violation: [`History::held_twice`] and [`History::against`].
    pub fn check(&self, held: &BTreeMap<IpAddr, Attachment>) -> Vec<Violation> {
        let mut found = self.held_twice();
        found.extend(self.against(held));
        found
    }
}

/// The attachment a call is about, as the plugin keys it.
pub fn attachment_of(o: &Outcome) -> Attachment {
    let arg = |key: &str| o.call.cni_args.split(';').find_map(|kv| kv.strip_prefix(key)).unwrap_or("").to_string();
    let (namespace, pod) = (arg("K8S_POD_NAMESPACE="), arg("K8S_POD_NAME="));
    let holder = if pod.is_empty() { o.call.container_id.clone() } else { format!("{namespace}/{pod}") };
    Attachment { holder, ifname: o.call.ifname.clone() }
}

/// A pool entry's attachment (its `podref`, else its container `id`).
pub fn attachment_of_entry(podref: &str, id: &str, ifname: &str) -> Attachment {
    Attachment { holder: if podref.is_empty() { id.to_string() } else { podref.to_string() }, ifname: ifname.to_string() }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn who(pod: &str) -> Attachment {
        Attachment { holder: format!("default/{pod}"), ifname: "eth0".into() }
    }

    /// `(op, pod, start ms, end ms, ok, addresses)`.
    type Recorded<'a> = (Op, &'a str, u64, u64, bool, &'a [&'a str]);

    fn history(calls: &[Recorded]) -> History {
        let t0 = Instant::now();
        let at = |ms: u64| t0 + Duration::from_millis(ms);
        let events = calls
            .iter()
            .map(|(op, pod, start, end, ok, ips)| Event {
                op: *op,
                attachment: who(pod),
                start: at(*start),
                end: at(*end),
                ok: *ok,
                addresses: ips.iter().map(|ip| ip.parse().unwrap()).collect(),
            })
            .collect();
        History { events }
    }

    fn ip(text: &str) -> IpAddr {
        text.parse().unwrap()
    }

    #[test]
    fn an_address_given_again_after_its_del_is_no_duplicate_but_before_it_is() {
        use Op::*;
        let freed_first = history(&[(Add, "a", 0, 10, true, &["192.0.2.1"]), (Del, "a", 20, 30, true, &[]), (Add, "b", 25, 40, true, &["192.0.2.1"])]);
        assert_eq!(freed_first.held_twice(), []);
        let taken = history(&[(Add, "a", 0, 10, true, &["192.0.2.1"]), (Add, "b", 12, 15, true, &["192.0.2.1"]), (Del, "a", 20, 30, true, &[])]);
        assert_eq!(taken.held_twice(), [Violation::HeldTwice { address: ip("192.0.2.1"), first: who("a"), second: who("b") }]);
        // Concurrent ADDs of one address, neither ever freed: one of them is wrong.
        let both = history(&[(Add, "a", 0, 10, true, &["192.0.2.1"]), (Add, "b", 5, 8, true, &["192.0.2.1"])]);
        assert_eq!(both.held_twice().len(), 1);
        // The same pod's repeated ADD is one attachment.
        assert_eq!(history(&[(Add, "a", 0, 10, true, &["192.0.2.1"]), (Add, "a", 11, 12, true, &["192.0.2.1"])]).held_twice(), []);
    }

    #[test]
    fn the_datastore_must_hold_what_the_history_leaves_and_nothing_else() {
        use Op::*;
        let h = history(&[
            (Add, "a", 0, 10, true, &["192.0.2.1"]),
            (Add, "b", 0, 10, true, &["192.0.2.2"]),
            (Del, "b", 20, 30, true, &[]),
            (Add, "c", 0, 10, false, &[]),
            (Add, "d", 0, 10, true, &["192.0.2.4"]),
            (Del, "d", 20, 30, false, &[]),
        ]);
        let held = |pairs: &[(&str, &str)]| pairs.iter().map(|(a, pod)| (ip(a), who(pod))).collect::<BTreeMap<_, _>>();
        assert_eq!(h.against(&held(&[("192.0.2.1", "a"), ("192.0.2.4", "d")])), [], "d's DEL failed: either is right");
        assert_eq!(h.against(&held(&[("192.0.2.1", "a"), ("192.0.2.9", "other")])), [], "another client's entry is not judged");
        assert_eq!(
            h.against(&held(&[("192.0.2.2", "b"), ("192.0.2.3", "c")])),
            [
                Violation::Lost { address: ip("192.0.2.1"), by: who("a"), found: None },
                Violation::Leaked { address: ip("192.0.2.2"), by: who("b") },
                Violation::Leaked { address: ip("192.0.2.3"), by: who("c") },
            ]
        );
    }
}
