"""Sum folded stacks (stackcollapse-perf.pl output, thread names kept) into
groups: each stack goes to the first group one of whose patterns it holds."""
import re, sys, collections
GROUPS = [
    ("checkpoints (the log copied into the database file)", [r"checkpoint::once", r"sqlite3WalCheckpoint"]),
    ("commit: fsync", [r"sqlite3PagerCommitPhaseOne.*fsync", r"sqlite3PagerSync.*fsync", r"walSyncFile"]),
    ("commit: the log's frames written", [r"pagerWalFrames", r"sqlite3WalFrames"]),
    ("commit: the rest", [r"sqlite3BtreeCommitPhase", r"sqlite3VdbeHalt", r"vdbeCommit"]),
    ("SQL: statements on the writer", [r"^ledger-writer.*(sqlite3_step|sqlite3VdbeExec|sqlite3_prepare|sqlite3Prepare)"]),
    ("the writer's grouping and answers", [r"^ledger-writer"]),
    ("publishing (lapin, the publisher)", [r"^lapin-io-loop", r"lapin::", r"broker::publisher", r"amq_protocol", r"cookie_factory"]),
    ("HTTP (hyper, parsing, answers)", [r"hyper::", r"axum::", r"serde_json", r"serde_path_to_error", r"delayline::http::"]),
    ("the bookkeeper awaiting the ledger", [r"bookkeeper"]),
    ("the runtime: parking, waking, switching threads", [r"tokio::runtime", r"finish_task_switch", r"schedule_hrtimeout", r"futex", r"epoll", r"parking_lot", r"__schedule"]),
    ("other", [r""]),
]
compiled = [(name, [re.compile(p) for p in pats]) for name, pats in GROUPS]
totals = collections.Counter()
threads = collections.Counter()
n = 0
for line in open(sys.argv[1]):
    stack, _, count = line.rstrip().rpartition(" ")
    count = int(count)
    n += count
    threads[stack.split(";")[0].split("-")[0] if not stack.startswith("ledger") else "ledger-writer"] += count
    for name, pats in compiled:
        if any(p.search(stack) for p in pats):
            totals[name] += count
            break
us = float(sys.argv[2]) if len(sys.argv) > 2 else None
for name, _ in GROUPS:
    share = totals[name] / n
    extra = f" ({share * us:.0f} µs)" if us else ""
    print(f"| {name} | {share * 100:.1f} %{extra} |")
print("samples", n, dict(threads.most_common(6)), file=sys.stderr)
