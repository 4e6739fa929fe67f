//! Which host names the console and the API answer to. A web page can
//! point a name of its own at this listener (DNS rebinding) and read the
//! API as if it were same-origin; the browser still sends that name as
//! `Host`, so a request is served only for the listen address, loopback
//! names and `[http] allowed_hosts`. An IP address cannot be rebound, so
//! a listener on all interfaces answers to any address. A write that says
//! where it comes from (`Origin`) must come from the host it is sent to.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::header::{HOST, ORIGIN};
use axum::http::{Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use super::error::ApiError;
use super::HttpState;

/// The names and addresses the console answers to.
#[derive(Debug, Clone, Default)]
pub struct Hosts {
    /// `[http] allowed_hosts`, lower-case.
    names: Vec<String>,
    /// The listen address; unspecified (`0.0.0.0`, `::`) allows any address.
    listen: Option<IpAddr>,
}

impl Hosts {
    /// The hosts for a listener on `listen` with these extra names.
    pub fn new(listen: Option<SocketAddr>, names: &[String]) -> Self {
        Self {
            names: names.iter().map(|n| n.to_ascii_lowercase()).collect(),
            listen: listen.map(|a| a.ip()),
        }
    }

    /// Whether a `Host` header value (name or address, with or without a
    /// port) is one this console answers to.
    pub fn allows(&self, host: &str) -> bool {
        let name = name_of(host).to_ascii_lowercase();
        let name = name.strip_suffix('.').unwrap_or(&name);
        if name == "localhost" {
            return true;
        }
        if let Ok(ip) = name.parse::<IpAddr>() {
            return ip.is_loopback()
                || self.listen == Some(ip)
                || self.listen.is_some_and(|l| l.is_unspecified());
        }
        self.names.iter().any(|n| n == name)
    }
}

/// `host` without its port; an IPv6 address without its brackets.
fn name_of(host: &str) -> &str {
    if let Some(rest) = host.strip_prefix('[') {
        return rest.split(']').next().unwrap_or(rest);
    }
    match host.rsplit_once(':') {
        Some((name, port)) if port.bytes().all(|b| b.is_ascii_digit()) => name,
        _ => host,
    }
}

/// Refuses a request for a host name this console does not answer to, and
/// a write whose `Origin` is not the host it was sent to (403, one line).
pub async fn check(State(state): State<Arc<HttpState>>, req: Request, next: Next) -> Response {
    match refusal(&state.hosts, &req) {
        Some(message) => refuse(message),
        None => next.run(req).await,
    }
}

/// Why `req` is refused, if it is.
fn refusal(hosts: &Hosts, req: &Request) -> Option<String> {
    let header = |name| req.headers().get(name).and_then(|v| v.to_str().ok());
    // HTTP/1.1 requires Host; a client that sends none is no browser.
    let host = header(HOST).or_else(|| req.uri().authority().map(|a| a.as_str()));
    if let Some(host) = host.filter(|h| !hosts.allows(h)) {
        return Some(format!(
            "this console does not answer to the host name \"{host}\": open it by its address, as localhost, or add the name to [http] allowed_hosts"
        ));
    }
    let write = !matches!(*req.method(), Method::GET | Method::HEAD | Method::OPTIONS);
    let origin = header(ORIGIN).filter(|_| write)?;
    let from = origin.split_once("://").map(|(_, rest)| rest);
    let same = matches!((from, host), (Some(f), Some(h)) if f.eq_ignore_ascii_case(h));
    (!same).then(|| format!(
        "a write from the page at Origin \"{origin}\" is refused: writes come from this console's own page or from clients that send no Origin"
    ))
}

fn refuse(message: String) -> Response {
    ApiError::with(StatusCode::FORBIDDEN, message).into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loopback_names_the_listen_address_and_configured_names_are_allowed() {
        let listen = Some(SocketAddr::from(([10, 0, 0, 5], 9464)));
        let h = Hosts::new(listen, &["Delayd.Internal".into()]);
        for ok in [
            "localhost",
            "LOCALHOST:9464",
            "127.0.0.1:9464",
            "[::1]:9464",
            "10.0.0.5:9464",
            "delayd.internal",
            "delayd.internal.:80",
        ] {
            assert!(h.allows(ok), "{ok}");
        }
        for bad in [
            "evil.example",
            "evil.example:9464",
            "10.0.0.6",
            "delayd.internal.evil.example",
            "",
        ] {
            assert!(!h.allows(bad), "{bad}");
        }
    }

    #[test]
    fn on_every_interface_any_address_is_allowed_but_no_other_name() {
        let h = Hosts::new(Some(SocketAddr::from(([0, 0, 0, 0], 9464))), &[]);
        assert!(h.allows("192.168.1.20:9464"));
        assert!(h.allows("[fd00::1]:9464"));
        assert!(!h.allows("rebound.example:9464"));
    }
}
