import sys, math; sys.path.insert(0,'benchmarks'); sys.path.insert(0,'.')
from pathlib import Path
import replay_budget as rb
from replay_budget import load, load_compiles, replay
folder=Path('benchmarks/results/2026-11-26c-2xH200')
compiles=load_compiles(folder/'gemm1152-compile-s-c602185.json.gz'); tables=load(folder/'gemm1152-c602185.json.gz')
def mk(f):
    def w(config):
        tile = math.prod(v for v in (getattr(config, "kwargs", None) or {}).values() if isinstance(v, int) and not isinstance(v, bool) and v >= 16)
        return float(f(tile, getattr(config, "num_stages", None) or 1, getattr(config, "num_warps", None) or 4))
    return w
forms={'t*s*w':lambda t,s,w:t*s*w,'t*s/w':lambda t,s,w:t*s/w,'t/w':lambda t,s,w:t/w,'t*sqrt(s)/w':lambda t,s,w:t*s**.5/w}
N=int(sys.argv[1])
for name,f in forms.items():
    rb.compile_weight=mk(f)
    runs=[(shape,seed,*replay(table, seed, limit=7.09, start_s=2.5, rung_s=1.2, slot_s=0.005, compiles=compiles)) for shape, table in tables.items() for seed in range(N)]
    rs=sorted(r[2] for r in runs)
    print('%-12s'%name, sum(r[2]<=1.03 for r in runs), len(runs), 'geomean %.4f'%math.exp(sum(math.log(r) for r in rs)/len(rs)), 'worst %.3f'%rs[-1], 'max el %.2f'%max(r[4] for r in runs), 'mean el %.2f'%(sum(r[4] for r in runs)/len(runs)))
