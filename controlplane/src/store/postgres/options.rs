//! Where and how to connect: a `postgres://` URL completed from the libpq
//! environment variables, and TLS on rustls with ring.
//!
//! tokio-postgres reads no environment itself; we read the variables libpq
//! documents for what the URL leaves out: `PGHOST`, `PGPORT`, `PGUSER`,
//! `PGPASSWORD`, `PGDATABASE`, `PGSSLMODE`, `PGSSLROOTCERT`,
//! `PGAPPNAME`, `PGCONNECT_TIMEOUT`. What the URL says wins.
//!
//! `sslmode`: `disable`, `allow` and `prefer` connect without TLS (we never
//! use a TLS session we cannot verify, so "prefer" does not pretend);
//! `require`, `verify-ca` and `verify-full` all verify the server's
//! certificate and name against `sslrootcert` (or `~/.postgresql/root.crt`),
//! which must exist.

use std::{collections::BTreeMap, path::PathBuf, str::FromStr, sync::Arc, time::Duration};

use super::super::StoreError;

/// tokio-postgres's keepalive idle time when the URL sets none.
const DEFAULT_KEEPALIVES_IDLE: Duration = Duration::from_secs(2 * 60 * 60);
/// TCP keepalive: first probe after this much silence.
pub(super) const KEEPALIVES_IDLE: Duration = Duration::from_secs(15);
/// TCP keepalive: between probes.
const KEEPALIVES_INTERVAL: Duration = Duration::from_secs(5);
/// TCP keepalive: unanswered probes before the socket is declared dead.
const KEEPALIVES_RETRIES: u32 = 3;

/// The libpq variables we read.
pub(crate) const PG_ENV: &[&str] = &[
    "PGHOST",
    "PGPORT",
    "PGUSER",
    "PGPASSWORD",
    "PGDATABASE",
    "PGSSLMODE",
    "PGSSLROOTCERT",
    "PGAPPNAME",
    "PGCONNECT_TIMEOUT",
];

/// The `PG*` variables of this process.
pub(crate) fn process_env() -> BTreeMap<String, String> {
    PG_ENV
        .iter()
        .filter_map(|k| std::env::var(k).ok().map(|v| ((*k).to_string(), v)))
        .collect()
}

/// Whether and how to use TLS.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Tls {
    /// Plaintext.
    Disable,
    /// TLS, the server verified against these roots (a PEM file).
    Verify(PathBuf),
}

/// A resolved PostgreSQL connection.
#[derive(Debug, Clone)]
pub struct PgOptions {
    /// Host, port, user, password, database (tokio-postgres's own).
    pub config: tokio_postgres::Config,
    /// TLS.
    pub tls: Tls,
}

impl PgOptions {
    /// Parses `url` (`postgres://user:pass@host:port/db?sslmode=…`) and
    /// fills what it leaves out from `env` (the `PG*` variables).
    pub fn from_url_and_env(url: &str, env: &BTreeMap<String, String>) -> Result<Self, StoreError> {
        let bad = |what: String| StoreError::Config(format!("--db {}: {what}", redact(url)));
        // sslmode and sslrootcert are ours: tokio-postgres knows fewer modes.
        let (base, query) = url.split_once('?').unwrap_or((url, ""));
        let mut ssl_mode = None;
        let mut root_cert = None;
        let mut rest = Vec::new();
        for pair in query.split('&').filter(|p| !p.is_empty()) {
            match pair.split_once('=') {
                Some(("sslmode", v)) => ssl_mode = Some(v.to_string()),
                Some(("sslrootcert", v)) => root_cert = Some(v.to_string()),
                _ => rest.push(pair),
            }
        }
        let cleaned = if rest.is_empty() {
            base.to_string()
        } else {
            format!("{base}?{}", rest.join("&"))
        };
        let mut config =
            tokio_postgres::Config::from_str(&cleaned).map_err(|e| bad(e.to_string()))?;
        let var = |k: &str| env.get(k).filter(|v| !v.is_empty()).cloned();
        if config.get_hosts().is_empty() {
            let hosts = var("PGHOST").unwrap_or_else(|| "localhost".into());
            for h in hosts.split(',') {
                if h.starts_with('/') {
                    config.host_path(h);
                } else {
                    config.host(h);
                }
            }
        }
        if config.get_ports().is_empty()
            && let Some(p) = var("PGPORT")
        {
            for port in p.split(',') {
                config.port(
                    port.trim()
                        .parse()
                        .map_err(|_| bad(format!("PGPORT {p:?}")))?,
                );
            }
        }
        if config.get_user().is_none() {
            let user = var("PGUSER")
                .or_else(|| std::env::var("USER").ok())
                .ok_or_else(|| bad("no user: give one in the URL or PGUSER".into()))?;
            config.user(user);
        }
        if config.get_password().is_none()
            && let Some(p) = var("PGPASSWORD")
        {
            config.password(p);
        }
        if config.get_dbname().is_none()
            && let Some(d) = var("PGDATABASE")
        {
            config.dbname(d);
        }
        if config.get_application_name().is_none() {
            config.application_name(
                var("PGAPPNAME").unwrap_or_else(|| "agentmesh-control-plane".into()),
            );
        }
        if config.get_connect_timeout().is_none() {
            let secs = match var("PGCONNECT_TIMEOUT") {
                Some(s) => s
                    .parse()
                    .map_err(|_| bad(format!("PGCONNECT_TIMEOUT {s:?}")))?,
                None => 10,
            };
            config.connect_timeout(Duration::from_secs(secs));
        }
        // A server that vanished without a reset (a host down, a network
        // partition) is noticed in ~30 s rather than the kernel's 2 hours,
        // unless the URL says otherwise.
        if config.get_keepalives_idle() == DEFAULT_KEEPALIVES_IDLE {
            config
                .keepalives(true)
                .keepalives_idle(KEEPALIVES_IDLE)
                .keepalives_interval(KEEPALIVES_INTERVAL)
                .keepalives_retries(KEEPALIVES_RETRIES);
        }
        let mode = ssl_mode
            .or_else(|| var("PGSSLMODE"))
            .unwrap_or_else(|| "prefer".into());
        let tls = match mode.as_str() {
            "disable" | "allow" | "prefer" => Tls::Disable,
            "require" | "verify-ca" | "verify-full" => {
                let path = root_cert
                    .or_else(|| var("PGSSLROOTCERT"))
                    .map(PathBuf::from)
                    .or_else(|| {
                        std::env::var("HOME")
                            .ok()
                            .map(|h| PathBuf::from(h).join(".postgresql/root.crt"))
                    })
                    .ok_or_else(|| bad(format!("sslmode={mode} needs sslrootcert")))?;
                Tls::Verify(path)
            }
            other => return Err(bad(format!("unknown sslmode {other:?}"))),
        };
        config.ssl_mode(tokio_postgres::config::SslMode::Disable);
        Ok(Self { config, tls })
    }

    /// The rustls connector for [`Tls::Verify`] (ring as the provider).
    pub(super) fn rustls(
        path: &std::path::Path,
    ) -> Result<tokio_postgres_rustls::MakeRustlsConnect, StoreError> {
        use rustls::pki_types::{CertificateDer, pem::PemObject};
        let bad =
            |what: String| StoreError::Config(format!("sslrootcert {}: {what}", path.display()));
        let mut roots = rustls::RootCertStore::empty();
        let certs = CertificateDer::pem_file_iter(path).map_err(|e| bad(e.to_string()))?;
        for cert in certs {
            roots
                .add(cert.map_err(|e| bad(e.to_string()))?)
                .map_err(|e| bad(e.to_string()))?;
        }
        if roots.is_empty() {
            return Err(bad("no certificate in the file".into()));
        }
        let config = rustls::ClientConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .map_err(|e| bad(e.to_string()))?
        .with_root_certificates(roots)
        .with_no_client_auth();
        Ok(tokio_postgres_rustls::MakeRustlsConnect::new(config))
    }
}

/// `url` without its password, for error messages.
pub(crate) fn redact(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(s), Some(at)) if at > s => {
            let userinfo = &url[s + 3..at];
            match userinfo.split_once(':') {
                Some((user, _)) => format!("{}{user}:***{}", &url[..s + 3], &url[at..]),
                None => url.to_string(),
            }
        }
        _ => url.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use tokio_postgres::config::Host;

    use super::*;

    fn env(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn the_url_wins_and_pg_variables_fill_the_rest() {
        let e = env(&[
            ("PGHOST", "db.example"),
            ("PGPORT", "6543"),
            ("PGUSER", "envuser"),
            ("PGPASSWORD", "envpass"),
            ("PGDATABASE", "envdb"),
        ]);
        let o = PgOptions::from_url_and_env("postgres://", &e).expect("env only");
        assert_eq!(o.config.get_hosts(), &[Host::Tcp("db.example".into())]);
        assert_eq!(o.config.get_ports(), &[6543]);
        assert_eq!(o.config.get_user(), Some("envuser"));
        assert_eq!(o.config.get_password(), Some(&b"envpass"[..]));
        assert_eq!(o.config.get_dbname(), Some("envdb"));
        assert_eq!(o.tls, Tls::Disable);
        let o = PgOptions::from_url_and_env("postgres://u:p@127.0.0.1:5433/cp", &e).expect("url");
        assert_eq!(o.config.get_hosts(), &[Host::Tcp("127.0.0.1".into())]);
        assert_eq!(o.config.get_ports(), &[5433]);
        assert_eq!(o.config.get_user(), Some("u"));
        assert_eq!(o.config.get_dbname(), Some("cp"));
    }

    #[test]
    fn verified_tls_needs_roots_and_unknown_modes_are_refused() {
        let e = env(&[
            ("PGUSER", "u"),
            ("PGSSLMODE", "verify-full"),
            ("PGSSLROOTCERT", "/ca.pem"),
        ]);
        let o = PgOptions::from_url_and_env("postgres://h/db", &e).expect("parses");
        assert_eq!(o.tls, Tls::Verify("/ca.pem".into()));
        let o =
            PgOptions::from_url_and_env("postgres://h/db?sslmode=disable", &e).expect("url wins");
        assert_eq!(o.tls, Tls::Disable);
        let err = PgOptions::from_url_and_env("postgres://u:secret@h/db?sslmode=bogus", &e)
            .expect_err("unknown mode");
        let msg = err.to_string();
        assert!(msg.contains("bogus") && !msg.contains("secret"), "{msg}");
        assert!(PgOptions::rustls(std::path::Path::new("/nonexistent/ca.pem")).is_err());
    }
}
