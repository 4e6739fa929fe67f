//! The `[amqp]` section.

use super::*;

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

/// The `[amqp]` rules: one of `url`/`urls`, valid AMQP URLs of one scheme,
/// TLS files only with `amqps://`, and readable, matching TLS files.
pub(super) fn validate_amqp(raw: Option<RawAmqp>, problems: &mut Vec<String>) -> AmqpConfig {
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
