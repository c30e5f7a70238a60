//! The engine's part of the rules a direct connection keeps
//! (`docs/direct.md`): it verifies the credential each peer sends in the
//! hello on a direct connection (`crate::direct::hello`) exactly as a
//! caller's is verified (`call/inbound.rs`: our trust and keys, expiry,
//! revocations, role member, subject = the PeerId the connection proved),
//! re-fetching the keys once for an unknown key id; it hands the claims to
//! the direct behaviour, which keeps them per connection; and on every
//! new policy or revocation list it judges each authenticated direct
//! connection again ([`judge`]) and closes those no longer allowed.
//!
//! A direct connection may stay while its peer is not revoked (node or
//! token) and the policy grants one of us a service the other may
//! provide, in either direction: `Policy::may_reach`, the question a
//! router asks before it relays a circuit between two members.

use agentmesh_policy::Policy;
use agentmesh_proto::credential::{CredentialError, Trust, VerifiedClaims, peek_claims, verify};
use agentmesh_proto::enforce::groups_of;
use agentmesh_proto::pb::credential::{Credential, Role};
use agentmesh_proto::unix_now;
use libp2p::PeerId;
use libp2p::swarm::ConnectionId;

use super::{Engine, Op};
use crate::direct::hello::Heard;

/// Why a direct connection to `theirs` may not stay (a
/// `direct_closed_total` reason), under `policy` and `trust` at `now`;
/// `ours` are our own claims (none: the reach check is skipped, as we
/// cannot tell our groups).
pub(crate) fn judge(
    trust: &Trust,
    policy: &Policy,
    ours: Option<&VerifiedClaims>,
    theirs: &VerifiedClaims,
    now: i64,
) -> Result<(), &'static str> {
    if trust.is_claims_revoked(theirs, now) {
        return Err("revoked");
    }
    let Some(ours) = ours else {
        return Ok(());
    };
    let (a, b) = (groups_of(policy, ours), groups_of(policy, theirs));
    if policy.may_reach(&a, &b) || policy.may_reach(&b, &a) {
        Ok(())
    } else {
        Err("policy")
    }
}

/// Why a hello's credential was not taken.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum HelloRefused {
    /// Signed by a key we do not know (yet): fetch the keys and try again.
    UnknownKey,
    /// Refused: the `direct_closed_total` reason and what was wrong.
    Closed(&'static str, String),
}

/// Verifies the credential `peer` sent in its hello, exactly as a caller's
/// is verified (`call/inbound.rs`): signed by a key of `trust`, not
/// expired (give or take `skew_secs`), its subject the PeerId the
/// connection proved, neither its node nor its token revoked, role member.
pub(crate) fn verify_hello(
    cred: &Credential,
    trust: &Trust,
    peer: &PeerId,
    now: i64,
    skew_secs: i64,
) -> Result<VerifiedClaims, HelloRefused> {
    match verify(cred, trust, now, Some(peer), skew_secs) {
        Ok(v) if v.role() == Role::Member => Ok(v),
        Ok(_) => Err(HelloRefused::Closed(
            "unauthenticated",
            "credential role is not member".into(),
        )),
        Err(CredentialError::UnknownKey(_)) => Err(HelloRefused::UnknownKey),
        Err(CredentialError::Revoked) => {
            Err(HelloRefused::Closed("revoked", "peer is revoked".into()))
        }
        Err(e) => Err(HelloRefused::Closed("unauthenticated", e.to_string())),
    }
}

impl Engine {
    /// Our own claims, read from our credential (ours: not verified).
    fn own_claims(&self) -> Option<VerifiedClaims> {
        let claims = peek_claims(&self.node.credential()).ok()?;
        Some(VerifiedClaims {
            peer: *self.swarm.local_peer_id(),
            claims,
        })
    }

    /// The peer's hello on direct connection `conn`: verified, then the
    /// connection is authenticated or closed. `refetched`: the keys were
    /// fetched again for it already.
    pub(super) fn on_direct_hello(
        &mut self,
        peer: PeerId,
        conn: ConnectionId,
        heard: Heard,
        refetched: bool,
    ) {
        let cred = match heard {
            Heard::Credential(c) => c,
            Heard::Unreadable(why) => {
                tracing::debug!(%peer, %why, "direct hello unreadable: closing the connection");
                self.swarm
                    .behaviour_mut()
                    .direct
                    .close_direct(conn, "unauthenticated");
                return;
            }
        };
        let skew = self.node.config.control_plane.credential_skew.as_secs() as i64;
        let now = unix_now();
        let trust = self.node.trust();
        let claims = match verify_hello(&cred, &trust, &peer, now, skew) {
            Ok(v) => v,
            Err(HelloRefused::UnknownKey) if !refetched => {
                self.refetch_then_verify(peer, conn, cred);
                return;
            }
            Err(HelloRefused::UnknownKey) => {
                tracing::debug!(%peer, "direct hello: credential signed by an unknown key: closing");
                self.close_direct(conn, "unauthenticated");
                return;
            }
            Err(HelloRefused::Closed(reason, why)) => {
                tracing::debug!(%peer, reason, %why, "direct hello: credential refused: closing");
                self.close_direct(conn, reason);
                return;
            }
        };
        let policy = self.node.policy.policy();
        if let Err(reason) = judge(&trust, &policy, self.own_claims().as_ref(), &claims, now) {
            tracing::debug!(%peer, reason, "direct hello: the peer may not stay: closing");
            self.close_direct(conn, reason);
            return;
        }
        if self
            .swarm
            .behaviour_mut()
            .direct
            .authenticated(conn, claims)
        {
            tracing::debug!(%peer, "direct connection authenticated");
            self.notice_upgraded(peer);
        }
    }

    /// Fetches the key set again (a key we do not know yet signed the
    /// peer's credential), then verifies the hello once more.
    fn refetch_then_verify(&mut self, peer: PeerId, conn: ConnectionId, cred: Box<Credential>) {
        let node = self.node.clone();
        self.ops.push(Box::pin(async move {
            node.refetch_keys().await;
            Op::DirectHello {
                peer,
                conn,
                heard: Heard::Credential(cred),
            }
        }));
    }

    fn close_direct(&mut self, conn: ConnectionId, reason: &'static str) {
        self.swarm.behaviour_mut().direct.close_direct(conn, reason);
    }

    /// A new policy or revocation list is in force: every authenticated
    /// direct connection it no longer allows is closed.
    pub(super) fn recheck_direct(&mut self) {
        let trust = self.node.trust();
        let policy = self.node.policy.policy();
        let ours = self.own_claims();
        let now = unix_now();
        let refused: Vec<(ConnectionId, PeerId, &'static str)> = self
            .swarm
            .behaviour()
            .direct
            .verified()
            .filter_map(|(id, claims)| {
                judge(&trust, &policy, ours.as_ref(), claims, now)
                    .err()
                    .map(|r| (id, claims.peer, r))
            })
            .collect();
        for (id, peer, reason) in refused {
            tracing::info!(%peer, reason, "closing a direct connection the policy or revocations no longer allow");
            self.close_direct(id, reason);
        }
    }
}

#[cfg(test)]
mod tests;
#[cfg(test)]
mod tests_attack;
