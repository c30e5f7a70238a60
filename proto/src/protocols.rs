//! libp2p protocol ids of agentmesh's own protocols and their size caps.

use libp2p_identity::PeerId;

/// Authentication: one `AuthRequest` frame, one `AuthResponse` frame.
pub const AUTH: &str = "/agentmesh/auth/1";
/// Service catalog: one `CatalogRequest`, one `CatalogResponse`.
pub const CATALOG: &str = "/agentmesh/catalog/1";
/// Calls: one `CallRequest`, one `CallResponse`, then raw bytes.
pub const CALL: &str = "/agentmesh/call/1";
/// Go-away: router to member, one `GoAway`, one `GoAwayAck`.
pub const GOAWAY: &str = "/agentmesh/goaway/1";

/// Policy push: router to member, one `PolicyPush`, one `PolicyAck`.
pub const POLICY: &str = "/agentmesh/policy/1";

/// Direct-connection hello: on a direct connection between two members,
/// each side opens one stream and sends one `Credential` frame (at most
/// [`MAX_FRAME_BYTES`]), the credential its calls carry; nothing is
/// answered. One per connection and direction.
pub const DIRECT_HELLO: &str = "/agentmesh/direct-hello/1";

/// Connection reversal: on a relayed connection between two members, the
/// one behind an endpoint-dependent NAT asks the other to accept a direct
/// dial from it; one request byte, answered by the address to dial (or a
/// refusal). See the node's `direct/reversal.rs`.
pub const DIRECT_REVERSE: &str = "/agentmesh/direct-reverse/1";

/// Largest `PolicyPush` (and `Admitted` carrying one): the policy
/// document's and the signed revocation list's own caps, plus room for
/// their signatures and framing.
pub const MAX_POLICY_FRAME_BYTES: usize = crate::policy::MAX_POLICY_DOCUMENT_BYTES
    + crate::revocations::MAX_REVOCATIONS_LIST_BYTES
    + 4096;

/// Largest frame any of our protocols accepts (64 KiB).
pub const MAX_FRAME_BYTES: usize = 64 * 1024;

/// Largest catalog lookup answer (many signed records).
pub const MAX_CATALOG_FRAME_BYTES: usize = 256 * 1024;

/// Parses PeerId bytes from the wire, `None` if they are not a PeerId.
pub fn peer_id_from_bytes(bytes: &[u8]) -> Option<PeerId> {
    PeerId::from_bytes(bytes).ok()
}
