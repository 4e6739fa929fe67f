//! Configuration: one TOML file layered with `DELAYD_`-prefixed environment
//! variables, validated in full before any connection is made.

use std::collections::BTreeMap;
use std::fmt;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;

use crate::keys::ShardNames;

/// A configuration problem a user can fix by editing the file or environment.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file is missing or unreadable.
    #[error("config file {path}: {reason}")]
    Unreadable {
        /// The file named on the command line.
        path: PathBuf,
        /// What went wrong reading it.
        reason: String,
    },
    /// The file does not parse, or a field has the wrong type or is unknown.
    #[error("config file {path}: {reason}")]
    Parse {
        /// The file named on the command line.
        path: PathBuf,
        /// The parser's explanation, naming the field.
        reason: String,
    },
    /// The file parses but its values are unusable; every problem is listed.
    #[error("config file {path}: {}", problems.join("; "))]
    Invalid {
        /// The file named on the command line.
        path: PathBuf,
        /// One entry per problem, each naming the section or business and field.
        problems: Vec<String>,
    },
}

/// A URL that may carry a password: it prints with the password masked, so it
/// can go into logs and `check` output without leaking the secret.
#[derive(Clone, Deserialize)]
#[serde(transparent)]
pub struct SecretUrl(String);

impl SecretUrl {
    /// Wraps a URL.
    pub fn new(url: impl Into<String>) -> Self {
        Self(url.into())
    }

    /// The real URL, for handing to a client library and nothing else.
    pub fn expose(&self) -> &str {
        &self.0
    }

    /// The URL with any password replaced by `***`.
    pub fn redacted(&self) -> String {
        redact_url(&self.0)
    }
}

impl fmt::Debug for SecretUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.redacted())
    }
}

impl fmt::Display for SecretUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.redacted())
    }
}

/// Masks every password a URL can carry: the one in
/// `scheme://user:password@host` (whatever characters it holds, reserved
/// ones included) and the `pass=`/`password=` query parameters redis-rs
/// reads (`redis+unix:///path?pass=...`).
pub fn redact_url(url: &str) -> String {
    let Some(scheme_end) = url.find("://") else {
        return url.to_string();
    };
    let (head, rest) = url.split_at(scheme_end + 3);
    // The userinfo ends at the last '@': a password may hold '/', '?', '#'
    // or '@' unencoded, a host never holds '@'.
    let rest = match rest.rfind('@') {
        Some(at) => {
            let userinfo = &rest[..at];
            let masked = match userinfo.find(':') {
                Some(colon) => format!("{}:***", &userinfo[..colon]),
                None => userinfo.to_string(),
            };
            format!("{masked}{}", &rest[at..])
        }
        None => rest.to_string(),
    };
    format!("{head}{}", redact_query(&rest))
}

/// `pass=...` and `password=...` query values replaced by `***`.
fn redact_query(rest: &str) -> String {
    let Some(q) = rest.find('?') else {
        return rest.to_string();
    };
    let params: Vec<String> = rest[q + 1..]
        .split('&')
        .map(|p| match p.split_once('=') {
            Some((k, _))
                if k.eq_ignore_ascii_case("pass") || k.eq_ignore_ascii_case("password") =>
            {
                format!("{k}=***")
            }
            _ => p.to_string(),
        })
        .collect();
    format!("{}?{}", &rest[..q], params.join("&"))
}

/// Why a URL did not parse, without quoting it: a parser's reason can hold
/// a piece of a password that is not percent-encoded.
pub fn url_reason(url: &str, reason: &str) -> String {
    let has_password = url
        .find("://")
        .is_some_and(|i| url[i + 3..].contains('@') || url.contains("pass"));
    if has_password {
        "characters such as / ? # @ : % or spaces in a user name or password must be percent-encoded".to_string()
    } else {
        redact_url(reason)
    }
}

/// The AMQP properties of delayd's messages. The broker pays for a header
/// table on every message (10–30 % of RabbitMQ's throughput on 64-byte
/// bodies on this project's 2-core bench, whatever the table holds), and
/// next to nothing for the standard properties.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Properties {
    /// The default: the facts consumers need in standard properties only:
    /// `message_id`, `type` (the business), `app_id` (`delayd`),
    /// `timestamp` (the due time, in seconds), and an `x-delayd-attempt`
    /// header on retries only (no header means the first attempt).
    Standard,
    /// `message_id`, `timestamp` (publish time) and the `x-delayd-*`
    /// headers: the due time to the millisecond on every message.
    Full,
    /// `message_id` and `timestamp`: consumers can still de-duplicate.
    NoHeaders,
    /// Nothing but `delivery_mode` and `content_type`, like a plain publisher.
    Bare,
}

/// How producers write the due time into the score.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ScoreUnit {
    /// Epoch milliseconds (the default).
    Millis,
    /// Epoch seconds, possibly fractional, as several common recipes write.
    Seconds,
}

impl ScoreUnit {
    /// Milliseconds per score unit, as the Lua scripts take it.
    pub fn millis(self) -> u64 {
        match self {
            ScoreUnit::Millis => 1,
            ScoreUnit::Seconds => 1000,
        }
    }
}

/// What the member of a business's sorted set is: the one setting the
/// store, the scanner and the commands consult to know where a task's body
/// lives.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum MemberMode {
    /// The member is the message body (the default): identical bodies
    /// collapse while pending, and a task is addressed by its bytes.
    #[default]
    Body,
    /// The member is a task id and the body lives in the hash `{K}:body`,
    /// so a task can be cancelled, moved and looked up by its id.
    Id {
        /// An id delivered within this long is not delivered again.
        dedup_window: Option<Duration>,
    },
}

impl MemberMode {
    /// Whether members are ids with their bodies kept beside them.
    pub fn is_id(self) -> bool {
        matches!(self, MemberMode::Id { .. })
    }

    /// The de-duplication window, in id mode when one is set.
    pub fn dedup_window(self) -> Option<Duration> {
        match self {
            MemberMode::Id { dedup_window } => dedup_window,
            MemberMode::Body => None,
        }
    }

    /// The value of the `member` setting this mode comes from.
    pub fn name(self) -> &'static str {
        match self {
            MemberMode::Body => "body",
            MemberMode::Id { .. } => "id",
        }
    }
}

/// Log output format.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogFormat {
    /// Human-readable lines.
    Text,
    /// One JSON object per line, for log shippers.
    Json,
}

/// Which kind of Redis deployment delayd talks to (`[redis] mode`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RedisMode {
    /// One server (the default).
    Standalone,
    /// A Redis Cluster, found from its seed nodes.
    Cluster,
    /// A master found through Redis Sentinel.
    Sentinel,
}

impl RedisMode {
    /// The value of the `mode` setting.
    pub fn name(self) -> &'static str {
        match self {
            RedisMode::Standalone => "standalone",
            RedisMode::Cluster => "cluster",
            RedisMode::Sentinel => "sentinel",
        }
    }
}

/// A secret that is never printed: `Debug` and `Display` show `***`.
#[derive(Clone, Deserialize)]
#[serde(transparent)]
pub struct Secret(String);

impl Secret {
    /// A secret holding `s`.
    pub(crate) fn new(s: &str) -> Self {
        Self(s.to_string())
    }

    /// The secret itself, for handing to a client library and nothing else.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("***")
    }
}

/// A TOML basic string holding `s`.
fn toml_string(s: &str) -> String {
    format!("\"{}\"", s.replace('\\', "\\\\").replace('"', "\\\""))
}

/// The `tls_*_file` lines of a section, for [`RedisConfig::to_toml`] and
/// [`AmqpConfig::to_toml`].
fn tls_toml(files: &crate::tls::TlsFiles, out: &mut String) {
    for (field, path) in [
        ("tls_ca_file", &files.ca_file),
        ("tls_cert_file", &files.cert_file),
        ("tls_key_file", &files.key_file),
    ] {
        if let Some(p) = path {
            out.push_str(&format!(
                "{field} = {}\n",
                toml_string(&p.to_string_lossy())
            ));
        }
    }
}

/// The validated `[redis]` section.
#[derive(Debug, Clone)]
pub struct RedisConfig {
    /// Standalone, cluster or sentinel.
    pub mode: RedisMode,
    /// Standalone: the one server. Cluster: seed nodes. Sentinel: the
    /// sentinels (their user, password and database are the master's).
    pub urls: Vec<SecretUrl>,
    /// Sentinel: the name the sentinels know the master by.
    pub master_name: Option<String>,
    /// Sentinel: the sentinels' own password, when they require one.
    pub sentinel_password: Option<Secret>,
    /// Certificates for TLS; empty for the system's roots and no client certificate.
    pub tls: crate::tls::TlsFiles,
}

impl RedisConfig {
    /// True when the URLs ask for TLS.
    pub fn is_tls(&self) -> bool {
        self.urls
            .first()
            .is_some_and(|u| u.expose().starts_with("rediss://"))
    }

    /// The URLs with passwords masked, for logs and `check`.
    pub fn describe(&self) -> String {
        let urls: Vec<String> = self.urls.iter().map(|u| u.redacted()).collect();
        match self.mode {
            RedisMode::Standalone => urls.join(", "),
            RedisMode::Cluster => format!("cluster via {}", urls.join(", ")),
            RedisMode::Sentinel => format!(
                "master \"{}\" via sentinels {}",
                self.master_name.as_deref().unwrap_or(""),
                urls.join(", ")
            ),
        }
    }

    /// The section as TOML, secrets included: for the temporary config
    /// `delayd bench` hands its child (a file only its owner can read).
    pub fn to_toml(&self) -> String {
        let mut out = format!("[redis]\nmode = \"{}\"\n", self.mode.name());
        let urls: Vec<String> = self.urls.iter().map(|u| toml_string(u.expose())).collect();
        if self.mode == RedisMode::Standalone {
            out.push_str(&format!("url = {}\n", urls.join(", ")));
        } else {
            out.push_str(&format!("urls = [{}]\n", urls.join(", ")));
        }
        if let Some(m) = &self.master_name {
            out.push_str(&format!("master_name = {}\n", toml_string(m)));
        }
        if let Some(p) = &self.sentinel_password {
            out.push_str(&format!(
                "sentinel_password = {}\n",
                toml_string(p.expose())
            ));
        }
        tls_toml(&self.tls, &mut out);
        out
    }
}

/// Where a business's `max_rate` bucket lives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RateScope {
    /// Each process has its own bucket: N processes publish up to N × max_rate.
    Process,
    /// One bucket in Redis shared by every process.
    Cluster,
}

/// The validated configuration the daemon and commands run with.
#[derive(Debug, Clone)]
pub struct Config {
    /// The file it came from, for messages.
    pub path: PathBuf,
    /// How to reach Redis.
    pub redis: RedisConfig,
    /// RabbitMQ: its nodes and how to reach them.
    pub amqp: AmqpConfig,
    /// Where `/metrics`, `/healthz`, `/readyz`, the console and the API are
    /// served; `None` turns the server off.
    pub http_listen: Option<SocketAddr>,
    /// The bearer token API writes need; `None`: the API is read-only.
    pub http_admin_token: Option<Secret>,
    /// Log format.
    pub log_format: LogFormat,
    /// Log filter, in `tracing_subscriber::EnvFilter` syntax.
    pub log_level: String,
    /// Every business, by name, sorted.
    pub businesses: Vec<Business>,
}

impl Config {
    /// The business called `name`, or an error that lists the known ones.
    pub fn business(&self, name: &str) -> Result<&Business, String> {
        self.businesses
            .iter()
            .find(|b| b.name == name)
            .ok_or_else(|| {
                let known: Vec<&str> = self.businesses.iter().map(|b| b.name.as_str()).collect();
                format!(
                    "unknown business \"{name}\" in {}: known businesses are {}",
                    self.path.display(),
                    known.join(", ")
                )
            })
    }
}

/// The `[amqp]` section: one node (`url`) or several (`urls`), all reached
/// the same way, clear text or TLS.
#[derive(Debug, Clone)]
pub struct AmqpConfig {
    /// The nodes, at least one; `url` is the one-node form.
    pub urls: Vec<SecretUrl>,
    /// Private CA and client certificate for `amqps://`.
    pub tls: crate::tls::TlsFiles,
    /// Longest wait for TCP, TLS and the AMQP handshake of one node.
    pub connect_timeout: Duration,
}

impl AmqpConfig {
    /// The section as TOML, secrets included, for a configuration file that
    /// delayd writes for its own child processes (`delayd bench`).
    pub fn to_toml(&self) -> String {
        let urls: Vec<String> = self.urls.iter().map(|u| toml_string(u.expose())).collect();
        let mut out = format!(
            "[amqp]\nurls = [{}]\nconnect_timeout = \"{}\"\n",
            urls.join(", "),
            humantime::format_duration(self.connect_timeout)
        );
        tls_toml(&self.tls, &mut out);
        out
    }
}

impl fmt::Display for AmqpConfig {
    /// The nodes, passwords masked.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let urls: Vec<String> = self.urls.iter().map(SecretUrl::redacted).collect();
        f.write_str(&urls.join(", "))
    }
}

/// One stream of delayed work: a Redis key (or shards of it) dispatched to
/// one exchange and routing key.
#[derive(Debug, Clone)]
pub struct Business {
    /// The name under `[businesses.NAME]`.
    pub name: String,
    /// The sorted set producers write to.
    pub key: String,
    /// Exchange to publish to (may be `""`, the default exchange).
    pub exchange: String,
    /// Routing key to publish with.
    pub routing_key: String,
    /// Concurrent claim-and-publish loops per key.
    pub scanners: usize,
    /// Most members one claim script call moves.
    pub batch_size: usize,
    /// Most unconfirmed publishes one scanner keeps in flight.
    pub window: usize,
    /// How long a claim is leased before another instance may recover it.
    pub lease: Duration,
    /// Publish attempts (returns and nacks) before a member is dead-lettered.
    pub max_attempts: u32,
    /// First retry delay; doubles per attempt.
    pub retry_backoff: Duration,
    /// Cap on the retry delay.
    pub retry_backoff_max: Duration,
    /// Unit of the scores producers write.
    pub score_unit: ScoreUnit,
    /// Number of shards; 1 means the single key `K`.
    pub shards: usize,
    /// How the shards' keys are named.
    pub shard_names: ShardNames,
    /// Start even when members wait under key names this business does not
    /// read (see [`crate::unread`]), with a warning instead of a refusal.
    pub ignore_unread_keys: bool,
    /// Publish with `delivery_mode = 2`.
    pub persistent: bool,
    /// `content_type` property, when set.
    pub content_type: Option<String>,
    /// Which AMQP properties each message carries besides `delivery_mode`
    /// and `content_type`.
    pub properties: Properties,
    /// How long a clean stop waits for owed confirms before returning members.
    pub shutdown_timeout: Duration,
    /// Publishes per second across the business, when capped.
    pub max_rate: Option<u32>,
    /// Whether `max_rate` holds per process or across every process.
    pub max_rate_scope: RateScope,
    /// Longest idle sleep when keyspace notifications are not available.
    pub poll_interval: Duration,
    /// Longest idle sleep while keyspace notifications wake delayd early.
    pub watchdog_interval: Duration,
    /// Whether members are bodies or task ids.
    pub member: MemberMode,
    /// Messages published with `x-delay` to an intake exchange, when set.
    pub intake: Option<crate::intake::Settings>,
    /// Recurring schedules whose occurrences delayd writes ahead.
    pub recurring: Vec<crate::recurring::Schedule>,
}

impl Business {
    /// The Redis keys this business reads: `K`, or its shards' keys, named
    /// as [`Business::shard_names`] says.
    pub fn keys(&self) -> Vec<String> {
        crate::keys::shard_keys(&self.key, self.shards, self.shard_names)
    }

    /// Whether members' bodies may be stored envelopes (routing key,
    /// properties, body) rather than plain bodies: an intake's messages and
    /// occurrences of schedules with their own routing key are.
    pub fn stores_envelopes(&self) -> bool {
        self.intake.is_some() || self.recurring.iter().any(|s| s.routing_key.is_some())
    }
}

#[derive(Debug, Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct RawConfig {
    redis: Option<RawRedis>,
    amqp: Option<RawAmqp>,
    http: Option<crate::http::settings::RawHttp>,
    log: Option<RawLog>,
    businesses: Option<BTreeMap<String, RawBusiness>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawRedis {
    mode: Option<String>,
    url: Option<SecretUrl>,
    #[serde(default, deserialize_with = "url_list")]
    urls: Option<Vec<SecretUrl>>,
    master_name: Option<String>,
    sentinel_password: Option<Secret>,
    tls_ca_file: Option<PathBuf>,
    tls_cert_file: Option<PathBuf>,
    tls_key_file: Option<PathBuf>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawAmqp {
    url: Option<SecretUrl>,
    #[serde(default, deserialize_with = "url_list")]
    urls: Option<Vec<SecretUrl>>,
    tls_ca_file: Option<PathBuf>,
    tls_cert_file: Option<PathBuf>,
    tls_key_file: Option<PathBuf>,
    connect_timeout: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawLog {
    format: Option<String>,
    level: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawBusiness {
    key: Option<String>,
    exchange: Option<String>,
    routing_key: Option<String>,
    scanners: Option<i64>,
    batch_size: Option<i64>,
    window: Option<i64>,
    lease: Option<String>,
    max_attempts: Option<i64>,
    retry_backoff: Option<String>,
    retry_backoff_max: Option<String>,
    score_unit: Option<String>,
    shards: Option<i64>,
    shard_names: Option<String>,
    ignore_unread_keys: Option<bool>,
    persistent: Option<bool>,
    content_type: Option<String>,
    properties: Option<String>,
    shutdown_timeout: Option<String>,
    max_rate: Option<i64>,
    max_rate_scope: Option<String>,
    poll_interval: Option<String>,
    watchdog_interval: Option<String>,
    member: Option<String>,
    dedup_window: Option<String>,
    intake: Option<RawIntake>,
    recurring: Option<std::collections::BTreeMap<String, crate::recurring::settings::RawSchedule>>,
}

/// `[businesses.NAME.intake]`, as written (see [`crate::intake`]).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawIntake {
    exchange: Option<String>,
    queue: Option<String>,
    queue_type: Option<String>,
    prefetch: Option<i64>,
    batch_size: Option<i64>,
    dead_letter_exchange: Option<String>,
    max_message_size: Option<i64>,
    x_delay: Option<String>,
}

/// A node list: an array in the file, or one string from the environment
/// (`DELAYD_AMQP__URLS`, `DELAYD_REDIS__URLS`) with the URLs separated by
/// whitespace or by commas. A comma splits only where the next URL's scheme
/// follows it, so a comma inside a password stays part of it.
fn url_list<'de, D>(d: D) -> Result<Option<Vec<SecretUrl>>, D::Error>
where
    D: serde::Deserializer<'de>,
{
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum List {
        Many(Vec<SecretUrl>),
        One(String),
    }
    Ok(Option::<List>::deserialize(d)?.map(|l| match l {
        List::Many(v) => v,
        List::One(s) => split_urls(&s).into_iter().map(SecretUrl::new).collect(),
    }))
}

/// Splits a string of URLs at whitespace and at each comma that a scheme
/// (`letters://`) follows.
fn split_urls(s: &str) -> Vec<String> {
    let mut out = Vec::new();
    for word in s.split_whitespace() {
        let mut start = 0;
        for (i, _) in word.match_indices(',') {
            let next = &word[i + 1..];
            let scheme = next.split("://").next().unwrap_or("");
            if next.contains("://")
                && !scheme.is_empty()
                && scheme
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '+')
            {
                out.push(word[start..i].to_string());
                start = i + 1;
            }
        }
        out.push(word[start..].to_string());
    }
    out.retain(|u| !u.is_empty());
    out
}

/// Default values of the optional business fields, shown in the README.
pub mod defaults {
    /// Scanners per key.
    pub const SCANNERS: usize = 2;
    /// Members per claim.
    pub const BATCH_SIZE: usize = 256;
    /// Unconfirmed publishes per scanner.
    pub const WINDOW: usize = 1024;
    /// Claim lease.
    pub const LEASE: &str = "30s";
    /// Attempts before dead-lettering.
    pub const MAX_ATTEMPTS: u32 = 5;
    /// First retry delay.
    pub const RETRY_BACKOFF: &str = "1s";
    /// Retry delay cap.
    pub const RETRY_BACKOFF_MAX: &str = "5m";
    /// Clean-stop bound.
    pub const SHUTDOWN_TIMEOUT: &str = "10s";
    /// Idle sleep bound without notifications.
    pub const POLL_INTERVAL: &str = "1s";
    /// Idle sleep bound with notifications.
    pub const WATCHDOG_INTERVAL: &str = "5s";
}

/// Reads, layers and validates the configuration at `path`.
pub fn load(path: &Path) -> Result<Config, ConfigError> {
    load_with_env(path, delayd_env())
}

/// [`load`] with the given `DELAYD_*` variables instead of the process's.
pub(crate) fn load_with_env(
    path: &Path,
    env: config::Map<String, String>,
) -> Result<Config, ConfigError> {
    if let Err(e) = std::fs::metadata(path).and_then(|_| std::fs::read(path)) {
        return Err(ConfigError::Unreadable {
            path: path.to_path_buf(),
            reason: format!("cannot read it ({e}); pass an existing file with --config"),
        });
    }
    let built = config::Config::builder()
        .add_source(config::File::from(path).format(config::FileFormat::Toml))
        .add_source(
            config::Environment::with_prefix("DELAYD")
                .prefix_separator("_")
                .separator("__")
                // Every value stays the string it was (`1.10` is not 1.1);
                // numbers and booleans parse where a field wants one.
                .try_parsing(false)
                .source(Some(env)),
        )
        .build()
        .map_err(|e| ConfigError::Parse {
            path: path.to_path_buf(),
            reason: one_line(&e.to_string()),
        })?;
    let raw: RawConfig = built.try_deserialize().map_err(|e| ConfigError::Parse {
        path: path.to_path_buf(),
        reason: describe_parse_error(&e.to_string()),
    })?;
    validate(path, raw)
}

/// The `DELAYD_*` variables that address a config section. Others with the
/// same prefix are not ours: Kubernetes, for one, injects `DELAYD_PORT` and
/// `DELAYD_SERVICE_HOST` for a Service named `delayd`.
fn delayd_env() -> config::Map<String, String> {
    const SECTIONS: [&str; 5] = ["REDIS__", "AMQP__", "HTTP__", "LOG__", "BUSINESSES__"];
    std::env::vars()
        .filter(|(k, _)| {
            k.strip_prefix("DELAYD_").is_some_and(|rest| {
                SECTIONS
                    .iter()
                    .any(|s| rest.to_ascii_uppercase().starts_with(s))
            })
        })
        .collect()
}

fn one_line(s: &str) -> String {
    s.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// Rewrites the `config` crate's "... for key `businesses.x.y`" into a
/// sentence that starts with the place, which is what a user looks for.
fn describe_parse_error(msg: &str) -> String {
    let msg = one_line(msg);
    const MARK: &str = " for key `";
    if let Some(idx) = msg.find(MARK) {
        let rest = &msg[idx + MARK.len()..];
        if let Some(end) = rest.find('`') {
            return format!("{}: {}", describe_key(&rest[..end]), &msg[..idx]);
        }
    }
    msg
}

fn describe_key(key: &str) -> String {
    let parts: Vec<&str> = key.split('.').collect();
    match parts.as_slice() {
        ["businesses", name] => format!("business \"{name}\""),
        ["businesses", name, field, ..] => format!("business \"{name}\", field \"{field}\""),
        [section] => format!("section [{section}]"),
        [section, field, ..] => format!("[{section}] field \"{field}\""),
        [] => key.to_string(),
    }
}

/// Validates `[redis]`, naming the field of every problem; reads the TLS
/// files so a missing or malformed one is refused before any connection.
fn validate_redis(raw: Option<RawRedis>, problems: &mut Vec<String>) -> RedisConfig {
    let raw = raw.unwrap_or(RawRedis {
        mode: None,
        url: None,
        urls: None,
        master_name: None,
        sentinel_password: None,
        tls_ca_file: None,
        tls_cert_file: None,
        tls_key_file: None,
    });
    let mode = match raw.mode.as_deref() {
        None | Some("standalone") => RedisMode::Standalone,
        Some("cluster") => RedisMode::Cluster,
        Some("sentinel") => RedisMode::Sentinel,
        Some(other) => {
            problems.push(format!(
                "[redis] field \"mode\" must be \"standalone\", \"cluster\" or \"sentinel\" (got \"{other}\")"
            ));
            RedisMode::Standalone
        }
    };
    let url = raw.url.filter(|u| !u.expose().is_empty());
    let listed = raw.urls.unwrap_or_default();
    let mut urls: Vec<(String, SecretUrl)> = Vec::new();
    match mode {
        RedisMode::Standalone => {
            if !listed.is_empty() {
                problems.push(
                    "[redis] field \"urls\" is for mode = \"cluster\" (seed nodes) or \"sentinel\" (the sentinels); a standalone server takes one url".into(),
                );
            }
            match url {
                Some(u) => urls.push(("url".into(), u)),
                None => problems.push(
                    "[redis] field \"url\" is required (e.g. redis://127.0.0.1:6379/0)".into(),
                ),
            }
        }
        RedisMode::Cluster | RedisMode::Sentinel => {
            // `url` is one more node, so a single configuration endpoint
            // (as managed services give) needs no list.
            urls.extend(url.map(|u| ("url".to_string(), u)));
            urls.extend(
                listed
                    .into_iter()
                    .enumerate()
                    .map(|(i, u)| (format!("urls[{i}]"), u)),
            );
            if urls.is_empty() {
                let example = if mode == RedisMode::Cluster {
                    "the seed nodes, e.g. [\"redis://10.0.0.1:7000\", \"redis://10.0.0.2:7000\"]"
                } else {
                    "the sentinels, e.g. [\"redis://10.0.0.1:26379\", \"redis://10.0.0.2:26379\"]"
                };
                problems.push(format!(
                    "[redis] field \"urls\" is required for mode = \"{}\": {example}",
                    mode.name()
                ));
            }
        }
    }
    for (field, u) in &urls {
        let text = u.expose();
        let schemes: &[&str] = if mode == RedisMode::Standalone {
            &["redis://", "rediss://", "unix://", "redis+unix://"]
        } else {
            &["redis://", "rediss://"]
        };
        if !schemes.iter().any(|p| text.starts_with(p)) {
            problems.push(format!(
                "[redis] field \"{field}\" must start with {} (got {})",
                schemes.join(" or "),
                u.redacted()
            ));
        } else if text.contains("#insecure") || text.contains("?insecure") {
            problems.push(format!(
                "[redis] field \"{field}\": \"insecure\" would turn off the check of the server's certificate, which delayd does not allow; trust a private CA with tls_ca_file instead"
            ));
        } else if let Err(e) = redis::IntoConnectionInfo::into_connection_info(text) {
            problems.push(format!(
                "[redis] field \"{field}\" is not a valid Redis URL ({}): {}",
                url_reason(text, &e.to_string()),
                u.redacted()
            ));
        } else if mode == RedisMode::Cluster && url_db(text).is_some_and(|db| db != 0) {
            problems.push(format!(
                "[redis] field \"{field}\": a cluster has only database 0 (got {})",
                u.redacted()
            ));
        }
    }
    let tls = urls
        .first()
        .is_some_and(|(_, u)| u.expose().starts_with("rediss://"));
    if urls
        .iter()
        .any(|(_, u)| u.expose().starts_with("rediss://") != tls)
    {
        problems.push(
            "[redis] fields \"url\"/\"urls\": mix rediss:// (TLS) and redis:// (clear text); use one for every node".into(),
        );
    }
    let master_name = raw.master_name.filter(|m| !m.is_empty());
    match (mode, &master_name) {
        (RedisMode::Sentinel, None) => problems.push(
            "[redis] field \"master_name\" is required for mode = \"sentinel\": the name the sentinels monitor the master under (SENTINEL MASTERS lists it)".into(),
        ),
        (RedisMode::Sentinel, Some(_)) | (_, None) => {}
        (_, Some(_)) => problems.push(format!(
            "[redis] field \"master_name\" is for mode = \"sentinel\" (mode is \"{}\")",
            mode.name()
        )),
    }
    if raw.sentinel_password.is_some() && mode != RedisMode::Sentinel {
        problems.push(format!(
            "[redis] field \"sentinel_password\" is for mode = \"sentinel\" (mode is \"{}\")",
            mode.name()
        ));
    }
    let files = crate::tls::TlsFiles {
        ca_file: raw.tls_ca_file,
        cert_file: raw.tls_cert_file,
        key_file: raw.tls_key_file,
    };
    if !files.is_empty() && !tls && !urls.is_empty() {
        problems.push(format!(
            "[redis] field \"{}\" needs rediss:// URLs: with redis:// the connection is not encrypted and the file would be ignored",
            files.first_field()
        ));
    } else {
        files.check("redis", problems);
    }
    RedisConfig {
        mode,
        urls: urls.into_iter().map(|(_, u)| u).collect(),
        master_name,
        sentinel_password: raw.sentinel_password,
        tls: files,
    }
}

/// The database number in a `redis://host:port/N` URL, if it names one.
fn url_db(url: &str) -> Option<i64> {
    let rest = &url[url.find("://")? + 3..];
    let path = &rest[rest.find('/')? + 1..];
    let end = path.find(['?', '#']).unwrap_or(path.len());
    path[..end].parse().ok()
}

/// Why `pem` is not a usable certificate file (or key file), if it is not.
fn validate(path: &Path, raw: RawConfig) -> Result<Config, ConfigError> {
    let mut problems = Vec::new();
    let redis = validate_redis(raw.redis, &mut problems);
    let amqp = validate_amqp(raw.amqp, &mut problems);
    let http = crate::http::settings::validate(raw.http, &mut problems);
    let (log_format, log_level) = {
        let log = raw.log.unwrap_or(RawLog {
            format: None,
            level: None,
        });
        let format = match log.format.as_deref() {
            None | Some("text") => LogFormat::Text,
            Some("json") => LogFormat::Json,
            Some(other) => {
                problems.push(format!(
                    "[log] field \"format\" must be \"text\" or \"json\" (got \"{other}\")"
                ));
                LogFormat::Text
            }
        };
        (format, log.level.unwrap_or_else(|| "info".into()))
    };

    let mut businesses = Vec::new();
    match raw.businesses {
        None => problems.push(
            "no businesses configured: add at least one [businesses.NAME] section with key, exchange and routing_key".into(),
        ),
        Some(map) if map.is_empty() => problems.push(
            "no businesses configured: add at least one [businesses.NAME] section with key, exchange and routing_key".into(),
        ),
        Some(map) => {
            for (name, rb) in map {
                if let Some(b) = validate_business(&name, rb, redis.mode, path, &mut problems) {
                    businesses.push(b);
                }
            }
        }
    }
    problems.extend(overlapping_families(&businesses));
    problems.extend(crate::intake::settings::shared_queues(&businesses));

    if !problems.is_empty() {
        return Err(ConfigError::Invalid {
            path: path.to_path_buf(),
            problems,
        });
    }
    Ok(Config {
        path: path.to_path_buf(),
        redis,
        amqp,
        http_listen: http.listen,
        http_admin_token: http.admin_token,
        log_format,
        log_level,
        businesses,
    })
}

/// The `[amqp]` rules: one of `url`/`urls`, valid AMQP URLs of one scheme,
/// TLS files only with `amqps://`, and readable, matching TLS files.
fn validate_amqp(raw: Option<RawAmqp>, problems: &mut Vec<String>) -> AmqpConfig {
    let raw = raw.unwrap_or(RawAmqp {
        url: None,
        urls: None,
        tls_ca_file: None,
        tls_cert_file: None,
        tls_key_file: None,
        connect_timeout: None,
    });
    let (field, urls) = match (raw.url, raw.urls) {
        (Some(_), Some(_)) => {
            problems.push("[amqp] fields \"url\" and \"urls\" are both set: use \"url\" for one node or \"urls\" for a cluster's nodes, not both".into());
            ("urls", Vec::new())
        }
        (Some(u), None) if !u.expose().is_empty() => ("url", vec![u]),
        (None, Some(list)) if list.is_empty() => {
            problems.push("[amqp] field \"urls\" must list at least one node".into());
            ("urls", Vec::new())
        }
        (None, Some(list)) => ("urls", list),
        _ => {
            problems.push(
                "[amqp] field \"url\" is required (e.g. amqp://guest:guest@127.0.0.1:5672/%2f), or \"urls\" for a cluster's nodes"
                    .into(),
            );
            ("url", Vec::new())
        }
    };
    let mut schemes = std::collections::BTreeSet::new();
    let mut external = false;
    for (i, u) in urls.iter().enumerate() {
        let place = if field == "url" {
            "[amqp] field \"url\"".to_string()
        } else {
            format!("[amqp] field \"urls\", entry {}", i + 1)
        };
        let text = u.expose();
        let scheme = ["amqp://", "amqps://"]
            .into_iter()
            .find(|p| text.starts_with(p));
        let Some(scheme) = scheme else {
            problems.push(format!(
                "{place} must start with amqp:// or amqps:// (got {})",
                u.redacted()
            ));
            continue;
        };
        schemes.insert(scheme);
        match text.parse::<lapin::uri::AMQPUri>() {
            Ok(uri) => {
                external |= uri.query.auth_mechanism == Some(lapin::uri::SASLMechanism::External);
            }
            Err(e) => problems.push(format!(
                "{place} is not a valid AMQP URL ({}): {}",
                url_reason(text, &e),
                u.redacted()
            )),
        }
    }
    if schemes.len() > 1 {
        problems.push("[amqp] field \"urls\" mixes amqp:// and amqps://: a password sent in clear text to one node is exposed for all; reach every node the same way".into());
    }
    let tls = crate::tls::TlsFiles {
        ca_file: raw.tls_ca_file,
        cert_file: raw.tls_cert_file,
        key_file: raw.tls_key_file,
    };
    let tls_urls = schemes.contains("amqps://");
    if !tls.is_empty() && !tls_urls && !urls.is_empty() && schemes.len() == 1 {
        problems.push(format!(
            "[amqp] field \"{}\" is set but [amqp] {field} is amqp:// (clear text), which ignores it: use amqps://",
            tls.first_field()
        ));
    }
    if external && tls.cert_file.is_none() {
        problems.push("[amqp] auth_mechanism=external in the URL logs in with a client certificate: set tls_cert_file and tls_key_file (and use amqps://)".into());
    }
    tls.check("amqp", problems);
    let connect_timeout = raw
        .connect_timeout
        .and_then(|s| {
            parse_duration(
                "[amqp] field \"connect_timeout\"",
                &s,
                limits::CONNECT_TIMEOUT,
                problems,
            )
        })
        .unwrap_or(Duration::from_secs(10));
    AmqpConfig {
        urls,
        tls,
        connect_timeout,
    }
}

/// The longest each duration setting may be, and why: past these a value is
/// a typo, and some would overflow (a lease past 2^43 ms no longer fits the
/// claim tag in a score; a stop or poll bound past `Instant`'s range panics).
pub mod limits {
    use std::time::Duration;

    const DAY: u64 = 86_400;
    /// `lease`.
    pub const LEASE: Duration = Duration::from_secs(DAY);
    /// `retry_backoff` and `retry_backoff_max`.
    pub const RETRY_BACKOFF: Duration = Duration::from_secs(30 * DAY);
    /// `shutdown_timeout`.
    pub const SHUTDOWN_TIMEOUT: Duration = Duration::from_secs(3600);
    /// `poll_interval` and `watchdog_interval`.
    pub const IDLE: Duration = Duration::from_secs(3600);
    /// `dedup_window`.
    pub const DEDUP_WINDOW: Duration = Duration::from_secs(30 * DAY);
    /// `[amqp] connect_timeout`.
    pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(600);
    /// AMQP short strings (exchange, routing key, content type, the
    /// business's name in `type`) are at most this many bytes.
    pub const SHORT_STRING: usize = 255;
}

/// A problem for every key two businesses would share: one's key (or a shard
/// key) that is another's, or that is one of another's helper keys (its
/// `{K}:dead`, `{K}:inflight`, ...), where one would publish or recover the
/// other's members.
fn overlapping_families(businesses: &[Business]) -> Vec<String> {
    let mut owner: BTreeMap<String, &str> = BTreeMap::new();
    let mut problems = Vec::new();
    for b in businesses {
        let mut mine: Vec<String> = Vec::new();
        for k in b.keys() {
            let family = crate::keys::KeyFamily::new(&k);
            mine.extend(family.all().into_iter().map(str::to_string));
        }
        mine.push(crate::keys::KeyFamily::new(&b.key).rate());
        mine.sort();
        mine.dedup();
        for k in mine {
            match owner.get(&k) {
                Some(other) if *other != b.name => problems.push(format!(
                    "business \"{}\", field \"key\": key \"{k}\" is also used by business \"{other}\": their key families overlap; give each business a key of its own, not another's or one of its helper keys ({{K}}:dead, {{K}}:inflight, ...)",
                    b.name
                )),
                _ => {
                    owner.insert(k, &b.name);
                }
            }
        }
    }
    problems
}

/// Parses a duration setting at `place` (e.g. `business "b", field "lease"`):
/// longer than zero and at most `max`, else a problem and `None`.
pub(crate) fn parse_duration(
    place: &str,
    s: &str,
    max: Duration,
    problems: &mut Vec<String>,
) -> Option<Duration> {
    match humantime::parse_duration(s.trim()) {
        Ok(d) if d.is_zero() => {
            problems.push(format!("{place} must be longer than zero (got \"{s}\")"));
            None
        }
        Ok(d) if d > max => {
            problems.push(format!(
                "{place} must be at most {} (got \"{s}\")",
                humantime::format_duration(max)
            ));
            None
        }
        Ok(d) => Some(d),
        Err(e) => {
            problems.push(format!(
                "{place}: cannot parse \"{s}\" as a duration ({e}); write e.g. \"250ms\", \"30s\" or \"5m\""
            ));
            None
        }
    }
}

/// A problem if `value` is longer than an AMQP short string can carry.
pub(crate) fn check_short_string(place: &str, value: &str, problems: &mut Vec<String>) {
    if value.len() > limits::SHORT_STRING {
        problems.push(format!(
            "{place} must be at most {} bytes (got {}): AMQP carries it as a short string",
            limits::SHORT_STRING,
            value.len()
        ));
    }
}

fn validate_business(
    name: &str,
    rb: RawBusiness,
    mode: RedisMode,
    path: &Path,
    problems: &mut Vec<String>,
) -> Option<Business> {
    let before = problems.len();
    let mut need = |field: &str, v: Option<String>, allow_empty: bool| -> String {
        match v {
            Some(s) if allow_empty || !s.is_empty() => s,
            Some(_) => {
                problems.push(format!(
                    "business \"{name}\", field \"{field}\" must not be empty"
                ));
                String::new()
            }
            None => {
                problems.push(format!(
                    "business \"{name}\", field \"{field}\" is required"
                ));
                String::new()
            }
        }
    };
    let key = need("key", rb.key, false);
    // The default exchange is named "", so an empty exchange is legitimate.
    let exchange = need("exchange", rb.exchange, true);
    // An intake message keeps its own routing key; the business's is only
    // for tasks scheduled another way.
    let routing_key = need(
        "routing_key",
        rb.routing_key
            .or_else(|| rb.intake.as_ref().map(|_| String::new())),
        true,
    );
    for (field, value) in [
        ("exchange", exchange.as_str()),
        ("routing_key", routing_key.as_str()),
        ("content_type", rb.content_type.as_deref().unwrap_or("")),
    ] {
        check_short_string(
            &format!("business \"{name}\", field \"{field}\""),
            value,
            problems,
        );
    }
    check_short_string(
        &format!(
            "business name \"{}...\"",
            name.chars().take(16).collect::<String>()
        ),
        name,
        problems,
    );
    if key.contains('}') && !crate::keys::has_hash_tag(&key) {
        problems.push(format!(
            "business \"{name}\", field \"key\": \"{key}\" has a '}}' but no hash tag such as {{tag}}, so its helper keys could not share its cluster slot"
        ));
    }

    let mut size = |field: &str, v: Option<i64>, default: usize, max: usize| -> usize {
        match v {
            None => default,
            Some(n) if n < 1 => {
                problems.push(format!(
                    "business \"{name}\", field \"{field}\" must be at least 1 (got {n})"
                ));
                default
            }
            Some(n) if n as u64 > max as u64 => {
                problems.push(format!(
                    "business \"{name}\", field \"{field}\" must be at most {max} (got {n})"
                ));
                default
            }
            Some(n) => n as usize,
        }
    };
    let scanners = size("scanners", rb.scanners, defaults::SCANNERS, 64);
    let batch_size = size("batch_size", rb.batch_size, defaults::BATCH_SIZE, 10_000);
    let window = size("window", rb.window, defaults::WINDOW, 100_000);
    let shards = size("shards", rb.shards, 1, 1024);
    let max_attempts = size(
        "max_attempts",
        rb.max_attempts,
        defaults::MAX_ATTEMPTS as usize,
        1000,
    ) as u32;
    let max_rate = rb
        .max_rate
        .map(|r| size("max_rate", Some(r), 1, 10_000_000) as u32);
    if mode == RedisMode::Cluster && shards > 1 && crate::keys::has_hash_tag(&key) {
        problems.push(format!(
            "business \"{name}\", field \"key\": \"{key}\" has a hash tag, so on a cluster all {shards} shards would share one slot and one master; drop the {{...}} from the key (delayd tags each shard itself)"
        ));
    }
    let shard_names = match rb.shard_names.as_deref() {
        // One default in every mode: a producer's key names must not
        // depend on where Redis runs.
        None | Some("index") => ShardNames::Index,
        Some("spread") => ShardNames::Spread,
        Some(other) => {
            problems.push(format!(
                "business \"{name}\", field \"shard_names\" must be \"index\" (K:0, K:1, ...) or \"spread\" (one slot range per shard) (got \"{other}\")"
            ));
            ShardNames::Index
        }
    };
    let max_rate_scope = match rb.max_rate_scope.as_deref() {
        None | Some("process") => RateScope::Process,
        Some("cluster") => RateScope::Cluster,
        Some(other) => {
            problems.push(format!(
                "business \"{name}\", field \"max_rate_scope\" must be \"process\" or \"cluster\" (got \"{other}\")"
            ));
            RateScope::Process
        }
    };
    if max_rate_scope == RateScope::Cluster && max_rate.is_none() {
        problems.push(format!(
            "business \"{name}\", field \"max_rate_scope\" = \"cluster\" needs max_rate (publishes per second shared by every process)"
        ));
    }

    let mut duration = |field: &str, v: Option<String>, default: &str, max: Duration| -> Duration {
        let s = v.unwrap_or_else(|| default.to_string());
        let place = format!("business \"{name}\", field \"{field}\"");
        parse_duration(&place, &s, max, problems)
            .unwrap_or_else(|| humantime::parse_duration(default).unwrap_or(Duration::from_secs(1)))
    };
    let lease = duration("lease", rb.lease, defaults::LEASE, limits::LEASE);
    let retry_backoff = duration(
        "retry_backoff",
        rb.retry_backoff,
        defaults::RETRY_BACKOFF,
        limits::RETRY_BACKOFF,
    );
    let retry_backoff_max = duration(
        "retry_backoff_max",
        rb.retry_backoff_max,
        defaults::RETRY_BACKOFF_MAX,
        limits::RETRY_BACKOFF,
    );
    let shutdown_timeout = duration(
        "shutdown_timeout",
        rb.shutdown_timeout,
        defaults::SHUTDOWN_TIMEOUT,
        limits::SHUTDOWN_TIMEOUT,
    );
    let poll_interval = duration(
        "poll_interval",
        rb.poll_interval,
        defaults::POLL_INTERVAL,
        limits::IDLE,
    );
    let watchdog_interval = duration(
        "watchdog_interval",
        rb.watchdog_interval,
        defaults::WATCHDOG_INTERVAL,
        limits::IDLE,
    );
    let dedup_window = rb
        .dedup_window
        .clone()
        .map(|w| duration("dedup_window", Some(w), "1h", limits::DEDUP_WINDOW));
    if lease < Duration::from_secs(1) {
        problems.push(format!(
            "business \"{name}\", field \"lease\" must be at least 1s (got {}): a shorter lease expires under ordinary confirm delays and causes duplicates",
            humantime::format_duration(lease)
        ));
    }
    let score_unit = match rb.score_unit.as_deref() {
        None | Some("ms") => ScoreUnit::Millis,
        Some("s") => ScoreUnit::Seconds,
        Some(other) => {
            problems.push(format!(
                "business \"{name}\", field \"score_unit\" must be \"ms\" or \"s\" (got \"{other}\")"
            ));
            ScoreUnit::Millis
        }
    };
    let properties = match rb.properties.as_deref() {
        None | Some("standard") => Properties::Standard,
        Some("full") => Properties::Full,
        Some("no-headers") => Properties::NoHeaders,
        Some("bare") => Properties::Bare,
        Some(other) => {
            problems.push(format!(
                "business \"{name}\", field \"properties\" must be \"standard\", \"full\", \"no-headers\" or \"bare\" (got \"{other}\")"
            ));
            Properties::Standard
        }
    };
    let intake = rb
        .intake
        .map(|raw| validate_intake(name, raw, rb.member.as_deref(), &exchange, problems));
    let recurring = rb.recurring.map_or_else(Vec::new, |raw| {
        let dir = path.parent().unwrap_or(Path::new("."));
        crate::recurring::settings::validate(name, raw, dir, problems)
    });
    if !recurring.is_empty() && rb.member.as_deref() == Some("body") {
        problems.push(format!("business \"{name}\", field \"member\": recurring schedules store each occurrence by its id, so they need member = \"id\" (or no member setting, which implies it)"));
    }
    // An intake or a schedule addresses every message by its id: id mode
    // is implied.
    let member_setting = rb
        .member
        .as_deref()
        .or(intake.as_ref().map(|_| "id"))
        .or((!recurring.is_empty()).then_some("id"));
    let member = match member_setting {
        None | Some("body") => {
            if rb.dedup_window.is_some() {
                problems.push(format!(
                    "business \"{name}\", field \"dedup_window\" needs member = \"id\": in body mode identical bodies already collapse while pending, and delivered bodies are not remembered"
                ));
            }
            MemberMode::Body
        }
        Some("id") => MemberMode::Id { dedup_window },
        Some(other) => {
            problems.push(format!(
                "business \"{name}\", field \"member\" must be \"body\" or \"id\" (got \"{other}\")"
            ));
            MemberMode::Body
        }
    };
    if problems.len() > before {
        return None;
    }
    Some(Business {
        name: name.to_string(),
        key,
        exchange,
        routing_key,
        scanners,
        batch_size,
        window: window.max(batch_size),
        lease,
        max_attempts,
        retry_backoff,
        retry_backoff_max,
        score_unit,
        shards,
        shard_names,
        ignore_unread_keys: rb.ignore_unread_keys.unwrap_or(false),
        persistent: rb.persistent.unwrap_or(true),
        content_type: rb.content_type.filter(|c| !c.is_empty()),
        properties,
        shutdown_timeout,
        max_rate,
        max_rate_scope,
        poll_interval,
        watchdog_interval,
        member,
        intake: intake.flatten(),
        recurring,
    })
}

/// The `intake` section's rules: both names set, usable on the broker and
/// distinct from the target; id mode (implied, or `member = "id"`).
fn validate_intake(
    name: &str,
    raw: RawIntake,
    member: Option<&str>,
    target: &str,
    problems: &mut Vec<String>,
) -> Option<crate::intake::Settings> {
    use crate::intake::settings::{defaults, QueueType, Settings, XDelay};
    let before = problems.len();
    let place = |field: &str| format!("business \"{name}\", field \"intake.{field}\"");
    let mut named = |field: &str, v: Option<String>| -> String {
        match v {
            Some(s) if s.is_empty() => {
                problems.push(format!("{} must not be empty", place(field)));
                s
            }
            Some(s) => {
                check_short_string(&place(field), &s, problems);
                if s.starts_with("amq.") {
                    problems.push(format!(
                        "{} \"{s}\" starts with \"amq.\", a prefix the broker reserves for itself",
                        place(field)
                    ));
                }
                s
            }
            None => {
                problems.push(format!("{} is required", place(field)));
                String::new()
            }
        }
    };
    let exchange = named("exchange", raw.exchange);
    let queue = named("queue", raw.queue);
    if !exchange.is_empty() && exchange == target {
        problems.push(format!("{}: \"{exchange}\" is also the business's exchange, where delayd delivers: each delivery would come back to the intake; producers publish to the intake exchange, consumers bind to the other", place("exchange")));
    }
    if member == Some("body") {
        problems.push(format!("business \"{name}\", field \"member\": an intake stores every message by its id, so it needs member = \"id\" (or no member setting, which implies it)"));
    }
    let queue_type = match raw.queue_type.as_deref() {
        None | Some("classic") => QueueType::Classic,
        Some("quorum") => QueueType::Quorum,
        Some(other) => {
            problems.push(format!(
                "{} must be \"classic\" or \"quorum\" (got \"{other}\")",
                place("queue_type")
            ));
            QueueType::Classic
        }
    };
    let x_delay = match raw.x_delay.as_deref() {
        None | Some("as-published") => XDelay::AsPublished,
        Some("negated") => XDelay::Negated,
        Some(other) => {
            problems.push(format!(
                "{} must be \"as-published\" or \"negated\" (got \"{other}\")",
                place("x_delay")
            ));
            XDelay::AsPublished
        }
    };
    let mut range = |field: &str, v: Option<i64>, default: i64, max: i64| -> i64 {
        match v {
            None => default,
            Some(n) if n < 1 || n > max => {
                problems.push(format!(
                    "{} must be between 1 and {max} (got {n})",
                    place(field)
                ));
                default
            }
            Some(n) => n,
        }
    };
    let prefetch = range("prefetch", raw.prefetch, defaults::PREFETCH as i64, 65_535) as u16;
    let batch_size = range(
        "batch_size",
        raw.batch_size,
        defaults::BATCH_SIZE as i64,
        10_000,
    ) as usize;
    let max_message_size = raw
        .max_message_size
        .map(|n| range("max_message_size", Some(n), 1, 512 << 20) as usize);
    let dead_letter_exchange = raw.dead_letter_exchange;
    if let Some(d) = &dead_letter_exchange {
        check_short_string(&place("dead_letter_exchange"), d, problems);
    }
    (problems.len() == before).then(|| Settings {
        exchange,
        queue,
        queue_type,
        prefetch,
        batch_size: batch_size.min(prefetch as usize),
        dead_letter_exchange,
        max_message_size,
        x_delay,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    const BASE: &str = r#"
[redis]
url = "redis://127.0.0.1:6379/0"
[amqp]
url = "amqp://guest:secret@127.0.0.1:5672/%2f"
"#;

    fn load_str(body: &str) -> Result<Config, ConfigError> {
        let mut f = tempfile::NamedTempFile::new().unwrap();
        f.write_all(body.as_bytes()).unwrap();
        load(f.path())
    }

    fn err_of(body: &str) -> String {
        load_str(body).unwrap_err().to_string()
    }

    fn business(extra: &str) -> String {
        format!(
            "{BASE}\n[businesses.billing]\nkey = \"k\"\nexchange = \"e\"\nrouting_key = \"r\"\n{extra}\n"
        )
    }

    #[test]
    fn a_valid_file_gets_defaults() {
        let c = load_str(&business("")).unwrap();
        let b = c.business("billing").unwrap();
        assert_eq!(b.scanners, defaults::SCANNERS);
        assert_eq!(b.batch_size, defaults::BATCH_SIZE);
        assert_eq!(b.lease, Duration::from_secs(30));
        assert_eq!(b.score_unit, ScoreUnit::Millis);
        assert!(b.persistent);
        assert_eq!(b.properties, Properties::Standard);
        assert_eq!(b.keys(), vec!["k".to_string()]);
    }

    #[test]
    fn unknown_field_is_refused_and_named() {
        let e = err_of(&business("batchsize = 5"));
        assert!(e.contains("batchsize"), "{e}");
        assert!(e.contains("billing"), "{e}");
    }

    #[test]
    fn unknown_top_level_section_is_refused() {
        let e = err_of(&format!("{}\n[redsi]\nurl = \"x\"\n", business("")));
        assert!(e.contains("redsi"), "{e}");
    }

    #[test]
    fn missing_key_exchange_routing_key_are_all_reported() {
        let e = err_of(&format!("{BASE}\n[businesses.billing]\nscanners = 1\n"));
        for f in ["\"key\"", "\"exchange\"", "\"routing_key\""] {
            assert!(e.contains(f), "{f} missing from {e}");
        }
        assert!(e.contains("billing"), "{e}");
    }

    #[test]
    fn zero_batch_size_is_refused() {
        let e = err_of(&business("batch_size = 0"));
        assert!(
            e.contains("business \"billing\", field \"batch_size\" must be at least 1 (got 0)"),
            "{e}"
        );
    }

    #[test]
    fn negative_scanners_is_refused() {
        let e = err_of(&business("scanners = -2"));
        assert!(
            e.contains("field \"scanners\" must be at least 1 (got -2)"),
            "{e}"
        );
    }

    #[test]
    fn unparseable_duration_is_refused() {
        let e = err_of(&business("lease = \"thirty seconds\""));
        assert!(e.contains("field \"lease\""), "{e}");
        assert!(e.contains("thirty seconds"), "{e}");
    }

    #[test]
    fn no_businesses_is_refused() {
        let e = err_of(BASE);
        assert!(e.contains("no businesses"), "{e}");
    }

    #[test]
    fn missing_file_is_refused() {
        let e = load(Path::new("/nonexistent/delayd.toml"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("/nonexistent/delayd.toml"), "{e}");
    }

    #[test]
    fn wrong_type_names_business_and_field() {
        let e = err_of(&business("batch_size = \"abc\""));
        assert!(
            e.contains("business \"billing\", field \"batch_size\""),
            "{e}"
        );
        assert!(e.contains("invalid type"), "{e}");
    }

    /// `[amqp]` as given, with a valid business.
    fn amqp_err(section: &str) -> String {
        err_of(&business("").replace(
            "[amqp]\nurl = \"amqp://guest:secret@127.0.0.1:5672/%2f\"\n",
            &format!("[amqp]\n{section}\n"),
        ))
    }

    /// `deploy/local/certs.sh` certificates, made once for these tests.
    fn certs() -> &'static Path {
        static DIR: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
        DIR.get_or_init(|| {
            let dir =
                std::env::temp_dir().join(format!("delayd-unit-certs-{}", std::process::id()));
            let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy/local/certs.sh");
            let out = std::process::Command::new(script)
                .arg(&dir)
                .output()
                .unwrap();
            assert!(
                out.status.success(),
                "{}",
                String::from_utf8_lossy(&out.stderr)
            );
            dir
        })
    }

    fn tls_section(url: &str, ca: &str, cert: &str, key: &str) -> String {
        let c = certs();
        let mut s = format!("url = \"{url}\"\n");
        for (field, file) in [
            ("tls_ca_file", ca),
            ("tls_cert_file", cert),
            ("tls_key_file", key),
        ] {
            if !file.is_empty() {
                s.push_str(&format!("{field} = \"{}\"\n", c.join(file).display()));
            }
        }
        s
    }

    #[test]
    fn amqps_with_a_private_ca_and_client_certificate_is_accepted() {
        let body = business("").replace(
            "url = \"amqp://guest:secret@127.0.0.1:5672/%2f\"",
            &tls_section(
                "amqps://guest:secret@127.0.0.1:5671/%2f",
                "ca.crt",
                "client.crt",
                "client.key",
            ),
        );
        let c = load_str(&body).unwrap();
        assert_eq!(c.amqp.urls.len(), 1);
        assert!(c.amqp.tls.cert_file.is_some());
        assert_eq!(c.amqp.connect_timeout, Duration::from_secs(10));
    }

    #[test]
    fn amqps_without_tls_files_is_accepted() {
        let c = load_str(&business("").replace("amqp://guest", "amqps://guest")).unwrap();
        assert!(c.amqp.urls[0].expose().starts_with("amqps://"));
    }

    #[test]
    fn the_node_list_comes_from_the_environment_comma_separated() {
        let body = business("").replace("url = \"amqp://guest:secret@127.0.0.1:5672/%2f\"\n", "");
        let mut f = tempfile::NamedTempFile::new().unwrap();
        f.write_all(body.as_bytes()).unwrap();
        let env = config::Map::from([(
            "DELAYD_AMQP__URLS".to_string(),
            "amqp://u:p1@a:5672/%2f,amqp://u:p2@b:5672/%2f".to_string(),
        )]);
        let c = load_with_env(f.path(), env).unwrap();
        let urls: Vec<&str> = c.amqp.urls.iter().map(|u| u.expose()).collect();
        assert_eq!(urls, ["amqp://u:p1@a:5672/%2f", "amqp://u:p2@b:5672/%2f"]);
    }

    #[test]
    fn url_and_urls_together_are_refused() {
        let e = amqp_err("url = \"amqp://h/%2f\"\nurls = [\"amqp://h/%2f\"]");
        assert!(
            e.contains("[amqp] fields \"url\" and \"urls\" are both set"),
            "{e}"
        );
    }

    #[test]
    fn neither_url_nor_urls_is_refused() {
        let e = amqp_err("connect_timeout = \"5s\"");
        assert!(e.contains("[amqp] field \"url\" is required"), "{e}");
    }

    #[test]
    fn empty_urls_is_refused() {
        let e = amqp_err("urls = []");
        assert!(
            e.contains("[amqp] field \"urls\" must list at least one node"),
            "{e}"
        );
    }

    #[test]
    fn a_node_list_is_kept_in_order() {
        let body = business("").replace(
            "url = \"amqp://guest:secret@127.0.0.1:5672/%2f\"",
            "urls = [\"amqp://u:p@a:5672/%2f\", \"amqp://u:p@b:5672/%2f\", \"amqp://u:p@c:5672/%2f\"]",
        );
        let c = load_str(&body).unwrap();
        let hosts: Vec<String> = c.amqp.urls.iter().map(|u| u.redacted()).collect();
        assert_eq!(
            hosts,
            [
                "amqp://u:***@a:5672/%2f",
                "amqp://u:***@b:5672/%2f",
                "amqp://u:***@c:5672/%2f"
            ]
        );
        assert_eq!(c.amqp.to_string(), hosts.join(", "));
    }

    #[test]
    fn a_node_with_another_scheme_is_named_by_position() {
        let e = amqp_err("urls = [\"amqp://a/%2f\", \"http://u:pw@b/\"]");
        assert!(
            e.contains("[amqp] field \"urls\", entry 2 must start with amqp:// or amqps:// (got http://u:***@b/)"),
            "{e}"
        );
    }

    #[test]
    fn an_unparseable_node_url_is_named() {
        let e = amqp_err("url = \"amqp://u:pw@host:notaport/%2f\"");
        assert!(
            e.contains("[amqp] field \"url\" is not a valid AMQP URL"),
            "{e}"
        );
        assert!(!e.contains("pw@"), "{e}");
    }

    #[test]
    fn mixing_clear_text_and_tls_nodes_is_refused() {
        let e = amqp_err("urls = [\"amqp://a/%2f\", \"amqps://b/%2f\"]");
        assert!(e.contains("mixes amqp:// and amqps://"), "{e}");
    }

    #[test]
    fn tls_files_with_a_clear_text_url_are_refused() {
        let e = amqp_err(&tls_section("amqp://h/%2f", "ca.crt", "", ""));
        assert!(
            e.contains("[amqp] field \"tls_ca_file\" is set but") && e.contains("amqps://"),
            "{e}"
        );
    }

    #[test]
    fn a_client_certificate_without_its_key_is_refused() {
        let e = amqp_err(&tls_section("amqps://h/%2f", "", "client.crt", ""));
        assert!(
            e.contains("[amqp] field \"tls_cert_file\" is set without \"tls_key_file\""),
            "{e}"
        );
    }

    #[test]
    fn a_key_without_its_client_certificate_is_refused() {
        let e = amqp_err(&tls_section("amqps://h/%2f", "", "", "client.key"));
        assert!(
            e.contains("[amqp] field \"tls_key_file\" is set without \"tls_cert_file\""),
            "{e}"
        );
    }

    #[test]
    fn an_unreadable_tls_file_is_named() {
        let e = amqp_err("url = \"amqps://h/%2f\"\ntls_ca_file = \"/nonexistent/ca.pem\"");
        assert!(
            e.contains("[amqp] field \"tls_ca_file\": cannot read /nonexistent/ca.pem"),
            "{e}"
        );
    }

    #[test]
    fn a_ca_file_without_a_certificate_is_refused() {
        // A key is PEM, but not a certificate.
        let e = amqp_err(&tls_section("amqps://h/%2f", "client.key", "", ""));
        assert!(
            e.contains("[amqp] field \"tls_ca_file\"") && e.contains("holds no PEM certificate"),
            "{e}"
        );
    }

    #[test]
    fn a_key_file_without_a_key_is_refused() {
        let e = amqp_err(&tls_section(
            "amqps://h/%2f",
            "",
            "client.crt",
            "client.crt",
        ));
        assert!(
            e.contains("[amqp] field \"tls_key_file\"")
                && e.contains("no usable unencrypted private key"),
            "{e}"
        );
    }

    #[test]
    fn a_key_that_is_not_the_certificates_is_refused() {
        let e = amqp_err(&tls_section(
            "amqps://h/%2f",
            "",
            "client.crt",
            "server.key",
        ));
        assert!(e.contains("do not make a usable client certificate"), "{e}");
    }

    #[test]
    fn external_login_without_a_client_certificate_is_refused() {
        let e = amqp_err("url = \"amqps://h/%2f?auth_mechanism=external\"");
        assert!(
            e.contains("auth_mechanism=external") && e.contains("tls_cert_file"),
            "{e}"
        );
    }

    #[test]
    fn a_zero_or_unparseable_connect_timeout_is_refused() {
        let e = amqp_err("url = \"amqp://h/%2f\"\nconnect_timeout = \"0s\"");
        assert!(
            e.contains("[amqp] field \"connect_timeout\" must be longer than zero"),
            "{e}"
        );
        let e = amqp_err("url = \"amqp://h/%2f\"\nconnect_timeout = \"soon\"");
        assert!(
            e.contains("[amqp] field \"connect_timeout\": cannot parse \"soon\""),
            "{e}"
        );
    }

    #[test]
    fn properties_take_three_values_and_refuse_others() {
        let b = business("properties = \"bare\"");
        assert_eq!(
            load_str(&b).unwrap().businesses[0].properties,
            Properties::Bare
        );
        let e = err_of(&business("properties = \"none\""));
        assert!(e.contains("properties") && e.contains("no-headers"), "{e}");
    }

    #[test]
    fn bad_score_unit_is_refused() {
        let e = err_of(&business("score_unit = \"minutes\""));
        assert!(e.contains("score_unit"), "{e}");
    }

    #[test]
    fn every_problem_is_reported_at_once() {
        let e = err_of(&business("batch_size = 0\nscanners = 0\nlease = \"x\""));
        assert!(
            e.contains("batch_size") && e.contains("scanners") && e.contains("lease"),
            "{e}"
        );
    }

    #[test]
    fn shared_key_is_refused() {
        let body = format!(
            "{}\n[businesses.other]\nkey = \"k\"\nexchange = \"e\"\nrouting_key = \"r\"\n",
            business("")
        );
        assert!(err_of(&body).contains("also used"));
    }

    #[test]
    fn member_defaults_to_body() {
        let c = load_str(&business("")).unwrap();
        assert_eq!(c.businesses[0].member, MemberMode::Body);
    }

    #[test]
    fn member_id_takes_an_optional_dedup_window() {
        let c = load_str(&business("member = \"id\"")).unwrap();
        assert_eq!(
            c.businesses[0].member,
            MemberMode::Id { dedup_window: None }
        );
        let c = load_str(&business("member = \"id\"\ndedup_window = \"1h\"")).unwrap();
        assert_eq!(
            c.businesses[0].member.dedup_window(),
            Some(Duration::from_secs(3600))
        );
    }

    #[test]
    fn unknown_member_mode_is_refused() {
        let e = err_of(&business("member = \"ids\""));
        assert!(
            e.contains(
                "business \"billing\", field \"member\" must be \"body\" or \"id\" (got \"ids\")"
            ),
            "{e}"
        );
    }

    #[test]
    fn dedup_window_without_id_mode_is_refused() {
        let e = err_of(&business("dedup_window = \"1h\""));
        assert!(
            e.contains("business \"billing\", field \"dedup_window\" needs member = \"id\""),
            "{e}"
        );
    }

    #[test]
    fn unparseable_or_zero_dedup_window_is_refused() {
        let e = err_of(&business("member = \"id\"\ndedup_window = \"soon\""));
        assert!(
            e.contains("field \"dedup_window\": cannot parse \"soon\""),
            "{e}"
        );
        let e = err_of(&business("member = \"id\"\ndedup_window = \"0s\""));
        assert!(
            e.contains("field \"dedup_window\" must be longer than zero"),
            "{e}"
        );
    }

    #[test]
    fn sharded_business_lists_every_shard() {
        let c = load_str(&business("shards = 3")).unwrap();
        assert_eq!(c.businesses[0].keys(), vec!["k:0", "k:1", "k:2"]);
    }

    #[test]
    fn passwords_are_redacted() {
        let c = load_str(&business("")).unwrap();
        let shown = format!("{:?} {}", c.amqp, c.amqp);
        assert!(!shown.contains("secret"), "{shown}");
        assert!(shown.contains("guest:***@127.0.0.1"), "{shown}");
        assert_eq!(redact_url("redis://:pw@h:1/0"), "redis://:***@h:1/0");
        assert_eq!(redact_url("redis://h:1/0"), "redis://h:1/0");
    }

    fn redis_section(redis: &str) -> String {
        format!(
            "[redis]\n{redis}\n[amqp]\nurl = \"amqp://guest:guest@127.0.0.1:5672/%2f\"\n[businesses.billing]\nkey = \"k\"\nexchange = \"e\"\nrouting_key = \"r\"\n"
        )
    }

    fn pem_files() -> (tempfile::TempDir, String, String) {
        let dir = tempfile::tempdir().unwrap();
        // A syntactically valid PEM certificate and key (not a usable pair:
        // validation checks the files' form, the handshake checks the rest).
        let cert = dir.path().join("c.pem");
        std::fs::write(
            &cert,
            "-----BEGIN CERTIFICATE-----\nMAA=\n-----END CERTIFICATE-----\n",
        )
        .unwrap();
        let key = dir.path().join("k.pem");
        std::fs::write(
            &key,
            "-----BEGIN PRIVATE KEY-----\nMAA=\n-----END PRIVATE KEY-----\n",
        )
        .unwrap();
        let (c, k) = (cert.display().to_string(), key.display().to_string());
        (dir, c, k)
    }

    /// A self-signed certificate and its key, made by `openssl`: validation
    /// checks that the two make a usable client identity.
    fn pem_pair() -> (tempfile::TempDir, String, String) {
        let dir = tempfile::tempdir().unwrap();
        let (cert, key) = (dir.path().join("c.pem"), dir.path().join("k.pem"));
        let ok = std::process::Command::new("openssl")
            .args(["req", "-x509", "-newkey", "ec", "-pkeyopt"])
            .args([
                "ec_paramgen_curve:P-256",
                "-nodes",
                "-days",
                "1",
                "-subj",
                "/CN=t",
            ])
            .arg("-keyout")
            .arg(&key)
            .arg("-out")
            .arg(&cert)
            .stderr(std::process::Stdio::null())
            .status()
            .expect("openssl is needed by the tests");
        assert!(ok.success());
        let (c, k) = (cert.display().to_string(), key.display().to_string());
        (dir, c, k)
    }

    #[test]
    fn redis_mode_defaults_to_standalone_and_refuses_others() {
        let c = load_str(&business("")).unwrap();
        assert_eq!(c.redis.mode, RedisMode::Standalone);
        let e = err_of(&redis_section("mode = \"replicated\"\nurl = \"redis://h\""));
        assert!(
            e.contains("[redis] field \"mode\" must be \"standalone\", \"cluster\" or \"sentinel\" (got \"replicated\")"),
            "{e}"
        );
    }

    #[test]
    fn urls_are_refused_in_standalone_mode() {
        let e = err_of(&redis_section(
            "url = \"redis://h\"\nurls = [\"redis://a\"]",
        ));
        assert!(
            e.contains("[redis] field \"urls\" is for mode = \"cluster\""),
            "{e}"
        );
    }

    #[test]
    fn cluster_and_sentinel_need_urls() {
        for mode in ["cluster", "sentinel"] {
            let e = err_of(&redis_section(&format!(
                "mode = \"{mode}\"\nmaster_name = \"m\""
            )));
            assert!(
                e.contains(&format!(
                    "[redis] field \"urls\" is required for mode = \"{mode}\""
                )),
                "{e}"
            );
        }
    }

    #[test]
    fn cluster_takes_url_and_urls_as_seeds_and_names_shards_as_everywhere() {
        let c = load_str(&redis_section(
            "mode = \"cluster\"\nurl = \"redis://a:7000\"\nurls = [\"redis://b:7000\"]",
        ))
        .unwrap();
        assert_eq!(c.redis.urls.len(), 2);
        let c = load_str(
            &redis_section("mode = \"cluster\"\nurls = [\"redis://b:7000\"]")
                .replace("routing_key = \"r\"", "routing_key = \"r\"\nshards = 3"),
        )
        .unwrap();
        // The names do not depend on the Redis mode; spread is a choice.
        assert_eq!(c.businesses[0].shard_names, ShardNames::Index);
        assert_eq!(c.businesses[0].keys()[0], "k:0");
    }

    #[test]
    fn redis_url_scheme_is_checked_per_field() {
        let e = err_of(&redis_section(
            "mode = \"cluster\"\nurls = [\"redis://a:1\", \"unix:///tmp/r.sock\"]",
        ));
        assert!(
            e.contains("[redis] field \"urls[1]\" must start with redis:// or rediss://"),
            "{e}"
        );
        let e = err_of(&redis_section("url = \"http://h\""));
        assert!(e.contains("[redis] field \"url\" must start with"), "{e}");
    }

    #[test]
    fn insecure_tls_is_refused() {
        let e = err_of(&redis_section("url = \"rediss://h:6380/#insecure\""));
        assert!(
            e.contains("[redis] field \"url\": \"insecure\" would turn off the check"),
            "{e}"
        );
    }

    #[test]
    fn cluster_refuses_a_database_other_than_0() {
        let e = err_of(&redis_section(
            "mode = \"cluster\"\nurls = [\"redis://a:7000/3\"]",
        ));
        assert!(
            e.contains("[redis] field \"urls[0]\": a cluster has only database 0"),
            "{e}"
        );
    }

    #[test]
    fn mixed_tls_and_clear_text_urls_are_refused() {
        let e = err_of(&redis_section(
            "mode = \"cluster\"\nurls = [\"rediss://a:7000\", \"redis://b:7000\"]",
        ));
        assert!(e.contains("mix rediss:// (TLS) and redis://"), "{e}");
    }

    #[test]
    fn sentinel_needs_master_name() {
        let e = err_of(&redis_section(
            "mode = \"sentinel\"\nurls = [\"redis://s:26379\"]",
        ));
        assert!(
            e.contains("[redis] field \"master_name\" is required for mode = \"sentinel\""),
            "{e}"
        );
        let c = load_str(&redis_section(
            "mode = \"sentinel\"\nurls = [\"redis://:pw@s:26379/2\"]\nmaster_name = \"main\"\nsentinel_password = \"spw\"",
        ))
        .unwrap();
        assert_eq!(c.redis.master_name.as_deref(), Some("main"));
        assert!(!format!("{:?}", c.redis).contains("spw"));
    }

    #[test]
    fn master_name_outside_sentinel_mode_is_refused() {
        let e = err_of(&redis_section("url = \"redis://h\"\nmaster_name = \"m\""));
        assert!(
            e.contains(
                "[redis] field \"master_name\" is for mode = \"sentinel\" (mode is \"standalone\")"
            ),
            "{e}"
        );
    }

    #[test]
    fn sentinel_password_outside_sentinel_mode_is_refused() {
        let e = err_of(&redis_section(
            "url = \"redis://h\"\nsentinel_password = \"x\"",
        ));
        assert!(
            e.contains("[redis] field \"sentinel_password\" is for mode = \"sentinel\""),
            "{e}"
        );
        assert!(!e.contains("\"x\""), "{e}");
    }

    #[test]
    fn tls_files_need_rediss_urls() {
        let (_d, cert, _) = pem_files();
        let e = err_of(&redis_section(&format!(
            "url = \"redis://h\"\ntls_ca_file = \"{cert}\""
        )));
        assert!(
            e.contains("[redis] field \"tls_ca_file\" needs rediss:// URLs"),
            "{e}"
        );
    }

    #[test]
    fn unreadable_tls_file_is_named() {
        let e = err_of(&redis_section(
            "url = \"rediss://h\"\ntls_ca_file = \"/nonexistent/ca.pem\"",
        ));
        assert!(
            e.contains("[redis] field \"tls_ca_file\": cannot read /nonexistent/ca.pem"),
            "{e}"
        );
    }

    #[test]
    fn tls_file_without_pem_is_refused() {
        let (_d, cert, key) = pem_files();
        let e = err_of(&redis_section(&format!(
            "url = \"rediss://h\"\ntls_ca_file = \"{key}\""
        )));
        assert!(
            e.contains("field \"tls_ca_file\"") && e.contains("holds no PEM certificate"),
            "{e}"
        );
        let e = err_of(&redis_section(&format!(
            "url = \"rediss://h\"\ntls_cert_file = \"{cert}\"\ntls_key_file = \"{cert}\""
        )));
        assert!(
            e.contains("field \"tls_key_file\"")
                && e.contains("holds no usable unencrypted private key"),
            "{e}"
        );
    }

    #[test]
    fn client_cert_and_key_come_together() {
        let (_d, cert, key) = pem_files();
        let e = err_of(&redis_section(&format!(
            "url = \"rediss://h\"\ntls_cert_file = \"{cert}\""
        )));
        assert!(
            e.contains("[redis] field \"tls_cert_file\" is set without \"tls_key_file\""),
            "{e}"
        );
        let e = err_of(&redis_section(&format!(
            "url = \"rediss://h\"\ntls_key_file = \"{key}\""
        )));
        assert!(
            e.contains("[redis] field \"tls_key_file\" is set without \"tls_cert_file\""),
            "{e}"
        );
        let (_d, cert, key) = pem_pair();
        let c = load_str(&redis_section(&format!(
            "url = \"rediss://h\"\ntls_ca_file = \"{cert}\"\ntls_cert_file = \"{cert}\"\ntls_key_file = \"{key}\""
        )))
        .unwrap();
        assert!(c.redis.is_tls() && c.redis.tls.key_file.is_some());
    }

    #[test]
    fn hash_tagged_key_with_shards_is_refused_in_cluster_mode() {
        let body = redis_section("mode = \"cluster\"\nurls = [\"redis://a:7000\"]")
            .replace("key = \"k\"", "key = \"{k}\"\nshards = 4");
        let e = err_of(&body);
        assert!(
            e.contains("business \"billing\", field \"key\": \"{k}\" has a hash tag"),
            "{e}"
        );
        // One shard, or standalone, is fine.
        let body = business("shards = 4").replace("key = \"k\"", "key = \"{k}\"");
        assert!(load_str(&body).is_ok());
    }

    #[test]
    fn bad_shard_names_is_refused() {
        let e = err_of(&business("shard_names = \"hashed\""));
        assert!(
            e.contains("business \"billing\", field \"shard_names\" must be \"index\""),
            "{e}"
        );
        let c = load_str(&business("shards = 2\nshard_names = \"spread\"")).unwrap();
        assert_eq!(c.businesses[0].keys().len(), 2);
        assert!(c.businesses[0].keys()[1].starts_with("k:{s1."));
    }

    #[test]
    fn bad_max_rate_scope_is_refused() {
        let e = err_of(&business("max_rate = 5\nmax_rate_scope = \"global\""));
        assert!(
            e.contains("business \"billing\", field \"max_rate_scope\" must be \"process\" or \"cluster\" (got \"global\")"),
            "{e}"
        );
    }

    #[test]
    fn cluster_rate_scope_needs_max_rate() {
        let e = err_of(&business("max_rate_scope = \"cluster\""));
        assert!(
            e.contains("field \"max_rate_scope\" = \"cluster\" needs max_rate"),
            "{e}"
        );
        let c = load_str(&business("max_rate = 5\nmax_rate_scope = \"cluster\"")).unwrap();
        assert_eq!(c.businesses[0].max_rate_scope, RateScope::Cluster);
        let c = load_str(&business("max_rate = 5\nmax_rate_scope = \"process\"")).unwrap();
        assert_eq!(c.businesses[0].max_rate_scope, RateScope::Process);
    }

    #[test]
    fn redis_section_round_trips_through_toml() {
        let c = load_str(&redis_section(
            "mode = \"sentinel\"\nurls = [\"redis://:p\\\"w@s:26379\"]\nmaster_name = \"main\"",
        ))
        .unwrap();
        let again = load_str(&format!(
            "{}[amqp]\nurl = \"amqp://h\"\n[businesses.b]\nkey = \"k\"\nexchange = \"e\"\nrouting_key = \"r\"\n",
            c.redis.to_toml()
        ))
        .unwrap();
        assert_eq!(again.redis.urls[0].expose(), c.redis.urls[0].expose());
        assert_eq!(again.redis.master_name.as_deref(), Some("main"));
    }
    fn load_env(body: &str, vars: &[(&str, &str)]) -> Result<Config, ConfigError> {
        let mut f = tempfile::NamedTempFile::new().unwrap();
        f.write_all(body.as_bytes()).unwrap();
        let env = vars
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        load_with_env(f.path(), env)
    }

    #[test]
    fn environment_values_reach_delayd_byte_for_byte() {
        let c = load_env(
            &business(""),
            &[
                ("DELAYD_BUSINESSES__BILLING__ROUTING_KEY", "1.10"),
                ("DELAYD_BUSINESSES__BILLING__KEY", "00123"),
                ("DELAYD_BUSINESSES__BILLING__EXCHANGE", "true"),
                ("DELAYD_AMQP__URL", "amqp://guest:0042@127.0.0.1:5672/%2f"),
                ("DELAYD_BUSINESSES__BILLING__BATCH_SIZE", "50"),
                ("DELAYD_BUSINESSES__BILLING__PERSISTENT", "false"),
            ],
        )
        .unwrap();
        let b = c.business("billing").unwrap();
        assert_eq!(b.routing_key, "1.10");
        assert_eq!(b.key, "00123");
        assert_eq!(b.exchange, "true");
        assert_eq!(
            c.amqp.urls[0].expose(),
            "amqp://guest:0042@127.0.0.1:5672/%2f"
        );
        assert_eq!(b.batch_size, 50, "numbers still parse from the environment");
        assert!(!b.persistent, "booleans still parse from the environment");
    }

    #[test]
    fn a_node_list_from_the_environment_keeps_commas_in_passwords() {
        let body = business("").replace("url = \"amqp://guest:secret@127.0.0.1:5672/%2f\"\n", "");
        for list in [
            "amqp://u:p,1@a:5672/%2f,amqp://u:p2@b:5672/%2f",
            "amqp://u:p,1@a:5672/%2f amqp://u:p2@b:5672/%2f",
            "amqp://u:p,1@a:5672/%2f\namqp://u:p2@b:5672/%2f\n",
        ] {
            let c = load_env(&body, &[("DELAYD_AMQP__URLS", list)]).unwrap();
            let urls: Vec<&str> = c.amqp.urls.iter().map(|u| u.expose()).collect();
            assert_eq!(
                urls,
                ["amqp://u:p,1@a:5672/%2f", "amqp://u:p2@b:5672/%2f"],
                "{list:?}"
            );
        }
    }

    #[test]
    fn names_the_broker_cannot_take_are_refused_at_load() {
        let long = "x".repeat(256);
        for field in ["exchange", "routing_key", "content_type"] {
            let body = business(&format!("{field} = \"{long}\""))
                .replace(&format!("\n{field} = \"e\"\n"), "\n")
                .replace(&format!("\n{field} = \"r\"\n"), "\n");
            let e = err_of(&body);
            assert!(
                e.contains(&format!(
                    "business \"billing\", field \"{field}\" must be at most 255 bytes (got 256)"
                )),
                "{field}: {e}"
            );
        }
        let e =
            err_of(&business("").replace("[businesses.billing]", &format!("[businesses.{long}]")));
        assert!(e.contains("at most 255 bytes"), "{e}");
        // 255 bytes is still fine.
        let ok = "y".repeat(255);
        load_str(&business("").replace("routing_key = \"r\"", &format!("routing_key = \"{ok}\"")))
            .unwrap();
    }

    #[test]
    fn durations_beyond_their_stated_maximum_are_refused() {
        for (field, value) in [
            ("lease", "300y"),
            ("lease", "2days"),
            ("shutdown_timeout", "100000000y"),
            ("poll_interval", "100000000y"),
            ("watchdog_interval", "2h"),
            ("retry_backoff", "10000y"),
            ("retry_backoff_max", "10000y"),
        ] {
            let e = err_of(&business(&format!("{field} = \"{value}\"")));
            assert!(
                e.contains(&format!(
                    "business \"billing\", field \"{field}\" must be at most"
                )),
                "{field} = {value}: {e}"
            );
        }
        let e = err_of(&business("member = \"id\"\ndedup_window = \"100000000y\""));
        assert!(e.contains("field \"dedup_window\" must be at most"), "{e}");
        let e = amqp_err("url = \"amqp://h/%2f\"\nconnect_timeout = \"100000000y\"");
        assert!(
            e.contains("[amqp] field \"connect_timeout\" must be at most"),
            "{e}"
        );
    }

    #[test]
    fn key_families_that_overlap_are_refused() {
        for other in ["{k}:dead", "{k}:inflight", "{k}:meta", "{k}:body", "{k}"] {
            let body = format!(
                "{}\n[businesses.zeta]\nkey = \"{other}\"\nexchange = \"e\"\nrouting_key = \"r\"\n",
                business("")
            );
            let e = err_of(&body);
            assert!(
                e.contains("\"billing\"") && e.contains("\"zeta\"") && e.contains("overlap"),
                "{other}: {e}"
            );
        }
        // A shard key of one business is another's key.
        let body = format!(
            "{}\n[businesses.zeta]\nkey = \"k:1\"\nexchange = \"e\"\nrouting_key = \"r\"\n",
            business("shards = 2")
        );
        assert!(err_of(&body).contains("overlap"));
    }

    #[test]
    fn no_form_of_url_shows_its_password() {
        for (url, secret) in [
            ("redis+unix:///run/redis.sock?db=0&pass=s3cr3t", "s3cr3t"),
            ("redis://127.0.0.1:6379/0?password=s3cr3t", "s3cr3t"),
            ("redis://:pa/ss@127.0.0.1:6379/0", "pa/ss"),
            ("redis://user:p?w#d@127.0.0.1/0", "p?w#d"),
            ("amqp://guest:p@ss@host:5672/%2f", "p@ss"),
            ("amqp://guest:x,y@host:5672/%2f", "x,y"),
        ] {
            let shown = redact_url(url);
            assert!(!shown.contains(secret), "{url} shown as {shown}");
            assert!(shown.contains("***"), "{shown}");
        }
    }

    #[test]
    fn a_bad_url_error_does_not_echo_its_password() {
        for (section, url) in [
            ("redis", "redis://:pa/ss@127.0.0.1:6379/0"),
            ("redis", "redis://u:pa ss@127.0.0.1:6379/0"),
            ("amqp", "amqp://guest:pa/ss@127.0.0.1:5672/%2f"),
        ] {
            let body = business("").replace(
                if section == "redis" {
                    "redis://127.0.0.1:6379/0"
                } else {
                    "amqp://guest:secret@127.0.0.1:5672/%2f"
                },
                url,
            );
            match load_str(&body) {
                Err(e) => {
                    let e = e.to_string();
                    assert!(
                        !e.contains("pa/ss") && !e.contains("pa ss") && !e.contains("ss@"),
                        "{e}"
                    );
                }
                Ok(c) => {
                    let shown = format!("{:?} {:?}", c.redis, c.amqp);
                    assert!(!shown.contains("pa/ss"), "{shown}");
                }
            }
        }
    }
}
