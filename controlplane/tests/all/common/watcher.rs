//! A router-like watcher: a real [`Client`] over several replicas holding
//! one Watch the way a router does (`router/src/policy/watch.rs`): after a
//! move it watches again at once (after [`move_jitter`]), after an error
//! it backs off. It records every open (where, in how many attempts),
//! every open that failed, every end, and the policy version of the last
//! event, for tests to read with a bounded wait.

use std::{
    sync::{Arc, Mutex},
    time::Duration,
};

use agentmesh_controlplane::client::{Client, WatchMove, move_jitter};
use agentmesh_proto::{identity::Keypair, pb::credential::Credential, policy::peek_version};

/// Bounds every wait on a watcher.
pub const WAIT: Duration = Duration::from_secs(60);

/// A watch opened.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Opened {
    /// The endpoint that serves it.
    pub endpoint: String,
    /// Attempts the open took (1: the first endpoint tried served it).
    pub attempts: u32,
}

/// What a watcher saw so far.
#[derive(Debug, Default, Clone)]
pub struct Seen {
    pub opens: Vec<Opened>,
    /// Opens that failed (the client's retry budget spent): an error a
    /// router would have seen.
    pub failed_opens: Vec<String>,
    /// Ends that asked for a move.
    pub moves: Vec<WatchMove>,
    /// Every other end: an error a router would have backed off from.
    pub errors: Vec<String>,
    /// The policy version the last event carried.
    pub policy_version: u64,
}

/// The watcher's task; aborted on drop.
pub struct Watcher {
    seen: Arc<Mutex<Seen>>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Watcher {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Watcher {
    /// Starts holding a watch with `cred` (a router's) through `client`.
    pub fn spawn(client: Client, cred: Credential, key: Keypair) -> Self {
        let seen = Arc::new(Mutex::new(Seen::default()));
        let task = tokio::spawn(hold(client, cred, key, seen.clone()));
        Self { seen, task }
    }

    /// A copy of what it saw so far.
    pub fn seen(&self) -> Seen {
        self.seen.lock().expect("not poisoned").clone()
    }

    /// Waits (bounded by [`WAIT`]) until `done` holds of what it saw.
    pub async fn until(&self, what: &str, done: impl Fn(&Seen) -> bool) -> Seen {
        let deadline = tokio::time::Instant::now() + WAIT;
        loop {
            let seen = self.seen();
            if done(&seen) {
                return seen;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "{what} not within {WAIT:?}: {seen:?}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

async fn hold(client: Client, cred: Credential, key: Keypair, seen: Arc<Mutex<Seen>>) {
    let note = |f: &dyn Fn(&mut Seen)| f(&mut seen.lock().expect("not poisoned"));
    loop {
        let mut w = match client.open_watch(&cred, &key).await {
            Ok(w) => w,
            Err(e) => {
                note(&|s| s.failed_opens.push(e.to_string()));
                tokio::time::sleep(Duration::from_millis(500)).await;
                continue;
            }
        };
        let opened = Opened {
            endpoint: w.endpoint.clone(),
            attempts: w.attempts,
        };
        note(&|s| s.opens.push(opened.clone()));
        let end = loop {
            match w.stream.message().await {
                Ok(Some(ev)) => {
                    if let Some((_, v)) = ev.policy.as_ref().and_then(peek_version) {
                        note(&|s| s.policy_version = v);
                    }
                }
                Ok(None) => break Err("the stream ended without a status".to_string()),
                Err(status) => {
                    break client
                        .watch_ended(&w.endpoint, &status)
                        .ok_or_else(|| format!("{status:?}"));
                }
            }
        };
        match end {
            Ok(moved) => {
                note(&|s| s.moves.push(moved));
                tokio::time::sleep(move_jitter()).await;
            }
            Err(e) => {
                note(&|s| s.errors.push(e.clone()));
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
        }
    }
}
