//! The `[redis]` section.

use super::*;

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

/// A TOML basic string holding `s`.
pub(super) fn toml_string(s: &str) -> String {
    format!("\"{}\"", s.replace('\\', "\\\\").replace('"', "\\\""))
}

/// The `tls_*_file` lines of a section, for [`RedisConfig::to_toml`] and
/// [`AmqpConfig::to_toml`].
pub(super) fn tls_toml(files: &crate::tls::TlsFiles, out: &mut String) {
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

/// Validates `[redis]`, naming the field of every problem; reads the TLS
/// files so a missing or malformed one is refused before any connection.
pub(super) fn validate_redis(raw: Option<RawRedis>, problems: &mut Vec<String>) -> RedisConfig {
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
    let mode = one_of(
        "[redis] field \"mode\"",
        raw.mode.as_deref(),
        &[
            ("standalone", "", RedisMode::Standalone),
            ("cluster", "", RedisMode::Cluster),
            ("sentinel", "", RedisMode::Sentinel),
        ],
        problems,
    );
    let urls = node_urls(mode, raw.url, raw.urls.unwrap_or_default(), problems);
    for (field, u) in &urls {
        problems.extend(bad_url(mode, field, u));
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
    problems.extend(sentinel_fields(
        mode,
        &master_name,
        raw.sentinel_password.is_some(),
    ));
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

/// The nodes' URLs with the field each came from: one `url` for a
/// standalone server; for a cluster or Sentinel, `url` (one more node) and
/// `urls`, at least one.
fn node_urls(
    mode: RedisMode,
    url: Option<SecretUrl>,
    listed: Vec<SecretUrl>,
    problems: &mut Vec<String>,
) -> Vec<(String, SecretUrl)> {
    let url = url.filter(|u| !u.expose().is_empty());
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
    urls
}

/// What is wrong with one node's URL, if anything: its scheme, `insecure`,
/// its syntax, or a database other than 0 on a cluster.
fn bad_url(mode: RedisMode, field: &str, u: &SecretUrl) -> Option<String> {
    let text = u.expose();
    let schemes: &[&str] = if mode == RedisMode::Standalone {
        &["redis://", "rediss://", "unix://", "redis+unix://"]
    } else {
        &["redis://", "rediss://"]
    };
    if !schemes.iter().any(|p| text.starts_with(p)) {
        Some(format!(
            "[redis] field \"{field}\" must start with {} (got {})",
            schemes.join(" or "),
            u.redacted()
        ))
    } else if text.contains("#insecure") || text.contains("?insecure") {
        Some(format!(
            "[redis] field \"{field}\": \"insecure\" would turn off the check of the server's certificate, which delayd does not allow; trust a private CA with tls_ca_file instead"
        ))
    } else if let Err(e) = redis::IntoConnectionInfo::into_connection_info(text) {
        Some(format!(
            "[redis] field \"{field}\" is not a valid Redis URL ({}): {}",
            url_reason(text, &e.to_string()),
            u.redacted()
        ))
    } else if mode == RedisMode::Cluster && url_db(text).is_some_and(|db| db != 0) {
        Some(format!(
            "[redis] field \"{field}\": a cluster has only database 0 (got {})",
            u.redacted()
        ))
    } else {
        None
    }
}

/// `master_name` and `sentinel_password` are Sentinel's, and Sentinel
/// needs the master's name.
fn sentinel_fields(mode: RedisMode, master_name: &Option<String>, password: bool) -> Vec<String> {
    let mut problems = Vec::new();
    match (mode, master_name) {
        (RedisMode::Sentinel, None) => problems.push(
            "[redis] field \"master_name\" is required for mode = \"sentinel\": the name the sentinels monitor the master under (SENTINEL MASTERS lists it)".into(),
        ),
        (RedisMode::Sentinel, Some(_)) | (_, None) => {}
        (_, Some(_)) => problems.push(format!(
            "[redis] field \"master_name\" is for mode = \"sentinel\" (mode is \"{}\")",
            mode.name()
        )),
    }
    if password && mode != RedisMode::Sentinel {
        problems.push(format!(
            "[redis] field \"sentinel_password\" is for mode = \"sentinel\" (mode is \"{}\")",
            mode.name()
        ));
    }
    problems
}

/// The database number in a `redis://host:port/N` URL, if it names one.
pub(super) fn url_db(url: &str) -> Option<i64> {
    let rest = &url[url.find("://")? + 3..];
    let path = &rest[rest.find('/')? + 1..];
    let end = path.find(['?', '#']).unwrap_or(path.len());
    path[..end].parse().ok()
}
