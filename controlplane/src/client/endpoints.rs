//! The endpoints a client dials (the control plane's replicas) and which
//! one a call or a watch goes to.
//!
//! Unary calls stay on one endpoint (`current`) and move to the next when
//! an attempt gets no answer, so a client keeps one connection while its
//! replica serves. A watch, held for minutes by a router, is placed
//! instead: the k-th watch a client opens goes first to endpoint
//! `start + k` (mod the count), `start` random per client unless given.
//! Each reopen of a moved watch (the replica ended it at its maximum age)
//! so goes to the next replica of the client's own rotation, whatever
//! replica it was on: watches that all landed on the replicas that came
//! up first (the others were not up yet, or stopping) are spread again
//! after one maximum age, the same way random starts spread them at first,
//! and a test choosing the starts gets an exact spread.
//!
//! An endpoint whose replica said it is stopping is avoided by every call
//! and watch for [`STOPPING_AVOID`] (it closes its listener and exits
//! within its shutdown grace; a restarted one is tried again after it).
//! When every endpoint is avoided, the one whose mark ends first is used.
//!
//! The set changes when a name given as `dns+http://NAME:PORT` resolves to
//! other addresses (see `resolve`): an address kept keeps its [`Dial`]
//! (its held connection and its avoid mark); indices given out before a
//! change are hints, read modulo the new count (a call or watch placed on
//! an index that moved lands on another endpoint, never on none).

use std::{
    sync::{
        Arc, OnceLock, RwLock,
        atomic::{AtomicU64, AtomicUsize, Ordering},
    },
    time::Duration,
};

use tonic::transport::{Channel, Endpoint};

use super::ClientError;
use super::resolve::{RESOLVE_EVERY, Source};

/// Builds the tonic endpoint for one address.
pub(super) type MakeEndpoint = Box<dyn Fn(&str) -> Result<Endpoint, ClientError> + Send + Sync>;

/// How long calls avoid an endpoint whose replica said it is stopping:
/// past a replica's shutdown grace (default 10 s), short enough that a
/// replica restarted in a rollout is used again soon after.
pub const STOPPING_AVOID: Duration = Duration::from_secs(15);

/// One address to dial, its held channel, and until when it is avoided.
pub(super) struct Dial {
    pub(super) address: String,
    pub(super) endpoint: Endpoint,
    pub(super) channel: OnceLock<Channel>,
    /// Avoided until this instant of the client's clock, in milliseconds
    /// (0: not avoided).
    avoid_until_ms: AtomicU64,
}

impl Dial {
    pub(super) fn new(address: String, endpoint: Endpoint) -> Self {
        Self {
            address,
            endpoint,
            channel: OnceLock::new(),
            avoid_until_ms: AtomicU64::new(0),
        }
    }

    fn avoided_until(&self) -> u64 {
        self.avoid_until_ms.load(Ordering::Relaxed)
    }
}

/// What the sources stood for at the last resolution.
struct Resolved {
    /// When, on the client's clock (`None`: never).
    at: Option<Duration>,
    /// Each source's addresses (a name not resolved yet: the name itself).
    per_source: Vec<Vec<String>>,
}

/// The endpoints and where calls and watches go.
pub(super) struct Endpoints {
    /// The addresses dialled now, in order (never empty).
    dials: RwLock<Arc<Vec<Arc<Dial>>>>,
    /// The list as given: fixed addresses and names to resolve.
    sources: Vec<Source>,
    /// Whether any source is a name (else [`Endpoints::refresh`], called
    /// before every call, returns at once).
    has_names: bool,
    make: MakeEndpoint,
    /// What names resolved to last; the lock also keeps resolutions one
    /// at a time.
    resolved: tokio::sync::Mutex<Resolved>,
    /// The endpoint unary calls use now; moved on when one fails to answer.
    current: AtomicUsize,
    /// Where the next watch opens first (before avoided endpoints are
    /// skipped): the client's start plus the watches opened so far.
    next_watch: AtomicUsize,
}

fn ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

impl Endpoints {
    /// The endpoints `sources` name (at least one; a name is dialled as
    /// itself until it first resolves), each built by `make`; watches start
    /// at `watch_start`, or at a random endpoint.
    pub(super) fn new(
        sources: Vec<Source>,
        make: MakeEndpoint,
        watch_start: Option<usize>,
    ) -> Result<Self, ClientError> {
        let start = watch_start.unwrap_or_else(|| rand::random::<u32>() as usize);
        let per_source: Vec<Vec<String>> = sources.iter().map(|s| vec![s.unresolved()]).collect();
        let dials = merge(&[], per_source.concat(), &make)?;
        Ok(Self {
            dials: RwLock::new(Arc::new(dials)),
            has_names: sources.iter().any(Source::is_name),
            sources,
            make,
            resolved: tokio::sync::Mutex::new(Resolved {
                at: None,
                per_source,
            }),
            current: AtomicUsize::new(0),
            next_watch: AtomicUsize::new(start),
        })
    }

    fn dials(&self) -> Arc<Vec<Arc<Dial>>> {
        self.dials.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    pub(super) fn len(&self) -> usize {
        self.dials().len()
    }

    pub(super) fn get(&self, i: usize) -> Arc<Dial> {
        let dials = self.dials();
        dials[i % dials.len()].clone()
    }

    /// The addresses dialled now, in order.
    pub(super) fn addresses(&self) -> Vec<String> {
        self.dials().iter().map(|d| d.address.clone()).collect()
    }

    /// The index of `address`, if it is one of ours.
    pub(super) fn index_of(&self, address: &str) -> Option<usize> {
        self.dials().iter().position(|d| d.address == address)
    }

    /// Resolves the names among the sources again when they were never
    /// resolved or [`RESOLVE_EVERY`] has passed (`now` on the client's
    /// clock), one resolution at a time: a call that finds one running
    /// goes on with the endpoints held. A name that does not answer keeps
    /// the addresses it gave last. Nothing to do without names.
    pub(super) async fn refresh(&self, now: Duration) {
        if !self.has_names {
            return;
        }
        let Ok(mut resolved) = self.resolved.try_lock() else {
            return;
        };
        if resolved
            .at
            .is_some_and(|at| now.saturating_sub(at) < RESOLVE_EVERY)
        {
            return;
        }
        resolved.at = Some(now);
        for (source, last) in self.sources.iter().zip(resolved.per_source.iter_mut()) {
            if let Some(got) = source.resolve().await {
                *last = got;
            }
        }
        let addresses = resolved.per_source.concat();
        let held = self.dials();
        let dials = match merge(&held, addresses, &self.make) {
            Ok(d) => d,
            Err(e) => {
                tracing::warn!(error = %e, "control plane endpoints not changed");
                return;
            }
        };
        let same = dials.len() == held.len()
            && dials
                .iter()
                .zip(held.iter())
                .all(|(a, b)| a.address == b.address);
        if same || dials.is_empty() {
            return;
        }
        tracing::info!(endpoints = ?dials.iter().map(|d| d.address.as_str()).collect::<Vec<_>>(), "control plane endpoints resolved");
        // Unary calls stay on the replica they were on, if it is still one.
        let current = held
            .get(self.current.load(Ordering::Relaxed) % held.len())
            .and_then(|d| dials.iter().position(|n| n.address == d.address))
            .unwrap_or(0);
        *self.dials.write().unwrap_or_else(|e| e.into_inner()) = Arc::new(dials);
        self.current.store(current, Ordering::Relaxed);
    }

    /// From `from` round the ring, the first endpoint not avoided at `now`;
    /// when every one is, the one whose mark ends first.
    fn usable_from(&self, from: usize, now: Duration) -> usize {
        let dials = self.dials();
        let (n, now) = (dials.len(), ms(now));
        let ring = (0..n).map(|k| (from + k) % n);
        ring.clone()
            .find(|&i| dials[i].avoided_until() <= now)
            .or_else(|| ring.min_by_key(|&i| dials[i].avoided_until()))
            .unwrap_or(0)
    }

    /// Where a unary call starts: the current endpoint, or past it when it
    /// is avoided (which makes the one chosen current).
    pub(super) fn for_call(&self, now: Duration) -> usize {
        let current = self.current.load(Ordering::Relaxed) % self.len();
        let i = self.usable_from(current, now);
        if i != current {
            self.current.store(i, Ordering::Relaxed);
        }
        i
    }

    /// Where the next watch opens first: the next of the rotation, past
    /// avoided endpoints.
    pub(super) fn for_watch(&self, now: Duration) -> usize {
        let k = self.next_watch.fetch_add(1, Ordering::Relaxed) % self.len();
        self.usable_from(k, now)
    }

    /// After endpoint `failed` gave no answer: the next one not avoided,
    /// made current so later calls go there too. With one endpoint, that
    /// one.
    pub(super) fn after_failure(&self, failed: usize, now: Duration) -> usize {
        let dials = self.dials();
        let n = dials.len();
        if n == 1 {
            return 0;
        }
        let next = self.usable_from((failed + 1) % n, now);
        // `failed` itself only when every other one is avoided longer.
        let _ =
            self.current
                .compare_exchange(failed % n, next, Ordering::Relaxed, Ordering::Relaxed);
        tracing::debug!(failed = %dials[failed % n].address, next = %dials[next % n].address, "control plane endpoint did not answer; trying the next");
        next
    }

    /// Avoids endpoint `i` until `until` on the client's clock.
    pub(super) fn avoid(&self, i: usize, until: Duration) {
        self.get(i)
            .avoid_until_ms
            .fetch_max(ms(until), Ordering::Relaxed);
    }
}

/// The dials for `addresses` (duplicates once, in order): a held one kept
/// as it is (its connection, its avoid mark), others built by `make`.
fn merge(
    held: &[Arc<Dial>],
    addresses: Vec<String>,
    make: &MakeEndpoint,
) -> Result<Vec<Arc<Dial>>, ClientError> {
    let mut out: Vec<Arc<Dial>> = Vec::with_capacity(addresses.len());
    for address in addresses {
        if out.iter().any(|d| d.address == address) {
            continue;
        }
        let dial = match held.iter().find(|d| d.address == address) {
            Some(d) => d.clone(),
            None => Arc::new(Dial::new(address.clone(), make(&address)?)),
        };
        out.push(dial);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn make() -> MakeEndpoint {
        Box::new(|a: &str| {
            Endpoint::from_shared(a.to_string()).map_err(|e| ClientError::Config(e.to_string()))
        })
    }

    fn endpoints(n: usize, watch_start: Option<usize>) -> Endpoints {
        let sources = (0..n)
            .map(|i| Source::Fixed(format!("http://10.0.0.{i}:7400")))
            .collect();
        Endpoints::new(sources, make(), watch_start).expect("endpoints")
    }

    #[tokio::test]
    async fn a_name_is_dialled_as_itself_until_it_resolves_then_as_its_addresses() {
        let sources = vec![
            Source::Fixed("http://10.0.0.9:7400".into()),
            Source::parse("dns+http://localhost:7400").expect("parses"),
        ];
        let e = Endpoints::new(sources, make(), Some(0)).expect("endpoints");
        assert_eq!(
            e.addresses(),
            ["http://10.0.0.9:7400", "http://localhost:7400"]
        );
        let fixed = e.get(0);
        e.avoid(0, T0 + STOPPING_AVOID);
        e.refresh(T0).await;
        let got = e.addresses();
        assert_eq!(got[0], "http://10.0.0.9:7400");
        assert!(got.len() >= 2, "{got:?}");
        assert!(
            got[1..]
                .iter()
                .all(|a| a == "http://127.0.0.1:7400" || a == "http://[::1]:7400"),
            "localhost's addresses replace the name: {got:?}"
        );
        assert!(
            Arc::ptr_eq(&fixed, &e.get(0)),
            "an address kept keeps its dial (connection, avoid mark)"
        );
        assert_eq!(e.for_call(T0), 1, "its avoid mark too");
        // Not due again before RESOLVE_EVERY: the same set, untouched.
        let before = e.get(1);
        e.refresh(T0 + RESOLVE_EVERY / 2).await;
        assert!(Arc::ptr_eq(&before, &e.get(1)));
    }

    #[tokio::test]
    async fn a_name_that_stops_resolving_keeps_its_last_addresses() {
        let sources = vec![Source::parse("dns+http://agentmesh-cp.invalid:7400").expect("parses")];
        let e = Endpoints::new(sources, make(), Some(0)).expect("endpoints");
        e.refresh(T0).await;
        assert_eq!(
            e.addresses(),
            ["http://agentmesh-cp.invalid:7400"],
            "never resolved: still the name itself, never nothing"
        );
    }

    #[test]
    fn merge_keeps_held_dials_drops_gone_ones_and_duplicates() {
        let held = vec![
            Arc::new(Dial::new(
                "http://a:1".into(),
                make()("http://a:1").expect("url"),
            )),
            Arc::new(Dial::new(
                "http://b:1".into(),
                make()("http://b:1").expect("url"),
            )),
        ];
        let out = merge(
            &held,
            vec![
                "http://b:1".into(),
                "http://c:1".into(),
                "http://b:1".into(),
            ],
            &make(),
        )
        .expect("merged");
        let names: Vec<&str> = out.iter().map(|d| d.address.as_str()).collect();
        assert_eq!(names, ["http://b:1", "http://c:1"]);
        assert!(Arc::ptr_eq(&out[0], &held[1]));
    }

    const T0: Duration = Duration::from_secs(100);

    #[test]
    fn watches_rotate_from_the_clients_start_whatever_they_were_on() {
        let e = endpoints(3, Some(1));
        let firsts: Vec<_> = (0..6).map(|_| e.for_watch(T0)).collect();
        assert_eq!(firsts, [1, 2, 0, 1, 2, 0]);
        // Six clients starting 0..6 spread their k-th watches evenly, for
        // every k: two on each of three endpoints.
        for k in 0..4 {
            let mut on = [0; 3];
            for start in 0..6 {
                let e = endpoints(3, Some(start));
                for _ in 0..k {
                    e.for_watch(T0);
                }
                on[e.for_watch(T0)] += 1;
            }
            assert_eq!(on, [2, 2, 2], "watch {k}");
        }
    }

    #[test]
    fn a_stopping_endpoint_is_skipped_until_its_mark_ends() {
        let e = endpoints(3, Some(0));
        e.avoid(0, T0 + STOPPING_AVOID);
        assert_eq!(e.for_watch(T0), 1, "the rotation's 0 is avoided");
        assert_eq!(e.for_call(T0), 1, "calls leave it too");
        assert_eq!(e.after_failure(1, T0), 2);
        assert_eq!(e.for_call(T0), 2, "the next is current now");
        // Marks end.
        assert_eq!(e.for_watch(T0 + STOPPING_AVOID), 1);
        assert_eq!(e.for_watch(T0 + STOPPING_AVOID), 2);
        assert_eq!(e.for_watch(T0 + STOPPING_AVOID), 0);
        // All avoided: the one whose mark ends first.
        e.avoid(0, T0 + Duration::from_secs(30));
        e.avoid(1, T0 + Duration::from_secs(20));
        e.avoid(2, T0 + Duration::from_secs(40));
        assert_eq!(e.for_call(T0), 1);
        assert_eq!(e.for_watch(T0), 1);
        // A mark is never shortened by a later, shorter one.
        e.avoid(2, T0);
        assert_eq!(e.usable_from(2, T0 + Duration::from_secs(35)), 0);
    }

    #[test]
    fn one_endpoint_is_always_the_one() {
        let e = endpoints(1, None);
        e.avoid(0, T0 + STOPPING_AVOID);
        assert_eq!(
            (e.for_call(T0), e.for_watch(T0), e.after_failure(0, T0)),
            (0, 0, 0)
        );
    }
}
