//! The JSON API under `/api/v1`: one handler per action, each calling the
//! functions the CLI calls ([`crate::tasks`], [`crate::store`]).
//!
//! Reads are open; writes need the admin token ([`super::auth`]). A request
//! the caller can fix answers 4xx with `{"error": "..."}`, Redis away or
//! slow answers 503; every Redis wait is bounded.

use std::collections::HashMap;
use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::extract::DefaultBodyLimit;
use axum::routing::{get, post, MethodRouter};

use super::error::{ApiError, MAX_REQUEST_BYTES};
use super::HttpState;
use crate::config::Business;
use crate::redis_conn::RedisConn;
use crate::store::{Glimpse, Store, StoreError};
use crate::tasks::dead::Filter;

mod asked;
mod audit;
mod body_search;
mod bulk;
mod dead;
mod intake;
mod overview;
mod pause;
mod schedules;
mod tasks;
mod tenants;

use asked::Asked;
use tenants::{MaxRateBody, WeightBody};

/// Longest a request waits on Redis before it answers 503.
const REDIS_BOUND: Duration = Duration::from_secs(5);
/// Most bytes of a body or member an answer carries; the rest is cut and
/// the full size given.
pub const SHOWN_BYTES: usize = 4096;

pub(super) type Shared = axum::extract::State<Arc<HttpState>>;
/// What a handler answers: JSON, or why not.
type Reply = Result<axum::Json<serde_json::Value>, ApiError>;

/// The `/api/v1` routes.
pub(super) fn routes() -> axum::Router<Arc<HttpState>> {
    // Everything but the overview and the audit log is one business's,
    // under `/businesses/{business}/`.
    let per_business: [(&str, MethodRouter<Arc<HttpState>>); 21] = [
        ("histogram", get(overview::histogram)),
        ("tasks", get(tasks::list).post(tasks::schedule)),
        ("tasks/{id}", get(tasks::get).delete(tasks::cancel)),
        ("tasks/{id}/reschedule", post(tasks::reschedule)),
        ("tasks/{id}/run", post(tasks::run_now)),
        ("search", get(tasks::search)),
        ("dead", get(dead::list)),
        ("dead/requeue", post(dead::requeue)),
        ("dead/purge", post(dead::purge)),
        ("bulk/{action}", post(bulk::act)),
        ("pause", post(pause::pause)),
        ("resume", post(pause::resume)),
        ("schedules", get(schedules::list)),
        ("schedules/{schedule}/pause", post(schedules::pause)),
        ("schedules/{schedule}/resume", post(schedules::resume)),
        ("schedules/{schedule}/run", post(schedules::run)),
        ("tenants", get(tenants::list)),
        ("tenants/{tenant}/pause", post(tenants::pause)),
        ("tenants/{tenant}/resume", post(tenants::resume)),
        ("tenants/{tenant}/weight", post(tenants::set::<WeightBody>)),
        (
            "tenants/{tenant}/max_rate",
            post(tenants::set::<MaxRateBody>),
        ),
    ];
    let top = axum::Router::new()
        .route("/businesses", get(overview::businesses))
        .route("/audit", get(audit::list));
    per_business
        .into_iter()
        .fold(top, |r, (path, m)| {
            r.route(&format!("/businesses/{{business}}/{path}"), m)
        })
        .fallback(|| async {
            ApiError::not_found("no such API path; the paths are listed in docs/console.md")
        })
        .layer(DefaultBodyLimit::max(MAX_REQUEST_BYTES))
}

impl HttpState {
    /// The business called `name`, or a 404. The routes' guard
    /// ([`super::auth::reads`]) answers an unknown business first, naming
    /// what the caller may read; this 404 names none.
    fn business(&self, name: &str) -> Result<&Business, ApiError> {
        self.businesses
            .iter()
            .find(|b| b.name == name)
            .ok_or_else(|| ApiError::not_found(format!("unknown business \"{name}\"")))
    }

    /// The Redis connection, or a 503 while Redis is not reached yet.
    fn conn(&self, business: &str) -> Result<RedisConn, ApiError> {
        self.conn
            .get()
            .cloned()
            .ok_or_else(|| ApiError::redis(business, "not reached yet; delayd keeps trying"))
    }

    /// The stores of `business`'s keys.
    fn stores_of(&self, business: &str) -> Result<Vec<Store>, ApiError> {
        self.conn(business)?;
        Ok(self
            .stores()
            .iter()
            .filter(|(b, _)| b == business)
            .map(|(_, s)| s.clone())
            .collect())
    }
}

impl HttpState {
    /// Records a write in the audit log. The write is done by now, so a
    /// log that cannot be written is a warning, not the caller's failure.
    async fn audit(&self, write: crate::tasks::audit::Write<'_>) {
        let Some(mut conn) = self.conn.get().cloned() else {
            return;
        };
        let done =
            tokio::time::timeout(REDIS_BOUND, crate::tasks::audit::record(&mut conn, &write)).await;
        if !matches!(done, Ok(Ok(()))) {
            tracing::warn!(
                business = write.business,
                action = write.action,
                "could not write the audit log entry of a console write"
            );
        }
    }
}

/// `fut`, bounded by [`REDIS_BOUND`], its failure a 503 naming `business`.
async fn bounded<T>(
    business: &str,
    fut: impl Future<Output = Result<T, StoreError>>,
) -> Result<T, ApiError> {
    bounded_by(REDIS_BOUND, business, fut).await
}

/// [`bounded`] with a bound of its own, for actions on many members (each
/// script call is atomic, so one cut short leaves whole members done).
async fn bounded_by<T>(
    bound: Duration,
    business: &str,
    fut: impl Future<Output = Result<T, StoreError>>,
) -> Result<T, ApiError> {
    match tokio::time::timeout(bound, fut).await {
        Ok(Ok(v)) => Ok(v),
        Ok(Err(e)) => Err(ApiError::redis(business, e)),
        Err(_) => Err(ApiError::redis(
            business,
            format!("no answer within {}s", bound.as_secs()),
        )),
    }
}

/// Bytes as an answer shows them: text (escaped where not UTF-8), cut to
/// [`SHOWN_BYTES`], with the full size.
#[derive(Debug, serde::Serialize)]
pub struct Shown {
    /// The bytes as text: UTF-8 as it is, other bytes as `\xNN`.
    pub text: String,
    /// The full size in bytes.
    pub bytes: usize,
    /// True when `text` holds only the first [`SHOWN_BYTES`].
    pub truncated: bool,
}

impl Shown {
    /// `b` for an answer.
    pub fn of(b: &[u8]) -> Self {
        Self::of_start(b, b.len())
    }

    /// Bytes of which only the start `b` left Redis, `size` in all.
    pub fn of_start(b: &[u8], size: usize) -> Self {
        let mut end = b.len().min(SHOWN_BYTES);
        // Cut on a character boundary when the bytes are UTF-8.
        if let Err(e) = std::str::from_utf8(&b[..end]) {
            if e.error_len().is_none() {
                end = e.valid_up_to();
            }
        }
        Self {
            text: crate::text::text(&b[..end]),
            bytes: size.max(b.len()),
            truncated: end < size.max(b.len()),
        }
    }
}

/// `"id"` or `"body"`: what a business's members are.
/// Most rows one page lists.
const MAX_PAGE: usize = 1000;

/// A page's `limit`: `default` when unset, else 1 to [`MAX_PAGE`].
fn page_limit(limit: Option<usize>, default: usize) -> Result<usize, ApiError> {
    count_within("limit", limit, default, MAX_PAGE)
}

/// A count the query gives in `field`: `default` when unset, else 1 to
/// `most`, or a 400 naming the field and its range.
fn count_within<T>(field: &str, v: Option<T>, default: T, most: T) -> Result<T, ApiError>
where
    T: Copy + PartialOrd + From<u8> + std::fmt::Display,
{
    match v.unwrap_or(default) {
        n if (T::from(1)..=most).contains(&n) => Ok(n),
        n => Err(ApiError::bad(format!(
            "\"{field}\" must be between 1 and {most} (got {n})"
        ))),
    }
}

fn member_kind(b: &Business) -> &'static str {
    if b.member.is_id() {
        "id"
    } else {
        "body"
    }
}

/// Answers that any number of pages share for a second, so an open
/// console costs Redis the same however many are open.
#[derive(Default)]
pub struct Cache {
    /// One slot per answer, each with its own lock: a slow answer (Redis
    /// may take up to [`REDIS_BOUND`]) holds up only those waiting for it.
    entries: std::sync::Mutex<HashMap<String, Slot>>,
}

/// One answer, when it was computed, behind the lock its callers share.
type Slot = Arc<tokio::sync::Mutex<Option<(Instant, serde_json::Value)>>>;

impl Cache {
    /// The answer for `key` if computed within `ttl`, else `compute`'s.
    /// Callers of the same answer wait for each other, so one computes
    /// while the rest reuse.
    async fn get_or<F>(
        &self,
        key: &str,
        ttl: Duration,
        compute: F,
    ) -> Result<serde_json::Value, ApiError>
    where
        F: Future<Output = Result<serde_json::Value, ApiError>>,
    {
        let slot = {
            let mut entries = self.entries.lock().unwrap_or_else(|p| p.into_inner());
            entries.entry(key.to_string()).or_default().clone()
        };
        let mut slot = slot.lock().await;
        if let Some((at, v)) = slot.as_ref() {
            if at.elapsed() < ttl {
                return Ok(v.clone());
            }
        }
        let v = compute.await?;
        *slot = Some((Instant::now(), v.clone()));
        Ok(v)
    }

    /// Drops the answer for `key`, after a write that changes it.
    fn forget(&self, key: &str) {
        let entries = self.entries.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(slot) = entries.get(key) {
            if let Ok(mut slot) = slot.try_lock() {
                *slot = None;
            }
        }
    }
}

/// A member as the API hands it out, for the page to send back: its text
/// may be cut or escaped, the handle never is. The hex of its exact bytes,
/// or for a member longer than a glimpse `sha1:DIGEST:SCORE` (its SHA-1
/// and its score in the set it was listed from), resolved in Redis.
pub fn handle(member: &Glimpse, score: impl std::fmt::Display) -> String {
    match &member.digest {
        None => crate::tasks::hex(&member.head),
        Some(d) => format!("sha1:{d}:{score}"),
    }
}

/// The dead member a handle names, or a 400 saying it is not one.
pub fn dead_filter_of(handle: &str) -> Result<Filter, ApiError> {
    let bad = || {
        ApiError::bad(
            "\"handle\" is not a handle this API returned (hex of the member's bytes, or sha1:DIGEST:SCORE)",
        )
    };
    if let Some(rest) = handle.strip_prefix("sha1:") {
        let (digest, died) = rest.split_once(':').ok_or_else(bad)?;
        let hex40 = digest.len() == 40 && digest.bytes().all(|b| b.is_ascii_hexdigit());
        if !hex40 || died.parse::<f64>().map_or(true, |d| !d.is_finite()) {
            return Err(bad());
        }
        return Ok(Filter::Digest {
            died: died.to_string(),
            digest: digest.to_ascii_lowercase(),
        });
    }
    crate::tasks::unhex(handle)
        .map(Filter::Member)
        .ok_or_else(bad)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_slow_answer_holds_up_only_the_callers_of_the_same_answer() {
        let cache = std::sync::Arc::new(Cache::default());
        let slow = {
            let cache = cache.clone();
            tokio::spawn(async move {
                cache
                    .get_or("slow", Duration::from_secs(1), async {
                        tokio::time::sleep(Duration::from_secs(3)).await;
                        Ok(serde_json::json!(1))
                    })
                    .await
            })
        };
        tokio::time::sleep(Duration::from_millis(100)).await;
        let other = tokio::time::timeout(
            Duration::from_secs(1),
            cache.get_or("other", Duration::from_secs(1), async {
                Ok(serde_json::json!(2))
            }),
        )
        .await;
        assert!(
            matches!(other, Ok(Ok(ref v)) if *v == 2),
            "another answer waited for the slow one"
        );
        slow.abort();
    }

    #[test]
    fn shown_bytes_are_cut_with_their_size() {
        let s = Shown::of(b"ok\xff");
        assert_eq!(
            (s.text.as_str(), s.bytes, s.truncated),
            ("ok\\xff", 3, false)
        );
        let big = "é".repeat(SHOWN_BYTES);
        let s = Shown::of(big.as_bytes());
        assert!(s.truncated);
        assert_eq!(s.bytes, SHOWN_BYTES * 2);
        assert_eq!(s.text.len(), SHOWN_BYTES);
    }
}
