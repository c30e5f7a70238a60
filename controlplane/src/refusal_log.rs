//! Logging refusals at most once a minute per source.
//!
//! A flood is refused thousands of times a second; logging each refusal
//! would turn it into a flood of the log. Every refusal is counted in a
//! metric; the log names each refused source at most once per
//! [`LOG_EVERY`], with what refused it. The table of sources is a bounded
//! [`SourceMap`] (sources that do not fit share one line for the overflow
//! source), and entries leave through a queue once their minute is over,
//! never by a scan.

use std::{
    collections::VecDeque,
    net::IpAddr,
    sync::{Arc, Mutex},
    time::Duration,
};

use agentmesh_fair::{SourceKey, SourceMap};

use crate::clock::SharedClock;

/// Shortest interval between two log lines about one source.
pub const LOG_EVERY: Duration = Duration::from_secs(60);

/// Per-source log gate, shared by every limit that refuses (cloning shares it).
#[derive(Debug, Clone)]
pub struct RefusalLog {
    inner: Arc<Mutex<Inner>>,
    clock: SharedClock,
}

#[derive(Debug)]
struct Inner {
    /// When each source was last logged.
    last: SourceMap<Option<Duration>>,
    /// (last logged, source), oldest first, one item per entry.
    order: VecDeque<(Duration, SourceKey)>,
}

impl RefusalLog {
    /// A gate for at most `max_sources` sources, IPv6 keyed at `ipv6_prefix_len`.
    pub fn new(max_sources: usize, ipv6_prefix_len: u8, clock: SharedClock) -> Self {
        Self {
            inner: Arc::new(Mutex::new(Inner {
                last: SourceMap::new(max_sources, ipv6_prefix_len),
                order: VecDeque::new(),
            })),
            clock,
        }
    }

    /// The source of `ip` if a refusal of it should be logged now (its last
    /// line is at least [`LOG_EVERY`] old), marking it logged.
    pub fn due(&self, ip: IpAddr) -> Option<SourceKey> {
        let now = self.clock.now();
        let mut guard = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        let st = &mut *guard;
        st.expire(now);
        let (key, last) = st.last.entry(ip);
        match *last {
            Some(at) if now < at + LOG_EVERY => None,
            Some(_) => {
                *last = Some(now);
                Some(key)
            }
            None => {
                *last = Some(now);
                st.order.push_back((now, key));
                Some(key)
            }
        }
    }

    /// Sources remembered now.
    pub fn tracked(&self) -> usize {
        self.inner
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .last
            .len()
    }
}

impl Inner {
    fn expire(&mut self, now: Duration) {
        for _ in 0..2 {
            let Some(&(at, key)) = self.order.front() else {
                return;
            };
            if now < at + LOG_EVERY {
                return;
            }
            self.order.pop_front();
            match self.last.get(&key) {
                Some(Some(l)) if now < *l + LOG_EVERY => self.order.push_back((*l, key)),
                _ => {
                    self.last.remove(&key);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::{Clock, SleepFuture};

    #[derive(Debug, Default)]
    struct Fixed(std::sync::Mutex<Duration>);

    impl Clock for Fixed {
        fn now(&self) -> Duration {
            *self.0.lock().expect("lock")
        }
        fn sleep(&self, _: Duration) -> SleepFuture {
            Box::pin(std::future::ready(()))
        }
    }

    #[test]
    fn once_a_minute_per_source_and_bounded() {
        let clock = Arc::new(Fixed::default());
        let log = RefusalLog::new(16, 64, clock.clone());
        let a = IpAddr::from([10, 0, 0, 1]);
        assert!(log.due(a).is_some());
        assert!(log.due(a).is_none());
        assert!(log.due(IpAddr::from([10, 0, 0, 2])).is_some(), "per source");
        *clock.0.lock().expect("lock") = Duration::from_secs(59);
        assert!(log.due(a).is_none());
        *clock.0.lock().expect("lock") = Duration::from_secs(60);
        assert_eq!(log.due(a).map(|k| k.to_string()), Some("10.0.0.1".into()));
        for i in 0..1_000u16 {
            log.due(IpAddr::from([10, 1, (i >> 8) as u8, i as u8]));
        }
        assert!(log.tracked() <= 17, "{}", log.tracked());
        // Two minutes on, the entries leave as refusals keep coming.
        *clock.0.lock().expect("lock") = Duration::from_secs(200);
        for _ in 0..20 {
            log.due(a);
        }
        assert_eq!(log.tracked(), 1);
    }
}
