//! delayd: a reliable delay queue from Redis sorted sets to RabbitMQ.
//!
//! Producers `ZADD key <due> <body>`; delayd claims what is due with an
//! atomic Lua script, publishes it with confirms and `mandatory`, and only
//! then forgets it. Where each concern lives, from the ground floor up; a
//! module imports only from its own floor's neighbours and from below:
//!
//! 1. what everything uses:
//!    - [`keys`]: hash tags, cluster slots and shard names;
//!    - [`secret`]: URLs and passwords that print redacted;
//!    - [`tls`]: the CA and client certificate files the configuration names;
//!    - [`text`]: bytes and durations shown to people, by the CLI and the API;
//!    - [`progress`]: the progress line of long commands, on a terminal only;
//! 2. [`config`]: the TOML file, environment overrides and validation; each
//!    feature's section (`[http]`, intake, recurring) is parsed and checked
//!    here, and the features read what it gives them;
//! 3. the servers' clients and what they report:
//!    - [`telemetry`]: logs, metrics, connection health;
//!    - [`redis_conn`]: one connection type for every Redis mode
//!      (standalone, cluster, sentinel), clear text or TLS;
//!    - [`amqp`]: the RabbitMQ side: nodes, TLS, supervised connections and
//!      channels;
//! 4. what is stored and what is sent:
//!    - [`store`]: the Redis side, key families and the Lua scripts
//!      (`src/lua/`), and the writer of messages taken in from outside;
//!    - [`message`]: what is published for a claimed member, the stored
//!      form of an intake message, its due time and delivered properties;
//!    - [`unread`]: members under key names a business does not read;
//! 5. the features:
//!    - [`rate`]: `max_rate`, per process or shared through Redis;
//!    - [`tasks`]: one task addressed by its member (id or body): look up,
//!      cancel, reschedule, list;
//!    - [`scanner`]: one claim → publish → settle loop;
//!    - [`intake`]: a drop-in for the delayed-message plugin: consume what
//!      producers publish with `x-delay`, store it, deliver it when due;
//!    - [`recurring`]: cron schedules whose occurrences are written ahead,
//!      each delivered once;
//!    - [`adopt`]: moves what the delayed-message plugin holds into an
//!      intake business, crash-safe, chunk by chunk;
//!    - [`tenants`]: fair release among the tenants of a business;
//! 6. the faces: [`http`] (`/metrics`, `/healthz`, `/readyz`, the console
//!    and its JSON API) and [`bench`] (`delayd bench`, measured against the
//!    raw broker ceiling);
//! 7. [`supervisor`]: starts and restarts scanners, signals and clean stop;
//! 8. [`cli`]: the `delayd` commands (`run`, `check`, `inspect`, ...).

pub mod adopt;
pub mod amqp;
pub mod bench;
pub mod cli;
pub mod config;
pub mod http;
pub mod intake;
pub mod keys;
pub mod message;
pub mod progress;
pub mod rate;
pub mod recurring;
pub mod redis_conn;
pub mod scanner;
pub mod secret;
pub mod store;
pub mod supervisor;
pub mod tasks;
pub mod telemetry;
pub mod tenants;
pub mod text;
pub mod tls;
pub mod unread;
