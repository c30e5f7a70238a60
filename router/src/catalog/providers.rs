//! Provider searches in the router DHT, one per service at a time.
//!
//! A member lookup that this router cannot answer from its own records asks
//! the DHT which routers provide the service. Without coordination every
//! lookup started its own Kademlia query: in a re-attach storm thousands of
//! members look up the same service at once, so thousands of queries ran
//! together, each asking up to three routers, and libp2p-kad's query table
//! kept the capacity of that peak for good (1.5 MiB in the heap profile of a
//! router after 5,000 members left, ladder/RESULTS.md). Here a lookup
//! joins the search already running for its service, and a search that
//! found providers is remembered for `--catalog-provider-cache-ms`: provider
//! records are re-announced every two minutes and live six, so a few
//! seconds of reuse changes no answer that matters. An empty answer is never
//! remembered, so a service that has just been published is found as soon as
//! the DHT knows it.
//!
//! Generic over the query id so the bookkeeping is tested without a swarm.

use std::collections::{HashMap, HashSet};
use std::hash::Hash;
use std::time::Duration;

use libp2p::PeerId;
use libp2p::kad::RecordKey;
use tokio::sync::oneshot;
use tokio::time::Instant;

use crate::shrink::ShrinkSparse;

/// Services whose providers are remembered at most (entries beyond wait for
/// expired ones to go).
pub(crate) const MAX_CACHED_SERVICES: usize = 4096;

/// Who is waiting for a search's answer.
pub(crate) type Reply = oneshot::Sender<Vec<PeerId>>;

/// What a lookup's request for providers turned into; also the label value
/// of `agentmesh_router_catalog_provider_searches_total{outcome}`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Outcome {
    /// A new DHT query was started for it.
    Started,
    /// It waits for the query already running for the service.
    Joined,
    /// Answered at once from a recent search.
    Cached,
}

impl Outcome {
    /// Every outcome, for pre-created label values.
    pub(crate) const ALL: [Outcome; 3] = [Outcome::Started, Outcome::Joined, Outcome::Cached];

    /// The label value.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Outcome::Started => "started",
            Outcome::Joined => "joined",
            Outcome::Cached => "cached",
        }
    }
}

struct Running {
    key: RecordKey,
    found: HashSet<PeerId>,
    /// Bounded by the lookups in flight, which the catalog's stream budget
    /// bounds (`--catalog-max-inflight-streams`).
    waiters: Vec<Reply>,
}

/// The searches running and the answers remembered.
pub(crate) struct Searches<Q> {
    ttl: Duration,
    running: HashMap<Q, Running>,
    by_key: HashMap<RecordKey, Q>,
    cache: HashMap<RecordKey, (Instant, Vec<PeerId>)>,
}

impl<Q: Copy + Eq + Hash> Searches<Q> {
    /// Remembers answers for `ttl` (zero: never).
    pub(crate) fn new(ttl: Duration) -> Self {
        Self {
            ttl,
            running: HashMap::new(),
            by_key: HashMap::new(),
            cache: HashMap::new(),
        }
    }

    /// A lookup wants the providers of `key`: answers at once from a recent
    /// search, joins the running one, or starts a DHT query with `start`.
    pub(crate) fn request(
        &mut self,
        key: RecordKey,
        reply: Reply,
        now: Instant,
        start: impl FnOnce(RecordKey) -> Q,
    ) -> Outcome {
        if let Some((at, providers)) = self.cache.get(&key) {
            if now.saturating_duration_since(*at) < self.ttl {
                let _ = reply.send(providers.clone());
                return Outcome::Cached;
            }
            self.cache.remove(&key);
        }
        if let Some(q) = self.by_key.get(&key)
            && let Some(r) = self.running.get_mut(q)
        {
            r.waiters.push(reply);
            return Outcome::Joined;
        }
        let query = start(key.clone());
        self.by_key.insert(key.clone(), query);
        self.running.insert(
            query,
            Running {
                key,
                found: HashSet::new(),
                waiters: vec![reply],
            },
        );
        Outcome::Started
    }

    /// Providers the query reported so far (`None` if `query` is not ours).
    pub(crate) fn progress(
        &mut self,
        query: &Q,
        providers: impl IntoIterator<Item = PeerId>,
    ) -> Option<usize> {
        let r = self.running.get_mut(query)?;
        r.found.extend(providers);
        Some(r.found.len())
    }

    /// The query ended (or was cut short): every waiter gets what it found,
    /// and a non-empty answer is remembered.
    pub(crate) fn finish(&mut self, query: &Q, now: Instant) {
        let Some(r) = self.running.remove(query) else {
            return;
        };
        self.by_key.remove(&r.key);
        self.running.shrink_sparse();
        self.by_key.shrink_sparse();
        let providers: Vec<PeerId> = r.found.into_iter().collect();
        if !providers.is_empty() && !self.ttl.is_zero() {
            if self.cache.len() >= MAX_CACHED_SERVICES {
                self.expire(now);
            }
            if self.cache.len() < MAX_CACHED_SERVICES {
                self.cache.insert(r.key, (now, providers.clone()));
            }
        }
        for w in r.waiters {
            let _ = w.send(providers.clone());
        }
    }

    /// Forgets answers older than the ttl.
    pub(crate) fn expire(&mut self, now: Instant) {
        let ttl = self.ttl;
        self.cache
            .retain(|_, (at, _)| now.saturating_duration_since(*at) < ttl);
        self.cache.shrink_sparse();
    }

    /// Searches running now.
    pub(crate) fn running(&self) -> usize {
        self.running.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(s: &str) -> RecordKey {
        RecordKey::new(&s)
    }

    /// Asks for `name`'s providers; a query started gets id `q`.
    fn ask(
        s: &mut Searches<u32>,
        name: &str,
        now: Instant,
        q: u32,
    ) -> (Outcome, oneshot::Receiver<Vec<PeerId>>) {
        let (tx, rx) = oneshot::channel();
        (s.request(key(name), tx, now, |_| q), rx)
    }

    #[tokio::test]
    async fn lookups_of_one_service_share_one_search_and_its_answer() {
        let mut s: Searches<u32> = Searches::new(Duration::from_secs(5));
        let now = Instant::now();
        let (o1, rx1) = ask(&mut s, "echo", now, 1);
        assert_eq!(o1, Outcome::Started);
        let (o2, rx2) = ask(&mut s, "echo", now, 99);
        assert_eq!(o2, Outcome::Joined, "no second query for the same service");
        let (o3, _rx3) = ask(&mut s, "other", now, 2);
        assert_eq!(o3, Outcome::Started, "another service gets its own search");
        assert_eq!(s.running(), 2);

        let p = PeerId::random();
        assert_eq!(s.progress(&1, [p]), Some(1));
        assert_eq!(s.progress(&7, [p]), None, "not our query");
        s.finish(&1, now);
        assert_eq!(rx1.await.expect("answer"), vec![p]);
        assert_eq!(rx2.await.expect("answer"), vec![p]);
        assert_eq!(s.running(), 1);

        // Within the ttl the answer is reused; after it, a new search runs.
        let (o4, rx4) = ask(&mut s, "echo", now + Duration::from_secs(4), 3);
        assert_eq!(o4, Outcome::Cached);
        assert_eq!(rx4.await.expect("answer"), vec![p]);
        let (o5, _rx5) = ask(&mut s, "echo", now + Duration::from_secs(5), 4);
        assert_eq!(o5, Outcome::Started);
    }

    #[tokio::test]
    async fn an_empty_answer_is_not_remembered_and_zero_ttl_remembers_nothing() {
        let now = Instant::now();
        let mut s: Searches<u32> = Searches::new(Duration::from_secs(5));
        let (o, rx) = ask(&mut s, "new", now, 1);
        assert_eq!(o, Outcome::Started);
        s.finish(&1, now);
        assert_eq!(rx.await.expect("answer"), Vec::<PeerId>::new());
        assert_eq!(ask(&mut s, "new", now, 2).0, Outcome::Started);

        let mut s: Searches<u32> = Searches::new(Duration::ZERO);
        assert_eq!(ask(&mut s, "echo", now, 1).0, Outcome::Started);
        s.progress(&1, [PeerId::random()]);
        s.finish(&1, now);
        assert_eq!(ask(&mut s, "echo", now, 2).0, Outcome::Started);
    }

    #[tokio::test]
    async fn the_cache_is_bounded_and_expires() {
        let now = Instant::now();
        let mut s: Searches<u32> = Searches::new(Duration::from_secs(5));
        for i in 0..(MAX_CACHED_SERVICES as u32 + 10) {
            assert_eq!(ask(&mut s, &i.to_string(), now, i).0, Outcome::Started);
            s.progress(&i, [PeerId::random()]);
            s.finish(&i, now);
        }
        assert_eq!(s.cache.len(), MAX_CACHED_SERVICES);
        s.expire(now + Duration::from_secs(6));
        assert!(s.cache.is_empty());
        assert_eq!(s.running(), 0);
        assert!(s.by_key.is_empty());
    }
}
