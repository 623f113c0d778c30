//! Why a task (or a batch, or a move) is refused: one variant per error
//! code the API answers with, said of the field at fault.

use crate::cascade::RouteError;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TaskError {
    #[error("request body is not valid JSON: {0}")]
    MalformedJson(String),
    #[error("{0}")]
    InvalidRequest(String),
    #[error("{0}")]
    InvalidDestination(String),
    #[error("{0}")]
    InvalidDelay(String),
    #[error("{0}")]
    DelayOutOfRange(String),
    #[error("{0}")]
    InvalidPayload(String),
    #[error("{0}")]
    InvalidHeader(String),
    #[error("{0}")]
    InvalidId(String),
    #[error("{0}")]
    InvalidExchange(String),
    #[error("{0}")]
    InvalidDeadline(String),
}

impl TaskError {
    /// The same error, said of the field at the JSON pointer `at`.
    pub fn at_pointer(self, at: &str) -> TaskError {
        self.at(at)
    }

    /// The same error, said of the task at the JSON pointer `at`.
    pub(super) fn at(self, at: &str) -> TaskError {
        if at.is_empty() {
            return self;
        }
        // "/tasks/3" and "/delay_ms: …" make "/tasks/3/delay_ms: …".
        let locate = |message: String| match message.starts_with('/') {
            true => format!("{at}{message}"),
            false => format!("{at}: {message}"),
        };
        match self {
            TaskError::MalformedJson(m) => TaskError::MalformedJson(locate(m)),
            TaskError::InvalidRequest(m) => TaskError::InvalidRequest(locate(m)),
            TaskError::InvalidDestination(m) => TaskError::InvalidDestination(locate(m)),
            TaskError::InvalidDelay(m) => TaskError::InvalidDelay(locate(m)),
            TaskError::DelayOutOfRange(m) => TaskError::DelayOutOfRange(locate(m)),
            TaskError::InvalidPayload(m) => TaskError::InvalidPayload(locate(m)),
            TaskError::InvalidHeader(m) => TaskError::InvalidHeader(locate(m)),
            TaskError::InvalidId(m) => TaskError::InvalidId(locate(m)),
            TaskError::InvalidExchange(m) => TaskError::InvalidExchange(locate(m)),
            TaskError::InvalidDeadline(m) => TaskError::InvalidDeadline(locate(m)),
        }
    }

    /// The stable, machine-readable code of the error.
    pub fn code(&self) -> &'static str {
        match self {
            TaskError::MalformedJson(_) => "malformed_json",
            TaskError::InvalidRequest(_) => "invalid_request",
            TaskError::InvalidDestination(_) => "invalid_destination",
            TaskError::InvalidDelay(_) => "invalid_delay",
            TaskError::DelayOutOfRange(_) => "delay_out_of_range",
            TaskError::InvalidPayload(_) => "invalid_payload",
            TaskError::InvalidHeader(_) => "invalid_header",
            TaskError::InvalidId(_) => "invalid_id",
            TaskError::InvalidExchange(_) => "invalid_exchange",
            TaskError::InvalidDeadline(_) => "invalid_deadline",
        }
    }

    pub(crate) fn from_json(error: &serde_json::Error) -> Self {
        match error.classify() {
            serde_json::error::Category::Data => TaskError::InvalidRequest(error.to_string()),
            _ => TaskError::MalformedJson(error.to_string()),
        }
    }

    /// A body that does not fit the request's shape, said in the request's
    /// terms: where (a JSON pointer below `at`), what was found, and what
    /// is accepted there. `object` names the request in words ("a task",
    /// "a bulk request"), for a field it does not have.
    pub(crate) fn from_shape(
        error: &serde_path_to_error::Error<serde_json::Error>,
        at: &str,
        object: &str,
    ) -> Self {
        let inner = error.inner();
        if !matches!(inner.classify(), serde_json::error::Category::Data) {
            return TaskError::MalformedJson(inner.to_string());
        }
        let pointer = json_pointer(at, error.path());
        let text = inner.to_string();
        // serde's words, less the position (of no use in a JSON body) and the backquotes.
        let text = text
            .split(" at line ")
            .next()
            .unwrap_or(&text)
            .replace('`', "\"");
        if let Some(unknown) = text.strip_prefix("unknown field ") {
            let name = unknown.split(',').next().unwrap_or(unknown);
            // serde lists the struct's own fields, so the list cannot drift.
            let fields = unknown
                .split_once("expected one of ")
                .map_or(String::new(), |(_, list)| list.replace('"', ""));
            let container = pointer
                .rsplit_once('/')
                .map_or("", |(container, _)| container);
            let owner = if container == at { object } else { container };
            return TaskError::InvalidRequest(format!(
                "{pointer}: unknown field {name}; the fields of {owner} are {fields}"
            ));
        }
        if let Some(missing) = text.strip_prefix("missing field ") {
            // The pointer is the object's; the field is named by serde.
            let name = missing.trim_matches('"');
            let accepts = accepted(name).map_or(String::new(), |what| format!(" ({what})"));
            return TaskError::InvalidRequest(format!(
                "{pointer}/{name}: missing; {object} needs \"{name}\"{accepts}"
            ));
        }
        let field = pointer.rsplit('/').next().unwrap_or_default();
        let found = text
            .strip_prefix("invalid type: ")
            .and_then(|t| t.split(", expected").next())
            .unwrap_or(&text);
        let expected = accepted(field)
            .unwrap_or_else(|| text.split(", expected ").nth(1).unwrap_or("another value"));
        let hint = if field == "delay" && found.starts_with("integer") {
            " (a number of milliseconds is \"delay_ms\")"
        } else {
            ""
        };
        TaskError::InvalidRequest(format!("{pointer}: got {found}, expected {expected}{hint}"))
    }
}

/// The JSON pointer of a place serde found wrong, below `at`.
fn json_pointer(at: &str, path: &serde_path_to_error::Path) -> String {
    let mut pointer = at.to_owned();
    for segment in path.iter() {
        match segment {
            serde_path_to_error::Segment::Seq { index } => pointer.push_str(&format!("/{index}")),
            serde_path_to_error::Segment::Map { key }
            | serde_path_to_error::Segment::Enum { variant: key } => {
                pointer.push('/');
                pointer.push_str(key);
            }
            serde_path_to_error::Segment::Unknown => pointer.push_str("/?"),
        }
    }
    pointer
}

/// What a request field accepts, in the reference's words.
fn accepted(field: &str) -> Option<&'static str> {
    Some(match field {
        "destination" => "a string: words of A-Z, a-z, 0-9, _ and - joined by dots",
        "delay_ms" => "a whole number of milliseconds, 0 or more",
        "delay" => "a duration string such as \"90s\" or \"1h30m\"",
        "deliver_at" => "an RFC 3339 time string such as \"2026-01-02T15:04:05Z\"",
        "payload_base64" => "a base64 string",
        "content_type" => "a media type string such as \"text/plain\"",
        "headers" => "an object of string, number or boolean values",
        "id" => "a string of 1 to 255 bytes",
        "tasks" => "an array of task objects",
        _ => return None,
    })
}

impl From<RouteError> for TaskError {
    fn from(error: RouteError) -> Self {
        match error {
            RouteError::DelayTooLong { .. } => TaskError::DelayOutOfRange(error.to_string()),
            RouteError::InvalidDestination(_) | RouteError::DestinationTooLong { .. } => {
                TaskError::InvalidDestination(error.to_string())
            }
        }
    }
}
