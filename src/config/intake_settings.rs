//! The validated `[businesses.NAME.intake]` section.

/// Defaults of the optional intake settings, shown in docs/configuration.md.
pub mod defaults {
    /// Unacknowledged intake deliveries the broker may hand delayd at once.
    pub const PREFETCH: u16 = 2000;
    /// Deliveries written to Redis in one script call.
    pub const BATCH_SIZE: usize = 500;
    /// Replicas that must hold an intake write before it is acknowledged,
    /// in Sentinel and Cluster modes (standalone: 0, nothing to wait for).
    pub const REPLICAS: u32 = 1;
    /// How long a write waits for them before it is retried.
    pub const REPLICA_TIMEOUT: &str = "1s";
    /// The same with `replica_ack = "fsynced"`: replicas fsync once a second.
    pub const REPLICA_TIMEOUT_FSYNCED: &str = "3s";
}

/// What a replica must have done with an intake write for it to count.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReplicaAck {
    /// Received it (`WAIT`): in the replica's memory (the default).
    Received,
    /// Written it to its append-only file and fsynced it (`WAITAOF`,
    /// Redis 7.2 and later, Valkey 8): the replica needs `appendonly yes`.
    Fsynced,
}

/// How many replicas must hold an intake write before its deliveries are
/// acknowledged to the broker, and how long a write waits for them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReplicaWait {
    /// Replicas that must hold it; 0 waits for none.
    pub replicas: u32,
    /// The longest one write waits; fewer replicas by then: retried.
    pub timeout: std::time::Duration,
    /// What a replica must have done with it.
    pub ack: ReplicaAck,
}

/// What kind of queue delayd declares as the intake queue when it is missing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QueueType {
    /// A classic durable queue (the default).
    Classic,
    /// A quorum queue, replicated over the cluster's nodes.
    Quorum,
}

/// What the delivered message's `x-delay` header holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum XDelay {
    /// The header exactly as the producer published it (the default).
    AsPublished,
    /// The plugin's own habit: a delay that was applied comes out negated,
    /// as a signed 64-bit integer, so a consumer that publishes the message
    /// again to the delayed exchange does not delay it a second time.
    Negated,
}

/// What becomes of a producer's `user_id`. RabbitMQ refuses a publish whose
/// `user_id` is not the publishing connection's user (unless that user has
/// the `impersonator` tag), and delayd publishes as itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UserId {
    /// Kept when it names delayd's own user, dropped (and counted)
    /// otherwise, so the message is delivered (the default).
    DropOthers,
    /// Kept always: delayd's user must have the `impersonator` tag.
    Keep,
}

/// How one business takes in messages published with `x-delay`: the intake
/// exchange producers publish to, and the queue delayd consumes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Settings {
    /// The exchange producers publish to, declared (durable, fanout) when missing.
    pub exchange: String,
    /// The queue delayd consumes, declared and bound to `exchange` when missing.
    pub queue: String,
    /// Classic or quorum, for a queue delayd declares.
    pub queue_type: QueueType,
    /// The consumer's prefetch.
    pub prefetch: u16,
    /// Deliveries per Redis write.
    pub batch_size: usize,
    /// `x-dead-letter-exchange` of a queue delayd declares: where rejected
    /// intake messages go, once verified (see `intake::topology`).
    pub dead_letter_exchange: Option<String>,
    /// The queue bound behind `dead_letter_exchange`, declared and bound by
    /// delayd: without one verified, rejected messages stay in the dead set.
    pub dead_letter_queue: Option<String>,
    /// Envelopes larger than this many bytes are rejected rather than stored.
    pub max_message_size: Option<usize>,
    /// The delivered `x-delay` header.
    pub x_delay: XDelay,
    /// The delivered `user_id`.
    pub user_id: UserId,
    /// The replicas a write waits for before its deliveries are acknowledged.
    pub replica_wait: ReplicaWait,
    /// The header naming each message's tenant, on a business with tenants
    /// (docs/tenants.md); without it every message goes to [`DEFAULT_TENANT`].
    pub tenant_header: Option<String>,
}

/// The tenant of an intake message that names none, or names one that cannot
/// be a tenant (empty, over [`TENANT_MAX_BYTES`], not text, not a string).
pub const DEFAULT_TENANT: &str = "default";

/// The longest tenant name, in bytes: a tenant is part of a key name.
pub const TENANT_MAX_BYTES: usize = 200;

/// Whether `name` can name a tenant: 1 to [`TENANT_MAX_BYTES`] bytes of
/// UTF-8 text without control characters, so it reads plainly wherever it
/// is shown.
pub fn names_a_tenant(name: &[u8]) -> bool {
    std::str::from_utf8(name).is_ok_and(|t| {
        !t.is_empty() && t.len() <= TENANT_MAX_BYTES && !t.chars().any(char::is_control)
    })
}

/// A problem for every intake queue two businesses name: each would take
/// some of the other's messages.
pub fn shared_queues(businesses: &[crate::config::Business]) -> Vec<String> {
    let mut owner: std::collections::BTreeMap<&str, &str> = Default::default();
    let mut problems = Vec::new();
    for b in businesses {
        let Some(intake) = &b.intake else { continue };
        if let Some(other) = owner.insert(&intake.queue, &b.name) {
            problems.push(format!(
                "business \"{}\", field \"intake.queue\": queue \"{}\" is also business \"{other}\"'s intake queue; each would take some of the other's messages: give each its own queue (both may bind it to the same exchange)",
                b.name, intake.queue
            ));
        }
    }
    problems
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{load, MemberMode};
    use std::io::Write;

    fn load_str(body: &str) -> Result<crate::config::Config, String> {
        let mut f = tempfile::NamedTempFile::new().unwrap();
        f.write_all(body.as_bytes()).unwrap();
        load(f.path()).map_err(|e| e.to_string())
    }

    fn with_intake(business: &str, intake: &str) -> String {
        format!(
            "[redis]\nurl = \"redis://127.0.0.1:6379/0\"\n[amqp]\nurl = \"amqp://127.0.0.1:5672/%2f\"\n\
             [businesses.orders]\nkey = \"delay:orders\"\nexchange = \"orders\"\n{business}\n\
             [businesses.orders.intake]\n{intake}\n"
        )
    }

    #[test]
    fn an_intake_needs_only_its_two_names_and_implies_id_mode() {
        let c = load_str(&with_intake(
            "",
            "exchange = \"orders.delayed\"\nqueue = \"delayd.intake.orders\"",
        ))
        .unwrap();
        let b = c.business("orders").unwrap();
        let i = b.intake.as_ref().unwrap();
        assert_eq!(i.exchange, "orders.delayed");
        assert_eq!(i.queue, "delayd.intake.orders");
        assert_eq!(i.queue_type, QueueType::Classic);
        assert_eq!(i.prefetch, defaults::PREFETCH);
        assert_eq!(i.x_delay, XDelay::AsPublished);
        assert_eq!(b.member, MemberMode::Id { dedup_window: None });
        assert_eq!(b.routing_key, "", "no routing_key needed");
    }

    #[test]
    fn every_intake_setting_is_read() {
        let c = load_str(&with_intake(
            "member = \"id\"\nrouting_key = \"r\"",
            "exchange = \"x\"\nqueue = \"q\"\nqueue_type = \"quorum\"\nprefetch = 100\nbatch_size = 500\n\
             dead_letter_exchange = \"dlx\"\nmax_message_size = 1000000\nx_delay = \"negated\"",
        ))
        .unwrap();
        let i = c.businesses[0].intake.clone().unwrap();
        assert_eq!(i.queue_type, QueueType::Quorum);
        assert_eq!(i.prefetch, 100);
        assert_eq!(i.batch_size, 100, "a batch never exceeds the prefetch");
        assert_eq!(i.dead_letter_exchange.as_deref(), Some("dlx"));
        assert_eq!(i.max_message_size, Some(1_000_000));
        assert_eq!(i.x_delay, XDelay::Negated);
    }

    #[test]
    fn intake_problems_are_all_reported_with_their_field() {
        let e = load_str(&with_intake(
            "member = \"body\"",
            "queue = \"\"\nqueue_type = \"stream\"\nprefetch = 0\nx_delay = \"positive\"",
        ))
        .unwrap_err();
        for want in [
            "business \"orders\", field \"intake.exchange\" is required",
            "business \"orders\", field \"intake.queue\" must not be empty",
            "field \"intake.queue_type\" must be \"classic\" or \"quorum\" (got \"stream\")",
            "field \"intake.prefetch\" must be at least 1 (got 0)",
            "field \"intake.x_delay\" must be \"as-published\" or \"negated\"",
            "field \"member\": an intake stores every message by its id",
        ] {
            assert!(e.contains(want), "{want:?} missing from {e}");
        }
    }

    #[test]
    fn the_intake_exchange_must_not_be_the_target() {
        let e = load_str(&with_intake("", "exchange = \"orders\"\nqueue = \"q\"")).unwrap_err();
        assert!(
            e.contains("field \"intake.exchange\": \"orders\" is also the business's exchange"),
            "{e}"
        );
        let e = load_str(&with_intake("", "exchange = \"amq.fanout\"\nqueue = \"q\"")).unwrap_err();
        assert!(e.contains("reserves"), "{e}");
    }

    fn in_mode(redis: &str, intake: &str) -> Result<ReplicaWait, String> {
        let body = with_intake("", &format!("exchange = \"x\"\nqueue = \"q\"\n{intake}")).replace(
            "[redis]\nurl = \"redis://127.0.0.1:6379/0\"",
            &format!("[redis]\n{redis}"),
        );
        let c = load_str(&body)?;
        Ok(c.businesses[0].intake.clone().unwrap().replica_wait)
    }

    #[test]
    fn an_intake_waits_for_one_replica_in_sentinel_and_cluster_modes_and_none_standalone() {
        let second = std::time::Duration::from_secs(1);
        let standalone = in_mode("url = \"redis://127.0.0.1:6379/0\"", "").unwrap();
        assert_eq!(
            (standalone.replicas, standalone.timeout, standalone.ack),
            (0, second, ReplicaAck::Received)
        );
        let sentinel = in_mode(
            "mode = \"sentinel\"\nurls = [\"redis://127.0.0.1:26379\"]\nmaster_name = \"m\"",
            "",
        )
        .unwrap();
        assert_eq!((sentinel.replicas, sentinel.timeout), (1, second));
        let cluster = in_mode(
            "mode = \"cluster\"\nurls = [\"redis://127.0.0.1:7000\"]",
            "",
        )
        .unwrap();
        assert_eq!(cluster.replicas, 1);
        let set = in_mode(
            "url = \"redis://127.0.0.1:6379/0\"",
            "replicas = 2\nreplica_timeout = \"250ms\"\nreplica_ack = \"fsynced\"",
        )
        .unwrap();
        assert_eq!(
            (set.replicas, set.timeout, set.ack),
            (
                2,
                std::time::Duration::from_millis(250),
                ReplicaAck::Fsynced
            )
        );
    }

    #[test]
    fn fsynced_waits_three_seconds_by_default_since_replicas_fsync_once_a_second() {
        let fsynced = in_mode(
            "url = \"redis://127.0.0.1:6379/0\"",
            "replicas = 1\nreplica_ack = \"fsynced\"",
        )
        .unwrap();
        assert_eq!(fsynced.timeout, std::time::Duration::from_secs(3));
        let received = in_mode("url = \"redis://127.0.0.1:6379/0\"", "replicas = 1").unwrap();
        assert_eq!(received.timeout, std::time::Duration::from_secs(1));
    }

    #[test]
    fn replica_settings_that_cannot_work_are_refused_with_their_field() {
        let standalone = "url = \"redis://127.0.0.1:6379/0\"";
        for (intake, want) in [
            (
                "replicas = -1",
                "field \"intake.replicas\" must be between 0 and 100 (got -1)",
            ),
            (
                "replicas = 1\nreplica_timeout = \"0s\"",
                "field \"intake.replica_timeout\" must be longer than zero",
            ),
            (
                "replica_timeout = \"500us\"",
                "field \"intake.replica_timeout\" must be at least 1ms",
            ),
            (
                "replica_timeout = \"10s\"",
                "field \"intake.replica_timeout\" must be at most 5s",
            ),
            (
                "replica_ack = \"maybe\"",
                "field \"intake.replica_ack\" must be \"received\" (WAIT) or \"fsynced\"",
            ),
            (
                "replica_ack = \"fsynced\"",
                "replica_ack\" = \"fsynced\" needs replicas of at least 1",
            ),
        ] {
            let e = in_mode(standalone, intake).unwrap_err();
            assert!(e.contains(want), "{intake}: {want:?} missing from {e}");
        }
    }

    #[test]
    fn unknown_intake_fields_are_refused() {
        let e = load_str(&with_intake(
            "",
            "exchange = \"x\"\nqueue = \"q\"\ndelay = 5",
        ))
        .unwrap_err();
        assert!(e.contains("business \"orders\", field \"intake\""), "{e}");
        assert!(e.contains("delay"), "{e}");
    }

    #[test]
    fn two_businesses_cannot_share_an_intake_queue() {
        let body = format!(
            "{}\n[businesses.other]\nkey = \"delay:other\"\nexchange = \"other\"\n[businesses.other.intake]\nexchange = \"x2\"\nqueue = \"q\"\n",
            with_intake("", "exchange = \"x\"\nqueue = \"q\"")
        );
        let e = load_str(&body).unwrap_err();
        assert!(e.contains("queue \"q\" is also business"), "{e}");
    }

    #[test]
    fn the_environment_sets_intake_fields_as_written() {
        let body = with_intake("", "exchange = \"x\"\nqueue = \"q\"");
        let mut f = tempfile::NamedTempFile::new().unwrap();
        f.write_all(body.as_bytes()).unwrap();
        let env: config::Map<String, String> = [
            ("DELAYD_BUSINESSES__ORDERS__INTAKE__QUEUE", "q.from.env"),
            ("DELAYD_BUSINESSES__ORDERS__INTAKE__PREFETCH", "300"),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
        let c = crate::config::load_with_env(f.path(), env).unwrap();
        let i = c.businesses[0].intake.clone().unwrap();
        assert_eq!((i.queue.as_str(), i.prefetch), ("q.from.env", 300));
    }
}
