//! Services this node's calls looked up recently, for `agentmesh-node
//! services`: a router answers lookups by name and has no mesh-wide list,
//! so what a member "sees" is what it exposes, forwards and has looked up.
//! Bounded ([`MAX_SEEN`] names, the oldest forgotten first).

use std::collections::HashMap;

use parking_lot::Mutex;
use tokio::time::Instant;

/// Most names remembered.
pub(crate) const MAX_SEEN: usize = 256;

/// Names looked up, with the providers found and when.
#[derive(Debug, Default)]
pub(crate) struct Seen {
    by_name: Mutex<HashMap<String, (usize, Instant)>>,
}

impl Seen {
    /// A lookup of `name` at `now` found `providers` verified providers.
    pub(crate) fn looked_up(&self, name: &str, providers: usize, now: Instant) {
        let mut m = self.by_name.lock();
        if !m.contains_key(name)
            && m.len() >= MAX_SEEN
            && let Some(oldest) = m
                .iter()
                .min_by_key(|(_, (_, at))| *at)
                .map(|(k, _)| k.clone())
        {
            m.remove(&oldest);
        }
        m.insert(name.to_string(), (providers, now));
    }

    /// Every name remembered, newest lookup first: (name, providers, when).
    pub(crate) fn list(&self) -> Vec<(String, usize, Instant)> {
        let mut v: Vec<_> = self
            .by_name
            .lock()
            .iter()
            .map(|(k, (n, at))| (k.clone(), *n, *at))
            .collect();
        v.sort_by(|a, b| b.2.cmp(&a.2).then_with(|| a.0.cmp(&b.0)));
        v
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn the_newest_lookup_wins_and_the_oldest_name_goes_first() {
        let s = Seen::default();
        let t0 = Instant::now();
        s.looked_up("a", 2, t0);
        s.looked_up("b", 0, t0 + Duration::from_secs(1));
        s.looked_up("a", 3, t0 + Duration::from_secs(2));
        let names: Vec<_> = s.list().into_iter().map(|(n, p, _)| (n, p)).collect();
        assert_eq!(names, vec![("a".to_string(), 3), ("b".to_string(), 0)]);
        for i in 0..MAX_SEEN + 10 {
            s.looked_up(&format!("s{i}"), 1, t0 + Duration::from_secs(10 + i as u64));
        }
        let list = s.list();
        assert_eq!(list.len(), MAX_SEEN);
        assert!(!list.iter().any(|(n, _, _)| n == "a" || n == "b"));
        assert_eq!(list[0].0, format!("s{}", MAX_SEEN + 9));
    }
}
