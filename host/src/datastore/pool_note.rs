//! What a node noted of one of its slice pools when its calls last read or
//! wrote it: how many entries it held, and (as hashes) who held them. An ADD
//! with `node_slice_max_entries` reads only the pools of its node that may
//! take it or may hold it already, so that its cost does not grow with the
//! slices its node fills: a pool noted at the bound, without the asking pod,
//! is left out.
//!
//! A hint, never what correctness rests on: every address is still planned on
//! a read and committed with its entry tests. A note can be stale in only two
//! ways. Fewer entries than noted (the controller freed some): the ADD leaves
//! out a pool with room and may claim a slice early (it reads them all only
//! when no slice is free). A holder not noted: only the node's own calls add
//! entries to its slice pools, and each notes what it wrote.

use std::collections::BTreeSet;

use thereabouts_allocator::attachment::Holder;
use thereabouts_allocator::model::Allocation;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PoolNote {
    pub entries: usize,
    /// [`holder_key`]s of every entry's pod and container.
    holders: BTreeSet<u64>,
}

/// 64-bit FNV-1a: stable across processes and builds, and cheap, for keys
/// where a collision only costs a read more (here and the controller's index
/// of pods' pools).
pub fn fnv1a<'a>(bytes: impl IntoIterator<Item = &'a u8>) -> u64 {
    bytes.into_iter().fold(0xcbf2_9ce4_8422_2325, |hash, byte| (hash ^ u64::from(*byte)).wrapping_mul(0x0100_0000_01b3))
}

/// The hash of a holder's pod (`p`) or container (`c`): two holders sharing
/// one only make an ADD read a pool it could have left out.
fn holder_key(kind: u8, text: &str) -> u64 {
    fnv1a([kind, b':'].iter().chain(text.as_bytes()))
}

impl PoolNote {
    pub fn of(entries: &[Allocation]) -> Self {
        let keys = entries.iter().flat_map(|e| [(b'p', &e.pod_ref), (b'c', &e.container_id)]);
        PoolNote { entries: entries.len(), holders: keys.filter(|(_, text)| !text.is_empty()).map(|(kind, text)| holder_key(kind, text)).collect() }
    }

    /// Whether the pool may hold an entry that `asking` would take for its own
    /// (`same_holder`: the same pod, or without a pod the same container).
    pub fn may_hold(&self, asking: Holder) -> bool {
        match asking.pod_ref.is_empty() {
            false => self.holders.contains(&holder_key(b'p', asking.pod_ref)),
            true => !asking.container_id.is_empty() && self.holders.contains(&holder_key(b'c', asking.container_id)),
        }
    }

    /// `entries <n>`, then a hash a line, then `end`: a note cut short is no note.
    pub fn to_text(&self) -> String {
        let mut text = format!("entries {}\n", self.entries);
        for key in &self.holders {
            text.push_str(&format!("{key:016x}\n"));
        }
        text.push_str("end\n");
        text
    }

    pub fn from_text(text: &str) -> Option<Self> {
        let mut lines = text.lines();
        let entries = lines.next()?.strip_prefix("entries ")?.parse().ok()?;
        let mut holders = BTreeSet::new();
        for line in lines {
            if line == "end" {
                return Some(PoolNote { entries, holders });
            }
            holders.insert(u64::from_str_radix(line, 16).ok()?);
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(container_id: &str, pod_ref: &str) -> Allocation {
        Allocation { offset: 1, container_id: container_id.into(), pod_ref: pod_ref.into(), ifname: "eth0".into(), claim: None }
    }

    fn asking<'a>(container_id: &'a str, pod_ref: &'a str) -> Holder<'a> {
        Holder { container_id, pod_ref, ifname: "eth0" }
    }

    #[test]
    fn a_note_may_hold_the_pods_and_containers_of_its_entries_and_no_other() {
        let note = PoolNote::of(&[entry("c1", "ns/a"), entry("c2", "")]);
        assert_eq!(note.entries, 2);
        assert!(note.may_hold(asking("c9", "ns/a")), "the same pod, another sandbox");
        assert!(!note.may_hold(asking("c1", "ns/b")), "a pod's container is not its pod");
        assert!(note.may_hold(asking("c2", "")), "without a pod: the container");
        assert!(!note.may_hold(asking("ns/a", "")));
    }

    #[test]
    fn a_note_reads_back_from_its_text_and_a_cut_one_is_none() {
        let note = PoolNote::of(&[entry("c1", "ns/a"), entry("c2", "ns/b")]);
        let text = note.to_text();
        assert_eq!(PoolNote::from_text(&text), Some(note));
        assert_eq!(PoolNote::from_text(&text[..text.len() - 4]), None);
        assert_eq!(PoolNote::from_text(""), None);
        assert_eq!(PoolNote::from_text("entries x\nend\n"), None);
    }
}
