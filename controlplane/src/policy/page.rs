//! `GET /policy` (read-only: the version in force, or `?version=N` a kept
//! one, with its epoch, text and summary) and the policy part of `/info`.

use agentmesh_policy::Summary;
use agentmesh_proto::pb::controlplane::GetPolicyRequest;
use serde_json::{Value, json};

use super::epoch_hex;
use crate::{
    signed_policy::PolicyInForce,
    state::State,
    status::{ServiceError, to_status},
};

/// What the state of the policy in force is called on `/info` and `/policy`.
pub fn state_of(p: &PolicyInForce) -> &'static str {
    if p.is_none() {
        "none applied: every call is denied"
    } else if p.is_allow_all() {
        "allow-all: every member may provide and call every service"
    } else {
        "applied"
    }
}

fn summary_json(s: Summary) -> Value {
    json!({
        "groups": s.groups,
        "owners": s.owners,
        "grants": s.grants,
        "tests": s.tests,
    })
}

/// The policy part of `/info`.
pub fn info(state: &State) -> Value {
    let p = state.policy_in_force();
    json!({
        "version": p.version,
        "epoch": epoch_hex(p.epoch),
        "state": state_of(&p),
        "summary": summary_json(p.summary()),
        "applied_at_unix_secs": p.applied_at,
    })
}

/// `GET /policy[?version=N]`: (HTTP status, JSON body).
pub async fn page(state: &State, version: Option<u64>) -> (u16, Value) {
    let req = GetPolicyRequest {
        version: version.unwrap_or(0),
    };
    match state.get_policy_rpc(req).await {
        Ok(r) => {
            let in_force = r.version == r.current_version;
            let held = state.policy_in_force();
            let described = if in_force {
                state_of(&held)
            } else {
                "replaced"
            };
            (
                200,
                json!({
                    "version": r.version,
                    "current_version": r.current_version,
                    "epoch": epoch_hex(r.epoch),
                    "state": described,
                    "applied_at_unix_secs": r.applied_at_unix_secs,
                    "applied_by": r.applied_by,
                    "applied_from": r.applied_from,
                    "replaced_at_unix_secs": r.replaced_at_unix_secs,
                    "summary": r.summary.map(|s| json!({
                        "groups": s.groups,
                        "owners": s.owners,
                        "grants": s.grants,
                        "tests": s.tests,
                    })),
                    "text": r.text,
                }),
            )
        }
        Err(e) => {
            let code = match &e {
                ServiceError::NotFound(_) => 404,
                ServiceError::Invalid(_) => 400,
                _ => 503,
            };
            (code, json!({ "error": to_status(&e).message() }))
        }
    }
}
