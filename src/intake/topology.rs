//! The intake's side of the broker: the exchange producers publish to and
//! the queue delayd consumes, declared only when missing, so that whatever
//! an operator declared (a topic exchange, a queue with a policy or a
//! dead-letter exchange of its own) stays as it is.

use lapin::options::{ExchangeDeclareOptions, QueueBindOptions, QueueDeclareOptions};
use lapin::types::{AMQPValue, FieldTable, LongString};
use lapin::{Channel, Connection, ExchangeKind};

use crate::config::intake_settings::{QueueType, Settings};

/// The binding key delayd binds the intake queue with: every routing key
/// matches it on a fanout or topic exchange.
pub const BINDING_KEY: &str = "#";

/// Where an intake name stands on the broker.
#[derive(Debug, PartialEq, Eq)]
pub enum Found {
    /// It exists (and, for the queue, this many messages wait in it).
    Exists(Option<u32>),
    /// It does not exist yet: `delayd run` declares it.
    Missing,
}

/// Makes sure the intake exchange and queue exist and the queue is bound:
/// each is declared, as the settings say, only where a passive declare
/// finds nothing. Each passive declare gets a channel of its own, since a
/// missing name closes the channel it was asked on. The queue comes first
/// and the binding right after the exchange: a new exchange routes what
/// producers publish to it nowhere until its queue is bound, so that
/// window is one round trip.
pub async fn ensure(conn: &Connection, s: &Settings) -> Result<(), Refused> {
    if let Some(line) = refusal(conn, s).await? {
        return Err(Refused::Exchange(line));
    }
    if queue(conn, &s.queue).await? == Found::Missing {
        let ch = conn.create_channel().await?;
        ch.queue_declare(
            s.queue.as_str().into(),
            QueueDeclareOptions {
                durable: true,
                ..Default::default()
            },
            queue_arguments(s),
        )
        .await?;
        let _ = ch.close(200, "ok".into()).await;
    }
    let exchange_missing = exchange(conn, &s.exchange).await? == Found::Missing;
    let ch = conn.create_channel().await?;
    if exchange_missing {
        declare_fanout(&ch, &s.exchange).await?;
    }
    bind(&ch, s).await?;
    let _ = ch.close(200, "ok".into()).await;
    Ok(())
}

/// Why [`ensure`] did not make the intake ready.
#[derive(Debug, thiserror::Error)]
pub enum Refused {
    /// The intake exchange exists with another type: see [`refusal`].
    #[error("{0}")]
    Exchange(String),
    /// The broker failed or refused a declare.
    #[error("{0}")]
    Broker(#[from] lapin::Error),
}

/// Declares the dead-letter exchange the settings name, when missing
/// (durable fanout), so that what the intake rejects reaches a place that
/// exists rather than being dropped by the broker.
async fn declare_dead_letter_target(conn: &Connection, dlx: &str) -> Result<(), lapin::Error> {
    if dlx.is_empty() || exchange(conn, dlx).await? == Found::Exists(None) {
        return Ok(());
    }
    let ch = conn.create_channel().await?;
    declare_fanout(&ch, dlx).await?;
    let _ = ch.close(200, "ok".into()).await;
    Ok(())
}

/// Where the intake sends a message it cannot store to be published as it
/// came, as verified on the broker (on every channel it opens): the broker
/// drops a rejected message whose queue has no dead-letter exchange, or
/// whose dead-letter exchange routes it nowhere.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DeadLetters {
    /// Rejected without requeue: the intake queue dead-letters to
    /// `dead_letter_exchange`, and `dead_letter_queue` is bound behind it
    /// with a key every routing key matches.
    Rejected,
    /// Kept in the business's dead set with its reason; the reason the
    /// target could not be verified.
    Kept(String),
}

/// Verifies the dead-letter target the settings name (see [`DeadLetters`]):
/// the intake queue's own `x-dead-letter-exchange` (a declare with delayd's
/// arguments succeeds only if the queue has them), the exchange's type
/// (fanout or topic, so that [`BINDING_KEY`] matches every routing key) and
/// `dead_letter_queue` bound to it (declared when missing; binding again is
/// harmless). Each step on a channel of its own, as a refusal closes it.
/// With `apply` false (`delayd check`) nothing is declared or bound: what
/// `run` would declare counts as verified.
pub async fn dead_letters(
    conn: &Connection,
    s: &Settings,
    apply: bool,
) -> Result<DeadLetters, lapin::Error> {
    let kept = |why: String| Ok(DeadLetters::Kept(why));
    let Some(dlx) = s.dead_letter_exchange.as_deref().filter(|d| !d.is_empty()) else {
        return kept("intake.dead_letter_exchange is not set".into());
    };
    let Some(dlq) = s.dead_letter_queue.as_deref() else {
        return kept(format!(
            "intake.dead_letter_queue is not set, so no queue behind dead_letter_exchange \"{dlx}\" can be verified"
        ));
    };
    if !apply && queue(conn, &s.queue).await? == Found::Missing {
        return Ok(DeadLetters::Rejected);
    }
    let ch = conn.create_channel().await?;
    let declared = ch
        .queue_declare(
            s.queue.as_str().into(),
            QueueDeclareOptions {
                durable: true,
                ..Default::default()
            },
            queue_arguments(s),
        )
        .await;
    match declared {
        Ok(_) => {
            let _ = ch.close(200, "ok".into()).await;
        }
        Err(e) if e.to_string().contains("PRECONDITION_FAILED") => {
            return kept(format!(
                "intake queue \"{}\" exists with other arguments than delayd declares (x-dead-letter-exchange \"{dlx}\"{}): delete it while empty so delayd declares it, or declare it with them",
                s.queue,
                if s.queue_type == QueueType::Quorum { ", a quorum queue" } else { "" }
            ))
        }
        Err(e) => return Err(e),
    }
    if exchange(conn, dlx).await? == Found::Missing {
        if !apply {
            return Ok(DeadLetters::Rejected);
        }
        declare_dead_letter_target(conn, dlx).await?;
    }
    match exchange_type_if_not_fanout(conn, dlx).await? {
        None => {}
        Some(t) if t == "topic" => {}
        Some(t) => {
            return kept(format!(
                "dead_letter_exchange \"{dlx}\" is {t}: only a fanout or topic exchange routes every routing key to dead_letter_queue"
            ))
        }
    }
    if !apply {
        return Ok(DeadLetters::Rejected);
    }
    let ch = conn.create_channel().await?;
    if queue(conn, dlq).await? == Found::Missing {
        ch.queue_declare(
            dlq.into(),
            QueueDeclareOptions {
                durable: true,
                ..Default::default()
            },
            FieldTable::default(),
        )
        .await?;
    }
    ch.queue_bind(
        dlq.into(),
        dlx.into(),
        BINDING_KEY.into(),
        QueueBindOptions::default(),
        FieldTable::default(),
    )
    .await?;
    let _ = ch.close(200, "ok".into()).await;
    Ok(DeadLetters::Rejected)
}

/// Declares `name` as a durable fanout exchange.
async fn declare_fanout(ch: &Channel, name: &str) -> Result<(), lapin::Error> {
    ch.exchange_declare(
        name.into(),
        ExchangeKind::Fanout,
        ExchangeDeclareOptions {
            durable: true,
            ..Default::default()
        },
        FieldTable::default(),
    )
    .await
}

async fn bind(ch: &Channel, s: &Settings) -> Result<(), lapin::Error> {
    ch.queue_bind(
        s.queue.as_str().into(),
        s.exchange.as_str().into(),
        BINDING_KEY.into(),
        QueueBindOptions::default(),
        FieldTable::default(),
    )
    .await
}

/// The `x-delivery-limit` of a quorum intake queue delayd declares: one
/// no stop of delayd can reach. A quorum queue counts every hand-back of a
/// delivery (a closed channel or connection too), RabbitMQ 4 drops or
/// dead-letters a message handed back more than 20 times by default, and
/// delayd hands back what it holds whenever it stops before Redis took it.
/// 2^31 - 1 hand-backs would take 24 days of nothing else at one a
/// millisecond. Not RabbitMQ 4's "no limit", -1: RabbitMQ 3 takes it as a
/// limit below every count and drops a message at its first hand-back.
pub const DELIVERY_LIMIT: i64 = i32::MAX as i64;

/// The arguments of a queue delayd declares.
pub fn queue_arguments(s: &Settings) -> FieldTable {
    let mut args = FieldTable::default();
    if s.queue_type == QueueType::Quorum {
        args.insert(
            "x-queue-type".into(),
            AMQPValue::LongString(LongString::from("quorum")),
        );
        args.insert(
            "x-delivery-limit".into(),
            AMQPValue::LongLongInt(DELIVERY_LIMIT),
        );
    }
    if let Some(dlx) = &s.dead_letter_exchange {
        args.insert(
            "x-dead-letter-exchange".into(),
            AMQPValue::LongString(LongString::from(dlx.as_str())),
        );
    }
    args
}

/// Whether `name` exists as an exchange (a passive declare on a channel of
/// its own). A refusal other than "not found" is an error.
pub async fn exchange(conn: &Connection, name: &str) -> Result<Found, lapin::Error> {
    let ch = conn.create_channel().await?;
    let r = ch
        .exchange_declare(
            name.into(),
            ExchangeKind::Fanout,
            ExchangeDeclareOptions {
                passive: true,
                ..Default::default()
            },
            FieldTable::default(),
        )
        .await;
    found(ch, r.map(|()| None)).await
}

/// Whether `name` exists as a queue, and how many messages wait in it.
pub async fn queue(conn: &Connection, name: &str) -> Result<Found, lapin::Error> {
    let ch = conn.create_channel().await?;
    let r = passive_queue(&ch, name).await;
    found(ch, r.map(|q| Some(q.message_count()))).await
}

/// How many consumers `name` has; `None` while the queue does not exist.
pub async fn consumers(conn: &Connection, name: &str) -> Result<Option<u32>, lapin::Error> {
    let ch = conn.create_channel().await?;
    let r = passive_queue(&ch, name).await;
    let found = found(ch, r.map(|q| Some(q.consumer_count()))).await?;
    Ok(match found {
        Found::Exists(n) => n,
        Found::Missing => None,
    })
}

async fn passive_queue(ch: &Channel, name: &str) -> Result<lapin::Queue, lapin::Error> {
    ch.queue_declare(
        name.into(),
        QueueDeclareOptions {
            passive: true,
            ..Default::default()
        },
        FieldTable::default(),
    )
    .await
}

async fn found(ch: Channel, r: Result<Option<u32>, lapin::Error>) -> Result<Found, lapin::Error> {
    match r {
        Ok(count) => {
            let _ = ch.close(200, "ok".into()).await;
            Ok(Found::Exists(count))
        }
        Err(e) if e.to_string().contains("NOT_FOUND") => Ok(Found::Missing),
        Err(e) => Err(e),
    }
}

/// The type an existing exchange has when it is not `fanout`, read from the
/// broker's refusal of a fanout declare ("... received 'fanout' but current
/// is 'x-delayed-message'"); `None` when it is a durable fanout exchange.
/// Only for an exchange known to exist: a missing one would be created.
pub async fn exchange_type_if_not_fanout(
    conn: &Connection,
    name: &str,
) -> Result<Option<String>, lapin::Error> {
    let ch = conn.create_channel().await?;
    let r = declare_fanout(&ch, name).await;
    match r {
        Ok(()) => {
            let _ = ch.close(200, "ok".into()).await;
            Ok(None)
        }
        Err(e) => {
            let text = e.to_string();
            if !text.contains("PRECONDITION_FAILED") {
                return Err(e);
            }
            let current = text
                .contains("arg 'type'")
                .then(|| text.split("but current is '").nth(1))
                .flatten()
                .and_then(|rest| rest.split('\'').next());
            Ok(Some(match current {
                Some(t) => t.to_string(),
                None => format!("not a durable fanout ({text})"),
            }))
        }
    }
}

/// Why the intake exchange cannot be used, when it exists with another
/// type than fanout: the line `delayd check` prints and `delayd run`
/// refuses to start with. delayd binds its queue with [`BINDING_KEY`]; any
/// other type routes some or all publishes nowhere, and the plugin's own
/// exchange would deliver each message a second time.
pub async fn refusal(conn: &Connection, s: &Settings) -> Result<Option<String>, lapin::Error> {
    if exchange(conn, &s.exchange).await? == Found::Missing {
        return Ok(None);
    }
    Ok(match exchange_type_if_not_fanout(conn, &s.exchange).await? {
        None => None,
        Some(t) if t == "x-delayed-message" => Some(format!(
            "intake exchange \"{}\" is the delayed-message plugin's own exchange: both the plugin and delayd would deliver every message; delete it (or name the intake otherwise) as docs/migrating-from-the-delayed-message-plugin.md shows",
            s.exchange
        )),
        Some(t) => Some(format!(
            "intake exchange \"{}\" is {t}, not fanout: delayd binds its queue with \"{BINDING_KEY}\" and would miss publishes; delete it so delayd declares a durable fanout exchange, or name the intake otherwise",
            s.exchange
        )),
    })
}

/// What `delayd check` says of an intake's topology: `Ok` with a summary,
/// or `Err` with what stops the intake from working and what to do.
pub async fn check(conn: &Connection, s: &Settings) -> Result<String, String> {
    let broker = |e: lapin::Error| format!("cannot inspect the intake on the broker: {e}");
    if let Some(line) = refusal(conn, s).await.map_err(broker)? {
        return Err(line);
    }
    let exchange_note = match exchange(conn, &s.exchange).await.map_err(broker)? {
        Found::Missing => format!(
            "exchange \"{}\" missing (delayd run declares it, durable fanout)",
            s.exchange
        ),
        Found::Exists(_) => format!("exchange \"{}\" (fanout)", s.exchange),
    };
    let queue_note = match queue(conn, &s.queue).await.map_err(broker)? {
        Found::Missing => format!(
            "queue \"{}\" missing (delayd run declares and binds it)",
            s.queue
        ),
        Found::Exists(n) => format!("queue \"{}\" ({} waiting)", s.queue, n.unwrap_or(0)),
    };
    let dead = match dead_letters(conn, s, false).await.map_err(broker)? {
        DeadLetters::Rejected => format!(
            "; what cannot be stored is rejected to \"{}\", queue \"{}\"",
            s.dead_letter_exchange.as_deref().unwrap_or_default(),
            s.dead_letter_queue.as_deref().unwrap_or_default()
        ),
        DeadLetters::Kept(why) if s.dead_letter_exchange.is_some() => {
            format!("; what cannot be stored is kept in the dead set ({why})")
        }
        DeadLetters::Kept(_) => "; what cannot be stored is kept in the dead set".into(),
    };
    Ok(format!("{exchange_note} -> {queue_note}{dead}"))
}
