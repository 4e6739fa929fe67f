//! What a broker error means for a held member: retried, refused, released
//! or pausing the business.

use super::*;

/// What a confirm that failed with an error means for its member.
pub(super) fn error_outcome(lane: &Lane, e: &lapin::Error, h: &Holding, batch: &Batch) -> Outcome {
    if let Some(reason) = topology_error(e) {
        // Nothing is wrong with the member: keep it pending, not dead.
        lane.pause.pause(&lane.business.name, &reason);
        return Outcome::Release;
    }
    match precondition_failure(e) {
        // The broker refused one message and closed the channel: every
        // confirm still owed on it fails with the same error, including
        // those of earlier messages whose confirms were not sent yet, and
        // they arrive in no particular order. Count an attempt only for
        // the refused message, so it ends in the dead set instead of
        // wedging the scanner; the others go back untouched.
        Some(reason) => match max_message_size(&reason) {
            // The error names the limit: blame exactly what exceeds it.
            Some(max) if message::published_body(&lane.business, &h.claimed).len() > max => {
                Outcome::Rejected(reason)
            }
            Some(_) => Outcome::Release,
            // Otherwise one member per batch, so a message the broker
            // keeps refusing still runs out of attempts.
            None if !batch.has_rejected() => Outcome::Rejected(reason),
            None => Outcome::Release,
        },
        None => Outcome::Release,
    }
}

/// What the broker's answer means for one member.
pub(super) enum Outcome {
    /// Delivered: forget it.
    Ack,
    /// Refused for now: back after a backoff, no attempt counted.
    Nack,
    /// Unroutable: an attempt, then back with backoff or dead.
    Returned(String),
    /// Refused for good (too large, ...): an attempt, as for a return.
    Rejected(String),
    /// Never confirmed: back at its due time, no attempt counted.
    Release,
}

/// RabbitMQ refuses a body over `max_message_size` with "message size N is
/// larger than configured max size M"; M, when the error says so.
pub(super) fn max_message_size(reason: &str) -> Option<usize> {
    let rest = reason.split("larger than configured max size ").nth(1)?;
    let digits: String = rest.chars().take_while(|c| c.is_ascii_digit()).collect();
    digits.parse().ok()
}

pub(super) fn precondition_failure(e: &lapin::Error) -> Option<String> {
    match e.kind() {
        lapin::ErrorKind::ProtocolError(amqp) => {
            let text = amqp.to_string();
            (text.contains("PRECONDITION_FAILED") || text.contains("precondition"))
                .then(|| format!("refused by the broker ({text})"))
        }
        _ => None,
    }
}

/// A channel closed because the exchange does not exist (404) or the user
/// may not publish to it (403): the topology, not the member, is at fault.
pub(super) fn topology_error(e: &lapin::Error) -> Option<String> {
    match e.kind() {
        lapin::ErrorKind::ProtocolError(amqp) => {
            let text = amqp.to_string();
            (text.contains("NOT_FOUND") || text.contains("ACCESS_REFUSED")).then_some(text)
        }
        _ => None,
    }
}
