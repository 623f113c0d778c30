#!/usr/bin/env python3
"""Every due-order read the ledger makes, timed on a ledger of N tasks in
today's schema and in a bucketed one (issue 69's first measurement).

Usage: reads.py MIGRATIONS_DIR N SHAPE [OUT_DIR]

SHAPE is a bucket width in ms, or `slim`: the two indexes without the id
(`(deliver_at_ms, client)` and `(destination, deliver_at_ms)`, each ending
in the rowid), read by today's statements unchanged.

Builds the schema from the service's own SQLite migrations, fills it with
N scheduled tasks spread over four hours as the backlog phase's (2 to 6 h
ahead, at whole seconds, 16 destinations, ids that grow with time as UUIDv7
do), then copies it and turns the copy's two due-order indexes into
`(due_bucket)` and `(destination, due_bucket)`, due_bucket being a virtual
column `deliver_at_ms / BUCKET_MS` (each index ends in the rowid, which
grows with admission: inserts land at the end of their bucket's run).
Each read runs as the service's statement does today, and rewritten for the
bucketed shape (the same rows, in the same order); the best of 7 runs each.
Python's SQLite (3.40) here, not the service's bundled one, unless it is
run on the service's own (record 48: `LD_LIBRARY_PATH` to a `libsqlite3.so.0`
built from the `libsqlite3-sys` amalgamation the service bundles, 3.46).

ANALYZE=1 in the environment runs ANALYZE on both ledgers (record 47 did);
without it they have no statistics, as the service's ledger has none.
CLIENTS=N gives the tasks N clients in turn (an API with tokens), and adds
the reads by client.
"""
import os
import re
import shutil
import sqlite3
import sys
import time

HOUR = 3_600_000
ANALYZE = os.environ.get("ANALYZE") == "1"
CLIENTS = int(os.environ.get("CLIENTS", "0"))
BASE = 1_800_000_000_000  # a due-time origin, in ms


def build(path, migrations, n):
    if os.path.exists(path):
        os.remove(path)
    db = sqlite3.connect(path)
    for name in sorted(os.listdir(migrations)):
        if name.endswith(".sql"):
            db.executescript(open(os.path.join(migrations, name)).read())
    db.execute("PRAGMA journal_mode = WAL")
    db.executescript("DROP TRIGGER IF EXISTS due_counts_on_insert;")
    payload = b'{"n":0,"note":"a payload of about a hundred bytes, like a small business event"}'
    rows = (
        (
            "%08x-%04x-7000-8000-%012x" % (k // 1000, k % 1000, k),
            "bench.backlog.t%d" % (k % 16),
            "1.0.1." + "bench.backlog.t%d" % (k % 16),
            2 * HOUR + (k * 7919 * 1000) % (4 * HOUR),
            BASE + 2 * HOUR + (k * 7919 * 1000) % (4 * HOUR),
            "application/json",
            "{}",
            payload,
            len(payload),
            "scheduled",
            BASE - HOUR + k,
            0,
            "client-%d" % (k % CLIENTS) if CLIENTS else None,
        )
        for k in range(n)
    )
    db.executemany(
        "INSERT INTO tasks (id, destination, routing_key, delay_ms, deliver_at_ms, "
        "content_type, headers, payload, payload_bytes, state, created_at_ms, "
        "next_attempt_at_ms, client) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?)",
        rows,
    )
    db.commit()
    if ANALYZE:
        db.execute("ANALYZE")
    db.commit()
    db.close()


SLIM = """
    DROP INDEX tasks_by_deliver_at;
    DROP INDEX tasks_by_destination;
    CREATE INDEX tasks_by_deliver_at ON tasks (deliver_at_ms, client);
    CREATE INDEX tasks_by_destination ON tasks (destination, deliver_at_ms);
"""


def bucketed(src, dst, bucket_ms):
    shutil.copy(src, dst)
    db = sqlite3.connect(dst)
    if bucket_ms == "slim":
        db.executescript(SLIM + ("ANALYZE;" if ANALYZE else ""))
        db.commit()
        db.close()
        return
    db.executescript(
        f"""
        ALTER TABLE tasks ADD COLUMN due_bucket INTEGER
            GENERATED ALWAYS AS (deliver_at_ms / {bucket_ms}) VIRTUAL;
        DROP INDEX tasks_by_deliver_at;
        DROP INDEX tasks_by_destination;
        CREATE INDEX tasks_by_due_bucket ON tasks (due_bucket);
        CREATE INDEX tasks_by_destination ON tasks (destination, due_bucket);
        """ + ("ANALYZE;" if ANALYZE else "")
    )
    db.commit()
    db.close()


def reads(n, bucket_ms):
    """(name, today's statement, the bucketed one, parameters)."""
    if bucket_ms == "slim":
        return [(name, old, old, params) for name, old, _, params in reads(n, 60_000)] + more_reads()
    mid = BASE + 4 * HOUR  # the middle of the four hours
    b = bucket_ms
    cols = "*"
    return [
        ("list, first page of 100",
         f"SELECT {cols} FROM tasks ORDER BY deliver_at_ms, id LIMIT 101",
         f"SELECT {cols} FROM tasks ORDER BY due_bucket, deliver_at_ms, id LIMIT 101",
         {}),
        ("list, a deep page of 100 (after the middle)",
         f"SELECT {cols} FROM tasks WHERE (deliver_at_ms > :at OR (deliver_at_ms = :at AND id > :id)) "
         "ORDER BY deliver_at_ms, id LIMIT 101",
         f"SELECT {cols} FROM tasks WHERE due_bucket >= :at / {b} "
         "AND (deliver_at_ms > :at OR (deliver_at_ms = :at AND id > :id)) "
         "ORDER BY due_bucket, deliver_at_ms, id LIMIT 101",
         {"at": mid, "id": ""}),
        ("list of one destination, first page",
         f"SELECT {cols} FROM tasks WHERE destination = :d ORDER BY deliver_at_ms, id LIMIT 101",
         f"SELECT {cols} FROM tasks WHERE destination = :d ORDER BY due_bucket, deliver_at_ms, id LIMIT 101",
         {"d": "bench.backlog.t3"}),
        ("list due before the middle, by state, first page",
         f"SELECT {cols} FROM tasks WHERE state = 'scheduled' AND deliver_at_ms < :at "
         "ORDER BY deliver_at_ms, id LIMIT 101",
         f"SELECT {cols} FROM tasks WHERE state = 'scheduled' AND due_bucket <= :at / {b} "
         "AND deliver_at_ms < :at ORDER BY due_bucket, deliver_at_ms, id LIMIT 101",
         {"at": mid}),
        ("bulk operation's page of 1,000 (from the middle)",
         "SELECT id, destination, state, deliver_at_ms FROM tasks "
         "WHERE (deliver_at_ms, id) > (:at, :id) AND deliver_at_ms < :end "
         "ORDER BY deliver_at_ms, id LIMIT 1000",
         "SELECT id, destination, state, deliver_at_ms FROM tasks "
         f"WHERE due_bucket >= :at / {b} AND due_bucket <= :end / {b} "
         "AND (deliver_at_ms, id) > (:at, :id) AND deliver_at_ms < :end "
         "ORDER BY due_bucket, deliver_at_ms, id LIMIT 1000",
         {"at": mid, "id": "", "end": BASE + 7 * HOUR}),
        ("bulk page of one destination",
         "SELECT id, destination, state, deliver_at_ms FROM tasks "
         "WHERE (deliver_at_ms, id) > (:at, :id) AND deliver_at_ms < :end AND destination = :d "
         "ORDER BY deliver_at_ms, id LIMIT 1000",
         "SELECT id, destination, state, deliver_at_ms FROM tasks "
         f"WHERE destination = :d AND due_bucket >= :at / {b} AND due_bucket <= :end / {b} "
         "AND (deliver_at_ms, id) > (:at, :id) AND deliver_at_ms < :end "
         "ORDER BY due_bucket, deliver_at_ms, id LIMIT 1000",
         {"at": mid, "id": "", "end": BASE + 7 * HOUR, "d": "bench.backlog.t3"}),
        ("resender: any unreleased in a second",
         "SELECT id FROM tasks WHERE state = 'scheduled' AND deliver_at_ms >= :a AND deliver_at_ms < :z LIMIT 1",
         f"SELECT id FROM tasks WHERE state = 'scheduled' AND due_bucket BETWEEN :a / {b} AND :z / {b} "
         "AND deliver_at_ms >= :a AND deliver_at_ms < :z LIMIT 1",
         {"a": mid + 500, "z": mid + 900}),
        ("resender: a minute's unreleased (read, count)",
         "SELECT COUNT(*) FROM tasks WHERE state = 'scheduled' AND deliver_at_ms >= :a AND deliver_at_ms < :z",
         f"SELECT COUNT(*) FROM tasks WHERE state = 'scheduled' AND due_bucket BETWEEN :a / {b} AND :z / {b} "
         "AND deliver_at_ms >= :a AND deliver_at_ms < :z",
         {"a": mid, "z": mid + 60_000}),
        ("pruning: 1,000 due before (none prunable)",
         "SELECT id FROM tasks WHERE state NOT IN ('pending', 'waiting', 'staged') AND deliver_at_ms < :at LIMIT 1000",
         f"SELECT id FROM tasks WHERE state NOT IN ('pending', 'waiting', 'staged') AND due_bucket <= :at / {b} "
         "AND deliver_at_ms < :at LIMIT 1000",
         {"at": BASE + 2 * HOUR + 30_000}),
        ("count to cancel: one destination before the middle",
         "SELECT COUNT(*) FROM tasks WHERE destination = :d AND deliver_at_ms < :at "
         "AND state IN ('pending', 'scheduled', 'waiting', 'staged')",
         f"SELECT COUNT(*) FROM tasks WHERE destination = :d AND due_bucket <= :at / {b} AND deliver_at_ms < :at "
         "AND state IN ('pending', 'scheduled', 'waiting', 'staged')",
         {"d": "bench.backlog.t3", "at": mid}),
    ]


def more_reads():
    """Reads added for record 48, as the service's statements are (slim only)."""
    mid = BASE + 4 * HOUR
    listed = [
        ("list by state scheduled, first page",
         "SELECT * FROM tasks WHERE state = :s ORDER BY deliver_at_ms, id LIMIT 101",
         {"s": "scheduled"}),
        ("list by state scheduled, a deep page",
         "SELECT * FROM tasks WHERE state = :s AND (deliver_at_ms > :at OR (deliver_at_ms = :at AND id > :id)) "
         "ORDER BY deliver_at_ms, id LIMIT 101",
         {"s": "scheduled", "at": mid, "id": ""}),
        ("waiting tasks of a destination (limiter, own index)",
         "SELECT id, deliver_at_ms FROM tasks WHERE state = 'waiting' AND destination = :d "
         "AND deliver_at_ms <= :at ORDER BY deliver_at_ms, id LIMIT 100",
         {"d": "bench.backlog.t3", "at": mid}),
    ]
    if CLIENTS:
        listed += [
            ("a client's list, first page",
             "SELECT * FROM tasks WHERE client = :c ORDER BY deliver_at_ms, id LIMIT 101",
             {"c": "client-1"}),
            ("a client's list, a deep page",
             "SELECT * FROM tasks WHERE client = :c AND (deliver_at_ms > :at OR (deliver_at_ms = :at AND id > :id)) "
             "ORDER BY deliver_at_ms, id LIMIT 101",
             {"c": "client-1", "at": mid, "id": ""}),
            ("a client's quota: waiting tasks after the middle",
             "SELECT (SELECT COUNT(*) FROM tasks WHERE client = :c AND deliver_at_ms > :at) "
             "- (SELECT COUNT(*) FROM tasks WHERE client = :c AND deliver_at_ms > :at "
             "AND state IN ('cancelled', 'failed'))",
             {"c": "client-1", "at": mid}),
            ("a client's bulk page of 1,000",
             "SELECT id, destination, state, deliver_at_ms FROM tasks "
             "WHERE (deliver_at_ms, id) > (:at, :id) AND deliver_at_ms < :end AND client = :c "
             "ORDER BY deliver_at_ms, id LIMIT 1000",
             {"c": "client-1", "at": mid, "id": "", "end": BASE + 7 * HOUR}),
        ]
    return [(name, sql, sql, params) for name, sql, params in listed]


def bound_limits(sql):
    return re.sub(r"LIMIT (\d+)", r"LIMIT :limit\1", sql)


def best(db, sql, params, runs=7):
    times = []
    rows = None
    for _ in range(runs):
        started = time.perf_counter()
        rows = db.execute(sql, params).fetchall()
        times.append(time.perf_counter() - started)
    return min(times) * 1000, rows


def plan(db, sql, params):
    return "; ".join(r[3] for r in db.execute("EXPLAIN QUERY PLAN " + sql, params))


def main():
    migrations, n, bucket_ms = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    bucket_ms = bucket_ms if bucket_ms == "slim" else int(bucket_ms)
    out = sys.argv[4] if len(sys.argv) > 4 else "/tmp"
    today = os.path.join(out, f"reads-today-{n}.db")
    after = os.path.join(out, f"reads-bucket{bucket_ms}-{n}.db")
    if not os.path.exists(today):
        build(today, migrations, n)
    bucketed(today, after, bucket_ms)
    a, z = sqlite3.connect(today), sqlite3.connect(after)
    for db in (a, z):
        db.execute("PRAGMA cache_size = -16384")
    if bucket_ms == "slim":
        print(f"{n} tasks, slim indexes")
    else:
        print(f"{n} tasks, bucket {bucket_ms} ms ({n * bucket_ms // (4 * HOUR)} tasks a bucket)")
    print(f"{'read':<52} {'today ms':>9} {'shape ms':>9} {'ratio':>6}")
    for name, old, new, params in reads(n, bucket_ms):
        # The service binds every limit; SQLite plans a literal one otherwise.
        old, new = bound_limits(old), bound_limits(new)
        params = dict(params, **{f"limit{k}": k for k in (1, 100, 101, 1000)})
        t_old, r_old = best(a, old, params)
        t_new, r_new = best(z, new, params)
        same = "" if [tuple(r[:5]) if isinstance(r, tuple) else r for r in r_old] == \
            [tuple(r[:5]) if isinstance(r, tuple) else r for r in r_new] else "  DIFFERENT ROWS"
        print(f"{name:<52} {t_old:>9.3f} {t_new:>9.3f} {t_new / t_old:>6.2f}{same}")
        print(f"    today:  {plan(a, old, params)}")
        print(f"    shape:  {plan(z, new, params)}")
    os.remove(after)


main()
