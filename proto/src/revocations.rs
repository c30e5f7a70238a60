//! The signed revocation list: signing (control plane), offline
//! verification (routers, members), and which of two lists is current.
//!
//! Routers forward the list to members in pushes and admission answers.
//! A router is not trusted with it: members (and routers, for what the
//! control plane sends them) take a list only when it is signed by a key
//! of the control plane's key set that is still within its grace, and
//! only when it **supersedes** the list held (a higher generation of the
//! same epoch, or another epoch issued later). So a router can delay or
//! withhold a revocation, but never forge one (naming an honest member)
//! nor roll one back (an older list that omits a revocation in force).
//!
//! Like the policy (`crate::policy`), the list is carried as its exact
//! encoded bytes and signed over [`REVOCATIONS_DOMAIN_PREFIX`] followed by
//! them. The generation follows the control plane's database commit order
//! (a counter bumped in the transaction of every revocation write), never
//! a clock: the clocks of several control-plane replicas cannot order
//! anything.

use std::sync::Arc;

use libp2p_identity::ed25519;
use prost::Message;

use crate::credential::Trust;
use crate::order::{holder_lacks, within_epoch};
use crate::pb::credential::{Revocation, RevocationList, SignedRevocations};

/// Domain separation: a list's signature can never pass as a credential's,
/// a policy's or a record's, nor the other way round.
pub const REVOCATIONS_DOMAIN_PREFIX: &[u8] = b"agentmesh revocations v1\0";

/// The largest encoded list accepted, in bytes. An entry is about 70 bytes
/// (a PeerId, an instant, a reason of a few words), so this holds a few
/// thousand revocations by PeerId; a token's revocation is one entry
/// however many members it covers.
pub const MAX_REVOCATIONS_LIST_BYTES: usize = 256 * 1024;

/// Why a signed list does not verify.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RevocationsVerifyError {
    #[error("revocation list is {0} bytes, over the cap")]
    TooLarge(usize),
    #[error("revocation list does not decode")]
    Malformed,
    #[error("revocation list signed by unknown key {0:?}")]
    UnknownKey(String),
    #[error("revocation list signature does not verify")]
    BadSignature,
    /// Signed by a key whose grace ended: the control plane signs the list
    /// again with the new key at each rotation, well before that.
    #[error("revocation list signed by key {key_id:?}, retired at {verify_until} (now {now})")]
    KeyRetired {
        key_id: String,
        verify_until: i64,
        now: i64,
    },
}

impl RevocationsVerifyError {
    /// A short stable label for metrics.
    pub fn reason(&self) -> &'static str {
        match self {
            Self::TooLarge(_) => "too_large",
            Self::Malformed => "malformed",
            Self::UnknownKey(_) => "unknown_key",
            Self::BadSignature => "bad_signature",
            Self::KeyRetired { .. } => "key_retired",
        }
    }
}

/// Encodes `list` and signs it with `key` (the control plane's side); the
/// caller sets `list.key_id` to the key's id.
pub fn sign_revocations(list: &RevocationList, key: &ed25519::Keypair) -> SignedRevocations {
    let bytes = list.encode_to_vec();
    SignedRevocations {
        signature: key.sign(&signed_bytes(&bytes)),
        list: bytes,
    }
}

/// Verifies a signed list against the trusted keys at `now` and returns
/// it. Checks in order: size, decode, key id known, signature, key within
/// its grace (`verify_until` 0 or not passed).
pub fn verify_revocations(
    signed: &SignedRevocations,
    trust: &Trust,
    now: i64,
) -> Result<RevocationList, RevocationsVerifyError> {
    if signed.list.len() > MAX_REVOCATIONS_LIST_BYTES {
        return Err(RevocationsVerifyError::TooLarge(signed.list.len()));
    }
    let list = RevocationList::decode(signed.list.as_slice())
        .map_err(|_| RevocationsVerifyError::Malformed)?;
    let (key, verify_until) = trust
        .public_key(&list.key_id)
        .zip(trust.verify_until(&list.key_id))
        .ok_or_else(|| RevocationsVerifyError::UnknownKey(list.key_id.clone()))?;
    if !key.verify(&signed_bytes(&signed.list), &signed.signature) {
        return Err(RevocationsVerifyError::BadSignature);
    }
    if verify_until != 0 && now > verify_until {
        return Err(RevocationsVerifyError::KeyRetired {
            key_id: list.key_id,
            verify_until,
            now,
        });
    }
    Ok(list)
}

/// The `(epoch, generation)` a signed list names, unverified (`None` when
/// it does not decode): enough to tell whether a holder already has it,
/// never to trust it.
pub fn peek_generation(signed: &SignedRevocations) -> Option<(u64, u64)> {
    peek_list(signed).map(|l| (l.epoch, l.generation))
}

/// The list, unverified (`None` when it does not decode or is over the
/// cap): for the signer reading its own list and for display, never to
/// enforce.
pub fn peek_list(signed: &SignedRevocations) -> Option<RevocationList> {
    if signed.list.len() > MAX_REVOCATIONS_LIST_BYTES {
        return None;
    }
    RevocationList::decode(signed.list.as_slice()).ok()
}

/// What orders two lists: `(epoch, generation, issued_at)`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ListOrder {
    pub epoch: u64,
    pub generation: u64,
    pub issued_at_unix_secs: i64,
}

impl From<&RevocationList> for ListOrder {
    fn from(l: &RevocationList) -> Self {
        Self {
            epoch: l.epoch,
            generation: l.generation,
            issued_at_unix_secs: l.issued_at_unix_secs,
        }
    }
}

/// Whether `incoming` should replace `held`: within an epoch only a
/// higher generation does (the same one is the list held, perhaps signed
/// again); another epoch (a new or restored database) only if issued
/// later, so a replayed list of an old epoch never rolls a holder back.
pub fn supersedes(incoming: ListOrder, held: Option<ListOrder>) -> bool {
    let Some(h) = held else {
        return true;
    };
    match within_epoch(
        (h.epoch, h.generation),
        (incoming.epoch, incoming.generation),
    ) {
        Some(o) => o.is_gt(),
        None => incoming.issued_at_unix_secs > h.issued_at_unix_secs,
    }
}

/// A verified list a router or member holds: the signed copy (to pass on
/// as it came), its order, and its entries.
#[derive(Debug, Clone, PartialEq)]
pub struct HeldRevocations {
    pub signed: SignedRevocations,
    pub order: ListOrder,
    pub key_id: String,
    pub entries: Arc<Vec<Revocation>>,
}

/// Why an offered list was not taken.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RevocationsRejection {
    #[error(transparent)]
    Verify(#[from] RevocationsVerifyError),
    /// Genuine but not newer than the one held (an older generation, or a
    /// replayed epoch): a rollback, or a copy that was merely slow.
    #[error(
        "revocation list epoch {epoch} generation {generation} does not supersede the one held"
    )]
    Stale { epoch: u64, generation: u64 },
}

impl RevocationsRejection {
    /// A short stable label for metrics.
    pub fn reason(&self) -> &'static str {
        match self {
            Self::Verify(e) => e.reason(),
            Self::Stale { .. } => "stale",
        }
    }

    /// Every value of [`reason`](Self::reason), to pre-create metric labels.
    pub const REASONS: [&'static str; 6] = [
        "too_large",
        "malformed",
        "unknown_key",
        "bad_signature",
        "key_retired",
        "stale",
    ];
}

/// How [`HeldRevocations::accept`] treats a list of the generation held.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SameGeneration {
    /// Refused as stale (a member: it changes nothing it enforces).
    Refuse,
    /// Taken when issued later: the control plane signed it again after a
    /// key rotation. A router takes it, so what it forwards keeps
    /// verifying with the current key set.
    TakeResigned,
}

impl HeldRevocations {
    /// Verifies `signed` against `trust` at `now`; `Ok` only if it
    /// supersedes `held` (see [`supersedes`], and `same` for a copy of the
    /// generation held). Nothing changes on `Err`.
    pub fn accept(
        signed: &SignedRevocations,
        trust: &Trust,
        held: Option<&HeldRevocations>,
        now: i64,
        same: SameGeneration,
    ) -> Result<HeldRevocations, RevocationsRejection> {
        let list = verify_revocations(signed, trust, now)?;
        let order = ListOrder::from(&list);
        let held_order = held.map(|h| h.order);
        let resigned = same == SameGeneration::TakeResigned
            && held_order.is_some_and(|h| {
                (h.epoch, h.generation) == (order.epoch, order.generation)
                    && order.issued_at_unix_secs > h.issued_at_unix_secs
            });
        if !resigned && !supersedes(order, held_order) {
            return Err(RevocationsRejection::Stale {
                epoch: order.epoch,
                generation: order.generation,
            });
        }
        Ok(HeldRevocations {
            signed: signed.clone(),
            order,
            key_id: list.key_id,
            entries: Arc::new(list.entries),
        })
    }

    /// `(epoch, generation)`, what an auth request and an ack report.
    pub fn generation(&self) -> (u64, u64) {
        (self.order.epoch, self.order.generation)
    }

    /// Whether a holder reporting `(epoch, generation)` lacks this list:
    /// `(0, 0)` (none held) always does.
    pub fn is_newer_than(&self, epoch: u64, generation: u64) -> bool {
        holder_lacks(self.generation(), (epoch, generation))
    }
}

fn signed_bytes(list: &[u8]) -> Vec<u8> {
    let mut msg = Vec::with_capacity(REVOCATIONS_DOMAIN_PREFIX.len() + list.len());
    msg.extend_from_slice(REVOCATIONS_DOMAIN_PREFIX);
    msg.extend_from_slice(list);
    msg
}

#[cfg(test)]
mod tests;
