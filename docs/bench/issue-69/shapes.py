#!/usr/bin/env python3
"""Issue 69, record 48: what one group commit of random inserts costs SQLite alone,
by index shape and page size. 200,000 rows in groups of 256 (the writer's
group), WAL, synchronous FULL, a 16 MiB cache, due times spread over an hour
(same: all one delay after admission). CPU and wall time a row.
Usage: shapes.py PAGE_SIZES SHAPES, e.g. shapes.py 4096,1024 today,slim,same
Shapes: today (deliver_at, id, client) + (destination, deliver_at, id); slim
(the same without the id); same (today's, appended); aonly / bonly (one of
slim's two); none. Python's SQLite 3.40."""
import os
import random
import resource
import sqlite3
import sys
import time
def run(page, shape, n=200000, group=256, cache_kb=16384, seed=1):
    path=f"/tmp/shapes-{page}-{shape}.db"
    for s in ("","-wal","-shm"):
        try: os.remove(path+s)
        except FileNotFoundError: pass
    c=sqlite3.connect(path, isolation_level=None)
    c.execute(f"PRAGMA page_size={page}")
    c.execute("PRAGMA journal_mode=WAL"); c.execute("PRAGMA synchronous=FULL")
    c.execute(f"PRAGMA cache_size=-{cache_kb}"); c.execute("PRAGMA wal_autocheckpoint=4000")
    c.execute("""CREATE TABLE tasks(id TEXT PRIMARY KEY, destination TEXT NOT NULL, routing_key TEXT, deliver_at_ms INTEGER, state TEXT, client TEXT, payload BLOB, headers TEXT, created_at_ms INTEGER, revision INTEGER)""")
    if shape=="today":
        c.execute("CREATE INDEX a ON tasks(deliver_at_ms, id, client)")
        c.execute("CREATE INDEX b ON tasks(destination, deliver_at_ms, id)")
    elif shape=="slim":
        c.execute("CREATE INDEX a ON tasks(deliver_at_ms, client)")
        c.execute("CREATE INDEX b ON tasks(destination, deliver_at_ms)")
    elif shape=="aonly":
        c.execute("CREATE INDEX a ON tasks(deliver_at_ms, client)")
    elif shape=="bonly":
        c.execute("CREATE INDEX b ON tasks(destination, deliver_at_ms)")
    elif shape=="none":
        pass
    elif shape=="same":
        c.execute("CREATE INDEX a ON tasks(deliver_at_ms, id, client)")
        c.execute("CREATE INDEX b ON tasks(destination, deliver_at_ms, id)")
    rnd=random.Random(seed)
    payload=b"x"*200
    t0=time.time(); r0=resource.getrusage(resource.RUSAGE_SELF)
    now=1_800_000_000_000
    import uuid
    for g in range(n//group):
        rows=[]
        for k in range(group):
            i=g*group+k
            now+=1
            d = now+3_600_000 if shape=="same" else now+rnd.randint(1000,3_600_000)
            rows.append((f"{i:012x}-0000-7000-8000-{rnd.getrandbits(48):012x}", f"dest.{rnd.randint(0,9)}", "1.0.1", d, "scheduled", None, payload, "{}", now, 1))
        c.execute("BEGIN")
        c.executemany("INSERT INTO tasks VALUES (?,?,?,?,?,?,?,?,?,?)", rows)
        c.execute("COMMIT")
    r1=resource.getrusage(resource.RUSAGE_SELF); t1=time.time()
    cpu=(r1.ru_utime-r0.ru_utime+r1.ru_stime-r0.ru_stime)/n*1e6
    print(f"page {page:5} {shape:6} cpu {cpu:6.1f} us/task  wall {(t1-t0)/n*1e6:6.1f} us/task  size {os.path.getsize(path)/1e6:.1f} MB", flush=True)
for page in map(int, sys.argv[1].split(",")):
    for shape in sys.argv[2].split(","):
        run(page, shape)
