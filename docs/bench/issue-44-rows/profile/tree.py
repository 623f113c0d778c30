import sys, collections, re
hz=499
def samples(path):
    cur=None
    for line in open(path):
        line=line.rstrip('\n')
        if not line:
            if cur: yield cur
            cur=None; continue
        if not line.startswith('\t') and not line.startswith(' '):
            cur=(line.split()[0],[])
        else:
            f=line.strip().split(None,1)
            s=f[1] if len(f)>1 else '?'
            s=re.sub(r'\+0x[0-9a-f]+','',s)
            s=re.sub(r' \(.*\)$','',s)
            cur[1].append(s)
    if cur: yield cur
path,n,target=sys.argv[1],float(sys.argv[2]),sys.argv[3]
depth=int(sys.argv[4]) if len(sys.argv)>4 else 1
per=lambda c: c/hz/n*1e6
kids=collections.Counter(); tot=0
for comm,st in samples(path):
    idx=[i for i,f in enumerate(st) if target in f]
    if not idx: continue
    tot+=1
    i=max(idx)  # outermost occurrence
    # callee chain below it, skipping inlined noise: take `depth` frames toward leaf
    chain=tuple(st[max(0,i-depth):i][::-1]) if i>0 else ('<self>',)
    kids[' > '.join(x[:70] for x in chain)]+=1
print(f'{target}: {per(tot):.1f} us/task')
for k,v in kids.most_common(30): print(f'  {per(v):6.1f} {k}')
