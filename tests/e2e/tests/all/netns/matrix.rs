//! The NAT matrix (`docs/direct.md`, "What each NAT kind gets"): which
//! path warm calls take between two members with `--direct=true`, over TCP
//! and over QUIC (`--direct-transport=quic`, one test each), for every pair
//! of places a member can be: a public host, or behind a NAT of each
//! testbed kind (`agentmesh_netns::nat`):
//!
//! - `public`: no NAT;
//! - `eim`: endpoint-independent mapping, address-and-port-dependent
//!   filtering (the common home router);
//! - `full-cone`: endpoint-independent mapping and filtering;
//! - `edm-pp`: endpoint-dependent mapping that keeps the port when it can,
//!   with a forced collision: another host behind the same NAT first
//!   holds the member's listening port towards both routers (the
//!   "squatter"), so the member's flows get a port per destination (without
//!   a collision this NAT is indistinguishable from `eim`; the testbed's
//!   own tests show both);
//! - `symmetric`: endpoint-dependent random mapping.
//!
//! Every ordered pair (caller's place, provider's place) is a cell of its
//! own, 25 in all, plus two members behind one `eim` NAT, once hairpinning
//! and once not:
//! the direction matters, since the caller dials the relayed connection
//! and the provider starts the punch (dcutr), dialing with the listener's
//! role. In each cell each member exposes a service and forwards to the
//! other's: the caller calls first (its first call opens the relayed
//! connection and the punch runs beside it), then the provider calls back
//! over the connections that exist. The paths are measured on warm calls:
//! calls made once the relayed connection has existed for [`WARM`] (a
//! definition of the measurement, not a wait for an event), read from the
//! calling member's `agentmesh_node_calls_by_path_total{path}`.
//!
//! [`EXPECTED`] was written down before the matrix ever ran, with the
//! reasons in [`REASONS`]; the test prints expected against observed for
//! every cell (and what each member's `status` says of its NAT, its punch
//! results and port-reuse counters) and then fails on any difference. No
//! cell is merged with another: all 27 run at once on one control plane
//! and two routers (two observations of every member's mapping), 54
//! members, 42 NATs, 10 squatters, about 115 namespaces, in 12 to 30 s on
//! two cores (the cells' set-up and warm waits overlap).
//!
//! Over QUIC the punch differs (the side dialling in the listener's role
//! sends random datagrams to open its NAT while the other's QUIC handshake
//! comes in; no simultaneous open) but what each NAT lets through does not:
//! [`EXPECTED`] holds for both, written down for QUIC before its first run
//! too. The `edm-pp` squatter then holds the port's UDP mappings.
//!
//! What the first runs found, both fixed in the node: calls a provider
//! made back over the caller's circuit counted as direct (an accepted
//! circuit's remote address names only the peer: `agentmesh-streams`
//! `ConnectionInfo::accepted`), and a public or full-cone caller to an
//! `eim` provider went relayed about half the time (the provider's punch
//! reached the caller's listening port first and the two listeners' handshake
//! hung: `transport/reuse.rs`, "A punch that lands on the listening
//! port").

use std::fmt::Write as _;
use std::net::SocketAddr;
use std::panic::AssertUnwindSafe;
use std::time::Duration;

use agentmesh_netns::{Host, NatKind};
use futures::FutureExt as _;
use tokio::time::Instant;

use super::support::*;

/// How long a relayed connection exists before calls on it count as warm.
const WARM: Duration = Duration::from_secs(2);
/// Warm calls per direction of a cell.
const WARM_CALLS: u32 = 3;

/// The transport of the members' direct connections.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Over {
    Tcp,
    Quic,
}

impl Over {
    fn name(self) -> &'static str {
        match self {
            Self::Tcp => "TCP",
            Self::Quic => "QUIC",
        }
    }

    /// Host names of its cells start with this: a member's logs say which
    /// matrix it was in.
    fn prefix(self) -> &'static str {
        match self {
            Self::Tcp => "m",
            Self::Quic => "q",
        }
    }

    fn spec(self, expose: &str, forward: &str) -> MemberSpec {
        match self {
            Self::Tcp => direct_spec(Some(expose), &[forward]),
            Self::Quic => direct_quic_spec(Some(expose), &[forward]),
        }
    }
}

/// Where a member of the matrix is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Side {
    Public,
    Behind(NatKind),
}

const SIDES: [Side; 5] = [
    Side::Public,
    Side::Behind(NatKind::EndpointIndependent),
    Side::Behind(NatKind::FullCone),
    Side::Behind(NatKind::EndpointDependentPortPreserving),
    Side::Behind(NatKind::EndpointDependent),
];

impl Side {
    fn name(self) -> &'static str {
        match self {
            Self::Public => "public",
            Self::Behind(k) => k.as_str(),
        }
    }

    /// What the member's `status` must say of its NAT once both routers
    /// observed it: one public port towards both routers, or two.
    fn classified(self) -> &'static str {
        match self {
            Self::Public => "endpoint_independent",
            Self::Behind(k) if k.endpoint_independent_mapping() => "endpoint_independent",
            // `edm-pp` here always has its port taken (the squatter).
            Self::Behind(_) => "endpoint_dependent",
        }
    }
}

/// The path of a call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Path {
    Direct,
    Relayed,
}

use Path::{Direct as D, Relayed as R};

/// The expected path of warm calls, written before running: row the
/// caller's place, column the provider's, both in [`SIDES`] order; the
/// provider's calls back take the same path (the same connections).
const EXPECTED: [[Path; 5]; 5] = [
    // public eim full-cone edm-pp symmetric   <- provider
    [D, D, D, D, D], // public caller
    [D, D, D, R, R], // eim
    [D, D, D, D, D], // full-cone
    [D, R, D, R, R], // edm-pp (port taken)
    [D, R, D, R, R], // symmetric
];

/// Two members behind one `eim` NAT that hairpins.
const HAIRPIN: Path = D;

/// Two members behind one `eim` NAT that does not hairpin.
const NO_HAIRPIN: Path = R;

/// Why, printed under the table.
const REASONS: &[&str] = &[
    "direct wherever both mappings are endpoint-independent (public hosts included: \
     a public host's mapping is itself): each side punches from the port its routers \
     observed; over TCP a simultaneous open passes both NATs, over QUIC the side \
     dialling in the listener's role sends datagrams that open its NAT while the \
     other's handshake comes in (one connection either way)",
    "with a public or full-cone side a punch may reach the other's listening port before \
     that side's own dial leaves: if it reaches the provider (whose dial takes the \
     listener's role) it is an ordinary inbound connection; if it reaches the caller, \
     the caller's dial finds its tuple taken and takes that connection over \
     (port_reuse_adopted), since upgraded as inbound it would pair two listeners",
    "an endpoint-dependent side (edm-pp whose port is taken, symmetric) never punches: its \
     routers see two ports, so the peer has no port to aim at; it asks the peer over the \
     relayed connection to take its dial instead (connection reversal) and dials the \
     address the peer's routers agree on: direct when that address takes an unsolicited \
     connection (public, full-cone: reversed / reversal_agreed), relayed behind eim \
     (its filtering drops the dial: reversal_failed) or when both sides are \
     endpoint-dependent (no address to give: reversal_refused / reversal_declined)",
    "hairpin: both behind one eim NAT on one listening port, so the second gets another \
     public port (one owner per port); the punch to each other's mapping is hairpinned \
     with the sender's own mapping as source",
    "no hairpin: the same two members behind a NAT that does not hairpin; each one's \
     punch is aimed at the NAT's own public address from inside, which the NAT does not \
     send back in, so the punch fails (counted failed once dcutr's attempts are spent, \
     then backed off) and the calls stay relayed (members offer only the address their routers observe, not a LAN one)",
];

/// One cell: two members, `a` calls `b` first.
#[derive(Debug, Clone, Copy)]
struct Cell {
    caller: Side,
    provider: Side,
    /// Both behind one `eim` NAT (the sides are then `eim`): whether it
    /// hairpins.
    shared: Option<bool>,
    expected: Path,
}

impl Cell {
    /// What the members' `status` must say of their NATs (caller, provider).
    fn classified(&self) -> [&'static str; 2] {
        if self.shared.is_some() {
            // The second of the two gets another public port towards both
            // routers: one owner per port, one mapping per socket.
            return ["endpoint_independent"; 2];
        }
        [self.caller.classified(), self.provider.classified()]
    }

    fn name(&self) -> String {
        format!(
            "{} -> {}{}",
            self.caller.name(),
            self.provider.name(),
            match self.shared {
                Some(true) => " (hairpin)",
                Some(false) => " (no hairpin)",
                None => "",
            }
        )
    }
}

/// What warm calls of one direction did.
#[derive(Debug, Clone, PartialEq)]
enum Seen {
    Path(Path),
    /// Some of each.
    Mixed {
        direct: f64,
        relayed: f64,
    },
    /// A warm call failed.
    Failed(String),
}

impl Seen {
    fn short(&self) -> String {
        match self {
            Self::Path(Path::Direct) => "D".into(),
            Self::Path(Path::Relayed) => "R".into(),
            Self::Mixed { direct, relayed } => format!("{direct}D+{relayed}R"),
            Self::Failed(_) => "FAIL".into(),
        }
    }
}

/// What a cell saw.
#[derive(Debug)]
struct Outcome {
    /// The NAT each member's `status` names (caller, provider).
    classified: [String; 2],
    forward: Seen,
    back: Seen,
    /// Each member's punch results and port-reuse fallbacks, at the end.
    punches: [String; 2],
    /// Each member's open direct connections after the warm calls: one
    /// punch (or reversal) makes exactly one, none on a relayed cell.
    direct_conns: [f64; 2],
    /// Directions whose first warm calls were mixed (a call raced the
    /// direct connection coming up) and were measured once more: what the
    /// first measurement saw.
    remeasured: Vec<String>,
    took: Duration,
}

impl Outcome {
    fn matches(&self, cell: &Cell) -> bool {
        let conns = match cell.expected {
            Path::Direct => 1.0,
            Path::Relayed => 0.0,
        };
        self.classified == cell.classified()
            && self.forward == Seen::Path(cell.expected)
            && self.back == Seen::Path(cell.expected)
            && self.direct_conns == [conns; 2]
    }
}

/// What holds a squatter's mappings open.
enum Squat {
    /// The connections (held until dropped).
    Tcp(#[allow(dead_code)] Vec<std::net::TcpStream>),
    /// The socket, and the task sending on it.
    Udp(tokio::task::JoinHandle<()>),
}

impl Drop for Squat {
    fn drop(&mut self) {
        if let Self::Udp(task) = self {
            task.abort();
        }
    }
}

/// Holds `LISTEN_PORT`'s public mapping towards every router from `host`
/// (behind the member's NAT): TCP connections from that port, kept open;
/// or over QUIC a UDP socket on that port sending a datagram to each
/// router's port every 2 s (the routers drop them; the NAT keeps the
/// mappings).
async fn squat(host: &Host, routers: Vec<SocketAddr>, over: Over) -> Squat {
    let at = SocketAddr::new(host.addr().into(), LISTEN_PORT);
    if over == Over::Quic {
        let socket = host
            .spawn(async move {
                let s = std::net::UdpSocket::bind(at)?;
                s.set_nonblocking(true)?;
                Ok::<_, std::io::Error>(s)
            })
            .await
            .expect("squatter task")
            .expect("the squatter binds the port");
        let socket = tokio::net::UdpSocket::from_std(socket).expect("tokio socket");
        for r in &routers {
            socket.send_to(b"squat", r).await.expect("first datagram");
        }
        return Squat::Udp(tokio::spawn(async move {
            loop {
                tokio::time::sleep(Duration::from_secs(2)).await;
                for r in &routers {
                    let _ = socket.send_to(b"squat", r).await;
                }
            }
        }));
    }
    let held = host
        .spawn(async move {
            let mut held = Vec::new();
            for r in routers {
                let s = tokio::net::TcpSocket::new_v4()?;
                s.set_reuseaddr(true)?;
                s.set_reuseport(true)?;
                s.bind(at)?;
                held.push(s.connect(r).await?.into_std()?);
            }
            Ok::<_, std::io::Error>(held)
        })
        .await
        .expect("squatter task")
        .expect("the squatter connects to every router");
    Squat::Tcp(held)
}

/// The hosts of cell `i`'s two members, and what must stay open meanwhile.
async fn hosts(net: &Net, i: usize, cell: Cell, over: Over) -> ([Host; 2], Vec<Squat>) {
    let p = over.prefix();
    let names = [format!("{p}{i}a"), format!("{p}{i}b")];
    if let Some(hairpin) = cell.shared {
        let gw = net
            .tb
            .nat_with(&format!("{p}{i}-gw"), NatKind::EndpointIndependent, hairpin)
            .await
            .expect("nat");
        assert_eq!(gw.hairpin(), hairpin);
        let a = net.tb.host_behind(&gw, &names[0]).await.expect("host");
        let b = net.tb.host_behind(&gw, &names[1]).await.expect("host");
        return ([a, b], Vec::new());
    }
    let routers: Vec<SocketAddr> = net.routers.iter().map(|r| r.listen_addr()).collect();
    let mut held = Vec::new();
    let mut hosts = Vec::new();
    for (name, side) in names.iter().zip([cell.caller, cell.provider]) {
        let kind = match side {
            Side::Public => None,
            Side::Behind(k) => Some(k),
        };
        let (host, gw) = net.member_host(name, kind).await;
        if kind == Some(NatKind::EndpointDependentPortPreserving) {
            let gw = gw.expect("a NAT");
            let sq = net
                .tb
                .host_behind(&gw, &format!("{name}-sq"))
                .await
                .expect("squatter host");
            held.push(squat(&sq, routers.clone(), over).await);
        }
        hosts.push(host);
    }
    let [a, b]: [Host; 2] = hosts.try_into().expect("two hosts");
    ([a, b], held)
}

/// `caller` calls `service` until it answers, waits until the connection
/// that call used is [`WARM`], then makes [`WARM_CALLS`] calls: the path
/// they took.
async fn warm_path(caller: &Member, service: &str, payload: &[u8]) -> Seen {
    const DIRECT: &str = r#"agentmesh_node_calls_by_path_total{path="direct"}"#;
    const RELAYED: &str = r#"agentmesh_node_calls_by_path_total{path="relayed"}"#;
    caller.call_until_echoed(service, payload).await;
    tokio::time::sleep_until(Instant::now() + WARM).await;
    let (d0, r0) = (caller.metric(DIRECT).await, caller.metric(RELAYED).await);
    for n in 0..WARM_CALLS {
        match caller.call(service, payload).await {
            Ok(back) if back == payload => {}
            Ok(back) => return Seen::Failed(format!("warm call {n}: {} bytes back", back.len())),
            Err(e) => return Seen::Failed(format!("warm call {n}: {e}")),
        }
    }
    let direct = caller.metric(DIRECT).await - d0;
    let relayed = caller.metric(RELAYED).await - r0;
    let n = f64::from(WARM_CALLS);
    match (direct, relayed) {
        (d, 0.0) if d == n => Seen::Path(Path::Direct),
        (0.0, r) if r == n => Seen::Path(Path::Relayed),
        (direct, relayed) => Seen::Mixed { direct, relayed },
    }
}

async fn run_cell(net: &Net, i: usize, cell: Cell, over: Over) -> Outcome {
    let start = Instant::now();
    let ([ha, hb], _held) = hosts(net, i, cell, over).await;
    let p = over.prefix();
    let (an, bn) = (format!("{p}{i}a"), format!("{p}{i}b"));
    let (sa, sb) = (format!("echo-{an}"), format!("echo-{bn}"));
    let mut a = net.member(&an, ha, &over.spec(&sa, &sb)).await;
    let mut b = net.member(&bn, hb, &over.spec(&sb, &sa)).await;
    a.wait_ready().await;
    b.wait_ready().await;
    let classified = [nat_kind(&a).await, nat_kind(&b).await];
    let payload = vec![0x5a; 4 * 1024];
    let mut remeasured = Vec::new();
    let mut forward = warm_path(&a, &sb, &payload).await;
    if matches!(forward, Seen::Mixed { .. }) {
        // Under load a warm call can race the direct connection coming up
        // (or a second one being refused): the pair must settle, so the
        // direction is measured once more and the first result reported.
        remeasured.push(format!("forward {forward:?}"));
        forward = warm_path(&a, &sb, &payload).await;
    }
    let mut back = warm_path(&b, &sa, &payload).await;
    if matches!(back, Seen::Mixed { .. }) {
        remeasured.push(format!("back {back:?}"));
        back = warm_path(&b, &sa, &payload).await;
    }
    Outcome {
        classified,
        forward,
        back,
        punches: [punches(&a).await, punches(&b).await],
        direct_conns: [direct_conns(&a).await, direct_conns(&b).await],
        remeasured,
        took: start.elapsed(),
    }
}

/// `m`'s open direct connections (`agentmesh_node_direct_connections`,
/// every NAT kind).
async fn direct_conns(m: &Member) -> f64 {
    let text = m.metrics().await;
    agentmesh_node::metrics::NAT_KINDS
        .iter()
        .map(|nat| {
            agentmesh_testkit::metric(
                &text,
                &format!(r#"agentmesh_node_direct_connections{{nat="{nat}"}}"#),
            )
        })
        .sum()
}

/// `m`'s punch results (`agentmesh_node_upgrade_attempts_total` by result,
/// those above zero), port-reuse fallbacks, and direct connections refused
/// or closed for what their peer is, for the report.
async fn punches(m: &Member) -> String {
    let text = m.metrics().await;
    let mut out = Vec::new();
    for result in agentmesh_node::metrics::UPGRADE_RESULTS {
        let n = agentmesh_testkit::metric(
            &text,
            &format!(r#"agentmesh_node_upgrade_attempts_total{{result="{result}"}}"#),
        );
        if n > 0.0 {
            out.push(format!("{result}={n}"));
        }
    }
    for counter in ["port_reuse_fallbacks", "port_reuse_adopted"] {
        let n = agentmesh_testkit::metric(&text, &format!("agentmesh_node_{counter}_total"));
        if n > 0.0 {
            out.push(format!("{counter}={n}"));
        }
    }
    // Direct connections refused at once, or closed for what the peer is
    // (none expected between honest members).
    for reason in agentmesh_node::metrics::INBOUND_REFUSED_REASONS {
        let series = format!(r#"agentmesh_node_inbound_refused_total{{reason="{reason}"}}"#);
        let n = agentmesh_testkit::metric(&text, &series);
        if n > 0.0 {
            out.push(format!("refused_{reason}={n}"));
        }
    }
    for reason in ["unauthenticated", "revoked", "policy"] {
        let series = format!(r#"agentmesh_node_direct_closed_total{{reason="{reason}"}}"#);
        let n = agentmesh_testkit::metric(&text, &series);
        if n > 0.0 {
            out.push(format!("closed_{reason}={n}"));
        }
    }
    out.join(" ")
}

/// The table as printed: expected / observed per cell.
fn table(cells: &[Cell], outcomes: &[Result<Outcome, String>], over: Over) -> String {
    const W: usize = 18;
    let mut t = String::new();
    let _ = writeln!(
        t,
        "NAT matrix, {}, warm calls: expected path / observed caller->provider, provider->caller \
         (D direct, R relayed; `!!` a cell that differs; `*` a member whose NAT status differs)",
        over.name()
    );
    let _ = write!(t, "{:<W$}", "caller \\ provider");
    for s in SIDES {
        let _ = write!(t, "{:<W$}", s.name());
    }
    t.push('\n');
    let cell_text = |cell: &Cell, o: &Result<Outcome, String>| -> String {
        let exp = Seen::Path(cell.expected).short();
        match o {
            Err(_) => format!("{exp} / PANIC !!"),
            Ok(o) => {
                let star = if o.classified == cell.classified() {
                    ""
                } else {
                    "*"
                };
                let bad = if o.matches(cell) { "" } else { " !!" };
                format!(
                    "{exp} / {},{}{star}{bad}",
                    o.forward.short(),
                    o.back.short()
                )
            }
        }
    };
    for (row, caller) in SIDES.iter().enumerate() {
        let _ = write!(t, "{:<W$}", caller.name());
        for col in 0..SIDES.len() {
            let k = row * SIDES.len() + col;
            let _ = write!(t, "{:<W$}", cell_text(&cells[k], &outcomes[k]));
        }
        t.push('\n');
    }
    let shared = SIDES.len() * SIDES.len();
    for (k, label) in [(shared, "hairpin (eim)"), (shared + 1, "no hairpin (eim)")] {
        let _ = writeln!(t, "{:<W$}{}", label, cell_text(&cells[k], &outcomes[k]));
    }
    for r in REASONS {
        let _ = writeln!(t, "- {r}");
    }
    let _ = writeln!(
        t,
        "per cell: NAT status caller/provider; punch results and port-reuse counters \
         caller | provider; direct connections caller/provider; time; a direction \
         measured again after mixed warm calls"
    );
    for (cell, o) in cells.iter().zip(outcomes) {
        let _ = match o {
            Err(e) => writeln!(t, "  {}: panicked: {e}", cell.name()),
            Ok(o) => writeln!(
                t,
                "  {}: {}/{}; {} | {}; {}/{}; {:.1} s{}",
                cell.name(),
                o.classified[0],
                o.classified[1],
                o.punches[0],
                o.punches[1],
                o.direct_conns[0],
                o.direct_conns[1],
                o.took.as_secs_f64(),
                if o.remeasured.is_empty() {
                    String::new()
                } else {
                    format!("; measured again after {}", o.remeasured.join(", "))
                }
            ),
        };
    }
    t
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_nat_matrix_takes_the_expected_path_in_every_cell_and_direction() {
    matrix(Over::Tcp).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_quic_nat_matrix_takes_the_expected_path_in_every_cell_and_direction() {
    matrix(Over::Quic).await;
}

async fn matrix(over: Over) {
    let name = match over {
        Over::Tcp => "direct_matrix",
        Over::Quic => "quic_matrix",
    };
    let Some(mut net) = Net::start(name, &[]).await else {
        return;
    };
    let start = Instant::now();
    net.add_router("r1").await;
    net.add_router("r2").await;
    let mut cells = Vec::new();
    for (row, caller) in SIDES.into_iter().enumerate() {
        for (col, provider) in SIDES.into_iter().enumerate() {
            cells.push(Cell {
                caller,
                provider,
                shared: None,
                expected: EXPECTED[row][col],
            });
        }
    }
    let eim = Side::Behind(NatKind::EndpointIndependent);
    cells.push(Cell {
        caller: eim,
        provider: eim,
        shared: Some(true),
        expected: HAIRPIN,
    });
    cells.push(Cell {
        caller: eim,
        provider: eim,
        shared: Some(false),
        expected: NO_HAIRPIN,
    });
    let net = &net;
    let outcomes: Vec<Result<Outcome, String>> =
        futures::future::join_all(cells.iter().enumerate().map(|(i, cell)| {
            AssertUnwindSafe(run_cell(net, i, *cell, over))
                .catch_unwind()
                .map(|r| {
                    r.map_err(|p| {
                        p.downcast_ref::<String>()
                            .cloned()
                            .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
                            .unwrap_or_else(|| "a panic".into())
                    })
                })
        }))
        .await;
    let printed = table(&cells, &outcomes, over);
    eprintln!("{printed}");
    let mut wrong = Vec::new();
    for (cell, o) in cells.iter().zip(&outcomes) {
        let what = cell.name();
        match o {
            Err(e) => wrong.push(format!("{what}: panicked: {e}")),
            Ok(o) => {
                if !o.matches(cell) {
                    wrong.push(format!("{what}: expected {:?}, saw {o:?}", cell.expected));
                }
            }
        }
    }
    let slowest = outcomes
        .iter()
        .filter_map(|o| o.as_ref().ok())
        .map(|o| o.took)
        .max()
        .unwrap_or_default();
    eprintln!(
        "{} matrix: {} cells in {:?} (the slowest cell {slowest:?})",
        over.name(),
        cells.len(),
        start.elapsed()
    );
    assert!(
        wrong.is_empty(),
        "{} of {} cells differ:\n{}\n{printed}",
        wrong.len(),
        cells.len(),
        wrong.join("\n")
    );
}
