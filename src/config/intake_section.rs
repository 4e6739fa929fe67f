//! A business's `[businesses.NAME.intake]` section.

use super::intake_settings::{defaults, QueueType, Settings, UserId, XDelay};
use super::*;

/// The `intake` section's rules: both names set, usable on the broker and
/// distinct from the target; id mode (implied, or `member = "id"`).
pub(super) fn validate_intake(
    name: &str,
    raw: RawIntake,
    member: Option<&str>,
    target: &str,
    mode: RedisMode,
    tenants: bool,
    problems: &mut Vec<String>,
) -> Option<Settings> {
    let before = problems.len();
    let place = |field: &str| format!("business \"{name}\", field \"intake.{field}\"");
    let exchange = broker_name(&place("exchange"), raw.exchange, problems);
    let queue = broker_name(&place("queue"), raw.queue, problems);
    if !exchange.is_empty() && exchange == target {
        problems.push(format!("{}: \"{exchange}\" is also the business's exchange, where delayd delivers: each delivery would come back to the intake; producers publish to the intake exchange, consumers bind to the other", place("exchange")));
    }
    if member == Some("body") {
        problems.push(format!("business \"{name}\", field \"member\": an intake stores every message by its id, so it needs member = \"id\" (or no member setting, which implies it)"));
    }
    let words = [&raw.queue_type, &raw.x_delay, &raw.user_id].map(|w| w.as_deref());
    let (queue_type, x_delay, user_id) = choices(&place, words, problems);
    let mut range = |field: &str, v: Option<i64>, default: i64, max: i64| -> i64 {
        size_within(&place(field), v, default, max, problems)
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
    let (dead_letter_exchange, dead_letter_queue) = dead_letters(
        &place,
        raw.dead_letter_exchange,
        raw.dead_letter_queue,
        problems,
    );
    let replica_wait = replica_wait(
        &place,
        &raw.replicas,
        raw.replica_timeout,
        raw.replica_ack.as_deref(),
        mode,
        problems,
    );
    let tenant_header = tenant_header(
        &place("tenant_header"),
        raw.tenant_header,
        tenants,
        problems,
    );
    (problems.len() == before).then(|| Settings {
        exchange,
        queue,
        queue_type,
        prefetch,
        batch_size: batch_size.min(prefetch as usize),
        dead_letter_exchange,
        dead_letter_queue,
        max_message_size,
        x_delay,
        user_id,
        replica_wait,
        tenant_header,
    })
}

/// An exchange or queue the intake declares: required, a short string, and
/// not in the broker's own `amq.` namespace.
fn broker_name(place: &str, v: Option<String>, problems: &mut Vec<String>) -> String {
    let s = required(place, v, false, problems);
    if !s.is_empty() {
        check_short_string(place, &s, problems);
        if s.starts_with("amq.") {
            problems.push(format!(
                "{place} \"{s}\" starts with \"amq.\", a prefix the broker reserves for itself"
            ));
        }
    }
    s
}

/// `queue_type`, `x_delay` and `user_id` as written: each one of its words.
fn choices(
    place: &dyn Fn(&str) -> String,
    [queue_type, x_delay, user_id]: [Option<&str>; 3],
    problems: &mut Vec<String>,
) -> (QueueType, XDelay, UserId) {
    let queue_type = one_of(
        &place("queue_type"),
        queue_type,
        &[
            ("classic", "", QueueType::Classic),
            ("quorum", "", QueueType::Quorum),
        ],
        problems,
    );
    let x_delay = one_of(
        &place("x_delay"),
        x_delay,
        &[
            ("as-published", "", XDelay::AsPublished),
            ("negated", "", XDelay::Negated),
        ],
        problems,
    );
    let user_id = one_of(
        &place("user_id"),
        user_id,
        &[
            ("drop-others", "", UserId::DropOthers),
            (
                "keep",
                "delayd's user needs the impersonator tag",
                UserId::Keep,
            ),
        ],
        problems,
    );
    (queue_type, x_delay, user_id)
}

/// `dead_letter_exchange` and the queue behind it: short strings, and the
/// queue only with the exchange.
fn dead_letters(
    place: &dyn Fn(&str) -> String,
    exchange: Option<String>,
    queue: Option<String>,
    problems: &mut Vec<String>,
) -> (Option<String>, Option<String>) {
    if let Some(d) = &exchange {
        check_short_string(&place("dead_letter_exchange"), d, problems);
    }
    if let Some(q) = &queue {
        check_short_string(&place("dead_letter_queue"), q, problems);
        if exchange.is_none() {
            problems.push(format!(
                "{}: names the queue behind dead_letter_exchange, which is not set; set both, or neither",
                place("dead_letter_queue")
            ));
        }
    }
    (exchange, queue)
}

/// `tenant_header`: a header name, only on a business with tenants.
fn tenant_header(
    place: &str,
    header: Option<String>,
    tenants: bool,
    problems: &mut Vec<String>,
) -> Option<String> {
    if let Some(h) = &header {
        check_short_string(place, h, problems);
        if h.is_empty() {
            problems.push(format!(
                "{place} is empty; name the header that carries each message's tenant, or remove it"
            ));
        }
        if !tenants {
            problems.push(format!(
                "{place} needs tenants = true on the business; add it or remove the header"
            ));
        }
    }
    header
}

/// `replicas`, `replica_timeout` and `replica_ack`: by default one replica
/// in the modes that have replicas (Sentinel, Cluster), none standalone.
fn replica_wait(
    place: &dyn Fn(&str) -> String,
    replicas: &Option<i64>,
    timeout: Option<String>,
    ack: Option<&str>,
    mode: RedisMode,
    problems: &mut Vec<String>,
) -> super::intake_settings::ReplicaWait {
    use super::intake_settings::{defaults, ReplicaAck, ReplicaWait};
    let replicas = match *replicas {
        None if mode == RedisMode::Standalone => 0,
        None => defaults::REPLICAS,
        Some(n) if (0..=limits::REPLICAS).contains(&n) => n as u32,
        Some(n) => {
            problems.push(format!(
                "{} must be between 0 and {} (got {n}): the replicas that must hold an intake write before it is acknowledged",
                place("replicas"),
                limits::REPLICAS
            ));
            0
        }
    };
    let ack = one_of(
        &place("replica_ack"),
        ack,
        &[
            ("received", "WAIT", ReplicaAck::Received),
            (
                "fsynced",
                "WAITAOF: Redis 7.2 or later, replicas with appendonly yes",
                ReplicaAck::Fsynced,
            ),
        ],
        problems,
    );
    // A replica fsyncs its append-only file once a second: a 1 s wait for
    // it misses about every time, and a retried write waits again.
    let default_timeout = match ack {
        ReplicaAck::Received => defaults::REPLICA_TIMEOUT,
        ReplicaAck::Fsynced => defaults::REPLICA_TIMEOUT_FSYNCED,
    };
    let timeout_text = timeout.unwrap_or_else(|| default_timeout.to_string());
    let timeout = parse_duration(
        &place("replica_timeout"),
        &timeout_text,
        limits::REPLICA_TIMEOUT,
        problems,
    )
    .unwrap_or(Duration::from_secs(1));
    if timeout < Duration::from_millis(1) {
        problems.push(format!(
            "{} must be at least 1ms (got \"{timeout_text}\"): Redis waits in whole milliseconds, and 0 would wait for ever",
            place("replica_timeout")
        ));
    }
    if ack == ReplicaAck::Fsynced && replicas == 0 {
        problems.push(format!(
            "{} = \"fsynced\" needs replicas of at least 1 (there is nothing to wait for)",
            place("replica_ack")
        ));
    }
    ReplicaWait {
        replicas,
        timeout,
        ack,
    }
}
