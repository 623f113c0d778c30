//! What this replica knows of the release limits: the limits as last read,
//! their queues' depths, the destinations whose tasks wait. Shared by the
//! release stage (which hands a due task a limit matches to the ledger),
//! the limiter (which fills it and releases by it) and the API (which shows
//! why each limit holds).

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::{Arc, RwLock};

use tokio::sync::Notify;

use crate::ledger::{PassInput, StoredLimit, StoredTask};
use crate::limit::{Depth, Hold, waiting_per_limit};
use crate::metrics::{LimitLabel, Metrics};

/// The span the release rate is measured over.
const RATE_SPAN_MS: u64 = 10_000;

/// What the limiter knows, shared with the release stage (which hands it
/// what a limit matches) and the API (which shows why each limit holds).
#[derive(Clone, Default)]
pub(crate) struct LimitsView {
    view: Arc<RwLock<View>>,
    /// Wakes the limiter: tasks wait, or a limit changed.
    pub(super) wake: Arc<Notify>,
}

#[derive(Default)]
pub(super) struct View {
    pub limits: Vec<StoredLimit>,
    /// Ready messages per queue a limit bounds, as last read.
    pub depths: HashMap<String, Depth>,
    /// Tasks this replica released since each queue's depth was read: in
    /// the queue too, as far as the bound is concerned.
    pub released_since_read: HashMap<String, u64>,
    /// Destinations with waiting tasks.
    pub destinations: Vec<String>,
    /// Each limit's `released` count, as read at each refresh.
    history: VecDeque<(u64, BTreeMap<String, u64>)>,
}

/// A limit, and what it holds now.
#[derive(Clone, Debug)]
pub struct LimitStatus {
    pub stored: StoredLimit,
    pub waiting: u64,
    pub oldest_waiting_ms: Option<u64>,
    /// Why it holds tasks now (`None`: it does not).
    pub holds: Option<Hold>,
    /// Tasks a second it released over the last ten seconds (every replica).
    pub release_rate: f64,
    pub queue_depth: Option<Depth>,
}

impl LimitsView {
    pub(super) fn read(&self) -> std::sync::RwLockReadGuard<'_, View> {
        self.view
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    pub(super) fn write(&self) -> std::sync::RwLockWriteGuard<'_, View> {
        self.view
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The limit a due task for `destination` waits for (the first by
    /// name that matches), if any does.
    pub fn limit_for(&self, destination: &str) -> Option<String> {
        self.read()
            .limits
            .iter()
            .find(|l| l.limit.matches(destination))
            .map(|l| l.limit.name.clone())
    }

    /// Tasks for `destination` now wait: the limiter looks at once.
    pub fn now_waiting(&self, destination: &str) {
        {
            let mut view = self.write();
            if !view.destinations.iter().any(|d| d == destination) {
                view.destinations.push(destination.to_owned());
            }
        }
        self.wake.notify_one();
    }

    /// Nothing waits for `drained` any more (a pass released all): a
    /// claim for them may let its tasks go at once again without waiting
    /// for the next read of the ledger. A claim that holds one again says
    /// so ([`Self::now_waiting`]); one that held it in between is found by
    /// that read (every [`super::limiter`] refresh).
    pub(super) fn drained(&self, drained: &[String]) {
        if !drained.is_empty() {
            self.write().destinations.retain(|d| !drained.contains(d));
        }
    }

    /// The limits changed (here): taken as they are now, and the limiter
    /// looks at once.
    pub fn changed(&self, limits: Vec<StoredLimit>) {
        self.write().limits = limits;
        self.wake.notify_one();
    }

    /// `queue`'s depth, as just read.
    pub(crate) fn saw_depth(&self, queue: &str, depth: Depth) {
        self.write().depths.insert(queue.to_owned(), depth);
    }

    /// Per limit that caps its releases now, how many it may release: 0
    /// while closed (paused, its queue too deep), and below a queue's
    /// bound the room left, counting what was released since the depth was
    /// read.
    pub(super) fn caps(&self, now_ms: u64) -> HashMap<String, u64> {
        let view = self.read();
        view.limits
            .iter()
            .filter_map(|l| {
                let bound = l.limit.depth.as_ref();
                let depth = bound.and_then(|d| view.depths.get(&d.queue)).copied();
                let cap = if l.limit.closed(now_ms, depth).is_some() {
                    0
                } else {
                    let bound = bound?;
                    let Some(Depth::Ready(ready)) = depth else {
                        return Some((l.limit.name.clone(), 0));
                    };
                    let since = view.released_since_read.get(&bound.queue).copied();
                    bound.messages.saturating_sub(ready + since.unwrap_or(0))
                };
                Some((l.limit.name.clone(), cap))
            })
            .collect()
    }

    /// What one of the limiter's passes gives the release stage to claim
    /// with: the limits let a claimed task go at once only as a pass would.
    pub(super) fn pass_input(&self, now_ms: u64) -> PassInput {
        let caps = self.caps(now_ms);
        PassInput {
            now_ms,
            lease_until_ms: now_ms,
            destinations: self.read().destinations.clone(),
            caps,
            most: usize::MAX,
        }
    }

    /// `released` went to their queues: counted against the bounds until
    /// the depths are read again.
    pub(super) fn count_released(&self, released: &[StoredTask]) {
        let destinations: Vec<&str> = released.iter().map(|t| t.destination.as_str()).collect();
        self.count_released_to(&destinations);
    }

    /// Tasks the release stage's claim let go at once, to `destinations`:
    /// counted as [`Self::count_released`] counts the limiter's, and in
    /// each matching limit's released metric.
    pub(super) fn released_straight(&self, destinations: &[&str], metrics: &Metrics) {
        self.count_released_to(destinations);
        for limit in &self.read().limits {
            let count = destinations
                .iter()
                .filter(|d| limit.limit.matches(d))
                .count();
            if count > 0 {
                let label = LimitLabel {
                    limit: limit.limit.name.clone(),
                };
                metrics
                    .limit_released
                    .get_or_create(&label)
                    .inc_by(count as u64);
            }
        }
    }

    fn count_released_to(&self, destinations: &[&str]) {
        let mut view = self.write();
        let queues: Vec<(String, u64)> = view
            .limits
            .iter()
            .filter_map(|l| {
                let bound = l.limit.depth.as_ref()?;
                let count = destinations.iter().filter(|d| l.limit.matches(d)).count() as u64;
                Some((bound.queue.clone(), count))
            })
            .collect();
        for (queue, count) in queues {
            *view.released_since_read.entry(queue).or_default() += count;
        }
    }

    /// Whether a pass could release anything: some destination waits that
    /// no closed limit matches and whose paced limits have a token by now
    /// (as last read; another replica may have taken it).
    pub(super) fn worth_a_pass(&self, now_ms: u64) -> bool {
        let caps = self.caps(now_ms);
        let view = self.read();
        view.destinations.iter().any(|destination| {
            view.limits
                .iter()
                .filter(|l| l.limit.matches(destination))
                .all(|l| {
                    let open = caps.get(&l.limit.name) != Some(&0);
                    let token = match (l.limit.rate, l.bucket) {
                        (Some(rate), Some(bucket)) => bucket.refill(rate, now_ms).available() > 0,
                        _ => true,
                    };
                    open && token
                })
        })
    }

    /// Each limit with what it holds now: `per_destination` are the waiting
    /// tasks counted per destination.
    pub fn status(
        &self,
        limits: Vec<StoredLimit>,
        per_destination: &[(String, u64, u64)],
        now_ms: u64,
    ) -> Vec<LimitStatus> {
        let plain: Vec<_> = limits.iter().map(|l| l.limit.clone()).collect();
        let waiting = waiting_per_limit(&plain, per_destination);
        let view = self.read();
        limits
            .into_iter()
            .map(|stored| {
                let (count, oldest) = waiting.get(&stored.limit.name).copied().unwrap_or_default();
                let queue_depth = stored
                    .limit
                    .depth
                    .as_ref()
                    .and_then(|d| view.depths.get(&d.queue).copied());
                let holds = stored
                    .limit
                    .closed(now_ms, queue_depth)
                    .or_else(|| (count > 0 && stored.limit.rate.is_some()).then_some(Hold::Rate));
                LimitStatus {
                    release_rate: view.rate(&stored.limit.name),
                    stored,
                    waiting: count,
                    oldest_waiting_ms: oldest,
                    holds,
                    queue_depth,
                }
            })
            .collect()
    }
}

impl View {
    /// Released a second by `name` over the span of the history kept.
    fn rate(&self, name: &str) -> f64 {
        let (Some((first_ms, first)), Some((last_ms, last))) =
            (self.history.front(), self.history.back())
        else {
            return 0.0;
        };
        let span_ms = last_ms.saturating_sub(*first_ms);
        if span_ms == 0 {
            return 0.0;
        }
        let released = last.get(name).copied().unwrap_or(0);
        let before = first.get(name).copied().unwrap_or(released);
        released.saturating_sub(before) as f64 * 1000.0 / span_ms as f64
    }

    pub(super) fn record(&mut self, now_ms: u64) {
        let counts = self
            .limits
            .iter()
            .map(|l| (l.limit.name.clone(), l.released))
            .collect();
        self.history.push_back((now_ms, counts));
        while self
            .history
            .front()
            .is_some_and(|(at, _)| at + RATE_SPAN_MS < now_ms)
        {
            self.history.pop_front();
        }
    }
}
