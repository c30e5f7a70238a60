//! The testbed: an "internet" (a bridge in a namespace of its own), public
//! hosts on it, NAT gateways on it with LANs of their own, and hosts behind
//! them. See the crate docs for the names, the address plan and cleanup.

use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};

use crate::cmd;
use crate::enter::NsRuntime;
use crate::error::Error;
use crate::host::process::{LOG_TAIL_LINES, tail};
use crate::host::{Host, HostInner, Placement, Uplink};
use crate::names::Prefix;
use crate::nat::{self, NatKind};
use crate::plan;
use crate::sweep::{self, KEEP_MARKER, LOG_DIR_START, NETNS_DIR};

/// Set to `1` to keep the programs' logs of every testbed (they are kept
/// anyway when a test panics).
pub const KEEP_LOGS_ENV: &str = "AGENTMESH_NETNS_KEEP_LOGS";

/// The name of the internet's namespace (not available as a host name).
pub const INTERNET: &str = "internet";

/// A NAT gateway (cheap to clone): a public host forwarding for a LAN of
/// its own, with [`Testbed::host_behind`] adding hosts to that LAN.
#[derive(Debug, Clone)]
pub struct Nat {
    inner: Arc<NatInner>,
}

#[derive(Debug)]
struct NatInner {
    gateway: Host,
    kind: NatKind,
    hairpin: bool,
    lan_octet: u8,
    lan_bridge: String,
    next_host: AtomicU32,
}

impl Nat {
    /// The gateway host itself (its uplink is the WAN link).
    pub fn gateway(&self) -> &Host {
        &self.inner.gateway
    }

    /// Its mapping behaviour.
    pub fn kind(&self) -> NatKind {
        self.inner.kind
    }

    /// Whether it hairpins.
    pub fn hairpin(&self) -> bool {
        self.inner.hairpin
    }

    /// Its public (WAN) address.
    pub fn public_addr(&self) -> Ipv4Addr {
        self.inner.gateway.addr()
    }

    /// Its address on its LAN (the default route of hosts behind it).
    pub fn lan_addr(&self) -> Ipv4Addr {
        plan::lan_gateway(self.inner.lan_octet)
    }

    /// Takes its WAN link down or brings it back: every host behind it
    /// loses, then regains, the internet.
    pub async fn set_wan(&self, up: bool) -> Result<(), Error> {
        self.inner.gateway.set_uplink(up).await
    }

    /// Drops every packet it forwards to or from `peer` (`cut` true), or
    /// stops dropping them: a path between two hosts dies silently (no
    /// reset, no ICMP) while every other path through this gateway keeps
    /// working, as when a middlebox starts dropping one flow.
    pub async fn cut_to(&self, peer: Ipv4Addr, cut: bool) -> Result<(), Error> {
        let ns = self.inner.gateway.namespace();
        let rules = if cut {
            nat::cut_rules(peer)
        } else {
            nat::heal_rules()
        };
        cmd::run("ip", &["netns", "exec", ns, "nft", "-f", "-"], Some(&rules)).await?;
        tracing::info!(nat = self.inner.gateway.name(), %peer, cut, "path cut");
        Ok(())
    }
}

impl Nat {
    /// `host` (one behind this NAT) moves to a new address on the LAN, as
    /// after a new lease or on another network: its old address is gone,
    /// so its connections from it stop carrying bytes (silently: the NAT
    /// still maps the old address, the host no longer has it), and its new
    /// flows get a new mapping from this NAT (the old one keeps the old
    /// public port until it times out, so the new one gets another).
    /// Returns the new address.
    pub async fn move_host(&self, host: &Host) -> Result<Ipv4Addr, Error> {
        let n = &self.inner;
        match host.placement() {
            Placement::BehindNat { gateway, .. } if gateway == n.gateway.name() => {}
            _ => {
                return Err(Error::Name {
                    name: host.name().into(),
                    why: format!("not behind {}", n.gateway.name()),
                });
            }
        }
        let i = n.next_host.fetch_add(1, Ordering::Relaxed);
        let new = plan::lan_addr(n.lan_octet, i)
            .ok_or_else(|| Error::Exhausted(format!("the LAN of {} is full", n.gateway.name())))?;
        let old = host.addr();
        let (near, len, gw) = (
            &host.inner.uplink.near_link,
            plan::PREFIX_LEN,
            plan::lan_gateway(n.lan_octet),
        );
        // Deleting the address takes its routes with it: the default
        // route is added again.
        batch(
            host.namespace(),
            &format!(
                "addr del {old}/{len} dev {near}
addr add {new}/{len} dev {near}
                 route replace default via {gw} dev {near}
"
            ),
        )
        .await?;
        *host.inner.addr.lock().expect("lock") = new;
        tracing::info!(host = host.name(), %old, %new, "host moved");
        Ok(new)
    }
}

/// Hosts and NATs from network namespaces, all removed when this is
/// dropped (also while a test panics).
#[derive(Debug)]
pub struct Testbed {
    prefix: Prefix,
    internet: String,
    bridge: String,
    logs: PathBuf,
    keep_logs: bool,
    pdeathsig: bool,
    /// Namespaces made so far, in order (removed in reverse).
    created: Mutex<Vec<String>>,
    /// Index of the next host (its link names).
    next_index: AtomicU32,
    /// Public addresses handed out.
    next_public: AtomicU32,
    /// NATs made.
    next_nat: AtomicU32,
}

/// Why namespaces cannot be made here, if they cannot: not root, or `ip`
/// or `nft` missing. Creating one can still fail (a container without
/// CAP_SYS_ADMIN); [`Testbed::new`] says so then.
pub fn unavailable() -> Option<String> {
    if !nix::unistd::geteuid().is_root() {
        return Some(
            "not running as root (network namespaces, veth pairs and nftables need it)".into(),
        );
    }
    if !cmd::exists("ip", "-V") {
        return Some("`ip` not found (Debian package iproute2)".into());
    }
    if !cmd::exists("nft", "--version") {
        return Some("`nft` not found (Debian package nftables)".into());
    }
    None
}

impl Testbed {
    /// Removes leftovers of killed runs ([`sweep::sweep`]), then makes the
    /// internet: a namespace holding one bridge. [`Error::Unavailable`]
    /// when namespaces cannot be made here.
    pub async fn new() -> Result<Self, Error> {
        if let Some(why) = unavailable() {
            return Err(Error::Unavailable(why));
        }
        let swept = tokio::task::spawn_blocking(sweep::sweep)
            .await
            .map_err(|e| Error::io("sweeping leftovers", std::io::Error::other(e.to_string())))??;
        if !swept.namespaces.is_empty() {
            tracing::info!(namespaces = ?swept.namespaces, "removed leftovers of killed runs");
        }
        let prefix = Prefix::next();
        let logs = std::env::temp_dir().join(format!("{LOG_DIR_START}{prefix}"));
        std::fs::create_dir_all(&logs)
            .map_err(|e| Error::io(format!("creating {}", logs.display()), e))?;
        let tb = Self {
            prefix,
            internet: prefix.namespace(INTERNET)?,
            bridge: prefix.link('i', 0)?,
            logs,
            keep_logs: std::env::var(KEEP_LOGS_ENV).is_ok_and(|v| v == "1"),
            pdeathsig: cmd::exists("setpriv", "--version"),
            created: Mutex::new(Vec::new()),
            next_index: AtomicU32::new(0),
            next_public: AtomicU32::new(0),
            next_nat: AtomicU32::new(0),
        };
        if let Err(e) = tb.add_namespace(&tb.internet).await {
            return Err(Error::Unavailable(format!(
                "cannot create a network namespace: {e}"
            )));
        }
        let setup = format!(
            "link set lo up\nlink add {b} type bridge\nlink set {b} up\n",
            b = tb.bridge
        );
        batch(&tb.internet, &setup).await?;
        tracing::info!(prefix = %tb.prefix, logs = %tb.logs.display(), "testbed up");
        Ok(tb)
    }

    /// The prefix of every name this testbed made.
    pub fn prefix(&self) -> Prefix {
        self.prefix
    }

    /// The internet's namespace.
    pub fn internet_namespace(&self) -> &str {
        &self.internet
    }

    /// Where its programs' logs are written.
    pub fn logs_dir(&self) -> &Path {
        &self.logs
    }

    /// Every namespace it made so far.
    pub fn namespaces(&self) -> Vec<String> {
        self.created.lock().expect("lock").clone()
    }

    /// A host on the internet with the next public address.
    pub async fn public_host(&self, name: &str) -> Result<Host, Error> {
        let i = self.next_public.fetch_add(1, Ordering::Relaxed);
        let addr = plan::public_addr(i)
            .ok_or_else(|| Error::Exhausted("the internet /16 is full".into()))?;
        let port = BridgePort {
            ns: &self.internet,
            bridge: &self.bridge,
            hairpin: false,
        };
        self.make_host(name, port, addr, None, Placement::Public)
            .await
    }

    /// A NAT gateway of `kind` on the internet, hairpinning.
    pub async fn nat(&self, name: &str, kind: NatKind) -> Result<Nat, Error> {
        self.nat_with(name, kind, true).await
    }

    /// A NAT gateway of `kind`; `hairpin` whether LAN hosts reach each
    /// other at their public mappings.
    pub async fn nat_with(&self, name: &str, kind: NatKind, hairpin: bool) -> Result<Nat, Error> {
        let k = self.next_nat.fetch_add(1, Ordering::Relaxed);
        let octet = plan::lan_octet(k)
            .ok_or_else(|| Error::Exhausted(format!("at most {} NATs", plan::MAX_NATS)))?;
        let gateway = self.public_host(name).await?;
        let ns = gateway.namespace().to_string();
        // Redirects off before the LAN bridge exists (it inherits `default`):
        // a hairpinned packet leaves by the interface it came in on.
        cmd::run(
            "ip",
            &[
                "netns",
                "exec",
                &ns,
                "sysctl",
                "-qw",
                "net.ipv4.ip_forward=1",
                "net.ipv4.conf.all.send_redirects=0",
                "net.ipv4.conf.default.send_redirects=0",
            ],
            None,
        )
        .await?;
        let lan_bridge = self.prefix.link('l', u32::from(octet))?;
        let lan = plan::lan_gateway(octet);
        batch(
            &ns,
            &format!(
                "link add {lan_bridge} type bridge\naddr add {lan}/{len} dev {lan_bridge}\nlink set {lan_bridge} up\n",
                len = plan::PREFIX_LEN
            ),
        )
        .await?;
        let rules = nat::ruleset(
            kind,
            gateway.uplink_name(),
            &lan_bridge,
            gateway.addr(),
            hairpin,
        );
        cmd::run(
            "ip",
            &["netns", "exec", &ns, "nft", "-f", "-"],
            Some(&rules),
        )
        .await?;
        tracing::info!(nat = name, kind = kind.as_str(), hairpin, public = %gateway.addr(), "NAT up");
        Ok(Nat {
            inner: Arc::new(NatInner {
                gateway,
                kind,
                hairpin,
                lan_octet: octet,
                lan_bridge,
                next_host: AtomicU32::new(0),
            }),
        })
    }

    /// A host on `nat`'s LAN, its default route through the gateway.
    pub async fn host_behind(&self, nat: &Nat, name: &str) -> Result<Host, Error> {
        let n = &nat.inner;
        let i = n.next_host.fetch_add(1, Ordering::Relaxed);
        let addr = plan::lan_addr(n.lan_octet, i)
            .ok_or_else(|| Error::Exhausted(format!("the LAN of {} is full", n.gateway.name())))?;
        let placement = Placement::BehindNat {
            gateway: n.gateway.name().to_string(),
            public_addr: n.gateway.addr(),
        };
        let port = BridgePort {
            ns: n.gateway.namespace(),
            bridge: &n.lan_bridge,
            hairpin: n.hairpin,
        };
        self.make_host(
            name,
            port,
            addr,
            Some(plan::lan_gateway(n.lan_octet)),
            placement,
        )
        .await
    }

    async fn add_namespace(&self, ns: &str) -> Result<(), Error> {
        cmd::run("ip", &["netns", "add", ns], None).await?;
        self.created.lock().expect("lock").push(ns.to_string());
        Ok(())
    }

    /// A namespace with `lo` up and one veth to a port of `port`'s bridge.
    async fn make_host(
        &self,
        name: &str,
        port: BridgePort<'_>,
        addr: Ipv4Addr,
        gateway: Option<Ipv4Addr>,
        placement: Placement,
    ) -> Result<Host, Error> {
        let BridgePort {
            ns: far_ns,
            bridge,
            hairpin,
        } = port;
        if name == INTERNET {
            return Err(Error::Name {
                name: name.into(),
                why: "the internet's namespace has this name".into(),
            });
        }
        let ns = self.prefix.namespace(name)?;
        let index = self.next_index.fetch_add(1, Ordering::Relaxed);
        let near = self.prefix.link('h', index)?;
        let far = self.prefix.link('b', index)?;
        self.add_namespace(&ns).await?;
        // Both ends are created inside their namespaces: no interface of
        // the testbed ever exists in the machine's own namespace.
        cmd::run(
            "ip",
            &[
                "link", "add", &near, "netns", &ns, "type", "veth", "peer", "name", &far, "netns",
                far_ns,
            ],
            None,
        )
        .await?;
        let mut join = format!("link set {far} master {bridge} up\n");
        if hairpin {
            join.push_str(&format!(
                "link set dev {far} type bridge_slave hairpin on\n"
            ));
        }
        batch(far_ns, &join).await?;
        let mut setup = format!(
            "link set lo up\naddr add {addr}/{len} dev {near}\nlink set {near} up\n",
            len = plan::PREFIX_LEN
        );
        if let Some(gw) = gateway {
            setup.push_str(&format!("route add default via {gw} dev {near}\n"));
        }
        batch(&ns, &setup).await?;
        let rt = NsRuntime::start(&Path::new(NETNS_DIR).join(&ns), &ns)?;
        tracing::debug!(host = name, namespace = %ns, %addr, "host up");
        Ok(Host {
            inner: Arc::new(HostInner {
                name: name.to_string(),
                ns,
                addr: std::sync::Mutex::new(addr),
                placement,
                uplink: Uplink {
                    far_ns: far_ns.to_string(),
                    far_link: far,
                    near_link: near,
                },
                logs: self.logs.clone(),
                pdeathsig: self.pdeathsig,
                rt,
            }),
        })
    }

    /// Prints the last lines of every program's log (when a test failed).
    fn print_log_tails(&self) {
        let Ok(entries) = std::fs::read_dir(&self.logs) else {
            return;
        };
        let mut logs: Vec<PathBuf> = entries
            .flatten()
            .map(|e| e.path())
            .filter(|p| p.extension().is_some_and(|x| x == "log"))
            .collect();
        logs.sort();
        for log in logs {
            let text = std::fs::read_to_string(&log).unwrap_or_default();
            eprintln!(
                "--- {} (last {LOG_TAIL_LINES} lines) ---\n{}",
                log.display(),
                tail(&text, LOG_TAIL_LINES)
            );
        }
    }
}

impl Drop for Testbed {
    fn drop(&mut self) {
        let panicking = std::thread::panicking();
        if panicking {
            self.print_log_tails();
        }
        let created = std::mem::take(&mut *self.created.lock().unwrap_or_else(|e| e.into_inner()));
        for ns in created.iter().rev() {
            if let Err(e) = sweep::remove_namespace(ns) {
                eprintln!("agentmesh-netns: could not remove namespace {ns}: {e}");
            }
        }
        if panicking || self.keep_logs {
            let _ = std::fs::write(self.logs.join(KEEP_MARKER), b"");
            eprintln!("agentmesh-netns: logs kept in {}", self.logs.display());
        } else {
            let _ = std::fs::remove_dir_all(&self.logs);
        }
    }
}

/// Where a new host's veth joins a bridge: the bridge's namespace and
/// name, and whether the port hairpins. A packet a host sends to one of
/// its own public mappings comes back by the port it arrived on, which a
/// bridge refuses unless the port hairpins (bridged there, not routed,
/// once br_netfilter has DNAT-ed it to a neighbour): without it two
/// programs on one host behind a hairpinning NAT could not reach each
/// other at their mappings, as they do on a real gateway.
struct BridgePort<'a> {
    ns: &'a str,
    bridge: &'a str,
    hairpin: bool,
}

/// Runs `lines` as one `ip -batch` inside namespace `ns`.
async fn batch(ns: &str, lines: &str) -> Result<(), Error> {
    cmd::run("ip", &["-n", ns, "-batch", "-"], Some(lines))
        .await
        .map(|_| ())
}
