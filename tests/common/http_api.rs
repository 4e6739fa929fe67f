//! The console's HTTP side under test: a daemon with its listener on a free
//! port, and a small HTTP/1.0 client for the JSON API.

use super::*;

/// An answer: status, and the body as JSON (`Null` when it is not JSON).
#[derive(Debug, Clone)]
pub struct Answer {
    pub status: u16,
    pub json: serde_json::Value,
    pub text: String,
    /// The header lines, as sent.
    pub head: String,
}

impl Answer {
    /// The `error` line of a 4xx, asserting it is one line of JSON.
    pub fn error_line(&self) -> String {
        let e = self.json["error"]
            .as_str()
            .unwrap_or_else(|| panic!("no \"error\" in {} {}", self.status, self.text))
            .to_string();
        assert!(!e.contains('\n') && !e.is_empty(), "error {e:?}");
        e
    }

    /// Asserts a 200 whose `field` is `n`.
    #[track_caller]
    pub fn assert_ok_with(&self, field: &str, n: u64) {
        let got = (self.status, self.json[field].as_u64());
        assert_eq!(got, (200, Some(n)), "{}", self.text);
    }

    /// Asserts a refusal: this status, and an `error` line that says `says`.
    #[track_caller]
    pub fn assert_error(&self, status: u16, says: &str) {
        assert_eq!(self.status, status, "{}", self.text);
        assert!(self.error_line().contains(says), "{}", self.text);
    }
}

/// `method path` with an optional bearer token and JSON body; panics if
/// nothing answers within 10 s.
pub async fn call(
    port: u16,
    method: &str,
    path: &str,
    token: Option<&str>,
    body: Option<&str>,
) -> Answer {
    let auth = token.map(|t| format!("Bearer {t}"));
    let headers: Vec<(&str, &str)> = auth
        .as_deref()
        .map(|a| vec![("Authorization", a)])
        .unwrap_or_default();
    call_with(port, method, path, &headers, body).await
}

/// `method path` with these header lines (`Host: 127.0.0.1` unless one is
/// given) and an optional JSON body.
pub async fn call_with(
    port: u16,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: Option<&str>,
) -> Answer {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let go = async {
        let mut s = tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .expect("connect to the HTTP listener");
        let mut req = format!("{method} {path} HTTP/1.0\r\n");
        if !headers.iter().any(|(k, _)| k.eq_ignore_ascii_case("host")) {
            req.push_str("Host: 127.0.0.1\r\n");
        }
        for (k, v) in headers {
            req.push_str(&format!("{k}: {v}\r\n"));
        }
        let body = body.unwrap_or("");
        if !body.is_empty() || method == "POST" {
            req.push_str(&format!(
                "Content-Type: application/json\r\nContent-Length: {}\r\n",
                body.len()
            ));
        }
        req.push_str("\r\n");
        s.write_all(req.as_bytes()).await.unwrap();
        // A server may answer (413) before reading the whole body.
        let _ = s.write_all(body.as_bytes()).await;
        let mut raw = Vec::new();
        s.read_to_end(&mut raw).await.unwrap();
        raw
    };
    let raw = tokio::time::timeout(Duration::from_secs(10), go)
        .await
        .unwrap_or_else(|_| panic!("{method} {path}: no answer within 10 s"));
    let text = String::from_utf8_lossy(&raw).into_owned();
    let status = text
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or_else(|| panic!("{method} {path}: not HTTP: {text}"));
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    Answer {
        status,
        json: serde_json::from_str(body).unwrap_or(serde_json::Value::Null),
        text: body.to_string(),
        head: head.to_string(),
    }
}

/// `GET path`.
pub async fn api_get(port: u16, path: &str) -> Answer {
    call(port, "GET", path, None, None).await
}

/// `POST path` with a JSON body and a token.
pub async fn api_post(
    port: u16,
    path: &str,
    token: Option<&str>,
    body: &serde_json::Value,
) -> Answer {
    call(port, "POST", path, token, Some(&body.to_string())).await
}

/// One audit entry as (by, action, what, count).
pub type AuditEntry = (String, String, String, u64);

/// The entries of an audit page for `business` at or after `since_ms`,
/// newest first. The log is shared by every test on the server.
pub fn audit_entries(log: &Answer, business: &str, since_ms: i64) -> Vec<AuditEntry> {
    log.json["entries"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["business"] == business && e["at_ms"].as_i64().unwrap() >= since_ms)
        .map(|e| {
            let s = |k: &str| e[k].as_str().unwrap().to_string();
            (
                s("by"),
                s("action"),
                s("what"),
                e["count"].as_u64().unwrap(),
            )
        })
        .collect()
}

/// The newest 1,000 audit entries of `business` at or after `since_ms`,
/// newest first, read with `token`.
pub async fn audit_of(
    port: u16,
    token: Option<&str>,
    business: &str,
    since_ms: i64,
) -> Vec<AuditEntry> {
    let log = call(port, "GET", "/api/v1/audit?limit=1000", token, None).await;
    assert_eq!(log.status, 200, "{}", log.text);
    audit_entries(&log, business, since_ms)
}

/// A daemon serving the console and API on a free port, its businesses'
/// queues consumed. Keep it alive for the test.
pub struct ConsoleDaemon {
    pub setup: Setup,
    pub daemon: Daemon,
    pub port: u16,
    pub token: Option<String>,
}

impl ConsoleDaemon {
    /// Starts delayd for `businesses`, with `DELAYD_HTTP__ADMIN_TOKEN` set
    /// to `token` when given, and waits until the API sees Redis.
    pub async fn start(businesses: &[&BusinessSpec], token: Option<&str>) -> Self {
        let env: Vec<(&str, &str)> = token
            .map(|t| vec![("DELAYD_HTTP__ADMIN_TOKEN", t)])
            .unwrap_or_default();
        let mut c = Self::start_with_env(businesses, &env).await;
        c.token = token.map(str::to_string);
        c
    }

    /// Starts delayd for `businesses` with a read token and an admin token.
    pub async fn start_with_tokens(businesses: &[&BusinessSpec], read: &str, admin: &str) -> Self {
        let env = [
            ("DELAYD_HTTP__READ_TOKEN", read),
            ("DELAYD_HTTP__ADMIN_TOKEN", admin),
        ];
        Self::start_with_env(businesses, &env).await
    }

    /// Starts delayd for `businesses` with these `DELAYD_*` variables; waits
    /// with the read token (`DELAYD_HTTP__READ_TOKEN`) when one is set.
    pub async fn start_with_env(businesses: &[&BusinessSpec], env: &[(&str, &str)]) -> Self {
        Self::start_on(&redis_url(), businesses, env).await
    }

    /// [`ConsoleDaemon::start_with_env`] against the Redis at `redis`.
    pub async fn start_on(redis: &str, businesses: &[&BusinessSpec], env: &[(&str, &str)]) -> Self {
        let c = Consumers::on(&amqp_url(), businesses).await;
        let port = free_port(16000..20000, &[]);
        let config = write_config_with(
            c.dir.path(),
            redis,
            &format!("url = \"{}\"", amqp_url()),
            &format!("127.0.0.1:{port}"),
            businesses,
        );
        let setup = Setup {
            dir: c.dir,
            config: config.clone(),
            redis: redis_at(redis).await,
            amqp: c.amqp,
            ch: c.ch,
            queues: c.queues,
            inboxes: c.inboxes,
        };
        let read = env
            .iter()
            .find(|(k, _)| *k == "DELAYD_HTTP__READ_TOKEN")
            .map(|(_, v)| *v);
        let daemon = Daemon::start_with_env(&config, env);
        let ok = eventually(Duration::from_secs(20), || async {
            tokio::net::TcpStream::connect(("127.0.0.1", port))
                .await
                .is_ok()
                && call(port, "GET", "/api/v1/businesses", read, None)
                    .await
                    .json["businesses"]
                    .as_array()
                    .is_some_and(|a| a.iter().all(|b| b.get("pending").is_some()))
        })
        .await;
        assert!(ok, "the API did not come up; log:\n{}", daemon.tail());
        Self {
            setup,
            daemon,
            port,
            token: None,
        }
    }

    /// The token, as a header value would carry it.
    pub fn token(&self) -> Option<&str> {
        self.token.as_deref()
    }

    /// `POST path` with `body`, with the admin token when it has one.
    pub async fn post(&self, path: &str, body: serde_json::Value) -> Answer {
        api_post(self.port, path, self.token(), &body).await
    }

    /// `POST path` with `body` and no token (a read, or a refusal).
    pub async fn post_untokened(&self, path: &str, body: serde_json::Value) -> Answer {
        api_post(self.port, path, None, &body).await
    }

    /// The overview row of `business`.
    pub async fn overview_of(&self, business: &str) -> serde_json::Value {
        let a = api_get(self.port, "/api/v1/businesses").await;
        assert_eq!(a.status, 200, "{}", a.text);
        find_row(&a.json["businesses"], "name", business)
            .unwrap_or_else(|| panic!("no {business} in {}", a.text))
    }
}

/// The row of the JSON array `rows` whose `field` is `value`.
pub fn find_row(rows: &serde_json::Value, field: &str, value: &str) -> Option<serde_json::Value> {
    rows.as_array()?.iter().find(|r| r[field] == value).cloned()
}

/// Puts `members` in `key`'s dead set with their reasons, as delayd would.
pub async fn seed_dead(
    conn: &mut redis::aio::MultiplexedConnection,
    key: &str,
    members: &[(&str, &str)],
) {
    let fam = family(key);
    let now = redis_now_ms(conn).await;
    for (i, (m, reason)) in members.iter().enumerate() {
        let _: () = redis::pipe()
            .zadd(&fam.dead, *m, now - 1000 + i as i64)
            .hset(&fam.reasons, *m, *reason)
            .query_async(conn)
            .await
            .unwrap();
    }
}
