//! RabbitMQ's management HTTP API, where the broker exposes it: the only
//! place that counts every message of a quorum queue.
//!
//! AMQP's passive declare reports only *ready* messages. A quorum queue's
//! at-least-once dead-letter worker holds expired messages until the next
//! level confirms them; those are neither ready nor unacknowledged as AMQP
//! counts them, so a level whose dead-lettering stalls looks empty. The
//! management API reports a queue's total, and the held messages are what
//! the total has beyond ready and unacknowledged.

use std::time::Duration;

use lapin::uri::AMQPUri;
use serde::Deserialize;

/// The management plugin's default port.
const DEFAULT_PORT: u16 = 15672;
const TIMEOUT: Duration = Duration::from_secs(5);
/// The API's largest page.
const PAGE_SIZE: usize = 500;

#[derive(Debug, thiserror::Error)]
pub enum ManagementError {
    #[error("management API at {url}: {source}")]
    Request { url: String, source: reqwest::Error },
    #[error("management.url {0:?} is not an http:// URL")]
    InvalidUrl(String),
}

/// One queue as the management API counts it.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
pub struct QueueCounts {
    pub name: String,
    /// Every message, held ones included. Absent until the broker's first
    /// statistics emission for a new queue.
    #[serde(default)]
    pub messages: u64,
    #[serde(default)]
    pub messages_ready: u64,
    #[serde(default)]
    pub messages_unacknowledged: u64,
    /// The node leading a quorum queue.
    #[serde(default)]
    pub leader: Option<String>,
    /// The node a classic queue lives on (a quorum queue's leader, too).
    #[serde(default)]
    pub node: Option<String>,
}

impl QueueCounts {
    /// Messages neither ready nor delivered to a consumer: in a level queue,
    /// those the dead-letter worker holds until the next level confirms them.
    pub fn held(&self) -> u64 {
        self.messages
            .saturating_sub(self.messages_ready + self.messages_unacknowledged)
    }

    /// Where the queue's leader (or its only copy) runs, when the API said.
    pub fn leader_node(&self) -> Option<&str> {
        self.leader.as_deref().or(self.node.as_deref())
    }
}

#[derive(Deserialize)]
struct Page {
    items: Vec<QueueCounts>,
}

/// A client of one broker's management API, for one vhost.
#[derive(Clone, Debug)]
pub struct ManagementApi {
    client: reqwest::Client,
    /// `http://host:port`, without credentials (they go in a header).
    base: String,
    user: String,
    password: String,
    vhost: String,
}

impl ManagementApi {
    /// The API for the broker at `amqp_uri`: `setting` is `metrics.management_url`,
    /// empty for the AMQP host on the default port with the AMQP credentials,
    /// `none` for no API, or an `http://user:password@host:port` URL.
    pub fn new(amqp_uri: &str, setting: &str) -> Result<Option<ManagementApi>, ManagementError> {
        let setting = setting.trim();
        if setting == "none" {
            return Ok(None);
        }
        let Ok(amqp) = amqp_uri.parse::<AMQPUri>() else {
            return Ok(None);
        };
        let (mut base, mut user, mut password) = (
            format!("http://{}:{DEFAULT_PORT}", amqp.authority.host),
            amqp.authority.userinfo.username.clone(),
            amqp.authority.userinfo.password.clone(),
        );
        if !setting.is_empty() {
            let url = reqwest::Url::parse(setting)
                .ok()
                .filter(|url| url.scheme() == "http" && url.host_str().is_some())
                .ok_or_else(|| ManagementError::InvalidUrl(setting.to_owned()))?;
            if !url.username().is_empty() {
                user = decode(url.username());
                password = decode(url.password().unwrap_or_default());
            }
            base = format!(
                "http://{}:{}",
                url.host_str().unwrap_or_default(),
                url.port().unwrap_or(DEFAULT_PORT)
            );
        }
        let client = reqwest::Client::builder()
            .timeout(TIMEOUT)
            .build()
            .map_err(|source| ManagementError::Request {
                url: base.clone(),
                source,
            })?;
        Ok(Some(ManagementApi {
            client,
            base,
            user,
            password,
            vhost: amqp.vhost,
        }))
    }

    /// Where the API is, for logs (never the credentials).
    pub fn base(&self) -> &str {
        &self.base
    }

    /// The queues of the vhost whose whole name matches `pattern` (a regular expression).
    pub async fn queues(&self, pattern: &str) -> Result<Vec<QueueCounts>, ManagementError> {
        let query = [
            ("page", "1"),
            ("page_size", &PAGE_SIZE.to_string()),
            ("name", pattern),
            ("use_regex", "true"),
            (
                "columns",
                "name,messages,messages_ready,messages_unacknowledged,leader,node",
            ),
        ];
        let page: Option<Page> = self.get(&["queues", &self.vhost], &query).await?;
        Ok(page.map(|page| page.items).unwrap_or_default())
    }

    /// What sends `queue`'s dead letters where: its arguments and the
    /// policy the broker applies to it; `None` when there is no such queue.
    pub async fn queue_wiring(&self, queue: &str) -> Result<Option<QueueWiring>, ManagementError> {
        self.get(&["queues", &self.vhost, queue], &[]).await
    }

    /// An exchange's type, and the queues it is bound to; `None` when
    /// there is no such exchange.
    pub async fn exchange(&self, name: &str) -> Result<Option<ExchangeView>, ManagementError> {
        let Some(found): Option<ExchangeType> =
            self.get(&["exchanges", &self.vhost, name], &[]).await?
        else {
            return Ok(None);
        };
        let path = ["exchanges", &self.vhost, name, "bindings", "source"];
        let bindings: Option<Vec<Binding>> = self.get(&path, &[]).await?;
        let bound_queues = bindings.unwrap_or_default().into_iter();
        let bound_queues = bound_queues.filter(|b| b.destination_type == "queue");
        Ok(Some(ExchangeView {
            kind: found.kind,
            bound_queues: bound_queues.map(|b| b.destination).collect(),
        }))
    }

    /// GETs `/api/<path>` (each segment encoded) with `query`: `None` for a 404.
    async fn get<T: serde::de::DeserializeOwned>(
        &self,
        path: &[&str],
        query: &[(&str, &str)],
    ) -> Result<Option<T>, ManagementError> {
        let invalid = || ManagementError::InvalidUrl(self.base.clone());
        let mut url = reqwest::Url::parse(&self.base).map_err(|_| invalid())?;
        url.path_segments_mut()
            .map_err(|()| invalid())?
            .push("api")
            .extend(path);
        if !query.is_empty() {
            url.query_pairs_mut().extend_pairs(query);
        }
        let failed = |source| ManagementError::Request {
            url: self.base.clone(),
            source,
        };
        let response = self
            .client
            .get(url)
            .basic_auth(&self.user, Some(&self.password))
            .send()
            .await
            .map_err(failed)?;
        if response.status() == reqwest::StatusCode::NOT_FOUND {
            return Ok(None);
        }
        let response = response.error_for_status().map_err(failed)?;
        Ok(Some(response.json().await.map_err(failed)?))
    }
}

/// A queue's dead-letter settings, as the management API shows them.
#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
pub struct QueueWiring {
    /// Its `x-` arguments, as declared (an object; an empty list for none
    /// on some versions, as the policy's definition).
    #[serde(default)]
    pub arguments: serde_json::Value,
    /// The user policy applied to it, by name.
    #[serde(default)]
    pub policy: Option<String>,
    /// What the applied policies (user and operator) set, merged.
    #[serde(default)]
    pub effective_policy_definition: Option<serde_json::Value>,
}

impl QueueWiring {
    /// The exchange its `x-dead-letter-exchange` argument names.
    pub fn argument_dead_letter_exchange(&self) -> Option<&str> {
        self.arguments.get("x-dead-letter-exchange")?.as_str()
    }

    /// The exchange the policy applied to it names as its dead-letter exchange.
    pub fn policy_dead_letter_exchange(&self) -> Option<&str> {
        let definition = self.effective_policy_definition.as_ref()?;
        definition.get("dead-letter-exchange")?.as_str()
    }
}

/// An exchange's type and the queues bound to it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ExchangeView {
    pub kind: String,
    pub bound_queues: Vec<String>,
}

#[derive(Deserialize)]
struct ExchangeType {
    #[serde(rename = "type")]
    kind: String,
}

#[derive(Deserialize)]
struct Binding {
    destination: String,
    destination_type: String,
}

fn decode(text: &str) -> String {
    reqwest::Url::parse(&format!("http://x/?v={text}"))
        .ok()
        .and_then(|url| url.query_pairs().next().map(|(_, v)| v.into_owned()))
        .unwrap_or_else(|| text.to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_api_is_found_from_the_amqp_address_or_the_setting() {
        let uri = "amqp://app:s%40cret@rabbit.local:5672/orders";
        let api = ManagementApi::new(uri, "").unwrap().unwrap();
        assert_eq!(api.base(), "http://rabbit.local:15672");
        assert_eq!(
            (api.user.as_str(), api.password.as_str()),
            ("app", "s@cret")
        );
        assert_eq!(api.vhost, "orders");
        let api = ManagementApi::new(uri, "http://ops:pw%21@mgmt:8080")
            .unwrap()
            .unwrap();
        assert_eq!(api.base(), "http://mgmt:8080");
        assert_eq!((api.user.as_str(), api.password.as_str()), ("ops", "pw!"));
        assert!(ManagementApi::new(uri, "none").unwrap().is_none());
        assert!(ManagementApi::new(uri, "ftp://x").is_err());
        let default = ManagementApi::new("amqp://guest:guest@127.0.0.1:5672/%2f", "").unwrap();
        assert_eq!(default.unwrap().vhost, "/");
    }

    #[test]
    fn held_messages_are_those_neither_ready_nor_unacknowledged() {
        let counts = QueueCounts {
            name: "q".into(),
            messages: 357,
            messages_ready: 0,
            messages_unacknowledged: 0,
            leader: None,
            node: None,
        };
        assert_eq!(counts.held(), 357);
        let page: Page = serde_json::from_str(r#"{"items": [{"name": "new"}]}"#).unwrap();
        assert_eq!(page.items[0].held(), 0);
        assert_eq!(page.items[0].leader_node(), None);
        // A quorum queue names its leader; a classic queue only its node.
        let page: Page = serde_json::from_str(
            r#"{"items": [{"name": "q", "leader": "rabbit@a", "node": "rabbit@a"},
                          {"name": "c", "node": "rabbit@b"}]}"#,
        )
        .unwrap();
        assert_eq!(page.items[0].leader_node(), Some("rabbit@a"));
        assert_eq!(page.items[1].leader_node(), Some("rabbit@b"));
    }
}
