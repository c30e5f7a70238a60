//! What the propagation events keep per worker and per member slot: the
//! held calls, the revocable token and each member's trace of policy
//! changes. Plain data, so the slot (`state`) and the events
//! (`propagation`) both hold it without importing each other.

use std::collections::VecDeque;
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex};

use tokio::sync::watch;

/// The worker's held calls and the revocable token.
pub(crate) struct Live {
    pub(super) revocable_token: Option<String>,
    /// Set by the report of the revocation: members started after it
    /// enroll with the fleet's token (the revoked one enrolls no one, so
    /// they would only exit, counted as the run's exits).
    pub(super) token_revoked: AtomicBool,
    pub(super) calls: Mutex<Vec<Arc<HeldCall>>>,
    /// Moved to end every held call.
    pub(super) stop: watch::Sender<u64>,
}

impl Live {
    /// With the revocable token, if the worker was given one.
    pub(crate) fn new(revocable_token: Option<String>) -> Self {
        Self {
            revocable_token,
            token_revoked: AtomicBool::new(false),
            calls: Mutex::new(Vec::new()),
            stop: watch::channel(0).0,
        }
    }
}

/// One held call: how and when it ended, if it did.
#[derive(Default)]
pub(super) struct HeldCall {
    pub(super) ended: Mutex<Option<(u64, String)>>,
}

/// What one member's slot keeps for the propagation events.
#[derive(Debug, Default)]
pub(crate) struct SlotTrace {
    /// Enrolled with the revocable token.
    pub(super) revocable: AtomicBool,
    /// `(unix ms, version held)` at each change of its policy or revocations.
    pub(super) changes: Mutex<VecDeque<(u64, u64)>>,
    /// Since when it holds no router, if it holds none now.
    pub(super) no_router_since: Mutex<Option<u64>>,
}
