//! Who a pool entry or a reservation belongs to, decided in one place for the
//! planner (which entry a repeated ADD keeps) and every datastore (which
//! reservation an ADD may take, which one a DEL may free).

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
    fn only_old_whereabouts_reservations_may_lack_the_interface() {
        assert!(same_attachment(recorded("", "ns/pod", ""), ASKING, Ifname::MayBeMissing));
        assert!(!same_attachment(recorded("", "ns/pod", ""), ASKING, Ifname::Required));
    }
}
