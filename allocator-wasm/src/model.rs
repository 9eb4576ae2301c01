//! The engine's data model: the Rust side of the records in `wit/ipam.wit`.
//! Offsets are plain `u128` here; the WIT layer splits them in two `u64`s.

use serde::Serialize;

use crate::ip::Family;

/// One range after normalization (see `normalized-range` in the WIT).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct NormalizedRange {
    pub cidr: String,
    /// The prefix results carry: `cidr`'s own, except in a node's slice, which
    /// keeps its range's.
    pub prefix_len: u8,
    /// `cidr`'s prefix length (the extent of `network`).
    #[serde(skip)]
    pub network_prefix: u8,
    pub family: Family,
    /// Network address as an integer.
    pub network: u128,
    pub first: String,
    pub last: String,
    pub first_offset: u128,
    pub last_offset: u128,
    /// Excludes as written in the config.
    pub excludes: Vec<String>,
    /// Excludes as canonical CIDRs (bare IPs become /32 or /128).
    pub exclude_cidrs: Vec<String>,
    /// Offsets never handed out, as merged, sorted intervals clipped to [first,
    /// last]: the exclude blocks and the gateway.
    #[serde(skip)]
    pub excluded: Vec<(u128, u128)>,
    /// Addresses in [first, last] that are neither excluded nor the gateway.
    pub usable: u128,
    /// Never allocated (see `range::excluded_blocks`).
    pub gateway: Option<String>,
    pub pool_name: String,
    pub requested: Option<String>,
    /// `node_slice_size`: the range is divided among nodes (see `crate::slices`).
    pub node_slicing: Option<NodeSlicing>,
}

/// How a range is divided among nodes (see `node-slicing` in the WIT).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct NodeSlicing {
    /// The `NodeSlicePool` recording which node holds which slice.
    pub slice_pool: String,
    /// Prefix length of every slice.
    pub prefix_len: u8,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct StaticAddress {
    pub address: String,
    pub gateway: Option<String>,
    pub family: Family,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct DatastoreSettings {
    pub kind: Option<String>,
    pub data_dir: Option<String>,
    pub kubeconfig: Option<String>,
    pub etcd_hosts: Vec<String>,
    pub etcd_username: Option<String>,
    pub etcd_password: Option<String>,
    pub etcd_key_file: Option<String>,
    pub etcd_cert_file: Option<String>,
    pub etcd_ca_cert_file: Option<String>,
    pub etcd_prefix: Option<String>,
}

impl NormalizedRange {
    /// The last address of the range's network (its broadcast address).
    pub fn network_end(&self) -> u128 {
        self.network | crate::ip::host_mask(self.family, self.network_prefix)
    }

    /// Whether `value`, an address of `family`, lies in the range's network.
    pub fn network_contains(&self, family: Family, value: u128) -> bool {
        family == self.family && value >= self.network && value <= self.network_end()
    }

    /// Whether the two ranges' networks share an address (one nests in the other).
    pub fn shares_network_with(&self, other: &NormalizedRange) -> bool {
        self.family == other.family && self.network <= other.network_end() && other.network <= self.network_end()
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct NormalizedConfig {
    pub name: String,
    pub cni_version: String,
    pub network_name: String,
    pub enable_overlapping_ranges: bool,
    pub ranges: Vec<NormalizedRange>,
    pub addresses: Vec<StaticAddress>,
    pub routes_json: Option<String>,
    pub dns_json: Option<String>,
    pub pod_ref: String,
    pub datastore: DatastoreSettings,
    pub log_file: Option<String>,
    pub log_level: Option<String>,
    pub configuration_path: Option<String>,
}

impl NormalizedConfig {
    /// The first range on the pool `pool_name` (ranges on one pool share its network).
    pub fn range_of_pool(&self, pool_name: &str) -> Option<&NormalizedRange> {
        self.ranges.iter().find(|r| r.pool_name == pool_name)
    }
}

/// One pool entry as a datastore holds it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Allocation {
    pub offset: u128,
    pub container_id: String,
    pub pod_ref: String,
    pub ifname: String,
}

impl Allocation {
    /// Its attachment, for [`crate::attachment::same_attachment`].
    pub fn holder(&self) -> crate::attachment::Holder<'_> {
        crate::attachment::Holder { container_id: &self.container_id, pod_ref: &self.pod_ref, ifname: &self.ifname }
    }
}

/// The entries of a pool as planning one range sees them (see `pool-state` in
/// the WIT, which adds the pool's name). Offsets are split at 2^64 the way they
/// cross the component boundary, so the common case (every offset below 2^64) is
/// one bulk copy with no conversion.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PoolSnapshot {
    pub taken: Vec<u64>,
    pub taken_wide: Vec<u128>,
    pub reserved: Vec<u128>,
    pub held: Vec<Allocation>,
}

impl PoolSnapshot {
    /// A snapshot whose taken offsets are `offsets` (any order, any width).
    pub fn with_taken(offsets: impl IntoIterator<Item = u128>) -> Self {
        let mut pool = PoolSnapshot::default();
        for offset in offsets {
            match u64::try_from(offset) {
                Ok(narrow) => pool.taken.push(narrow),
                Err(_) => pool.taken_wide.push(offset),
            }
        }
        pool
    }

    /// Every entry's offset, narrow and wide.
    pub fn entries(&self) -> impl Iterator<Item = u128> + '_ {
        self.taken.iter().map(|&o| u128::from(o)).chain(self.taken_wide.iter().copied())
    }

    /// Every offset that counts as taken: the pool's entries and the reservations.
    pub fn occupied(&self) -> impl Iterator<Item = u128> + '_ {
        self.entries().chain(self.reserved.iter().copied())
    }

    pub fn occupied_count(&self) -> usize {
        self.taken.len() + self.taken_wide.len() + self.reserved.len()
    }
}

/// One pool of a config by name (see `pool-state` in the WIT).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PoolState {
    /// The `pool_name` of the ranges it serves.
    pub name: String,
    pub snapshot: PoolSnapshot,
}

/// Where `plan_all` learns what overlapping ranges hold (see `reservations` in the WIT).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reservations {
    /// Each pool's `reserved` alone.
    AsRead,
    /// Also every other pool's entries inside a range's network.
    FromPools,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Request {
    pub container_id: String,
    pub pod_ref: String,
    pub ifname: String,
    /// The address to plan instead of the lowest free one: not in the WIT's
    /// `request`, `plan_all` sets it from each range's `requested`.
    pub requested_ip: Option<String>,
    /// Conflicts this call already met (0: lowest free, whereabouts' rule). See
    /// `request.contention` in the WIT and [`crate::planner::spread_window`].
    pub contention: u32,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Assignment {
    pub ip: String,
    pub address: String,
    pub offset: u128,
    pub gateway: Option<String>,
    /// The address's `OverlappingRangeIPReservation` name, scoped by `network_name`.
    pub reservation: String,
}

/// What planning decided for one range. `Reuse`'s `held_index` points into the
/// `held` of the range's pool.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "outcome", rename_all = "kebab-case")]
pub enum PlanOutcome {
    Reuse { assignment: Assignment, held_index: u32 },
    Fresh { assignment: Assignment },
}

impl PlanOutcome {
    /// The address this outcome gives the pod.
    pub fn assignment(&self) -> &Assignment {
        match self {
            PlanOutcome::Reuse { assignment, .. } | PlanOutcome::Fresh { assignment } => assignment,
        }
    }
}

/// Why a range cannot serve a request (see `plan-failure` in the WIT).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "failure", rename_all = "kebab-case")]
pub enum PlanFailure {
    Exhausted { message: String },
    Rejected { message: String },
}

impl PlanFailure {
    pub fn message(&self) -> &str {
        match self {
            PlanFailure::Exhausted { message } | PlanFailure::Rejected { message } => message,
        }
    }
}

/// CNI_CONTAINERID and CNI_IFNAME of the attachment a DEL, CHECK or GC is about.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Attachment {
    pub container_id: String,
    pub ifname: String,
}

/// An entry `release` matched (see `released` in the WIT).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Released {
    pub index: u32,
    pub reservation: Option<String>,
}

/// How full one range is (see `range-usage` in the WIT).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RangeUsage {
    pub allocated: u64,
    pub free: u128,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WarningKind {
    Overlap,
    Gateway,
}

/// Something about a valid config that is likely a mistake (see `config-warning`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigWarning {
    pub kind: WarningKind,
    pub text: String,
}

/// `preview`'s answer (see `pod-table` in the WIT).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PreviewTable {
    pub served: u32,
    /// One line per served pod, one `ip/prefix` per range separated by spaces.
    pub addresses: String,
    /// Offsets, pod-major.
    pub offsets: Vec<u128>,
    pub failure: Option<PreviewFailure>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PreviewFailure {
    pub range_index: u32,
    pub exhausted: String,
    pub rejected: String,
}
