//! A host: one network namespace with its own loopback, one address and an
//! uplink (a veth pair) to the internet bridge or to a NAT gateway's LAN.
//!
//! Everything a test does on a host runs inside its namespace: futures and
//! closures on the host's runtime ([`Host::spawn`], [`Host::run_blocking`]),
//! sockets opened there and handed back ([`Host::connect`],
//! [`Host::bind_tcp`], [`Host::bind_udp`]), `/readyz` and `/metrics` of its
//! programs ([`Host::http_get`]), and the programs themselves
//! ([`Host::program`], [`Host::command`]).

pub mod process;

use std::ffi::{OsStr, OsString};
use std::future::Future;
use std::net::{Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use tokio::task::JoinHandle;

use crate::cmd;
use crate::enter::NsRuntime;
use crate::error::Error;
use crate::http::{self, HttpResponse};
use process::Program;

/// Deadline of [`Host::connect`].
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// Where a host is: on the internet, or behind a NAT gateway.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Placement {
    /// On the internet bridge with a public address.
    Public,
    /// On the LAN of the NAT gateway host named here.
    BehindNat {
        /// The gateway host's name.
        gateway: String,
        /// The gateway's public (WAN) address: what the internet sees.
        public_addr: Ipv4Addr,
    },
}

/// The far end of a host's uplink: the veth end on the internet bridge or
/// on the NAT gateway's LAN bridge. Taking it down cuts the host off the
/// way a pulled cable or a dead upstream does: the host's own end loses its
/// carrier, its routes stay, and what it sends is dropped without an error.
#[derive(Debug, Clone)]
pub(crate) struct Uplink {
    /// The namespace holding the far end.
    pub(crate) far_ns: String,
    /// The far end's name.
    pub(crate) far_link: String,
    /// The host's own end (its only interface besides `lo`).
    pub(crate) near_link: String,
}

pub(crate) struct HostInner {
    pub(crate) name: String,
    pub(crate) ns: String,
    /// Changed only by [`crate::Nat::move_host`].
    pub(crate) addr: std::sync::Mutex<Ipv4Addr>,
    pub(crate) placement: Placement,
    pub(crate) uplink: Uplink,
    pub(crate) logs: PathBuf,
    pub(crate) pdeathsig: bool,
    pub(crate) rt: NsRuntime,
}

/// A host of a testbed (cheap to clone). It stays usable until its
/// [`crate::Testbed`] is dropped, which removes its namespace.
#[derive(Clone)]
pub struct Host {
    pub(crate) inner: Arc<HostInner>,
}

impl std::fmt::Debug for Host {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Host")
            .field("name", &self.inner.name)
            .field("namespace", &self.inner.ns)
            .field("addr", &self.addr())
            .field("placement", &self.inner.placement)
            .finish()
    }
}

impl Host {
    /// The name it was created with.
    pub fn name(&self) -> &str {
        &self.inner.name
    }

    /// Its namespace (`ip netns exec NAMESPACE …`).
    pub fn namespace(&self) -> &str {
        &self.inner.ns
    }

    /// Its own address (public, or private on its NAT's LAN; a host
    /// behind a NAT may move to another, [`crate::Nat::move_host`]).
    pub fn addr(&self) -> Ipv4Addr {
        *self.inner.addr.lock().expect("lock")
    }

    /// Where it is.
    pub fn placement(&self) -> &Placement {
        &self.inner.placement
    }

    /// The address the internet sees it from: its own, or its NAT's.
    pub fn public_addr(&self) -> Ipv4Addr {
        match &self.inner.placement {
            Placement::Public => self.addr(),
            Placement::BehindNat { public_addr, .. } => *public_addr,
        }
    }

    /// Its interface to the rest of the testbed.
    pub fn uplink_name(&self) -> &str {
        &self.inner.uplink.near_link
    }

    /// The directory its programs' logs are written to.
    pub fn logs_dir(&self) -> &Path {
        &self.inner.logs
    }

    /// Takes its uplink down (`false`) or brings it back (`true`); see
    /// [`Uplink`] for what down means. For a NAT gateway this is its WAN
    /// link: every host behind it loses the internet with it.
    pub async fn set_uplink(&self, up: bool) -> Result<(), Error> {
        let u = &self.inner.uplink;
        let state = if up { "up" } else { "down" };
        cmd::run(
            "ip",
            &["-n", &u.far_ns, "link", "set", &u.far_link, state],
            None,
        )
        .await?;
        tracing::info!(host = %self.inner.name, state, "uplink");
        Ok(())
    }

    /// Runs `fut` on the host's runtime: every socket it opens is inside
    /// the host's namespace.
    pub fn spawn<F>(&self, fut: F) -> JoinHandle<F::Output>
    where
        F: Future + Send + 'static,
        F::Output: Send + 'static,
    {
        self.inner.rt.handle().spawn(fut)
    }

    /// Runs blocking `f` on a thread inside the host's namespace.
    pub async fn run_blocking<T, F>(&self, what: &str, f: F) -> Result<T, Error>
    where
        F: FnOnce() -> std::io::Result<T> + Send + 'static,
        T: Send + 'static,
    {
        let what = format!("{what} on host {}", self.inner.name);
        match self.inner.rt.handle().spawn_blocking(f).await {
            Ok(r) => r.map_err(|e| Error::io(what, e)),
            Err(e) => Err(Error::io(what, std::io::Error::other(e.to_string()))),
        }
    }

    /// A TCP connection from this host to `addr` (within [`CONNECT_TIMEOUT`]),
    /// usable on the caller's runtime.
    pub async fn connect(&self, addr: SocketAddr) -> Result<tokio::net::TcpStream, Error> {
        let s = self
            .run_blocking(&format!("connecting to {addr}"), move || {
                let s = std::net::TcpStream::connect_timeout(&addr, CONNECT_TIMEOUT)?;
                s.set_nonblocking(true)?;
                Ok(s)
            })
            .await?;
        tokio::net::TcpStream::from_std(s).map_err(|e| Error::io("registering a stream", e))
    }

    /// A TCP listener on this host at `addr` (port 0: any free port),
    /// usable on the caller's runtime.
    pub async fn bind_tcp(&self, addr: SocketAddr) -> Result<tokio::net::TcpListener, Error> {
        let l = self
            .run_blocking(&format!("binding TCP {addr}"), move || {
                let l = std::net::TcpListener::bind(addr)?;
                l.set_nonblocking(true)?;
                Ok(l)
            })
            .await?;
        tokio::net::TcpListener::from_std(l).map_err(|e| Error::io("registering a listener", e))
    }

    /// A UDP socket on this host at `addr`, usable on the caller's runtime.
    pub async fn bind_udp(&self, addr: SocketAddr) -> Result<tokio::net::UdpSocket, Error> {
        let s = self
            .run_blocking(&format!("binding UDP {addr}"), move || {
                let s = std::net::UdpSocket::bind(addr)?;
                s.set_nonblocking(true)?;
                Ok(s)
            })
            .await?;
        tokio::net::UdpSocket::from_std(s).map_err(|e| Error::io("registering a UDP socket", e))
    }

    /// `GET http://addr/path` from this host within `timeout`.
    pub async fn http_get(
        &self,
        addr: SocketAddr,
        path: &str,
        timeout: Duration,
    ) -> Result<HttpResponse, Error> {
        let target = format!("{addr}{path}");
        let fail = |message: String| Error::Http {
            target: target.clone(),
            message,
        };
        let exchange = async {
            let s = self.connect(addr).await.map_err(|e| e.to_string())?;
            http::exchange(s, path).await
        };
        match tokio::time::timeout(timeout, exchange).await {
            Ok(r) => r.map_err(fail),
            Err(_) => Err(fail(format!("no answer within {timeout:?}"))),
        }
    }

    /// The command line that runs `program` inside this host: `ip netns
    /// exec NAMESPACE`, and `setpriv --pdeathsig KILL --` where setpriv
    /// exists (the program dies with the thread that started it, even if
    /// the test is killed). For callers with a spawner of their own.
    pub fn command_line(&self, program: impl AsRef<OsStr>) -> Vec<OsString> {
        let mut v: Vec<OsString> = ["ip", "netns", "exec", &self.inner.ns]
            .iter()
            .map(OsString::from)
            .collect();
        if self.inner.pdeathsig {
            v.extend(["setpriv", "--pdeathsig", "KILL", "--"].map(OsString::from));
        }
        v.push(program.as_ref().to_os_string());
        v
    }

    /// The command line that runs a program inside this host, without the
    /// program: [`Host::command_line`]'s prefix, for spawners that add the
    /// program and its arguments themselves.
    pub fn exec_prefix(&self) -> Vec<OsString> {
        let mut v = self.command_line("");
        v.pop();
        v
    }

    /// A runtime of `worker_threads` of the caller's own whose every thread
    /// lives in this host's namespace: code that opens many sockets of its
    /// own (a coordinator scraping programs on other hosts) runs there
    /// without [`Host::spawn`]'s one thread. Shut it down with
    /// `shutdown_background` (it may not be dropped inside async code).
    pub fn runtime(&self, worker_threads: usize) -> Result<tokio::runtime::Runtime, Error> {
        crate::enter::runtime(
            &Path::new(crate::sweep::NETNS_DIR).join(&self.inner.ns),
            &self.inner.ns,
            worker_threads,
        )
    }

    /// A command running `program` inside this host (see
    /// [`Host::command_line`]), killed when dropped.
    pub fn command(&self, program: impl AsRef<OsStr>) -> tokio::process::Command {
        let line = self.command_line(program);
        let mut c = tokio::process::Command::new(&line[0]);
        c.args(&line[1..]).kill_on_drop(true);
        c
    }

    /// A program to start on this host, its output logged to
    /// `logs_dir()/NAME.log` (see [`Program`]).
    pub fn program(&self, name: &str, exe: impl AsRef<Path>) -> Program {
        Program::new(self.clone(), name, exe.as_ref())
    }
}
