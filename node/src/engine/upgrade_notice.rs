//! Telling a router that a circuit through it was upgraded away: once a
//! direct connection to a peer is authenticated (its hello verified,
//! `direct_auth`), each relayed connection we dialed to that peer is
//! reported to the router it goes through, so routers can count the
//! circuits hole punching took off them
//! (`agentmesh_router_circuits_upgraded_total`). Only members can: the
//! circuit is end-to-end encrypted and the direct connection never touches
//! the router.
//!
//! The circuit's dialer tells (its relayed connection is outbound), not
//! both ends, so a router does not see every upgrade twice; the router
//! accepts the notice from either end and counts each circuit once. One
//! notice per circuit (`Conns::circuits_to_notice` marks it), one exchange
//! within the call timeout (an op of `/agentmesh/catalog/1`), never
//! retried: a lost notice costs one count on the router, and the result is
//! counted here (`agentmesh_node_upgrade_notices_total{result}`). The
//! relayed connection stays open until idle (`--relayed-idle-secs`), so
//! the circuit is still live when the router checks.

use agentmesh_wire::ExchangeFailure as _;
use agentmesh_wire::catalog::{self, CatalogAnswer};
use libp2p::PeerId;

use super::{Engine, Op};

impl Engine {
    /// A direct connection to `peer` was authenticated: tells the router
    /// of each circuit we dialed to `peer`, once per circuit.
    pub(super) fn notice_upgraded(&mut self, peer: PeerId) {
        for (conn, router) in self.conns.circuits_to_notice(&peer) {
            tracing::debug!(%peer, %router, %conn, "telling the router a circuit was upgraded away");
            let node = self.node.clone();
            self.ops.push(Box::pin(async move {
                let answer = catalog::request(
                    node.control.clone(),
                    router,
                    catalog::upgraded(&peer),
                    node.config.call_timeout(),
                )
                .await;
                let result = match &answer {
                    Ok(CatalogAnswer::Ack(_)) => "ok",
                    Ok(CatalogAnswer::Refused(why)) => {
                        tracing::debug!(%peer, %router, %why, "router refused the upgrade notice");
                        "refused"
                    }
                    Ok(CatalogAnswer::Records(_)) => "failed",
                    Err(e) if e.is_timeout() => "timed_out",
                    Err(e) => {
                        tracing::debug!(%peer, %router, error = %e, "upgrade notice failed");
                        "failed"
                    }
                };
                node.metrics.upgrade_notices.count(result);
                Op::UpgradeNoticed
            }));
        }
    }
}
