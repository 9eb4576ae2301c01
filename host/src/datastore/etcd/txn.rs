//! A commit as one etcd transaction, built without talking to etcd (pure logic):
//! the guards (compare-and-swap conditions) and the writes of every pool update
//! of one call, so a multi-range ADD lands all or nothing by construction.
//!
//! - Each pool written is guarded by the version read: `mod_revision == <read>`,
//!   or `create_revision == 0` when it was absent (etcd's "key does not exist").
//!   Any write to the pool since the read fails the whole transaction: the
//!   caller reads again and plans again ([`Retry::Conflict`](super::super::Retry::Conflict)).
//! - A new reservation is guarded absent; one found held by the same attachment
//!   (pod and interface) is taken over, guarded by its `mod_revision`. One held
//!   by anyone else refuses the plan before anything is sent: its address is
//!   the planner's to avoid.
//! - A reservation of a removed entry is deleted, guarded by its `mod_revision`,
//!   only while it is still the removed entry's attachment's; absent or someone
//!   else's, it is left alone.

use std::collections::{BTreeMap, HashMap};

use thereabouts_allocator::model::Allocation;

use super::super::{Change, PoolUpdate, apply_changes};
use super::layout::{Layout, ReservationValue};
use crate::datastore::pool_document::{self, Format, PoolDocument};

/// A condition the transaction needs to hold on a key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Guard {
    /// The key does not exist (`create_revision == 0`).
    Absent { key: String },
    /// The key was last written at `mod_revision`.
    Unchanged { key: String, mod_revision: i64 },
}

/// A write the transaction makes when every guard holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Write {
    Put { key: String, value: Vec<u8> },
    Delete { key: String },
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CommitTxn {
    pub guards: Vec<Guard>,
    pub writes: Vec<Write>,
}

/// A reservation key as read before the commit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredReservation {
    /// `None` when the value is unreadable: treated as someone else's.
    pub value: Option<ReservationValue>,
    pub create_revision: i64,
    pub mod_revision: i64,
}

/// Why a plan cannot be committed as it is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    /// The address planned at `offset` of `pool` is reserved (key `name`) by
    /// another attachment, since `create_revision`.
    HeldElsewhere { pool: String, name: String, offset: u128, create_revision: i64 },
    /// A change that contradicts the pool as read (a bug).
    Inconsistent { pool: String, detail: String },
}

/// What the commit needs to know besides the updates.
pub struct Reads<'a> {
    /// The pools as read, by pool name (absent pools need not be here).
    pub pools: &'a HashMap<String, PoolDocument>,
    /// Every reservation key the updates name, by reservation name; a name
    /// missing here (or mapped to `None`) is absent.
    pub reservations: &'a HashMap<String, Option<StoredReservation>>,
}

/// The reservation names `updates` reserve or unreserve, to read before building.
pub fn reservation_names(updates: &[PoolUpdate]) -> Vec<String> {
    let mut names: Vec<String> = updates
        .iter()
        .flat_map(|u| u.changes.iter())
        .filter_map(|c| match c {
            Change::Reserve { name, .. } | Change::Unreserve { name, .. } => Some(name.clone()),
            _ => None,
        })
        .collect();
    names.sort();
    names.dedup();
    names
}

/// The transaction that applies `updates` to the pools as read.
pub fn build(layout: &Layout, updates: &[PoolUpdate], reads: &Reads) -> Result<CommitTxn, Refusal> {
    let mut txn = CommitTxn::default();
    for update in updates.iter().filter(|u| !u.changes.is_empty()) {
        let name = &update.pool.name;
        let inconsistent = |detail: String| Refusal::Inconsistent { pool: name.clone(), detail };
        let pool_key = layout.pool_key(name);
        let value = if update.expected.is_absent() {
            txn.guards.push(Guard::Absent { key: pool_key.clone() });
            PoolDocument::empty(&update.pool.cidr)
        } else {
            let mod_revision =
                update.expected.0.parse::<i64>().map_err(|_| inconsistent(format!("version {:?} is not an etcd revision", update.expected.0)))?;
            txn.guards.push(Guard::Unchanged { key: pool_key.clone(), mod_revision });
            reads
                .pools
                .get(name)
                .cloned()
                .ok_or_else(|| inconsistent(format!("commit against version {}, which this process did not read", update.expected.0)))?
        };
        // The entries as the shared meaning of the changes leaves them; the
        // reservation changes below become guarded writes of their own keys.
        let mut entries: BTreeMap<u128, Allocation> = value.entries.into_iter().map(|a| (a.offset, a)).collect();
        apply_changes(&mut entries, &update.changes).map_err(inconsistent)?;
        let pool_changed = update.changes.iter().any(Change::touches_entries);
        for change in &update.changes {
            match change {
                Change::Insert(_) | Change::Remove { .. } | Change::SetContainerId { .. } | Change::TakeOver { .. } | Change::Keep { .. } => {}
                Change::Reserve { name: reservation, holder } => {
                    let key = layout.reservation_key(reservation);
                    let put = Write::Put { key: key.clone(), value: ReservationValue::of(holder).encode() };
                    match reads.reservations.get(reservation).and_then(Option::as_ref) {
                        None => txn.guards.push(Guard::Absent { key }),
                        Some(stored) if stored.value.as_ref().is_some_and(|v| v.is_for(holder)) => {
                            txn.guards.push(Guard::Unchanged { key, mod_revision: stored.mod_revision });
                        }
                        Some(stored) => {
                            return Err(Refusal::HeldElsewhere {
                                pool: name.clone(),
                                name: reservation.clone(),
                                offset: holder.offset,
                                create_revision: stored.create_revision,
                            });
                        }
                    }
                    txn.writes.push(put);
                }
                Change::Unreserve { name: reservation, holder } => {
                    if let Some(stored) = reads.reservations.get(reservation).and_then(Option::as_ref)
                        && stored.value.as_ref().is_some_and(|v| v.is_for(holder))
                    {
                        let key = layout.reservation_key(reservation);
                        txn.guards.push(Guard::Unchanged { key: key.clone(), mod_revision: stored.mod_revision });
                        txn.writes.push(Write::Delete { key });
                    }
                }
            }
        }
        if pool_changed {
            txn.writes.push(Write::Put {
                key: pool_key,
                value: pool_document::encode(&value.range, &entries, &BTreeMap::new(), &Default::default(), Format::Compact),
            });
        }
    }
    Ok(txn)
}

#[cfg(test)]
mod tests {
    use thereabouts_allocator::model::Allocation;

    use super::*;
    use crate::datastore::{PoolId, Version};

    fn alloc(offset: u128, cid: &str, pod: &str) -> Allocation {
        Allocation { offset, container_id: cid.into(), pod_ref: format!("default/{pod}"), ifname: "eth0".into(), claim: None }
    }

    fn pool(name: &str, cidr: &str) -> PoolId {
        PoolId { name: name.into(), cidr: cidr.into(), node_local: false }
    }

    fn stored(holder: &Allocation, create: i64, modified: i64) -> Option<StoredReservation> {
        Some(StoredReservation { value: Some(ReservationValue::of(holder)), create_revision: create, mod_revision: modified })
    }

    fn put_text(w: &Write) -> (String, String) {
        match w {
            Write::Put { key, value } => (key.clone(), String::from_utf8(value.clone()).unwrap()),
            Write::Delete { key } => (key.clone(), "DELETE".into()),
        }
    }

    #[test]
    fn a_multi_range_add_is_one_guarded_transaction() {
        let layout = Layout::new(None);
        let a4 = alloc(1, "c1", "pod-a");
        let a6 = alloc(1, "c1", "pod-a");
        let mut existing = PoolDocument::empty("2001:db8::/64");
        existing.entries.push(alloc(2, "c0", "pod-0"));
        let pools = HashMap::from([("2001-db8---64".to_string(), existing)]);
        let reservations = HashMap::new();
        let updates = vec![
            PoolUpdate {
                pool: pool("192.0.2.0-24", "192.0.2.0/24"),
                expected: Version::absent(),
                changes: vec![Change::Reserve { name: "192.0.2.1".into(), holder: a4.clone() }, Change::Insert(a4)],
            },
            PoolUpdate {
                pool: pool("2001-db8---64", "2001:db8::/64"),
                expected: Version("17".into()),
                changes: vec![Change::Reserve { name: "2001-db8--1".into(), holder: a6.clone() }, Change::Insert(a6)],
            },
        ];
        assert_eq!(reservation_names(&updates), ["192.0.2.1", "2001-db8--1"]);
        let txn = build(&layout, &updates, &Reads { pools: &pools, reservations: &reservations }).unwrap();
        assert_eq!(
            txn.guards,
            [
                Guard::Absent { key: "/thereabouts/pools/192.0.2.0-24".into() },
                Guard::Absent { key: "/thereabouts/reservations/192.0.2.1".into() },
                Guard::Unchanged { key: "/thereabouts/pools/2001-db8---64".into(), mod_revision: 17 },
                Guard::Absent { key: "/thereabouts/reservations/2001-db8--1".into() },
            ]
        );
        let writes: Vec<_> = txn.writes.iter().map(put_text).collect();
        let entry = r#"{"id":"c1","podref":"default/pod-a","ifname":"eth0"}"#;
        assert_eq!(
            writes,
            [
                ("/thereabouts/reservations/192.0.2.1".into(), r#"{"containerid":"c1","podref":"default/pod-a","ifname":"eth0"}"#.into()),
                ("/thereabouts/pools/192.0.2.0-24".into(), format!(r#"{{"range":"192.0.2.0/24","allocations":{{"1":{entry}}}}}"#)),
                ("/thereabouts/reservations/2001-db8--1".into(), r#"{"containerid":"c1","podref":"default/pod-a","ifname":"eth0"}"#.into()),
                (
                    "/thereabouts/pools/2001-db8---64".into(),
                    format!(r#"{{"range":"2001:db8::/64","allocations":{{"1":{entry},"2":{{"id":"c0","podref":"default/pod-0","ifname":"eth0"}}}}}}"#)
                ),
            ]
        );
    }

    #[test]
    fn a_reservation_held_elsewhere_refuses_the_plan() {
        let layout = Layout::new(None);
        let mine = alloc(5, "c1", "pod-a");
        let theirs = alloc(5, "c9", "pod-z");
        let reservations = HashMap::from([("192.0.2.5".to_string(), stored(&theirs, 40, 40))]);
        let updates = vec![PoolUpdate {
            pool: pool("192.0.2.0-28", "192.0.2.0/28"),
            expected: Version::absent(),
            changes: vec![Change::Reserve { name: "192.0.2.5".into(), holder: mine.clone() }, Change::Insert(mine.clone())],
        }];
        let refusal = build(&layout, &updates, &Reads { pools: &HashMap::new(), reservations: &reservations }).unwrap_err();
        assert_eq!(refusal, Refusal::HeldElsewhere { pool: "192.0.2.0-28".into(), name: "192.0.2.5".into(), offset: 5, create_revision: 40 });
        // Held by the same pod and interface (a re-created sandbox): taken over,
        // guarded by its revision.
        let own = HashMap::from([("192.0.2.5".to_string(), stored(&alloc(5, "c0", "pod-a"), 40, 41))]);
        let txn = build(&layout, &updates, &Reads { pools: &HashMap::new(), reservations: &own }).unwrap();
        assert!(txn.guards.contains(&Guard::Unchanged { key: "/thereabouts/reservations/192.0.2.5".into(), mod_revision: 41 }));
        // Unreadable: not ours.
        let junk = HashMap::from([("192.0.2.5".to_string(), Some(StoredReservation { value: None, create_revision: 3, mod_revision: 3 }))]);
        assert!(matches!(build(&layout, &updates, &Reads { pools: &HashMap::new(), reservations: &junk }), Err(Refusal::HeldElsewhere { .. })));
    }

    #[test]
    fn a_release_deletes_only_its_own_reservations() {
        let layout = Layout::new(Some("/x"));
        let a = alloc(1, "c1", "pod-a");
        let b = alloc(2, "c2", "pod-b");
        let mut read = PoolDocument::empty("192.0.2.0/24");
        for e in [&a, &b] {
            read.entries.push(e.clone());
        }
        let pools = HashMap::from([("p".to_string(), read)]);
        // a's reservation is its own; b's address is now reserved by someone else.
        let reservations = HashMap::from([("192.0.2.1".to_string(), stored(&a, 5, 6)), ("192.0.2.2".to_string(), stored(&alloc(2, "c7", "pod-q"), 8, 8))]);
        let updates = vec![PoolUpdate {
            pool: pool("p", "192.0.2.0/24"),
            expected: Version("9".into()),
            changes: vec![
                Change::Remove { offset: 1 },
                Change::Unreserve { name: "192.0.2.1".into(), holder: a },
                Change::Remove { offset: 2 },
                Change::Unreserve { name: "192.0.2.2".into(), holder: b },
                Change::Unreserve { name: "192.0.2.3".into(), holder: alloc(3, "c3", "pod-c") },
            ],
        }];
        let txn = build(&layout, &updates, &Reads { pools: &pools, reservations: &reservations }).unwrap();
        assert_eq!(
            txn.guards,
            [Guard::Unchanged { key: "/x/pools/p".into(), mod_revision: 9 }, Guard::Unchanged { key: "/x/reservations/192.0.2.1".into(), mod_revision: 6 }]
        );
        assert_eq!(
            txn.writes.iter().map(put_text).collect::<Vec<_>>(),
            [("/x/reservations/192.0.2.1".into(), "DELETE".into()), ("/x/pools/p".into(), r#"{"range":"192.0.2.0/24","allocations":{}}"#.into())]
        );
    }

    #[test]
    fn contradictions_are_refused_not_written() {
        let layout = Layout::new(None);
        let pools = HashMap::new();
        let reservations = HashMap::new();
        let reads = Reads { pools: &pools, reservations: &reservations };
        let on_absent = |changes| vec![PoolUpdate { pool: pool("p", "192.0.2.0/24"), expected: Version::absent(), changes }];
        assert!(matches!(build(&layout, &on_absent(vec![Change::Remove { offset: 1 }]), &reads), Err(Refusal::Inconsistent { .. })));
        let twice = on_absent(vec![Change::Insert(alloc(1, "a", "a")), Change::Insert(alloc(1, "b", "b"))]);
        assert!(matches!(build(&layout, &twice, &reads), Err(Refusal::Inconsistent { .. })));
        let unread = vec![PoolUpdate { pool: pool("p", "192.0.2.0/24"), expected: Version("3".into()), changes: vec![Change::Remove { offset: 1 }] }];
        assert!(matches!(build(&layout, &unread, &reads), Err(Refusal::Inconsistent { .. })));
        let garbage = vec![PoolUpdate { pool: pool("p", "192.0.2.0/24"), expected: Version("x".into()), changes: vec![Change::Remove { offset: 1 }] }];
        assert!(matches!(build(&layout, &garbage, &reads), Err(Refusal::Inconsistent { .. })));
        // Nothing to change, nothing to send.
        assert_eq!(build(&layout, &on_absent(vec![]), &reads).unwrap(), CommitTxn::default());
    }
}
