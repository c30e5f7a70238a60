//! The strangers' memory pool at the connection level: the manager's
//! bookkeeping per peer (charges in, out on release, moved out of the pool
//! when the peer is admitted). What the pool may hold, and how sources
//! share it, is pure policy in `budget::stranger_pool`.

use libp2p::PeerId;

use super::source::SourceKey;
use super::{ResourceManager, State};

impl ResourceManager {
    /// Books `bytes` charged to `peer` (not admitted, from `source`) in the
    /// strangers' pool.
    pub(super) fn charge_stranger(
        &self,
        st: &mut State,
        peer: PeerId,
        source: Option<SourceKey>,
        bytes: u64,
    ) {
        let u = st.peers.entry(peer).or_default();
        if u.stranger_bytes == 0 {
            u.stranger_source = source;
        }
        u.stranger_bytes = u.stranger_bytes.saturating_add(bytes);
        let source = u.stranger_source;
        st.strangers.charge(source, bytes);
        self.stranger_gauge(st);
    }

    /// Releases up to `bytes` of `peer`'s charges from the strangers' pool
    /// (none once it was admitted).
    pub(super) fn uncharge_stranger(&self, st: &mut State, peer: &PeerId, bytes: u64) {
        let Some(u) = st.peers.get_mut(peer) else {
            return;
        };
        let take = bytes.min(u.stranger_bytes);
        if take == 0 {
            return;
        }
        u.stranger_bytes -= take;
        let source = u.stranger_source;
        st.strangers.uncharge(source, take);
        self.stranger_gauge(st);
    }

    fn stranger_gauge(&self, st: &State) {
        self.metrics
            .unauthenticated_memory_in_use
            .set(i64::try_from(st.strangers.used()).unwrap_or(i64::MAX));
    }

    /// `peer` was admitted: its charges leave the strangers' pool (members
    /// are charged to the router's budget only), and its connections count
    /// as a member's in their sources.
    pub(crate) fn peer_admitted(&self, peer: &PeerId) {
        let mut st = self.state.lock();
        let bytes = st.peers.get(peer).map_or(0, |u| u.stranger_bytes);
        self.uncharge_stranger(&mut st, peer, bytes);
        self.count_admitted(&mut st, peer, true);
    }
}
