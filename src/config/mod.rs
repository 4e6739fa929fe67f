//! Configuration: one TOML file layered with `DELAYD_`-prefixed environment
//! variables, validated in full before any connection is made.

use std::collections::BTreeMap;
use std::fmt;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;

use crate::keys::ShardNames;
use crate::secret::{url_reason, Secret, SecretUrl};
use crate::text::visible;

mod amqp_section;
mod business;
mod check;
mod http_section;
mod intake_section;
pub mod intake_settings;
mod load;
mod raw;
pub mod recurring_section;
mod redis_section;
mod tenants_section;
#[cfg(test)]
mod tests;
mod whole;

pub use amqp_section::*;
pub use business::*;
pub(crate) use check::*;
use intake_section::*;
pub use load::*;
use raw::*;
pub use redis_section::*;
use tenants_section::tenants;
pub use tenants_section::{TenantSetting, Tenants};

/// A configuration problem a user can fix by editing the file or environment.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file is missing or unreadable.
    #[error("config file {}: {}", visible(&path.display().to_string()), visible(reason))]
    Unreadable {
        /// The file named on the command line.
        path: PathBuf,
        /// What went wrong reading it.
        reason: String,
    },
    /// The file does not parse, or a field has the wrong type or is unknown.
    #[error("config file {}: {}", visible(&path.display().to_string()), visible(reason))]
    Parse {
        /// The file named on the command line.
        path: PathBuf,
        /// The parser's explanation, naming the field.
        reason: String,
    },
    /// The file parses but its values are unusable; every problem is listed.
    #[error("config file {}: {}", visible(&path.display().to_string()), visible(&problems.join("; ")))]
    Invalid {
        /// The file named on the command line.
        path: PathBuf,
        /// One entry per problem, each naming the section or business and field.
        problems: Vec<String>,
    },
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

/// Whether delayd gives each publish a W3C trace context of its own.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Trace {
    /// The default: headers go out as stored, a producer's `traceparent`
    /// and `tracestate` untouched.
    Off,
    /// Each publish carries a new `traceparent` (a new trace), and the
    /// producer's `traceparent`/`tracestate` move to
    /// `x-delayd-producer-traceparent`/`-tracestate`, for the consumer to
    /// link to: OpenTelemetry's messaging conventions link, rather than
    /// parent, work that runs long after the producer's trace ended.
    Link,
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
    /// The bearer token API reads need; `None`: reads are open.
    pub http_read_token: Option<Secret>,
    /// Host names the console answers to besides its address and loopback.
    pub http_allowed_hosts: Vec<String>,
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
