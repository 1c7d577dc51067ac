import json,os,sys,time,torch,torch.distributed as d
from triton_ctx_tune.runtime.collectives import Collectives
d.init_process_group("gloo");c=Collectives(True);W=d.get_world_size();R=d.get_rank()
g=json.dumps({"new":[],"launches":6,"measured":None,"failed":None}).encode()
T=torch.rand(6,48,3,dtype=torch.float64);K=torch.zeros(6,48,dtype=torch.int64)
a=lambda:c.agree(g,"a",lambda:g,payload=(0,))
gt=lambda:c.all_gather(T,"g")
bk=lambda:c.broadcast_from_root(K,"b")
sf=lambda:c.share_failures({},48,"s")
def raw():
 o=[torch.empty_like(T) for _ in range(W)];d.all_gather(o,T)
def dec():a();gt();bk()
def meet():
 for _ in range(6):c.agree(g,"l",lambda:g,payload=(0,-1))
 a()
 for _ in range(18):sf()
ops=dict(agree=a,gather_timings_6x48x3=gt,broadcast_keep_6x48=bk,share_failures_none_48=sf,raw_dist_all_gather_6x48x3=raw,step_plain=a,step_deciding=dec,step_meeting_6_keys=meet)
res={}
for n,f in ops.items():
 for _ in range(20):f()
 m=[]
 for _ in range(300):
  d.barrier();t=time.perf_counter();f();m.append(time.perf_counter()-t)
 e=[None]*W;d.all_gather_object(e,m);s=sorted(max(x) for x in zip(*e))
 res[n]=dict(median_ms=s[150]*1e3,p90_ms=s[269]*1e3)
if R==0:
 json.dump(dict(world=W,cpus=os.cpu_count(),torch=torch.__version__,load=os.getloadavg(),collectives=res),open(sys.argv[1]+f"/c{W}.json","w"),indent=1)
 print(W,json.dumps(res))
d.barrier();os._exit(0)
