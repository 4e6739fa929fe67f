//! API errors: a status and one line of JSON, `{"error": "..."}`. What a
//! caller can cause is a 4xx; Redis away is a 503; nothing answers 500.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};

/// Largest request body accepted (a task's body travels inside it).
pub const MAX_REQUEST_BYTES: usize = 1 << 20;

/// An API failure, shown to the caller as one line.
#[derive(Debug)]
pub struct ApiError {
    status: StatusCode,
    message: String,
}

impl ApiError {
    /// A request the caller can fix (400).
    pub fn bad(message: impl Into<String>) -> Self {
        Self::with(StatusCode::BAD_REQUEST, message)
    }

    /// Nothing answers to what the request names (404).
    pub fn not_found(message: impl Into<String>) -> Self {
        Self::with(StatusCode::NOT_FOUND, message)
    }

    /// Any status, with its line.
    pub fn with(status: StatusCode, message: impl Into<String>) -> Self {
        Self {
            status,
            message: one_line(&message.into()),
        }
    }

    /// The line the caller sees.
    pub fn message(&self) -> &str {
        &self.message
    }

    /// Redis is not reached yet, or failed this call (503: try again).
    pub fn redis(business: &str, e: impl std::fmt::Display) -> Self {
        Self::with(
            StatusCode::SERVICE_UNAVAILABLE,
            format!("business \"{business}\": redis: {e}"),
        )
    }
}

fn one_line(s: &str) -> String {
    s.split_whitespace().collect::<Vec<_>>().join(" ")
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut r = (
            self.status,
            axum::Json(serde_json::json!({ "error": self.message })),
        )
            .into_response();
        if self.status == StatusCode::UNAUTHORIZED {
            r.headers_mut().insert(
                axum::http::header::WWW_AUTHENTICATE,
                axum::http::HeaderValue::from_static("Bearer"),
            );
        }
        r
    }
}

impl From<axum::extract::rejection::JsonRejection> for ApiError {
    fn from(r: axum::extract::rejection::JsonRejection) -> Self {
        let status = r.status();
        let text = r.body_text();
        if status == StatusCode::PAYLOAD_TOO_LARGE {
            return Self::with(
                status,
                format!(
                    "the request body is larger than {} bytes; send a smaller body",
                    MAX_REQUEST_BYTES
                ),
            );
        }
        // 415 and 422 say what a caller must change; keep them, as 4xx.
        Self::with(status, text)
    }
}

impl From<axum::extract::rejection::QueryRejection> for ApiError {
    fn from(r: axum::extract::rejection::QueryRejection) -> Self {
        Self::bad(r.body_text())
    }
}

impl From<axum::extract::rejection::PathRejection> for ApiError {
    fn from(r: axum::extract::rejection::PathRejection) -> Self {
        Self::bad(r.body_text())
    }
}
