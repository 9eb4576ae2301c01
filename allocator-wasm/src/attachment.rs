//! Who a pool entry or a reservation belongs to, decided in one place for the
//! planner (which entry a repeated ADD keeps) and every datastore (which
//! reservation an ADD may take, which one a DEL may free).

use crate::model::Claim;

/// What a record (pool entry, reservation) keeps of the attachment that holds an
/// address, or what an attachment asking about it presents.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Holder<'a> {
    pub container_id: &'a str,
    pub pod_ref: &'a str,
    pub ifname: &'a str,
}

/// Whether records of this kind may lack the interface name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ifname {
    /// Every record names its interface: pool entries, thereabouts' etcd keys.
    Required,
    /// whereabouts before v0.8.0 wrote `OverlappingRangeIPReservation`s without
    /// an `ifname`: one without matches any interface of its pod.
    MayBeMissing,
}

/// Whether `recorded` belongs to the attachment `asking`. In Kubernetes (the
/// asker names a pod): the same pod and interface, whatever the container, so a
/// re-created sandbox (a StatefulSet pod re-created under its name) keeps its
/// pod's address, as in whereabouts. Outside Kubernetes: the same container and
/// interface.
pub fn same_attachment(recorded: Holder, asking: Holder, ifname: Ifname) -> bool {
    let same_interface = recorded.ifname == asking.ifname || (ifname == Ifname::MayBeMissing && recorded.ifname.is_empty());
    same_holder(recorded, asking) && same_interface
}

/// The first half of [`same_attachment`]: the same pod in Kubernetes, the same
/// container outside, whatever the interface. What an ADD hands the planner as
/// the attachment's own entries, among which it picks the interface's.
pub fn same_holder(recorded: Holder, asking: Holder) -> bool {
    if asking.pod_ref.is_empty() {
        !recorded.container_id.is_empty() && recorded.container_id == asking.container_id
    } else {
        recorded.pod_ref == asking.pod_ref
    }
}

/// Whether an entry held by `recorded` and owned by `recorded_claim` is the
/// asker's own (to keep, or to take over). A claim's entries belong to
/// whoever asks with that claim, whatever pod held them before (a VM's new
/// launcher pod, a live migration's target); a ResourceClaim's devices are
/// told apart by their interface. An entry a claim owns is never an asker's
/// without that claim, and a claim never takes a pod's entry.
pub fn owns(recorded: Holder, recorded_claim: Option<&Claim>, asking: Holder, asking_claim: Option<&Claim>) -> bool {
    owns_record(recorded, recorded_claim, asking, asking_claim, Ifname::Required)
}

/// [`owns`], for records of a kind that may lack the interface name.
pub fn owns_record(recorded: Holder, recorded_claim: Option<&Claim>, asking: Holder, asking_claim: Option<&Claim>, ifname: Ifname) -> bool {
    match (recorded_claim, asking_claim) {
        (None, None) => same_attachment(recorded, asking, ifname),
        (Some(Claim::IpamClaim(r)), Some(Claim::IpamClaim(a))) => r == a,
        (Some(Claim::ResourceClaim(r)), Some(Claim::ResourceClaim(a))) => r == a && recorded.ifname == asking.ifname,
        _ => false,
    }
}

/// Whether an entry is one the asker's ADD should see among its own: the
/// first half of [`owns`] ([`same_holder`] for pods, the same claim for claims).
pub fn may_own(recorded: Holder, recorded_claim: Option<&Claim>, asking: Holder, asking_claim: Option<&Claim>) -> bool {
    match (recorded_claim, asking_claim) {
        (None, None) => same_holder(recorded, asking),
        (Some(r), Some(a)) => r == a,
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const ASKING: Holder = Holder { container_id: "c2", pod_ref: "ns/pod", ifname: "eth0" };

    fn recorded(container_id: &'static str, pod_ref: &'static str, ifname: &'static str) -> Holder<'static> {
        Holder { container_id, pod_ref, ifname }
    }

    #[test]
    fn a_pod_keeps_its_address_across_containers_on_the_same_interface() {
        assert!(same_attachment(recorded("c1", "ns/pod", "eth0"), ASKING, Ifname::Required));
        assert!(!same_attachment(recorded("c2", "ns/pod", "net1"), ASKING, Ifname::Required));
        // The pod's entry on another interface is still the pod's: the planner picks among them.
        assert!(same_holder(recorded("c1", "ns/pod", "net1"), ASKING));
        assert!(!same_attachment(recorded("c2", "ns/other", "eth0"), ASKING, Ifname::Required));
    }

    #[test]
    fn outside_kubernetes_the_container_decides() {
        let bare = Holder { pod_ref: "", ..ASKING };
        assert!(same_attachment(recorded("c2", "", "eth0"), bare, Ifname::Required));
        assert!(!same_attachment(recorded("c1", "", "eth0"), bare, Ifname::Required));
        assert!(!same_attachment(recorded("", "", "eth0"), Holder { container_id: "", ..bare }, Ifname::Required));
    }

    #[test]
    fn a_claims_entry_is_whoever_asks_with_the_claim() {
        let vm = Claim::IpamClaim("ns/vm.net".into());
        let old_launcher = recorded("c1", "ns/launcher-a", "net1");
        assert!(owns(old_launcher, Some(&vm), ASKING, Some(&vm)));
        assert!(!owns(old_launcher, Some(&vm), recorded("c1", "ns/launcher-a", "net1"), None), "not without the claim");
        assert!(!owns(ASKING, None, ASKING, Some(&vm)), "a claim takes no pod's entry");
        assert!(!owns(old_launcher, Some(&vm), ASKING, Some(&Claim::IpamClaim("ns/other".into()))));
        let device = Claim::ResourceClaim("ns/rc".into());
        assert!(owns(recorded("uid", "", "eth0"), Some(&device), ASKING, Some(&device)));
        assert!(!owns(recorded("uid", "", "net2"), Some(&device), ASKING, Some(&device)), "another device of the claim");
        assert!(may_own(recorded("uid", "", "net2"), Some(&device), ASKING, Some(&device)));
    }

    #[test]
    fn only_old_whereabouts_reservations_may_lack_the_interface() {
        assert!(same_attachment(recorded("", "ns/pod", ""), ASKING, Ifname::MayBeMissing));
        assert!(!same_attachment(recorded("", "ns/pod", ""), ASKING, Ifname::Required));
    }
}
