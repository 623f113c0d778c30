#!/usr/bin/env python3
"""Record 48: the resender's resend read (a minute's unreleased tasks) on the
million-task ledgers reads.py builds, each ledger in a process of its own,
the service's 16 MiB cache, best of 9 for three one-minute windows (ms).
Usage: resend-read.py LEDGER [LEDGER ...]; a process per ledger to compare
shapes (two connections in one process distort it: see record 48)."""
import sqlite3, sys, time
HOUR=3_600_000; BASE=1_800_000_000_000; mid=BASE+4*HOUR
q="SELECT COUNT(*) FROM tasks WHERE state = 'scheduled' AND deliver_at_ms >= :a AND deliver_at_ms < :z"
for f in sys.argv[1:]:
    db=sqlite3.connect(f); db.execute("PRAGMA cache_size=-16384")
    out=[]
    for off in (0,600000,1200000):
        p={"a":mid+off,"z":mid+off+60000}
        ts=[]
        for i in range(9):
            a=time.perf_counter(); db.execute(q,p).fetchall(); ts.append(time.perf_counter()-a)
        out.append(min(ts)*1000)
    print(f.split('/')[-1], " ".join(f"{x:.2f}" for x in out))
