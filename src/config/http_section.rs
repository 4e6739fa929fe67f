//! The validated `[http]` section: where the HTTP side listens, the tokens
//! that unlock its reads and writes, and the host names it answers to.

use std::net::SocketAddr;
use std::path::PathBuf;

use serde::Deserialize;

use crate::secret::Secret;

/// Where the HTTP side listens when `[http] listen` is not set: loopback,
/// so the console is not reachable from elsewhere unless asked for.
pub const DEFAULT_LISTEN: ([u8; 4], u16) = ([127, 0, 0, 1], 9464);

/// Longest token accepted: anything longer is a file named by mistake.
const MAX_TOKEN: usize = 4096;

/// `[http]` as written.
#[derive(Debug, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawHttp {
    listen: Option<String>,
    admin_token: Option<Secret>,
    admin_token_file: Option<PathBuf>,
    read_token: Option<Secret>,
    read_token_file: Option<PathBuf>,
    open_reads: Option<bool>,
    allowed_hosts: Option<Names>,
}

/// Host names: a TOML list, or one comma-separated string (how an
/// environment variable carries a list).
#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum Names {
    List(Vec<String>),
    Text(String),
}

/// The `[http]` section once checked.
#[derive(Debug, Clone, Default)]
pub struct HttpSettings {
    /// Where `/metrics`, `/healthz`, `/readyz`, the console and the API are
    /// served; `None` turns the server off.
    pub listen: Option<SocketAddr>,
    /// The bearer token every API write needs; `None` makes the API and the
    /// console read-only.
    pub admin_token: Option<Secret>,
    /// The bearer token API reads need (the admin token reads too); `None`
    /// leaves reads open, which a listener beyond loopback allows only
    /// with `open_reads = true`.
    pub read_token: Option<Secret>,
    /// Host names the console answers to besides its address and loopback
    /// names (a guard against DNS rebinding), lower-case.
    pub allowed_hosts: Vec<String>,
}

/// Checks `[http]`, adding one line per problem to `problems`.
pub(crate) fn validate(raw: Option<RawHttp>, problems: &mut Vec<String>) -> HttpSettings {
    let raw = raw.unwrap_or_default();
    let listen = match raw.listen {
        None => Some(SocketAddr::from(DEFAULT_LISTEN)),
        Some(s) if s.is_empty() || s == "off" => None,
        Some(s) => match s.parse::<SocketAddr>() {
            Ok(a) => Some(a),
            Err(_) => {
                problems.push(format!(
                    "[http] field \"listen\" must be HOST:PORT such as 127.0.0.1:9464, or \"off\" (got \"{s}\")"
                ));
                None
            }
        },
    };
    let admin_token = token(
        raw.admin_token,
        raw.admin_token_file,
        "[http]",
        "admin_token",
        problems,
    );
    let read_token = token(
        raw.read_token,
        raw.read_token_file,
        "[http]",
        "read_token",
        problems,
    );
    if let (Some(r), Some(a)) = (&read_token, &admin_token) {
        if r.expose() == a.expose() {
            problems.push("[http] fields \"read_token\" and \"admin_token\" are the same token: a reader could write; give them different values".into());
        }
    }
    if let Some(a) = listen {
        if !a.ip().is_loopback() && read_token.is_none() && raw.open_reads != Some(true) {
            problems.push(format!(
                "[http] listen = \"{a}\" is reachable from other hosts and no read_token is set, so anyone who reaches it could read every task body: set read_token (or read_token_file, or DELAYD_HTTP__READ_TOKEN), or open_reads = true to serve reads without a token"
            ));
        }
    }
    HttpSettings {
        listen,
        admin_token,
        read_token,
        allowed_hosts: host_names(raw.allowed_hosts, problems),
    }
}

/// `allowed_hosts`, each a bare name: no scheme, port, path or wildcard.
fn host_names(raw: Option<Names>, problems: &mut Vec<String>) -> Vec<String> {
    let names = match raw {
        None => return Vec::new(),
        Some(Names::List(l)) => l,
        Some(Names::Text(t)) => t.split(',').map(|n| n.trim().to_string()).collect(),
    };
    let mut out = Vec::new();
    for n in names {
        let ok = !n.is_empty()
            && n.len() <= 253
            && n.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'.');
        if ok {
            out.push(n.to_ascii_lowercase());
        } else {
            problems.push(format!(
                "[http] field \"allowed_hosts\": \"{n}\" is not a host name such as delayd.example.internal (no scheme, port or wildcard)"
            ));
        }
    }
    out
}

/// The token `field` (or `field_file`) gives, if usable; `place` names the
/// section in messages (`[http]`, or `business "billing",`).
pub(super) fn token(
    given: Option<Secret>,
    file: Option<PathBuf>,
    place: &str,
    field: &str,
    problems: &mut Vec<String>,
) -> Option<Secret> {
    match (given, file) {
        (Some(_), Some(_)) => {
            problems.push(format!("{place} fields \"{field}\" and \"{field}_file\" are both set: give the token one way"));
            None
        }
        (Some(t), None) => checked_token(t.expose(), place, field, problems),
        (None, Some(path)) => match std::fs::read_to_string(&path) {
            // One trailing line break is how files end, not part of the token.
            Ok(text) => {
                let t = text.strip_suffix('\n').unwrap_or(&text);
                let t = t.strip_suffix('\r').unwrap_or(t);
                checked_token(t, place, &format!("{field}_file"), problems)
            }
            Err(e) => {
                problems.push(format!(
                    "{place} field \"{field}_file\": cannot read {} ({e})",
                    path.display()
                ));
                None
            }
        },
        (None, None) => None,
    }
}

/// A problem for every token that is also another place's token: the
/// console would take it for whichever it checks first, so a business's
/// admin token equal to the global read token could not write, and one
/// shared by two businesses would open only the first. The pair within one
/// section is refused where it is read.
pub fn reused_tokens(http: &HttpSettings, businesses: &[super::Business]) -> Vec<String> {
    let mut places: Vec<(&Secret, String, &str)> = Vec::new();
    for (t, field) in [
        (&http.admin_token, "admin_token"),
        (&http.read_token, "read_token"),
    ] {
        if let Some(t) = t {
            places.push((t, format!("[http] field \"{field}\""), ""));
        }
    }
    for b in businesses {
        for (t, field) in [
            (&b.tokens.admin, "admin_token"),
            (&b.tokens.read, "read_token"),
        ] {
            if let Some(t) = t {
                places.push((
                    t,
                    format!("business \"{}\", field \"{field}\"", b.name),
                    &b.name,
                ));
            }
        }
    }
    let mut problems = Vec::new();
    for (i, (t, place, section)) in places.iter().enumerate() {
        let first = places[..i]
            .iter()
            .find(|(u, _, s)| s != section && u.expose() == t.expose());
        if let Some((_, other, _)) = first {
            problems.push(format!(
                "{place} is the same token as {other}: a token must open one thing; give each its own value"
            ));
        }
    }
    problems
}

/// The token, if usable. The messages never quote it.
fn checked_token(t: &str, place: &str, field: &str, problems: &mut Vec<String>) -> Option<Secret> {
    let problem = if t.is_empty() {
        "is empty: leave it unset, or give a token"
    } else if t.len() > MAX_TOKEN {
        "is longer than 4096 bytes"
    } else if t.chars().any(|c| c.is_whitespace() || c.is_control()) {
        "contains whitespace or control characters, which an Authorization header cannot carry"
    } else {
        return Some(Secret::new(t));
    };
    problems.push(format!("{place} field \"{field}\": the token {problem}"));
    None
}

#[cfg(test)]
mod tests {
    use std::io::Write;

    use crate::config::{load_with_env, Config, ConfigError};

    fn load(http: &str, env: &[(&str, &str)]) -> Result<Config, ConfigError> {
        let mut f = tempfile::NamedTempFile::new().unwrap();
        write!(
            f,
            "[redis]\nurl = \"redis://127.0.0.1:6379/0\"\n[amqp]\nurl = \"amqp://g:g@127.0.0.1:5672/%2f\"\n[http]\n{http}\n[businesses.b]\nkey = \"k\"\nexchange = \"e\"\nrouting_key = \"r\"\n"
        )
        .unwrap();
        let env = env
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        load_with_env(f.path(), env)
    }

    #[test]
    fn no_token_means_read_only_on_loopback() {
        let c = load("", &[]).unwrap();
        assert!(c.http_admin_token.is_none());
        assert_eq!(c.http_listen, Some(super::DEFAULT_LISTEN.into()));
    }

    #[test]
    fn the_token_comes_from_the_file_the_environment_or_a_file_and_never_prints() {
        let c = load("admin_token = \"tok-in-file\"", &[]).unwrap();
        assert_eq!(c.http_admin_token.as_ref().unwrap().expose(), "tok-in-file");
        let shown = format!("{c:?}");
        assert!(!shown.contains("tok-in-file"), "{shown}");

        let c = load("", &[("DELAYD_HTTP__ADMIN_TOKEN", "tok-from-env")]).unwrap();
        assert_eq!(c.http_admin_token.unwrap().expose(), "tok-from-env");

        let mut f = tempfile::NamedTempFile::new().unwrap();
        f.write_all(b"tok-in-secret-file\n").unwrap();
        let c = load(
            &format!("admin_token_file = \"{}\"", f.path().display()),
            &[],
        )
        .unwrap();
        assert_eq!(c.http_admin_token.unwrap().expose(), "tok-in-secret-file");
    }

    #[test]
    fn a_listener_beyond_loopback_needs_a_read_token_or_open_reads_said_outright() {
        let e = load("listen = \"0.0.0.0:9464\"", &[])
            .unwrap_err()
            .to_string();
        assert!(e.contains("no read_token is set"), "{e}");
        assert_eq!(
            e.lines().filter(|l| l.contains("read_token")).count(),
            1,
            "{e}"
        );
        let c = load(
            "listen = \"0.0.0.0:9464\"",
            &[("DELAYD_HTTP__READ_TOKEN", "r-secret-1.10")],
        )
        .unwrap();
        assert_eq!(
            c.http_read_token.as_ref().unwrap().expose(),
            "r-secret-1.10"
        );
        assert!(!format!("{c:?}").contains("r-secret"));
        let c = load("listen = \"0.0.0.0:9464\"\nopen_reads = true", &[]).unwrap();
        assert!(c.http_read_token.is_none());
        let c = load(
            "",
            &[
                ("DELAYD_HTTP__LISTEN", "0.0.0.0:9464"),
                ("DELAYD_HTTP__OPEN_READS", "true"),
            ],
        )
        .unwrap();
        assert!(c.http_read_token.is_none());
        let e = load("read_token = \"same-tok\"\nadmin_token = \"same-tok\"", &[])
            .unwrap_err()
            .to_string();
        assert!(e.contains("same token") && !e.contains("same-tok"), "{e}");
    }

    #[test]
    fn allowed_hosts_come_as_a_list_or_from_the_environment_as_one_line() {
        let c = load("allowed_hosts = [\"Console.Example\", \"b.example\"]", &[]).unwrap();
        assert_eq!(c.http_allowed_hosts, ["console.example", "b.example"]);
        let c = load(
            "",
            &[("DELAYD_HTTP__ALLOWED_HOSTS", "a.example, b.example")],
        )
        .unwrap();
        assert_eq!(c.http_allowed_hosts, ["a.example", "b.example"]);
        let e = load("allowed_hosts = [\"http://x.example:80\"]", &[])
            .unwrap_err()
            .to_string();
        assert!(e.contains("[http] field \"allowed_hosts\""), "{e}");
    }

    #[test]
    fn a_business_token_is_checked_as_the_global_ones_and_named_by_its_business() {
        let with = |extra: &str| {
            let mut f = tempfile::NamedTempFile::new().unwrap();
            write!(
                f,
                "[redis]\nurl = \"redis://127.0.0.1:6379/0\"\n[amqp]\nurl = \"amqp://g:g@127.0.0.1:5672/%2f\"\n[businesses.b]\nkey = \"k\"\nexchange = \"e\"\nrouting_key = \"r\"\n{extra}\n"
            )
            .unwrap();
            load_with_env(f.path(), Default::default())
        };
        let c = with("admin_token = \"biz-secret-1\"\nread_token = \"biz-secret-2\"").unwrap();
        let t = &c.businesses[0].tokens;
        assert_eq!(t.admin.as_ref().unwrap().expose(), "biz-secret-1");
        assert_eq!(t.read.as_ref().unwrap().expose(), "biz-secret-2");
        assert!(!format!("{c:?}").contains("biz-secret"));
        let e = with("admin_token = \"two words-secret\"")
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("business \"b\", field \"admin_token\": the token contains whitespace")
                && !e.contains("secret"),
            "{e}"
        );
        let e = with("read_token = \"same-x\"\nadmin_token = \"same-x\"")
            .unwrap_err()
            .to_string();
        assert!(
            e.contains(
                "business \"b\", fields \"read_token\" and \"admin_token\" are the same token"
            ) && !e.contains("same-x"),
            "{e}"
        );
    }

    #[test]
    fn a_token_used_in_two_places_is_refused_naming_both_never_the_token() {
        let with = |http: &str, a: &str, b: &str| {
            let mut f = tempfile::NamedTempFile::new().unwrap();
            write!(
                f,
                "[redis]\nurl = \"redis://127.0.0.1:6379/0\"\n[amqp]\nurl = \"amqp://g:g@127.0.0.1:5672/%2f\"\n[http]\n{http}\n\
                 [businesses.a]\nkey = \"ka\"\nexchange = \"e\"\nrouting_key = \"r\"\n{a}\n\
                 [businesses.b]\nkey = \"kb\"\nexchange = \"e\"\nrouting_key = \"r\"\n{b}\n"
            )
            .unwrap();
            load_with_env(f.path(), Default::default()).map_err(|e| e.to_string())
        };
        let cases = [
            (
                "read_token = \"tok-one\"",
                "admin_token = \"tok-one\"",
                "",
                "business \"a\", field \"admin_token\" is the same token as [http] field \"read_token\"",
            ),
            (
                "admin_token = \"tok-one\"",
                "read_token = \"tok-one\"",
                "",
                "business \"a\", field \"read_token\" is the same token as [http] field \"admin_token\"",
            ),
            (
                "",
                "admin_token = \"tok-one\"",
                "admin_token = \"tok-one\"",
                "business \"b\", field \"admin_token\" is the same token as business \"a\", field \"admin_token\"",
            ),
            (
                "",
                "read_token = \"tok-one\"",
                "admin_token = \"tok-one\"",
                "business \"b\", field \"admin_token\" is the same token as business \"a\", field \"read_token\"",
            ),
        ];
        for (http, a, b, want) in cases {
            let e = with(http, a, b).unwrap_err();
            assert!(e.contains(want) && !e.contains("tok-one"), "{e}");
        }
        let ok = with(
            "admin_token = \"g-admin\"\nread_token = \"g-read\"",
            "admin_token = \"a-admin\"\nread_token = \"a-read\"",
            "admin_token = \"b-admin\"",
        );
        assert!(ok.is_ok(), "{ok:?}");
    }

    #[test]
    fn a_bad_token_is_refused_without_quoting_it() {
        let e = load("admin_token = \"\"", &[]).unwrap_err().to_string();
        assert!(
            e.contains("[http] field \"admin_token\": the token is empty"),
            "{e}"
        );
        let e = load("admin_token = \"two words-secret\"", &[])
            .unwrap_err()
            .to_string();
        assert!(e.contains("whitespace") && !e.contains("secret"), "{e}");
        let e = load(
            "admin_token = \"a\"\nadmin_token_file = \"/nonexistent\"",
            &[],
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("both set"), "{e}");
        let e = load("admin_token_file = \"/nonexistent/token\"", &[])
            .unwrap_err()
            .to_string();
        assert!(e.contains("cannot read /nonexistent/token"), "{e}");
    }
}
