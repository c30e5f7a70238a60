//! The gate in front of a new admission: a peer whose credential verified
//! is admitted unless it left meanwhile, or it is a new member while the
//! router drains or holds its high watermark of members.

use libp2p::PeerId;

use super::{Admission, AdmissionTable, Purpose};

/// Why an auth that verified did not end in an admission.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum NotAdmitted {
    /// A new member while the router drains: it must go elsewhere.
    Draining,
    /// A new member while the router holds its high watermark of members.
    Overloaded,
    /// The peer has no live connection any more: it left while its
    /// credential was being verified (a key fetch may take up to the stream
    /// timeout). Recording it would leave a ghost member counted against
    /// the watermark, the lease load and the drain until its credential
    /// expires, since the swarm already forgot the peer.
    Disconnected,
}

/// What the gate looks at besides the table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Conditions {
    /// Whether the peer still has a live connection (the auth task asks
    /// the resource manager before it sends the admission to the table's
    /// owner: the resource manager reads admissions, so the owner never
    /// waits on it).
    pub(crate) connected: bool,
    /// Whether a drain was requested.
    pub(crate) draining: bool,
    /// Members admitted at most (new members beyond get go-away).
    pub(crate) high_watermark: u32,
}

/// Admits `peer` unless it is no longer connected, or it is a new member
/// while the router drains or holds at least the high watermark of
/// members; then returns why not (and records nothing). Re-presentations
/// of an admitted member, transit peers and routers are always admitted
/// while connected. Run by the table's one owner (the swarm loop), one
/// admission at a time, so concurrent logins cannot overshoot. A peer that drops right after is removed by
/// the swarm loop (on its close, or its next sweep).
pub(crate) fn admit_or_refuse(
    table: &mut AdmissionTable,
    peer: PeerId,
    admission: Admission,
    when: Conditions,
) -> Result<(), NotAdmitted> {
    if !when.connected {
        return Err(NotAdmitted::Disconnected);
    }
    let new_member = admission.purpose == Purpose::Attach
        && table
            .get(&peer)
            .is_none_or(|a| a.purpose != Purpose::Attach);
    if new_member {
        if when.draining {
            return Err(NotAdmitted::Draining);
        }
        if table.counts().attached >= when.high_watermark {
            return Err(NotAdmitted::Overloaded);
        }
    }
    table.admit(peer, admission);
    Ok(())
}
