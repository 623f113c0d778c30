#!/usr/bin/env python3
"""Record 48: reads.py's reads timed on one ledger, in a process of its own
(two ledgers in one process distort what misses the cache; record 48).
Usage: CLIENTS=8 reads-one.py LEDGER N   (N: the tasks it was built with)."""
import os
import sys
import time

source = open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "reads.py")).read()
namespace = {"__name__": "reads"}
exec(source.replace("\nmain()\n", "\n"), namespace)
path, n = sys.argv[1], int(sys.argv[2])
db = namespace["sqlite3"].connect(path)
db.execute("PRAGMA cache_size = -16384")
for name, statement, _, params in namespace["reads"](n, "slim"):
    statement = namespace["bound_limits"](statement)
    params = dict(params, **{f"limit{k}": k for k in (1, 100, 101, 1000)})
    ms, _ = namespace["best"](db, statement, params)
    print(f"{name:<52} {ms:>9.3f}")
