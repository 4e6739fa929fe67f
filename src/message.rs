//! The message delayd publishes for a claimed member: its body, routing key,
//! properties and headers, by the business's settings or, for an intake
//! message, as the producer published it ([`envelope`]). The scanner and
//! the publisher read it; the intake writes envelopes.

pub mod envelope;

pub use envelope::Envelope;
