//! Messages lapin cannot read, made readable enough to be refused.
//!
//! RabbitMQ passes a publisher's properties on as bytes, so a header key or
//! a short-string property (`content_type`, `message_id`, …) that is not
//! UTF-8, or a routing key that is not, reaches the intake's consumer as
//! published. lapin treats such a frame as a protocol error and closes the
//! whole connection; the message goes back to the queue, is delivered again
//! on the next connection, and the intake never gets past it.
//!
//! The intake's connection therefore reads the broker through a filter (a
//! loopback socket pair, as lapin takes no other stream): frames lapin can
//! parse pass unchanged; in a `basic.deliver` or content header it cannot,
//! every byte of a malformed UTF-8 sequence becomes `?`, and a header named
//! [`marker`] carries the reason. The consumer sees the marker and refuses
//! the delivery, so the broker dead-letters its own copy, byte for byte.

use std::collections::HashMap;
use std::io;
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::LazyLock;

use futures::io::{AsyncReadExt as _, AsyncWriteExt as _};
use lapin::protocol::basic::{gen_properties, parse_properties};
use lapin::tcp::AsyncTcpStream;
use lapin::types::{AMQPValue, FieldTable, LongString};
use lapin::BasicProperties;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

type Upstream = AsyncTcpStream<async_compat::Compat<TcpStream>>;

/// The header a rewritten delivery carries its reason in; random per
/// process, so no producer's header is taken for it.
static MARKER: LazyLock<String> =
    LazyLock::new(|| format!("x-delayd-unreadable-{:016x}", rand::random::<u64>()));

/// The marker header's name.
pub fn marker() -> &'static str {
    &MARKER
}

/// Why lapin could not read the message these properties came with, if
/// the filter rewrote it.
pub fn reason(props: &BasicProperties) -> Option<String> {
    match props.headers().as_ref()?.inner().get(marker())? {
        AMQPValue::LongString(s) => Some(String::from_utf8_lossy(s.as_bytes()).into_owned()),
        _ => None,
    }
}

/// A socket for lapin that reaches `upstream` through the filter; the
/// filter runs until either side closes.
pub async fn behind_filter(upstream: Upstream) -> io::Result<TcpStream> {
    let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).await?;
    let lapin_side = TcpStream::connect(listener.local_addr()?).await?;
    let ours: SocketAddr = lapin_side.local_addr()?;
    // Anyone on the host may connect to the listener: only our own socket
    // is served.
    let filter_side = loop {
        let (s, peer) = listener.accept().await?;
        if peer == ours {
            break s;
        }
    };
    drop(listener);
    let _ = lapin_side.set_nodelay(true);
    let _ = filter_side.set_nodelay(true);
    tokio::spawn(pump(filter_side, upstream));
    Ok(lapin_side)
}

async fn pump(lapin: TcpStream, upstream: Upstream) {
    let (mut from_lapin, mut to_lapin) = lapin.into_split();
    let (mut from_broker, mut to_broker) = upstream.split();
    let out = async {
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            let n = from_lapin.read(&mut buf).await?;
            if n == 0 {
                return io::Result::Ok(());
            }
            to_broker.write_all(&buf[..n]).await?;
            to_broker.flush().await?;
        }
    };
    let back = async {
        let mut frames = Frames::default();
        let mut buf = vec![0u8; 64 * 1024];
        let mut ready = Vec::new();
        loop {
            let n = from_broker.read(&mut buf).await?;
            if n == 0 {
                frames.finish(&mut ready);
                to_lapin.write_all(&ready).await?;
                return io::Result::Ok(());
            }
            frames.feed(&buf[..n], &mut ready);
            to_lapin.write_all(&ready).await?;
            ready.clear();
        }
    };
    // Either side ending ends both: dropping the halves closes the sockets.
    tokio::select! {
        _ = out => {}
        _ = back => {}
    }
}

/// The broker-to-client byte stream, cut into frames.
#[derive(Default)]
struct Frames {
    /// Bytes of an incomplete method or header frame.
    buf: Vec<u8>,
    /// Bytes still to pass of a body or heartbeat frame.
    pass: usize,
    /// Not AMQP frames (a protocol header refusing ours): passed as they are.
    raw: bool,
    /// Why a `basic.deliver` was rewritten, by channel, until its header.
    pending: HashMap<u16, Vec<String>>,
}

const FRAME_END: u8 = 0xCE;

impl Frames {
    /// Takes `input` from the broker and appends to `out` what lapin may read.
    fn feed(&mut self, input: &[u8], out: &mut Vec<u8>) {
        let mut buf = std::mem::take(&mut self.buf);
        buf.extend_from_slice(input);
        let mut at = 0;
        loop {
            let rest = &buf[at..];
            if self.raw {
                out.extend_from_slice(rest);
                at = buf.len();
                break;
            }
            if self.pass > 0 {
                let n = self.pass.min(rest.len());
                out.extend_from_slice(&rest[..n]);
                self.pass -= n;
                at += n;
                if self.pass > 0 {
                    break;
                }
                continue;
            }
            if rest.len() < 7 {
                break;
            }
            let kind = rest[0];
            let channel = u16::from_be_bytes([rest[1], rest[2]]);
            let size = u32::from_be_bytes([rest[3], rest[4], rest[5], rest[6]]) as usize;
            match kind {
                1 | 2 => {
                    let Some(frame) = rest.get(..size + 8) else {
                        break;
                    };
                    match self.check(kind, channel, &frame[7..7 + size]) {
                        Some(payload) => {
                            out.push(kind);
                            out.extend_from_slice(&channel.to_be_bytes());
                            out.extend_from_slice(&(payload.len() as u32).to_be_bytes());
                            out.extend_from_slice(&payload);
                            out.push(FRAME_END);
                        }
                        None => out.extend_from_slice(frame),
                    }
                    at += size + 8;
                }
                3 | 8 => self.pass = size + 8,
                _ => self.raw = true,
            }
        }
        buf.drain(..at);
        self.buf = buf;
    }

    /// The connection ended: whatever is left goes to lapin as it is.
    fn finish(&mut self, out: &mut Vec<u8>) {
        out.append(&mut self.buf);
    }

    /// The payload to send instead of this one, if lapin cannot parse it.
    fn check(&mut self, kind: u8, channel: u16, payload: &[u8]) -> Option<Vec<u8>> {
        if kind == 1 {
            return self.check_deliver(channel, payload);
        }
        let pending = self.pending.remove(&channel);
        let props = payload.get(12..)?;
        // lapin wants the properties to fill the frame exactly.
        let whole =
            |r: &Result<(&[u8], BasicProperties), _>| matches!(r, Ok((rest, _)) if rest.is_empty());
        if pending.is_none() && whole(&parse_properties(props)) {
            return None;
        }
        let mut reasons = pending.unwrap_or_default();
        let mut fixed = props.to_vec();
        fix_properties(&mut fixed, &mut reasons);
        let parsed = match parse_properties(fixed.as_slice()) {
            Ok((rest, p)) => {
                if !rest.is_empty() {
                    reasons.push("its properties are followed by stray bytes".into());
                }
                p
            }
            Err(_) => {
                reasons.push("its properties are not valid AMQP".into());
                BasicProperties::default()
            }
        };
        let reason = reasons.join("; ");
        let mut out = payload[..12].to_vec();
        let mut headers = parsed.headers().clone().unwrap_or_default();
        headers.insert(marker().into(), LongString::from(reason.as_str()).into());
        let encoded = encode(&parsed.clone().with_headers(headers), &mut out);
        // Never larger than what came, nor than the smallest frame AMQP
        // allows: lapin refuses a frame over the negotiated maximum.
        if !encoded || out.len() > payload.len().max(4000) {
            out.truncate(12);
            let mut only = FieldTable::default();
            let short: String = reason.chars().take(1000).collect();
            only.insert(marker().into(), LongString::from(short).into());
            encode(&BasicProperties::default().with_headers(only), &mut out);
        }
        Some(out)
    }

    /// A `basic.deliver` whose routing key (or exchange) is not UTF-8:
    /// fixed in place, and its reason kept for the header that follows.
    fn check_deliver(&mut self, channel: u16, payload: &[u8]) -> Option<Vec<u8>> {
        if payload.get(..4)? != [0, 60, 0, 60] {
            return None;
        }
        let mut fixed = payload.to_vec();
        let mut reasons = Vec::new();
        let at = fix_short(&mut fixed, 4, || "consumer_tag".into(), &mut reasons)?;
        // Then the delivery tag and the redelivered flag.
        let at = fix_short(&mut fixed, at + 9, || "exchange".into(), &mut reasons)?;
        fix_short(&mut fixed, at, || "routing_key".into(), &mut reasons)?;
        if reasons.is_empty() {
            return None;
        }
        self.pending.insert(channel, reasons);
        Some(fixed)
    }
}

fn encode(props: &BasicProperties, out: &mut Vec<u8>) -> bool {
    match gen_properties(props)(std::mem::take(out).into()) {
        Ok(w) => {
            *out = w.write;
            true
        }
        Err(_) => false,
    }
}

/// Replaces each byte of a malformed UTF-8 sequence in `b` with `?`; true
/// if there was one.
fn fix_utf8(b: &mut [u8]) -> bool {
    let mut at = 0;
    let mut fixed = false;
    while let Err(e) = std::str::from_utf8(&b[at..]) {
        let start = at + e.valid_up_to();
        let len = e.error_len().unwrap_or(b.len() - start);
        b[start..start + len].fill(b'?');
        at = start + len;
        fixed = true;
    }
    fixed
}

/// Fixes the short string at `at`; the offset after it, `None` if the
/// bytes end first.
fn fix_short(
    b: &mut [u8],
    at: usize,
    what: impl FnOnce() -> String,
    reasons: &mut Vec<String>,
) -> Option<usize> {
    let len = *b.get(at)? as usize;
    let s = b.get_mut(at + 1..at + 1 + len)?;
    let shown = s.escape_ascii().to_string();
    if fix_utf8(s) {
        reasons.push(format!("{} \"{shown}\" is not UTF-8", what()));
    }
    Some(at + 1 + len)
}

/// The names of the short-string properties by flag bit; headers (13),
/// delivery_mode (12), priority (11) and timestamp (6) are not strings.
const SHORT_PROPERTIES: [(u16, &str); 10] = [
    (15, "content_type"),
    (14, "content_encoding"),
    (10, "correlation_id"),
    (9, "reply_to"),
    (8, "expiration"),
    (7, "message_id"),
    (5, "type"),
    (4, "user_id"),
    (3, "app_id"),
    (2, "cluster_id"),
];

/// Fixes every short string of encoded basic properties in place, as far
/// as they can be walked.
fn fix_properties(b: &mut [u8], reasons: &mut Vec<String>) {
    let _ = (|| -> Option<()> {
        let flags = u16::from_be_bytes([*b.first()?, *b.get(1)?]);
        let mut at = 2;
        for bit in (2..16).rev() {
            if flags & (1 << bit) == 0 {
                continue;
            }
            if let Some((_, name)) = SHORT_PROPERTIES.iter().find(|(n, _)| *n == bit) {
                at = fix_short(b, at, || name.to_string(), reasons)?;
                continue;
            }
            at += match bit {
                13 => {
                    let len = long_len(b, at)?;
                    fix_table(b.get_mut(at + 4..at + 4 + len)?, reasons)?;
                    4 + len
                }
                12 | 11 => 1,
                _ => 8, // timestamp
            };
        }
        Some(())
    })();
}

fn long_len(b: &[u8], at: usize) -> Option<usize> {
    Some(u32::from_be_bytes(b.get(at..at + 4)?.try_into().ok()?) as usize)
}

/// Fixes a table's keys (and those of tables inside it).
fn fix_table(b: &mut [u8], reasons: &mut Vec<String>) -> Option<()> {
    let mut at = 0;
    while at < b.len() {
        at = fix_short(b, at, || "header key".into(), reasons)?;
        at = fix_value(b, at, reasons)?;
    }
    Some(())
}

/// Walks the value at `at` (type code, then data); the offset after it.
fn fix_value(b: &mut [u8], at: usize, reasons: &mut Vec<String>) -> Option<usize> {
    let kind = *b.get(at)?;
    let at = at + 1;
    let fixed = match kind {
        b't' | b'b' | b'B' => 1,
        b's' | b'u' | b'U' => 2,
        b'I' | b'i' | b'f' => 4,
        b'l' | b'L' | b'd' | b'T' => 8,
        b'D' => 5,
        b'V' => 0,
        b'S' | b'x' => 4 + long_len(b, at)?,
        b'F' => {
            let len = long_len(b, at)?;
            fix_table(b.get_mut(at + 4..at + 4 + len)?, reasons)?;
            4 + len
        }
        b'A' => {
            let len = long_len(b, at)?;
            let end = at + 4 + len;
            let mut i = at + 4;
            while i < end {
                i = fix_value(b, i, reasons)?;
            }
            4 + len
        }
        other => {
            reasons.push(format!(
                "a header value has the type code {:?}, which lapin does not read",
                other as char
            ));
            return None;
        }
    };
    Some(at + fixed)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn header_frame(props: &[u8]) -> Vec<u8> {
        let mut p = vec![0, 60, 0, 0];
        p.extend_from_slice(&5u64.to_be_bytes());
        p.extend_from_slice(props);
        let mut f = vec![2, 0, 1];
        f.extend_from_slice(&(p.len() as u32).to_be_bytes());
        f.extend_from_slice(&p);
        f.push(FRAME_END);
        f
    }

    /// Headers (flag 13) holding one entry `key` = long string "v".
    fn with_key(key: &[u8]) -> Vec<u8> {
        let mut t = vec![key.len() as u8];
        t.extend_from_slice(key);
        t.extend_from_slice(b"S\0\0\0\x01v");
        headers(&t)
    }

    /// Properties of only headers (flag 13), whose field table is `table`.
    fn headers(table: &[u8]) -> Vec<u8> {
        let mut p = vec![0x20, 0];
        p.extend_from_slice(&(table.len() as u32).to_be_bytes());
        p.extend_from_slice(table);
        p
    }

    fn props_of(frame: &[u8]) -> BasicProperties {
        parse_properties(&frame[7 + 12..frame.len() - 1]).unwrap().1
    }

    /// What a fresh connection's frames become, fed `stream` in one piece.
    fn fed(stream: &[u8]) -> Vec<u8> {
        let (mut f, mut out) = (Frames::default(), Vec::new());
        f.feed(stream, &mut out);
        out
    }

    /// The properties a header frame carrying `props` leaves with.
    fn rewritten(props: &[u8]) -> BasicProperties {
        props_of(&fed(&header_frame(props)))
    }

    #[test]
    fn readable_frames_pass_unchanged_in_any_cut() {
        let mut stream = header_frame(&with_key(b"tenant"));
        stream.extend_from_slice(&[3, 0, 1, 0, 0, 0, 5, b'h', b'e', b'l', b'l', b'o', FRAME_END]);
        stream.extend_from_slice(&[8, 0, 0, 0, 0, 0, 0, FRAME_END]);
        for cut in 0..stream.len() {
            let (mut f, mut out) = (Frames::default(), Vec::new());
            f.feed(&stream[..cut], &mut out);
            f.feed(&stream[cut..], &mut out);
            assert_eq!(out, stream, "cut at {cut}");
        }
    }

    #[test]
    fn a_key_that_is_not_utf8_is_replaced_and_marked() {
        let p = rewritten(&with_key(b"ten\xffant"));
        let h = p.headers().as_ref().unwrap().inner();
        assert!(h.contains_key("ten?ant"));
        assert_eq!(
            reason(&p).unwrap(),
            "header key \"ten\\xffant\" is not UTF-8"
        );
    }

    /// Properties of only a `content_type` (flag 15) the filter must mend.
    #[test]
    fn a_content_type_is_kept_readable_and_the_reason_names_what_was_wrong() {
        for (props, content_type, why) in [
            // A short string that is not UTF-8 is named.
            (
                &b"\x80\0\x04a\xc3(b"[..],
                "a?(b",
                "content_type \"a\\xc3(b\" is not UTF-8",
            ),
            // Stray bytes after the properties are a reason too.
            (
                b"\x80\0\x01a!",
                "a",
                "its properties are followed by stray bytes",
            ),
        ] {
            let p = rewritten(props);
            assert_eq!(p.content_type().as_ref().unwrap().as_str(), content_type);
            assert_eq!(reason(&p).unwrap(), why);
        }
    }

    #[test]
    fn an_unknown_type_code_leaves_only_the_marker() {
        let p = rewritten(b"\x20\0\0\0\0\x03\x01kZ");
        assert_eq!(p.headers().as_ref().unwrap().inner().len(), 1);
        assert!(reason(&p).unwrap().contains("type code 'Z'"));
    }

    #[test]
    fn a_routing_key_that_is_not_utf8_marks_the_header_that_follows() {
        let mut m = vec![0, 60, 0, 60, 1, b'c'];
        m.extend_from_slice(&7u64.to_be_bytes());
        m.extend_from_slice(&[0, 1, b'x', 2, b'r', 0xff]);
        let mut stream = vec![1, 0, 1];
        stream.extend_from_slice(&(m.len() as u32).to_be_bytes());
        stream.extend_from_slice(&m);
        stream.push(FRAME_END);
        let header = header_frame(b"\0\0");
        stream.extend_from_slice(&header);
        let out = fed(&stream);
        let (deliver, rest) = out.split_at(stream.len() - header.len());
        assert!(deliver.ends_with(&[b'r', b'?', FRAME_END]));
        assert_eq!(
            reason(&props_of(rest)).unwrap(),
            "routing_key \"r\\xff\" is not UTF-8"
        );
    }

    #[test]
    fn a_rewritten_header_is_never_larger_than_the_frames_allowed() {
        let big_key = [0xffu8; 255];
        let mut t = Vec::new();
        for _ in 0..30 {
            t.push(255);
            t.extend_from_slice(&big_key);
            t.push(b'V');
        }
        let frame = header_frame(&headers(&t));
        let out = fed(&frame);
        assert!(out.len() <= frame.len(), "{} > {}", out.len(), frame.len());
        assert!(reason(&props_of(&out)).is_some());
    }
}
