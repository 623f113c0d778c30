"""For each delayline service the bench starts: perf-record its whole life
(CLOCK_MONOTONIC stamps) and log its CPU ticks every 100 ms with
time.monotonic(), so that a window (the batch rows) can be cut afterwards."""
import os, subprocess, sys, time
out, stores = sys.argv[1], sys.argv[2:]
seen = set()
for store in stores:
    pid = None
    while pid is None:
        time.sleep(0.05)
        r = subprocess.run(["pgrep", "-x", "delayline"], capture_output=True, text=True)
        pids = [int(p) for p in r.stdout.split() if int(p) not in seen]
        pid = max(pids) if pids else None
    seen.add(pid)
    perf = subprocess.Popen(["perf", "record", "-k", "CLOCK_MONOTONIC", "-F", "299",
                             "--call-graph", "dwarf", "-p", str(pid), "-o",
                             f"{out}/perf-{store}.data"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    with open(f"{out}/ticks-{store}.txt", "w") as log:
        while True:
            try:
                f = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
            except OSError:
                break
            log.write(f"{time.monotonic():.3f} {int(f[11]) + int(f[12])}\n")
            log.flush()
            time.sleep(0.1)
    perf.wait()
    print(store, "done", file=sys.stderr)
