"""Counts the SQLite service's pwrite64 and fsync calls per thread, every
500 ms (perf stat on the syscall tracepoints), beside its CPU ticks every
100 ms, so that the batch rows' window can be cut afterwards."""
import subprocess, sys, time
out = sys.argv[1]
pid = None
while pid is None:
    time.sleep(0.05)
    r = subprocess.run(["pgrep", "-x", "delayline"], capture_output=True, text=True)
    pid = int(r.stdout.split()[0]) if r.stdout.split() else None
started = time.monotonic()
stat = subprocess.Popen(["perf", "stat", "-I", "500", "--per-thread", "-x", ",", "-o",
                         f"{out}/syscalls.csv", "-e",
                         "syscalls:sys_enter_pwrite64,syscalls:sys_enter_fsync,syscalls:sys_enter_pread64",
                         "-p", str(pid)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
with open(f"{out}/ticks-count.txt", "w") as log:
    log.write(f"# perf stat started at monotonic {started:.3f}\n")
    while True:
        try:
            f = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
        except OSError:
            break
        log.write(f"{time.monotonic() - started:.3f} {int(f[11]) + int(f[12])}\n")
        log.flush()
        time.sleep(0.1)
stat.wait()
