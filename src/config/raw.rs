//! The configuration as written: the TOML file and the `DELAYD_` environment,
//! before validation.

use super::*;

#[derive(Debug, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub(super) struct RawConfig {
    pub(super) redis: Option<RawRedis>,
    pub(super) amqp: Option<RawAmqp>,
    pub(super) http: Option<http_section::RawHttp>,
    pub(super) log: Option<RawLog>,
    pub(super) businesses: Option<BTreeMap<String, RawBusiness>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawRedis {
    pub(super) mode: Option<String>,
    pub(super) url: Option<SecretUrl>,
    #[serde(default, deserialize_with = "url_list")]
    pub(super) urls: Option<Vec<SecretUrl>>,
    pub(super) master_name: Option<String>,
    pub(super) sentinel_password: Option<Secret>,
    pub(super) tls_ca_file: Option<PathBuf>,
    pub(super) tls_cert_file: Option<PathBuf>,
    pub(super) tls_key_file: Option<PathBuf>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawAmqp {
    pub(super) url: Option<SecretUrl>,
    #[serde(default, deserialize_with = "url_list")]
    pub(super) urls: Option<Vec<SecretUrl>>,
    pub(super) tls_ca_file: Option<PathBuf>,
    pub(super) tls_cert_file: Option<PathBuf>,
    pub(super) tls_key_file: Option<PathBuf>,
    pub(super) connect_timeout: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawLog {
    pub(super) format: Option<String>,
    pub(super) level: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawBusiness {
    pub(super) key: Option<String>,
    pub(super) exchange: Option<String>,
    pub(super) routing_key: Option<String>,
    #[serde(default, deserialize_with = "whole::opt")]
    pub(super) scanners: Option<i64>,
    #[serde(default, deserialize_with = "whole::opt")]
    pub(super) batch_size: Option<i64>,
    #[serde(default, deserialize_with = "whole::opt")]
    pub(super) window: Option<i64>,
    pub(super) lease: Option<String>,
    #[serde(default, deserialize_with = "whole::opt")]
    pub(super) max_attempts: Option<i64>,
    pub(super) retry_backoff: Option<String>,
    pub(super) retry_backoff_max: Option<String>,
    pub(super) score_unit: Option<String>,
    #[serde(default, deserialize_with = "whole::opt")]
    pub(super) shards: Option<i64>,
    pub(super) shard_names: Option<String>,
    pub(super) ignore_unread_keys: Option<bool>,
    pub(super) persistent: Option<bool>,
    pub(super) content_type: Option<String>,
    pub(super) properties: Option<String>,
    pub(super) shutdown_timeout: Option<String>,
    #[serde(default, deserialize_with = "whole::opt")]
    pub(super) max_rate: Option<i64>,
    pub(super) max_rate_scope: Option<String>,
    pub(super) poll_interval: Option<String>,
    pub(super) watchdog_interval: Option<String>,
    pub(super) member: Option<String>,
    pub(super) dedup_window: Option<String>,
    pub(super) envelopes: Option<bool>,
    pub(super) trace: Option<String>,
    pub(super) intake: Option<RawIntake>,
    pub(super) recurring:
        Option<std::collections::BTreeMap<String, recurring_section::RawSchedule>>,
    pub(super) read_token: Option<crate::secret::Secret>,
    pub(super) read_token_file: Option<std::path::PathBuf>,
    pub(super) admin_token: Option<crate::secret::Secret>,
    pub(super) admin_token_file: Option<std::path::PathBuf>,
    pub(super) tenants: Option<bool>,
    #[serde(default, deserialize_with = "whole::map")]
    pub(super) tenant_weights: Option<std::collections::BTreeMap<String, i64>>,
    #[serde(default, deserialize_with = "whole::map")]
    pub(super) tenant_max_rate: Option<std::collections::BTreeMap<String, i64>>,
    #[serde(default, deserialize_with = "whole::opt")]
    pub(super) tenant_window: Option<i64>,
}

/// `[businesses.NAME.intake]`, as written (see [`crate::intake`]).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawIntake {
    pub(super) exchange: Option<String>,
    pub(super) queue: Option<String>,
    pub(super) queue_type: Option<String>,
    #[serde(default, deserialize_with = "whole::opt")]
    pub(super) prefetch: Option<i64>,
    #[serde(default, deserialize_with = "whole::opt")]
    pub(super) batch_size: Option<i64>,
    pub(super) dead_letter_exchange: Option<String>,
    pub(super) dead_letter_queue: Option<String>,
    #[serde(default, deserialize_with = "whole::opt")]
    pub(super) max_message_size: Option<i64>,
    pub(super) x_delay: Option<String>,
    pub(super) user_id: Option<String>,
    #[serde(default, deserialize_with = "whole::opt")]
    pub(super) replicas: Option<i64>,
    pub(super) replica_timeout: Option<String>,
    pub(super) replica_ack: Option<String>,
    pub(super) tenant_header: Option<String>,
}

/// A node list: an array in the file, or one string from the environment
/// (`DELAYD_AMQP__URLS`, `DELAYD_REDIS__URLS`) with the URLs separated by
/// whitespace or by commas. A comma splits only where the next URL's scheme
/// follows it, so a comma inside a password stays part of it.
pub(super) fn url_list<'de, D>(d: D) -> Result<Option<Vec<SecretUrl>>, D::Error>
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
pub(super) fn split_urls(s: &str) -> Vec<String> {
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
