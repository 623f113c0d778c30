//! The pure parts of `POST /v1/tasks/batch`: which tasks repeat an earlier
//! one of the same batch, and each task's answer once the others are
//! submitted. No I/O: the handler (`create_batch`) submits, these decide.

use std::collections::HashMap;

use super::error::{ApiError, ErrorCode};
use crate::scheduler::{Idempotency, Submitted};
use crate::task::Task;

/// A batch's task as parsed: the task and how it is recognised again, or
/// why it was refused.
pub(super) type Parsed = Result<(Task, Idempotency), ApiError>;

/// For each task, the index of the first earlier task of the batch with the
/// same client-chosen id: a client id names one task, so the repeat is
/// answered as the first (a replay), not submitted again.
pub(super) fn earlier_with_same_id(client_ids: &[Option<&str>]) -> Vec<Option<usize>> {
    let mut first_with_id: HashMap<&str, usize> = HashMap::new();
    client_ids
        .iter()
        .enumerate()
        .map(|(index, id)| {
            let id = (*id)?;
            match first_with_id.get(id) {
                Some(&first) => Some(first),
                None => {
                    first_with_id.insert(id, index);
                    None
                }
            }
        })
        .collect()
}

/// The client-chosen id of each task that parsed.
pub(super) fn client_ids(parsed: &[Parsed]) -> Vec<Option<&str>> {
    parsed
        .iter()
        .map(|item| {
            let (task, _) = item.as_ref().ok()?;
            task.client_id.then_some(task.id.as_str())
        })
        .collect()
}

/// Each task's answer, in order: its own outcome (`outcomes[i]`, `None` for
/// a repeat, which was not submitted), or for a repeat, its first
/// occurrence's as a replay, or a conflict if its body differs.
pub(super) fn answers(
    parsed: &[Parsed],
    repeats: &[Option<usize>],
    outcomes: &[Option<Result<Submitted, ApiError>>],
) -> Vec<Result<Submitted, ApiError>> {
    (0..parsed.len())
        .map(|index| match (repeats[index], &outcomes[index]) {
            (None, Some(outcome)) => outcome.clone(),
            (Some(first), _) => repeat_of(parsed, first, index, &outcomes[first]),
            (None, None) => Err(ApiError::internal(
                "a task of the batch was neither submitted nor a repeat",
            )),
        })
        .collect()
}

/// The answer to the task at `index`, which repeats the client id of the
/// task at `first` in the same batch.
fn repeat_of(
    parsed: &[Parsed],
    first: usize,
    index: usize,
    first_outcome: &Option<Result<Submitted, ApiError>>,
) -> Result<Submitted, ApiError> {
    let fingerprint = |i: usize| {
        parsed[i]
            .as_ref()
            .ok()
            .and_then(|(_, idempotency)| idempotency.fingerprint.clone())
    };
    if fingerprint(first) != fingerprint(index) {
        let id = parsed[index]
            .as_ref()
            .map(|(t, _)| t.id.clone())
            .unwrap_or_default();
        return Err(ApiError::new(
            ErrorCode::IdempotencyConflict,
            format!("task id {id:?} appears earlier in this batch with a different body"),
        ));
    }
    match first_outcome {
        Some(Ok(submitted)) => Ok(Submitted {
            accepted: submitted.accepted.clone(),
            replayed: true,
        }),
        Some(Err(error)) => Err(error.clone()),
        None => Err(ApiError::internal(
            "a repeated task lost its first occurrence",
        )),
    }
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, UNIX_EPOCH};

    use proptest::prelude::*;

    use super::*;
    use crate::cascade::CascadeSettings;
    use crate::task::TaskState;

    #[test]
    fn a_repeat_points_at_the_first_task_with_its_id() {
        let ids = [
            Some("a"),
            None,
            Some("b"),
            Some("a"),
            None,
            Some("a"),
            Some("b"),
        ];
        assert_eq!(
            earlier_with_same_id(&ids),
            [None, None, None, Some(0), None, Some(0), Some(2)]
        );
    }

    proptest! {
        /// Every repeat points at an earlier task with the same id that is
        /// itself no repeat; every first occurrence is no repeat.
        #[test]
        fn repeats_point_at_first_occurrences(ids in proptest::collection::vec(proptest::option::of(0u8..4), 0..30)) {
            let names: Vec<Option<String>> = ids.iter().map(|id| id.map(|n| n.to_string())).collect();
            let ids: Vec<Option<&str>> = names.iter().map(|id| id.as_deref()).collect();
            let repeats = earlier_with_same_id(&ids);
            for (index, repeat) in repeats.iter().enumerate() {
                let first = ids[..index].iter().position(|earlier| ids[index].is_some() && *earlier == ids[index]);
                prop_assert_eq!(*repeat, first);
                if let Some(first) = repeat {
                    prop_assert!(repeats[*first].is_none());
                }
            }
        }
    }

    fn parsed(id: &str, body: &[u8]) -> Parsed {
        let cascade = CascadeSettings::default().validate().unwrap();
        let now = UNIX_EPOCH + Duration::from_secs(1_700_000_000);
        let text = format!(
            r#"{{"id":"{id}","destination":"d","delay_ms":0,"payload":{}}}"#,
            String::from_utf8_lossy(body)
        );
        let task = Task::parse(text.as_bytes(), &cascade, now).unwrap();
        let idempotency = Idempotency {
            key: None,
            fingerprint: Some(crate::task::fingerprint(text.as_bytes()).unwrap()),
        };
        Ok((task, idempotency))
    }

    #[test]
    fn a_repeat_answers_as_its_first_or_conflicts_when_its_body_differs() {
        let batch = [
            parsed("x", b"1"),
            parsed("x", b"1"),
            parsed("x", b"2"),
            Err(ApiError::new(ErrorCode::InvalidDelay, "no")),
        ];
        let repeats = earlier_with_same_id(&client_ids(&batch));
        assert_eq!(repeats, [None, Some(0), Some(0), None]);
        let (task, _) = batch[0].as_ref().unwrap();
        let first = Submitted {
            accepted: task.accepted(TaskState::Scheduled),
            replayed: false,
        };
        let refused = Err(ApiError::new(ErrorCode::InvalidDelay, "no"));
        let outcomes = [Some(Ok(first)), None, None, Some(refused)];
        let answers = answers(&batch, &repeats, &outcomes);
        let codes: Vec<Result<bool, &str>> = answers
            .iter()
            .map(|answer| match answer {
                Ok(submitted) => Ok(submitted.replayed),
                Err(error) => Err(error.code),
            })
            .collect();
        assert_eq!(
            codes,
            [
                Ok(false),
                Ok(true),
                Err("idempotency_conflict"),
                Err("invalid_delay")
            ]
        );
    }
}
