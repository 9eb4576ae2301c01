//! Reading and claiming a node's slices, in whichever shape its layout keeps
//! them ([`Shape`]): whereabouts' list in the layout object, one object per
//! slice, or both while the controller moves a layout from one to the other.
//! The model is in `slices.rs`; the design in `docs/datastores.md` ("Slice
//! objects").

use std::collections::BTreeSet;
use std::time::Instant;

use http::Method;
use serde_json::{Value, json};

use super::crd::{self, NODE_SLICE_POOLS};
use super::slices::{self, Shape, SliceObject, SliceTable};
use super::{JSON, JSON_PATCH, KubernetesStore, Reply, held_memory, node_turn};
use crate::datastore::{DatastoreError, NodeSlices, SliceCandidates};
use crate::logging;

/// Creates tried at slices picked in turn before a claim lists which slices
/// are taken: at 5 000 nodes on 16 384 slices one create in three meets a
/// taken slice, and the list of every slice object (about 600 bytes each) is
/// what a claim should not pay each time.
const PROBES: usize = 32;
/// Slice objects a node that remembers none of its slices reads from its home
/// before it lists them: with 5 000 nodes over 8 192 slices, the controller
/// found a free slice within a few of a node's home.
const HOME_READS: usize = 8;

/// How a create of a slice object ended.
enum Created {
    /// Ours now; its UID, to take it back if the list refuses the claim.
    Ours(String),
    /// Someone holds it (or it cools down).
    Taken,
}

/// The slices `node` holds in the layout object's list (none once the
/// layout keeps slice objects alone).
fn listed(table: &SliceTable, node: &str) -> Vec<String> {
    match table.shape {
        Shape::Objects => Vec::new(),
        Shape::List | Shape::Both { .. } => table.held_by(node),
    }
}

fn add_new(held: &mut Vec<String>, slice: String) {
    if !held.contains(&slice) {
        held.push(slice);
    }
}

impl KubernetesStore {
    /// The slices `node` holds in layout `slice_pool`, from the watch cache
    /// unless `fresh`: one GET of the layout object, and, once the layout has
    /// slice objects, one LIST of the node's objects by label.
    ///
    /// Unless `every` slice is asked for, the slices this node remembers are
    /// read by name instead ([`held_memory`]): an ADD needs a slice of its
    /// node, not all of them, and a DEL that finds its entries there needs no more.
    pub(super) fn held_slices(
        &self,
        slice_pool: &str,
        node: &str,
        fresh: bool,
        every: bool,
        candidates: &mut dyn SliceCandidates,
        deadline: Instant,
    ) -> Result<NodeSlices, DatastoreError> {
        let table = self.slice_table(slice_pool, node, fresh, deadline)?;
        if table.shape.has_objects() && !every && !fresh {
            if let Some(held) = self.recalled(&table, slice_pool, node, deadline)? {
                return Ok(NodeSlices { slices: held, all: false });
            }
            if let Some(found) = self.found_from_home(slice_pool, node, candidates, deadline)? {
                held_memory::remember(&self.lock_scope(), slice_pool, node, std::slice::from_ref(&found));
                let mut held = listed(&table, node);
                add_new(&mut held, found);
                return Ok(NodeSlices { slices: held, all: false });
            }
        }
        Ok(NodeSlices { slices: self.held_in(&table, slice_pool, node, fresh, deadline)?, all: true })
    }

    /// A node that remembers none of its slices: the objects of the
    /// [`HOME_READS`] slices from its home ([`slices::home`], where the
    /// controller assigns a new node's slice) read by name, the first that
    /// names the node; `None` when none does, and the node lists them.
    fn found_from_home(&self, slice_pool: &str, node: &str, candidates: &mut dyn SliceCandidates, deadline: Instant) -> Result<Option<String>, DatastoreError> {
        for slice in candidates.near_home(node, HOME_READS) {
            if let Some(o) = self.slice_object(slice_pool, &slice, deadline)?
                && o.node == node
            {
                return Ok(Some(o.slice));
            }
        }
        Ok(None)
    }

    /// The node holding `slice`: the NodeSlicePool's table, else (a layout
    /// of slice objects) the slice's object; `None` when no node holds it.
    pub(super) fn holder_of_slice(&self, slice_pool: &str, slice: &str, deadline: Instant) -> Result<Option<String>, DatastoreError> {
        let table = self.slice_table(slice_pool, "", false, deadline)?;
        if let Some((node, _)) = table.allocations.iter().find(|(node, s)| s == slice && !node.is_empty()) {
            return Ok(Some(node.clone()));
        }
        if !table.shape.has_objects() {
            return Ok(None);
        }
        Ok(self.slice_object(slice_pool, slice, deadline)?.map(|o| o.node).filter(|node| !node.is_empty()))
    }

    /// The object of `slice` in layout `slice_pool`, from the watch cache; `None` when it has none.
    fn slice_object(&self, slice_pool: &str, slice: &str, deadline: Instant) -> Result<Option<SliceObject>, DatastoreError> {
        let name = slices::slice_object_name(slice_pool, slice);
        let action = format!("reading slice object NodeSlicePool {}/{name}", self.namespace);
        let path = format!("{}?resourceVersion=0", crd::object_path(&self.namespace, NODE_SLICE_POOLS, &name));
        match self.call(Method::GET, &path, None, &action, deadline)? {
            Reply::Object(object) => Ok(SliceObject::from_object(&object).ok()),
            Reply::Status(s) if s.code == 404 => Ok(None),
            Reply::Status(s) => Err(self.status_error(&s, &action)),
        }
    }

    /// The slices this node remembers of `table`'s layout that still name it,
    /// each read by name from the watch cache; `None` when none does.
    fn recalled(&self, table: &SliceTable, slice_pool: &str, node: &str, deadline: Instant) -> Result<Option<Vec<String>>, DatastoreError> {
        let mut held = listed(table, node);
        let mut found = false;
        for slice in held_memory::recall(&self.lock_scope(), slice_pool, node) {
            if let Some(o) = self.slice_object(slice_pool, &slice, deadline)?
                && o.node == node
            {
                found = true;
                add_new(&mut held, o.slice);
            }
        }
        Ok(found.then_some(held))
    }

    /// What `node` holds of the layout read as `table`.
    fn held_in(&self, table: &SliceTable, slice_pool: &str, node: &str, fresh: bool, deadline: Instant) -> Result<Vec<String>, DatastoreError> {
        let mut held = listed(table, node);
        if table.shape.has_objects() {
            let objects: Vec<String> =
                self.slice_objects(slice_pool, Some(node), fresh, deadline)?.into_iter().filter(|o| o.node == node).map(|o| o.slice).collect();
            held_memory::remember(&self.lock_scope(), slice_pool, node, &objects);
            objects.into_iter().for_each(|slice| add_new(&mut held, slice));
        }
        Ok(held)
    }

    /// A fresh read of the layout, then a claim in the shape it has now. The
    /// node's calls take turns on it (one claims, the others find the slice
    /// it took).
    pub(super) fn claim_in_layout(
        &self,
        slice_pool: &str,
        node: &str,
        known: &[String],
        candidates: &mut dyn SliceCandidates,
        deadline: Instant,
    ) -> Result<Option<String>, DatastoreError> {
        let _turn = node_turn::NodeTurn::claim_turn(&self.lock_scope(), slice_pool, deadline);
        // Slices found taken by a create, whatever the list says.
        let mut taken = BTreeSet::new();
        loop {
            let table = self.slice_table(slice_pool, node, true, deadline)?;
            // Calls of one node that ran full together claim one slice, not one each.
            let held = self.held_in(&table, slice_pool, node, true, deadline)?;
            if let Some(fresh) = held.into_iter().find(|s| !known.contains(s)) {
                return Ok(Some(fresh));
            }
            let claimed = match table.shape {
                Shape::List => self.claim_in_list(slice_pool, &table, node, &taken, candidates, deadline)?,
                Shape::Both { .. } => self.claim_in_both(slice_pool, &table, node, &mut taken, candidates, deadline)?,
                Shape::Objects => {
                    let claimed = self.claim_object(slice_pool, &table, node, candidates, deadline)?;
                    if let Some(slice) = &claimed {
                        self.remember_claim(slice_pool, node, slice);
                    }
                    return Ok(claimed);
                }
            };
            match claimed {
                Claim::Took(slice) => {
                    logging::verbose(format!("node {node} claimed slice {slice} of NodeSlicePool {slice_pool}"));
                    self.remember_claim(slice_pool, node, &slice);
                    return Ok(Some(slice));
                }
                Claim::NoneFree => return Ok(None),
                Claim::Lost => continue,
            }
        }
    }

    /// A slice object this node now holds too, for its next ADD ([`held_memory`]).
    fn remember_claim(&self, slice_pool: &str, node: &str, slice: &str) {
        let scope = self.lock_scope();
        let mut held = held_memory::recall(&scope, slice_pool, node);
        if !held.iter().any(|s| s == slice) {
            held.push(slice.to_string());
            held_memory::remember(&scope, slice_pool, node, &held);
        }
    }

    /// whereabouts' shape: a JSON patch that tests that the slot is still free.
    fn claim_in_list(
        &self,
        slice_pool: &str,
        table: &SliceTable,
        node: &str,
        taken: &BTreeSet<String>,
        candidates: &mut dyn SliceCandidates,
        deadline: Instant,
    ) -> Result<Claim, DatastoreError> {
        let Some((index, slice)) = table.first_free(|s| !taken.contains(s) && candidates.usable(s)) else { return Ok(Claim::NoneFree) };
        Ok(match self.patch_list(slice_pool, index, &slice, node, deadline)? {
            true => Claim::Took(slice),
            false => Claim::Lost,
        })
    }

    /// On the way between shapes: the object first, then the list; a claim
    /// the list refuses takes its object back.
    fn claim_in_both(
        &self,
        slice_pool: &str,
        table: &SliceTable,
        node: &str,
        taken: &mut BTreeSet<String>,
        candidates: &mut dyn SliceCandidates,
        deadline: Instant,
    ) -> Result<Claim, DatastoreError> {
        let Some((index, slice)) = table.first_free(|s| !taken.contains(s) && candidates.usable(s)) else { return Ok(Claim::NoneFree) };
        let Created::Ours(uid) = self.create_slice_object(slice_pool, &table.slice_size, &slice, node, deadline)? else {
            taken.insert(slice);
            return Ok(Claim::Lost);
        };
        if self.patch_list(slice_pool, index, &slice, node, deadline)? {
            return Ok(Claim::Took(slice));
        }
        let action = format!("taking back slice object {}/{}", self.namespace, slices::slice_object_name(slice_pool, &slice));
        let path = crd::object_path(&self.namespace, NODE_SLICE_POOLS, &slices::slice_object_name(slice_pool, &slice));
        self.delete_guarded(&path, Some(json!({"uid": uid})), &action, deadline)?;
        Ok(Claim::Lost)
    }

    /// Slice objects only: creates at slices picked from a start of the node's
    /// own (so nodes claiming at once spread over the layout), then, past
    /// [`PROBES`] taken ones, the first free slice after the start by a LIST
    /// of the layout's objects.
    fn claim_object(
        &self,
        slice_pool: &str,
        table: &SliceTable,
        node: &str,
        candidates: &mut dyn SliceCandidates,
        deadline: Instant,
    ) -> Result<Option<String>, DatastoreError> {
        let layout = candidates.layout();
        if layout.is_empty() {
            return Ok(None);
        }
        let start = slices::home(node, layout.len());
        let in_order = || layout[start..].iter().chain(&layout[..start]);
        let mut tried = 0;
        for slice in in_order() {
            if tried == PROBES {
                break;
            }
            if !candidates.usable(slice) {
                continue;
            }
            tried += 1;
            if let Created::Ours(_) = self.create_slice_object(slice_pool, &table.slice_size, slice, node, deadline)? {
                logging::verbose(format!("node {node} claimed slice {slice} of NodeSlicePool {slice_pool} (an object of its own)"));
                return Ok(Some(slice.clone()));
            }
        }
        loop {
            let held: BTreeSet<String> = self.slice_objects(slice_pool, None, true, deadline)?.into_iter().map(|o| o.slice).collect();
            let Some(slice) = in_order().find(|s| !held.contains(*s) && candidates.usable(s)) else { return Ok(None) };
            if let Created::Ours(_) = self.create_slice_object(slice_pool, &table.slice_size, slice, node, deadline)? {
                logging::verbose(format!("node {node} claimed slice {slice} of NodeSlicePool {slice_pool} (an object of its own, after a list)"));
                return Ok(Some(slice.clone()));
            }
        }
    }

    /// The JSON patch that takes the free slot `index` of the list; `false`
    /// when it was taken meanwhile (422, or 409).
    fn patch_list(&self, slice_pool: &str, index: usize, slice: &str, node: &str, deadline: Instant) -> Result<bool, DatastoreError> {
        let action = format!("claiming a slice of NodeSlicePool {}/{slice_pool} for node {node}", self.namespace);
        let patch = slices::claim_patch(index, slice, node);
        match self.call(Method::PATCH, &crd::object_path(&self.namespace, NODE_SLICE_POOLS, slice_pool), Some((JSON_PATCH, &patch)), &action, deadline)? {
            Reply::Object(_) => Ok(true),
            Reply::Status(s) if s.code == 422 || s.code == 409 => Ok(false),
            Reply::Status(s) => Err(self.status_error(&s, &action)),
        }
    }

    fn create_slice_object(&self, slice_pool: &str, size: &str, slice: &str, node: &str, deadline: Instant) -> Result<Created, DatastoreError> {
        let body = SliceObject::object(slice_pool, &self.namespace, size, slice, node, None);
        let action = format!("claiming slice {slice} of NodeSlicePool {}/{slice_pool} for node {node}", self.namespace);
        match self.call(Method::POST, &crd::collection_path(&self.namespace, NODE_SLICE_POOLS), Some((JSON, &body)), &action, deadline)? {
            Reply::Object(created) => Ok(Created::Ours(created.pointer("/metadata/uid").and_then(Value::as_str).unwrap_or_default().to_string())),
            Reply::Status(s) if s.code == 409 => Ok(Created::Taken),
            Reply::Status(s) => Err(self.status_error(&s, &action)),
        }
    }

    /// The slice objects of layout `slice_pool` (those `node` holds, when
    /// given), from the watch cache unless `fresh`. One that cannot be read is
    /// left out: its slice looks free to this call, whose create then fails.
    fn slice_objects(&self, slice_pool: &str, node: Option<&str>, fresh: bool, deadline: Instant) -> Result<Vec<SliceObject>, DatastoreError> {
        let action = format!("listing the slice objects of NodeSlicePool {}/{slice_pool}", self.namespace);
        let mut path = format!("{}?labelSelector={}", crd::collection_path(&self.namespace, NODE_SLICE_POOLS), slices::slice_selector(slice_pool, node));
        if !fresh {
            path.push_str("&resourceVersion=0");
        }
        let list = match self.call(Method::GET, &path, None, &action, deadline)? {
            Reply::Object(list) => list,
            Reply::Status(s) => return Err(self.status_error(&s, &action)),
        };
        let items = list.get("items").and_then(Value::as_array).map(Vec::as_slice).unwrap_or_default();
        Ok(items
            .iter()
            .filter_map(|item| {
                SliceObject::from_object(item)
                    .map_err(|e| {
                        logging::verbose(format!(
                            "NodeSlicePool {}: not a slice object ({e}); left out",
                            item.pointer("/metadata/name").unwrap_or(&Value::Null)
                        ))
                    })
                    .ok()
            })
            .collect())
    }
}

/// How one claim attempt ended.
enum Claim {
    Took(String),
    NoneFree,
    /// Someone else took the slot: read again.
    Lost,
}
