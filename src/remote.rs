//! `delayline schedules …`, `limits …`, `forecast`, `bulk …`, `retries
//! list` and `parked …`: the command line's view of recurring schedules,
//! release limits, the forecast, bulk changes, retry policies and parked
//! messages, through a running service's own API.
//!
//! Going through the API rather than the ledger means one code path for a
//! change (a pause withdraws the occurrences already made, and wakes the
//! planner), the same access control (a token with the `schedule`
//! permission when clients are configured), and no second writer. The
//! service is reached on `http.bind` (loopback for a wildcard address), or
//! at `--url`.

use std::time::Duration;

use serde_json::Value;

use crate::config::Settings;

const TIMEOUT: Duration = Duration::from_secs(10);

#[derive(Debug, thiserror::Error)]
pub enum RemoteError {
    #[error("{url}: {source}")]
    Http { url: String, source: reqwest::Error },
    #[error("{url}: {status} {body}")]
    Refused {
        url: String,
        status: u16,
        body: String,
    },
}

/// A client of the service's API.
pub struct Remote {
    base: String,
    token: Option<String>,
    http: reqwest::Client,
}

impl Remote {
    /// The service `settings` describe, or the one at `url`.
    pub fn new(
        settings: &Settings,
        url: Option<String>,
        token: Option<String>,
    ) -> Result<Remote, RemoteError> {
        let base = url.unwrap_or_else(|| {
            let scheme = if settings.http.tls.enabled() {
                "https"
            } else {
                "http"
            };
            let (host, port) = settings
                .http
                .bind
                .rsplit_once(':')
                .unwrap_or(("127.0.0.1", "8080"));
            let host = match host {
                "0.0.0.0" | "" => "127.0.0.1",
                "[::]" => "[::1]",
                other => other,
            };
            format!("{scheme}://{host}:{port}")
        });
        // The service's certificate names it for its clients, not the
        // loopback address an operator's command reaches it on.
        let http = reqwest::Client::builder()
            .danger_accept_invalid_certs(true)
            .timeout(TIMEOUT)
            .build()
            .map_err(|source| RemoteError::Http {
                url: base.clone(),
                source,
            })?;
        Ok(Remote { base, token, http })
    }

    async fn call(&self, method: reqwest::Method, path: &str) -> Result<Value, RemoteError> {
        self.send(method, path, None).await
    }

    async fn send(
        &self,
        method: reqwest::Method,
        path: &str,
        body: Option<&Value>,
    ) -> Result<Value, RemoteError> {
        let url = format!("{}{path}", self.base);
        let http = |source| RemoteError::Http {
            url: url.clone(),
            source,
        };
        let mut request = self.http.request(method, &url);
        if let Some(token) = &self.token {
            request = request.bearer_auth(token);
        }
        if let Some(body) = body {
            request = request.json(body);
        }
        let response = request.send().await.map_err(http)?;
        let status = response.status().as_u16();
        let body = response.text().await.map_err(http)?;
        if !(200..300).contains(&status) {
            return Err(RemoteError::Refused { url, status, body });
        }
        Ok(serde_json::from_str(&body).unwrap_or(Value::Null))
    }

    /// Every schedule, page by page, as a table.
    pub async fn list_schedules(&self) -> Result<String, RemoteError> {
        let mut table = String::from("id\tstate\twhen\tnext occurrence\toccurrences\tmissed\n");
        let mut cursor: Option<String> = None;
        loop {
            let path = match &cursor {
                Some(cursor) => format!("/v1/schedules?limit=1000&cursor={cursor}"),
                None => "/v1/schedules?limit=1000".to_owned(),
            };
            let page = self.call(reqwest::Method::GET, &path).await?;
            for schedule in page["schedules"].as_array().into_iter().flatten() {
                table += &row(schedule);
            }
            match page["next_cursor"].as_str() {
                Some(next) => cursor = Some(next.to_owned()),
                None => return Ok(table),
            }
        }
    }

    /// Pauses (`true`) or resumes a schedule; what it is now, in a line.
    pub async fn pause_schedule(&self, id: &str, pause: bool) -> Result<String, RemoteError> {
        let action = if pause { "pause" } else { "resume" };
        let schedule = self
            .call(
                reqwest::Method::POST,
                &format!("/v1/schedules/{id}/{action}"),
            )
            .await?;
        Ok(format!(
            "schedule {id}: {} (revision {}), next occurrence {}\n",
            schedule["state"].as_str().unwrap_or("?"),
            schedule["revision"],
            schedule["next_occurrences"][0].as_str().unwrap_or("none"),
        ))
    }
}

impl Remote {
    /// Every limit the token may see, as a table.
    pub async fn list_limits(&self) -> Result<String, RemoteError> {
        let mut table = String::from("name\tdestinations\tholds\twaiting\trate/s\tpaced at\n");
        let page = self.call(reqwest::Method::GET, "/v1/limits").await?;
        for limit in page["limits"].as_array().into_iter().flatten() {
            table += &limit_row(limit);
        }
        Ok(table)
    }

    /// Sets a limit (`PUT /v1/limits/{name}` with `body`); what it is now.
    pub async fn set_limit(&self, name: &str, body: &Value) -> Result<String, RemoteError> {
        let path = format!("/v1/limits/{name}");
        let limit = self.send(reqwest::Method::PUT, &path, Some(body)).await?;
        Ok(limit_line(&limit))
    }

    /// Pauses (`true`) or resumes a limit; what it is now, in a line.
    pub async fn pause_limit(&self, name: &str, pause: bool) -> Result<String, RemoteError> {
        let action = if pause { "pause" } else { "resume" };
        let path = format!("/v1/limits/{name}/{action}");
        let limit = self.call(reqwest::Method::POST, &path).await?;
        Ok(limit_line(&limit))
    }

    pub async fn delete_limit(&self, name: &str) -> Result<String, RemoteError> {
        let path = format!("/v1/limits/{name}");
        self.call(reqwest::Method::DELETE, &path).await?;
        Ok(format!("limit {name}: deleted; what it held is released\n"))
    }
}

impl Remote {
    /// `GET /v1/forecast?{query}` as a table of its buckets and total.
    pub async fn forecast(&self, query: &str) -> Result<String, RemoteError> {
        let path = format!("/v1/forecast?{query}");
        let forecast = self.call(reqwest::Method::GET, &path).await?;
        let mut table = String::from("bucket start\ttasks\n");
        for bucket in forecast["buckets"].as_array().into_iter().flatten() {
            table += &format!(
                "{}\t{}\n",
                bucket["start"].as_str().unwrap_or("?"),
                bucket["tasks"]
            );
        }
        table += &format!("total\t{}\n", forecast["total"]);
        Ok(table)
    }

    /// Starts a bulk change and waits until it is done; its counts.
    pub async fn bulk(&self, body: &Value, key: Option<&str>) -> Result<String, RemoteError> {
        let url = format!("{}/v1/tasks/bulk", self.base);
        let http = |source| RemoteError::Http {
            url: url.clone(),
            source,
        };
        let mut request = self.http.post(&url).json(body);
        if let Some(token) = &self.token {
            request = request.bearer_auth(token);
        }
        if let Some(key) = key {
            request = request.header("idempotency-key", key);
        }
        let response = request.send().await.map_err(http)?;
        let status = response.status().as_u16();
        let text = response.text().await.map_err(http)?;
        if status != 202 {
            return Err(RemoteError::Refused {
                url,
                status,
                body: text,
            });
        }
        let started: Value = serde_json::from_str(&text).unwrap_or(Value::Null);
        let path = format!("/v1/operations/{}", started["id"].as_str().unwrap_or(""));
        loop {
            let operation = self.call(reqwest::Method::GET, &path).await?;
            if operation["done"] == true {
                return Ok(format!(
                    "operation {}: {}; matched {}, changed {}, too late {}, unchanged {}\n",
                    operation["id"].as_str().unwrap_or("?"),
                    operation["state"].as_str().unwrap_or("?"),
                    operation["matched"],
                    operation["changed"],
                    operation["too_late"],
                    operation["unchanged"],
                ));
            }
            tokio::time::sleep(std::time::Duration::from_millis(200)).await;
        }
    }
}

fn limit_line(limit: &Value) -> String {
    format!(
        "limit {}: {}, {} waiting\n",
        limit["name"].as_str().unwrap_or("?"),
        limit["reason"].as_str().unwrap_or("holds nothing now"),
        limit["waiting"],
    )
}

fn limit_row(limit: &Value) -> String {
    let text = |field: &str| limit[field].as_str().unwrap_or("-").to_owned();
    format!(
        "{}\t{}\t{}\t{}\t{}\t{}\n",
        text("name"),
        text("destinations"),
        text("holds"),
        limit["waiting"],
        limit["release_rate_per_sec"],
        limit["rate_per_sec"]
            .as_f64()
            .map_or("-".to_owned(), |r| r.to_string()),
    )
}

fn row(schedule: &Value) -> String {
    let text = |field: &str| schedule[field].as_str().unwrap_or("").to_owned();
    let when = match schedule["cron"].as_str() {
        Some(cron) => format!("cron {cron:?} {}", text("timezone")),
        None => format!("every {}", text("every")),
    };
    format!(
        "{}\t{}\t{when}\t{}\t{}\t{}\n",
        text("id"),
        text("state"),
        schedule["next_occurrences"][0].as_str().unwrap_or("-"),
        schedule["occurrences"],
        schedule["missed"],
    )
}

/// A retry policy as `GET /v1/retries` shows it, in a line of its table.
fn policy_line(policy: &Value) -> String {
    let queues: Vec<&str> = (policy["queues"].as_array().into_iter().flatten())
        .filter_map(Value::as_str)
        .collect();
    let or_dash = |name: &str| match &policy[name] {
        Value::Null => "-".to_owned(),
        Value::String(text) => text.clone(),
        other => other.to_string(),
    };
    format!(
        "{}\t{}\t{}\t{}\t{}\t{}\t{}\t{}\t{}\t{}\t{}\t{}\n",
        policy["name"].as_str().unwrap_or("?"),
        queues.join(","),
        policy["initial_ms"],
        policy["multiplier"],
        policy["max_delay_ms"],
        policy["jitter"],
        policy["max_attempts"],
        or_dash("give_up_after_ms"),
        or_dash("park_to"),
        or_dash("source"),
        or_dash("changed_by"),
        or_dash("changed_at"),
    )
}

impl Remote {
    /// `GET /v1/retries` as a table: a policy a line, then the broker objects.
    pub async fn list_retries(&self) -> Result<String, RemoteError> {
        let retries = self.call(reqwest::Method::GET, "/v1/retries").await?;
        let mut table = String::from(
            "policy\tqueues\tinitial ms\tmultiplier\tmax delay ms\tjitter\tattempts\t\
             give up after ms\tpark to\tsource\tchanged by\tchanged at\n",
        );
        for policy in retries["policies"].as_array().into_iter().flatten() {
            table += &policy_line(policy);
        }
        for aside in retries["set_aside"].as_array().into_iter().flatten() {
            table += &format!(
                "not in force here: {}: {}\n",
                aside["name"].as_str().unwrap_or("?"),
                aside["reason"].as_str().unwrap_or("?")
            );
        }
        let renamed: Vec<(&String, &Value)> = (retries["destinations"].as_object().into_iter())
            .flatten()
            .filter(|(queue, destination)| destination.as_str() != Some(queue.as_str()))
            .collect();
        if !renamed.is_empty() {
            table +=
                "\nqueue\tits retries' destination (a queue name that cannot be one, escaped)\n";
            for (queue, destination) in renamed {
                table += &format!("{queue}\t{}\n", destination.as_str().unwrap_or("?"));
            }
        }
        if let Some(exchange) = retries["exchange"].as_str() {
            table += &format!(
                "a covered queue dead-letters to {exchange}; delayline takes them from {}; \
                 what no policy covers goes to {}\n",
                retries["queue"].as_str().unwrap_or("?"),
                retries["refused_queue"].as_str().unwrap_or("?"),
            );
        }
        Ok(table)
    }

    /// Sets retry policy `name` (`PUT /v1/retries/policies/{name}`); what
    /// it is now, in a line.
    pub async fn set_retry_policy(&self, name: &str, body: &Value) -> Result<String, RemoteError> {
        let path = format!("/v1/retries/policies/{name}");
        let policy = self.send(reqwest::Method::PUT, &path, Some(body)).await?;
        Ok(policy_line(&policy))
    }

    pub async fn remove_retry_policy(&self, name: &str) -> Result<String, RemoteError> {
        let path = format!("/v1/retries/policies/{name}");
        self.call(reqwest::Method::DELETE, &path).await?;
        Ok(format!(
            "retry policy {name}: removed; its queues' dead letters are refused until another \
             policy covers them\n"
        ))
    }

    /// `GET /v1/retries/changes` as a table, newest first.
    pub async fn retry_policy_changes(&self, limit: u32) -> Result<String, RemoteError> {
        let path = format!("/v1/retries/changes?limit={limit}");
        let changes = self.call(reqwest::Method::GET, &path).await?;
        let mut table = String::from("at\tpolicy\tchange\tchanged by\tsettings\n");
        for change in changes["changes"].as_array().into_iter().flatten() {
            table += &format!(
                "{}\t{}\t{}\t{}\t{}\n",
                change["at"].as_str().unwrap_or("?"),
                change["policy"].as_str().unwrap_or("?"),
                change["change"].as_str().unwrap_or("?"),
                change["changed_by"].as_str().unwrap_or("-"),
                match &change["settings"] {
                    Value::Null => "-".to_owned(),
                    settings => settings.to_string(),
                }
            );
        }
        Ok(table)
    }

    /// `GET /v1/parked` as two tables: the count per queue, then the
    /// newest messages (of `queue`, when given), up to `limit`.
    /// The parked messages by group, as a table.
    pub async fn parked_groups(&self) -> Result<String, RemoteError> {
        let groups = self.call(reqwest::Method::GET, "/v1/parked/groups").await?;
        let mut text = String::from("queue\treason\tfirst failed\tparked\tnewest\n");
        for group in groups["groups"].as_array().into_iter().flatten() {
            let field = |name: &str| group[name].as_str().unwrap_or("?").to_owned();
            text += &format!(
                "{}\t{}\t{}\t{}\t{}\n",
                field("queue"),
                field("reason"),
                field("first_failed_hour"),
                group["parked"],
                field("newest_parked_at"),
            );
        }
        Ok(text)
    }

    /// The expired tasks (one page, in due order), as a table.
    pub async fn list_expired(
        &self,
        destination: Option<&str>,
        limit: u32,
    ) -> Result<String, RemoteError> {
        let mut query = vec![
            ("state", "expired".to_owned()),
            ("limit", limit.to_string()),
        ];
        query.extend(destination.map(|d| ("destination", d.to_owned())));
        let query = reqwest::Url::parse_with_params("http://tasks/", &query)
            .ok()
            .and_then(|url| url.query().map(str::to_owned))
            .unwrap_or_default();
        let page = self
            .call(reqwest::Method::GET, &format!("/v1/tasks?{query}"))
            .await?;
        let mut text = String::from("id	destination	due	deadline	expired at	why\n");
        for task in page["tasks"].as_array().into_iter().flatten() {
            let field = |name: &str| task[name].as_str().unwrap_or("-").to_owned();
            text += &format!(
                "{}\t{}\t{}\t{}\t{}\t{}\n",
                field("id"),
                field("destination"),
                field("deliver_at"),
                field("deadline"),
                field("expired_at"),
                field("last_error"),
            );
        }
        if page["next_cursor"].is_string() {
            text += "(more: --limit up to 1000, or the API's `cursor`)\n";
        }
        Ok(text)
    }

    /// Replays expired task `id`: the new task, due now.
    pub async fn replay_task(&self, id: &str) -> Result<String, RemoteError> {
        let path = format!("/v1/tasks/{}/replay", path_segment(id));
        let task = self.call(reqwest::Method::POST, &path).await?;
        Ok(format!(
            "replayed {id} as {}, due {}\n",
            task["id"].as_str().unwrap_or("?"),
            task["deliver_at"].as_str().unwrap_or("?")
        ))
    }

    pub async fn list_parked(
        &self,
        queue: Option<&str>,
        limit: u32,
    ) -> Result<String, RemoteError> {
        let mut query = vec![("limit", limit.to_string())];
        query.extend(queue.map(|q| ("queue", q.to_owned())));
        let query = reqwest::Url::parse_with_params("http://parked/", &query)
            .ok()
            .and_then(|url| url.query().map(str::to_owned))
            .unwrap_or_default();
        let parked = self
            .call(reqwest::Method::GET, &format!("/v1/parked?{query}"))
            .await?;
        let mut text = String::from("queue\tparked\tnewest\n");
        for queue in parked["queues"].as_array().into_iter().flatten() {
            text += &format!(
                "{}\t{}\t{}\n",
                queue["queue"].as_str().unwrap_or("?"),
                queue["parked"],
                queue["newest_at"].as_str().unwrap_or("?"),
            );
        }
        text += "\nid\tqueue\tpolicy\treason\tattempts\tparked at\tmessage id\n";
        for message in parked["parked"].as_array().into_iter().flatten() {
            text += &format!(
                "{}\t{}\t{}\t{}\t{}\t{}\t{}\n",
                message["id"].as_str().unwrap_or("?"),
                message["queue"].as_str().unwrap_or("?"),
                message["policy"].as_str().unwrap_or("?"),
                message["reason"].as_str().unwrap_or("?"),
                message["attempts"],
                message["parked_at"].as_str().unwrap_or("?"),
                message["message_id"].as_str().unwrap_or("-"),
            );
        }
        if parked["next"].is_string() {
            text += "(more: --limit up to 500, or the API's `before` cursor)\n";
        }
        Ok(text)
    }

    /// Replays (`"replay"`) or discards (`"discard"`) one parked message,
    /// by `id`, or every one of `queue`; the counts.
    pub async fn act_on_parked(
        &self,
        action: &str,
        which: ParkedWhich,
        after: Option<&str>,
    ) -> Result<String, RemoteError> {
        let done = match which {
            ParkedWhich::One(id) if action == "replay" => {
                let path = format!("/v1/parked/{}/replay", path_segment(&id));
                let body = after.map(|after| serde_json::json!({ "delay": after }));
                self.send(reqwest::Method::POST, &path, body.as_ref())
                    .await?
            }
            ParkedWhich::One(id) => {
                let path = format!("/v1/parked/{}", path_segment(&id));
                self.call(reqwest::Method::DELETE, &path).await?
            }
            ParkedWhich::Filter(mut filter) => {
                if let Some(fields) = filter.as_object_mut() {
                    fields.retain(|_, value| !value.is_null());
                }
                let body = serde_json::json!({"filter": filter, "action": action});
                self.send(reqwest::Method::POST, "/v1/parked/bulk", Some(&body))
                    .await?
            }
        };
        let verb = if action == "replay" {
            "replayed"
        } else {
            "discarded"
        };
        Ok(format!(
            "{verb} {} of {} matched ({} gone before the action reached them)\n",
            done["changed"], done["matched"], done["unchanged"]
        ))
    }
}

/// `text` as one path segment: unreserved bytes as they are, every other
/// byte percent-encoded (a task id may hold `/`, `?` or spaces).
fn path_segment(text: &str) -> String {
    text.bytes()
        .map(|byte| match byte {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' => {
                char::from(byte).to_string()
            }
            other => format!("%{other:02X}"),
        })
        .collect()
}

/// Which parked messages a command acts on: one by id, or those a
/// `POST /v1/parked/bulk` filter matches.
pub enum ParkedWhich {
    One(String),
    Filter(serde_json::Value),
}
