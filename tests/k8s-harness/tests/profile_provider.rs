//! DRANET's profile-provider webhook (`thereabouts profile-provider`) over its
//! unix socket, with request bodies as DRANET's webhook client marshals them,
//! against the real apiserver with real `resource.k8s.io/v1` ResourceClaims:
//! a device's addresses are its claim's, the same on every repeat, freed by
//! the release, and, when the release never came, by the controller once the
//! claim is gone or no pod reserves it; no pod rule ever touches them.

use std::time::Duration;

use serde_json::{Value, json};
use thereabouts_e2e::{TempDir, thereabouts_bin};
use thereabouts_k8s_harness::controller::{self, Controller, Settings};
use thereabouts_k8s_harness::plugin::{Objects, kubernetes_conf};
use thereabouts_k8s_harness::profile_provider::{Client, ProfileProvider, RESOURCE_CLAIMS, claim_status, request, resource_claim};
use thereabouts_k8s_harness::{Cluster, block_on, pods, wait_until};

const NS: &str = "dra";
const POOL: &str = "192.0.2.0-24";
const PROFILE: &str = "dra-blue";

/// A ResourceClaim allocated on node-1 and reserved for a pod: its UID.
fn reserved_claim(objects: &Objects, name: &str) -> String {
    let created = objects.create_at(RESOURCE_CLAIMS, "resourceclaims", &resource_claim(name)).unwrap();
    objects.patch_status_at(RESOURCE_CLAIMS, "resourceclaims", name, &claim_status("node-1", Some((&format!("pod-{name}"), "pod-uid")))).unwrap();
    created["metadata"]["uid"].as_str().unwrap().to_string()
}

#[test]
fn a_devices_addresses_are_its_claims_until_released_or_the_claim_ends() {
    let cluster = Cluster::prepared().unwrap();
    let controller_kubeconfig = block_on(async {
        pods::namespace(&cluster, NS).await?;
        controller::install(&cluster).await
    })
    .unwrap();
    let objects = Objects::admin_in(&cluster, NS).unwrap();
    let pools = Objects::admin(&cluster).unwrap();
    let (a, b, c) = (reserved_claim(&objects, "nic-a"), reserved_claim(&objects, "nic-b"), reserved_claim(&objects, "nic-c"));

    let work = TempDir::new("profile-provider");
    let profiles = work.path().join("profiles");
    std::fs::create_dir_all(&profiles).unwrap();
    let mut profile = kubernetes_conf(PROFILE, &cluster.plugin_kubeconfig(), None, &["192.0.2.0/24", "2001:db8::/64"]);
    profile["ipam"]["routes"] = json!([{"dst": "198.51.100.0/24", "gw": "192.0.2.254"}]);
    std::fs::write(profiles.join("dra-blue.conf"), profile.to_string()).unwrap();
    let _provider = ProfileProvider::start(&thereabouts_bin(), &profiles, &work.path().join("profile.sock"), &work.path().join("provider.log")).unwrap();
    let mut client = Client::new(&work.path().join("profile.sock")).unwrap();

    let health = client.call("GET", "/health", None).unwrap();
    assert_eq!((health.0, serde_json::from_str::<Value>(&health.1).unwrap()), (200, json!({"cloudProvider": false, "profileProvider": true})));

    // The first device of claim a; the same addresses on the kubelet's retry.
    let expected =
        json!({"interface": {"addresses": ["192.0.2.1/24", "2001:db8::1/64"]}, "routes": [{"destination": "198.51.100.0/24", "gateway": "192.0.2.254"}]});
    assert_eq!(client.get_profile(&request(&a, "pci-0000-8a-00-0", PROFILE)).unwrap(), (200, expected.clone()));
    assert_eq!(client.get_profile(&request(&a, "pci-0000-8a-00-0", PROFILE)).unwrap(), (200, expected), "idempotent per (claim, device)");
    let entry = &pools.allocations(POOL).unwrap()["1"];
    assert_eq!((&entry["id"], &entry["ifname"], &entry["resourceclaimref"]), (&json!(a), &json!("0000-8a-00-0"), &json!(a)));
    // A second device of the same claim, and the devices of two more claims.
    let address = |(status, answer): (u16, Value)| (status, answer["interface"]["addresses"][0].as_str().unwrap_or_default().to_string());
    assert_eq!(address(client.get_profile(&request(&a, "eth2", PROFILE)).unwrap()), (200, "192.0.2.2/24".into()));
    assert_eq!(address(client.get_profile(&request(&b, "eth1", PROFILE)).unwrap()), (200, "192.0.2.3/24".into()));
    assert_eq!(address(client.get_profile(&request(&c, "eth1", PROFILE)).unwrap()), (200, "192.0.2.4/24".into()));

    // Refusals DRANET tells apart, and nothing written for them.
    let before = pools.allocations(POOL).unwrap();
    assert_eq!(client.get_profile(&request(&a, "eth3", "no-such-profile")).unwrap().0, 404);
    assert_eq!(client.get_profile(&json!({"device": {"name": "eth3"}, "config": {"profile": PROFILE}})).unwrap().0, 400, "no claim_uid");
    let mut static_addresses = request(&a, "eth3", PROFILE);
    static_addresses["config"]["interface"]["addresses"] = json!(["192.0.2.99/24"]);
    assert_eq!(client.get_profile(&static_addresses).unwrap().0, 400);
    assert_eq!(client.call("POST", "/GetProfileConfig", None).unwrap().0, 400, "an empty body");
    assert_eq!(pools.allocations(POOL).unwrap(), before);

    // The release frees that device alone; a repeated release is success.
    assert_eq!(client.release_profile(&request(&a, "eth2", PROFILE)).unwrap(), 200);
    assert_eq!(client.release_profile(&request(&a, "eth2", PROFILE)).unwrap(), 200);
    let held: Vec<String> = pools.allocations(POOL).unwrap().into_keys().collect();
    assert_eq!(held, ["1", "3", "4"]);

    // The controller: no pod rule touches them (no pod holds them), while their claims are reserved.
    let settings = Settings { reconcile_interval_seconds: 1, unreserved_grace_seconds: 3, ..Settings::default() };
    let _controller = Controller::run(&thereabouts_bin(), &controller_kubeconfig, &settings, &work.path().join("controller.log")).unwrap();
    std::thread::sleep(Duration::from_secs(4));
    assert_eq!(pools.allocations(POOL).unwrap().len(), 3, "reserved claims keep their devices' addresses");
    // Claim a deleted without a release; claim b no pod's any more: both freed, c kept.
    objects.delete_at(RESOURCE_CLAIMS, "resourceclaims", "nic-a").unwrap();
    objects.patch_status_at(RESOURCE_CLAIMS, "resourceclaims", "nic-b", &claim_status("node-1", None)).unwrap();
    wait_until("the ended claims' addresses are freed", Duration::from_secs(30), Duration::from_millis(200), || {
        pools.allocations(POOL).unwrap().into_keys().collect::<Vec<_>>() == ["4"]
    });
    // The freed addresses come back.
    assert_eq!(address(client.get_profile(&request("another-uid", "eth1", PROFILE)).unwrap()), (200, "192.0.2.1/24".into()));
}

/// The same calls on the file and etcd datastores: a profile's datastore is
/// whatever its config names (the cross-store rule: the same addresses for the
/// same calls on every store).
#[test]
fn the_file_and_etcd_datastores_serve_devices_the_same_way() {
    use thereabouts_k8s_harness::etcd::{Etcd, etcd_conf};
    let etcd = Etcd::start_plain().unwrap();
    let work = TempDir::new("profile-provider-stores");
    let profiles = work.path().join("profiles");
    std::fs::create_dir_all(&profiles).unwrap();
    let file = json!({"cniVersion": "1.1.0", "name": "dra-file", "ipam": {"type": "thereabouts", "datastore": "file",
        "data_dir": work.path().join("data"), "ipRanges": [{"range": "192.0.2.0/24"}, {"range": "2001:db8::/64"}]}});
    let etcd_profile = etcd_conf(etcd.access(), "dra-etcd", &["192.0.2.0/24", "2001:db8::/64"]);
    std::fs::write(profiles.join("file.conf"), file.to_string()).unwrap();
    std::fs::write(profiles.join("etcd.json"), etcd_profile.to_string()).unwrap();
    let socket = work.path().join("profile.sock");
    let _provider = ProfileProvider::start(&thereabouts_bin(), &profiles, &socket, &work.path().join("provider.log")).unwrap();
    let mut client = Client::new(&socket).unwrap();
    let addresses = |(status, answer): (u16, Value)| (status, answer["interface"]["addresses"].clone());
    for profile in ["dra-file", "dra-etcd"] {
        let device = request("uid-1", "eth1", profile);
        let first = addresses(client.get_profile(&device).unwrap());
        assert_eq!(first, (200, json!(["192.0.2.1/24", "2001:db8::1/64"])), "{profile}");
        assert_eq!(addresses(client.get_profile(&device).unwrap()), first, "{profile}: idempotent");
        assert_eq!(addresses(client.get_profile(&request("uid-2", "eth1", profile)).unwrap()).1, json!(["192.0.2.2/24", "2001:db8::2/64"]), "{profile}");
        assert_eq!(client.release_profile(&device).unwrap(), 200, "{profile}");
        assert_eq!(addresses(client.get_profile(&request("uid-3", "eth1", profile)).unwrap()).1, first.1, "{profile}: the released addresses come back");
    }
}
