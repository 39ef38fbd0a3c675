import re,collections,sys
cur=None; best=collections.defaultdict(dict); order=[]
for line in open(sys.argv[1]):
    if line.startswith("=="):
        cur=line.split()[1]; order.append(cur) if cur not in order else None; continue
    m=re.match(r"(Lq=\d+ ctx=\d+): (\d+) us",line)
    if m: best[m[1]][cur]=min(best[m[1]].get(cur,1e9),int(m[2]))
for k,v in best.items(): print(k, v, f"{v[order[0]]/v[order[1]]:.2f}x")
