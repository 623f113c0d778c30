//! What every handler shares.

use std::sync::Arc;
use std::time::Duration;

use super::chain_view::TopologyView;
use super::console::sessions::Sessions;
use super::limits;
use super::settings::HttpSettings;
use crate::auth::Authenticator;
use crate::ingress::RetryBook;
use crate::metrics::Metrics;
use crate::operations::OperatorSettings;
use crate::scheduler::Scheduler;

/// What every handler shares. Cloning is cheap.
#[derive(Clone)]
pub struct AppState {
    pub(super) scheduler: Scheduler,
    pub(super) metrics: Arc<Metrics>,
    pub(super) batch_limit: usize,
    pub(super) topology: Arc<TopologyView>,
    pub(super) auth: Arc<Authenticator>,
    pub(super) limits: limits::RequestLimits,
    pub(super) intake: limits::Intake,
    /// Per process: the console's form tokens are derived from it.
    pub(super) console_secret: [u8; 32],
    /// The console's signed-in sessions.
    pub(super) console_sessions: Arc<Sessions>,
    /// The API is served over HTTPS: the console's cookie is `Secure`.
    pub(super) https: bool,
    /// For operations that take a connection of their own (a requeue).
    pub(super) operator: Option<Arc<OperatorSettings>>,
    /// The retry policies in force, and their broker objects: none
    /// without the release stage.
    pub(super) retries: Option<Arc<RetryBook>>,
}

impl AppState {
    pub fn new(
        scheduler: Scheduler,
        metrics: Arc<Metrics>,
        http: &HttpSettings,
        auth: Arc<Authenticator>,
    ) -> Self {
        let topology = Arc::new(TopologyView::new(scheduler.cascade()));
        Self {
            scheduler,
            metrics,
            batch_limit: http.batch_limit,
            topology,
            auth,
            limits: limits::RequestLimits {
                body_read_timeout: Duration::from_millis(http.body_read_timeout_ms),
                body_max_bytes: http.body_limit_bytes,
                request_timeout: Duration::from_millis(http.request_timeout_ms),
            },
            intake: limits::Intake::new(http.max_tasks_in_flight),
            console_secret: rand::random(),
            console_sessions: Arc::default(),
            https: http.tls.enabled(),
            operator: None,
            retries: None,
        }
    }

    /// The retry policies `GET /v1/retries` shows.
    pub fn with_retries(mut self, retries: Option<Arc<RetryBook>>) -> Self {
        self.retries = retries;
        self
    }

    /// The settings operations (a requeue) act with.
    pub fn with_operator(mut self, operator: OperatorSettings) -> Self {
        self.operator = Some(Arc::new(operator));
        self
    }
}
