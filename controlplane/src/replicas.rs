//! How many control-plane replicas are live, so that every budget the
//! control plane promises is one budget for all of them.
//!
//! Each replica renews a lease on its own name in `duty_leases` every
//! [`HEARTBEAT`] (timed by the database's clock, lapsing after three
//! missed beats) and counts the live ones in the same transaction; its
//! [`RequestLimits`](crate::request_limits::RequestLimits) then serve
//! 1/N of each budget and of the failure guard's count. A share rather
//! than a budget in the database: admitting a request stays a memory
//! operation (no write per request, which would put the database on the
//! path every refusal is meant to protect), at the cost of honesty only
//! as good as the balance across replicas: members open a connection per
//! call, so a Service spreads them, and a `retry-after` from one replica
//! promises a slot of that replica's share, which the retry finds on
//! whichever replica it lands on at the same rate. Until the first beat,
//! and while the database cannot be asked, a replica keeps its last share
//! (the whole budget at start: the count of one).

use std::{sync::Arc, time::Duration};

use crate::{duty::replica_id, state::State, store::replica_duty, supervisor::Tasks};

/// How often a replica renews its presence and recounts.
pub const HEARTBEAT: Duration = Duration::from_secs(2);

/// How long a presence lasts without a renewal: three beats.
pub const PRESENCE: Duration = Duration::from_secs(6);

/// Spawns the heartbeat as the supervised task `replicas`; on stop it
/// withdraws this replica's presence so the others take its share at
/// their next beat.
pub fn spawn(state: &Arc<State>, tasks: &mut Tasks) {
    let (s, mut stop) = (state.clone(), tasks.stop_signal());
    tasks.spawn("replicas", async move {
        let holder = replica_id();
        let ttl_ms = i64::try_from(PRESENCE.as_millis()).unwrap_or(i64::MAX);
        let mut live = 1u32;
        s.metrics.set_live_replicas(live);
        let mut tick = tokio::time::interval(HEARTBEAT);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                biased;
                _ = stop.changed() => break,
                _ = tick.tick() => {}
            }
            match s.db.run(s.db.store().replica_heartbeat(holder, ttl_ms)).await {
                Ok(n) => {
                    let n = n.max(1);
                    if n != live {
                        tracing::info!(replicas = n, was = live, "live control-plane replicas changed; each serves 1/{n} of every shared budget");
                        live = n;
                        s.limits.set_replicas(n);
                        s.metrics.set_live_replicas(n);
                    }
                }
                Err(e) => tracing::warn!(error = %e, replicas = live, "could not renew this replica's presence; keeping the last share"),
            }
        }
        if let Err(e) = s.db.run(s.db.store().release_duty(&replica_duty(holder), holder)).await {
            tracing::warn!(error = %e, "could not withdraw this replica's presence; it lapses on its own");
        }
        Ok(())
    });
}
