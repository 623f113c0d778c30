//! delayline: delayed delivery for RabbitMQ through a binary TTL cascade.
//!
//! # Layout
//!
//! One room per concern, listed from the top floor down: a room imports
//! only rooms listed after it, and no two files import each other, however
//! far apart. `tests/layout.rs` checks both, and each claim in bold below.
//! Each module's first lines say what it may touch.
//!
//! - [`cli`]: the command line. What each command takes (`args`), the
//!   run that loads the configuration and dispatches (`run`), the
//!   operator's commands, which call [`operations`] (`operator`), those
//!   that act through a running service's API (`api`), and what they print
//!   (`describe`).
//!   `main.rs` only calls [`cli::main`].
//! - [`service`]: three visible stages: builds each component from its own
//!   settings section, runs them (HTTP or HTTPS, an optional metrics
//!   listener, reloads on SIGHUP), and stops them in
//!   [`service::STOP_ORDER`], the order that loses nothing.
//! - [`remote`]: `delayline schedules`, which acts through a running
//!   service's API.
//! - [`testkit`]: what the integration tests and the benchmark share (a
//!   consumer stamping each arrival, the clock in microseconds, quantiles);
//!   the service does not use it.
//! - [`config`]: **where configuration is decided.** It gathers the
//!   sections (defaults, then a file, then the environment), applies the
//!   rules that span sections, and derives the settings made of several
//!   (the cascade with its release stage, the ingresses, the scheduler's
//!   timings, the operator's). Each section is defined, defaulted and
//!   validated by the room it configures, in that room's `settings.rs`
//!   (`cascade`, `broker`, `ledger`, `auth`, `http`, `scheduler`,
//!   `ingress`, `metrics`, `telemetry`). Nothing listed
//!   below imports it.
//! - [`http`]: the axum API, one module (and router) per resource: tasks in
//!   (`tasks`, with the batch's pure rules in `batch`), inspection,
//!   `changes` (cancel and move), `schedules` (recurring schedules),
//!   `release_limits` (pace, pause, hold by destination), `retry_policies`
//!   (retry policies set, changed and removed at run time), `forecast` (what
//!   falls due, per bucket), `bulk` (cancel or move by filter, and the
//!   operations that do it), the web
//!   `console` (server-rendered, one router and one layout for every page,
//!   reading the metrics registry rather than its text, signed in by cookie,
//!   same permissions),
//!   topology, health, the metrics scrape; the clients and certificate
//!   read again on SIGHUP and when their files change (`reload`); the gate
//!   in front of all but the
//!   probes (401/403/429); the JSON extractor; the error shape, every code
//!   one variant of `http::codes::ErrorCode` with its status and the
//!   API reference's words; the OpenAPI description, generated from the handlers'
//!   and types' annotations; its own accept loop and the bounds on what one
//!   client may hold. A request's instant is read here, once, and handed
//!   down. It calls the [`scheduler`], [`ingress`] for retry policies and
//!   parked messages (`retries`, the console's parked page), and, for a
//!   requeue, [`operations`];
//!   what it shows of the ledger and the broker (a stored task, a publish
//!   error) it names through the scheduler, which hands those types on.
//! - [`operations`]: the operator's commands as an application layer
//!   (provision and check, migrate-topology, requeue-unroutable,
//!   deprovision, a queue's wiring to the retries, reload, token create),
//!   each coordinating ledger and broker with
//!   the settings `config` hands it. Where migrate decides what to do with a task (its
//!   revision, whether it is still wanted): `operations::migrate`.
//! - [`ingress`]: AMQP ingresses speaking the `x-delayed-message` plugin's
//!   contract: an ingress's settings and broker objects, a message turned
//!   into a task or refused (`intake`, pure; the plugin's delay headers are
//!   read in [`message`]), and the consumer that takes messages in through
//!   the scheduler, acknowledging each once its task is committed
//!   (`intake_runner`); and retries: the policies and their refusals
//!   (`retry`, pure), which are in force together, the configuration's and
//!   those set at run time (`policy_set`, pure), kept fresh from the ledger
//!   on every replica (`policies`), the intake that schedules a dead-lettered message
//!   back to the queue it failed in after its backoff or parks it in the
//!   ledger (`retry_runner`); what both runners share (`consumer`: windows,
//!   the refused copy); and replaying or
//!   discarding parked messages (`parked`); whether a queue is wired to
//!   the retry exchange, judged from what the broker shows (`wiring`,
//!   pure).
//! - [`scheduler`]: takes a task in, in one of two modes fixed at start-up
//!   (stateless, or with a ledger, whose bookkeeper records every task,
//!   forwards pending ones, awaits late confirms, moves tasks and prunes,
//!   and publishes again what the release stage never saw a minute late);
//!   cancels tasks; keeps recurring schedules (`recurring`: changes
//!   withdrawing what was made) and plans them (`planner`: each occurrence
//!   a task a lead before its time, a page of schedules at a time, the lead
//!   following the load by `recurrence`'s `lead`);
//!   gives the tasks of a burst head starts through the levels (by
//!   [`chain`]); reads the forecast and keeps its per-minute
//!   counts folded (`forecast`); works bulk operations page by page under
//!   a lease (`bulk`); answers the API's questions on release limits
//!   (`limits`), readiness and inspection; and says, in one place, which
//!   background work runs and starts it (`background`), the release
//!   side's included.
//! - [`chain`]: the cascade at run time, its side of the seam a way of
//!   delaying meets (the Development page says what it owes): a burst's
//!   head starts through the levels (`burst`, by `cascade`'s `spread`),
//!   the level keepers, a probe through every level and the drain of a
//!   level that stopped dead-lettering (`strands`; the verdict, pure, is
//!   `cascade`'s `strand`, the probe's message `message`'s `probe`), told what reaches the release stage through
//!   `release::ArrivalWatch`, and what a lost node's levels may have lost,
//!   published again (`failover`, by `cascade`'s `loss`). The control
//!   plane above and beside it names none of the cascade's internals.
//! - [`release`]: the release side, from a due message leaving the cascade
//!   to its destination. The release stage consumes the release queue,
//!   holds a due task to its millisecond (`hold`: when to release, by
//!   bounding other replicas' clocks from what arrives, pure), stages in
//!   the ledger what arrives well before its time, and looks every due
//!   task up in the ledger before it goes on (`stage`; its verdicts per
//!   message are pure functions); the staged release lets staged tasks go
//!   at their moments (`staged`); the limiter releases what waits for a
//!   release limit in due order as the limits allow (`limiter`, by
//!   `limit_view`, what this replica knows of them); all three publish
//!   through one `publisher`; the unroutable watch (`unroutable`).
//!   `side` builds them from the handles they share; what arrives is told
//!   to the way of delaying (`watch`). It sees the broker
//!   through the [`release::Broker`] port (publishing, and consuming a
//!   queue as [`broker::Windows`]), which tests replace.
//! - [`metrics`]: the Prometheus registry, and the poller that reads queue
//!   depths into it.
//! - [`ledger`]: the task ledger (sqlx; SQLite by default, PostgreSQL for
//!   replicas). **Where a task's state changes:** the text of every
//!   statement on tasks is in `ledger/sql.rs`, and nowhere else; `mod.rs`
//!   only declares. One operation in one place: the writer task's group
//!   commit (`writer`), a group's transaction per backend (`transaction`),
//!   its steps `admit`, `claim` and the planner's pages (`plan`), cancel
//!   and move (`change`), what the
//!   release stage records (`release`), staged tasks (`staged`), reads and sweeps (`tasks`),
//!   recurring schedules (`schedules`, each change guarded by the revision
//!   read, the one file that writes the schedules table but for the
//!   planner's steps, written with their tasks in the group commit), the
//!   messages retry policies parked (`parked`, the one file that writes
//!   that table). Whether there is
//!   a ledger at all is decided once, by `ledger::StoreSettings`. Its rows
//!   stay inside; it hands out [`ledger::StoredTask`].
//! - [`broker`]: an adapter to RabbitMQ. Connecting (to the first of a
//!   cluster's nodes that answers), declaring the plan (with a full diagnosis
//!   when the broker holds something else), publishing a message it is given
//!   (confirms, pipelining, reconnection, bounded waits, isolation of a
//!   suspect message), over TLS when asked, consuming a queue in windows,
//!   reading queue depths, moving a chain's messages (survey, drain, move,
//!   delete), requeueing the unroutable queue, looking at and deleting
//!   named objects (`deprovision`). It knows nothing of tasks or
//!   ledgers: what becomes of a task is decided above it.
//! - [`recurrence`]: recurring schedules, pure. A schedule as a client states
//!   it, validated (its content by a task's rules); when it fires (a cron
//!   expression in an IANA zone, by `croner` and `jiff` with the zone
//!   database compiled in, or a fixed interval); each occurrence's task id
//!   and body; what the planner does with missed occurrences; how far ahead
//!   it plans an instant many schedules share (`lead`).
//! - [`limit`]: release limits, pure. A limit as a client states it
//!   (destinations by pattern, a rate with a burst, a pause, a bound on a
//!   consumer queue's depth), validated; its token bucket; why it holds;
//!   which waiting tasks one pass of the limiter lets go, in due order.
//! - [`forecast`]: what falls due, pure. A forecast's window and buckets
//!   (whole minutes, the grain of the ledger's counts) as a client asks,
//!   checked; the ledger's per-minute counts summed into its buckets.
//! - [`bulk`]: changes in bulk, pure. A filter over tasks and an action
//!   (cancel, move by a shift or to a time), checked; which tasks match,
//!   their new due times, and how a task left unchanged is counted.
//! - [`task`]: a task, pure. **Where a task is made:** `Task::new` alone,
//!   from what an entry point decided (`TaskParts`) and where and when it
//!   goes (`Itinerary`: the route, the shard its id picks, its due time,
//!   decided there for every entry point); a task as submitted over HTTP,
//!   validated (`request`); why one is refused (`error`). The instant is
//!   an argument.
//! - [`message`]: **where headers are decided:** the message format, pure.
//!   Every header name delayline writes or reads is in `message/headers.rs`
//!   (no other file names one), a task's message is built from what the
//!   task hands it ([`message::TaskMessage`]) and read back (its id,
//!   revision, due time, destination, hold stamp), and which of the
//!   broker's headers a republished message leaves behind.
//! - [`auth`]: who may do what. Clients (from the configuration and a
//!   clients file read again on SIGHUP or a change), tokens known only by their SHA-256,
//!   destination topic patterns, permissions, rate limits and quotas. No
//!   HTTP and no broker; the one I/O is reading the clients file.
//! - [`telemetry`], [`probe`]: logs, and the health check that containers
//!   run. Telemetry also makes the spans of a traced task's life (`spans`:
//!   which phases, their times and ids, children of the producer's trace
//!   context, pure; the `traceparent` rules are its) and sends them to an
//!   OpenTelemetry collector (`otlp`, off unless configured); the scheduler
//!   records a task's acceptance, the release side its delay, hold and
//!   delivery, the retry intake a parked message.
//! - [`stop`]: a stop that ends in bounded time: the `[stop]` section, and
//!   waiting for named background work until a deadline, naming what was
//!   still running when it passed.
//! - [`clock`]: **where time is read and written.** This process's wall
//!   clock (due times) and its named monotonic clock (holds), read here
//!   and nowhere else, and time as delayline writes it (epoch
//!   milliseconds, RFC 3339).
//! - [`secret`]: settings that carry a password, and URIs shown without it.
//! - [`cascade`]: the algorithm as pure logic. Settings and their limits,
//!   the routing key of a delay, the entry exchange, and the topology plan
//!   as data (shared by the provisioner, `--dry-run` and the routing
//!   simulator), the verdicts on stranded levels (`strand`), the due
//!   times a failover makes suspect (`loss`), and which wait a task of a
//!   burst takes (`spread`). No I/O; proven exhaustively
//!   and with property tests.
//!
//! The public surface is what the binary, the integration tests and the
//! benchmark use: the rooms they reach are `pub`, the others (`http`,
//! `metrics`, `operations`, `recurrence`, `remote`, `probe`, `telemetry`)
//! `pub(crate)`, and a folder's `mod.rs` hands on publicly only the names
//! used outside the crate (the rest `pub(crate)`, or `cfg(test)` where
//! only the crate's own tests use them). No product function is longer
//! than a screen (`tests/layout.rs`). Tests of the untrusted-input parsers with arbitrary input
//! (property-based fuzzing) are in `fuzz.rs`, compiled for tests only.

pub mod auth;
pub mod broker;
pub mod bulk;
pub mod cascade;
pub(crate) mod chain;
pub mod cli;
pub mod clock;
pub mod config;
pub mod forecast;
#[cfg(test)]
mod fuzz;
pub(crate) mod http;
pub mod ingress;
pub mod ledger;
pub mod limit;
pub mod message;
pub(crate) mod metrics;
pub(crate) mod operations;
pub(crate) mod probe;
pub(crate) mod recurrence;
pub mod release;
pub(crate) mod remote;
pub mod scheduler;
pub mod secret;
pub mod service;
pub mod stop;
pub mod task;
pub(crate) mod telemetry;
pub mod testkit;
