//! One command's cycle on the Kubernetes datastore: what the call learns
//! between its reads and its commits (the objects read, reservations it made or
//! found taken, what a DEL's attachment holds) lives here and dies with it.
//! The request sequence of each path is in `docs/datastores.md`.

use std::collections::{BTreeSet, HashMap};
use std::time::Instant;

use http::Method;
use serde_json::Value;
use thereabouts_allocator::model::{Allocation, Attachment};

use super::crd::{self, IPPOOLS, PoolObject, RESERVATIONS};
use super::node_turn::NodeTurn;
use super::turn::{self, Turn};
use super::{CLEANUP_GRACE, JSON, JSON_PATCH, KubernetesStore, REQUEST_TIMEOUT, Reply, Request, THROTTLE_RETRIES, WRITE_TIMEOUT, failure, patch};
use crate::datastore::pool_note::PoolNote;
use crate::datastore::{Change, DatastoreError, Outcome, Pool, PoolId, PoolUpdate, Purpose, ReservedOffsets, Retry, Transaction, Version};
use crate::logging;

pub(super) struct KubeTransaction<'s> {
    store: &'s KubernetesStore,
    pools: Vec<PoolId>,
    deadline: Instant,
    /// The last object read per pool name: its keys and shape make the patch.
    read: HashMap<String, PoolObject>,
    /// Per pool name: the revision (collection resourceVersion) of its last read.
    read_revisions: HashMap<String, String>,
    /// Offsets found reserved by others, per pool name.
    reserved: ReservedOffsets,
    /// Reservations this call created that no successful commit recorded yet,
    /// by name: kept across a conflict for the retry, deleted when the retry plans
    /// other addresses, when a commit fails otherwise, and on drop.
    held: HashMap<String, Held>,
    /// Set when a commit lost a reservation race: the pools did not refuse
    /// anything, so the retry plans again on the reads it has (see `load`).
    reuse_reads: bool,
    /// Reservation races this call lost. After the first, a reservation found
    /// taken is not read to see whose it is: see `reserve`.
    races_lost: u32,
    /// A DEL's attachment ([`Purpose::Release`]), whose labelled reservations
    /// `free_leftovers` lists.
    releasing: Option<Releasing>,
    /// Where the call stands with turns ([`turn`]).
    turn: TurnState,
    /// A DEL's offer for group commit ([`Transaction::release_together`]).
    offer: Option<turn::ReleaseOffer>,
    /// The tickets of the DELs the next commit may serve, with their
    /// attachments ([`Transaction::queued_releases`]).
    serving: Vec<(String, Attachment)>,
}

/// See [`KubeTransaction::turn`].
enum TurnState {
    /// No race lost yet: attempts fail fast (their pool patches test the
    /// version read) instead of being re-applied inside the apiserver.
    NotYet,
    /// A race was lost, and this call now holds its turn on its pools.
    Holding(Turn),
    /// Its pools are this node's slice pools, and it holds the node's lock on
    /// them from the start ([`NodeTurn`]): it alone writes them now.
    Node(NodeTurn),
    /// A race was lost and no turn could be had (or it ended): attempts are
    /// re-applied inside the apiserver, as before turns existed.
    Without,
}

/// See [`KubeTransaction::releasing`].
struct Releasing {
    container_id: String,
    ifname: String,
}

/// A reservation this call created.
#[derive(Debug, Clone)]
struct Held {
    uid: String,
    /// The pool the address was planned in.
    pool: String,
    holder: Allocation,
}

impl Held {
    /// Whether it reserves the address for `holder`'s attachment (same container,
    /// pod and interface), so a retry that plans the address again can use it.
    fn serves(&self, holder: &Allocation) -> bool {
        self.holder.container_id == holder.container_id && self.holder.pod_ref == holder.pod_ref && self.holder.ifname == holder.ifname
    }
}

/// How a reservation attempt ended.
enum Reservation {
    Created {
        uid: String,
    },
    /// It existed already for this attachment (a retried ADD), or was made by
    /// whereabouts for the same pod and interface.
    Adopted,
    HeldElsewhere(crd::ReservationObject),
    /// It exists, and this call already lost a race: taken by a racer, not read.
    Taken,
    /// Created and deleted by others under our feet twice in a row.
    Contended,
}

/// Begins a cycle.
pub(super) fn begin<'s>(store: &'s KubernetesStore, pools: &[PoolId], purpose: Purpose<'_>, deadline: Instant) -> Result<KubeTransaction<'s>, DatastoreError> {
    let releasing = match purpose {
        Purpose::Release { container_id, ifname } => Some(Releasing { container_id: container_id.to_string(), ifname: ifname.to_string() }),
        Purpose::Read | Purpose::Update => None,
    };
    // Only this node writes its slice pools: its calls take turns on the node.
    let node_local = !pools.is_empty() && pools.iter().all(|p| p.node_local) && purpose != Purpose::Read;
    let turn = match node_local.then(|| NodeTurn::take(&store.lock_scope(), pools, deadline)).flatten() {
        Some(held) => TurnState::Node(held),
        None => TurnState::NotYet,
    };
    Ok(KubeTransaction {
        store,
        pools: pools.to_vec(),
        deadline,
        read: HashMap::new(),
        read_revisions: HashMap::new(),
        reserved: ReservedOffsets::default(),
        held: HashMap::new(),
        reuse_reads: false,
        races_lost: 0,
        releasing,
        turn,
        offer: None,
        serving: Vec::new(),
    })
}

/// The reservations labelled with the attachment (container ID, interface):
/// one LIST by label, which the apiserver serves by walking every reservation
/// of the namespace (its cache has no index by label).
fn labelled_reservations(
    store: &KubernetesStore,
    container_id: &str,
    ifname: &str,
    deadline: Instant,
) -> Result<HashMap<String, crd::ReservationObject>, DatastoreError> {
    let action = format!("listing the OverlappingRangeIPReservations of container {container_id} interface {ifname} in namespace {}", store.namespace);
    let path = crd::attachment_reservations_path(&store.namespace, container_id, ifname);
    let labelled = match store.call(Method::GET, &path, None, &action, deadline)? {
        Reply::Object(list) => list
            .get("items")
            .and_then(Value::as_array)
            .map(Vec::as_slice)
            .unwrap_or_default()
            .iter()
            .map(crd::parse_reservation)
            .filter(|r| !r.name.is_empty())
            .map(|r| (r.name.clone(), r))
            .collect(),
        // An identity from an older deploy/rbac.yaml (no `list`): the DEL still
        // frees every reservation its pool entries lead to.
        Reply::Status(s) if s.code == 403 => {
            logging::error(format!(
                "{}; reservations left by failed ADDs stay, nothing else frees them (grant `list` on overlappingrangeipreservations, see deploy/rbac.yaml)",
                store.status_error(&s, &action)
            ));
            HashMap::new()
        }
        Reply::Status(s) => return Err(store.status_error(&s, &action)),
    };
    Ok(labelled)
}

impl Transaction for KubeTransaction<'_> {
    /// In its turn a call reads its pools at once (one round trip for all
    /// ranges); otherwise one after the other. Not at once outside a turn: a
    /// burst's first attempts would double the requests that reach the
    /// apiserver together, and its flow control then turned many of them away
    /// (a burst of 500 ADDs took 53 s instead of 22).
    fn load(&mut self) -> Result<Vec<Pool>, DatastoreError> {
        let pools = self.pools.clone();
        let to_read: Vec<&PoolId> = pools.iter().filter(|p| !(self.reuse_reads && self.read.contains_key(&p.name))).collect();
        let requests: Vec<Request> = to_read.iter().map(|p| self.pool_read_request(p)).collect();
        let replies = if self.serialized() {
            self.store.call_all(&requests, self.deadline, REQUEST_TIMEOUT, 0)
        } else {
            requests.iter().map(|r| self.store.call_one(r, self.deadline, REQUEST_TIMEOUT, 0)).collect()
        };
        let mut fresh = HashMap::new();
        for (pool, reply) in to_read.into_iter().zip(replies) {
            let object = self.pool_from_reply(pool, reply?)?;
            if let TurnState::Node(turn) = &self.turn {
                turn.note(&pool.name, &PoolNote::of(object.as_ref().map(|o| o.entries.as_slice()).unwrap_or_default()));
            }
            fresh.insert(pool.name.clone(), object);
        }
        pools.iter().map(|pool| Ok(self.load_one(pool, fresh.remove(&pool.name)))).collect()
    }

    /// One attempt; after the first lost race, waits for this call's turn on
    /// its pools before it returns the [`Retry`] (see [`turn`]).
    fn commit(&mut self, updates: &[PoolUpdate]) -> Result<Outcome, DatastoreError> {
        // A DEL that writes its pools queues first: DELs come in bursts (a
        // Deployment scaled down), and in its turn a DEL also removes the
        // entries of the DELs of its group queued behind it (group commit). A
        // first attempt of each would send its whole-pool patch into the
        // stampede, and a refused patch costs the apiserver as much as one
        // that lands. Uncontended, this costs three requests on a small Lease.
        if self.offer.is_some() && matches!(self.turn, TurnState::NotYet) && updates.iter().any(|u| u.changes.iter().any(Change::guards_entries)) {
            self.turn = match turn::take(self.store, &self.pools, &self.holder_identity(updates), self.offer.as_ref(), self.deadline) {
                Some(turn) => TurnState::Holding(turn),
                None => TurnState::Without,
            };
            return Ok(Outcome::Retry(Retry::Turn));
        }
        let outcome = self.attempt(updates)?;
        if matches!(outcome, Outcome::Retry(Retry::Conflict { .. })) && matches!(self.turn, TurnState::NotYet) {
            // What this attempt reserved goes before the wait: the calls whose
            // turn comes first would otherwise plan into it and lose, one
            // reservation race per address held by a waiter.
            // One it cannot delete stays held: the next attempt tries again first.
            let _ = self.release_held(&BTreeSet::new(), self.deadline.max(Instant::now() + CLEANUP_GRACE));
            self.turn = match turn::take(self.store, &self.pools, &self.holder_identity(updates), self.offer.as_ref(), self.deadline) {
                Some(turn) => TurnState::Holding(turn),
                None => TurnState::Without,
            };
            // Others committed while this call waited: plan on a new read.
            self.reuse_reads = false;
        }
        Ok(outcome)
    }

    fn serialized(&self) -> bool {
        matches!(self.turn, TurnState::Holding(_) | TurnState::Node(_))
    }

    fn release_together(&mut self, group: &str, attachment: &Attachment) {
        self.offer = Some(turn::ReleaseOffer { group: group.to_string(), container_id: attachment.container_id.clone(), ifname: attachment.ifname.clone() });
    }

    fn queued_releases(&mut self) -> Vec<Attachment> {
        self.serving.clear();
        let (TurnState::Holding(held), Some(offer)) = (&mut self.turn, &self.offer) else { return Vec::new() };
        let queued = turn::queued(self.store, held, &self.pools, offer, self.deadline);
        if !queued.is_empty() {
            logging::debug(format!("serving {} DEL(s) queued behind this one in its write", queued.len()));
        }
        queued
            .into_iter()
            .map(|(ticket, container_id, ifname)| {
                let attachment = Attachment { container_id, ifname, claim: None };
                self.serving.push((ticket, attachment.clone()));
                attachment
            })
            .collect()
    }

    fn free_leftovers(&mut self, in_use: &[String]) -> Result<usize, DatastoreError> {
        let Some(releasing) = self.releasing.take() else { return Ok(0) };
        let labelled = labelled_reservations(self.store, &releasing.container_id, &releasing.ifname, self.deadline)?;
        let mut freed = 0;
        for (name, r) in &labelled {
            // The label is a hash: free only what this exact attachment made.
            if !r.is_made_by(&releasing.container_id, &releasing.ifname) {
                continue;
            }
            // A claim's: its address outlives this attachment (a VM's next
            // launcher pod holds it now); the claim's end frees it.
            if r.claim.is_some() {
                logging::debug(format!("reservation {name}: made by this attachment for a claim; kept"));
                continue;
            }
            // Made by this container, but its entry now names a newer container
            // of the pod, which still relies on it (the label is never updated).
            if in_use.contains(name) {
                logging::debug(format!("reservation {name}: made by this attachment, still guards its pod's entry; kept"));
                continue;
            }
            logging::debug(format!("reservation {name}: made by this attachment, no pool entry of it left; deleting"));
            self.store.delete_reservation(name, &r.uid, self.deadline.max(Instant::now() + CLEANUP_GRACE))?;
            freed += 1;
        }
        Ok(freed)
    }
}

impl Drop for KubeTransaction<'_> {
    /// The end of the cycle, however it went: the reservations this call made
    /// for addresses no commit recorded go, for a retry that will not come.
    fn drop(&mut self) {
        if !self.held.is_empty() {
            // Logged; what stays is the DEL's (`free_leftovers`): the call failed.
            let _ = self.release_held(&BTreeSet::new(), self.deadline.max(Instant::now() + CLEANUP_GRACE));
        }
        self.end_turn();
    }
}

impl KubeTransaction<'_> {
    /// One attempt of [`Transaction::commit`]: reservations, then pools, then
    /// the reservations of removed entries.
    fn attempt(&mut self, updates: &[PoolUpdate]) -> Result<Outcome, DatastoreError> {
        let deadline = self.deadline;
        let updates: Vec<&PoolUpdate> = updates.iter().filter(|u| !u.changes.is_empty()).collect();
        // Served only by this attempt's write, if it lands, and only those
        // whose entries it removes: the others were served before (a call that
        // woke after its holder's write, before the holder got to delete its
        // ticket, finds itself queued with nobody ahead). Dismissing them
        // again from every such call sent 18 000 ticket deletes for 200 DELs.
        let serving: Vec<String> =
            std::mem::take(&mut self.serving).into_iter().filter(|(_, a)| self.removes_entry_of(&updates, a)).map(|(ticket, _)| ticket).collect();
        let cleanup_deadline = || deadline.max(Instant::now() + CLEANUP_GRACE);
        let reserves: Vec<(&PoolUpdate, &String, &Allocation)> = updates
            .iter()
            .flat_map(|u| u.changes.iter().filter_map(move |c| if let Change::Reserve { name, holder } = c { Some((*u, name, holder)) } else { None }))
            .collect();
        let planned: BTreeSet<&str> = reserves.iter().map(|(_, name, _)| name.as_str()).collect();

        // 0. Reservations an earlier attempt of this call took for addresses this
        // plan does not use any more: free them for the others first.
        // One it cannot delete stops the attempt before anything is written:
        // see `release_held`.
        if let Err(e) = self.release_held(&planned, cleanup_deadline()) {
            logging::verbose(format!("a reservation this call no longer plans could not be deleted; trying again before any write: {e}"));
            self.reuse_reads = false;
            return Ok(Outcome::Retry(Retry::Conflict { pool: "(a reservation of an earlier attempt)".into() }));
        }

        // 1. Reservations of new addresses, before any pool shows the address.
        // In its turn a call sends their POSTs at once, then looks at each
        // answer in order; a first attempt sends them one by one, as it reads
        // (see `load`).
        let serves = |held: &HashMap<String, Held>, i: usize| held.get(reserves[i].1.as_str()).is_some_and(|h| h.serves(reserves[i].2));
        let mut posted: HashMap<usize, Result<Reply, DatastoreError>> = HashMap::new();
        if self.serialized() {
            let fresh: Vec<usize> = (0..reserves.len()).filter(|&i| !serves(&self.held, i)).collect();
            let posts: Vec<Request> = fresh.iter().map(|&i| self.reservation_request(reserves[i].1, reserves[i].2)).collect();
            posted = fresh.into_iter().zip(self.store.call_all(&posts, deadline, REQUEST_TIMEOUT, THROTTLE_RETRIES)).collect();
        }
        for (i, (update, name, holder)) in reserves.iter().enumerate() {
            if serves(&self.held, i) {
                logging::debug(format!("reservation {name}: taken by an earlier attempt of this call, planned again"));
                continue;
            }
            let answer = posted.remove(&i);
            let pool = update.pool.name.clone();
            let outcome = self.reserve(name, holder, answer, deadline);
            if !matches!(outcome, Ok(Reservation::Created { .. } | Reservation::Adopted)) {
                // Stopping here: in a turn the later reservations were sent
                // too, and the ones created are this call's until a commit
                // records them.
                self.hold_created(&reserves, std::mem::take(&mut posted));
            }
            let refused = match outcome {
                Ok(Reservation::Created { uid }) => {
                    self.held.insert(name.to_string(), Held { uid, pool, holder: (*holder).clone() });
                    continue;
                }
                Ok(Reservation::Adopted) => continue,
                Ok(Reservation::HeldElsewhere(owner)) => {
                    logging::debug(format!(
                        "address of offset {} in pool {pool} is reserved as {name} by {} {} (container {}); planning around it",
                        holder.offset, owner.podref, owner.ifname, owner.containerid
                    ));
                    if self.reserved_before_read(&pool, &owner) {
                        Retry::Reserved { pool: pool.clone(), name: name.to_string() }
                    } else {
                        self.races_lost += 1;
                        Retry::Conflict { pool: pool.clone() }
                    }
                }
                Ok(Reservation::Taken) => {
                    logging::debug(format!("address of offset {} in pool {pool} is reserved as {name} (by a racer); planning around it", holder.offset));
                    self.races_lost += 1;
                    Retry::Conflict { pool: pool.clone() }
                }
                Ok(Reservation::Contended) => return Ok(Outcome::Retry(Retry::Conflict { pool: format!("(reservation {name})") })),
                Err(e) => {
                    let _ = self.release_held(&BTreeSet::new(), cleanup_deadline());
                    return Err(e);
                }
            };
            // The reservations taken so far stay for the retry (see `held`),
            // which plans again on the reads it has (see `load`).
            self.reserved.add(&pool, [holder.offset]);
            self.reuse_reads = true;
            return Ok(Outcome::Retry(refused));
        }

        crate::failpoint::hit(crate::failpoint::KUBERNETES_RESERVED);

        // 2. Pools; a failure undoes the ones written. In its turn a call sends
        // them at once (one round trip). Otherwise one after the other, stopping
        // at the first refusal: under contention most first attempts are
        // refused, and a refused patch costs the apiserver an encoding and a
        // patch application of the whole pool, so a lost race costs one of
        // them, not one per range.
        let writes: Vec<&PoolUpdate> = updates.iter().copied().filter(|u| u.changes.iter().any(Change::guards_entries)).collect();
        let requests = match writes.iter().map(|u| self.pool_write_request(u)).collect::<Result<Vec<Request>, DatastoreError>>() {
            Ok(requests) => requests,
            Err(e) => {
                let _ = self.release_held(&BTreeSet::new(), cleanup_deadline());
                return Err(e);
            }
        };
        let mut results: Vec<Result<Outcome, DatastoreError>> = if !self.serialized() {
            let mut results = Vec::with_capacity(writes.len());
            for (u, request) in writes.iter().zip(&requests) {
                let answer = self.store.call_one(request, deadline, WRITE_TIMEOUT, THROTTLE_RETRIES);
                let result = self.pool_write_outcome(u, answer);
                let refused = !matches!(result, Ok(Outcome::Committed));
                results.push(result);
                if refused {
                    break;
                }
            }
            results
        } else {
            let answers = self.store.call_all(&requests, deadline, WRITE_TIMEOUT, THROTTLE_RETRIES);
            writes.iter().zip(answers).map(|(u, answer)| self.pool_write_outcome(u, answer)).collect()
        };
        // Whatever happened, the objects read are stale now.
        for u in &writes {
            self.read.remove(&u.pool.name);
        }
        // The first error, else the first refusal: an error wins over a
        // conflict, which retrying cannot help.
        let failure = results.iter().position(Result::is_err).or_else(|| results.iter().position(|r| !matches!(r, Ok(Outcome::Committed))));
        if let Some(failure) = failure {
            let written: Vec<&PoolUpdate> = writes.iter().zip(&results).filter(|(_, r)| matches!(r, Ok(Outcome::Committed))).map(|(u, _)| *u).collect();
            let cleanup = cleanup_deadline();
            // A write whose answer never came may still land (the apiserver
            // goes on after the client gave up): its entries keep their
            // reservations, never freed here, so no entry can stand without
            // one. The runtime's DEL after the failed ADD frees both.
            for (u, r) in writes.iter().zip(&results) {
                if matches!(r, Err(DatastoreError::Unavailable { .. })) {
                    self.keep_reservations_of(&u.pool.name);
                }
            }
            for unsure in self.undo(&written, cleanup) {
                self.keep_reservations_of(&unsure);
            }
            let failed = results.swap_remove(failure);
            if failed.is_err() {
                let _ = self.release_held(&BTreeSet::new(), cleanup);
            }
            // Removals are not undone (a DEL may stop half way and is
            // retried); the entries they removed are gone for good, and
            // the retry will not see them: free their reservations now.
            // The call fails anyway; a reservation left here goes with its retry.
            let _ = self.unreserve_all(&written, cleanup);
            return failed;
        }

        // Every reservation of this plan now backs a committed entry.
        self.held.retain(|name, _| !planned.contains(name.as_str()));
        self.reuse_reads = false;
        // The pools are written: the DELs it served stop waiting, and the next
        // in the queue may go.
        if !serving.is_empty() {
            turn::dismiss(self.store, &serving);
        }
        self.end_turn();

        crate::failpoint::hit(crate::failpoint::KUBERNETES_POOLS_WRITTEN);

        // 3. Reservations of removed entries. The pools no longer hold the
        // addresses; a reservation left behind only blocks its address. One a
        // DEL could not delete because the apiserver went away fails the DEL
        // (unavailable, code 11): the runtime sends it again, and the retry,
        // which finds no entry of its attachment, deletes the reservations
        // labelled with it (`free_leftovers`). Answered as a success, the DEL
        // would never come again, and the address would stay blocked until
        // the controller's orphan pass (seen in the fault trials: the
        // apiserver killed, or the connection reset, between a DEL's pool
        // write and its reservation deletes).
        match self.unreserve_all(&updates, cleanup_deadline()) {
            Err(e) if self.releasing.is_some() => Err(e),
            _ => Ok(Outcome::Committed),
        }
    }

    /// Whether `updates` remove an entry of `attachment` from a pool as read.
    fn removes_entry_of(&self, updates: &[&PoolUpdate], attachment: &Attachment) -> bool {
        updates.iter().any(|u| {
            let Some(read) = self.read.get(&u.pool.name) else { return false };
            u.changes.iter().any(|c| {
                matches!(c, Change::Remove { offset } if read.entries.iter().any(|e| e.offset == *offset && e.container_id == attachment.container_id && e.ifname == attachment.ifname))
            })
        })
    }

    /// Ends the turn this call holds, if any: later attempts go without one.
    fn end_turn(&mut self) {
        match std::mem::replace(&mut self.turn, TurnState::Without) {
            TurnState::Holding(held) => turn::end(self.store, held, self.deadline.max(Instant::now() + CLEANUP_GRACE)),
            // Dropping the locks ends the node's turn.
            TurnState::Node(_) | TurnState::NotYet | TurnState::Without => {}
        }
    }

    /// Who a turn ticket names, for people reading the queue: the attachment
    /// being committed.
    fn holder_identity(&self, updates: &[PoolUpdate]) -> String {
        let committing = updates.iter().flat_map(|u| &u.changes).find_map(|c| match c {
            Change::Insert(a) | Change::TakeOver { holder: a, .. } | Change::Reserve { holder: a, .. } | Change::Unreserve { holder: a, .. } => Some(a),
            Change::Remove { .. } | Change::SetContainerId { .. } | Change::Keep { .. } => None,
        });
        match (committing, &self.releasing) {
            (Some(a), _) => format!("{} container {} interface {}", a.pod_ref, a.container_id, a.ifname),
            (None, Some(r)) => format!("container {} interface {}", r.container_id, r.ifname),
            (None, None) => format!("process {}", std::process::id()),
        }
    }

    /// One pool for `load`, as `fresh`ly read (`Some`), or not read again
    /// (`None`): after a lost reservation race the pool itself refused nothing,
    /// so the retry plans again on the object read (the address lost is in
    /// `reserved` now). Its entry guards make a stale read safe, and it knows
    /// little less than a new read would: the racing writers hold reservations
    /// before the pool shows their entries. A pool write (success or conflict)
    /// drops the read.
    fn load_one(&mut self, pool: &PoolId, fresh: Option<Option<PoolObject>>) -> Pool {
        let reserved = self.reserved.of(&pool.name);
        let as_read = |object: &PoolObject, reserved| Pool {
            version: Version(object.resource_version.clone()),
            entries: object.entries.clone(),
            reserved,
            ..Pool::default()
        };
        match fresh {
            Some(Some(object)) => {
                let loaded = as_read(&object, reserved);
                self.read.insert(pool.name.clone(), object);
                loaded
            }
            Some(None) => {
                self.read.remove(&pool.name);
                Pool { reserved, ..Pool::default() }
            }
            None => match self.read.get(&pool.name) {
                Some(object) => {
                    logging::debug(format!(
                        "IPPool {}: planning again on the read of version {} (a reservation was taken, not the pool)",
                        pool.name, object.resource_version
                    ));
                    as_read(object, reserved)
                }
                None => Pool { reserved, ..Pool::default() },
            },
        }
    }

    /// The read of a pool: a LIST of the one object by name. The answer carries
    /// the revision the read saw (kept in `read_revisions`), which tells
    /// reservations older than this read from ones made since
    /// (`reserved_before_read`), and the apiserver serves it from its watch cache
    /// (at 200 entries about a fifth of the CPU of a GET, which reads etcd).
    ///
    /// `resourceVersion=0`: the cache as it is, at once. A consistent LIST first
    /// waits until the cache has caught up with etcd's latest revision, which
    /// writes of other kinds (reservations, turn tickets) move without an
    /// IPPool event to follow; the cache then waits for etcd's next progress
    /// notification, 40-100 ms per read (every DEL after another's reservation
    /// deletes, every read in a turn). The cache can lag behind the pool only by
    /// the writes of the last few milliseconds, and a plan on such a read fails
    /// safely: its `resourceVersion` test or its entry tests refuse it, or the
    /// address's reservation is taken.
    fn pool_read_request(&self, pool: &PoolId) -> Request {
        // In the node's turn: the cache once it holds the last holder's write.
        // Served by another DEL's write: the cache once it holds that write.
        let version = match &self.turn {
            TurnState::Node(turn) => turn.last_version(&pool.name).map(|v| format!("resourceVersion={v}&resourceVersionMatch=NotOlderThan")),
            TurnState::Holding(turn) => turn.read_at(&pool.name).map(|v| format!("resourceVersion={v}&resourceVersionMatch=NotOlderThan")),
            _ => None,
        };
        let path = format!("{}&{}", crd::named_list_path(&self.store.namespace, IPPOOLS, &pool.name), version.as_deref().unwrap_or("resourceVersion=0"));
        Request { method: Method::GET, path, body: None, action: format!("reading IPPool {}/{}", self.store.namespace, pool.name) }
    }

    /// Whether the read of `pool` asks for a version: the one the node's last
    /// holder left, or the revision at which another DEL served this one.
    fn hinted(&self, pool: &PoolId) -> bool {
        match &self.turn {
            TurnState::Node(turn) => turn.last_version(&pool.name).is_some(),
            TurnState::Holding(turn) => turn.read_at(&pool.name).is_some(),
            TurnState::NotYet | TurnState::Without => false,
        }
    }

    /// The pool in the answer to [`Self::pool_read_request`]. While the watch
    /// cache is not ready (after the apiserver or the CRD started) the LIST
    /// answers 429: then one GET of the object instead, without a revision.
    fn pool_from_reply(&mut self, pool: &PoolId, reply: Reply) -> Result<Option<PoolObject>, DatastoreError> {
        let action = format!("reading IPPool {}/{}", self.store.namespace, pool.name);
        let object = match reply {
            Reply::Object(list) => {
                let revision = list.pointer("/metadata/resourceVersion").and_then(Value::as_str).unwrap_or_default().to_string();
                self.read_revisions.insert(pool.name.clone(), revision);
                match crd::named_item(&list, &pool.name) {
                    Some(object) => object.clone(),
                    None => return Ok(None),
                }
            }
            // The version hinted is newer than anything this apiserver has (its
            // etcd was restored or replaced, or it lags behind another): read as it is.
            Reply::Status(s) if s.code == 504 && self.hinted(pool) => {
                logging::verbose(format!(
                    "IPPool {}: the version left on this node is unknown to the apiserver ({}); reading the cache as it is",
                    pool.name, s.message
                ));
                match &mut self.turn {
                    TurnState::Node(turn) => turn.record(&pool.name, ""),
                    TurnState::Holding(turn) => turn.forget_read_at(),
                    TurnState::NotYet | TurnState::Without => {}
                }
                let plain = self.pool_read_request(pool);
                let reply = self.store.call_one(&plain, self.deadline, REQUEST_TIMEOUT, 0)?;
                return self.pool_from_reply(pool, reply);
            }
            Reply::Status(s) if s.code == 429 => {
                self.read_revisions.remove(&pool.name);
                match self.store.call(Method::GET, &self.store.pool_path(&pool.name), None, &action, self.deadline)? {
                    Reply::Object(object) => object,
                    Reply::Status(s) if failure::is_object_not_found(&s, &pool.name) => return Ok(None),
                    Reply::Status(s) => return Err(self.store.status_error(&s, &action)),
                }
            }
            Reply::Status(s) => return Err(self.store.status_error(&s, &action)),
        };
        let malformed = |detail: String| DatastoreError::Malformed { object: format!("IPPool {}/{}", self.store.namespace, pool.name), detail };
        let parsed = crd::parse_pool(&object).map_err(malformed)?;
        if let Some(range) = parsed.range.as_deref().filter(|r| *r != pool.cidr) {
            return Err(malformed(format!("it holds range {range}, expected {}", pool.cidr)));
        }
        if !parsed.unparsable.is_empty() {
            logging::debug(format!("IPPool {}: ignoring allocation keys that are no offset: {:?}", pool.name, parsed.unparsable));
        }
        Ok(Some(parsed))
    }

    /// POSTs the reservation; on AlreadyExists looks at who holds it, unless
    /// this call already lost a reservation race: then the answer is nearly
    /// always another racer (the contended plan picked a random address of a
    /// window that the racers are filling), and reading it would only double
    /// the requests of every lost round. What the read would tell apart — our
    /// own reservation from an earlier attempt of this ADD, or an overlapping
    /// range's — is then planned around like a racer's: the former is freed by
    /// the DEL (it carries our attachment label), the latter was not planned
    /// lowest-first anyway under contention.
    ///
    /// `posted` is the answer to the first POST ([`Self::reservation_request`])
    /// when it was sent together with the other reservations of the commit.
    fn reserve(
        &mut self,
        name: &str,
        holder: &Allocation,
        mut posted: Option<Result<Reply, DatastoreError>>,
        deadline: Instant,
    ) -> Result<Reservation, DatastoreError> {
        let request = self.reservation_request(name, holder);
        // Twice at most: a reservation deleted between our POST and GET is free again.
        for _ in 0..2 {
            let reply = match posted.take() {
                Some(reply) => reply?,
                None => self.store.call_one(&request, deadline, REQUEST_TIMEOUT, THROTTLE_RETRIES)?,
            };
            let action = &request.action;
            match reply {
                Reply::Object(created) => return Ok(Reservation::Created { uid: crd::parse_reservation(&created).uid }),
                Reply::Status(s) if s.code == 409 => {}
                Reply::Status(s) => return Err(self.store.status_error(&s, action)),
            }
            if self.races_lost > 0 {
                return Ok(Reservation::Taken);
            }
            let reading = format!("reading OverlappingRangeIPReservation {}/{name}", self.store.namespace);
            match self.store.call(Method::GET, &self.store.reservation_path(name), None, &reading, deadline)? {
                Reply::Object(existing) => {
                    let existing = crd::parse_reservation(&existing);
                    return Ok(if existing.is_adoptable_by(holder) { Reservation::Adopted } else { Reservation::HeldElsewhere(existing) });
                }
                Reply::Status(s) if failure::is_object_not_found(&s, name) => continue,
                Reply::Status(s) => return Err(self.store.status_error(&s, &reading)),
            }
        }
        Ok(Reservation::Contended)
    }

    /// Records the reservations among `answers` (index into `reserves` →
    /// the answer to its POST) that were created, as held by this call.
    fn hold_created(&mut self, reserves: &[(&PoolUpdate, &String, &Allocation)], answers: HashMap<usize, Result<Reply, DatastoreError>>) {
        for (i, answer) in answers {
            if let (Ok(Reply::Object(created)), Some((update, name, holder))) = (answer, reserves.get(i)) {
                let uid = crd::parse_reservation(&created).uid;
                self.held.insert(name.to_string(), Held { uid, pool: update.pool.name.clone(), holder: (*holder).clone() });
            }
        }
    }

    /// The POST that reserves the address `name` for `holder`.
    fn reservation_request(&self, name: &str, holder: &Allocation) -> Request {
        Request {
            method: Method::POST,
            path: crd::collection_path(&self.store.namespace, RESERVATIONS),
            body: Some((JSON.to_string(), crd::new_reservation(name, &self.store.namespace, holder))),
            action: format!("creating OverlappingRangeIPReservation {}/{name}", self.store.namespace),
        }
    }

    /// Deletes the reservation `name` if `holder`'s pod and interface hold it:
    /// read by name first (a GET from the cache), then deleted by its UID.
    fn unreserve(&mut self, name: &str, holder: &Allocation, deadline: Instant) -> Result<(), DatastoreError> {
        let action = format!("reading OverlappingRangeIPReservation {}/{name}", self.store.namespace);
        match self.store.call(Method::GET, &self.store.reservation_path(name), None, &action, deadline)? {
            Reply::Object(object) => {
                let existing = crd::parse_reservation(&object);
                if existing.is_held_by(holder) {
                    self.store.delete_reservation(name, &existing.uid, deadline)
                } else {
                    logging::debug(format!("reservation {name} is held by {} {}, not by {}; left alone", existing.podref, existing.ifname, holder.pod_ref));
                    Ok(())
                }
            }
            Reply::Status(s) if failure::is_object_not_found(&s, name) => Ok(()),
            Reply::Status(s) => Err(self.store.status_error(&s, &action)),
        }
    }

    /// Whether the reservation `owner`, found holding an address planned in
    /// `pool`, existed before this process read the pool (an overlapping range's
    /// address: whereabouts just plans around it) rather than being made by a
    /// writer racing for the address since (contention). Decided by comparing its
    /// resourceVersion with the revision the read saw; the apiserver takes both
    /// from one etcd revision counter, but the API calls them opaque, so this is
    /// only a hint for choosing the next address, never for correctness:
    /// anything unparsable counts as a race.
    fn reserved_before_read(&self, pool: &str, owner: &crd::ReservationObject) -> bool {
        let read = self.read_revisions.get(pool).and_then(|r| r.parse::<u64>().ok());
        matches!((owner.resource_version.parse::<u64>(), read), (Ok(reserved), Some(read)) if reserved <= read)
    }

    /// Removal of the reservations this process holds for addresses it did not
    /// get, except those named in `keep`. One whose entry the pool holds after
    /// all, as last read, stays, and stays this call's: a write whose answer was
    /// lost (a 504 after which the retry found the entry, then the plan reused
    /// it) did commit; but the read may also be older than this call's own
    /// rollback of that write, and a later plan that takes the address again must
    /// know the reservation as its own, not as a racer's (which it would plan
    /// around and leave behind).
    ///
    /// One that could not be deleted stays held, and the first such error is
    /// returned. No pool write may follow while one is held: a call that
    /// committed other addresses would answer success, its DEL would find every
    /// entry of the ADD and not look for leftovers, and the reservation would
    /// block its address until the controller's orphan pass (seen in the fault
    /// trials: a lost race's reservation whose DELETE was black-holed). So an
    /// attempt retries instead (`attempt`, step 0) while its time lasts; if the
    /// apiserver stays away the call fails holding no entry, the drop tries once
    /// more, and the runtime's DEL deletes the reservations labelled with it
    /// (`free_leftovers`).
    fn release_held(&mut self, keep: &BTreeSet<&str>, deadline: Instant) -> Result<(), DatastoreError> {
        let dropped: Vec<(String, Held)> = {
            let held = &mut self.held;
            let names: Vec<String> = held.keys().filter(|n| !keep.contains(n.as_str())).cloned().collect();
            names.into_iter().filter_map(|n| held.remove(&n).map(|h| (n, h))).collect()
        };
        let mut failed = None;
        for (name, h) in dropped {
            let committed = self.read.get(&h.pool).is_some_and(|p| {
                p.entries.iter().any(|e| e.offset == h.holder.offset && e.container_id == h.holder.container_id && e.ifname == h.holder.ifname)
            });
            if committed {
                logging::debug(format!("reservation {name} (offset {}): the pool holds its entry, kept", h.holder.offset));
                self.held.insert(name, h);
                continue;
            }
            logging::debug(format!("deleting reservation {name} (offset {}): not committed", h.holder.offset));
            if let Err(e) = self.store.delete_reservation(&name, &h.uid, deadline) {
                logging::error(format!("could not delete reservation {name} of an address not committed: {e}"));
                self.held.insert(name, h);
                failed.get_or_insert(e);
            }
        }
        failed.map_or(Ok(()), Err)
    }

    /// The write of one pool's changes: POST when it did not exist, else the
    /// PATCH whose `test`s compare each touched entry with the pool as read.
    fn pool_write_request(&self, update: &PoolUpdate) -> Result<Request, DatastoreError> {
        let name = &update.pool.name;
        let inconsistent = |detail: String| DatastoreError::Inconsistent { pool: name.clone(), detail };
        if update.expected.is_absent() {
            let mut inserts = Vec::new();
            for change in &update.changes {
                match change {
                    Change::Insert(a) => inserts.push(a),
                    Change::Reserve { .. } | Change::Unreserve { .. } => {}
                    other => return Err(inconsistent(format!("{other:?} on a pool that does not exist"))),
                }
            }
            return Ok(Request {
                method: Method::POST,
                path: crd::collection_path(&self.store.namespace, IPPOOLS),
                body: Some((JSON.to_string(), crd::new_pool(name, &self.store.namespace, &update.pool.cidr, &inserts))),
                action: format!("creating IPPool {}/{name}", self.store.namespace),
            });
        }
        let read = self.read.get(name).filter(|p| p.resource_version == update.expected.0);
        let read = read.ok_or_else(|| inconsistent(format!("commit against version {:?}, which this process did not read", update.expected.0)))?;
        let fail_fast = matches!(self.turn, TurnState::NotYet);
        let patch = patch::update(read, &update.changes, fail_fast).map_err(inconsistent)?;
        Ok(Request {
            method: Method::PATCH,
            path: self.store.pool_path(name),
            body: Some((JSON_PATCH.to_string(), patch)),
            action: format!("patching IPPool {}/{name}", self.store.namespace),
        })
    }

    /// What the answer to [`Self::pool_write_request`] means.
    fn pool_write_outcome(&mut self, update: &PoolUpdate, answer: Result<Reply, DatastoreError>) -> Result<Outcome, DatastoreError> {
        let name = &update.pool.name;
        let conflict = || Ok(Outcome::Retry(Retry::Conflict { pool: name.clone() }));
        let action = if update.expected.is_absent() { "creating" } else { "patching" };
        let action = format!("{action} IPPool {}/{name}", self.store.namespace);
        match answer? {
            Reply::Object(written) => {
                match (&mut self.turn, written.pointer("/metadata/resourceVersion").and_then(Value::as_str)) {
                    (TurnState::Node(turn), Some(version)) => {
                        turn.record(name, version);
                        if let Ok(pool) = crd::parse_pool(&written) {
                            turn.note(name, &PoolNote::of(&pool.entries));
                        }
                    }
                    (TurnState::Holding(turn), Some(version)) => turn.record_written(name, version),
                    _ => {}
                }
                Ok(Outcome::Committed)
            }
            // Someone created it first.
            Reply::Status(s) if update.expected.is_absent() && s.code == 409 => conflict(),
            Reply::Status(s) if update.expected.is_absent() => Err(self.store.status_error(&s, &action)),
            // An entry's test failed (its offset was taken, or the entry to change
            // is gone or someone else's), or the pool was deleted since.
            Reply::Status(s) if failure::is_failed_test(&s) || s.code == 409 || failure::is_object_not_found(&s, name) => conflict(),
            Reply::Status(s) if failure::is_too_large(&s) => {
                let entries = self.read.get(name).map_or(0, |p| p.entries.len()) + update.inserts();
                Err(DatastoreError::PoolTooLarge { object: format!("IPPool {}/{name}", self.store.namespace), entries })
            }
            Reply::Status(s) => Err(self.store.status_error(&s, &action)),
        }
    }

    /// The [`Change::Unreserve`]s of `updates` (pools already written), best effort.
    /// Deletes the reservations of the entries `updates` removed (each only
    /// while its holder is the entry's). Tries them all; answers the first
    /// failure that may heal (the apiserver unreachable, the budget spent),
    /// which leaves a reservation behind.
    fn unreserve_all(&mut self, updates: &[&PoolUpdate], deadline: Instant) -> Result<(), DatastoreError> {
        let mut first = Ok(());
        for update in updates {
            for change in &update.changes {
                let Change::Unreserve { name, holder } = change else { continue };
                if let Err(e) = self.unreserve(name, holder, deadline) {
                    logging::error(format!("released offset {} of pool {} but could not delete its reservation {name}: {e}", holder.offset, update.pool.name));
                    if first.is_ok() && matches!(e, DatastoreError::Unavailable { .. } | DatastoreError::Timeout { .. }) {
                        first = Err(e);
                    }
                }
            }
        }
        first
    }

    /// Removes the entries `written` inserted (best effort, see [`patch::rollback`]).
    /// Returns the pools whose rollback may or may not have landed.
    fn undo(&self, written: &[&PoolUpdate], deadline: Instant) -> Vec<String> {
        let mut unsure = Vec::new();
        for update in written.iter().rev() {
            let inserted: Vec<&Allocation> = update.changes.iter().filter_map(|c| if let Change::Insert(a) = c { Some(a) } else { None }).collect();
            if inserted.is_empty() {
                continue;
            }
            let action = format!("rolling back IPPool {}/{}", self.store.namespace, update.pool.name);
            match self.store.call(Method::PATCH, &self.store.pool_path(&update.pool.name), Some((JSON_PATCH, &patch::rollback(&inserted))), &action, deadline) {
                Ok(Reply::Object(_)) => {}
                // Our entries are not there any more: nothing to undo.
                Ok(Reply::Status(s)) if s.code == 422 || s.code == 404 => {}
                Ok(Reply::Status(s)) => logging::error(format!("{}", self.store.status_error(&s, &action))),
                Err(e) => {
                    logging::error(format!("could not roll back a failed commit: {e}"));
                    unsure.push(update.pool.name.clone());
                }
            }
        }
        unsure
    }

    /// Forgets the reservations this call made for entries of `pool`, so
    /// nothing of this call frees them: an entry of the pool may exist.
    fn keep_reservations_of(&mut self, pool: &str) {
        self.held.retain(|name, h| {
            let keep = h.pool == pool;
            if keep {
                logging::debug(format!("reservation {name}: the write of pool {pool} may have landed; kept for the DEL"));
            }
            !keep
        });
    }
}
