//! AWS-LC's random generator, seeded once per process before anything
//! needs it, off the async runtime.
//!
//! Why: libp2p's QUIC (through quinn and libp2p-tls) uses AWS-LC, whose
//! generator seeds a per-process root from CPU jitter entropy the first
//! time any thread asks for randomness: the first QUIC dial or handshake
//! of a process. That collection times the CPU, so on a busy machine it
//! runs long: in the NAT matrix under load it held both runtime threads of
//! a member for 1.0–1.2 s (the stall watchdog named `jent_*` inside
//! libp2p-quic's dial), and reversal dials made then ran past QUIC's
//! handshake timeout. Seeded here first, the dial only draws from the
//! per-thread generators, which reseed from the process's seeded one
//! without jitter.

use std::sync::Once;
use std::time::Instant;

static SEEDED: Once = Once::new();

/// Seeds AWS-LC's generator on this thread if no one has in this process
/// (later calls return at once). Blocking: call it before the runtime
/// starts (every program's `block_on` does) or through [`seeded`].
pub fn seed() {
    SEEDED.call_once(|| {
        let started = Instant::now();
        let mut buf = [0u8; 32];
        // Draws from the generator, which seeds itself first; a failure
        // here would fail the first handshake the same way, so it is only
        // logged: nothing is lost by not seeding early.
        match aws_lc_rs::rand::fill(&mut buf) {
            Ok(()) => tracing::debug!(
                took_ms = started.elapsed().as_millis() as u64,
                "AWS-LC's random generator seeded"
            ),
            Err(_) => tracing::warn!("AWS-LC's random generator could not be seeded early"),
        }
    });
}

/// Whether [`seed`] ran in this process.
pub fn is_seeded() -> bool {
    SEEDED.is_completed()
}

/// [`seed`] on a blocking thread, for code already on the runtime (a node
/// embedded in another program): returns once seeded.
pub async fn seeded() {
    if is_seeded() {
        return;
    }
    // A failed blocking task (the runtime shutting down) leaves it to the
    // first handshake, as before.
    let _ = tokio::task::spawn_blocking(seed).await;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn seeding_runs_off_the_runtime_once_and_then_returns_at_once() {
        seeded().await;
        assert!(is_seeded());
        // Later calls, blocking or not, do nothing more.
        seed();
        seeded().await;
        let mut a = [0u8; 32];
        let mut b = [0u8; 32];
        aws_lc_rs::rand::fill(&mut a).expect("random bytes");
        aws_lc_rs::rand::fill(&mut b).expect("random bytes");
        assert_ne!(a, b);
    }
}
