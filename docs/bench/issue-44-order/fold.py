import sys, collections
def samples(path):
    cur=None
    for line in open(path):
        line=line.rstrip('\n')
        if not line: 
            if cur: yield cur
            cur=None; continue
        if not line.startswith('\t') and not line.startswith(' '):
            parts=line.split()
            cur=(parts[0],[])
        else:
            f=line.strip().split(None,1)
            cur[1].append(f[1] if len(f)>1 else '?')
    if cur: yield cur
def tasks(a,b):
    rows=[l.split() for l in open('watch.log').readlines()[1:]]
    rows=[(float(r[0]),float(r[1])) for r in rows]
    lo=min(rows,key=lambda r:abs(r[0]-a)); hi=min(rows,key=lambda r:abs(r[0]-b))
    return hi[1]-lo[1]
path,a,b=sys.argv[1],float(sys.argv[2]),float(sys.argv[3])
n=tasks(a,b)
S=list(samples(path))
hz=149
print(f'{path}: {len(S)} samples, {n:.0f} tasks, {len(S)/hz/n*1e6:.1f} us/task sampled')
per=lambda c: c/hz/n*1e6
comm=collections.Counter(s[0] for s in S)
print('by thread:', ', '.join(f'{k} {per(v):.1f}' for k,v in comm.most_common(8)))
selfc=collections.Counter(s[1][0] if s[1] else '?' for s in S)
print('top self:'); [print(f'  {per(v):6.1f} {k[:110]}') for k,v in selfc.most_common(25)]
incl=collections.Counter()
for s in S:
    seen=set()
    for f in s[1]:
        g=f.split('::{{closure}}')[0]
        if any(x in g for x in ('delayline::','lapin::','hyper::','axum::','serde_json::','sqlite3_step','amq_protocol','tokio::runtime::io','malloc','free','epoll','h2::')):
            key=g[:100]
            if key not in seen: seen.add(key); incl[key]+=1
print('top inclusive:'); [print(f'  {per(v):6.1f} {k}') for k,v in incl.most_common(45)]
