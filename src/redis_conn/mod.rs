//! Connections to Redis in every mode: one standalone server, a Redis
//! Cluster, or a master found through Sentinel, in clear text or over TLS.
//!
//! [`Redis`] holds the settings and makes connections; [`RedisConn`] is the
//! one connection type the scanners, the supervisor and the commands use,
//! whatever the mode. It is cheap to clone, reconnects by itself, and runs
//! scripts with `EVALSHA`, falling back to `EVAL` on `NOSCRIPT` on the node
//! that holds the script's keys: scripts are not replicated, so a restarted
//! server or a promoted replica does not have them, and `SCRIPT LOAD` through
//! a cluster client would need every node to answer.

use std::collections::HashMap;
use std::sync::{Arc, LazyLock, Mutex};
use std::time::Duration;

use redis::aio::{ConnectionLike, ConnectionManager, MultiplexedConnection};
use redis::cluster_async::ClusterConnection;
use redis::{
    Client, Cmd, ConnectionAddr, ConnectionInfo, IntoConnectionInfo, Pipeline, RedisError,
    RedisFuture, RedisResult, Script, Value,
};

use crate::config::{RedisConfig, RedisMode};
use crate::secret::SecretUrl;

/// How long one connection attempt (TCP, TLS handshake, first reply) may
/// take. A `rediss://` URL pointing at a clear-text Redis never completes
/// its handshake: only this ends it.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(3);

/// How long a command may wait for its reply.
pub const RESPONSE_TIMEOUT: Duration = Duration::from_secs(10);

/// A Redis connection problem, as one line that names the server.
#[derive(Debug, Clone, thiserror::Error)]
pub enum ConnError {
    /// The settings cannot make a client (caught by validation in practice).
    #[error("[redis] {0}")]
    Settings(String),
    /// A server could not be reached, refused us, or failed the TLS check.
    #[error("{server}: {reason}")]
    Unreachable {
        /// The server, password masked.
        server: String,
        /// Why, in words a user can act on.
        reason: String,
    },
}

mod cluster;
pub mod scripts;
mod sentinel;

pub use cluster::{parse_cluster_nodes, Addr, Master};
pub use scripts::script;
use sentinel::SentinelConn;

/// Turns a client error into words a user can act on: the TLS failures in
/// particular, whose raw text ("invalid peer certificate: UnknownIssuer")
/// does not say what to change.
pub fn describe(e: &RedisError) -> String {
    let raw = crate::secret::redact_url(&e.to_string());
    // rustls's wording varies between its error's Debug and Display forms.
    let lower = raw.to_lowercase().replace(['_', ' '], "");
    let has = |s: &str| lower.contains(s);
    let reason = if has("unknownissuer") || has("badsignature") {
        "TLS: the server's certificate is not signed by a CA delayd trusts (set tls_ca_file to the CA that signed it)"
    } else if has("expired") {
        "TLS: the server's certificate has expired"
    } else if has("notvalidyet") {
        "TLS: the server's certificate is not valid yet (check the clocks)"
    } else if has("notvalidforname") {
        "TLS: the server's certificate does not name this host (connect by a name or IP in its subjectAltName)"
    } else if has("certificaterequired") || has("handshakefailure") && has("alert") {
        "TLS: the server requires a client certificate (set tls_cert_file and tls_key_file)"
    } else if has("badcertificate") || has("unknownca") || has("decrypterror") && has("alert") {
        "TLS: the server refused delayd's client certificate (is it signed by a CA the server trusts?)"
    } else if has("invalidcontenttype") || has("corruptmessage") {
        "TLS: the server does not speak TLS (use redis://, or enable TLS on the server)"
    } else {
        return raw;
    };
    reason.to_string()
}

fn unreachable(server: impl std::fmt::Display, e: &RedisError) -> ConnError {
    ConnError::Unreachable {
        server: server.to_string(),
        reason: describe(e),
    }
}

fn timed_out(server: impl std::fmt::Display, tls: bool) -> ConnError {
    ConnError::Unreachable {
        server: server.to_string(),
        reason: if tls {
            format!("no TLS handshake within {CONNECT_TIMEOUT:?}: the server may not speak TLS (use redis://, or enable TLS on the server), or it is unreachable")
        } else {
            format!("no answer within {CONNECT_TIMEOUT:?}")
        },
    }
}

/// The settings to reach Redis in the configured mode; makes [`RedisConn`]s
/// and the per-node clients the keyspace watcher subscribes through.
#[derive(Clone)]
pub struct Redis {
    cfg: RedisConfig,
    certs: Option<redis::TlsCertificates>,
    /// Parsed `urls`, same order.
    infos: Vec<ConnectionInfo>,
}

/// The PEM files `[redis]` names, as the redis crate takes them. They were
/// checked at validation; reading them again can only fail if they went away.
fn redis_certificates(files: &crate::tls::TlsFiles) -> Result<redis::TlsCertificates, ConnError> {
    let read = |field: &str, path: &std::path::Path| {
        std::fs::read(path).map_err(|e| {
            ConnError::Settings(format!(
                "field \"{field}\": cannot read {} ({e})",
                path.display()
            ))
        })
    };
    let client_tls = match (&files.cert_file, &files.key_file) {
        (Some(c), Some(k)) => Some(redis::ClientTlsConfig {
            client_cert: read("tls_cert_file", c)?,
            client_key: read("tls_key_file", k)?,
        }),
        _ => None,
    };
    let root_cert = match &files.ca_file {
        Some(p) => Some(read("tls_ca_file", p)?),
        None => None,
    };
    Ok(redis::TlsCertificates {
        client_tls,
        root_cert,
    })
}

impl Redis {
    /// Checks the URLs and loads the certificates; connects to nothing.
    pub fn new(cfg: &RedisConfig) -> Result<Self, ConnError> {
        // rustls needs one crypto provider for the process; this build has
        // only ring. Installing twice is harmless.
        let _ = rustls::crypto::ring::default_provider().install_default();
        let certs = if cfg.is_tls() {
            Some(redis_certificates(&cfg.tls)?)
        } else {
            None
        };
        let infos = cfg
            .urls
            .iter()
            .map(|u| {
                u.expose()
                    .into_connection_info()
                    .map_err(|e| ConnError::Settings(format!("{}: {e}", u.redacted())))
            })
            .collect::<Result<Vec<_>, _>>()?;
        if infos.is_empty() {
            return Err(ConnError::Settings("no url configured".into()));
        }
        Ok(Self {
            cfg: cfg.clone(),
            certs,
            infos,
        })
    }

    /// The configured mode.
    pub fn mode(&self) -> RedisMode {
        self.cfg.mode
    }

    /// The settings this was made from.
    pub fn config(&self) -> &RedisConfig {
        &self.cfg
    }

    /// The database keyspace events are published for.
    pub fn db(&self) -> i64 {
        match self.cfg.mode {
            RedisMode::Cluster => 0,
            _ => self.infos[0].redis_settings().db(),
        }
    }

    fn url(&self, i: usize) -> &SecretUrl {
        &self.cfg.urls[i]
    }

    /// A client for `addr` with the credentials, database and TLS settings
    /// of configured URL `i`.
    fn client_at(&self, i: usize, addr: &Addr) -> Result<Client, ConnError> {
        let base = self.infos[i].clone();
        let tls = matches!(base.addr(), ConnectionAddr::TcpTls { .. });
        let info = base.set_addr(if tls {
            ConnectionAddr::TcpTls {
                host: addr.host.clone(),
                port: addr.port,
                insecure: false,
                tls_params: None,
            }
        } else {
            ConnectionAddr::Tcp(addr.host.clone(), addr.port)
        });
        self.client_of(info, addr)
    }

    fn client_of(
        &self,
        info: ConnectionInfo,
        server: impl std::fmt::Display,
    ) -> Result<Client, ConnError> {
        let tls = matches!(info.addr(), ConnectionAddr::TcpTls { .. });
        match &self.certs {
            Some(c) if tls => Client::build_with_tls(info, c.clone()),
            _ => Client::open(info),
        }
        .map_err(|e| unreachable(server, &e))
    }

    /// A client for the server named by configured URL `i`.
    fn client_for_url(&self, i: usize) -> Result<Client, ConnError> {
        self.client_of(self.infos[i].clone(), self.url(i))
    }

    /// A client to the master's address for keyspace subscriptions and the
    /// like: in cluster mode `addr` is a master from [`RedisConn::masters`].
    pub fn node_client(&self, addr: &Addr) -> Result<Client, ConnError> {
        self.client_at(0, addr)
    }

    /// Connects once, bounded by [`CONNECT_TIMEOUT`] per server tried. The
    /// connection then reconnects by itself.
    pub async fn connect(&self) -> Result<RedisConn, ConnError> {
        match self.cfg.mode {
            RedisMode::Standalone => {
                let client = self.client_for_url(0)?;
                probe(&client, self.url(0), self.cfg.is_tls()).await?;
                let cfg = redis::aio::ConnectionManagerConfig::new()
                    .set_connection_timeout(Some(CONNECT_TIMEOUT))
                    .set_response_timeout(Some(RESPONSE_TIMEOUT))
                    .set_number_of_retries(2)
                    .set_max_delay(Duration::from_secs(2));
                let m = ConnectionManager::new_lazy_with_config(client, cfg)
                    .map_err(|e| unreachable(self.url(0), &e))?;
                Ok(RedisConn {
                    inner: Inner::Single(m),
                    db: self.db(),
                })
            }
            RedisMode::Cluster => {
                // A probe of the seeds first: the cluster client's own error
                // for a failed TLS check only says that no node answered.
                let mut first_err = None;
                for i in 0..self.infos.len() {
                    match probe(&self.client_for_url(i)?, self.url(i), self.cfg.is_tls()).await {
                        Ok(()) => {
                            first_err = None;
                            break;
                        }
                        Err(e) => {
                            first_err.get_or_insert(e);
                        }
                    }
                }
                if let Some(e) = first_err {
                    return Err(e);
                }
                let seeds: Vec<ConnectionInfo> = self.infos.clone();
                let mut b = redis::cluster::ClusterClientBuilder::new(seeds)
                    .connection_timeout(CONNECT_TIMEOUT)
                    .response_timeout(RESPONSE_TIMEOUT)
                    // Enough to ride out a failover (node timeout plus an
                    // election, a few seconds) inside one call.
                    .retries(8)
                    .min_retry_wait(100)
                    .max_retry_wait(1000);
                if let Some(c) = &self.certs {
                    b = b.certs(c.clone());
                }
                let server = self.cfg.describe();
                let client = b.build().map_err(|e| unreachable(&server, &e))?;
                let conn = tokio::time::timeout(CONNECT_TIMEOUT * 2, client.get_async_connection())
                    .await
                    .map_err(|_| timed_out(&server, self.cfg.is_tls()))?
                    .map_err(|e| unreachable(&server, &e))?;
                Ok(RedisConn {
                    inner: Inner::Cluster(conn),
                    db: 0,
                })
            }
            RedisMode::Sentinel => {
                let s = Arc::new(SentinelConn {
                    redis: self.clone(),
                    current: tokio::sync::Mutex::new(None),
                    master: Mutex::new(None),
                    failed: Mutex::new(None),
                    asker: tokio::sync::Mutex::new(None),
                });
                s.get().await?;
                Ok(RedisConn {
                    inner: Inner::Sentinel(s),
                    db: self.db(),
                })
            }
        }
    }

    /// A connection to configured sentinel `i`, with `sentinel_password`
    /// and nothing else of the URL's credentials.
    async fn connect_sentinel(&self, i: usize) -> Result<MultiplexedConnection, ConnError> {
        let mut sentinel_redis = self.infos[i].redis_settings().clone().set_db(0);
        sentinel_redis = match &self.cfg.sentinel_password {
            Some(p) => sentinel_redis.set_password(p.expose()),
            // The URL's credentials are the master's; a sentinel
            // without a password of its own must not be sent them.
            None => redis::RedisConnectionInfo::default().set_protocol(sentinel_redis.protocol()),
        };
        let info = self.infos[i].clone().set_redis_settings(sentinel_redis);
        let client = self.client_of(info, self.url(i))?;
        connect_multiplexed(&client, self.url(i), self.cfg.is_tls())
            .await
            .map_err(|e| self.sentinel_auth_hint(e))
    }

    /// A password problem at a sentinel, in terms of the setting to change:
    /// the raw `NOAUTH`/`WRONGPASS` reply does not say which password.
    fn sentinel_auth_hint(&self, e: ConnError) -> ConnError {
        match e {
            ConnError::Unreachable { server, reason } => {
                let r = reason.to_uppercase();
                let reason = if r.contains("NOAUTH") {
                    "the sentinel requires a password (set sentinel_password)".to_string()
                } else if r.contains("WRONGPASS")
                    || r.contains("INVALID PASSWORD")
                    || r.contains("AUTHENTICATIONFAILED")
                {
                    "the sentinel refused sentinel_password (wrong password)".to_string()
                } else if r.contains("WITHOUT ANY PASSWORD CONFIGURED") {
                    "the sentinel has no password (remove sentinel_password)".to_string()
                } else {
                    reason
                };
                ConnError::Unreachable { server, reason }
            }
            other => other,
        }
    }

    /// Where sentinel `c` (configured URL `i`) says the master is.
    async fn ask_sentinel(
        &self,
        i: usize,
        c: &mut MultiplexedConnection,
    ) -> Result<Addr, ConnError> {
        let name = self.cfg.master_name.as_deref().unwrap_or_default();
        let reply: Option<(String, u16)> = redis::cmd("SENTINEL")
            .arg("get-master-addr-by-name")
            .arg(name)
            .query_async(c)
            .await
            .map_err(|e| self.sentinel_auth_hint(unreachable(self.url(i), &e)))?;
        match reply {
            Some((host, port)) => Ok(Addr { host, port }),
            None => Err(ConnError::Unreachable {
                server: self.url(i).redacted(),
                reason: format!(
                    "this sentinel monitors no master named \"{name}\" (check master_name)"
                ),
            }),
        }
    }

    /// Asks the sentinels, in order, where the master is, and connects to it;
    /// a sentinel that does not know, or names a server that is not (yet) a
    /// master, is skipped.
    async fn resolve_master(&self) -> Result<(Addr, MultiplexedConnection), ConnError> {
        let name = self.cfg.master_name.as_deref().unwrap_or_default();
        let mut last = None;
        for i in 0..self.infos.len() {
            let result = async {
                let mut c = self.connect_sentinel(i).await?;
                let addr = self.ask_sentinel(i, &mut c).await?;
                let client = self.client_at(i, &addr)?;
                let mut m = connect_multiplexed(&client, &addr, self.cfg.is_tls()).await?;
                let role: Vec<Value> = redis::cmd("ROLE")
                    .query_async(&mut m)
                    .await
                    .map_err(|e| unreachable(&addr, &e))?;
                match role.first() {
                    Some(Value::BulkString(r)) if r == b"master" => Ok((addr, m)),
                    _ => Err(ConnError::Unreachable {
                        server: addr.to_string(),
                        reason: format!("sentinel named it master of \"{name}\", but it is not a master (a failover is under way)"),
                    }),
                }
            }
            .await;
            match result {
                Ok(found) => return Ok(found),
                Err(e) => last = Some(e),
            }
        }
        Err(last.unwrap_or_else(|| ConnError::Settings("no sentinel configured".into())))
    }
}

async fn connect_multiplexed(
    client: &Client,
    server: impl std::fmt::Display,
    tls: bool,
) -> Result<MultiplexedConnection, ConnError> {
    let cfg = redis::AsyncConnectionConfig::new()
        .set_connection_timeout(Some(CONNECT_TIMEOUT))
        .set_response_timeout(Some(RESPONSE_TIMEOUT));
    tokio::time::timeout(
        CONNECT_TIMEOUT + Duration::from_millis(500),
        client.get_multiplexed_async_connection_with_config(&cfg),
    )
    .await
    .map_err(|_| timed_out(&server, tls))?
    .map_err(|e| {
        if e.is_timeout() {
            timed_out(&server, tls)
        } else {
            unreachable(&server, &e)
        }
    })
}

/// One connection and a PING, for the exact reason a server cannot be used.
async fn probe(client: &Client, server: &SecretUrl, tls: bool) -> Result<(), ConnError> {
    let mut c = connect_multiplexed(client, server, tls).await?;
    let _: String = redis::cmd("PING")
        .query_async(&mut c)
        .await
        .map_err(|e| unreachable(server, &e))?;
    Ok(())
}

fn conn_error(e: ConnError) -> RedisError {
    RedisError::from(std::io::Error::new(
        std::io::ErrorKind::NotConnected,
        e.to_string(),
    ))
}

#[derive(Clone)]
enum Inner {
    Single(ConnectionManager),
    Cluster(ClusterConnection),
    Sentinel(Arc<SentinelConn>),
}

/// A connection to Redis in whichever mode is configured: clone it freely,
/// it reconnects by itself (and in sentinel mode finds the new master).
#[derive(Clone)]
pub struct RedisConn {
    inner: Inner,
    db: i64,
}

impl RedisConn {
    async fn raw_command(&mut self, cmd: &Cmd) -> RedisResult<Value> {
        match &mut self.inner {
            Inner::Single(c) => c.req_packed_command(cmd).await,
            Inner::Cluster(c) => c.req_packed_command(cmd).await,
            Inner::Sentinel(s) => {
                let (g, mut c) = s.get_waiting().await.map_err(conn_error)?;
                let r = c.req_packed_command(cmd).await;
                if let Err(e) = &r {
                    if SentinelConn::must_reresolve(e) {
                        s.forget(g).await;
                    }
                }
                r
            }
        }
    }

    /// The masters that serve slots, in cluster mode, from `CLUSTER NODES`
    /// as one node sees it; the one server otherwise (in sentinel mode the
    /// master the sentinels name now, moving this connection to it if it
    /// moved).
    pub async fn masters(&self, redis: &Redis) -> Result<Vec<Master>, ConnError> {
        match &self.inner {
            Inner::Cluster(c) => {
                let mut c = c.clone();
                let text: String = redis::cmd("CLUSTER")
                    .arg("NODES")
                    .query_async(&mut c)
                    .await
                    .map_err(|e| unreachable(redis.cfg.describe(), &e))?;
                Ok(parse_cluster_nodes(&text))
            }
            Inner::Single(_) => {
                let addr = match redis.infos[0].addr() {
                    ConnectionAddr::Tcp(h, p) => Addr {
                        host: h.clone(),
                        port: *p,
                    },
                    ConnectionAddr::TcpTls { host, port, .. } => Addr {
                        host: host.clone(),
                        port: *port,
                    },
                    other => Addr {
                        host: other.to_string(),
                        port: 0,
                    },
                };
                Ok(vec![Master {
                    addr,
                    slots: vec![(0, crate::keys::SLOTS - 1)],
                }])
            }
            Inner::Sentinel(s) => {
                if let Err(e) = s.follow().await {
                    tracing::debug!(error = %e, "cannot ask the sentinels where the master is");
                }
                if s.master.lock().ok().and_then(|m| m.clone()).is_none() {
                    s.get().await?;
                }
                let addr = s.master.lock().ok().and_then(|m| m.clone());
                Ok(addr
                    .map(|addr| Master {
                        addr,
                        slots: vec![(0, crate::keys::SLOTS - 1)],
                    })
                    .into_iter()
                    .collect())
            }
        }
    }

    /// A client for subscribing on `master`: the URL's own client in
    /// standalone mode (which may be a unix socket), else one at its address.
    pub fn subscriber(&self, redis: &Redis, master: &Master) -> Result<Client, ConnError> {
        match &self.inner {
            Inner::Single(_) => redis.client_for_url(0),
            _ => redis.node_client(&master.addr),
        }
    }
}

/// A standalone connection made elsewhere (tests, tools), with the same
/// `EVALSHA`-then-`EVAL` script handling.
impl From<ConnectionManager> for RedisConn {
    fn from(c: ConnectionManager) -> Self {
        let db = c.get_db();
        RedisConn {
            inner: Inner::Single(c),
            db,
        }
    }
}

impl ConnectionLike for RedisConn {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        Box::pin(async move {
            match self.raw_command(cmd).await {
                Err(e) if e.code() == Some("NOSCRIPT") => match scripts::eval_for(cmd) {
                    Some(eval) => self.raw_command(&eval).await,
                    None => Err(e),
                },
                other => other,
            }
        })
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        cmd: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        Box::pin(async move {
            match &mut self.inner {
                Inner::Single(c) => c.req_packed_commands(cmd, offset, count).await,
                Inner::Cluster(c) => c.req_packed_commands(cmd, offset, count).await,
                Inner::Sentinel(s) => {
                    let (g, mut c) = s.get_waiting().await.map_err(conn_error)?;
                    let r = c.req_packed_commands(cmd, offset, count).await;
                    // A pipeline's server errors come back as replies.
                    let demoted = |v: &Value| {
                        matches!(v, Value::ServerError(e)
                            if matches!(e.code(), "READONLY" | "MASTERDOWN" | "LOADING"))
                    };
                    let reresolve = match &r {
                        Err(e) => SentinelConn::must_reresolve(e),
                        Ok(replies) => replies.iter().any(demoted),
                    };
                    if reresolve {
                        s.forget(g).await;
                    }
                    r
                }
            }
        })
    }

    fn get_db(&self) -> i64 {
        self.db
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tls_failures_are_described_in_plain_words() {
        let e = RedisError::from(std::io::Error::other(
            "invalid peer certificate: UnknownIssuer",
        ));
        assert!(describe(&e).contains("tls_ca_file"), "{}", describe(&e));
        let e = RedisError::from(std::io::Error::other("invalid peer certificate: Expired"));
        assert!(describe(&e).contains("expired"));
    }
}
