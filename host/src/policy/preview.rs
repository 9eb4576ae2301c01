//! `thereabouts preview` with policies: what successive pods would get when a
//! config's policies decide. The engine's own `preview` plans thousands of
//! pods in one call, but a policy answers per attachment (its name, its
//! labels), so here each pod is planned as its ADD would be (select, offer
//! candidates, pick, `plan-all` with the guidance) and its addresses are
//! recorded in the simulated pools before the next pod. Unlike an engine
//! preview, a pod that fails (a veto, a policy error, a range out) does not
//! end the run: a later pod may be one its policies treat otherwise.

use serde::Serialize;
use thereabouts_allocator::model::{NormalizedConfig, PlanOutcome, PoolSnapshot, PoolState, Request, Reservations};

use super::decide::{Guide, GuideError, Guided, Policies, Refused, Subject};
use super::hooks::redacted;
use super::sandbox::PolicyEngine;
use crate::component::{EngineComponent, EngineFailure};

/// Who the previewed pods are: pod `i` (from 0) is `<namespace>/<prefix><i>`,
/// container ID `preview-<i>`, ifname `net1`, every pod with `labels`.
pub struct PodNames<'a> {
    pub namespace: &'a str,
    pub prefix: &'a str,
    pub labels: &'a [(String, String)],
}

/// One previewed pod.
#[derive(Debug, Clone, Serialize)]
pub struct PolicyView {
    /// `namespace/name`.
    pub name: String,
    /// What the policies refused in this pod's ranges, and why.
    pub refused: Vec<Refused>,
    /// Why this pod's ADD would fail (then it gets no address).
    pub failure: Option<String>,
}

/// A pod's addresses (one per range, `ip/prefix` or none) and its view.
pub type PreviewedPod = (Vec<Option<String>>, PolicyView);

/// Plans `count` pods one after the other on `pools` (consumed: they end
/// holding what the served pods took). Only a policy that cannot be loaded
/// or an engine failure stops the preview; anything a pod meets is its row.
pub fn preview(
    engine: &mut EngineComponent,
    config: &NormalizedConfig,
    mut pools: Vec<PoolState>,
    count: u32,
    pods: &PodNames,
) -> anyhow::Result<Vec<PreviewedPod>> {
    let policy_engine = PolicyEngine::new()?;
    let policies = Policies::load(&policy_engine, &config.policies)?;
    let seen = redacted(config);
    for range in &config.ranges {
        if !pools.iter().any(|p| p.name == range.pool_name) {
            pools.push(PoolState { name: range.pool_name.clone(), snapshot: PoolSnapshot::default() });
        }
    }
    let mut rows = Vec::with_capacity(count as usize);
    for i in 0..count {
        let name = format!("{}{i}", pods.prefix);
        let container_id = format!("preview-{i}");
        let cni_args = [("K8S_POD_NAMESPACE".to_string(), pods.namespace.to_string()), ("K8S_POD_NAME".to_string(), name.clone())];
        let subject = Subject {
            pod_namespace: pods.namespace,
            pod_name: &name,
            container_id: &container_id,
            ifname: "net1",
            cni_args: &cni_args,
            labels: pods.labels,
            annotations: &[],
        };
        let mut request = Request {
            container_id: container_id.clone(),
            pod_ref: format!("{}/{name}", pods.namespace),
            ifname: "net1".into(),
            requested_ip: None,
            contention: 0,
            guidance: None,
            preferred: Vec::new(),
            claim: None,
        };
        let guided = policies.select(&subject, &seen).map_err(GuideError::from).and_then(|selection| {
            let guide = Guide { policies: &policies, subject: subject.clone(), seen: seen.clone(), selection };
            // From the pools: they are the whole simulated cluster, so an
            // address one range handed out is reserved in every overlapping one.
            guide.plan(engine, config, &pools, Reservations::FromPools, &mut request)
        });
        let mut addresses = vec![None; config.ranges.len()];
        let mut view = PolicyView { name: request.pod_ref.clone(), refused: Vec::new(), failure: None };
        match guided {
            Err(GuideError::Engine(EngineFailure(e))) => return Err(e),
            Err(GuideError::Stop(stop)) => view.failure = Some(stop.to_string()),
            Ok(Guided { planned, refused }) => {
                view.refused = refused;
                match planned {
                    Err(failure) => view.failure = Some(failure.message().to_string()),
                    Ok(outcomes) => {
                        for outcome in &outcomes {
                            record(config, &mut pools, outcome, &mut addresses);
                        }
                    }
                }
            }
        }
        rows.push((addresses, view));
    }
    Ok(rows)
}

/// Puts a served range's address in the pod's row and, when fresh, in its pool.
fn record(config: &NormalizedConfig, pools: &mut [PoolState], outcome: &PlanOutcome, addresses: &mut [Option<String>]) {
    let assignment = outcome.assignment();
    let index = assignment.range_index as usize;
    let (Some(range), Some(slot)) = (config.ranges.get(index), addresses.get_mut(index)) else { return };
    *slot = Some(assignment.address.clone());
    if let PlanOutcome::Fresh { .. } = outcome
        && let Some(pool) = pools.iter_mut().find(|p| p.name == range.pool_name)
    {
        match u64::try_from(assignment.offset) {
            Ok(narrow) => pool.snapshot.taken.push(narrow),
            Err(_) => pool.snapshot.taken_wide.push(assignment.offset),
        }
    }
}
