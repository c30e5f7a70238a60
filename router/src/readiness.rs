//! Readiness: the router is ready once it listens, has an external address,
//! holds the control plane's keys and had a lease accepted; a drain makes it
//! unready for good. Once every condition held it stays ready through a
//! control-plane outage (only draining counts afterwards), so an outage does
//! not take a working router out of service.

use std::borrow::Cow;

use parking_lot::Mutex;
use prometheus_client::metrics::gauge::Gauge;
use tokio::sync::watch;

/// The parts of readiness.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Readiness {
    pub(crate) listening: bool,
    pub(crate) external_addr: bool,
    pub(crate) keys: bool,
    pub(crate) lease_accepted: bool,
    pub(crate) draining: bool,
    /// Set once every condition held; afterwards only draining matters, so a
    /// control-plane outage does not make a ready router unready.
    pub(crate) latched: bool,
    /// A long-lived task that stopped outside a drain or shutdown (set by
    /// the supervisor): unready for good.
    pub(crate) failed_task: Option<&'static str>,
}

impl Readiness {
    /// Whether the router is ready now.
    pub(crate) fn is_ready(&self) -> bool {
        self.latched && !self.draining && self.failed_task.is_none()
    }

    /// Why the router is not ready (for `/readyz`), or `None` if it is.
    pub(crate) fn reason(&self) -> Option<Cow<'static, str>> {
        if let Some(task) = self.failed_task {
            return Some(format!("router task {task} stopped").into());
        }
        if self.draining {
            return Some("draining".into());
        }
        if self.latched {
            return None;
        }
        let why = if !self.listening {
            "not listening"
        } else if !self.external_addr {
            "no external address (set --external-addr)"
        } else if !self.keys {
            "no control-plane keys yet"
        } else if !self.lease_accepted {
            "no lease accepted yet"
        } else {
            return None;
        };
        Some(why.into())
    }
}

/// Readiness as the router's tasks share it: the parts, the watch channel
/// `RouterHandle::ready` hands out and the `agentmesh_router_ready` gauge.
#[derive(Debug)]
pub(crate) struct ReadinessState {
    parts: Mutex<Readiness>,
    tx: watch::Sender<bool>,
    gauge: Gauge,
}

impl ReadinessState {
    /// Not ready; `gauge` mirrors readiness.
    pub(crate) fn new(gauge: Gauge) -> Self {
        Self {
            parts: Mutex::new(Readiness::default()),
            tx: watch::channel(false).0,
            gauge,
        }
    }

    /// Updates readiness with `f` and publishes the result.
    pub(crate) fn update(&self, f: impl FnOnce(&mut Readiness)) {
        let ready = {
            let mut r = self.parts.lock();
            f(&mut r);
            if r.listening
                && r.external_addr
                && r.keys
                && r.lease_accepted
                && !r.draining
                && r.failed_task.is_none()
            {
                r.latched = true;
            }
            r.is_ready()
        };
        self.gauge.set(i64::from(ready));
        self.tx.send_if_modified(|v| {
            let changed = *v != ready;
            *v = ready;
            changed
        });
    }

    /// A copy of the readiness parts.
    pub(crate) fn get(&self) -> Readiness {
        *self.parts.lock()
    }

    /// Readiness as a watch channel.
    pub(crate) fn watch(&self) -> watch::Receiver<bool> {
        self.tx.subscribe()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ready_once_every_part_held_until_a_drain() {
        let r = ReadinessState::new(Gauge::default());
        let rx = r.watch();
        r.update(|p| {
            p.listening = true;
            p.external_addr = true;
            p.keys = true;
        });
        assert_eq!(r.get().reason().as_deref(), Some("no lease accepted yet"));
        assert!(!*rx.borrow());
        r.update(|p| p.lease_accepted = true);
        assert!(*rx.borrow() && r.get().reason().is_none());
        r.update(|p| p.keys = false);
        assert!(*rx.borrow(), "latched: a lost part does not unready it");
        r.update(|p| p.draining = true);
        assert!(!*rx.borrow());
        assert_eq!(r.get().reason().as_deref(), Some("draining"));
    }
}
