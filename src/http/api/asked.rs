//! The request of a per-business listing: the business named in the path
//! and the query, one extractor for every such `GET`.

use axum::extract::{FromRequestParts, Path, Query};
use axum::http::request::Parts;
use axum::response::{IntoResponse, Response};
use serde::de::DeserializeOwned;

use super::ApiError;

/// The `{business}` of the path and the query `Q`. A query the caller got
/// wrong answers 400 with `{"error": ...}` before the handler runs, as any
/// other mistake does, rather than axum's plain-text rejection.
pub(super) struct Asked<Q>(pub String, pub Q);

impl<Q, S> FromRequestParts<S> for Asked<Q>
where
    Q: DeserializeOwned,
    S: Send + Sync,
{
    type Rejection = Response;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Response> {
        let Path(name) = Path::<String>::from_request_parts(parts, state)
            .await
            .map_err(IntoResponse::into_response)?;
        let Query(q) = Query::<Q>::from_request_parts(parts, state)
            .await
            .map_err(|r| ApiError::from(r).into_response())?;
        Ok(Self(name, q))
    }
}
