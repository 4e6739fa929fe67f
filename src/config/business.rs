//! A `[businesses.NAME]` section: one delay queue.

use super::recurring_section::Schedule;
use super::*;

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
    /// Id mode: producers may store envelopes (docs/wire-format.md) in
    /// `{K}:body`, published with their own routing key and properties
    /// (headers such as `traceparent` included). Off by default, so a body
    /// that happens to look like an envelope is never read as one.
    pub envelopes: bool,
    /// Whether each publish carries delayd's own trace context, linked to
    /// the producer's (docs/wire-format.md, "Trace context").
    pub trace: Trace,
    /// The console tokens that open this business only, besides `[http]`'s.
    pub tokens: BusinessTokens,
    /// Messages published with `x-delay` to an intake exchange, when set.
    pub intake: Option<intake_settings::Settings>,
    /// Recurring schedules whose occurrences delayd writes ahead.
    pub recurring: Vec<Schedule>,
    /// Fair release among the tenants producers name (docs/tenants.md),
    /// when `tenants = true`.
    pub tenants: Option<Tenants>,
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
        self.envelopes
            || self.intake.is_some()
            || self.recurring.iter().any(|s| s.routing_key.is_some())
    }
}

/// Default values of the optional business fields, shown in docs/configuration.md.
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
    /// `intake.replicas`.
    pub const REPLICAS: i64 = 100;
    /// `intake.replica_timeout`: a write and its wait must be answered
    /// within the Redis connection's reply timeout (10 s), or the
    /// connection gives up on a write Redis may still apply.
    pub const REPLICA_TIMEOUT: Duration = Duration::from_secs(5);
}

/// A problem for every key two businesses would share: one's key (or a shard
/// key) that is another's, or that is one of another's helper keys (its
/// `{K}:dead`, `{K}:inflight`, ...), where one would publish or recover the
/// other's members.
pub(super) fn overlapping_families(businesses: &[Business]) -> Vec<String> {
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

/// Checks one `[businesses.NAME]` section, adding one line per problem to
/// `problems` (in the order the fields are read); `None` if it has any.
pub(super) fn validate_business(
    name: &str,
    mut rb: RawBusiness,
    mode: RedisMode,
    path: &Path,
    problems: &mut Vec<String>,
) -> Option<Business> {
    let before = problems.len();
    let Names {
        key,
        exchange,
        routing_key,
    } = names(name, &mut rb, problems);
    let sizes = sizes(name, &rb, problems);
    problems.extend(shards_share_a_slot(name, &key, mode, sizes.shards));
    let (shard_names, max_rate_scope, trace) = words(name, &rb, problems);
    problems.extend(shared_rate_without_rate(
        name,
        max_rate_scope,
        sizes.max_rate,
    ));
    let timing = timing(name, &mut rb, problems);
    problems.extend(lease_too_short(name, timing.lease));
    let (score_unit, properties) = formats(name, &rb, problems);
    let intake = rb.intake.take().map(|raw| {
        validate_intake(
            name,
            raw,
            rb.member.as_deref(),
            &exchange,
            mode,
            rb.tenants == Some(true),
            problems,
        )
    });
    let recurring = rb.recurring.take().map_or_else(Vec::new, |raw| {
        let dir = path.parent().unwrap_or(Path::new("."));
        recurring_section::validate(name, raw, dir, problems)
    });
    problems.extend(schedules_by_body(name, &recurring, rb.member.as_deref()));
    let member = member_mode(name, &rb, intake.is_some(), &recurring, &timing, problems);
    let envelopes = rb.envelopes.unwrap_or(false);
    problems.extend(envelopes_by_body(name, envelopes, member));
    let tokens = business_tokens(name, &mut rb, problems);
    let tenants = tenants(name, &mut rb, problems);
    if problems.len() > before {
        return None;
    }
    Some(Business {
        name: name.to_string(),
        key,
        exchange,
        routing_key,
        scanners: sizes.scanners,
        batch_size: sizes.batch_size,
        window: sizes.window.max(sizes.batch_size),
        lease: timing.lease,
        max_attempts: sizes.max_attempts,
        retry_backoff: timing.retry_backoff,
        retry_backoff_max: timing.retry_backoff_max,
        score_unit,
        shards: sizes.shards,
        shard_names,
        ignore_unread_keys: rb.ignore_unread_keys.unwrap_or(false),
        persistent: rb.persistent.unwrap_or(true),
        content_type: rb.content_type.filter(|c| !c.is_empty()),
        properties,
        shutdown_timeout: timing.shutdown_timeout,
        max_rate: sizes.max_rate,
        max_rate_scope,
        poll_interval: timing.poll_interval,
        watchdog_interval: timing.watchdog_interval,
        member,
        envelopes,
        trace,
        intake: intake.flatten(),
        recurring,
        tokens,
        tenants,
    })
}

/// `shard_names`, `max_rate_scope` and `trace`: each one of its words.
fn words(
    name: &str,
    rb: &RawBusiness,
    problems: &mut Vec<String>,
) -> (ShardNames, RateScope, Trace) {
    let field = |f: &str| format!("business \"{name}\", field \"{f}\"");
    // One default in every mode: a producer's key names must not depend on
    // where Redis runs.
    let shard_names = one_of(
        &field("shard_names"),
        rb.shard_names.as_deref(),
        &[
            ("index", "K:0, K:1, ...", ShardNames::Index),
            ("spread", "one slot range per shard", ShardNames::Spread),
        ],
        problems,
    );
    let max_rate_scope = one_of(
        &field("max_rate_scope"),
        rb.max_rate_scope.as_deref(),
        &[
            ("process", "", RateScope::Process),
            ("cluster", "", RateScope::Cluster),
        ],
        problems,
    );
    let trace = one_of(
        &field("trace"),
        rb.trace.as_deref(),
        &[
            ("off", "", Trace::Off),
            (
                "link",
                "a new trace per publish, linked to the producer's",
                Trace::Link,
            ),
        ],
        problems,
    );
    (shard_names, max_rate_scope, trace)
}

/// Console tokens for one business: its `read_token` reads its routes, its
/// `admin_token` reads and writes them, and neither opens any other.
#[derive(Debug, Clone, Default)]
pub struct BusinessTokens {
    /// Reads this business's routes.
    pub read: Option<Secret>,
    /// Reads and writes this business's routes.
    pub admin: Option<Secret>,
}

/// The business's own tokens, each checked as `[http]`'s are.
fn business_tokens(name: &str, rb: &mut RawBusiness, problems: &mut Vec<String>) -> BusinessTokens {
    let place = format!("business \"{name}\",");
    let mut token = |given: Option<Secret>, file: Option<PathBuf>, field: &str| {
        http_section::token(given, file, &place, field, problems)
    };
    let read = token(
        rb.read_token.take(),
        rb.read_token_file.take(),
        "read_token",
    );
    let admin = token(
        rb.admin_token.take(),
        rb.admin_token_file.take(),
        "admin_token",
    );
    if let (Some(r), Some(a)) = (&read, &admin) {
        if r.expose() == a.expose() {
            problems.push(format!("business \"{name}\", fields \"read_token\" and \"admin_token\" are the same token: a reader could write; give them different values"));
        }
    }
    BusinessTokens { read, admin }
}

/// Where a business's messages come from and go: its key, exchange and
/// routing key.
struct Names {
    key: String,
    exchange: String,
    routing_key: String,
}

/// `key`, `exchange` and `routing_key`, each set, each an AMQP short string
/// where AMQP carries it (the business's name and `content_type` too).
fn names(name: &str, rb: &mut RawBusiness, problems: &mut Vec<String>) -> Names {
    let field = |f: &str| format!("business \"{name}\", field \"{f}\"");
    let mut need = |f: &str, v: Option<String>, empty_ok: bool| -> String {
        required(&field(f), v, empty_ok, problems)
    };
    let key = need("key", rb.key.take(), false);
    // The default exchange is named "", so an empty exchange is legitimate.
    let exchange = need("exchange", rb.exchange.take(), true);
    // An intake message keeps its own routing key; the business's is only
    // for tasks scheduled another way.
    let routing_key = need(
        "routing_key",
        rb.routing_key
            .take()
            .or_else(|| rb.intake.as_ref().map(|_| String::new())),
        true,
    );
    for (f, value) in [
        ("exchange", exchange.as_str()),
        ("routing_key", routing_key.as_str()),
        ("content_type", rb.content_type.as_deref().unwrap_or("")),
    ] {
        check_short_string(&field(f), value, problems);
    }
    check_short_string(
        &format!(
            "business name \"{}...\"",
            name.chars().take(16).collect::<String>()
        ),
        name,
        problems,
    );
    problems.extend(brace_without_hash_tag(name, &key));
    Names {
        key,
        exchange,
        routing_key,
    }
}

/// A business's counts: scanners, batch, window, shards, attempts and rate.
struct Sizes {
    scanners: usize,
    batch_size: usize,
    window: usize,
    shards: usize,
    max_attempts: u32,
    max_rate: Option<u32>,
}

/// The counts, each within its range.
fn sizes(name: &str, rb: &RawBusiness, problems: &mut Vec<String>) -> Sizes {
    let mut size = |f: &str, v: Option<i64>, default: usize, max: usize| -> usize {
        let place = format!("business \"{name}\", field \"{f}\"");
        size_within(&place, v, default as i64, max as i64, problems) as usize
    };
    Sizes {
        scanners: size("scanners", rb.scanners, defaults::SCANNERS, 64),
        batch_size: size("batch_size", rb.batch_size, defaults::BATCH_SIZE, 10_000),
        window: size("window", rb.window, defaults::WINDOW, 100_000),
        shards: size("shards", rb.shards, 1, 1024),
        max_attempts: size(
            "max_attempts",
            rb.max_attempts,
            defaults::MAX_ATTEMPTS as usize,
            1000,
        ) as u32,
        max_rate: rb
            .max_rate
            .map(|r| size("max_rate", Some(r), 1, 10_000_000) as u32),
    }
}

/// A business's durations.
struct Timing {
    lease: Duration,
    retry_backoff: Duration,
    retry_backoff_max: Duration,
    shutdown_timeout: Duration,
    poll_interval: Duration,
    watchdog_interval: Duration,
    dedup_window: Option<Duration>,
}

/// The durations, each longer than zero and within its limit; a bad one
/// is a problem and stands at its default meanwhile.
fn timing(name: &str, rb: &mut RawBusiness, problems: &mut Vec<String>) -> Timing {
    let mut duration = |field: &str, v: Option<String>, default: &str, max: Duration| -> Duration {
        let s = v.unwrap_or_else(|| default.to_string());
        let place = format!("business \"{name}\", field \"{field}\"");
        parse_duration(&place, &s, max, problems)
            .unwrap_or_else(|| humantime::parse_duration(default).unwrap_or(Duration::from_secs(1)))
    };
    Timing {
        lease: duration("lease", rb.lease.take(), defaults::LEASE, limits::LEASE),
        retry_backoff: duration(
            "retry_backoff",
            rb.retry_backoff.take(),
            defaults::RETRY_BACKOFF,
            limits::RETRY_BACKOFF,
        ),
        retry_backoff_max: duration(
            "retry_backoff_max",
            rb.retry_backoff_max.take(),
            defaults::RETRY_BACKOFF_MAX,
            limits::RETRY_BACKOFF,
        ),
        shutdown_timeout: duration(
            "shutdown_timeout",
            rb.shutdown_timeout.take(),
            defaults::SHUTDOWN_TIMEOUT,
            limits::SHUTDOWN_TIMEOUT,
        ),
        poll_interval: duration(
            "poll_interval",
            rb.poll_interval.take(),
            defaults::POLL_INTERVAL,
            limits::IDLE,
        ),
        watchdog_interval: duration(
            "watchdog_interval",
            rb.watchdog_interval.take(),
            defaults::WATCHDOG_INTERVAL,
            limits::IDLE,
        ),
        dedup_window: rb
            .dedup_window
            .clone()
            .map(|w| duration("dedup_window", Some(w), "1h", limits::DEDUP_WINDOW)),
    }
}

/// How scores are read and which properties each message carries.
fn formats(name: &str, rb: &RawBusiness, problems: &mut Vec<String>) -> (ScoreUnit, Properties) {
    let field = |f: &str| format!("business \"{name}\", field \"{f}\"");
    let score_unit = one_of(
        &field("score_unit"),
        rb.score_unit.as_deref(),
        &[("ms", "", ScoreUnit::Millis), ("s", "", ScoreUnit::Seconds)],
        problems,
    );
    let properties = one_of(
        &field("properties"),
        rb.properties.as_deref(),
        &[
            ("standard", "", Properties::Standard),
            ("full", "", Properties::Full),
            ("no-headers", "", Properties::NoHeaders),
            ("bare", "", Properties::Bare),
        ],
        problems,
    );
    (score_unit, properties)
}

/// `member`: body or id, id implied by an intake or a schedule; a
/// `dedup_window` needs id mode.
fn member_mode(
    name: &str,
    rb: &RawBusiness,
    has_intake: bool,
    recurring: &[Schedule],
    timing: &Timing,
    problems: &mut Vec<String>,
) -> MemberMode {
    // An intake or a schedule addresses every message by its id: id mode
    // is implied.
    let member_setting = rb
        .member
        .as_deref()
        .or(has_intake.then_some("id"))
        .or((!recurring.is_empty()).then_some("id"));
    let member = one_of(
        &format!("business \"{name}\", field \"member\""),
        member_setting,
        &[
            ("body", "", MemberMode::Body),
            (
                "id",
                "",
                MemberMode::Id {
                    dedup_window: timing.dedup_window,
                },
            ),
        ],
        problems,
    );
    if member == MemberMode::Body
        && rb.dedup_window.is_some()
        && member_setting.is_none_or(|m| m == "body")
    {
        problems.push(format!(
            "business \"{name}\", field \"dedup_window\" needs member = \"id\": in body mode identical bodies already collapse while pending, and delivered bodies are not remembered"
        ));
    }
    member
}

/// Envelopes live in `{K}:body`, which only id mode has.
fn envelopes_by_body(name: &str, envelopes: bool, member: MemberMode) -> Option<String> {
    (envelopes && member == MemberMode::Body).then(|| format!(
        "business \"{name}\", field \"envelopes\" needs member = \"id\": envelopes are stored in {{K}}:body, beside each task id"
    ))
}

/// A key with a `}` but no `{tag}`: its helper keys could not share its slot.
fn brace_without_hash_tag(name: &str, key: &str) -> Option<String> {
    (key.contains('}') && !crate::keys::has_hash_tag(key)).then(|| format!(
        "business \"{name}\", field \"key\": \"{key}\" has a '}}' but no hash tag such as {{tag}}, so its helper keys could not share its cluster slot"
    ))
}

/// On a cluster, shards of a hash-tagged key would all share one slot.
fn shards_share_a_slot(name: &str, key: &str, mode: RedisMode, shards: usize) -> Option<String> {
    (mode == RedisMode::Cluster && shards > 1 && crate::keys::has_hash_tag(key)).then(|| format!(
        "business \"{name}\", field \"key\": \"{key}\" has a hash tag, so on a cluster all {shards} shards would share one slot and one master; drop the {{...}} from the key (delayd tags each shard itself)"
    ))
}

/// A rate shared through Redis needs a rate.
fn shared_rate_without_rate(name: &str, scope: RateScope, max_rate: Option<u32>) -> Option<String> {
    (scope == RateScope::Cluster && max_rate.is_none()).then(|| format!(
        "business \"{name}\", field \"max_rate_scope\" = \"cluster\" needs max_rate (publishes per second shared by every process)"
    ))
}

/// A lease under a second expires under ordinary confirm delays.
fn lease_too_short(name: &str, lease: Duration) -> Option<String> {
    (lease < Duration::from_secs(1)).then(|| format!(
        "business \"{name}\", field \"lease\" must be at least 1s (got {}): a shorter lease expires under ordinary confirm delays and causes duplicates",
        humantime::format_duration(lease)
    ))
}

/// Schedules store each occurrence by its id: body mode cannot hold them.
fn schedules_by_body(name: &str, recurring: &[Schedule], member: Option<&str>) -> Option<String> {
    (!recurring.is_empty() && member == Some("body")).then(|| format!(
        "business \"{name}\", field \"member\": recurring schedules store each occurrence by its id, so they need member = \"id\" (or no member setting, which implies it)"
    ))
}
