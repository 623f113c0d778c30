//! `/v1/forecast`: how many tasks fall due in each bucket of a window, from
//! the ledger's per-minute counts (see `crate::forecast`). Needs `read`; a
//! client counts only tasks to its own destinations.

use axum::Json;
use axum::extract::rejection::QueryRejection;
use axum::extract::{Query, State};
use serde::{Deserialize, Serialize};

use super::auth::require;
use super::error::{ApiError, ErrorCode};
use super::state::AppState;
use crate::auth::{Caller, Permission};
use crate::clock::format_epoch_ms;
use crate::forecast::{ForecastQuery, Window};
use crate::scheduler::InspectError;

/// What falls due in each bucket, and in all.
#[derive(Debug, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Forecast {
    /// The window's start, rounded down to the minute.
    pub from: String,
    /// Its end, rounded up to the minute.
    pub to: String,
    /// A bucket's width, as `delay` is written.
    pub bucket: String,
    pub buckets: Vec<ForecastBucket>,
    /// Tasks due in the whole window.
    pub total: u64,
}

#[derive(Debug, Serialize, Deserialize, utoipa::ToSchema)]
pub struct ForecastBucket {
    /// Where the bucket starts (it ends where the next one starts, the
    /// last one at `to`).
    pub start: String,
    /// Tasks on their way (pending, scheduled, waiting or being released;
    /// not delivered, cancelled or failed) due in it.
    pub tasks: u64,
}

/// What falls due between `from` and `to`, in buckets.
#[utoipa::path(get, summary = "Count the tasks falling due, in buckets", path = "/v1/forecast", tag = "tasks",
    params(ForecastQuery),
    responses((status = 200, description = "tasks due per bucket", body = Forecast)))]
pub async fn forecast(
    State(state): State<AppState>,
    caller: Caller,
    query: Result<Query<ForecastQuery>, QueryRejection>,
) -> Result<Json<Forecast>, ApiError> {
    require(&caller, Permission::Read)?;
    let now_ms = crate::clock::now_ms();
    if !state.scheduler.has_ledger() {
        return Err(InspectError::LedgerDisabled.into());
    }
    let Query(query) = query.map_err(|e| ApiError::new(ErrorCode::InvalidQuery, e.body_text()))?;
    let (window, pattern) = query
        .check(now_ms)
        .map_err(|e| ApiError::new(ErrorCode::InvalidQuery, e.to_string()))?;
    let counted = |destination: &str| {
        caller.sees_destination(destination)
            && pattern.as_ref().is_none_or(|p| p.matches(destination))
    };
    let tally = state.scheduler.forecast(&window, counted).await?;
    Ok(Json(view(&window, tally)))
}

pub(super) fn view(window: &Window, tally: crate::forecast::Tally) -> Forecast {
    let width = std::time::Duration::from_millis(window.bucket_ms);
    Forecast {
        from: format_epoch_ms(window.from_ms),
        to: format_epoch_ms(window.to_ms),
        bucket: humantime::format_duration(width).to_string(),
        buckets: window
            .starts()
            .zip(tally.buckets)
            .map(|(start, tasks)| ForecastBucket {
                start: format_epoch_ms(start),
                tasks,
            })
            .collect(),
        total: tally.total,
    }
}

pub fn router() -> axum::Router<AppState> {
    axum::Router::new().route("/v1/forecast", axum::routing::get(forecast))
}
