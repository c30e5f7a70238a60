//! A fleet meets the limiter: a real limiter behind a real tonic server on
//! loopback, N concurrent real clients, and one simulated clock shared by
//! the server's limiter and the clients' backoff, so minutes of retries run
//! in well under a second of wall time. On both backends: every admitted
//! caller's enrollment is a transaction in the database.

use std::{
    collections::{BTreeMap, HashMap},
    sync::{Arc, Mutex},
    time::Duration,
};

use agentmesh_controlplane::{
    Client, ClientConfig, ClientError,
    clock::{Clock, SleepFuture},
    spawn_with_clock,
};
use agentmesh_proto::{
    identity::Keypair,
    pb::credential::{Role, TokenKind},
};
use tokio::sync::oneshot;

use crate::common::{self, TestDb};

/// Simulated time: it stands still while any caller is working (in an RPC)
/// and jumps to the earliest wake-up once every caller sleeps or is done.
#[derive(Debug)]
struct SimClock {
    state: Mutex<SimState>,
}

#[derive(Debug, Default)]
struct SimState {
    now: Duration,
    participants: usize,
    done: usize,
    seq: u64,
    sleepers: BTreeMap<(Duration, u64), oneshot::Sender<()>>,
    /// Every wake-up instant handed out, with how many callers it woke.
    wakeups: HashMap<Duration, usize>,
}

impl SimClock {
    fn new(participants: usize) -> Arc<Self> {
        Arc::new(Self {
            state: Mutex::new(SimState {
                participants,
                ..SimState::default()
            }),
        })
    }

    fn finish(&self) {
        let mut s = self.state.lock().expect("lock");
        s.done += 1;
        Self::advance(&mut s);
    }

    fn advance(s: &mut SimState) {
        if s.sleepers.is_empty() || s.sleepers.len() + s.done < s.participants {
            return;
        }
        let Some((&(at, _), _)) = s.sleepers.iter().next() else {
            return;
        };
        s.now = at;
        while let Some(entry) = s.sleepers.first_entry() {
            if entry.key().0 != at {
                break;
            }
            let _ = entry.remove().send(());
            *s.wakeups.entry(at).or_default() += 1;
        }
    }
}

impl Clock for SimClock {
    fn now(&self) -> Duration {
        self.state.lock().expect("lock").now
    }

    fn sleep(&self, dur: Duration) -> SleepFuture {
        let (tx, rx) = oneshot::channel();
        {
            let mut s = self.state.lock().expect("lock");
            let at = s.now + dur;
            s.seq += 1;
            let seq = s.seq;
            s.sleepers.insert((at, seq), tx);
            Self::advance(&mut s);
        }
        Box::pin(async move {
            let _ = rx.await;
        })
    }
}

struct Outcome {
    admitted_at: Vec<Duration>,
    exhausted: Vec<(tonic::Status, u32, Duration)>,
    wakeups: HashMap<Duration, usize>,
    /// Enroll RPCs the limiter refused (the server's own counter).
    refused: f64,
    /// Of those, how many were told the cap instead of a slot.
    capped: f64,
}

/// One fleet against a control plane on `db` (the fleets of one test share
/// it, one after another: each mints its own token and enrolls new keys).
async fn run_fleet(db: &TestDb, n: usize, rate: u32, burst: u32, budget: Duration) -> Outcome {
    let clock = SimClock::new(n);
    let mut config = db.config();
    config.enroll_rate_per_sec = rate;
    config.enroll_burst = burst;
    let h = spawn_with_clock(config, clock.clone())
        .await
        .expect("control plane starts");
    let token = common::token(&h, TokenKind::Bootstrap, Role::Member, &[], n as u32).await;
    let client = Client::with_clock(
        ClientConfig {
            url: h.public_url().to_string(),
            retry_budget: budget,
            rpc_timeout: Duration::from_secs(30),
            ca_pem: None,
        },
        clock.clone(),
    )
    .expect("client");
    let mut callers = tokio::task::JoinSet::new();
    for _ in 0..n {
        let (client, clock, token) = (client.clone(), clock.clone(), token.clone());
        callers.spawn(async move {
            let key = Keypair::generate_ed25519();
            let r = client.enroll(&token, &key).await;
            let at = clock.now();
            clock.finish();
            (r, at)
        });
    }
    let mut out = Outcome {
        admitted_at: Vec::new(),
        exhausted: Vec::new(),
        wakeups: HashMap::new(),
        refused: 0.0,
        capped: 0.0,
    };
    let all = async {
        while let Some(joined) = callers.join_next().await {
            match joined.expect("caller task") {
                (Ok(resp), at) => {
                    assert!(resp.credential.is_some());
                    out.admitted_at.push(at);
                }
                (
                    Err(ClientError::BudgetExhausted {
                        last,
                        attempts,
                        elapsed,
                    }),
                    _,
                ) => out.exhausted.push((last, attempts, elapsed)),
                (Err(other), _) => panic!("unexpected error: {other}"),
            }
        }
    };
    tokio::time::timeout(Duration::from_secs(900), all)
        .await
        .expect("fleet finishes within 900 s of wall time");
    out.wakeups = std::mem::take(&mut clock.state.lock().expect("lock").wakeups);
    let m = common::metrics(&h).await;
    out.refused = common::metric(
        &m,
        "agentmesh_control_plane_limiter_refusals_total{limiter=\"enroll\"}",
    )
    .expect("refusal counter");
    out.capped = common::metric(
        &m,
        "agentmesh_control_plane_retry_after_capped_total{limiter=\"enroll\"}",
    )
    .expect("capped counter");
    let histogram_count = common::metric(
        &m,
        "agentmesh_control_plane_retry_after_seconds_count{limiter=\"enroll\"}",
    )
    .expect("retry-after histogram");
    assert_eq!(
        histogram_count, out.refused,
        "every refusal's retry-after observed"
    );
    h.shutdown().await;
    out
}

async fn fleet_through_the_limiter(db: TestDb) {
    let (rate, burst, budget) = (10u32, 20u32, Duration::from_secs(10));
    let capacity = burst as usize + rate as usize * budget.as_secs() as usize; // 120
    // (members, expected admitted)
    let table = [
        (1, 1),
        (burst as usize, burst as usize),
        (60, 60),
        (capacity, capacity),
        (capacity + 80, capacity),
    ];
    run_table(&db, rate, burst, budget, &table).await;
}

/// A longer budget and a bigger fleet: 300 members into 20 + 10 x 30 s.
async fn a_bigger_fleet_over_a_longer_budget(db: TestDb) {
    let (rate, burst, budget) = (10u32, 20u32, Duration::from_secs(30));
    run_table(&db, rate, burst, budget, &[(300, 300), (400, 320)]).await;
}

/// The ladder's burst (ladder/RESULTS.md): 1,500 joiners at one instant
/// against the default limiter (10/s, burst 20, retry-after capped at 60 s)
/// with the client's default 180 s budget. Before retry-after was assigned
/// from the virtual queue this cost ~48 refused RPCs per joiner.
async fn a_burst_of_1500_is_spread_and_fits_the_default_budget(db: TestDb) {
    let defaults = agentmesh_controlplane::Config::default();
    let (rate, burst) = (defaults.enroll_rate_per_sec, defaults.enroll_burst);
    let cap = defaults.enroll_max_retry_after_secs;
    let budget = agentmesh_controlplane::client::DEFAULT_RETRY_BUDGET;
    let n = 1500usize;
    let out = run_fleet(&db, n, rate, burst, budget).await;
    let last = out.admitted_at.iter().max().copied().unwrap_or_default();
    println!(
        "burst N={n} at {rate}/s (burst {burst}, cap {cap} s, budget {budget:?}): \
         {} enrolled, {} gave up, last in at {last:?}, {} refused RPCs ({:.2} per joiner), \
         {} told the cap",
        out.admitted_at.len(),
        out.exhausted.len(),
        out.refused,
        out.refused / n as f64,
        out.capped,
    );
    assert_eq!(out.admitted_at.len(), n, "everyone enrolled");
    assert!(out.exhausted.is_empty(), "nobody gave up");
    assert!(last <= budget, "the last one got in within the budget");
    assert!(
        out.refused <= 3.0 * n as f64,
        "{} refused RPCs for {n} joiners",
        out.refused
    );
    // Everyone refused at the first instant past the cap's slots was told
    // the cap: the cap bit, and its counter shows it.
    let beyond_cap = n as f64 - f64::from(burst) - f64::from(rate) * cap as f64;
    assert!(
        out.capped >= beyond_cap,
        "{} told the cap, expected at least {beyond_cap}",
        out.capped
    );
}

async fn run_table(db: &TestDb, rate: u32, burst: u32, budget: Duration, table: &[(usize, usize)]) {
    for &(n, expected) in table {
        let out = run_fleet(db, n, rate, burst, budget).await;
        assert_eq!(out.admitted_at.len(), expected, "N={n}: admitted");
        assert_eq!(out.exhausted.len(), n - expected, "N={n}: refused");
        // Never more than the limiter allows: by any instant t, at most
        // burst + rate * t admissions.
        let mut times = out.admitted_at.clone();
        times.sort();
        for (i, t) in times.iter().enumerate() {
            let cap = burst as f64 + rate as f64 * t.as_secs_f64() + 1e-9;
            assert!((i + 1) as f64 <= cap, "N={n}: {} admitted by {t:?}", i + 1);
            assert!(*t <= budget, "N={n}: admitted after the budget at {t:?}");
        }
        // Past the capacity, a caller gets the first refusal at the budget:
        // RESOURCE_EXHAUSTED with retry-after. The server told it a slot past
        // its budget, so it waited to the budget's end and tried once more.
        for (last, attempts, elapsed) in &out.exhausted {
            assert_eq!(last.code(), tonic::Code::ResourceExhausted, "{last:?}");
            assert!(
                agentmesh_controlplane::retry_after(last).is_some(),
                "retry-after set"
            );
            assert_eq!(*elapsed, budget);
            assert!(*attempts >= 2, "retried {attempts} times");
        }
        // Retries are spread, not in lockstep: apart from the budget's end
        // (where every caller still waiting makes its last attempt), no
        // instant wakes more than a few callers, and there are many instants.
        if n > burst as usize {
            let spread: Vec<_> = out.wakeups.iter().filter(|(t, _)| **t != budget).collect();
            let total: usize = spread.iter().map(|(_, c)| **c).sum();
            let at_budget = out.wakeups.get(&budget).copied().unwrap_or(0);
            let max_same = spread.iter().map(|(_, c)| **c).max().unwrap_or(0);
            assert!(
                max_same <= 2,
                "N={n}: {max_same} callers retried at one instant"
            );
            assert!(
                spread.len() * 10 >= total * 9,
                "N={n}: {} instants for {total} retries",
                spread.len()
            );
            assert!(
                total + at_budget >= n - burst as usize,
                "N={n}: every waiting caller retried"
            );
        }
        // Every refusal handed the caller a slot: nobody inside the capacity
        // was refused twice, so refusals stay within a caller each (the old
        // fixed ~1 s retry-after cost about one per caller per second).
        let refused_first = n.saturating_sub(burst as usize) as f64;
        let refused_again_at_budget = (n - expected) as f64;
        assert!(
            out.refused <= refused_first + refused_again_at_budget,
            "N={n}: {} refused RPCs",
            out.refused
        );
    }
}

on_both!(
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    fleet_through_the_limiter,
    a_bigger_fleet_over_a_longer_budget,
    a_burst_of_1500_is_spread_and_fits_the_default_budget,
);
