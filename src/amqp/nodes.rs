//! Reaching RabbitMQ: the configured nodes, TLS, and one connection attempt
//! bounded in time, with failures explained in a sentence that names the node.

use std::os::fd::AsFd;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use lapin::tcp::{AsyncTcpStream, RustlsConnector, RustlsConnectorConfig};
use lapin::uri::{AMQPScheme, AMQPUri};
use lapin::{Connection, ConnectionProperties};

use super::AmqpError;
use crate::config::AmqpConfig;
use crate::secret::SecretUrl;

/// One node: where it is, and how it may be shown.
struct Node {
    uri: AMQPUri,
    /// The URL with its password masked.
    name: String,
}

/// Every configured node, with the TLS settings they share.
pub struct Nodes {
    nodes: Vec<Node>,
    tls: Option<RustlsConnector>,
    timeout: Duration,
}

impl Nodes {
    /// Parses the URLs and loads the TLS files (when any URL is `amqps://`).
    pub fn new(cfg: &AmqpConfig) -> Result<Self, AmqpError> {
        let nodes = cfg
            .urls
            .iter()
            .map(|u| {
                Ok(Node {
                    uri: parse_uri(u)?,
                    name: u.redacted(),
                })
            })
            .collect::<Result<Vec<_>, AmqpError>>()?;
        if nodes.is_empty() {
            return Err(AmqpError::Tls("[amqp] no node configured".into()));
        }
        let tls = if nodes.iter().any(|n| n.uri.scheme == AMQPScheme::AMQPS) {
            Some(connector(cfg)?)
        } else {
            None
        };
        Ok(Self {
            nodes,
            tls,
            timeout: cfg.connect_timeout,
        })
    }

    /// How many nodes there are.
    pub fn len(&self) -> usize {
        self.nodes.len()
    }

    /// Always false: a configuration has at least one node.
    pub fn is_empty(&self) -> bool {
        self.nodes.is_empty()
    }

    /// Node `i`'s URL, password masked.
    pub fn name(&self, i: usize) -> &str {
        &self.nodes[i % self.nodes.len()].name
    }

    /// Connects to node `i` (modulo the count): TCP, TLS when `amqps://`, and
    /// the AMQP handshake, all within `connect_timeout`. With
    /// `filter_unreadable`, lapin reads the broker through
    /// [`super::unreadable`], for a consumer that must get past any message.
    ///
    /// lapin runs the handshake on a thread of its own that waits on the
    /// socket without a deadline, so timing out the future alone would leave
    /// that thread and socket behind for every attempt at a server that
    /// accepts and never answers. The socket is therefore shut down too,
    /// which ends lapin's thread.
    pub async fn connect(
        &self,
        i: usize,
        conn_name: &str,
        filter_unreadable: bool,
    ) -> Result<Connection, AmqpError> {
        let node = &self.nodes[i % self.nodes.len()];
        let runtime = lapin::runtime::default_runtime()?;
        let socket: Arc<Mutex<Option<std::net::TcpStream>>> = Arc::default();
        let slot = socket.clone();
        let tls = self.tls.clone();
        let timeout = self.timeout;
        let open = move |uri: AMQPUri, _rt| {
            let slot = slot.clone();
            let tls = tls.clone();
            async move {
                let stream = open_stream(uri, slot, tls, timeout).await?;
                if !filter_unreadable {
                    return Ok(stream);
                }
                let filtered = super::unreadable::behind_filter(stream).await?;
                Ok(AsyncTcpStream::Plain(async_compat::Compat::new(filtered)))
            }
        };
        let props = ConnectionProperties::default().with_connection_name(conn_name.into());
        let attempt = Connection::connector(node.uri.clone(), runtime, open, props);
        match tokio::time::timeout(self.timeout, attempt).await {
            Ok(Ok(c)) => Ok(c),
            Ok(Err(e)) => Err(AmqpError::Connect {
                node: node.name.clone(),
                reason: explain(&e, node.uri.scheme == AMQPScheme::AMQPS),
            }),
            Err(_) => {
                if let Some(s) = socket.lock().ok().and_then(|mut s| s.take()) {
                    let _ = s.shutdown(std::net::Shutdown::Both);
                }
                Err(AmqpError::Connect {
                    node: node.name.clone(),
                    reason: format!(
                        "no answer within {} (connect_timeout): the port accepts connections but nothing completes the {}handshake; is this the right port{}?",
                        humantime::format_duration(self.timeout),
                        if node.uri.scheme == AMQPScheme::AMQPS { "TLS or AMQP " } else { "AMQP " },
                        if node.uri.scheme == AMQPScheme::AMQPS { "" } else { ", or a TLS port behind amqp://" }
                    ),
                })
            }
        }
    }
}

/// TCP (bounded by `timeout`), then TLS for `amqps://`. A duplicate of the
/// socket goes into `slot`, so a caller that gives up can shut it down.
async fn open_stream(
    uri: AMQPUri,
    slot: Arc<Mutex<Option<std::net::TcpStream>>>,
    tls: Option<RustlsConnector>,
    timeout: Duration,
) -> lapin::Result<AsyncTcpStream<async_compat::Compat<tokio::net::TcpStream>>> {
    let host = uri.authority.host.clone();
    let tcp = tokio::time::timeout(
        timeout,
        tokio::net::TcpStream::connect((host.as_str(), uri.authority.port)),
    )
    .await
    .map_err(|_| std::io::Error::from(std::io::ErrorKind::TimedOut))??;
    let _ = tcp.set_nodelay(true);
    let dup = tcp.as_fd().try_clone_to_owned()?;
    if let Ok(mut s) = slot.lock() {
        *s = Some(std::net::TcpStream::from(dup));
    }
    let stream = AsyncTcpStream::Plain(async_compat::Compat::new(tcp));
    match (&uri.scheme, tls) {
        (AMQPScheme::AMQPS, Some(c)) => stream.into_rustls(&c, &host).await,
        _ => Ok(stream),
    }
    .map_err(lapin::Error::from)
}

/// Parses one URL and asks for 10 s heartbeats unless the URL sets its own,
/// so a dead TCP connection is noticed in seconds rather than minutes.
pub fn parse_uri(url: &SecretUrl) -> Result<AMQPUri, AmqpError> {
    let mut uri: AMQPUri = url
        .expose()
        .parse()
        .map_err(|reason: String| AmqpError::Url {
            url: url.redacted(),
            reason: crate::secret::url_reason(url.expose(), &reason),
        })?;
    if uri.query.heartbeat.is_none() {
        uri.query.heartbeat = Some(10);
    }
    Ok(uri)
}

/// The rustls client for every `amqps://` node: the private CA alone when
/// `tls_ca_file` is set (a public CA must not vouch for a private broker),
/// the public web roots otherwise; the client certificate when configured.
/// Built once, so TLS sessions resume across reconnects.
fn connector(cfg: &AmqpConfig) -> Result<RustlsConnector, AmqpError> {
    let material = cfg
        .tls
        .load("amqp")
        .map_err(|p| AmqpError::Tls(p.join("; ")))?;
    let base = match material.roots {
        Some(roots) => RustlsConnectorConfig::default().with_parsable_certificates(roots),
        None => RustlsConnectorConfig::new_with_webpki_root_certs(),
    };
    match material.identity {
        Some((certs, key)) => base.connector_with_single_cert(certs, key),
        None => base.connector_with_no_client_auth(),
    }
    .map_err(|e| AmqpError::Tls(format!("[amqp] TLS settings unusable: {e}")))
}

/// One sentence on why a connection failed and what to do about it.
fn explain(e: &lapin::Error, tls: bool) -> String {
    let raw = crate::secret::redact_url(&e.to_string());
    let debug = format!("{e:?}");
    let has = |needle: &str| raw.contains(needle) || debug.contains(needle);
    let hint = if has("UnknownIssuer") {
        "TLS: the server's certificate is not signed by a CA delayd trusts; set [amqp] tls_ca_file to the CA that signed it"
    } else if has("Expired") || has("expired") {
        "TLS: the server's certificate has expired (or this machine's clock is wrong); renew the certificate"
    } else if has("NotValidYet") {
        "TLS: the server's certificate is not valid yet (or this machine's clock is wrong)"
    } else if has("NotValidForName") || has("not valid for name") {
        "TLS: the server's certificate does not name this host; connect with a name or IP it lists, or reissue it"
    } else if has("InvalidContentType") || has("corrupt message") || (tls && has("WrongVersion")) {
        "TLS: the server did not answer in TLS; this port speaks clear text: use amqp:// or the broker's TLS port (usually 5671)"
    } else if has("CertificateRequired") {
        "TLS: the server requires a client certificate; set [amqp] tls_cert_file and tls_key_file"
    } else if has("BadCertificate") || has("UnknownCA") || has("DecryptError") {
        "TLS: the server refused delayd's client certificate; use one signed by a CA the server trusts"
    } else if has("HandshakeFailure") {
        "TLS: the server refused the handshake (a client certificate it wants, or no common cipher)"
    } else if has("ACCESS_REFUSED") || has("AccessRefused") {
        "login refused: check the user and password in the URL (with auth_mechanism=external, that a user named after the client certificate exists and may use the vhost)"
    } else if has("NOT_ALLOWED") || has("NotAllowed") {
        "the vhost in the URL does not exist or the user may not use it"
    } else if has("ConnectionRefused") || has("Connection refused") {
        "connection refused: is RabbitMQ running and listening on this port?"
    } else if has("TimedOut") {
        "TCP connect timed out: is the host reachable?"
    } else if tls && (has("UnexpectedEof") || has("ConnectionReset") || has("ConnectionAborted")) {
        "TLS: the server closed the connection during the handshake; does it require a client certificate (tls_cert_file, tls_key_file), or is this not a TLS port?"
    } else {
        ""
    };
    if hint.is_empty() {
        raw
    } else {
        format!("{hint} ({raw})")
    }
}
