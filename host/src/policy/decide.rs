//! The config's policies for one ADD, applied in order: loaded once
//! (artifact checked, settings validated), then asked which ranges the
//! attachment gets and, per range, which address; their answers merged into
//! the engine's `guidance`. `on_error` and `mode` are applied here and
//! nowhere else: a failure of an `ignore` policy, and every answer and every
//! failure of a `monitor` one, is logged and leaves the built-in choice.

use std::collections::BTreeSet;

use thereabouts_allocator::model::{
    Guidance, NormalizedConfig, PlanFailure, PlanOutcome, PolicyConfig, PolicyMode, PolicyOnError, PoolState, RangeCandidates, RangePick, Request, Reservations,
};

use super::artifact;
use super::failure::{CallFailure, Hook, PolicyError, PolicyStop};
pub use super::hooks::Subject;
use super::hooks::{self, Choice, Input, Needs};
use super::records;
use super::sandbox::{LoadedPolicy, PolicyEngine};
use crate::logging;

/// How many free addresses a policy is offered per range.
pub const CANDIDATES: u32 = 32;

struct Active<'e> {
    config: &'e PolicyConfig,
    policy: LoadedPolicy<'e>,
    needs: Needs,
}

/// The policies that loaded (an `ignore` one that did not is left out).
pub struct Policies<'e> {
    active: Vec<Active<'e>>,
}

/// A range's merged pick, the policy whose `prefer` it carries (the
/// engine's complaint about that preference is that policy's bad answer),
/// and every refusal with its policy and reason (shown by `preview`).
pub struct Merged {
    pub pick: RangePick,
    pub prefer_of: Option<usize>,
    pub refused: Vec<Refused>,
}

/// An address a policy turned down in a range, and why.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Refused {
    pub range: u32,
    pub address: String,
    pub policy: String,
    pub reason: String,
}

impl<'e> Policies<'e> {
    /// Loads the policies for an ADD (or a preview): settings accepted
    /// before for the same artifact are not asked again (see `validated`).
    pub fn load(engine: &'e PolicyEngine, configs: &'e [PolicyConfig]) -> Result<Self, PolicyStop> {
        Self::load_with(engine, configs, true)
    }

    /// Loads the policies and asks each `validate-settings`, whatever it
    /// answered before (`thereabouts policy check`).
    pub fn load_asking(engine: &'e PolicyEngine, configs: &'e [PolicyConfig]) -> Result<Self, PolicyStop> {
        Self::load_with(engine, configs, false)
    }

    fn load_with(engine: &'e PolicyEngine, configs: &'e [PolicyConfig], remembered: bool) -> Result<Self, PolicyStop> {
        let cache = artifact::cache_dir();
        let mut active = Vec::with_capacity(configs.len());
        for config in configs {
            let started = std::time::Instant::now();
            let found = artifact::trusted_artifact(config.path.as_ref(), &cache);
            let checked = std::time::Instant::now();
            let loaded = found.and_then(|a| engine.load(&a, config.timeout_ms, config.memory_mib).map(|p| (p, a)));
            let ready = std::time::Instant::now();
            let (policy, artifact) = match (loaded, tolerated(config)) {
                (Ok(loaded), _) => loaded,
                (Err(e), Some(why)) => {
                    logging::error(format!("policy {:?} not loaded, ignored ({why}): {e}", config.name));
                    continue;
                }
                (Err(source), None) => return Err(PolicyStop::Load { policy: config.name.clone(), source }),
            };
            let ask = || hooks::validate_settings(&policy, &config.settings);
            let validated = if remembered { validated(&cache, &artifact, config, ask) } else { ask() };
            let micros = |from: std::time::Instant, to: std::time::Instant| to.duration_since(from).as_micros();
            logging::debug(format!(
                "policy {:?}: artifact found and checked in {} µs, loaded in {} µs, settings checked in {} µs",
                config.name,
                micros(started, checked),
                micros(checked, ready),
                micros(ready, std::time::Instant::now())
            ));
            match validated {
                Ok(needs) => active.push(Active { config, policy, needs }),
                Err(failure) => fail(config, Hook::ValidateSettings, failure)?,
            }
        }
        Ok(Policies { active })
    }

    /// What the policies need to see of the pod, together.
    pub fn needs(&self) -> Needs {
        self.active.iter().fold(Needs::default(), |a, p| Needs { labels: a.labels || p.needs.labels, annotations: a.annotations || p.needs.annotations })
    }

    /// The pod's labels and annotations could not be read (`unreadable`):
    /// the policies that need them and may fail ([`tolerated`]) are left out,
    /// logged; one that needs them and may not fail stops the ADD.
    pub fn without_pod(&mut self, unreadable: PolicyStop) -> Result<(), PolicyStop> {
        let needs_pod = |p: &Active| p.needs.labels || p.needs.annotations;
        if self.active.iter().any(|p| needs_pod(p) && tolerated(p.config).is_none()) {
            return Err(unreadable);
        }
        for p in self.active.iter().filter(|p| needs_pod(p)) {
            let why = tolerated(p.config).unwrap_or_default();
            logging::error(format!("policy {:?} not run, ignored ({why}): {unreadable}", p.config.name));
        }
        self.active.retain(|p| !needs_pod(p));
        Ok(())
    }

    pub fn is_empty(&self) -> bool {
        self.active.is_empty()
    }

    fn input<'a>(&self, p: &'a Active, subject: &'a Subject, config: &'a NormalizedConfig) -> Input<'a> {
        Input { subject, config, needs: p.needs, settings: &p.config.settings }
    }

    /// The ranges to serve: the first enforcing policy's list, narrowed by
    /// each later one (keeping the earlier order); `None` when no policy chose.
    /// `config` is the redacted config ([`hooks::redacted`]).
    pub fn select(&self, subject: &Subject, config: &NormalizedConfig) -> Result<Option<Vec<u32>>, PolicyStop> {
        let mut selection: Option<Vec<u32>> = None;
        for p in &self.active {
            let answer = match hooks::select_ranges(&p.policy, &self.input(p, subject, config)) {
                Ok(a) => a,
                Err(failure) => {
                    fail(p.config, Hook::SelectRanges, failure)?;
                    continue;
                }
            };
            if p.config.mode == PolicyMode::Monitor {
                logging::verbose(format!("policy {:?} (monitor) select-ranges: {answer:?}", p.config.name));
                continue;
            }
            match answer {
                Err(reason) => return Err(PolicyStop::Vetoed { policy: p.config.name.clone(), reason }),
                Ok(list) => {
                    selection = Some(match selection {
                        None => list,
                        Some(earlier) => {
                            let keep: BTreeSet<u32> = list.into_iter().collect();
                            earlier.into_iter().filter(|r| keep.contains(r)).collect()
                        }
                    });
                    if selection.as_ref().is_some_and(Vec::is_empty) {
                        return Err(PolicyStop::Vetoed { policy: p.config.name.clone(), reason: "no range is left that every policy selected".into() });
                    }
                }
            }
        }
        Ok(selection)
    }

    /// Each policy's pick in every offered range (a range the pod holds an
    /// address in is kept, nobody picks), merged per range: a veto wins,
    /// refusals add up, the first preference counts, narrowed by later ones
    /// and by every refusal. Later policies are offered what earlier ones did
    /// not refuse. `skip` holds (policy, range) picks to leave out (an
    /// `ignore` policy whose preference the engine found bad).
    pub fn picks(
        &self,
        subject: &Subject,
        config: &NormalizedConfig,
        offered: &[RangeCandidates],
        skip: &BTreeSet<(usize, u32)>,
    ) -> Result<Vec<Merged>, PolicyStop> {
        let mut merged = Vec::new();
        for range in offered.iter().filter(|r| r.held.is_none()) {
            let mut m = Merged { pick: RangePick { range_index: range.range_index, ..RangePick::default() }, prefer_of: None, refused: Vec::new() };
            let mut free = range.free.clone();
            for (i, p) in self.active.iter().enumerate() {
                if skip.contains(&(i, range.range_index)) {
                    continue;
                }
                let pick = match hooks::pick_address(&p.policy, &self.input(p, subject, config), range.range_index, &free) {
                    Ok(pick) => pick,
                    Err(failure) => {
                        fail(p.config, Hook::PickAddress, failure)?;
                        continue;
                    }
                };
                if p.config.mode == PolicyMode::Monitor {
                    logging::verbose(format!("policy {:?} (monitor) pick-address in range {}: {pick:?}", p.config.name, range.range_index));
                    continue;
                }
                for (address, reason) in &pick.refused {
                    logging::debug(format!("policy {:?} refused {address} in range {}: {reason}", p.config.name, range.range_index));
                }
                let refused: BTreeSet<&str> = pick.refused.iter().map(|(a, _)| a.as_str()).collect();
                free.retain(|a| !refused.contains(a.as_str()));
                m.pick.prefer.retain(|a| !refused.contains(a.as_str()));
                m.pick.refuse.extend(pick.refused.iter().map(|(a, _)| a.clone()));
                m.refused.extend(pick.refused.into_iter().map(|(address, reason)| Refused {
                    range: range.range_index,
                    address,
                    policy: p.config.name.clone(),
                    reason,
                }));
                match pick.choice {
                    Choice::BuiltIn => {}
                    Choice::Veto(reason) => {
                        if m.pick.veto.is_none() {
                            logging::verbose(format!("policy {:?} vetoed range {}: {reason}", p.config.name, range.range_index));
                            m.pick.veto = Some(format!("policy {:?}: {reason}", p.config.name));
                        }
                    }
                    Choice::Prefer(list) if m.prefer_of.is_none() => {
                        m.pick.prefer = list.into_iter().filter(|a| !m.pick.refuse.contains(a)).collect();
                        m.prefer_of = Some(i);
                        if m.pick.prefer.is_empty() {
                            m.pick.veto.get_or_insert_with(|| format!("policy {:?}: every address it preferred was refused", p.config.name));
                        }
                    }
                    Choice::Prefer(list) => {
                        let later: BTreeSet<String> = list.into_iter().collect();
                        m.pick.prefer.retain(|a| later.contains(a));
                        if m.pick.prefer.is_empty() {
                            m.pick.veto.get_or_insert_with(|| {
                                format!("policy {:?}: none of the addresses it preferred is one an earlier policy preferred", p.config.name)
                            });
                        }
                    }
                }
            }
            merged.push(m);
        }
        Ok(merged)
    }

    /// The policy at `index`, for naming it.
    pub fn config_of(&self, index: usize) -> &PolicyConfig {
        self.active[index].config
    }
}

/// Where accepted settings are remembered, by what decides the answer.
const SETTINGS: &str = "settings";

/// `validate-settings` of a policy, or what it answered before for the same
/// artifact, settings and limits (see `records`). Only an acceptance is
/// remembered: a rejection fails the ADD, and is asked again the next time.
/// The record holds its whole input, compared exactly, so its name need
/// only spread records out (SipHash; no digest to compute on an ADD).
fn validated(
    cache: &std::path::Path,
    artifact: &std::path::Path,
    config: &PolicyConfig,
    ask: impl FnOnce() -> Result<Needs, CallFailure>,
) -> Result<Needs, CallFailure> {
    use std::hash::{Hash, Hasher};
    let artifact_name = artifact.file_name().map(|n| n.to_string_lossy()).unwrap_or_default();
    let input = format!("{artifact_name}\n{}\n{}\n{}", config.timeout_ms, config.memory_mib, config.settings);
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    input.hash(&mut hasher);
    let record = cache.join(SETTINGS).join(format!("{:016x}", hasher.finish()));
    let text_of = |n: Needs| format!("accepted; labels={} annotations={}\n{input}", n.labels, n.annotations);
    if let Some(text) = records::read(&record) {
        for needs in [(false, false), (true, false), (false, true), (true, true)].map(|(labels, annotations)| Needs { labels, annotations }) {
            if text == text_of(needs) {
                return Ok(needs);
            }
        }
    }
    let needs = ask()?;
    records::write(&record, &text_of(needs));
    Ok(needs)
}

/// The guidance the engine applies.
pub fn guidance(selection: Option<Vec<u32>>, merged: &[Merged]) -> Guidance {
    Guidance { ranges: selection, picks: merged.iter().map(|m| m.pick.clone()).collect() }
}

/// Why a failure of this policy does not stop the ADD, if it does not: a
/// policy on trial (`mode: monitor`) can never stop a pod, whatever its
/// `on_error`; an enforcing one only with `on_error: ignore`.
fn tolerated(config: &PolicyConfig) -> Option<&'static str> {
    match (config.mode, config.on_error) {
        (PolicyMode::Monitor, _) => Some("mode: monitor"),
        (PolicyMode::Enforce, PolicyOnError::Ignore) => Some("on_error: ignore"),
        (PolicyMode::Enforce, PolicyOnError::Deny) => None,
    }
}

/// One failed call: logged with its cause when [`tolerated`], else it stops the ADD.
fn fail(config: &PolicyConfig, hook: Hook, failure: CallFailure) -> Result<(), PolicyStop> {
    let error = PolicyError { policy: config.name.clone(), hook, failure };
    if let Some(why) = tolerated(config) {
        logging::error(format!("{error}; ignored ({why}), the built-in choice stands"));
        return Ok(());
    }
    Err(PolicyStop::Failed(error))
}

/// The policies of one ADD with what they see: the attachment, the redacted
/// config, and the ranges they selected (asked once, before any pool is read).
pub struct Guide<'a, 'e> {
    pub policies: &'a Policies<'e>,
    pub subject: Subject<'a>,
    pub seen: NormalizedConfig,
    pub selection: Option<Vec<u32>>,
}

/// Why a guided plan did not come to a plan or an engine failure.
#[derive(Debug, thiserror::Error)]
pub enum GuideError {
    #[error(transparent)]
    Stop(#[from] PolicyStop),
    #[error(transparent)]
    Engine(#[from] crate::component::EngineFailure),
}

/// A guided plan: the engine's answer, and what the policies refused on the way.
pub struct Guided {
    pub planned: Result<Vec<PlanOutcome>, PlanFailure>,
    pub refused: Vec<Refused>,
}

impl Guide<'_, '_> {
    /// Offers each selected range's candidates to the policies, then plans
    /// with their merged picks. A pick the engine finds bad is its policy's
    /// bad answer: `deny` stops the ADD, `ignore` plans again without it.
    ///
    /// The pools cross into the engine twice (for `candidates`, then for
    /// `plan-all`) on purpose: the policies answer in between, and the
    /// engine, a pure function, keeps nothing from one call to the next.
    pub fn plan(
        &self,
        engine: &mut crate::component::EngineComponent,
        config: &NormalizedConfig,
        states: &[PoolState],
        reservations: Reservations,
        request: &mut Request,
    ) -> Result<Guided, GuideError> {
        use crate::component::EngineFailure;
        let ranges: Vec<u32> = self.selection.clone().unwrap_or_else(|| (0..config.ranges.len() as u32).collect());
        request.guidance = None;
        let offered = engine
            .candidates(config, states, reservations, request, &ranges, CANDIDATES)
            .map_err(EngineFailure)?
            .map_err(|e| EngineFailure(anyhow::anyhow!("candidates: {e}")))?;
        let mut skip = BTreeSet::new();
        loop {
            let merged = self.policies.picks(&self.subject, &self.seen, &offered, &skip)?;
            request.guidance = Some(guidance(self.selection.clone(), &merged));
            let planned = engine.plan_all(config, states, reservations, request).map_err(EngineFailure)?;
            let refused = || merged.iter().flat_map(|m| m.refused.iter().cloned()).collect();
            let Err(PlanFailure::BadPick { range_index, message }) = &planned else { return Ok(Guided { refused: refused(), planned }) };
            let Some(policy) = merged.iter().find(|m| m.pick.range_index == *range_index).and_then(|m| m.prefer_of) else {
                return Ok(Guided { refused: refused(), planned });
            };
            fail(self.policies.config_of(policy), Hook::PickAddress, CallFailure::BadAnswer(message.clone()))?;
            skip.insert((policy, *range_index));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(settings: &str) -> PolicyConfig {
        PolicyConfig {
            name: "p".into(),
            path: "p.wasm".into(),
            settings: settings.into(),
            timeout_ms: 10,
            memory_mib: 4,
            on_error: PolicyOnError::Deny,
            mode: PolicyMode::Enforce,
        }
    }

    #[test]
    fn accepted_settings_are_asked_once_and_rejected_ones_every_time() {
        let cache = std::env::temp_dir().join(format!("thab-validated-{}", std::process::id()));
        std::fs::create_dir_all(&cache).unwrap();
        let artifact = cache.join("abc-123.cwasm");
        let needs = Needs { labels: true, annotations: false };
        let mut asked = 0;
        for _ in 0..3 {
            let answer = validated(&cache, &artifact, &config("{}"), || {
                asked += 1;
                Ok(needs)
            });
            assert_eq!(answer, Ok(needs));
        }
        assert_eq!(asked, 1, "the answer was remembered");
        let mut rejected = 0;
        for _ in 0..2 {
            let answer = validated(&cache, &artifact, &config("{\"x\":1}"), || {
                rejected += 1;
                Err(CallFailure::BadSettings("no".into()))
            });
            assert!(answer.is_err());
        }
        assert_eq!(rejected, 2, "other settings are asked, and a rejection is not remembered");
        std::fs::remove_dir_all(&cache).unwrap();
    }
}
