//! A whereabouts v0.9.4 peer on the same IPPools and reservations, for interop
//! tests: it writes the objects the way whereabouts' Kubernetes storage does
//! (`pkg/storage/kubernetes/ipam.go`; types in
//! `pkg/api/whereabouts.cni.cncf.io/v1alpha1/`):
//!
//! * a missing pool is created as `{range, allocations}`; entries are keyed by
//!   the decimal offset from the network address, `{id, podref, ifname}` (no
//!   `ifname` before v0.8.0);
//! * every pool update is a JSON patch that tests the `resourceVersion` it read
//!   (and, for each added entry, the entry's absence): a 422 means "read again";
//! * an address is planned lowest-free-first, skipping one whose
//!   `OverlappingRangeIPReservation` someone else holds; the ORIP `{podref,
//!   ifname}` (no `containerid` since v0.8.0) is created after the pool write.
//!
//! [`Peer`] has the single steps; [`Churn`] is a peer whose pods come and go
//! in the background while a test runs the plugin.

use std::collections::VecDeque;
use std::net::IpAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use anyhow::{Result, bail};
use serde_json::{Map, Value, json};
use thereabouts_e2e::{add_offset, range_network};

use crate::Cluster;
use crate::addresses::reservation_name;
use crate::plugin::{GROUP_VERSION, IPPOOLS, Objects, RESERVATIONS};

/// An allocation as whereabouts writes it; an empty `ifname` is left out, as
/// whereabouts before v0.8.0 wrote it.
pub fn entry(id: &str, podref: &str, ifname: &str) -> Value {
    let mut e = json!({"id": id, "podref": podref});
    if !ifname.is_empty() {
        e["ifname"] = json!(ifname);
    }
    e
}

/// whereabouts' pool update that adds one entry at `offset` to the pool it read
/// at `version`.
pub fn insert_patch(version: &str, offset: u128, entry: &Value) -> Value {
    let path = format!("/spec/allocations/{offset}");
    json!([
        {"op": "test", "path": "/metadata/resourceVersion", "value": version},
        {"op": "test", "path": path, "value": null},
        {"op": "add", "path": path, "value": entry}
    ])
}

/// whereabouts' pool update that removes the entry at `offset` from the pool it
/// read at `version`.
pub fn remove_patch(version: &str, offset: u128) -> Value {
    json!([
        {"op": "test", "path": "/metadata/resourceVersion", "value": version},
        {"op": "remove", "path": format!("/spec/allocations/{offset}")}
    ])
}

/// What one allocation attempt of [`Peer::try_allocate`] came to.
#[derive(Debug, PartialEq, Eq)]
pub enum Attempt {
    /// The entry is written at `offset`; `reservation` is the uid of the ORIP it
    /// created, `None` when someone created that ORIP in between (whereabouts
    /// then leaves its entry unreserved).
    Added { offset: u128, reservation: Option<String> },
    /// The pool changed since the read (422): whereabouts reads again.
    Refused,
    /// No free offset.
    Full,
}

/// A whereabouts client with the admin identity, in one namespace.
pub struct Peer {
    objects: Objects,
}

impl Peer {
    /// In the kubeconfigs' namespace (`kube-system`).
    pub fn admin(cluster: &Cluster) -> Result<Peer> {
        Ok(Peer { objects: Objects::admin(cluster)? })
    }

    pub fn admin_in(cluster: &Cluster, namespace: &str) -> Result<Peer> {
        Ok(Peer { objects: Objects::admin_in(cluster, namespace)? })
    }

    /// Creates the pool `name` of `range` holding `allocations` (offset, entry).
    pub fn create_pool(&self, name: &str, range: &str, allocations: &[(u128, Value)]) -> Result<()> {
        let allocations: Map<String, Value> = allocations.iter().map(|(o, e)| (o.to_string(), e.clone())).collect();
        let pool = json!({"apiVersion": GROUP_VERSION, "kind": "IPPool", "metadata": {"name": name}, "spec": {"range": range, "allocations": allocations}});
        self.objects.create(IPPOOLS, &pool).map(|_| ())
    }

    /// Creates the ORIP of `ip` (`network_name` unset): its uid, or the API's
    /// refusal code (409 when someone holds it).
    pub fn reserve(&self, ip: IpAddr, podref: &str, ifname: &str) -> Result<std::result::Result<String, u16>> {
        let mut spec = json!({"podref": podref});
        if !ifname.is_empty() {
            spec["ifname"] = json!(ifname);
        }
        let orip = json!({"apiVersion": GROUP_VERSION, "kind": "OverlappingRangeIPReservation", "metadata": {"name": reservation_name(ip)}, "spec": spec});
        let created = self.objects.request(http::Method::POST, RESERVATIONS, None, "application/json", &orip)?;
        Ok(created.map(|o| o["metadata"]["uid"].as_str().unwrap_or_default().to_string()))
    }

    /// Deletes the ORIP of `ip` if it is still the one with `uid` (gone already is fine).
    pub fn unreserve(&self, ip: IpAddr, uid: &str) -> Result<()> {
        let options = json!({"apiVersion": "v1", "kind": "DeleteOptions", "preconditions": {"uid": uid}});
        match self.objects.request(http::Method::DELETE, RESERVATIONS, Some(&reservation_name(ip)), "application/json", &options)? {
            Ok(_) | Err(404) => Ok(()),
            Err(code) => bail!("deleting the reservation of {ip}: {code}"),
        }
    }

    /// The pool as read: its `resourceVersion` and allocations.
    pub fn read(&self, pool: &str) -> Result<(String, Map<String, Value>)> {
        let Some(p) = self.objects.get(IPPOOLS, pool)? else { bail!("IPPool {pool} is absent") };
        Ok((p["metadata"]["resourceVersion"].as_str().unwrap_or_default().to_string(), p["spec"]["allocations"].as_object().cloned().unwrap_or_default()))
    }

    /// One pass of whereabouts' ADD on `pool` (of `range`) for `entry`: read,
    /// plan the lowest free offset (with `reservations`, skipping addresses
    /// whose ORIP exists), patch on the version read, then reserve.
    pub fn try_allocate(&self, pool: &str, range: &str, entry: &Value, reservations: bool) -> Result<Attempt> {
        let (version, allocations) = self.read(pool)?;
        let (net, len) = range_network(range);
        let last = (1u128 << ((if net.is_ipv4() { 32 } else { 128 }) - u32::from(len)).min(64)) - 2;
        let reserved = |o: u128| -> Result<bool> { Ok(reservations && self.objects.get(RESERVATIONS, &reservation_name(add_offset(net, o)))?.is_some()) };
        let mut offset = None;
        for o in 1..=last {
            if !allocations.contains_key(&o.to_string()) && !reserved(o)? {
                offset = Some(o);
                break;
            }
        }
        let Some(offset) = offset else { return Ok(Attempt::Full) };
        match self.objects.json_patch(IPPOOLS, pool, &insert_patch(&version, offset, entry))? {
            Ok(_) => {}
            Err(422) => return Ok(Attempt::Refused),
            Err(code) => bail!("whereabouts' pool patch answered {code}"),
        }
        let reservation = if reservations {
            let (podref, ifname) = (entry["podref"].as_str().unwrap_or_default(), entry["ifname"].as_str().unwrap_or_default());
            match self.reserve(add_offset(net, offset), podref, ifname)? {
                Ok(uid) => Some(uid),
                Err(409) => None,
                Err(code) => bail!("reserving offset {offset}: {code}"),
            }
        } else {
            None
        };
        Ok(Attempt::Added { offset, reservation })
    }

    /// whereabouts' ADD to the end: [`Peer::try_allocate`] again after each 422.
    /// The offset written and the number of refused patches.
    pub fn allocate(&self, pool: &str, range: &str, entry: &Value, reservations: bool) -> Result<(u128, usize)> {
        let mut refused = 0;
        loop {
            match self.try_allocate(pool, range, entry, reservations)? {
                Attempt::Added { offset, .. } => return Ok((offset, refused)),
                Attempt::Refused => refused += 1,
                Attempt::Full => bail!("IPPool {pool} is full"),
            }
        }
    }

    /// One pass of whereabouts' DEL of the entry at `offset`: read, patch on
    /// the version read. False when refused (422: the pool moved).
    pub fn try_release(&self, pool: &str, offset: u128) -> Result<bool> {
        let (version, _) = self.read(pool)?;
        match self.objects.json_patch(IPPOOLS, pool, &remove_patch(&version, offset))? {
            Ok(_) => Ok(true),
            Err(422) => Ok(false),
            Err(code) => bail!("whereabouts' pool patch answered {code}"),
        }
    }
}

/// A whereabouts cluster's pods on one IPPool, coming and going in the
/// background: a few entries that stay ([`Churn::STICKY`]), and every ~50 ms
/// one entry added (the lowest free offset, reserved) or its oldest churned
/// entry removed (then its reservation). A refused patch is retried at the next
/// tick. Before each step it checks that every entry it holds is still there,
/// its own.
pub struct Churn {
    peer: Peer,
    pool: String,
    range: String,
    /// Entries that stay (pods that live through the test).
    pub sticky: Vec<(u128, String)>,
    /// Entries added and not yet removed, oldest first, with their reservation's uid.
    pub churned: VecDeque<(u128, String, Option<String>)>,
    next_pod: usize,
    pub stats: ChurnStats,
}

#[derive(Debug, Default)]
pub struct ChurnStats {
    pub adds: usize,
    pub removes: usize,
    /// Patches refused because the pool moved (retried).
    pub conflicts: usize,
    /// Reservations it could not create (someone held the address's ORIP).
    pub reservations_lost: usize,
    /// Entries of its own found changed or gone: must stay empty.
    pub violations: Vec<String>,
}

impl Churn {
    pub const STICKY: [u128; 3] = [3, 7, 11];
    const MAX_CHURNED: usize = 3;

    /// Creates the pool with the sticky entries, each reserved.
    pub fn start(cluster: &Cluster, pool: &str, range: &str) -> Result<Churn> {
        let peer = Peer::admin(cluster)?;
        let sticky: Vec<(u128, String)> = Self::STICKY.iter().map(|o| (*o, format!("wb-sticky-{o}"))).collect();
        let allocations: Vec<(u128, Value)> = sticky.iter().map(|(o, id)| (*o, entry(id, &format!("other/{id}"), "net1"))).collect();
        peer.create_pool(pool, range, &allocations)?;
        let net = range_network(range).0;
        for (offset, id) in &sticky {
            if let Err(code) = peer.reserve(add_offset(net, *offset), &format!("other/{id}"), "net1")? {
                bail!("reserving sticky entry {offset}: {code}");
            }
        }
        Ok(Churn { peer, pool: pool.to_string(), range: range.to_string(), sticky, churned: VecDeque::new(), next_pod: 0, stats: ChurnStats::default() })
    }

    pub fn address(&self, offset: u128) -> IpAddr {
        add_offset(range_network(&self.range).0, offset)
    }

    /// Every entry it holds now: (offset, container ID).
    pub fn held(&self) -> Vec<(u128, String)> {
        self.sticky.iter().cloned().chain(self.churned.iter().map(|(o, id, _)| (*o, id.clone()))).collect()
    }

    fn tick(&mut self, tick: usize) -> Result<()> {
        let (version, allocations) = self.peer.read(&self.pool)?;
        for (offset, id) in self.held() {
            let found = allocations.get(&offset.to_string()).map(|e| e["id"].clone());
            if found != Some(json!(id)) {
                self.stats.violations.push(format!("entry {offset} of {id} is now {found:?} (resourceVersion {version})"));
            }
        }
        if self.churned.is_empty() || (self.churned.len() < Self::MAX_CHURNED && tick.is_multiple_of(2)) {
            let id = format!("wb-churn-{}", self.next_pod);
            match self.peer.try_allocate(&self.pool, &self.range, &entry(&id, &format!("other/{id}"), "net1"), true)? {
                Attempt::Added { offset, reservation } => {
                    self.next_pod += 1;
                    self.stats.adds += 1;
                    self.stats.reservations_lost += usize::from(reservation.is_none());
                    self.churned.push_back((offset, id, reservation));
                }
                Attempt::Refused => self.stats.conflicts += 1,
                Attempt::Full => {}
            }
        } else if let Some((offset, _, reservation)) = self.churned.front().cloned() {
            if self.peer.try_release(&self.pool, offset)? {
                self.churned.pop_front();
                self.stats.removes += 1;
                if let Some(uid) = reservation {
                    self.peer.unreserve(self.address(offset), &uid)?;
                }
            } else {
                self.stats.conflicts += 1;
            }
        }
        Ok(())
    }

    /// Runs a step every ~50 ms until `stop`; panics on an API failure.
    pub fn run(mut self, stop: &AtomicBool) -> Churn {
        let mut tick = 0;
        while !stop.load(Ordering::SeqCst) {
            self.tick(tick).unwrap_or_else(|e| panic!("whereabouts peer: {e:#}"));
            tick += 1;
            std::thread::sleep(Duration::from_millis(50));
        }
        self
    }
}
