//! Secrets: URLs and passwords that print redacted
//! wherever they are shown.

use std::fmt;

use serde::Deserialize;

/// A URL that may carry a password: it prints with the password masked, so it
/// can go into logs and `check` output without leaking the secret.
#[derive(Clone, Deserialize)]
#[serde(transparent)]
pub struct SecretUrl(String);

impl SecretUrl {
    /// Wraps a URL.
    pub fn new(url: impl Into<String>) -> Self {
        Self(url.into())
    }

    /// The real URL, for handing to a client library and nothing else.
    pub fn expose(&self) -> &str {
        &self.0
    }

    /// The URL with any password replaced by `***`.
    pub fn redacted(&self) -> String {
        redact_url(&self.0)
    }
}

impl fmt::Debug for SecretUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.redacted())
    }
}

impl fmt::Display for SecretUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.redacted())
    }
}

/// Masks every password a URL can carry: the one in
/// `scheme://user:password@host` (whatever characters it holds, reserved
/// ones included) and the `pass=`/`password=` query parameters redis-rs
/// reads (`redis+unix:///path?pass=...`).
pub fn redact_url(url: &str) -> String {
    let Some(scheme_end) = url.find("://") else {
        return url.to_string();
    };
    let (head, rest) = url.split_at(scheme_end + 3);
    // The userinfo ends at the last '@': a password may hold '/', '?', '#'
    // or '@' unencoded, a host never holds '@'.
    let rest = match rest.rfind('@') {
        Some(at) => {
            let userinfo = &rest[..at];
            let masked = match userinfo.find(':') {
                Some(colon) => format!("{}:***", &userinfo[..colon]),
                None => userinfo.to_string(),
            };
            format!("{masked}{}", &rest[at..])
        }
        None => rest.to_string(),
    };
    format!("{head}{}", redact_query(&rest))
}

/// `pass=...` and `password=...` query values replaced by `***`.
fn redact_query(rest: &str) -> String {
    let Some(q) = rest.find('?') else {
        return rest.to_string();
    };
    let params: Vec<String> = rest[q + 1..]
        .split('&')
        .map(|p| match p.split_once('=') {
            Some((k, _))
                if k.eq_ignore_ascii_case("pass") || k.eq_ignore_ascii_case("password") =>
            {
                format!("{k}=***")
            }
            _ => p.to_string(),
        })
        .collect();
    format!("{}?{}", &rest[..q], params.join("&"))
}

/// Why a URL did not parse, without quoting it: a parser's reason can hold
/// a piece of a password that is not percent-encoded.
pub fn url_reason(url: &str, reason: &str) -> String {
    let has_password = url
        .find("://")
        .is_some_and(|i| url[i + 3..].contains('@') || url.contains("pass"));
    if has_password {
        "characters such as / ? # @ : % or spaces in a user name or password must be percent-encoded".to_string()
    } else {
        redact_url(reason)
    }
}

/// A secret that is never printed: `Debug` and `Display` show `***`.
#[derive(Clone, Deserialize)]
#[serde(transparent)]
pub struct Secret(String);

impl Secret {
    /// A secret holding `s`.
    pub(crate) fn new(s: &str) -> Self {
        Self(s.to_string())
    }

    /// The secret itself, for handing to a client library and nothing else.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("***")
    }
}
