//! The three hooks, called with the engine's model types and answering the
//! host's own; every answer is checked for size here (the guest's memory
//! limit bounds what it can return, this bounds what the host keeps).

use thereabouts_allocator::model::NormalizedConfig;

use super::bindings::exports::thereabouts::ipam::policy as wit;
use super::failure::CallFailure;
use super::sandbox::LoadedPolicy;

/// Most addresses a `prefer` may list.
pub const MAX_PREFERRED: usize = 256;
/// Most refusals one answer may carry.
pub const MAX_REFUSED: usize = 1024;
/// Longest reason, veto or error text kept (bytes).
pub const MAX_TEXT: usize = 1024;
/// Longest address text (an IPv6 address is at most 45).
const MAX_ADDRESS: usize = 64;

/// What a policy declared it needs (`validate-settings`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Needs {
    pub labels: bool,
    pub annotations: bool,
}

/// Who the attachment is, and the pod's metadata when a policy needs it.
#[derive(Debug, Clone)]
pub struct Subject<'a> {
    pub pod_namespace: &'a str,
    pub pod_name: &'a str,
    pub container_id: &'a str,
    pub ifname: &'a str,
    pub cni_args: &'a [(String, String)],
    pub labels: &'a [(String, String)],
    pub annotations: &'a [(String, String)],
}

/// Everything one policy learns about one attachment.
#[derive(Debug, Clone)]
pub struct Input<'a> {
    pub subject: &'a Subject<'a>,
    /// Already stripped of credentials and policies (see `redacted`).
    pub config: &'a NormalizedConfig,
    /// What of the pod's metadata this policy declared it needs.
    pub needs: Needs,
    pub settings: &'a str,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Choice {
    BuiltIn,
    Prefer(Vec<String>),
    Veto(String),
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pick {
    pub choice: Choice,
    /// (address, reason).
    pub refused: Vec<(String, String)>,
}

/// The config as a policy sees it: no datastore credentials, no other
/// policy's settings.
pub fn redacted(config: &NormalizedConfig) -> NormalizedConfig {
    let mut c = config.clone();
    c.datastore.etcd_username = None;
    c.datastore.etcd_password = None;
    c.datastore.etcd_key_file = None;
    c.datastore.etcd_cert_file = None;
    c.datastore.etcd_ca_cert_file = None;
    c.datastore.kubeconfig = None;
    c.policies.clear();
    c
}

pub fn validate_settings(policy: &LoadedPolicy, settings: &str) -> Result<Needs, CallFailure> {
    let answer = policy.call(|store, p| p.thereabouts_ipam_policy().call_validate_settings(store, settings))?;
    match answer {
        Ok(needs) => Ok(Needs { labels: needs.contains(wit::Needs::POD_LABELS), annotations: needs.contains(wit::Needs::POD_ANNOTATIONS) }),
        Err(why) => Err(CallFailure::BadSettings(bounded(why)?)),
    }
}

/// `Ok(Err(reason))`: the policy vetoed the attachment.
pub fn select_ranges(policy: &LoadedPolicy, input: &Input) -> Result<Result<Vec<u32>, String>, CallFailure> {
    let wit_input = to_wit(input);
    let answer = policy.call_for(&attachment(input.subject), |store, p| p.thereabouts_ipam_policy().call_select_ranges(store, &wit_input))?;
    match answer {
        Ok(ranges) => {
            let count = input.config.ranges.len();
            let mut seen = vec![false; count];
            for &r in &ranges {
                let slot =
                    seen.get_mut(r as usize).ok_or_else(|| CallFailure::BadAnswer(format!("range index {r} is out of bounds (the config has {count})")))?;
                if std::mem::replace(slot, true) {
                    return Err(CallFailure::BadAnswer(format!("range index {r} is listed twice")));
                }
            }
            if ranges.is_empty() {
                return Err(CallFailure::BadAnswer("no range selected (answer an error to refuse the attachment)".into()));
            }
            Ok(Ok(ranges))
        }
        Err(reason) => Ok(Err(bounded(reason)?)),
    }
}

pub fn pick_address(policy: &LoadedPolicy, input: &Input, range_index: u32, candidates: &[String]) -> Result<Pick, CallFailure> {
    let wit_input = to_wit(input);
    let answer =
        policy.call_for(&attachment(input.subject), |store, p| p.thereabouts_ipam_policy().call_pick_address(store, &wit_input, range_index, candidates))?;
    if answer.refused.len() > MAX_REFUSED {
        return Err(CallFailure::BadAnswer(format!("{} refusals, more than {MAX_REFUSED}", answer.refused.len())));
    }
    let refused = answer.refused.into_iter().map(|r| Ok((address(r.address)?, bounded(r.reason)?))).collect::<Result<Vec<_>, CallFailure>>()?;
    let choice = match answer.choice {
        wit::Choice::BuiltIn => Choice::BuiltIn,
        wit::Choice::Prefer(list) if list.len() > MAX_PREFERRED => {
            return Err(CallFailure::BadAnswer(format!("{} preferred addresses, more than {MAX_PREFERRED}", list.len())));
        }
        wit::Choice::Prefer(list) if list.is_empty() => return Err(CallFailure::BadAnswer("an empty preference (answer built-in instead)".into())),
        wit::Choice::Prefer(list) => Choice::Prefer(list.into_iter().map(address).collect::<Result<_, _>>()?),
        wit::Choice::Veto(reason) => Choice::Veto(bounded(reason)?),
    };
    Ok(Pick { choice, refused })
}

/// What names an attachment: its hooks share one instance of a policy,
/// and no other attachment's calls see that instance (`LoadedPolicy::call_for`).
fn attachment(s: &Subject) -> String {
    [s.pod_namespace, s.pod_name, s.container_id, s.ifname].join("\0")
}

fn bounded(text: String) -> Result<String, CallFailure> {
    if text.len() > MAX_TEXT {
        return Err(CallFailure::BadAnswer(format!("a text of {} bytes, more than {MAX_TEXT}", text.len())));
    }
    Ok(text)
}

fn address(text: String) -> Result<String, CallFailure> {
    if text.len() > MAX_ADDRESS {
        return Err(CallFailure::BadAnswer(format!("an address of {} bytes", text.len())));
    }
    Ok(text)
}

fn to_wit(input: &Input) -> wit::AttachmentInput {
    let (s, needs) = (input.subject, input.needs);
    let pod = (needs.labels || needs.annotations).then(|| wit::PodMetadata {
        labels: if needs.labels { s.labels.to_vec() } else { Vec::new() },
        annotations: if needs.annotations { s.annotations.to_vec() } else { Vec::new() },
    });
    wit::AttachmentInput {
        pod_namespace: s.pod_namespace.to_string(),
        pod_name: s.pod_name.to_string(),
        container_id: s.container_id.to_string(),
        ifname: s.ifname.to_string(),
        cni_args: s.cni_args.to_vec(),
        config: wit_convert::config_to_wit(input.config),
        pod,
        settings: input.settings.to_string(),
    }
}

thereabouts_allocator::wit_conversions!(crate::policy::bindings::exports::thereabouts::ipam::types);
