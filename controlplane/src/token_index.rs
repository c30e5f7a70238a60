//! The digests of the enrollment tokens the database holds, in memory: what
//! lets the failure guard keep the made-up tokens of a source over its
//! failure limit away from the enroll budget and the database while the
//! real tokens of the members behind the same address still pass.
//!
//! Anyone can sign a valid enrollment proof (it only proves a fresh key),
//! so an Enroll's token is the only thing that tells an attacker from a
//! member, and only the database knows tokens. A source under its limit
//! has its tokens looked up there, as always; a source over it first asks
//! this index, and a digest it does not hold is refused in memory.
//!
//! The index is a superset of what the database holds as live (tokens not
//! expired at the last load; a used-up or revoked one stays until the next
//! load, and the database still refuses it). It is loaded on demand, only
//! when a source over its limit asks: on the first such lookup, and then
//! when a digest is missing and the last load is older than
//! `--token-index-max-age-secs`, or a token was minted in this process
//! since. A token minted elsewhere (the `token create` command, another
//! process on the database) is therefore known here within that age: a
//! member using it from a blocked address meanwhile is told to retry when
//! the index may be reloaded. At most `--token-index-max-tokens` digests are
//! kept; when the database holds more, the index cannot say "unknown" and
//! the source's enrollments go to the database as under the limit
//! (bounded by the enroll budget; counted in
//! `token_index_loads_total{result="truncated"}`).
//!
//! One writer: the load, under the index's lock; a mint only marks it stale.

use std::{
    collections::HashSet,
    future::Future,
    sync::atomic::{AtomicBool, Ordering},
    time::Duration,
};

/// A token's digest, as stored (see [`crate::tokens::digest`]).
pub type Digest = [u8; 32];

/// What the index says about a digest.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// The database held it at the last load: look it up there.
    Held,
    /// The database did not hold it at the last load, which is younger than
    /// the max age; it may be loaded again in `recheck_in`.
    Unknown {
        /// Until the index may be reloaded.
        recheck_in: Duration,
    },
    /// The database holds more live tokens than the index keeps (or the
    /// index is off): it cannot tell.
    Incomplete,
}

/// What one load read, for the metrics.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Loaded {
    /// Digests kept.
    pub tokens: usize,
    /// Whether they are every live token of the database.
    pub complete: bool,
}

#[derive(Debug, Default)]
struct Held {
    digests: HashSet<Digest>,
    /// When the last load ran (the clock of the request limits).
    at: Option<Duration>,
    complete: bool,
}

/// The index (see the module docs).
#[derive(Debug)]
pub struct TokenIndex {
    max_tokens: usize,
    max_age: Duration,
    stale: AtomicBool,
    held: tokio::sync::Mutex<Held>,
}

impl TokenIndex {
    /// An empty index keeping at most `max_tokens` digests (0: off), loaded
    /// again on a miss once older than `max_age`.
    pub fn new(max_tokens: usize, max_age: Duration) -> Self {
        Self {
            max_tokens,
            max_age,
            stale: AtomicBool::new(false),
            held: tokio::sync::Mutex::new(Held::default()),
        }
    }

    /// A token was minted in this process: the next miss loads again.
    pub fn minted(&self) {
        self.stale.store(true, Ordering::Release);
    }

    /// Whether the database may hold `digest`, at `now`; `load(limit)`
    /// reads at most `limit` live digests from the database when the index
    /// has to be (re)loaded. Lookups wait for a load in progress.
    pub async fn lookup<F, Fut, E>(
        &self,
        digest: &Digest,
        now: Duration,
        load: F,
    ) -> Result<(Verdict, Option<Loaded>), E>
    where
        F: FnOnce(u64) -> Fut,
        Fut: Future<Output = Result<Vec<Digest>, E>>,
    {
        if self.max_tokens == 0 {
            return Ok((Verdict::Incomplete, None));
        }
        let mut held = self.held.lock().await;
        if held.digests.contains(digest) {
            return Ok((Verdict::Held, None));
        }
        let mut loaded = None;
        let stale = self.stale.swap(false, Ordering::AcqRel);
        if stale || held.at.is_none_or(|at| now >= at + self.max_age) {
            let limit = u64::try_from(self.max_tokens).unwrap_or(u64::MAX);
            let rows = match load(limit.saturating_add(1)).await {
                Ok(rows) => rows,
                Err(e) => {
                    // Whoever asks next loads again.
                    self.stale.store(true, Ordering::Release);
                    return Err(e);
                }
            };
            let complete = rows.len() <= self.max_tokens;
            held.digests = rows.into_iter().take(self.max_tokens).collect();
            held.at = Some(now);
            held.complete = complete;
            loaded = Some(Loaded {
                tokens: held.digests.len(),
                complete,
            });
        }
        let verdict = if held.digests.contains(digest) {
            Verdict::Held
        } else if !held.complete {
            Verdict::Incomplete
        } else {
            let at = held.at.unwrap_or(now);
            Verdict::Unknown {
                recheck_in: (at + self.max_age).saturating_sub(now),
            }
        };
        Ok((verdict, loaded))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::{
        convert::Infallible,
        sync::atomic::{AtomicUsize, Ordering},
    };

    fn secs(n: u64) -> Duration {
        Duration::from_secs(n)
    }

    /// A database holding `tokens`, counting its loads.
    struct Db {
        tokens: std::sync::Mutex<Vec<Digest>>,
        loads: AtomicUsize,
    }

    impl Db {
        fn new(tokens: &[u8]) -> Self {
            Self {
                tokens: std::sync::Mutex::new(tokens.iter().map(|b| [*b; 32]).collect()),
                loads: AtomicUsize::new(0),
            }
        }

        async fn load(&self, limit: u64) -> Result<Vec<Digest>, Infallible> {
            self.loads.fetch_add(1, Ordering::SeqCst);
            let t = self.tokens.lock().expect("lock");
            Ok(t.iter().take(limit as usize).copied().collect())
        }

        fn loads(&self) -> usize {
            self.loads.load(Ordering::SeqCst)
        }
    }

    async fn ask(i: &TokenIndex, db: &Db, token: u8, now: Duration) -> Verdict {
        let (v, _) = i
            .lookup(&[token; 32], now, |limit| db.load(limit))
            .await
            .expect("infallible");
        v
    }

    #[tokio::test]
    async fn misses_load_at_most_once_per_max_age_unless_a_mint_made_it_stale() {
        let i = TokenIndex::new(10, secs(5));
        let db = Db::new(&[1, 2]);
        assert_eq!(ask(&i, &db, 1, secs(0)).await, Verdict::Held);
        assert_eq!(db.loads(), 1, "the first lookup loads");
        // A flood of made-up tokens: refused in memory, no load until the
        // max age has passed.
        for t in 10..100 {
            assert_eq!(
                ask(&i, &db, t, secs(2)).await,
                Verdict::Unknown {
                    recheck_in: secs(3)
                }
            );
        }
        assert_eq!(db.loads(), 1);
        // A token made elsewhere is found once the index is old enough.
        db.tokens.lock().expect("lock").push([3; 32]);
        assert!(matches!(
            ask(&i, &db, 3, secs(4)).await,
            Verdict::Unknown { .. }
        ));
        assert_eq!(ask(&i, &db, 3, secs(5)).await, Verdict::Held);
        assert_eq!(db.loads(), 2);
        // Held digests never load; a mint here makes the next miss load.
        assert_eq!(ask(&i, &db, 2, secs(6)).await, Verdict::Held);
        db.tokens.lock().expect("lock").push([4; 32]);
        i.minted();
        assert_eq!(ask(&i, &db, 4, secs(6)).await, Verdict::Held);
        assert_eq!(db.loads(), 3);
    }

    #[tokio::test]
    async fn more_tokens_than_it_keeps_make_it_unable_to_refuse() {
        let i = TokenIndex::new(2, secs(5));
        let db = Db::new(&[1, 2, 3]);
        let (v, loaded) = i
            .lookup(&[9; 32], secs(0), |limit| db.load(limit))
            .await
            .expect("infallible");
        assert_eq!(v, Verdict::Incomplete);
        assert_eq!(
            loaded,
            Some(Loaded {
                tokens: 2,
                complete: false
            })
        );
        // Off: never loads, never refuses.
        let off = TokenIndex::new(0, secs(5));
        assert_eq!(ask(&off, &db, 9, secs(0)).await, Verdict::Incomplete);
        assert_eq!(db.loads(), 1);
    }

    #[tokio::test]
    async fn a_failed_load_is_retried_by_the_next_lookup() {
        let i = TokenIndex::new(10, secs(5));
        let r: Result<_, &str> = i
            .lookup(&[1; 32], secs(0), |_| async { Err("database busy") })
            .await;
        assert_eq!(r.err(), Some("database busy"));
        let db = Db::new(&[1]);
        assert_eq!(ask(&i, &db, 1, secs(0)).await, Verdict::Held);
        assert_eq!(db.loads(), 1);
    }
}
