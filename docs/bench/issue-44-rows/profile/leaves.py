import sys, collections
exec(open('tree.py').read().split('path,n,target')[0])
path,n,target=sys.argv[1],float(sys.argv[2]),sys.argv[3]
names=sys.argv[4].split(',')
per=lambda c: c/hz/n*1e6
c=collections.Counter(); tot=0
for comm,st in samples(path):
    if not any(target in f for f in st): continue
    tot+=1
    hit=None
    for f in st:  # leaf first: first named frame wins
        for nm in names:
            if nm in f: hit=nm; break
        if hit: break
    c[hit or 'other:'+st[0][:60]]+=1
print(f'{target}: {per(tot):.1f}')
for k,v in c.most_common(40): print(f'  {per(v):6.1f} {k}')
