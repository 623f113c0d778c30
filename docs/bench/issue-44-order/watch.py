# Logs (CLOCK_MONOTONIC, accepted over HTTP+ingress, ingress accepted) of the
# bench's service every 100 ms, and starts perf on it once it is up.
import subprocess, time, re, urllib.request, sys
out = open('/tmp/prof/watch.log', 'w')
pid = None
while pid is None:
    r = subprocess.run(['pgrep', '-f', 'delayline serve'], capture_output=True, text=True)
    p = r.stdout.split()
    if p: pid = p[0]
    else: time.sleep(0.1)
time.sleep(1)
ss = subprocess.run(['ss', '-ltnp'], capture_output=True, text=True).stdout
port = None
for line in ss.splitlines():
    if f'pid={pid},' in line:
        m = re.search(r':(\d+)\s', line)
        if m: port = m.group(1)
out.write(f'pid {pid} port {port}\n'); out.flush()
perf = subprocess.Popen(['perf', 'record', '-k', 'CLOCK_MONOTONIC', '-F', '149', '--call-graph', 'dwarf,8192',
                         '-p', pid, '-o', '/tmp/prof/perf.data'], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
while True:
    try:
        text = urllib.request.urlopen(f'http://127.0.0.1:{port}/metrics', timeout=2).read().decode()
    except Exception:
        break
    acc = sum(float(l.split()[-1]) for l in text.splitlines() if l.startswith('delayline_tasks_accepted_total'))
    ing = sum(float(l.split()[-1]) for l in text.splitlines() if l.startswith('delayline_ingress_messages_total') and 'accepted' in l)
    out.write(f'{time.monotonic():.3f} {acc:.0f} {ing:.0f}\n'); out.flush()
    time.sleep(0.1)
perf.wait()
