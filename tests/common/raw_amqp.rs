//! A minimal AMQP 0-9-1 client over plain TCP, for what lapin cannot do:
//! publish properties with bytes the test chooses (a header key that is not
//! UTF-8, a duplicate key, the type codes `U` and `L`), and read back the
//! content header exactly as the broker sent it.

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use super::*;

const FRAME_END: u8 = 0xCE;

/// One connection with one channel (1) in confirm mode.
pub struct RawAmqp {
    sock: TcpStream,
    /// Publishes confirmed so far; the broker numbers them from 1.
    published: u64,
    /// The `version` the broker announced in `connection.start`.
    version: String,
}

/// A message as a 0-9-1 consumer receives it, bytes unparsed.
#[derive(Debug, Clone)]
pub struct RawMessage {
    pub routing_key: Vec<u8>,
    /// The property flags and list, as in the content header frame.
    pub properties: Vec<u8>,
    pub body: Vec<u8>,
}

/// A field table entry: key, type code, and the value's bytes as encoded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Field {
    pub key: Vec<u8>,
    pub kind: u8,
    pub value: Vec<u8>,
}

/// Builds a field table's content (without its length).
#[derive(Default, Clone)]
pub struct Table(pub Vec<u8>);

impl Table {
    pub fn field(mut self, key: &[u8], kind: u8, value: &[u8]) -> Self {
        self.0.push(key.len() as u8);
        self.0.extend_from_slice(key);
        self.0.push(kind);
        self.0.extend_from_slice(value);
        self
    }

    /// The table as a field value (type `F`): length, then content.
    pub fn as_value(&self) -> Vec<u8> {
        long_bytes(&self.0)
    }
}

/// A byte string with its 32-bit length in front (`S`, `x`, `A`, `F`).
pub fn long_bytes(b: &[u8]) -> Vec<u8> {
    let mut v = (b.len() as u32).to_be_bytes().to_vec();
    v.extend_from_slice(b);
    v
}

/// Basic properties in wire order; short strings are raw bytes.
#[derive(Default, Clone)]
pub struct RawProps {
    pub content_type: Option<Vec<u8>>,
    pub content_encoding: Option<Vec<u8>>,
    pub headers: Option<Table>,
    pub delivery_mode: Option<u8>,
    pub priority: Option<u8>,
    pub correlation_id: Option<Vec<u8>>,
    pub reply_to: Option<Vec<u8>>,
    pub expiration: Option<Vec<u8>>,
    pub message_id: Option<Vec<u8>>,
    pub timestamp: Option<u64>,
    pub kind: Option<Vec<u8>>,
    pub user_id: Option<Vec<u8>>,
    pub app_id: Option<Vec<u8>>,
}

impl RawProps {
    /// The property flags and list.
    pub fn encode(&self) -> Vec<u8> {
        let mut flags = 0u16;
        let mut list = Vec::new();
        let short = |bit: u16, v: &Option<Vec<u8>>, flags: &mut u16, list: &mut Vec<u8>| {
            if let Some(v) = v {
                *flags |= 1 << bit;
                list.push(v.len() as u8);
                list.extend_from_slice(v);
            }
        };
        short(15, &self.content_type, &mut flags, &mut list);
        short(14, &self.content_encoding, &mut flags, &mut list);
        if let Some(h) = &self.headers {
            flags |= 1 << 13;
            list.extend_from_slice(&h.as_value());
        }
        if let Some(v) = self.delivery_mode {
            flags |= 1 << 12;
            list.push(v);
        }
        if let Some(v) = self.priority {
            flags |= 1 << 11;
            list.push(v);
        }
        short(10, &self.correlation_id, &mut flags, &mut list);
        short(9, &self.reply_to, &mut flags, &mut list);
        short(8, &self.expiration, &mut flags, &mut list);
        short(7, &self.message_id, &mut flags, &mut list);
        if let Some(v) = self.timestamp {
            flags |= 1 << 6;
            list.extend_from_slice(&v.to_be_bytes());
        }
        short(5, &self.kind, &mut flags, &mut list);
        short(4, &self.user_id, &mut flags, &mut list);
        short(3, &self.app_id, &mut flags, &mut list);
        let mut out = flags.to_be_bytes().to_vec();
        out.extend_from_slice(&list);
        out
    }
}

/// The headers table of encoded properties, as its raw entries; `None`
/// without headers.
pub fn headers_of(props: &[u8]) -> Option<Vec<Field>> {
    let flags = u16::from_be_bytes([props[0], props[1]]);
    assert_eq!(flags & 1, 0, "no continuation flags expected");
    let mut at = 2;
    for bit in [15u16, 14] {
        if flags & (1 << bit) != 0 {
            at += 1 + props[at] as usize;
        }
    }
    if flags & (1 << 13) == 0 {
        return None;
    }
    let len = u32::from_be_bytes(props[at..at + 4].try_into().unwrap()) as usize;
    Some(parse_table(&props[at + 4..at + 4 + len]))
}

/// The entries of a table's content, in wire order.
pub fn parse_table(mut b: &[u8]) -> Vec<Field> {
    let mut out = Vec::new();
    while !b.is_empty() {
        let klen = b[0] as usize;
        let key = b[1..1 + klen].to_vec();
        let kind = b[1 + klen];
        let rest = &b[2 + klen..];
        let n = value_len(kind, rest);
        out.push(Field {
            key,
            kind,
            value: rest[..n].to_vec(),
        });
        b = &rest[n..];
    }
    out
}

/// The values of an array's content (type `A`), as (type code, bytes).
pub fn parse_array(mut b: &[u8]) -> Vec<(u8, Vec<u8>)> {
    let mut out = Vec::new();
    while !b.is_empty() {
        let kind = b[0];
        let n = value_len(kind, &b[1..]);
        out.push((kind, b[1..1 + n].to_vec()));
        b = &b[1 + n..];
    }
    out
}

/// How many bytes a value of type `kind` takes at the start of `b`.
fn value_len(kind: u8, b: &[u8]) -> usize {
    match kind {
        b'V' => 0,
        b't' | b'b' | b'B' => 1,
        b's' | b'u' | b'U' => 2,
        b'I' | b'i' | b'f' => 4,
        b'D' => 5,
        b'l' | b'L' | b'd' | b'T' => 8,
        b'S' | b'x' | b'A' | b'F' => 4 + u32::from_be_bytes(b[..4].try_into().unwrap()) as usize,
        other => panic!("unknown field type {:?}", other as char),
    }
}

fn short_str(out: &mut Vec<u8>, s: &[u8]) {
    out.push(s.len() as u8);
    out.extend_from_slice(s);
}

fn method(class: u16, id: u16, args: &[u8]) -> Vec<u8> {
    let mut p = class.to_be_bytes().to_vec();
    p.extend_from_slice(&id.to_be_bytes());
    p.extend_from_slice(args);
    p
}

/// The `version` server property of a `connection.start`'s arguments
/// (major and minor protocol version, then the server-properties table).
fn announced_version(start: &[u8]) -> String {
    let len = u32::from_be_bytes(start[2..6].try_into().unwrap()) as usize;
    parse_table(&start[6..6 + len])
        .into_iter()
        .find(|f| f.key == b"version")
        .map(|f| String::from_utf8_lossy(&f.value[4..]).into_owned())
        .unwrap_or_default()
}

impl RawAmqp {
    /// Connects to `url` (`amqp://user:pass@host:port/vhost`), opens
    /// channel 1 and puts it in confirm mode.
    pub async fn connect(url: &str) -> Self {
        let rest = url.strip_prefix("amqp://").expect("an amqp:// URL");
        let (auth, rest) = rest.split_once('@').expect("user and password in the URL");
        let (user, pass) = auth.split_once(':').unwrap();
        let (hostport, vhost) = rest.split_once('/').unwrap_or((rest, "%2f"));
        let vhost = vhost.replace("%2f", "/").replace("%2F", "/");
        let vhost = if vhost.is_empty() { "/".into() } else { vhost };
        let sock = TcpStream::connect(hostport).await.unwrap();
        let mut c = Self {
            sock,
            published: 0,
            version: String::new(),
        };
        c.sock.write_all(b"AMQP\x00\x00\x09\x01").await.unwrap();
        let start = c.expect_method(0, 10, 10).await;
        c.version = announced_version(&start);
        let mut args = long_bytes(&[]);
        short_str(&mut args, b"PLAIN");
        args.extend_from_slice(&long_bytes(format!("\0{user}\0{pass}").as_bytes()));
        short_str(&mut args, b"en_US");
        c.send(1, 0, &method(10, 11, &args)).await;
        let tune = c.expect_method(0, 10, 30).await;
        let mut args = tune[..6].to_vec();
        args.extend_from_slice(&0u16.to_be_bytes());
        c.send(1, 0, &method(10, 31, &args)).await;
        let mut args = Vec::new();
        short_str(&mut args, vhost.as_bytes());
        args.extend_from_slice(&[0, 0]);
        c.send(1, 0, &method(10, 40, &args)).await;
        c.expect_method(0, 10, 41).await;
        c.send(1, 1, &method(20, 10, &[0])).await;
        c.expect_method(1, 20, 11).await;
        c.send(1, 1, &method(85, 10, &[0])).await;
        c.expect_method(1, 85, 11).await;
        c
    }

    /// The broker's major version (3 or 4): RabbitMQ 4 re-encodes a header
    /// table it routes, where RabbitMQ 3 passes it through as published.
    pub fn rabbitmq_major(&self) -> u32 {
        let major = self.version.split('.').next().unwrap_or_default();
        major
            .parse()
            .unwrap_or_else(|_| panic!("broker version {:?}", self.version))
    }

    async fn send(&mut self, kind: u8, channel: u16, payload: &[u8]) {
        let mut f = vec![kind];
        f.extend_from_slice(&channel.to_be_bytes());
        f.extend_from_slice(&(payload.len() as u32).to_be_bytes());
        f.extend_from_slice(payload);
        f.push(FRAME_END);
        self.sock.write_all(&f).await.unwrap();
    }

    /// The next frame other than a heartbeat: (type, channel, payload).
    async fn frame(&mut self) -> (u8, u16, Vec<u8>) {
        loop {
            let mut head = [0u8; 7];
            tokio::time::timeout(Duration::from_secs(10), self.sock.read_exact(&mut head))
                .await
                .expect("no frame from the broker within 10s")
                .unwrap();
            let size = u32::from_be_bytes(head[3..7].try_into().unwrap()) as usize;
            let mut payload = vec![0u8; size + 1];
            self.sock.read_exact(&mut payload).await.unwrap();
            assert_eq!(payload.pop(), Some(FRAME_END));
            if head[0] != 8 {
                return (head[0], u16::from_be_bytes([head[1], head[2]]), payload);
            }
        }
    }

    /// The next method frame, which must be `class.id` on `channel`: its
    /// arguments. A close from the broker fails the test with its text.
    async fn expect_method(&mut self, channel: u16, class: u16, id: u16) -> Vec<u8> {
        let (kind, ch, p) = self.frame().await;
        assert_eq!(kind, 1, "expected a method frame");
        let got = (
            u16::from_be_bytes([p[0], p[1]]),
            u16::from_be_bytes([p[2], p[3]]),
        );
        if got != (class, id) && matches!(got, (10, 50) | (20, 40)) {
            let code = u16::from_be_bytes([p[4], p[5]]);
            let text = String::from_utf8_lossy(&p[7..7 + p[6] as usize]).to_string();
            panic!(
                "the broker closed the {}: {code} {text}",
                if got.0 == 10 { "connection" } else { "channel" }
            );
        }
        assert_eq!((ch, got), (channel, (class, id)), "unexpected method");
        p[4..].to_vec()
    }

    /// Publishes `body` with `props` and waits for the broker's ack.
    pub async fn publish(&mut self, exchange: &str, routing_key: &[u8], props: &[u8], body: &[u8]) {
        let mut args = 0u16.to_be_bytes().to_vec();
        short_str(&mut args, exchange.as_bytes());
        short_str(&mut args, routing_key);
        args.push(0);
        self.send(1, 1, &method(60, 40, &args)).await;
        let mut header = 60u16.to_be_bytes().to_vec();
        header.extend_from_slice(&0u16.to_be_bytes());
        header.extend_from_slice(&(body.len() as u64).to_be_bytes());
        header.extend_from_slice(props);
        self.send(2, 1, &header).await;
        for chunk in body.chunks(4096) {
            self.send(3, 1, chunk).await;
        }
        self.published += 1;
        let ack = self.expect_method(1, 60, 80).await;
        let tag = u64::from_be_bytes(ack[..8].try_into().unwrap());
        assert!(
            tag >= self.published,
            "ack of {tag}, {} published",
            self.published
        );
    }

    /// Takes one message from `queue` and acknowledges it; `None` if empty.
    pub async fn get(&mut self, queue: &str) -> Option<RawMessage> {
        let mut args = 0u16.to_be_bytes().to_vec();
        short_str(&mut args, queue.as_bytes());
        args.push(0);
        self.send(1, 1, &method(60, 70, &args)).await;
        let (kind, _, p) = self.frame().await;
        assert_eq!(kind, 1);
        match (
            u16::from_be_bytes([p[0], p[1]]),
            u16::from_be_bytes([p[2], p[3]]),
        ) {
            (60, 72) => return None,
            (60, 71) => {}
            other => panic!("unexpected answer to basic.get: {other:?} {p:?}"),
        }
        let a = &p[4..];
        let tag = a[..8].to_vec();
        let ex_len = a[9] as usize;
        let rk_at = 10 + ex_len;
        let routing_key = a[rk_at + 1..rk_at + 1 + a[rk_at] as usize].to_vec();
        let (kind, _, h) = self.frame().await;
        assert_eq!(kind, 2, "expected a content header");
        let size = u64::from_be_bytes(h[4..12].try_into().unwrap()) as usize;
        let properties = h[12..].to_vec();
        let mut body = Vec::with_capacity(size);
        while body.len() < size {
            let (kind, _, b) = self.frame().await;
            assert_eq!(kind, 3, "expected a body frame");
            body.extend_from_slice(&b);
        }
        let mut ack = tag;
        ack.push(0);
        self.send(1, 1, &method(60, 80, &ack)).await;
        Some(RawMessage {
            routing_key,
            properties,
            body,
        })
    }

    /// Polls `queue` until a message arrives; panics after `limit`.
    pub async fn get_within(&mut self, queue: &str, limit: Duration) -> RawMessage {
        let start = Instant::now();
        loop {
            if let Some(m) = self.get(queue).await {
                return m;
            }
            assert!(
                start.elapsed() < limit,
                "nothing in {queue} within {limit:?}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

/// The headers as the intake delivers them, per the migration guide: keys
/// sorted (bytewise), the last of duplicate keys kept, `L` sent as `l`, a
/// boolean as 0 or 1; nested tables alike, arrays in order.
pub fn as_the_intake_delivers(fields: &[Field]) -> Vec<Field> {
    let mut sorted = std::collections::BTreeMap::new();
    for f in fields {
        let (kind, value) = normalized(f.kind, &f.value);
        sorted.insert(f.key.clone(), (kind, value));
    }
    sorted
        .into_iter()
        .map(|(key, (kind, value))| Field { key, kind, value })
        .collect()
}

pub fn normalized(kind: u8, value: &[u8]) -> (u8, Vec<u8>) {
    match kind {
        b'L' => (b'l', value.to_vec()),
        b't' => (b't', vec![(value[0] != 0) as u8]),
        b'F' => {
            let mut t = Table::default();
            for f in as_the_intake_delivers(&parse_table(&value[4..])) {
                t = t.field(&f.key, f.kind, &f.value);
            }
            (b'F', t.as_value())
        }
        b'A' => {
            let mut a = Vec::new();
            for (k, v) in parse_array(&value[4..]) {
                let (k, v) = normalized(k, &v);
                a.push(k);
                a.extend_from_slice(&v);
            }
            (b'A', long_bytes(&a))
        }
        _ => (kind, value.to_vec()),
    }
}
