//! Label values of the crate's counters, every value pre-created.

use prometheus_client::encoding::{EncodeLabelSet, EncodeLabelValue, LabelValueEncoder};

/// Why an inbound stream was dropped after negotiation (metric label).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DropReason {
    /// The protocol's inbound queue was full and this stream's peer held
    /// the most of it: its accept loop is behind.
    QueueFull,
    /// Dropped from a full queue to make room for a stream of a peer that
    /// held fewer (the oldest stream of the peer holding the most).
    Preempted,
    /// Nobody accepts the protocol any more (its `IncomingStreams` was
    /// dropped after the stream was negotiated).
    NotAccepted,
}

impl DropReason {
    /// Every reason, to pre-create label values.
    pub(crate) const ALL: [DropReason; 3] = [
        DropReason::QueueFull,
        DropReason::Preempted,
        DropReason::NotAccepted,
    ];

    /// The label value.
    pub fn as_str(self) -> &'static str {
        match self {
            DropReason::QueueFull => "queue_full",
            DropReason::Preempted => "preempted",
            DropReason::NotAccepted => "not_accepted",
        }
    }
}

impl EncodeLabelValue for DropReason {
    fn encode(&self, encoder: &mut LabelValueEncoder) -> Result<(), std::fmt::Error> {
        EncodeLabelValue::encode(&self.as_str(), encoder)
    }
}

/// Which bound refused an open waiting for a dial (metric label `limit`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PendingLimit {
    /// Too many opens already wait for a connection to this one peer.
    PerPeer,
    /// Too many opens already wait for connections to all peers together.
    Total,
}

impl PendingLimit {
    /// Every limit, to pre-create label values.
    pub const ALL: [PendingLimit; 2] = [PendingLimit::PerPeer, PendingLimit::Total];

    /// The label value.
    pub fn as_str(self) -> &'static str {
        match self {
            PendingLimit::PerPeer => "per_peer",
            PendingLimit::Total => "total",
        }
    }
}

impl std::fmt::Display for PendingLimit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            PendingLimit::PerPeer => "a dial to this peer",
            PendingLimit::Total => "dials to all peers together",
        })
    }
}

impl EncodeLabelValue for PendingLimit {
    fn encode(&self, encoder: &mut LabelValueEncoder) -> Result<(), std::fmt::Error> {
        EncodeLabelValue::encode(&self.as_str(), encoder)
    }
}

/// Labels of `agentmesh_streams_pending_opens_refused_total`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub(crate) struct RefusedLabels {
    pub(crate) limit: PendingLimit,
}

/// Labels of `agentmesh_streams_inbound_dropped_total`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub(crate) struct DropLabels {
    pub(crate) protocol: String,
    pub(crate) reason: DropReason,
}
