//! A circuit the router refused by its access policy, in words: the
//! router's refusal carries no text (the relay's HOP status is
//! PERMISSION_DENIED, nothing more), but the caller holds the same signed
//! policy and its own credential, so it makes the check the router made
//! for the service it asked for and says what is missing: the policy
//! version, this caller's groups, the service. Such a refusal is final for
//! this caller and service: the call is not retried on other providers or
//! routers (each would refuse it the same way).

use agentmesh_policy::Policy;
use agentmesh_proto::credential::{CredentialError, VerifiedClaims, verify};
use agentmesh_proto::enforce::groups_of;
use agentmesh_proto::unix_now;
use libp2p::PeerId;

use crate::node::Node;

/// Why `router` refused our circuit to `provider` when we called
/// `service`, judged with our own copy of the policy and our credential.
pub(crate) fn explain(node: &Node, service: &str, router: PeerId, provider: PeerId) -> String {
    let skew = node.config.control_plane.credential_skew.as_secs() as i64;
    let mine = verify(
        &node.credential(),
        &node.trust(),
        unix_now(),
        Some(&node.peer_id),
        skew,
    );
    let held = node.policy.held().map(|h| (h.version, h.policy.clone()));
    let why = judge(held.as_ref().map(|(v, p)| (*v, p.as_ref())), mine, service);
    format!("{why} (router {router} refused the circuit to provider {provider}; not retried)")
}

/// The reason, from the policy held (`None`: none yet) and our verified
/// claims (or why they do not verify). Pure.
fn judge(
    held: Option<(u64, &Policy)>,
    mine: Result<VerifiedClaims, CredentialError>,
    service: &str,
) -> String {
    let claims = match mine {
        Ok(c) => c,
        Err(CredentialError::Revoked) => {
            return "this caller's credential is revoked: the access policy grants it nothing"
                .to_string();
        }
        Err(e) => return format!("this caller's credential does not verify: {e}"),
    };
    let Some((version, policy)) = held else {
        return "this node holds no access policy yet, and with none every call is denied"
            .to_string();
    };
    let groups = groups_of(policy, &claims);
    let names = policy.group_names(&groups);
    if names.is_empty() {
        return format!(
            "the access policy (version {version}) puts this caller in no group, so it grants it no service, {service:?} included"
        );
    }
    if !policy.may_call(&groups, service) {
        return format!(
            "the access policy (version {version}) grants none of this caller's groups {names:?} the service {service:?}"
        );
    }
    format!(
        "the router's access policy refused it, although ours (version {version}) grants this caller's groups {names:?} the service {service:?}: the router holds another version, or does not let the provider own {service:?}"
    )
}

#[cfg(test)]
mod tests {
    use agentmesh_proto::pb::credential::{Claims, Label, Role};

    use super::*;

    const POLICY: &str = r#"
format = 1

[groups]
ops = { labels = { team = "ops" } }
payments = { labels = { team = "payments" } }

[[owners]]
services = ["payments/*"]
groups = ["payments"]

[[grants]]
from = ["payments"]
to = ["payments/*"]
"#;

    fn claims(team: &str) -> VerifiedClaims {
        VerifiedClaims {
            peer: PeerId::random(),
            claims: Claims {
                role: Role::Member as i32,
                labels: vec![Label {
                    key: "team".into(),
                    value: team.into(),
                }],
                ..Default::default()
            },
        }
    }

    #[test]
    fn the_reason_names_the_version_the_groups_and_the_service() {
        let policy = Policy::parse(POLICY).expect("policy");
        let held = Some((2, &policy));
        let s = "payments/admin";
        let why = judge(held, Ok(claims("ops")), s);
        assert_eq!(
            why,
            r#"the access policy (version 2) grants none of this caller's groups ["ops"] the service "payments/admin""#
        );
        assert!(
            judge(held, Ok(claims("nobody")), s).contains("in no group"),
            "{}",
            judge(held, Ok(claims("nobody")), s)
        );
        let granted = judge(held, Ok(claims("payments")), s);
        assert!(
            granted.contains("although ours (version 2) grants"),
            "{granted}"
        );
        assert!(judge(held, Err(CredentialError::Revoked), s).contains("revoked"));
        assert!(judge(None, Ok(claims("ops")), s).contains("no access policy"));
        for why in [judge(held, Ok(claims("ops")), s), granted] {
            assert!(!why.contains('\n'), "one line: {why}");
        }
    }
}
