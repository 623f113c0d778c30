//! The ledger's SQL text, every statement in one place. Both backends are
//! built the same text: `$N` placeholders, nothing either dialect lacks;
//! the writer's SQLite connection (rusqlite) gets it through [`for_sqlite`],
//! sqlx takes `$N` as it is. Pure string building, checked
//! without a database (and, for the statements by id, against SQLite's
//! query plans). Statements over many ids come in a few fixed sizes
//! ([`statement_sized_chunks`]).

use super::filter::{TaskFilter, is_rare};
use super::record::{COLUMNS, INSERT_COLUMNS};
use crate::task::TaskState;

/// The statement SQLite is given: every `$N` becomes `?N`, SQLite's
/// parameter number N, so that the same text binds the same way on both
/// backends and a parameter is bound by its number, never looked up by name.
///
/// Why not the name: SQLite finds a parameter's name by walking a list of
/// all of them, so binding a 64-row insert (over a thousand parameters) by
/// name took quadratic time, about a tenth of the service's CPU under load.
pub fn for_sqlite(sql: &str) -> String {
    sql.replace('$', "?")
}

/// `$first, $first+1, …` for `count` parameters.
pub fn placeholders(first: usize, count: usize) -> String {
    (first..first + count)
        .map(|n| format!("${n}"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// Inserts `rows` new rows (every column of [`INSERT_COLUMNS`], in
/// order, row after row) and returns the ids it inserted; a row whose id
/// or idempotency key is taken is skipped, not an error.
pub fn insert(rows: usize) -> String {
    format!("{} RETURNING id", insert_skipping_taken(rows))
}

/// Inserts one new row, skipped if its id or idempotency key is taken;
/// returns nothing (SQLite's count of changed rows tells whether it went
/// in, without the table a `RETURNING` builds each time it runs).
pub fn insert_one() -> String {
    insert_skipping_taken(1)
}

fn insert_skipping_taken(rows: usize) -> String {
    let width = INSERT_COLUMNS.len();
    let values = (0..rows)
        .map(|row| format!("({})", placeholders(1 + row * width, width)))
        .collect::<Vec<_>>()
        .join(", ");
    format!(
        "INSERT INTO tasks ({}) VALUES {values} ON CONFLICT DO NOTHING",
        INSERT_COLUMNS.join(", ")
    )
}

/// `((id = $first AND revision = $first+1) OR …)` for `pairs` pairs.
/// Not `(id, revision) IN (VALUES …)`: SQLite scans the whole table for
/// that, where each term of the OR is a primary-key lookup.
pub fn id_revision_pairs(first: usize, pairs: usize) -> String {
    let terms = (0..pairs)
        .map(|pair| {
            let id = first + 2 * pair;
            format!("(id = ${id} AND revision = ${})", id + 1)
        })
        .collect::<Vec<_>>()
        .join(" OR ");
    format!("({terms})")
}

/// Keeps the first `$copy` bytes of the payload (none when `$copy` is 0);
/// SQLite's `substr` and PostgreSQL's on `bytea` both count bytes.
fn trimmed_payload(copy: usize) -> String {
    format!("payload = CASE WHEN ${copy} = 0 THEN NULL ELSE substr(payload, 1, ${copy}) END")
}

/// Marks pending tasks scheduled at `$1`, each only in the revision
/// given (a task moved since waits for its new copy's confirm); with
/// `trim`, keeps `$2` bytes of the payload. The `(id, revision)` pairs
/// are `$3…`.
pub fn mark_published(pairs: usize, trim: bool) -> String {
    let payload = if trim {
        format!(", {}", trimmed_payload(2))
    } else {
        // $2 is bound either way, so that the parameters keep their numbers.
        ", payload = CASE WHEN $2 < 0 THEN NULL ELSE payload END".to_owned()
    };
    format!(
        "UPDATE tasks SET state = 'scheduled', last_error = NULL, published_at_ms = $1{payload} \
         WHERE state = 'pending' AND {}",
        id_revision_pairs(3, pairs)
    )
}

/// Marks releasing tasks delivered at `$1`, keeping `$2` bytes of the
/// payload; the ids are `$3…`. A task the release stage claimed while
/// still pending (its confirm not yet recorded) carries the error of an
/// earlier attempt: delivered, it has none. Returns each one's due time
/// and destination: it leaves the forecast's count.
pub fn mark_delivered(ids: usize) -> String {
    format!(
        "UPDATE tasks SET state = 'delivered', delivered_at_ms = $1, last_error = NULL, {} \
         WHERE state = 'releasing' AND id IN ({}) RETURNING deliver_at_ms, destination",
        trimmed_payload(2),
        placeholders(3, ids)
    )
}

/// Whether any task still `scheduled` fell due in [`$1`, `$2`): a read,
/// so that the resender takes no write lock (which the group writer needs)
/// unless there is something to write.
/// With `$3` above 0, only tasks whose routing key has a `1` at character
/// `$3`: those that passed one level (a stranded one).
pub const ANY_UNRELEASED: &str = "SELECT id FROM tasks \
     WHERE state = 'scheduled' AND deliver_at_ms >= $1 AND deliver_at_ms < $2 \
     AND ($3 = 0 OR substr(routing_key, $3, 1) = '1') LIMIT 1";

/// Tasks still `scheduled` whose due time is in [`$3`, `$4`): pending
/// again from `$1`, with `$2` as their last error. By the due-time index:
/// only the tasks due in that span are read.
pub const RESEND_UNRELEASED: &str = "UPDATE tasks SET state = 'pending', \
     next_attempt_at_ms = $1, last_error = $2 \
     WHERE state = 'scheduled' AND deliver_at_ms >= $3 AND deliver_at_ms < $4 \
     AND ($5 = 0 OR substr(routing_key, $5, 1) = '1') RETURNING id";

/// The key (`$1`) revision `$3` of pending task `$2` is about to be
/// published with: the forwarder routes a task by what remains of its
/// delay, and the resend of a stranded level's tasks picks them by the
/// levels their key passes.
pub const RECORD_ROUTE: &str = "UPDATE tasks SET routing_key = $1 \
     WHERE id = $2 AND revision = $3 AND state = 'pending'";

/// A pending task tried again from `$1` (or leased until then, by `$7`).
pub const SCHEDULE_RETRY: &str = "UPDATE tasks SET next_attempt_at_ms = $1, last_error = $2, \
     publish_alone = CASE WHEN $3 = 1 THEN 1 ELSE publish_alone END, \
     refusals = refusals + $4, leased_by = $7 \
     WHERE id = $5 AND revision = $6 AND state = 'pending'";

/// Quarantines a task (in revision `$3`, or any when NULL), first if
/// pending (the count of pending tasks changes), else if scheduled (a
/// migration set its message aside). Returns its due time and destination:
/// it leaves the forecast's count.
pub const FAIL_PENDING: &str = "UPDATE tasks SET state = 'failed', last_error = $1 \
     WHERE id = $2 AND ($3 IS NULL OR revision = $3) AND state = 'pending' \
     RETURNING deliver_at_ms, destination";
pub const FAIL_SCHEDULED: &str = "UPDATE tasks SET state = 'failed', last_error = $1 \
     WHERE id = $2 AND ($3 IS NULL OR revision = $3) AND state = 'scheduled' \
     RETURNING deliver_at_ms, destination";

/// Claims `(id, revision)` pairs (`$1…`) of tasks matching `from`: `releasing`.
/// Returns each claimed pair: one window may carry two revisions of a task
/// (a copy of the old one late, the new one on time), and only the pair
/// that matched is claimed; with its due time and destination, for the
/// forecast's count when it was not counted before.
pub fn claim(from: &str, pairs: usize) -> String {
    format!(
        "UPDATE tasks SET state = 'releasing' WHERE {from} AND {} \
         RETURNING id, revision, deliver_at_ms, destination",
        id_revision_pairs(1, pairs)
    )
}

/// The state and revision of `ids` tasks (`$1…`).
pub fn states(ids: usize) -> String {
    format!(
        "SELECT id, state, revision FROM tasks WHERE id IN ({})",
        placeholders(1, ids)
    )
}

pub fn holder_by_key() -> String {
    format!("SELECT {COLUMNS} FROM tasks WHERE idempotency_key = $1")
}

pub fn holder_by_id() -> String {
    format!("SELECT {COLUMNS} FROM tasks WHERE id = $1")
}

/// Largest rows per statement. Statements come in a few fixed sizes (this and
/// the powers of two below it) so that each is prepared once and then reused
/// from the statement cache, instead of one new statement per group size.
/// 64 rows of 18 parameters stay far below both backends' limits.
const CHUNK: usize = 64;
// Both backends cap a statement's parameters; SQLite's default is 32,766.
const _: () = assert!(CHUNK * INSERT_COLUMNS.len() < 32_766);

pub fn statement_sized_chunks<T>(items: &[T]) -> Vec<&[T]> {
    let mut chunks = Vec::new();
    let mut rest = items;
    while !rest.is_empty() {
        let size = if rest.len() >= CHUNK {
            CHUNK
        } else {
            1 << rest.len().ilog2()
        };
        let (chunk, tail) = rest.split_at(size);
        chunks.push(chunk);
        rest = tail;
    }
    chunks
}

/// With `scoped`, only the tasks of the client `$3` are touched.
pub fn cancel(ids: usize, scoped: bool) -> String {
    let (owner, first_id) = if scoped {
        (" AND client = $3", 4)
    } else {
        ("", 3)
    };
    format!(
        "UPDATE tasks SET state = 'cancelled', cancelled_at_ms = $1 \
         WHERE state = $2{owner} AND id IN ({}) RETURNING {COLUMNS}",
        placeholders(first_id, ids)
    )
}

/// Every task in state `$2` cancelled at `$1` (a chain deleted with what
/// it held).
pub const CANCEL_IN_STATE: &str =
    "UPDATE tasks SET state = 'cancelled', cancelled_at_ms = $1 WHERE state = $2";

pub fn select(ids: usize) -> String {
    format!(
        "SELECT {COLUMNS} FROM tasks WHERE id IN ({})",
        placeholders(1, ids)
    )
}

/// A new revision, pending and leased (to `$8`), with its deadline moved
/// (`$9`), only from `$6` and only while the whole payload is kept (the
/// new copy is built from it).
pub const MOVE: &str = "UPDATE tasks SET revision = revision + 1, deliver_at_ms = $1, delay_ms = $2, \
     routing_key = $3, next_attempt_at_ms = $4, leased_by = $8, deadline_ms = $9, \
     state = 'pending', \
     attempts = attempts + 1, \
     last_error = NULL, published_at_ms = NULL, publish_alone = 0, refusals = 0, held_by = NULL, \
     release_at_ms = NULL \
     WHERE id = $5 AND state = $6 AND payload IS NOT NULL AND length(payload) = payload_bytes \
     AND ($7 IS NULL OR client = $7)";

pub const RECORD_CHANGE: &str = "INSERT INTO task_changes (idempotency_key, task_id, fingerprint, \
     created_at_ms) VALUES ($1, $2, $3, $4) ON CONFLICT DO NOTHING RETURNING idempotency_key";

pub const FIND_CHANGE: &str =
    "SELECT task_id, fingerprint FROM task_changes WHERE idempotency_key = $1";

/// Claimed tasks (ids `$2…`) held by limit `$1`: they wait in the ledger.
pub fn hold_releasing(ids: usize) -> String {
    format!(
        "UPDATE tasks SET state = 'waiting', held_by = $1, next_attempt_at_ms = 0, \
         release_at_ms = NULL WHERE state = 'releasing' AND id IN ({})",
        placeholders(2, ids)
    )
}

/// Waiting tasks (ids `$3…`) released by the limiter, leased until `$1`
/// to `$2`.
pub fn release_waiting(ids: usize) -> String {
    format!(
        "UPDATE tasks SET state = 'releasing', next_attempt_at_ms = $1, leased_by = $2 \
         WHERE state = 'waiting' AND id IN ({}) RETURNING {COLUMNS}",
        placeholders(3, ids)
    )
}

/// Tasks the limiter released (ids `$1…`) whose publish failed: waiting again.
pub fn wait_again(ids: usize) -> String {
    format!(
        "UPDATE tasks SET state = 'waiting', next_attempt_at_ms = 0 \
         WHERE state = 'releasing' AND held_by IS NOT NULL AND id IN ({})",
        placeholders(1, ids)
    )
}

/// Tasks the limiter released whose lease ran out before `$1` (the replica
/// died before marking them delivered): waiting again.
pub const RETURN_EXPIRED_LEASES: &str = "UPDATE tasks SET state = 'waiting', \
     next_attempt_at_ms = 0 \
     WHERE state = 'releasing' AND held_by IS NOT NULL AND next_attempt_at_ms < $1";

/// Whether any task the limiter released has a lease that ran out before
/// `$1`: a read, so that no write lock is taken unless there is one.
pub const ANY_EXPIRED_LEASE: &str = "SELECT id FROM tasks \
     WHERE state = 'releasing' AND held_by IS NOT NULL AND next_attempt_at_ms < $1 LIMIT 1";

/// A claimed task (`$2`) staged until `$1` by the process `$3`: it waits
/// in the ledger alone, so only while the ledger holds its whole payload (a
/// task published by a chain without a release stage kept only a copy of
/// its start).
pub const STAGE_RELEASING: &str = "UPDATE tasks SET state = 'staged', release_at_ms = $1, \
     staged_by = $3, next_attempt_at_ms = 0 WHERE state = 'releasing' AND id = $2 \
     AND payload IS NOT NULL AND length(payload) = payload_bytes";

/// Every staged task pending from `$1`, to be published again by what
/// remains of its delay (a chain without a release stage cannot release
/// it from the ledger).
pub const FORWARD_STAGED: &str = "UPDATE tasks SET state = 'pending', next_attempt_at_ms = $1, \
     release_at_ms = NULL WHERE state = 'staged'";

/// The earliest moment a staged task is released, of any process's.
pub const NEXT_STAGED: &str = "SELECT MIN(release_at_ms) FROM tasks WHERE state = 'staged'";

/// The earliest moment a task process `$1` staged is released.
pub const NEXT_OWN_STAGED: &str =
    "SELECT MIN(release_at_ms) FROM tasks WHERE state = 'staged' AND staged_by = $1";

/// Takes up to `$3` staged tasks whose moment is by `$1` (staged by the
/// process `$4`) or by `$5` (staged by another, whose clock may be
/// ahead), in release order (then admission order: a take's rows share
/// the table's pages), leased until `$2` to `$6`. The condition is repeated
/// outside the subquery so that, on PostgreSQL, a replica that waited for
/// another replica's take re-checks it and skips what was just taken.
pub fn unstage() -> String {
    let due = "release_at_ms <= $1 AND (staged_by = $4 OR release_at_ms <= $5)";
    format!(
        "UPDATE tasks SET state = 'releasing', next_attempt_at_ms = $2, leased_by = $6 \
         WHERE state = 'staged' AND {due} AND id IN ( \
             SELECT id FROM tasks WHERE state = 'staged' AND {due} \
             ORDER BY release_at_ms, created_at_ms, id LIMIT $3) \
         RETURNING {COLUMNS}"
    )
}

/// Tasks the staged release took (ids `$1…`) whose publish failed: staged
/// again, released on the next take.
pub fn stage_again(ids: usize) -> String {
    format!(
        "UPDATE tasks SET state = 'staged', next_attempt_at_ms = 0 \
         WHERE state = 'releasing' AND release_at_ms IS NOT NULL AND held_by IS NULL \
         AND id IN ({})",
        placeholders(1, ids)
    )
}

/// Whether any task is under a lease that ends after `$1` (pending, or
/// taken by the limiter or the staged release): a read, so that a start
/// with nothing to take over takes no write lock.
pub const ANY_LEASE: &str = "SELECT id FROM tasks \
     WHERE (state = 'pending' OR state = 'releasing') AND next_attempt_at_ms > $1 LIMIT 1";

/// Pending tasks leased before `$1` (by a process that stopped: see
/// `Ledger::end_leases_of_a_stopped_process`): due for the forwarder now.
pub const END_PENDING_LEASES: &str = "UPDATE tasks SET next_attempt_at_ms = 0 \
     WHERE state = 'pending' AND next_attempt_at_ms > 0 AND next_attempt_at_ms < $1";

/// Whether any task is staged by a process other than `$1`: a read, so
/// that a start with nothing to take over takes no write lock.
pub const ANY_STAGED_BY_ANOTHER: &str =
    "SELECT id FROM tasks WHERE state = 'staged' AND staged_by <> $1 LIMIT 1";

/// Every staged task becomes process `$1`'s (SQLite's start: the process
/// that staged them stopped).
pub const ADOPT_STAGED: &str =
    "UPDATE tasks SET staged_by = $1 WHERE state = 'staged' AND staged_by <> $1";

/// Tasks the staged release took whose lease ran out before `$1` (the
/// replica died before marking them delivered): staged again.
pub const RETURN_EXPIRED_STAGES: &str = "UPDATE tasks SET state = 'staged', \
     next_attempt_at_ms = 0 \
     WHERE state = 'releasing' AND release_at_ms IS NOT NULL AND held_by IS NULL \
     AND next_attempt_at_ms < $1";

/// Whether any task the staged release took has a lease that ran out
/// before `$1`: a read, so that no write lock is taken unless there is one.
pub const ANY_EXPIRED_STAGE: &str = "SELECT id FROM tasks \
     WHERE state = 'releasing' AND release_at_ms IS NOT NULL AND held_by IS NULL \
     AND next_attempt_at_ms < $1 LIMIT 1";

/// Waiting tasks per destination: how many, and the earliest due time.
pub const WAITING_PER_DESTINATION: &str = "SELECT destination, COUNT(*), MIN(deliver_at_ms) \
     FROM tasks WHERE state = 'waiting' GROUP BY destination";

/// Up to `$3` waiting tasks of destination `$1` due by `$2`, in due order.
pub const WAITING_OF_DESTINATION: &str = "SELECT id, deliver_at_ms FROM tasks \
     WHERE state = 'waiting' AND destination = $1 AND deliver_at_ms <= $2 \
     ORDER BY deliver_at_ms, id LIMIT $3";

/// Statements of `superseded`, `mark_unroutable` and `requeue_unroutable`.
pub const SUPERSEDED: &str =
    "SELECT id, state, revision FROM tasks WHERE state = 'cancelled' OR revision > 1";
pub const MARK_UNROUTABLE: &str = "UPDATE tasks SET state = 'unroutable', \
     delivered_at_ms = COALESCE(delivered_at_ms, $3) \
     WHERE id = $1 AND revision = $2 AND state IN ('releasing', 'delivered')";
/// Task `$3` in revision `$4`, whose deadline passed before it was
/// published to its destination: `expired` at `$1`, with why (`$2`), from
/// any state on its way (never from one it reached: delivered, cancelled).
/// Its whole payload stays: an expired task may be replayed.
pub const MARK_EXPIRED: &str = "UPDATE tasks SET state = 'expired', expired_at_ms = $1, \
     last_error = $2, next_attempt_at_ms = 0 \
     WHERE id = $3 AND revision = $4 AND (state = 'pending' OR state = 'scheduled' \
     OR state = 'releasing' OR state = 'waiting' OR state = 'staged')";

/// Whether any waiting task's deadline passed before `$1`: a read, so that
/// the limiter's sweep takes no write lock (which the group writer needs)
/// unless there is something to write.
pub const ANY_WAITING_PAST_DEADLINE: &str = "SELECT id FROM tasks \
     WHERE state = 'waiting' AND deadline_ms IS NOT NULL AND deadline_ms < $1 LIMIT 1";

/// Waiting tasks whose deadline passed before `$1` (their limit paused, or
/// its backlog too long), and whose message goes nowhere else: `expired`
/// then, by the index of waiting tasks' deadlines. Returns each one's limit.
pub const EXPIRE_WAITING: &str = "UPDATE tasks SET state = 'expired', expired_at_ms = $1, \
     last_error = 'its deadline passed while it waited for release limit ' || \
     COALESCE(held_by, '?') \
     WHERE state = 'waiting' AND deadline_ms IS NOT NULL AND deadline_ms < $1 \
     AND expired_destination IS NULL \
     RETURNING held_by";

/// At most `$4` waiting tasks whose deadline passed before `$1` and whose
/// message goes to an expired destination: taken (`releasing`, leased
/// until `$2` to `$3`, as the limiter's releases are) for it to be sent
/// there.
pub fn take_waiting_past_deadline() -> String {
    format!(
        "UPDATE tasks SET state = 'releasing', next_attempt_at_ms = $2, leased_by = $3 \
         WHERE state = 'waiting' AND id IN ( \
             SELECT id FROM tasks WHERE state = 'waiting' AND deadline_ms IS NOT NULL \
             AND deadline_ms < $1 AND expired_destination IS NOT NULL LIMIT $4) \
         RETURNING {COLUMNS}"
    )
}

/// A requeued task counts as delivered when it is requeued: the moment it
/// was released into the unroutable queue was no delivery.
pub const REQUEUE_UNROUTABLE: &str =
    "UPDATE tasks SET state = 'delivered', delivered_at_ms = $1 WHERE state = 'unroutable'";

/// A client's waiting tasks. Both counts read an index alone
/// (`tasks_by_deliver_at` carries the client): a task not yet due is waiting
/// unless it was withdrawn.
pub const WAITING_TASKS: &str = "SELECT \
    (SELECT COUNT(*) FROM tasks WHERE client = $1 AND deliver_at_ms > $2) \
    - (SELECT COUNT(*) FROM tasks WHERE client = $1 AND deliver_at_ms > $2 \
       AND state IN ('cancelled', 'failed'))";

/// A planner's steps of a schedule, recorded if it is still as the planner
/// read it (same revision, same next occurrence, not paused); its planning
/// lease is handed back with them.
pub const ADVANCE_SCHEDULE: &str = "UPDATE schedules SET next_at_ms = $4, \
     last_occurrence_ms = COALESCE($5, last_occurrence_ms), \
     occurrences = occurrences + $6, missed = missed + $7, updated_at_ms = $8, \
     planning_until_ms = NULL \
     WHERE id = $1 AND revision = $2 AND next_at_ms = $3 AND paused = 0";

/// The ledger's identity, made by its migration.
/// A lease holder's session lock (`$1`), held until its connection ends.
pub const LOCK_HOLDER: &str = "SELECT pg_advisory_lock($1)";

pub const REGISTER_HOLDER: &str = "INSERT INTO lease_holders (holder, since_ms) \
     VALUES ($1, $2) ON CONFLICT (holder) DO NOTHING";

/// Registered lease holders but `$1` whose advisory lock no session holds:
/// a lock on a bigint shows its high half as `classid`, its low half as
/// `objid`, and `objsubid` 1.
pub const GONE_HOLDERS: &str = "SELECT holder FROM lease_holders h WHERE holder <> $1 \
     AND NOT EXISTS (SELECT 1 FROM pg_locks l WHERE l.locktype = 'advisory' AND l.granted \
         AND l.objsubid = 1 \
         AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database()) \
         AND l.classid = (h.holder >> 32)::oid AND l.objid = (h.holder & 4294967295)::oid)";

pub const FORGET_HOLDER: &str = "DELETE FROM lease_holders WHERE holder = $1";

/// Pending tasks leased by holder `$1`, which is gone: due for the
/// forwarder now.
pub const END_PENDING_LEASES_OF: &str = "UPDATE tasks SET next_attempt_at_ms = 0 \
     WHERE state = 'pending' AND next_attempt_at_ms > 0 AND leased_by = $1";

/// Tasks the limiter released to holder `$1`, which is gone: waiting again.
pub const RETURN_RELEASES_OF: &str = "UPDATE tasks SET state = 'waiting', \
     next_attempt_at_ms = 0 \
     WHERE state = 'releasing' AND held_by IS NOT NULL AND leased_by = $1";

/// Tasks the staged release took for holder `$1`, which is gone: staged again.
pub const RETURN_STAGED_RELEASES_OF: &str = "UPDATE tasks SET state = 'staged', \
     next_attempt_at_ms = 0 \
     WHERE state = 'releasing' AND release_at_ms IS NOT NULL AND held_by IS NULL \
     AND leased_by = $1";

/// A replayed parked message goes in the transaction that records its task.
pub const UNPARK: &str = "DELETE FROM parked WHERE id = $1";

pub const IDENTITY: &str = "SELECT id FROM ledger_identity";

pub const PENDING_COUNT: &str = "SELECT COUNT(*) FROM tasks WHERE state = 'pending'";

/// One task by id.
pub fn get() -> String {
    format!("SELECT {COLUMNS} FROM tasks WHERE id = $1")
}

/// What an earlier request under an idempotency key, or for an id, was.
pub const REQUEST_BY_KEY: &str =
    "SELECT idempotency_key, fingerprint FROM tasks WHERE idempotency_key = $1";
pub const REQUEST_BY_ID: &str = "SELECT idempotency_key, fingerprint FROM tasks WHERE id = $1";

/// Whether any task is pending with its lease expired at `$1`: a read, so
/// that the forwarder, which asks five times a second on every replica and
/// nearly always in vain, takes no write lock (which the group writer
/// needs: an UPDATE takes it on SQLite even when it matches nothing).
pub const ANY_PENDING_DUE: &str =
    "SELECT id FROM tasks WHERE state = 'pending' AND next_attempt_at_ms <= $1 LIMIT 1";

/// Takes up to `$3` pending tasks whose lease has expired at `$1`, leasing
/// them until `$2` to `$4`. The condition is repeated outside the subquery so that,
/// on PostgreSQL, a replica that waited for another replica's claim
/// re-checks it and skips what was just taken.
pub fn claim_pending() -> String {
    format!(
        "UPDATE tasks SET next_attempt_at_ms = $2, leased_by = $4, attempts = attempts + 1 \
         WHERE state = 'pending' AND next_attempt_at_ms <= $1 AND id IN ( \
             SELECT id FROM tasks WHERE state = 'pending' AND next_attempt_at_ms <= $1 \
             ORDER BY next_attempt_at_ms LIMIT $3) \
         RETURNING {COLUMNS}"
    )
}

/// Up to `$2` tasks neither pending, waiting nor staged (whose only copy
/// is the ledger's) and due before `$1`, the earliest first. The order
/// makes PostgreSQL's generic plan read the due-order index from its start,
/// which ends at once when nothing is old enough: without it, the plan
/// scanned the whole table every minute (1.8 s at 2.5 million held).
pub const PRUNE_TASKS: &str = "DELETE FROM tasks WHERE id IN ( \
     SELECT id FROM tasks WHERE state NOT IN ('pending', 'waiting', 'staged') \
     AND deliver_at_ms < $1 ORDER BY deliver_at_ms LIMIT $2)";
/// Up to `$2` idempotency keys of changes made before `$1`.
pub const PRUNE_CHANGES: &str = "DELETE FROM task_changes WHERE idempotency_key IN ( \
     SELECT idempotency_key FROM task_changes WHERE created_at_ms < $1 LIMIT $2)";

/// A bulk operation's next page: tasks after the cursor `($1, $2)` and due
/// before `$3`, in due order, at most `$4`; to destination `$5` only (read
/// through the destination index) with `one_destination`, of client `$5`
/// (or `$6`) only with `owned`. The cursor is a row value, which both
/// backends turn into one range of the index.
pub fn bulk_page(one_destination: bool, owned: bool) -> String {
    let mut next = 4;
    let mut condition = String::new();
    if one_destination {
        next += 1;
        condition.push_str(&format!(" AND destination = ${next}"));
    }
    if owned {
        next += 1;
        condition.push_str(&format!(" AND client = ${next}"));
    }
    format!(
        "SELECT id, destination, state, deliver_at_ms, leeway_ms FROM tasks \
         WHERE (deliver_at_ms, id) > ($1, $2) AND deliver_at_ms < $3{condition} \
         ORDER BY deliver_at_ms, id LIMIT $4"
    )
}

/// How many of destination `$1`'s tasks a cancel could still change, due
/// before `$2`, counting up to `$3` (in state `$4`, of client `$5`, when
/// given): what the console's bulk cancel states before asking. The cap
/// keeps the count cheap beside a destination of millions of tasks.
pub fn count_changeable(state: bool, owned: bool) -> String {
    let mut next = 3;
    let mut condition = String::from("state IN ('pending', 'scheduled', 'waiting', 'staged')");
    if state {
        next += 1;
        condition = format!("state = ${next} AND {condition}");
    }
    if owned {
        next += 1;
        condition.push_str(&format!(" AND client = ${next}"));
    }
    format!(
        "SELECT COUNT(*) FROM (SELECT 1 FROM tasks \
         WHERE destination = $1 AND deliver_at_ms < $2 AND {condition} LIMIT $3)"
    )
}

/// The statement `Ledger::list` runs for `filter`, its parameters in the
/// order the filter's fields are declared.
///
/// A rare state is written as a literal (it is one of a fixed set), which a
/// partial index can be matched against, and the destination as an
/// expression, so that the planner reads the state's few tasks rather than
/// every task of the destination. The pending tasks' index is in attempt
/// order: they are sorted (there are at most `store.max_pending`).
pub fn list_sql(filter: &TaskFilter) -> String {
    let rare = filter.state.filter(|state| is_rare(*state));
    let mut conditions = Vec::new();
    let mut parameters = 0;
    let mut next = || {
        parameters += 1;
        format!("${parameters}")
    };
    if filter.client.is_some() {
        conditions.push(format!("client = {}", next()));
    }
    if filter.destination.is_some() {
        let column = if rare.is_some() {
            "destination || ''"
        } else {
            "destination"
        };
        conditions.push(format!("{column} = {}", next()));
    }
    match (filter.state, rare) {
        (Some(_), Some(state)) => conditions.push(format!("state = '{}'", state.as_str())),
        (Some(_), None) => conditions.push(format!("state = {}", next())),
        (None, _) => {}
    }
    if filter.due_before_ms.is_some() {
        conditions.push(format!("deliver_at_ms < {}", next()));
    }
    if filter.after.is_some() {
        // The first term is implied by the second; it is there so that
        // PostgreSQL starts the index range at the cursor instead of
        // filtering every row before it (a page 300,000 deep took 1 s).
        let (at, id) = (next(), next());
        conditions.push(format!(
            "deliver_at_ms >= {at} AND (deliver_at_ms > {at} OR (deliver_at_ms = {at} AND id > {id}))"
        ));
    }
    let limit = next();
    let condition = if conditions.is_empty() {
        String::new()
    } else {
        format!("WHERE {} ", conditions.join(" AND "))
    };
    let order = match rare {
        Some(TaskState::Pending) => "+deliver_at_ms",
        _ => "deliver_at_ms",
    };
    format!(
        "SELECT {} FROM tasks {condition}ORDER BY {order}, id LIMIT {limit}",
        COLUMNS
    )
}

/// Statements of `check_write`: a row of `$1` bytes written, then every
/// such row removed, in one transaction.
pub const WRITE_CHECK: &str = "INSERT INTO write_checks (filler) VALUES ($1)";
pub const WRITE_CHECKS_REMOVED: &str = "DELETE FROM write_checks";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunks_come_in_few_sizes_and_keep_every_item_in_order() {
        for n in 0..=300 {
            let items: Vec<usize> = (0..n).collect();
            let chunks = statement_sized_chunks(&items);
            assert!(
                chunks
                    .iter()
                    .all(|c| c.len().is_power_of_two() && c.len() <= CHUNK)
            );
            assert_eq!(chunks.concat(), items);
            assert!(chunks.len() <= n / CHUNK + CHUNK.ilog2() as usize + 1);
        }
    }

    /// The `$N` placeholders of `sql`, in order of appearance.
    fn parameters(sql: &str) -> Vec<usize> {
        sql.split('$')
            .skip(1)
            .map(|rest| {
                let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
                digits.parse().expect("a number after $")
            })
            .collect()
    }

    #[test]
    fn an_insert_numbers_every_column_of_every_row_once_and_in_order() {
        for rows in [1, 2, 7, CHUNK] {
            let sql = insert(rows);
            let width = INSERT_COLUMNS.len();
            assert_eq!(
                parameters(&sql),
                (1..=rows * width).collect::<Vec<_>>(),
                "{sql}"
            );
            assert_eq!(sql.matches('(').count(), rows + 1, "{sql}");
            assert!(sql.starts_with("INSERT INTO tasks (id, idempotency_key, "));
            assert!(sql.ends_with(" ON CONFLICT DO NOTHING RETURNING id"));
        }
    }

    #[test]
    fn marking_scheduled_binds_time_and_copy_size_then_each_id_with_its_revision() {
        for trim in [true, false] {
            let sql = mark_published(3, trim);
            let mut found = parameters(&sql);
            found.dedup();
            assert_eq!(found, [1, 2, 3, 4, 5, 6, 7, 8], "{sql}");
            assert!(
                sql.ends_with(
                    "WHERE state = 'pending' AND ((id = $3 AND revision = $4) OR \
                     (id = $5 AND revision = $6) OR (id = $7 AND revision = $8))"
                ),
                "{sql}"
            );
            assert_eq!(sql.contains("substr"), trim);
        }
    }

    #[test]
    fn marking_delivered_binds_time_and_copy_size_then_the_ids() {
        let sql = mark_delivered(2);
        let mut found = parameters(&sql);
        found.dedup();
        assert_eq!(found, [1, 2, 3, 4], "{sql}");
        assert!(sql.contains("last_error = NULL"), "{sql}");
        assert!(sql.ends_with(
            "WHERE state = 'releasing' AND id IN ($3, $4) RETURNING deliver_at_ms, destination"
        ));
    }

    #[test]
    fn a_claim_binds_each_id_with_its_revision() {
        let sql = claim("state = 'pending'", 2);
        assert_eq!(parameters(&sql), [1, 2, 3, 4]);
        assert_eq!(
            sql,
            "UPDATE tasks SET state = 'releasing' WHERE state = 'pending' AND \
             ((id = $1 AND revision = $2) OR (id = $3 AND revision = $4)) \
             RETURNING id, revision, deliver_at_ms, destination"
        );
        assert_eq!(parameters(&states(3)), [1, 2, 3]);
    }

    /// Every statement that names tasks by id finds them by the primary key,
    /// on the default backend, however large the ledger: the query plan of
    /// each, on a migrated SQLite ledger, searches and never scans `tasks`.
    #[tokio::test]
    async fn statements_by_id_use_the_primary_key_on_sqlite() {
        let pool = super::super::pool::migrated_sqlite().await;
        let statements = [
            mark_published(3, true),
            mark_published(3, false),
            mark_delivered(3),
            claim("state = 'pending'", 3),
            claim("state IN ('scheduled', 'releasing')", 3),
            claim("state = 'failed'", 3),
            states(3),
            SCHEDULE_RETRY.to_owned(),
            FAIL_PENDING.to_owned(),
            holder_by_id(),
        ];
        for statement in statements {
            let count = parameters(&statement).into_iter().max().unwrap_or(0);
            let plan = super::super::pool::query_plan(&pool, &statement, count).await;
            assert!(
                plan.iter().all(|step| !step.starts_with("SCAN tasks")),
                "{statement}\n{plan:?}"
            );
            assert!(
                plan.iter()
                    .any(|step| step.contains("USING INDEX sqlite_autoindex_tasks_1")
                        || step.contains("USING PRIMARY KEY")),
                "{statement}\n{plan:?}"
            );
        }
    }

    /// What the group writer runs for every task, the insert and the
    /// scheduled mark, builds no temporary table: SQLite builds one for an
    /// `IN` over more than two constants, such as the CHECK on `state`
    /// before migration 0015, each time the statement runs (record 39).
    #[tokio::test]
    async fn the_writers_statements_for_each_task_build_no_table() {
        let (dir, writer) = super::super::pool::migrated_sqlite_writer().await;
        for statement in [
            insert_one(),
            mark_published(1, true),
            mark_published(1, false),
        ] {
            let explain = format!("EXPLAIN {}", for_sqlite(&statement));
            let mut program = writer.prepare(&explain).unwrap();
            // Unbound: the program does not depend on the values.
            let mut steps = program.raw_query();
            let mut opcodes: Vec<String> = Vec::new();
            while let Some(step) = steps.next().unwrap() {
                opcodes.push(step.get(1).unwrap());
            }
            assert!(
                opcodes.iter().any(|op| op == "Insert"),
                "{statement}: {opcodes:?}"
            );
            assert!(
                !opcodes.iter().any(|op| op == "OpenEphemeral"),
                "{statement}: {opcodes:?}"
            );
        }
        drop(writer);
        let _ = std::fs::remove_dir_all(dir);
    }

    /// The resender reads only the tasks due in its span, by the due-time
    /// index, however many tasks the ledger holds.
    #[tokio::test]
    async fn the_resender_reads_its_span_by_the_due_time_index() {
        let pool = super::super::pool::migrated_sqlite().await;
        for (statement, parameters) in [(ANY_UNRELEASED, 3), (RESEND_UNRELEASED, 5)] {
            let plan = super::super::pool::query_plan(&pool, statement, parameters).await;
            assert!(
                plan.iter().all(|step| !step.starts_with("SCAN tasks")),
                "{statement}\n{plan:?}"
            );
            assert!(
                plan.iter()
                    .any(|step| step.contains("USING INDEX tasks_by_deliver_at")
                        || step.contains("USING COVERING INDEX tasks_by_deliver_at")),
                "{statement}\n{plan:?}"
            );
        }
    }

    /// The forwarder's read, five times a second on every replica, is a
    /// probe of the pending tasks' partial index, never a scan.
    #[tokio::test]
    async fn the_forwarders_read_probes_the_pending_index() {
        let pool = super::super::pool::migrated_sqlite().await;
        let plan = super::super::pool::query_plan(&pool, ANY_PENDING_DUE, 1).await;
        assert!(
            plan.iter().all(|step| !step.starts_with("SCAN tasks")),
            "{plan:?}"
        );
        assert!(
            plan.iter().any(|step| step.contains("INDEX tasks_pending")),
            "{plan:?}"
        );
    }

    /// A lookup by idempotency key uses the key's partial unique index
    /// (migration 0009), which holds only the tasks that have a key.
    #[tokio::test]
    async fn a_lookup_by_key_uses_the_partial_index_of_keys() {
        let pool = super::super::pool::migrated_sqlite().await;
        let plan = super::super::pool::query_plan(&pool, &holder_by_key(), 1).await;
        assert!(
            plan.iter()
                .any(|step| step.contains("USING INDEX tasks_by_idempotency_key")),
            "{plan:?}"
        );
    }

    #[test]
    fn sqlite_gets_every_parameter_by_its_number() {
        for statement in [
            insert(3),
            mark_published(2, true),
            mark_delivered(2),
            states(5),
        ] {
            let sqlite = for_sqlite(&statement);
            assert!(!sqlite.contains('$'), "{sqlite}");
            assert_eq!(sqlite.replace('?', "$"), statement);
        }
        assert_eq!(for_sqlite("SELECT $1, $3, $2, $2"), "SELECT ?1, ?3, ?2, ?2");
    }

    #[test]
    fn fixed_statements_number_their_parameters_from_one() {
        for (sql, count) in [
            (SCHEDULE_RETRY.to_owned(), 7),
            (MOVE.to_owned(), 9),
            (MARK_EXPIRED.to_owned(), 4),
            (EXPIRE_WAITING.to_owned(), 1),
            (take_waiting_past_deadline(), 4),
            (release_waiting(2), 4),
            (unstage(), 6),
            (claim_pending(), 4),
            (GONE_HOLDERS.to_owned(), 1),
            (END_PENDING_LEASES_OF.to_owned(), 1),
            (RETURN_RELEASES_OF.to_owned(), 1),
            (RETURN_STAGED_RELEASES_OF.to_owned(), 1),
            (RECORD_ROUTE.to_owned(), 3),
            (FAIL_PENDING.to_owned(), 3),
            (FAIL_SCHEDULED.to_owned(), 3),
            (holder_by_key(), 1),
            (holder_by_id(), 1),
        ] {
            let mut found = parameters(&sql);
            found.sort_unstable();
            found.dedup();
            assert_eq!(found, (1..=count).collect::<Vec<_>>(), "{sql}");
        }
    }
}
