//! `testbed.json`: what `agentmesh-ladder testbed` tells the runs it
//! serves. Where the control plane and routers listen, the files a member
//! needs (CA, token), each member host with the command prefix that runs a
//! program there, the arguments `agentmesh-ladder remote` takes, and the
//! limits that bound a fleet on one member host. Written once the mesh is
//! ready, atomically (a temp file renamed over it), removed at shutdown.

use std::ffi::OsString;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use agentmesh_netns::Host;
use serde::Serialize;

use super::build::HostsTestbed;
use crate::error::{LadderError, Result};
use crate::mesh::LocalMesh;

/// The file's name in the work dir.
pub const FILE_NAME: &str = "testbed.json";
/// This format's version (`version` in the file).
pub const FORMAT_VERSION: u32 = 1;
/// Connections a member holds through its NAT, as an estimate for the
/// conntrack warning: one to each of its K routers (2 by default), transit
/// connections, and its per-call control-plane connections lingering in
/// TIME_WAIT (120 s).
pub const CONNTRACK_PER_MEMBER: u64 = 4;

/// The whole file.
#[derive(Debug, Clone, Serialize)]
pub struct TestbedFile {
    /// [`FORMAT_VERSION`].
    pub version: u32,
    /// The testbed process: SIGINT or SIGTERM it to stop the mesh and
    /// remove the hosts.
    pub pid: u32,
    /// The prefix of every namespace and link of the testbed.
    pub prefix: String,
    /// The `agentmesh-ladder` that runs the testbed (the same build runs
    /// the fleet).
    pub ladder: PathBuf,
    /// Where the mesh keeps its data, tokens, certificate and logs.
    pub mesh_dir: PathBuf,
    /// Members the member token was minted for (`--members`).
    pub members: u64,
    /// Uses of the member token: `members` plus headroom.
    pub member_token_uses: u64,
    /// `none`, `eim` or `symmetric`.
    pub member_nat: String,
    /// Whether the control plane serves gRPC over TLS.
    pub tls: bool,
    /// The control plane's gRPC URL (`https://` with TLS).
    pub control_plane_url: String,
    /// The control plane's certificate, the CA members are given (TLS only).
    pub ca_file: Option<PathBuf>,
    /// The member token (ephemeral, `member_token_uses` uses).
    pub member_token_file: PathBuf,
    /// The admin bearer token (for `remote --admin-token-file`, which
    /// `--rotate-key-at` needs).
    pub admin_token_file: PathBuf,
    /// The control plane.
    pub control_plane: ControlPlaneEntry,
    /// The routers, in start order.
    pub routers: Vec<RouterEntry>,
    /// The hosts the fleet runs on.
    pub member_hosts: Vec<MemberHostEntry>,
    /// `agentmesh-ladder remote` arguments that point a run at this mesh:
    /// add the fleet's own (`--step`, `--steps`, `--report` …).
    pub remote_args: Vec<String>,
    /// This process's open-files soft limit, which the control plane and
    /// routers inherit.
    pub nofile: Option<u64>,
    /// The CPU cap of the mesh (`--cpu-quota`), cores, if any.
    pub cpu_quota: Option<f64>,
    /// Warnings about the limits (also printed at start).
    pub warnings: Vec<String>,
}

/// The control plane in the file.
#[derive(Debug, Clone, Serialize)]
pub struct ControlPlaneEntry {
    /// Its host's name.
    pub host: String,
    /// Its host's namespace.
    pub namespace: String,
    /// gRPC address.
    pub grpc_addr: SocketAddr,
    /// HTTP address: `/readyz`, `/metrics`, `/info`.
    pub http_addr: SocketAddr,
    /// Its pid (a process of this machine).
    pub pid: Option<u32>,
    /// Its log.
    pub log: PathBuf,
}

/// A router in the file.
#[derive(Debug, Clone, Serialize)]
pub struct RouterEntry {
    /// `r0`, `r1` …
    pub name: String,
    /// Its host's namespace.
    pub namespace: String,
    /// Its libp2p listen address.
    pub listen: String,
    /// `/metrics` and `/readyz`.
    pub metrics_addr: SocketAddr,
    /// Its pid.
    pub pid: Option<u32>,
    /// Its log.
    pub log: PathBuf,
}

/// A member host in the file.
#[derive(Debug, Clone, Serialize)]
pub struct MemberHostEntry {
    /// `m0`, `m1` …
    pub name: String,
    /// Its namespace.
    pub namespace: String,
    /// Its own address (private behind a NAT).
    pub addr: String,
    /// The address routers and the control plane see it from (its NAT's).
    pub public_addr: String,
    /// The command that runs a program on this host, without the program:
    /// `ip netns exec NAMESPACE`, and `setpriv --pdeathsig KILL --` where
    /// setpriv exists (the program is killed if its parent dies).
    pub exec_prefix: Vec<String>,
    /// Its NAT gateway's namespace (`ip netns exec GW conntrack -C`).
    pub nat_namespace: Option<String>,
    /// `net.netfilter.nf_conntrack_max` read inside the NAT gateway: the
    /// connections it can track. The machine's value (read-only inside a
    /// namespace), counted per namespace.
    pub nat_conntrack_max: Option<u64>,
    /// `net.ipv4.ip_local_port_range` inside the host: the ports its
    /// members dial from, at most this many connections to one address.
    pub ephemeral_ports: Option<(u32, u32)>,
}

/// The arguments of `agentmesh-ladder remote` for a mesh at `url`.
pub fn remote_args(
    url: &str,
    ca_file: Option<&Path>,
    token_file: &Path,
    control_plane_http: SocketAddr,
    router_metrics: &[SocketAddr],
) -> Vec<String> {
    let mut args = vec!["--control-plane".to_string(), url.to_string()];
    if let Some(ca) = ca_file {
        args.extend(["--control-plane-ca".to_string(), ca.display().to_string()]);
    }
    args.extend([
        "--token-file".to_string(),
        token_file.display().to_string(),
        "--control-plane-http-addr".to_string(),
        control_plane_http.to_string(),
    ]);
    for m in router_metrics {
        args.extend(["--router-metrics-addr".to_string(), m.to_string()]);
    }
    args
}

fn strings(v: Vec<OsString>) -> Vec<String> {
    v.into_iter()
        .map(|s| s.to_string_lossy().into_owned())
        .collect()
}

/// Reads a file of `/proc/sys` from inside `host` (`net.*` is per namespace).
async fn sysctl(host: &Host, path: &'static str) -> Option<String> {
    host.run_blocking(&format!("reading {path}"), move || {
        std::fs::read_to_string(path)
    })
    .await
    .ok()
    .map(|s| s.trim().to_string())
}

/// `"32768\t60999"` as a pair.
fn port_range(s: &str) -> Option<(u32, u32)> {
    let mut it = s.split_whitespace().map(str::parse::<u32>);
    match (it.next(), it.next()) {
        (Some(Ok(a)), Some(Ok(b))) => Some((a, b)),
        _ => None,
    }
}

/// What the limits mean for `members` members on one member host.
pub fn warnings(members: u64, m: &MemberHostEntry) -> Vec<String> {
    let mut w = Vec::new();
    if let Some(max) = m.nat_conntrack_max {
        let need = members.saturating_mul(CONNTRACK_PER_MEMBER);
        if max < need {
            w.push(format!(
                "{}: its NAT tracks at most {max} connections (net.netfilter.nf_conntrack_max, \
                 the machine's: read-only inside a namespace); {members} members on this host \
                 need about {need}: raise it on the machine (sysctl -w \
                 net.netfilter.nf_conntrack_max={need})",
                m.name
            ));
        }
    }
    if let Some((lo, hi)) = m.ephemeral_ports {
        let ports = u64::from(hi.saturating_sub(lo)) + 1;
        if members > ports {
            w.push(format!(
                "{}: its members dial from {ports} ephemeral ports ({lo}-{hi}), fewer than \
                 {members} members' connections to one router or the control plane",
                m.name
            ));
        }
    }
    w
}

impl TestbedFile {
    /// The file for `mesh` started on `tb`.
    pub async fn new(
        tb: &HostsTestbed,
        mesh: &LocalMesh,
        members: u64,
        member_token_uses: u64,
        cpu_quota: Option<f64>,
    ) -> Result<Self> {
        let ladder = std::env::current_exe()
            .map_err(|e| LadderError::io("locating the ladder's own executable", e))?;
        let ca_file = mesh.ca_file();
        let router_metrics: Vec<SocketAddr> = mesh.routers.iter().map(|r| r.metrics).collect();
        let url = mesh.url();
        let remote_args = remote_args(
            &url,
            ca_file.as_deref(),
            &mesh.member_token_file,
            mesh.control_planes.first().http,
            &router_metrics,
        );
        let routers = mesh
            .routers
            .iter()
            .enumerate()
            .map(|(i, r)| RouterEntry {
                name: r.name.clone(),
                namespace: tb
                    .routers
                    .get(i)
                    .map(|h| h.namespace().to_string())
                    .unwrap_or_default(),
                listen: format!("/ip4/{}/tcp/{}", r.metrics.ip(), r.listen_port),
                metrics_addr: r.metrics,
                pid: mesh.router_pid(i),
                log: mesh.dir.join(format!("{}.log", r.name)),
            })
            .collect();
        let mut member_hosts = Vec::with_capacity(tb.members.len());
        let mut warns = Vec::new();
        for (i, h) in tb.members.iter().enumerate() {
            let gw = tb.gateways.get(i);
            let nat_conntrack_max = match gw {
                Some(g) => sysctl(g, "/proc/sys/net/netfilter/nf_conntrack_max")
                    .await
                    .and_then(|s| s.parse().ok()),
                None => None,
            };
            let entry = MemberHostEntry {
                name: h.name().to_string(),
                namespace: h.namespace().to_string(),
                addr: h.addr().to_string(),
                public_addr: h.public_addr().to_string(),
                exec_prefix: strings(h.exec_prefix()),
                nat_namespace: gw.map(|g| g.namespace().to_string()),
                nat_conntrack_max,
                ephemeral_ports: sysctl(h, "/proc/sys/net/ipv4/ip_local_port_range")
                    .await
                    .as_deref()
                    .and_then(port_range),
            };
            warns.extend(warnings(members, &entry));
            member_hosts.push(entry);
        }
        Ok(Self {
            version: FORMAT_VERSION,
            pid: std::process::id(),
            prefix: tb.placement.record.prefix.clone(),
            ladder,
            mesh_dir: mesh.dir.clone(),
            members,
            member_token_uses,
            member_nat: tb.placement.record.member_nat.clone(),
            tls: ca_file.is_some(),
            control_plane_url: url,
            ca_file,
            member_token_file: mesh.member_token_file.clone(),
            admin_token_file: mesh.dir.join("admin.token"),
            control_plane: ControlPlaneEntry {
                host: tb.control_plane.name().to_string(),
                namespace: tb.control_plane.namespace().to_string(),
                grpc_addr: mesh.control_planes.first().grpc,
                http_addr: mesh.control_planes.first().http,
                pid: mesh.control_plane_pid(),
                log: mesh.dir.join("control-plane.log"),
            },
            routers,
            member_hosts,
            remote_args,
            nofile: crate::procstat::nofile_limit(),
            cpu_quota,
            warnings: warns,
        })
    }

    /// Writes the file as `path` atomically: a temp file beside it, then a
    /// rename, so a reader never sees half of it.
    pub fn write(&self, path: &Path) -> Result<()> {
        let mut json = serde_json::to_vec_pretty(self)
            .map_err(|e| LadderError::Process(format!("encoding {FILE_NAME}: {e}")))?;
        json.push(b'\n');
        let tmp = path.with_extension("json.tmp");
        std::fs::write(&tmp, &json)
            .map_err(|e| LadderError::io(format!("writing {}", tmp.display()), e))?;
        std::fs::rename(&tmp, path).map_err(|e| {
            LadderError::io(
                format!("renaming {} to {}", tmp.display(), path.display()),
                e,
            )
        })
    }

    /// The human summary printed at start.
    pub fn summary(&self, path: &Path) -> String {
        let mut s = format!(
            "testbed: up (prefix {}, pid {}): control plane {} (http {}) on host {}{}\n",
            self.prefix,
            self.pid,
            self.control_plane_url,
            self.control_plane.http_addr,
            self.control_plane.host,
            self.ca_file
                .as_ref()
                .map(|c| format!(", CA {}", c.display()))
                .unwrap_or_default(),
        );
        for r in &self.routers {
            s.push_str(&format!(
                "testbed: router {} at {} (metrics {})\n",
                r.name, r.listen, r.metrics_addr
            ));
        }
        for m in &self.member_hosts {
            s.push_str(&format!(
                "testbed: member host {} ({}) at {}, seen from {} (NAT: {})\n",
                m.name, m.namespace, m.addr, m.public_addr, self.member_nat
            ));
        }
        s.push_str(&format!(
            "testbed: member token for {} members ({} uses): {}\n",
            self.members,
            self.member_token_uses,
            self.member_token_file.display()
        ));
        for w in &self.warnings {
            s.push_str(&format!("testbed: WARNING: {w}\n"));
        }
        s.push_str(&format!("testbed: wrote {}\n", path.display()));
        if let Some(m) = self.member_hosts.first() {
            let mut line: Vec<String> = m.exec_prefix.clone();
            line.push(self.ladder.display().to_string());
            line.push("remote".into());
            line.extend(self.remote_args.iter().cloned());
            let quoted: Vec<String> = line.iter().map(|a| shell_quote(a)).collect();
            s.push_str(&format!(
                "testbed: run a fleet on {} with (then the fleet's flags: --step, --steps, \
                 --report …):\n  {}\n",
                m.name,
                quoted.join(" ")
            ));
        }
        s.push_str(&format!(
            "testbed: stop with Ctrl-C or kill -TERM {}",
            self.pid
        ));
        s
    }
}

/// `a` as one word of a POSIX shell line (single quotes when needed).
pub fn shell_quote(a: &str) -> String {
    let plain = !a.is_empty()
        && a.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-_./:=,@%+".contains(&b));
    if plain {
        a.to_string()
    } else {
        format!("'{}'", a.replace('\'', r"'\''"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::RemoteConfig;
    use clap::Parser;

    #[derive(Parser)]
    struct Remote {
        #[command(flatten)]
        remote: RemoteConfig,
    }

    #[test]
    fn the_remote_args_are_what_remote_mode_parses() {
        let http: SocketAddr = "10.0.0.1:7401".parse().expect("addr");
        let metrics: Vec<SocketAddr> = ["10.0.0.2:9100", "10.0.0.3:9100"]
            .iter()
            .map(|a| a.parse().expect("addr"))
            .collect();
        let args = remote_args(
            "https://10.0.0.1:7400",
            Some(Path::new("/w/mesh/control-plane-tls.crt")),
            Path::new("/w/mesh/member.token"),
            http,
            &metrics,
        );
        let cli = Remote::try_parse_from(std::iter::once("remote".to_string()).chain(args))
            .expect("remote mode parses them");
        assert_eq!(cli.remote.control_plane, "https://10.0.0.1:7400");
        assert_eq!(
            cli.remote.control_plane_ca.as_deref(),
            Some(Path::new("/w/mesh/control-plane-tls.crt"))
        );
        assert_eq!(cli.remote.token_file, Path::new("/w/mesh/member.token"));
        assert_eq!(cli.remote.control_plane_http_addr, Some(http));
        assert_eq!(cli.remote.router_metrics_addrs, metrics);
        // Without TLS there is no CA to give.
        let plain = remote_args(
            "http://10.0.0.1:7400",
            None,
            Path::new("t"),
            http,
            &metrics[..1],
        );
        assert!(
            !plain.iter().any(|a| a == "--control-plane-ca"),
            "{plain:?}"
        );
    }

    #[test]
    fn limits_below_a_fleet_on_one_host_are_named() {
        let m = |conntrack, ports| MemberHostEntry {
            name: "m0".into(),
            namespace: "ns".into(),
            addr: "10.1.0.2".into(),
            public_addr: "10.0.0.5".into(),
            exec_prefix: Vec::new(),
            nat_namespace: None,
            nat_conntrack_max: conntrack,
            ephemeral_ports: ports,
        };
        assert!(warnings(10_003, &m(Some(262_144), Some((32_768, 60_999)))).is_empty());
        assert!(warnings(10_003, &m(None, None)).is_empty());
        let w = warnings(10_003, &m(Some(16_384), Some((32_768, 60_999))));
        assert_eq!(w.len(), 1, "{w:?}");
        assert!(w[0].contains("nf_conntrack_max=40012"), "{w:?}");
        let w = warnings(10_003, &m(None, Some((60_000, 60_999))));
        assert_eq!(w.len(), 1, "{w:?}");
        assert!(w[0].contains("1000 ephemeral ports"), "{w:?}");
        assert_eq!(port_range("32768\t60999"), Some((32_768, 60_999)));
        assert_eq!(port_range("x"), None);
    }

    #[test]
    fn shell_words_are_quoted_only_when_needed() {
        assert_eq!(shell_quote("--step"), "--step");
        assert_eq!(shell_quote("/tmp/a b"), "'/tmp/a b'");
        assert_eq!(shell_quote("it's"), r"'it'\''s'");
        assert_eq!(shell_quote(""), "''");
    }
}
