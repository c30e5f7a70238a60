//! Not an attack but its mirror: a router of the directory that the router
//! under test dials, and that opens streams the router refuses it (catalog
//! streams: it is not admitted there yet) before its own auth to the router
//! is through. A router mesh does this whenever one side's auth lags: each
//! router dials the others it finds in the directory and authenticates on
//! its own schedule.
//!
//! The router must not take such a peer for a stranger reaching in: it
//! chose to dial it, so refused streams on that connection are not counted
//! against `--stranger-refused-streams-max`, the connection stays open and
//! the peer's address is not charged failed logins. Once the peer shows its
//! router credential on the same connection, it is admitted.
//!
//! The peer is a real one: it enrolls with a router token, leases its listen
//! address so the control plane's directory names it, and waits for the
//! router's dial. Bounded: `streams` streams and every step a deadline.

use std::net::IpAddr;
use std::time::Duration;

use agentmesh_controlplane::client::{Client, ClientConfig};
use agentmesh_proto::pb::controlplane::RouterLoad;
use agentmesh_proto::pb::mesh::Purpose;
use anyhow::Context as _;
use libp2p::identity::Keypair;
use libp2p::multiaddr::Protocol;
use libp2p::{Multiaddr, PeerId};
use tokio::time::Instant;

use crate::member::Member;
use crate::router_refused::{Opened, catalog_streams};

/// How often the peer renews its lease while it waits (the router under
/// test reads the directory at its own lease interval).
const LEASE_EVERY: Duration = Duration::from_secs(1);

/// The case to run.
#[derive(Debug, Clone)]
pub struct Case {
    /// The control plane's gRPC URL (must match its `--public-url`).
    pub control_plane: String,
    /// A router enrollment token.
    pub token: String,
    /// The router under test, which is to dial this peer.
    pub router: PeerId,
    /// The address this peer listens on (any of 127.0.0.0/8 on loopback).
    pub listen_ip: IpAddr,
    /// Catalog streams to open before authenticating back.
    pub streams: usize,
    /// Deadline of each step (enrollment, the router's dial, the streams,
    /// the auth).
    pub step_deadline: Duration,
}

crate::counts::counts! {
    /// What the case did.
    pub struct Report (live Counters, attack "dialed-router") {
        /// Leases this peer sent before the router dialed it.
        leases,
        /// Connections the router made to this peer.
        dialed_in,
        /// Catalog streams negotiated on the router's connection.
        streams_opened,
        /// Opens that failed (the connection was closing, or negotiation failed).
        opens_failed,
        /// Reads that brought bytes (none expected: not admitted yet).
        streams_answered,
        /// Connections to the router still open after the streams.
        open_after_streams,
        /// 1 if the router admitted this peer as a router afterwards, on
        /// that same connection.
        admitted,
        /// Connections to the router open at the end.
        open_at_end,
    }
}

/// Runs the case; an error only if a set-up step fails (enrollment,
/// listening, the router never dialing).
pub async fn run(case: Case) -> anyhow::Result<Report> {
    let mut report = Report::default();
    let client = Client::new(ClientConfig {
        url: case.control_plane.clone(),
        retry_budget: case.step_deadline,
        ..Default::default()
    })?;
    let key = Keypair::generate_ed25519();
    let credential = client
        .enroll(case.token.trim(), &key)
        .await?
        .credential
        .context("enrollment returned no credential")?;
    let member = Member::new(key.clone())?;
    let on = Multiaddr::empty()
        .with(case.listen_ip.into())
        .with(Protocol::Tcp(0));
    let addr = member.listen(on, case.step_deadline).await?;

    // Lease until the router dials us.
    let until = Instant::now() + case.step_deadline;
    while !member.is_connected(&case.router) {
        anyhow::ensure!(
            Instant::now() < until,
            "the router did not dial {addr} within {:?} ({} leases)",
            case.step_deadline,
            report.leases
        );
        client
            .router_lease(
                &credential,
                &key,
                vec![addr.to_string()],
                Vec::new(),
                RouterLoad::default(),
                false,
            )
            .await
            .context("lease")?;
        report.leases += 1;
        let next = Instant::now() + LEASE_EVERY;
        while Instant::now() < next && !member.is_connected(&case.router) {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    report.dialed_in = member.connections(&case.router).1;

    let (tx, rx) = tokio::sync::watch::channel(Opened::default());
    let deadline = Instant::now() + case.step_deadline;
    catalog_streams(member.control(), case.router, case.streams, deadline, tx).await;
    let o = *rx.borrow();
    report.streams_opened = o.opened;
    report.opens_failed = o.failed;
    report.streams_answered = o.answered;
    report.open_after_streams = u64::from(member.connections(&case.router).0);

    let auth = member
        .authenticate(case.router, credential, Purpose::Router, case.step_deadline)
        .await;
    match auth {
        Ok(()) => report.admitted = 1,
        Err(e) => tracing::info!(error = %e, "dialed router: not admitted"),
    }
    let (open, established, _) = member.connections(&case.router);
    report.open_at_end = u64::from(open);
    report.dialed_in = established;
    Ok(report)
}
