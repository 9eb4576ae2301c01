//! DRANET's profile-provider webhook contract (kubernetes-sigs/dranet,
//! `pkg/cloudprovider/webhook`): the request body of `/GetProfileConfig` and
//! `/ReleaseProfileConfig`, the `NetworkConfig` a GetProfileConfig answers,
//! and the HTTP statuses DRANET tells apart (400, 404 and 409 fail the
//! kubelet's `NodePrepareResources` for good; 500 is tried again).

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::cni::error::{CniError, code};
use crate::cni::result::IpamResult;

/// `{"device": {...}, "claim_uid": "...", "config": NetworkConfig}`, as
/// DRANET's `ProfileRequest` marshals it.
#[derive(Debug, Deserialize)]
pub struct ProfileRequest {
    pub device: Device,
    #[serde(default)]
    pub claim_uid: String,
    #[serde(default)]
    pub config: Option<RequestedConfig>,
}

/// `cloudprovider.DeviceIdentifiers`: the device's stable name (its DRA
/// device name) and, when known, its MAC and PCI address.
#[derive(Debug, Deserialize)]
pub struct Device {
    #[serde(default)]
    pub name: String,
    #[serde(default, rename = "mac_address")]
    pub _mac: Option<String>,
    #[serde(default, rename = "pci_address")]
    pub _pci: Option<String>,
}

/// The parts of DRANET's `NetworkConfig` a profile provider reads: the
/// profile's name, and whether the user already set the addresses.
#[derive(Debug, Default, Deserialize)]
pub struct RequestedConfig {
    #[serde(default)]
    pub profile: String,
    #[serde(default)]
    pub interface: RequestedInterface,
}

#[derive(Debug, Default, Deserialize)]
pub struct RequestedInterface {
    #[serde(default)]
    pub addresses: Vec<String>,
    #[serde(default)]
    pub dhcp: Option<bool>,
}

/// A request refused, with the HTTP status DRANET acts on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    pub status: u16,
    pub message: String,
}

impl Refusal {
    pub fn bad_request(message: impl Into<String>) -> Self {
        Self { status: 400, message: message.into() }
    }
}

/// What a request is about, checked: DRANET always sends a claim UID and a
/// device name; without them an allocation could not be found again.
pub struct Checked<'r> {
    pub claim_uid: &'r str,
    pub device: &'r str,
    pub profile: &'r str,
}

impl ProfileRequest {
    pub fn parse(body: &[u8]) -> Result<Self, Refusal> {
        serde_json::from_slice(body).map_err(|e| Refusal::bad_request(format!("request body is not a ProfileRequest: {e}")))
    }

    pub fn checked(&self) -> Result<Checked<'_>, Refusal> {
        if self.claim_uid.is_empty() {
            return Err(Refusal::bad_request("claim_uid is empty"));
        }
        if self.device.name.is_empty() {
            return Err(Refusal::bad_request("device.name is empty"));
        }
        Ok(Checked { claim_uid: &self.claim_uid, device: &self.device.name, profile: self.config.as_ref().map_or("", |c| c.profile.as_str()) })
    }

    /// A GetProfileConfig whose user config already decides the addresses:
    /// DRANET would keep the user's over ours, and ours would leak.
    pub fn sets_addresses(&self) -> Result<(), Refusal> {
        let Some(config) = &self.config else { return Ok(()) };
        if !config.interface.addresses.is_empty() {
            return Err(Refusal::bad_request(format!("interface.addresses is set; profile {:?} allocates the addresses", config.profile)));
        }
        if config.interface.dhcp == Some(true) {
            return Err(Refusal::bad_request(format!("interface.dhcp is true; profile {:?} allocates the addresses", config.profile)));
        }
        Ok(())
    }
}

/// The interface name an allocation is recorded under: the device's stable
/// DRA name (its kernel name changes as it moves into the pod), so that a
/// repeated GetProfileConfig and the release find it. As DRANET's
/// whereabouts provider derives it, so that a pool it wrote is read alike:
/// the name itself when it is a valid interface name, else without DRANET's
/// `pci-` prefix, else `dra` and the FNV-1a hash of the name.
pub fn device_ifname(device: &str) -> String {
    if valid_ifname(device) {
        return device.to_string();
    }
    if let Some(trimmed) = device.strip_prefix("pci-").filter(|t| valid_ifname(t)) {
        return trimmed.to_string();
    }
    format!("dra{:08x}", fnv1a32(device.as_bytes()))
}

/// The CNI runtime's rule (libcni `ValidateInterfaceName`): 1 to 15 bytes,
/// not `.` or `..`, no `/`, `:` or white space.
fn valid_ifname(name: &str) -> bool {
    !name.is_empty() && name.len() <= 15 && name != "." && name != ".." && !name.chars().any(|c| c == '/' || c == ':' || c.is_whitespace())
}

fn fnv1a32(bytes: &[u8]) -> u32 {
    bytes.iter().fold(0x811c_9dc5u32, |hash, b| (hash ^ u32::from(*b)).wrapping_mul(0x0100_0193))
}

/// The `NetworkConfig` a GetProfileConfig answers: the addresses (CIDR) and
/// the config's routes, which DRANET merges into the user's config.
#[derive(Debug, Serialize, PartialEq)]
pub struct ProfileAnswer {
    pub interface: AnswerInterface,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub routes: Vec<Route>,
}

#[derive(Debug, Serialize, PartialEq)]
pub struct AnswerInterface {
    pub addresses: Vec<String>,
}

#[derive(Debug, Serialize, PartialEq)]
pub struct Route {
    pub destination: String,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub gateway: String,
}

impl From<&IpamResult> for ProfileAnswer {
    fn from(result: &IpamResult) -> Self {
        let text = |route: &Value, key: &str| route.get(key).and_then(Value::as_str).unwrap_or_default().to_string();
        ProfileAnswer {
            interface: AnswerInterface { addresses: result.ips.iter().map(|ip| ip.address.clone()).collect() },
            routes: result.routes.iter().map(|r| Route { destination: text(r, "dst"), gateway: text(r, "gw") }).filter(|r| !r.destination.is_empty()).collect(),
        }
    }
}

/// The HTTP status of a failed allocation or release: a profile that cannot
/// be used as written is permanent (400); what may heal by itself (a full
/// range, an unreachable datastore, a conflict that outlasted the call's
/// budget) is 500, so that the kubelet tries again.
pub fn status_of(e: &CniError) -> u16 {
    match e.code {
        code::INCOMPATIBLE_VERSION | code::INVALID_ENV | code::DECODE | code::INVALID_CONFIG => 400,
        _ => 500,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_request_as_dranet_marshals_it() {
        // dranet webhook.ProfileRequest{Device: {Name, MAC, PCIAddress}, ClaimUID, Config: &NetworkConfig{Profile, Interface{Name}}}.
        let body = br#"{"device":{"mac_address":"02:00:00:00:00:01","pci_address":"0000:8a:00.0","name":"pci-0000-8a-00-0"},"claim_uid":"6c1b2f0e-1","config":{"profile":"blue","interface":{"name":"net1"}}}"#;
        let request = ProfileRequest::parse(body).unwrap();
        let checked = request.checked().unwrap();
        assert_eq!((checked.claim_uid, checked.device, checked.profile), ("6c1b2f0e-1", "pci-0000-8a-00-0", "blue"));
        assert_eq!(request.sets_addresses(), Ok(()));
    }

    #[test]
    fn what_cannot_be_served_is_a_400_naming_the_field() {
        assert_eq!(ProfileRequest::parse(b"{").unwrap_err().status, 400);
        let no_uid = ProfileRequest::parse(br#"{"device":{"name":"eth1"}}"#).unwrap();
        assert_eq!(no_uid.checked().err().map(|r| r.message), Some("claim_uid is empty".into()));
        let static_addresses =
            ProfileRequest::parse(br#"{"device":{"name":"eth1"},"claim_uid":"u","config":{"profile":"p","interface":{"addresses":["192.0.2.9/24"]}}}"#)
                .unwrap();
        assert!(static_addresses.sets_addresses().unwrap_err().message.starts_with("interface.addresses"));
    }

    #[test]
    fn the_interface_name_is_the_devices_stable_name_or_its_hash() {
        assert_eq!(device_ifname("eth1"), "eth1");
        assert_eq!(device_ifname("pci-0000-8a-00-0"), "0000-8a-00-0");
        let hashed = device_ifname("pci-0000:8a:00.0-very-long-name");
        assert!(hashed.starts_with("dra") && hashed.len() == 11, "{hashed}");
        assert_eq!(hashed, device_ifname("pci-0000:8a:00.0-very-long-name"), "the same name every time");
        // FNV-1a 32 of "a" (the algorithm's published test vector).
        assert_eq!(fnv1a32(b"a"), 0xe40c_292c);
    }

    #[test]
    fn the_answer_carries_addresses_and_routes_in_dranets_shape() {
        let result = IpamResult {
            ips: vec![crate::cni::result::IpConfig {
                address: "192.0.2.2/24".into(),
                gateway: Some("192.0.2.1".into()),
                family: thereabouts_allocator::ip::Family::V4,
            }],
            routes: vec![serde_json::json!({"dst": "198.51.100.0/24", "gw": "192.0.2.1"}), serde_json::json!({"dst": "203.0.113.0/24"})],
            dns: None,
        };
        let answer = serde_json::to_value(ProfileAnswer::from(&result)).unwrap();
        assert_eq!(
            answer,
            serde_json::json!({"interface": {"addresses": ["192.0.2.2/24"]}, "routes": [{"destination": "198.51.100.0/24", "gateway": "192.0.2.1"}, {"destination": "203.0.113.0/24"}]})
        );
    }
}
