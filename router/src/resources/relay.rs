//! Relay refusals as resource refusals: the relay server denies with
//! `RESOURCE_LIMIT_EXCEEDED` both when a limit bites and when our admission
//! check (its first rate limiter) says no. Only the former is a resource
//! refusal; it is counted as `resource="reservation"|"circuit"`, scope
//! `system` when the router-wide maximum is reached, else `peer`.
//!
//! Also the source of a circuit as the muxer sees it: the STOP request the
//! relay writes to the destination names the peer that asked for the
//! circuit ([`stop_source`]), so the circuit can be charged to that
//! source's share of the destination's circuits.
//!
//! And the answer the muxer gives the relay in the destination's place
//! when the policy refuses a circuit ([`stop_permission_denied`]): a STOP
//! STATUS `PERMISSION_DENIED`, which libp2p-relay passes on to the source
//! as its HOP status, so the caller learns the circuit was refused by
//! policy (`PermissionDenied`) instead of a garbled `MALFORMED_MESSAGE`.

use libp2p::PeerId;
use libp2p::relay::StatusCode;

use super::ResourceManager;
use super::budget::{Proto, Refusal, Resource, Scope};

/// Counts a denied reservation if a relay limit (not admission) refused
/// it: `admitted` says whether the peer may reserve, `full` whether the
/// router-wide reservation cap is reached.
pub(crate) fn reservation_denied(
    resources: &ResourceManager,
    status: &StatusCode,
    admitted: bool,
    full: bool,
) {
    count(resources, Resource::Reservation, status, admitted, full);
}

/// Counts a denied circuit if a relay limit (not admission) refused it:
/// `admitted` says whether the source may open circuits, `full` whether the
/// router-wide circuit cap is reached.
pub(crate) fn circuit_denied(
    resources: &ResourceManager,
    status: &StatusCode,
    admitted: bool,
    full: bool,
) {
    count(resources, Resource::Circuit, status, admitted, full);
}

fn count(
    resources: &ResourceManager,
    resource: Resource,
    status: &StatusCode,
    admitted: bool,
    full: bool,
) {
    if let Some(r) = classify(resource, status, admitted, full) {
        resources.metrics.refused(r, Proto::RelayHop.as_str());
    }
}

/// The refusal a relay denial stands for, if it was for lack of a resource.
fn classify(
    resource: Resource,
    status: &StatusCode,
    admitted: bool,
    full: bool,
) -> Option<Refusal> {
    if !matches!(status, StatusCode::ResourceLimitExceeded) || !admitted {
        return None;
    }
    let scope = if full { Scope::System } else { Scope::Peer };
    Some(Refusal { resource, scope })
}

/// Bytes of a STOP request looked at before giving up on finding its source.
pub(crate) const MAX_STOP_REQUEST_BYTES: usize = 1024;

/// libp2p-relay's `StopMessage`, only the fields read here (the rest are
/// skipped by the decoder).
#[derive(Clone, PartialEq, prost::Message)]
struct StopMessage {
    /// 0: CONNECT.
    #[prost(int32, tag = "1")]
    r#type: i32,
    #[prost(message, optional, tag = "2")]
    peer: Option<StopPeer>,
}

/// libp2p-relay's `Peer`: the id only.
#[derive(Clone, PartialEq, prost::Message)]
struct StopPeer {
    #[prost(bytes = "vec", tag = "1")]
    id: Vec<u8>,
}

/// What the bytes the relay wrote on an outbound STOP stream show.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum StopSource {
    /// Not the whole request yet.
    Incomplete,
    /// A CONNECT for a circuit asked for by this peer.
    Source(PeerId),
    /// Not a CONNECT naming a peer (or too long): nothing to charge.
    Unknown,
}

/// The source named by the STOP request in `written` followed by `next`
/// (the relay's length-prefixed `StopMessage`). Pure.
pub(crate) fn stop_source(written: &[u8], next: &[u8]) -> StopSource {
    let mut all = Vec::with_capacity(written.len() + next.len());
    all.extend_from_slice(written);
    all.extend_from_slice(&next[..next.len().min(MAX_STOP_REQUEST_BYTES)]);
    let mut body = &all[..];
    let Ok(len) = prost::decode_length_delimiter(&mut body) else {
        // A length prefix is at most 10 bytes.
        return if all.len() < 10 {
            StopSource::Incomplete
        } else {
            StopSource::Unknown
        };
    };
    if len > MAX_STOP_REQUEST_BYTES {
        return StopSource::Unknown;
    }
    if body.len() < len {
        return StopSource::Incomplete;
    }
    let Ok(m) = <StopMessage as prost::Message>::decode(&body[..len]) else {
        return StopSource::Unknown;
    };
    match m.peer {
        Some(p) if m.r#type == 0 => {
            PeerId::from_bytes(&p.id).map_or(StopSource::Unknown, StopSource::Source)
        }
        _ => StopSource::Unknown,
    }
}

/// libp2p-relay's `StopMessage` as a status answer.
#[derive(Clone, PartialEq, prost::Message)]
struct StopStatus {
    /// 1: STATUS.
    #[prost(int32, tag = "1")]
    r#type: i32,
    /// The relay v2 `Status`.
    #[prost(int32, tag = "4")]
    status: i32,
}

/// relay v2 `StopMessage.Type.STATUS`.
const STOP_TYPE_STATUS: i32 = 1;
/// relay v2 `Status.PERMISSION_DENIED`.
const STATUS_PERMISSION_DENIED: i32 = 202;

/// A destination's length-prefixed answer to a STOP CONNECT refusing it
/// with `PERMISSION_DENIED`.
pub(crate) fn stop_permission_denied() -> Vec<u8> {
    prost::Message::encode_length_delimited_to_vec(&StopStatus {
        r#type: STOP_TYPE_STATUS,
        status: STATUS_PERMISSION_DENIED,
    })
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;

    #[test]
    fn the_denial_is_a_stop_status_permission_denied() {
        // Length 5; type (field 1) = STATUS (1); status (field 4) = 202.
        assert_eq!(
            stop_permission_denied(),
            vec![5, 0x08, 0x01, 0x20, 0xca, 0x01]
        );
        // Not a CONNECT: it names no source.
        assert_eq!(
            stop_source(&[], &stop_permission_denied()),
            StopSource::Unknown
        );
    }

    /// A STOP CONNECT from `src` as libp2p-relay frames it (with a limit
    /// and an address the decoder must skip).
    pub(crate) fn connect_from(src: PeerId) -> Vec<u8> {
        #[derive(Clone, PartialEq, prost::Message)]
        struct Limit {
            #[prost(uint32, tag = "1")]
            duration: u32,
        }
        #[derive(Clone, PartialEq, prost::Message)]
        struct Peer {
            #[prost(bytes = "vec", tag = "1")]
            id: Vec<u8>,
            #[prost(bytes = "vec", repeated, tag = "2")]
            addrs: Vec<Vec<u8>>,
        }
        #[derive(Clone, PartialEq, prost::Message)]
        struct Full {
            #[prost(int32, tag = "1")]
            r#type: i32,
            #[prost(message, optional, tag = "2")]
            peer: Option<Peer>,
            #[prost(message, optional, tag = "3")]
            limit: Option<Limit>,
        }
        let m = Full {
            r#type: 0,
            peer: Some(Peer {
                id: src.to_bytes(),
                addrs: vec![vec![4, 127, 0, 0, 1]],
            }),
            limit: Some(Limit { duration: 3600 }),
        };
        prost::Message::encode_length_delimited_to_vec(&m)
    }

    #[test]
    fn the_source_of_a_stop_request_is_read_in_pieces() {
        let src = PeerId::random();
        let bytes = connect_from(src);
        assert_eq!(stop_source(&[], &bytes), StopSource::Source(src));
        for cut in 0..bytes.len() {
            assert_eq!(
                stop_source(&[], &bytes[..cut]),
                StopSource::Incomplete,
                "cut at {cut}"
            );
            assert_eq!(
                stop_source(&bytes[..cut], &bytes[cut..]),
                StopSource::Source(src)
            );
        }
    }

    #[test]
    fn other_stop_messages_name_no_source() {
        // STATUS (type 1), a garbled body, a bad peer id, an oversized length.
        assert_eq!(stop_source(&[], &[2, 0x08, 0x01]), StopSource::Unknown);
        assert_eq!(stop_source(&[], &[2, 0xff, 0xff]), StopSource::Unknown);
        assert_eq!(
            stop_source(&[], &[6, 0x08, 0x00, 0x12, 0x02, 0x0a, 0x00]),
            StopSource::Unknown
        );
        assert_eq!(stop_source(&[], &[0xff, 0xff, 0x01]), StopSource::Unknown);
        assert_eq!(stop_source(&[], &[0xff; 11]), StopSource::Unknown);
    }

    #[test]
    fn only_limits_on_admitted_peers_count() {
        let r = Resource::Circuit;
        assert_eq!(
            classify(r, &StatusCode::ResourceLimitExceeded, false, true),
            None
        );
        assert_eq!(classify(r, &StatusCode::NoReservation, true, true), None);
        assert_eq!(
            classify(r, &StatusCode::ResourceLimitExceeded, true, true),
            Some(Refusal {
                resource: r,
                scope: Scope::System
            })
        );
        assert_eq!(
            classify(r, &StatusCode::ResourceLimitExceeded, true, false),
            Some(Refusal {
                resource: r,
                scope: Scope::Peer
            })
        );
    }
}
