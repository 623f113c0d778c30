import sqlite3, glob, time, os, sys
mode = sys.argv[1]
path = '/tmp/exp/t.db'
for suffix in ['', '-wal', '-shm']:
    try: os.remove(path + suffix)
    except FileNotFoundError: pass
db = sqlite3.connect(path, isolation_level=None)
for f in sorted(glob.glob('/work/main/migrations/sqlite/*.sql')):
    db.executescript(open(f).read())
for (name,) in db.execute("select name from sqlite_master where type='trigger'").fetchall():
    db.execute(f'drop trigger {name}')
db.execute('PRAGMA journal_mode=WAL'); db.execute('PRAGMA synchronous=FULL')
cols = [r[1] for r in db.execute('pragma table_info(tasks)')]
N = 200_000
T0 = 1_000_000
db.execute('BEGIN')
rows = []
for i in range(N):
    rid = f'0190{i:028x}'
    rows.append((rid, None, 'fp', 'dest.q', 'rk', 1000, T0, 'application/json', '{}', os.urandom(100), 100,
                 'staged', i, None, 0, 0, None, 0, 0, 1, None, None, None, b'props'*10, None, None, T0, 'me', None, 0, None, None, None))
db.executemany(f"insert into tasks ({','.join(cols)}) values ({','.join('?'*len(cols))})", rows)
db.execute('COMMIT')
db.execute('PRAGMA wal_checkpoint(TRUNCATE)')
COLUMNS = ','.join(cols)
due = "release_at_ms <= ?1 AND (staged_by = ?4 OR release_at_ms <= ?5)"
take_a = f"""UPDATE tasks SET state = 'releasing', next_attempt_at_ms = ?2, leased_by = ?6
 WHERE state = 'staged' AND {due} AND id IN (
   SELECT id FROM tasks WHERE state = 'staged' AND {due} ORDER BY release_at_ms, created_at_ms, id LIMIT ?3)
 RETURNING {COLUMNS}"""
read_b = f"""SELECT rowid, {COLUMNS} FROM tasks WHERE state = 'staged' AND {due}
 ORDER BY release_at_ms, created_at_ms, id LIMIT ?3"""
take_b = "UPDATE tasks SET state = 'releasing', next_attempt_at_ms = ?, leased_by = ? WHERE rowid = ? AND state = 'staged'"
def mark_a(ids):
    n = len(ids)
    return (f"UPDATE tasks SET state='delivered', delivered_at_ms=?, last_error=NULL, payload = CASE WHEN ? < 0 THEN NULL ELSE substr(payload,1,?) END "
            f"WHERE state='releasing' AND id IN ({','.join('?'*n)}) RETURNING deliver_at_ms, destination")
mark_b = "UPDATE tasks SET state='delivered', delivered_at_ms=?, last_error=NULL, payload = CASE WHEN ? < 0 THEN NULL ELSE substr(payload,1,?) END WHERE rowid = ? AND state='releasing'"
takes = 100
t_take = t_mark = t_commit = 0
for k in range(takes):
    a = time.perf_counter()
    db.execute('BEGIN IMMEDIATE')
    if mode == 'a':
        got = db.execute(take_a, (T0, 5, 1000, 'me', T0, 7)).fetchall()
        ids = [r[0] for r in got]
    else:
        got = db.execute(read_b, (T0, 5, 1000, 'me', T0)).fetchall()
        db.executemany(take_b, [(5, 7, r[0]) for r in got])
        ids = [r[1] for r in got]; rowids = [r[0] for r in got]
    b = time.perf_counter()
    db.execute('COMMIT')
    c = time.perf_counter()
    db.execute('BEGIN IMMEDIATE')
    if mode == 'a':
        for i in range(0, len(ids), 64):
            chunk = ids[i:i+64]
            db.execute(mark_a(chunk), (9, 0, 0, *chunk)).fetchall()
    else:
        db.executemany(mark_b, [(9, 0, 0, r) for r in rowids])
    d = time.perf_counter()
    db.execute('COMMIT')
    e = time.perf_counter()
    t_take += b - a; t_mark += d - c; t_commit += (c - b) + (e - d)
    assert len(ids) == 1000, len(ids)
n = takes * 1000
print(f'{mode}: take {t_take/n*1e6:.2f} us, mark {t_mark/n*1e6:.2f} us, commits {t_commit/n*1e6:.2f} us a task')
