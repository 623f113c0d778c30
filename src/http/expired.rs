//! `POST /v1/tasks/{id}/replay`: an expired task taken in again, once, as
//! a new task due now. Its deadline passed while it could not be
//! delivered; whoever replays it knows it is late and wants it anyway.

use axum::extract::{Path, State};
use axum::response::Response;

use super::auth::{require, scoped_fingerprint};
use super::error::{ApiError, ErrorCode};
use super::state::AppState;
use super::tasks::{accepted_answer, admit_tasks, settle, submit};
use crate::auth::{Caller, Permission};
use crate::clock::Reading;
use crate::scheduler::{Idempotency, Submitted};
use crate::task::TaskState;

/// Takes expired task `id` in again as a new task due at `now` (see
/// `StoredTask::replayed`): its id is the replay's, so a second replay
/// answers the first (`replayed`). Another client's task is not found.
pub(super) async fn replay_expired(
    state: &AppState,
    caller: &Caller,
    id: &str,
    now: &Reading,
) -> Result<Submitted, ApiError> {
    let not_found = || {
        ApiError::new(
            ErrorCode::TaskNotFound,
            format!("no task {id:?} in the ledger (never accepted, or pruned after retention)"),
        )
    };
    let stored = state.scheduler.task(id).await?.ok_or_else(not_found)?;
    if !stored.within_scope(caller.owner_scope()) {
        return Err(not_found());
    }
    if stored.state != TaskState::Expired {
        return Err(ApiError::new(
            ErrorCode::TaskNotExpired,
            format!(
                "task {id:?} is {}: only an expired task is replayed",
                stored.state.as_str()
            ),
        ));
    }
    let task = stored
        .replayed(state.scheduler.cascade(), now.wall_ms)
        .map_err(|why| {
            ApiError::new(
                ErrorCode::PayloadNotKept,
                format!("task {id:?} cannot be replayed: {why}"),
            )
        })?;
    // The same replay is the same request, whoever's client asks again.
    let idempotency = Idempotency {
        key: None,
        fingerprint: Some(scoped_fingerprint(caller, format!("replay:{id}"))),
    };
    admit_tasks(state, caller, 1)?;
    let submitted = submit(state, &task, idempotency, now).await;
    let accepted = submitted.as_ref().is_ok_and(|s| !s.replayed);
    settle(state, caller, 1, u64::from(accepted));
    submitted
}

/// Replays an expired task: a new task, due now, without a deadline.
#[utoipa::path(post, summary = "Replay an expired task, once, as a new task due now",
    path = "/v1/tasks/{id}/replay", tag = "tasks",
    params(("id" = String, Path, description = "the expired task's id")),
    responses(
        (status = 202, description = "the new task (`Idempotent-Replayed: true` when it was replayed before)", body = crate::task::TaskAccepted,
         headers(("Idempotent-Replayed" = String, description = "`true` when the task was replayed before"))),
    ))]
pub async fn replay_task(
    State(state): State<AppState>,
    caller: Caller,
    Path(id): Path<String>,
) -> Result<Response, ApiError> {
    require(&caller, Permission::Submit)?;
    let now = crate::clock::read();
    let submitted = replay_expired(&state, &caller, &id, &now).await?;
    Ok(accepted_answer(submitted))
}

pub fn router() -> axum::Router<AppState> {
    axum::Router::new().route("/v1/tasks/{id}/replay", axum::routing::post(replay_task))
}
