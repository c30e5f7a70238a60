import sys,collections
f=sys.argv[1]; victim=sys.argv[2] if len(sys.argv)>2 else None
rows=[l.split() for l in open(f)]
by=collections.defaultdict(list)
for t,pid,key,ticks in rows: by[key].append((float(t),int(ticks)))
# kill time = last sample of the router whose samples end first
ends={k:v[-1][0] for k,v in by.items()}
vk=min(ends,key=ends.get); tk=ends[vk]
def at(k,t):
    v=by[k]; best=min(v,key=lambda x:abs(x[0]-t)); return best
tot_storm=0; tot_idle=0
for k in sorted(by):
    if k==vk: continue
    a=at(k,tk-20); b=at(k,tk); c=at(k,tk+20)
    idle=(b[1]-a[1])/(b[0]-a[0]); storm=(c[1]-b[1])/(c[0]-b[0])
    extra=(c[1]-b[1])-idle*(c[0]-b[0])
    tot_storm+=extra
    print(f"{k}: idle {idle/100:.3f} cores, 20 s after kill {storm/100:.3f} cores, extra {extra/100:.2f} CPU-s")
print(f"killed {vk}; survivors' extra CPU in 20 s after the kill: {tot_storm/100:.2f} CPU-s")
