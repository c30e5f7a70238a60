//! Enrollments and refreshes sent to the replicas without pause while a
//! test kills them: each round enrolls a fresh key through a client of
//! every endpoint and refreshes the credential it got (the two calls may
//! reach different replicas). The client retries within its budget, as
//! members' clients do; what reaches the caller after that is an error the
//! test counts.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use agentmesh_controlplane::client::Client;
use agentmesh_proto::pb::credential::Credential;
use libp2p::identity::Keypair;
use tokio::sync::watch;

/// Pause between rounds: about 4 enrollments a second, within the
/// enrollment budget the replicas share (see the test's flags).
const PAUSE: Duration = Duration::from_millis(250);

/// What the load saw.
#[derive(Default)]
pub(super) struct Counts {
    pub(super) enrolled: AtomicU64,
    pub(super) refreshed: AtomicU64,
    pub(super) errors: AtomicU64,
}

/// The running load; [`Load::stop`] ends it.
pub(super) struct Load {
    pub(super) counts: Arc<Counts>,
    stop: watch::Sender<bool>,
    task: tokio::task::JoinHandle<Outcome>,
}

/// What the load ends with.
pub(super) struct Outcome {
    /// Every error that reached the caller.
    pub(super) errors: Vec<String>,
    /// Each acknowledged enrollment's key and the credential its refresh
    /// returned: writes the control plane said it made.
    pub(super) acked: Vec<(Keypair, Credential)>,
}

impl Load {
    /// Starts enrolling with `token` through `client`.
    pub(super) fn start(client: Client, token: String) -> Self {
        let counts = Arc::new(Counts::default());
        let (stop, stopped) = watch::channel(false);
        let task = tokio::spawn(rounds(client, token, counts.clone(), stopped));
        Self { counts, stop, task }
    }

    /// Enrollments that succeeded so far.
    pub(super) fn enrolled(&self) -> u64 {
        self.counts.enrolled.load(Ordering::Relaxed)
    }

    /// Ends the load after the round under way.
    pub(super) async fn stop(self) -> Outcome {
        let _ = self.stop.send(true);
        tokio::time::timeout(agentmesh_testkit::DEADLINE, self.task)
            .await
            .expect("the load ends within its round's budget")
            .expect("load task")
    }
}

async fn rounds(
    client: Client,
    token: String,
    counts: Arc<Counts>,
    mut stopped: watch::Receiver<bool>,
) -> Outcome {
    let mut errors = Vec::new();
    let mut acked = Vec::new();
    while !*stopped.borrow() {
        let key = Keypair::generate_ed25519();
        match client.enroll(&token, &key).await {
            Ok(resp) => {
                counts.enrolled.fetch_add(1, Ordering::Relaxed);
                let cred = resp.credential.expect("an enrollment carries a credential");
                match client.refresh(&cred, &key).await {
                    Ok(resp) => {
                        counts.refreshed.fetch_add(1, Ordering::Relaxed);
                        let cred = resp.credential.expect("a refresh carries a credential");
                        acked.push((key, cred));
                    }
                    Err(e) => errors.push(format!("refresh: {e}")),
                }
            }
            Err(e) => errors.push(format!("enroll: {e}")),
        }
        counts.errors.store(errors.len() as u64, Ordering::Relaxed);
        tokio::select! {
            _ = stopped.changed() => {}
            _ = tokio::time::sleep(PAUSE) => {}
        }
    }
    Outcome { errors, acked }
}
