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
    /// `node_slice_max_entries`: entries a node's slice pool takes before the
    /// node prefers a new slice.
    pub max_entries: Option<u32>,
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
    /// `ipRangesAllocation`: every range, or the first with a free address.
    pub ip_ranges_allocation: RangesAllocation,
    /// `preferred_ip_annotation`: the host reads the pod's
    /// `whereabouts.cni.cncf.io/preferred-ip` into [`Request::preferred`].
    pub preferred_ip_annotation: bool,
    /// `allowPersistentIPs`: an attachment may allocate for an IPAMClaim.
    pub allow_persistent_ips: bool,
    /// The IPAMClaim stdin names (see `ipam-claim-reference` in the WIT).
    pub ipam_claim_reference: Option<String>,
    /// `policies`, validated (see `crate::policies_config`).
    pub policies: Vec<PolicyConfig>,
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

/// `ipRangesAllocation` (see `ranges-allocation` in the WIT).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum RangesAllocation {
    /// One address from each range (whereabouts' behaviour).
    #[default]
    All,
    /// One address from the first range, in order, that has a free one.
    FirstAvailable,
}

/// One entry of `policies` (see `policy-config` in the WIT).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct PolicyConfig {
    pub name: String,
    pub path: String,
    /// Compact JSON text.
    pub settings: String,
    pub timeout_ms: u32,
    pub memory_mib: u32,
    pub on_error: PolicyOnError,
    pub mode: PolicyMode,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum PolicyOnError {
    #[default]
    Deny,
    Ignore,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum PolicyMode {
    #[default]
    Enforce,
    Monitor,
}

/// One pool entry as a datastore holds it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Allocation {
    pub offset: u128,
    pub container_id: String,
    pub pod_ref: String,
    pub ifname: String,
    /// The claim that owns the address, when a pod attachment does not
    /// (`docs/claims.md`): the attachment above only holds it for now.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub claim: Option<Claim>,
}

/// An owner that outlives the pods holding its addresses.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Claim {
    /// An `IPAMClaim` (`k8s.cni.cncf.io`), `namespace/name`: a VM's addresses,
    /// kept across its launcher pods until the claim is deleted.
    IpamClaim(String),
    /// A DRA `ResourceClaim`, by UID: a network device's addresses (one
    /// entry per device, told apart by the entry's `ifname`), kept until the
    /// device is released or the claim is gone.
    ResourceClaim(String),
}

impl Claim {
    /// What it refers to: `namespace/name` (IPAMClaim), the UID (ResourceClaim).
    pub fn reference(&self) -> &str {
        match self {
            Claim::IpamClaim(r) | Claim::ResourceClaim(r) => r,
        }
    }
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
    /// What the config's policies decided (see `guidance` in the WIT and
    /// [`crate::guidance`]); `None` without policies.
    pub guidance: Option<Guidance>,
    /// Addresses the pod prefers (see `request.preferred` in the WIT).
    pub preferred: Vec<String>,
    /// The claim the attachment allocates for (see `request.claim` in the WIT).
    pub claim: Option<Claim>,
}

/// Policies' decisions for one attachment (see `guidance` in the WIT).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Guidance {
    /// The ranges to serve, in order; `None`: every range in config order.
    pub ranges: Option<Vec<u32>>,
    /// At most one per range.
    pub picks: Vec<RangePick>,
}

/// A policy's choice in one range (see `range-pick` in the WIT).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RangePick {
    pub range_index: u32,
    /// Addresses in order of preference; empty: the built-in choice.
    pub prefer: Vec<String>,
    /// Addresses the built-in choice skips as if excluded.
    pub refuse: Vec<String>,
    /// The range gives the attachment nothing, for this reason.
    pub veto: Option<String>,
}

/// What a policy is offered in one range (see `range-candidates` in the WIT).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RangeCandidates {
    pub range_index: u32,
    /// The lowest free addresses, without prefix, in address order.
    pub free: Vec<String>,
    /// The address the pod already holds in the range's pool.
    pub held: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Assignment {
    /// Index of the range (into the config's ranges) the address is from.
    pub range_index: u32,
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
    Exhausted {
        message: String,
    },
    Rejected {
        message: String,
    },
    /// A policy's pick in range `range_index` cannot be had (see `bad-pick` in the WIT).
    BadPick {
        range_index: u32,
        message: String,
    },
}

impl PlanFailure {
    pub fn message(&self) -> &str {
        match self {
            PlanFailure::Exhausted { message } | PlanFailure::Rejected { message } | PlanFailure::BadPick { message, .. } => message,
        }
    }
}

/// CNI_CONTAINERID and CNI_IFNAME of the attachment a DEL, CHECK or GC is about.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Attachment {
    pub container_id: String,
    pub ifname: String,
    /// The ResourceClaim a device's release speaks for (see `attachment` in the WIT).
    pub claim: Option<Claim>,
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
