//! `thereabouts profile-provider`: DRANET's profile-provider webhook
//! (`docs/claims.md`). DRANET moves a network device into a pod and asks this
//! server for the device's addresses; each answer is an allocation owned by
//! the ResourceClaim (by UID) and the device, made and released by the same
//! pipeline as a CNI ADD and DEL, on the profile's datastore.
//!
//! - [`wire`]: the request and answer bodies and the HTTP statuses;
//! - [`serve`]: the HTTP server on a unix socket (or loopback TCP);
//! - here: profiles (network configs keyed by `name`) and the two calls.

pub mod serve;
pub mod wire;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use anyhow::{Context, Result, bail};
use thereabouts_allocator::model::Claim;

use crate::cni::commands;
use crate::cni::error::CniError;
use crate::component::{EngineComponent, EngineFailure};
use crate::ipam::Attachment;
use crate::{datastore, logging, network_config};
use wire::{ProfileAnswer, ProfileRequest, Refusal};

/// Where the DaemonSet mounts the profiles (a ConfigMap).
pub const DEFAULT_PROFILES_DIR: &str = "/etc/thereabouts/profiles";

/// The profiles, and the one engine every call runs on in turn: calls of one
/// node are few (one per device of a pod being prepared), and one at a time
/// they never race each other for the node's pools.
pub struct Provider {
    profiles: BTreeMap<String, Profile>,
    engine: Mutex<EngineComponent>,
}

/// A network config (`.conf`, or `.json` as DRANET's whereabouts provider
/// reads) whose `name` a DRA config's `profile` names.
/// Only its text is kept: each call normalizes it again (microseconds), so
/// a call fails as the plugin would on the same config.
struct Profile {
    path: PathBuf,
    text: String,
}

impl Provider {
    /// Reads every profile of `dir` and normalizes each once, so that a profile
    /// that cannot serve stops the server at start, naming its file, instead of
    /// failing pods one by one.
    pub fn load(dir: &Path) -> Result<Self> {
        let mut engine = EngineComponent::load().map_err(EngineFailure)?;
        let mut profiles = BTreeMap::new();
        let entries = std::fs::read_dir(dir).with_context(|| format!("reading the profiles in {}", dir.display()))?;
        let mut paths: Vec<PathBuf> = entries.filter_map(|e| e.ok().map(|e| e.path())).collect();
        paths.sort();
        for path in paths {
            if !matches!(path.extension().and_then(|e| e.to_str()), Some("conf" | "json")) || !path.is_file() {
                continue;
            }
            let text = std::fs::read_to_string(&path).with_context(|| format!("reading profile {}", path.display()))?;
            let (config, _) =
                network_config::load(&mut engine, &text, "").map_err(|e| anyhow::anyhow!("profile {}: {}", path.display(), CniError::from(e).msg))?;
            if let Some(other) = profiles.get(&config.name).map(|p: &Profile| p.path.clone()) {
                bail!("profiles {} and {} are both named {:?}", other.display(), path.display(), config.name);
            }
            logging::verbose(format!("profile-provider: profile {:?} from {}", config.name, path.display()));
            profiles.insert(config.name.clone(), Profile { path, text });
        }
        if profiles.is_empty() {
            bail!("no profile (a .conf or .json network config) in {}", dir.display());
        }
        Ok(Self { profiles, engine: Mutex::new(engine) })
    }

    pub fn profile_names(&self) -> Vec<&str> {
        self.profiles.keys().map(String::as_str).collect()
    }

    /// `/GetProfileConfig`: the device's addresses, allocated on the first
    /// call and the same on every repeat (the claim and the device find them).
    pub fn get(&self, body: &[u8]) -> Result<ProfileAnswer, Refusal> {
        let request = ProfileRequest::parse(body)?;
        let checked = request.checked()?;
        let profile = self.profiles.get(checked.profile).ok_or_else(|| Refusal { status: 404, message: format!("profile {:?} not found", checked.profile) })?;
        request.sets_addresses()?;
        let claim = Claim::ResourceClaim(checked.claim_uid.to_string());
        let ifname = wire::device_ifname(checked.device);
        let who = Attachment { container_id: checked.claim_uid, ifname: &ifname, claim: None };
        let mut engine = self.engine.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        let outcome = (|| {
            let (config, _) = network_config::load(&mut engine, &profile.text, "")?;
            let store = datastore::open(&config.datastore, &config.name)?;
            commands::allocate_for_claim(&mut engine, store.as_ref(), &config, who, &claim)
        })();
        let result = outcome.map_err(|e: CniError| refused("GetProfileConfig", checked.claim_uid, &ifname, e))?;
        logging::verbose(format!(
            "profile-provider: claim {} device {} ({ifname}): {}",
            checked.claim_uid,
            checked.device,
            result.ips.iter().map(|ip| ip.address.as_str()).collect::<Vec<_>>().join(", ")
        ));
        Ok(ProfileAnswer::from(&result))
    }

    /// `/ReleaseProfileConfig`: frees the device's addresses. Nothing to free
    /// (released before, never allocated, a profile not ours) is success.
    pub fn release(&self, body: &[u8]) -> Result<(), Refusal> {
        let request = ProfileRequest::parse(body)?;
        let checked = request.checked()?;
        let Some(profile) = self.profiles.get(checked.profile) else { return Ok(()) };
        let claim = Claim::ResourceClaim(checked.claim_uid.to_string());
        let ifname = wire::device_ifname(checked.device);
        let who = Attachment { container_id: checked.claim_uid, ifname: &ifname, claim: Some(&claim) };
        let mut engine = self.engine.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        let outcome = (|| {
            let (config, _) = network_config::load(&mut engine, &profile.text, "")?;
            let store = datastore::open(&config.datastore, &config.name)?;
            commands::release_attachment(&mut engine, store.as_ref(), &config, who)
        })();
        outcome.map_err(|e: CniError| refused("ReleaseProfileConfig", checked.claim_uid, &ifname, e))
    }
}

fn refused(call: &str, claim_uid: &str, ifname: &str, e: CniError) -> Refusal {
    logging::error(format!("profile-provider: {call} claim {claim_uid} device {ifname}: [code {}] {}", e.code, e.msg));
    let message = if e.details.is_empty() { e.msg.clone() } else { format!("{} ({})", e.msg, e.details) };
    Refusal { status: wire::status_of(&e), message }
}
