import json,ast,glob,collections,statistics as st,sys
W=[1,2,4,8];S=[2,3,4];B=[32,64]
def lit(x): return x if not isinstance(x,str) else ast.literal_eval(x)
def cfg(kern,i):
    if kern in('chunk_fwd_kernel_h','chunk_bwd_kernel_dh'):
        s=S[i%3]; w=W[(i//3)%4]; bv=B[(i//12)%2]; bk=B[i//24]; return dict(BK=bk,BV=bv,w=w,s=s)
    if kern in('chunk_bwd_kernel_dqkwg','chunk_bwd_kernel_dv'):
        return dict(w=[2,4][i//3], s=S[i%3])
    if kern=='chunk_fwd_kernel_o':
        return [dict(BK=128,BV=128,w=8,s=3),dict(BK=64,BV=64,w=4,s=3),dict(BK=32,BV=32,w=2,s=3)][i]
d=collections.defaultdict(list)
for f in sys.argv[1:]:
    seen=collections.Counter()
    for l in open(f):
        e=json.loads(l)
        if e['event']!='precompile': continue
        k=e['kernel']; seen[k]+=1
        sp=lit(e['spans'])
        for c,(a,b) in sp.items(): d[(k,seen[k],int(c))].append(b-a)
for (k,n,c),v in sorted(d.items()):
    print(k[:22],n,c,cfg(k,c),'%.2f'%st.median(v))

def rank(xs):
    o=sorted(range(len(xs)),key=lambda i:xs[i]); r=[0]*len(xs)
    i=0
    while i<len(o):
        j=i
        while j+1<len(o) and xs[o[j+1]]==xs[o[i]]: j+=1
        for k in range(i,j+1): r[o[k]]=(i+j)/2
        i=j+1
    return r
def spear(a,b):
    ra,rb=rank(a),rank(b); n=len(a); ma=sum(ra)/n; mb=sum(rb)/n
    num=sum((x-ma)*(y-mb) for x,y in zip(ra,rb)); den=(sum((x-ma)**2 for x in ra)*sum((y-mb)**2 for y in rb))**.5
    return num/den if den else float('nan')
forms={'t*s*w':lambda t,s,w:t*s*w,'t*s/w':lambda t,s,w:t*s/w,'t/w':lambda t,s,w:t/w,'t*sqrt(s)/w':lambda t,s,w:t*s**.5/w}
keys=sorted({(k,n) for k,n,c in d})
for k,n in keys:
    cs=sorted(c for kk,nn,c in d if (kk,nn)==(k,n)); y=[st.median(d[(k,n,c)]) for c in cs]
    out=[]
    for name,fn in forms.items():
        x=[]
        for c in cs:
            g=cfg(k,c); t=g.get('BK',1)*g.get('BV',1); x.append(fn(t,g['s'],g['w']))
        out.append('%s %.2f'%(name,spear(x,y)))
    print(k[:22],n,' | '.join(out))
