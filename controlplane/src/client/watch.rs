//! `Watch` (a router's push of policy, revocations and keys) and the admin
//! `RevokeToken`. Opening a watch is retried like an idempotent call; the
//! stream itself carries no deadline (the control plane ends it when the
//! router's credential expires, and the HTTP/2 keepalive ends it when
//! either side vanishes), so the caller reads it until it ends and then
//! watches again with its current credential.
//!
//! Where a watch opens: the client's rotation over its endpoints (see
//! `endpoints`). How it ends: the control plane asks its router to watch
//! again at once with a "move" status ([`WatchMove`]: UNAVAILABLE and the
//! [`WATCH_MOVE_METADATA`] metadata) when the replica is stopping (then
//! [`Client::watch_ended`] has every call avoid it for
//! [`super::STOPPING_AVOID`]) or the watch reached the replica's maximum
//! age (the next watch goes to the next replica of the rotation). The
//! watcher reopens after [`move_jitter`], at most [`MOVE_JITTER_MAX`], so a
//! fleet told together does not arrive together; any other end is an
//! error it backs off from.

use std::time::Duration;

use agentmesh_proto::{
    identity::Keypair,
    pb::{
        controlplane::{RevokeTokenRequest, RevokeTokenResponse, WatchEvent, WatchRequest},
        credential::Credential,
    },
    proof::Bound,
    unix_now,
};
use tonic::{Request, Status, Streaming, metadata::MetadataValue};

use super::{Client, ClientError, Idempotency, bearer};

/// The gRPC metadata (in a watch's final status) asking its router to
/// watch again at once: `stopping` or `max_age`.
pub const WATCH_MOVE_METADATA: &str = "watch-move";

/// The longest wait before a moved watch is opened again: a fleet of
/// routers told to move at once (a replica stopping) spreads its reopens
/// over this.
pub const MOVE_JITTER_MAX: Duration = Duration::from_millis(250);

/// The wait before reopening a moved watch: uniform in `[0,
/// MOVE_JITTER_MAX]`.
pub fn move_jitter() -> Duration {
    super::retry::jitter(MOVE_JITTER_MAX)
}

/// Why the control plane ended a watch and asked its router to watch again
/// at once.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WatchMove {
    /// The replica is stopping: watch again on another one.
    Stopping,
    /// The watch reached the replica's `--watch-max-age-secs`: watch again
    /// on the next replica of the rotation, so watches spread.
    MaxAge,
}

impl WatchMove {
    /// The metadata value, also a metric label.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Stopping => "stopping",
            Self::MaxAge => "max_age",
        }
    }

    /// The status a watch ends with to ask for this move.
    pub fn status(self, message: &str) -> Status {
        let mut s = Status::unavailable(message);
        s.metadata_mut().insert(
            WATCH_MOVE_METADATA,
            MetadataValue::from_static(self.as_str()),
        );
        s
    }

    /// The move `status` asks for, if it is one.
    pub fn of(status: &Status) -> Option<Self> {
        if status.code() != tonic::Code::Unavailable {
            return None;
        }
        match status.metadata().get(WATCH_MOVE_METADATA)?.to_str().ok()? {
            "stopping" => Some(Self::Stopping),
            "max_age" => Some(Self::MaxAge),
            _ => None,
        }
    }
}

/// An open watch and where it is.
#[derive(Debug)]
pub struct Watching {
    /// The events: the state in force first, then the state after each change.
    pub stream: Streaming<WatchEvent>,
    /// The endpoint serving it (one of the client's addresses).
    pub endpoint: String,
    /// Attempts the open took (1: the first endpoint tried served it).
    pub attempts: u32,
}

impl Client {
    /// Opens a watch with a router credential and a fresh proof of
    /// possession of `key` (purpose `Watch`, bound to the credential). The first event is the
    /// full state in force; each next one the full state after a change.
    pub async fn watch(
        &self,
        cred: &Credential,
        key: &Keypair,
    ) -> Result<Streaming<WatchEvent>, ClientError> {
        Ok(self.open_watch(cred, key).await?.stream)
    }

    /// [`Client::watch`], saying where it opened: first on the next
    /// endpoint of this client's rotation (past endpoints avoided as
    /// stopping), then as any call fails over.
    pub async fn open_watch(
        &self,
        cred: &Credential,
        key: &Keypair,
    ) -> Result<Watching, ClientError> {
        self.inner.endpoints.refresh(self.now()).await;
        let first = self.inner.endpoints.for_watch(self.now());
        let opened = self
            .retrying_from("Watch", Idempotency::Idempotent, first, |mut c| {
                // No per-call timeout: it would end the stream.
                let req = Request::new(
                    WatchRequest {
                        credential: Some(cred.clone()),
                        proof: None,
                    }
                    .proven(self.public_url(), key, unix_now()),
                );
                async move { c.watch(req).await }
            })
            .await?;
        Ok(Watching {
            stream: opened.answer,
            endpoint: self.inner.endpoints.get(opened.endpoint).address.clone(),
            attempts: opened.attempts,
        })
    }

    /// Takes note that the watch on `endpoint` ended with `status`, and
    /// says whether the control plane asked to watch again at once (after
    /// [`move_jitter`]): a replica that said it is stopping is avoided by
    /// every call and watch of this client for [`super::STOPPING_AVOID`].
    /// `None`: an error to back off from.
    pub fn watch_ended(&self, endpoint: &str, status: &Status) -> Option<WatchMove> {
        let moved = WatchMove::of(status)?;
        if moved == WatchMove::Stopping
            && let Some(i) = self.inner.endpoints.index_of(endpoint)
        {
            let until = self.now() + super::STOPPING_AVOID;
            self.inner.endpoints.avoid(i, until);
        }
        tracing::debug!(
            endpoint,
            reason = moved.as_str(),
            "control plane moved the watch"
        );
        Some(moved)
    }

    /// Admin: revokes the token `token_id` (it enrolls no one again and
    /// every credential it led to is refused); returns until when the
    /// revocation is published.
    pub async fn revoke_token(
        &self,
        admin_token: &str,
        token_id: &str,
        reason: &str,
    ) -> Result<RevokeTokenResponse, ClientError> {
        let bearer = bearer(admin_token)?;
        self.retrying("RevokeToken", Idempotency::Idempotent, |mut c| {
            let r = self.admin_request(
                RevokeTokenRequest {
                    token_id: token_id.to_string(),
                    reason: reason.to_string(),
                },
                &bearer,
            );
            async move { c.revoke_token(r).await }
        })
        .await
    }
}
