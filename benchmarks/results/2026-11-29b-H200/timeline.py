import json,sys,ast,glob
for r in sys.argv[1:]:
    f=glob.glob(f'{r}/ctx_logs/*/rank-0.jsonl')[0]
    ev=[json.loads(l) for l in open(f)]
    t0=ev[0]['time']
    out=[r.split('/')[-1]]
    steps={}
    for e in ev:
        if e['event']=='call' and e['time']-t0>0.5: break
        if e['event']=='slot': steps.setdefault(e['step'],e['time']-t0)
        if e['event']=='precompile':
            sp=e['spans']; sp=ast.literal_eval(sp) if isinstance(sp,str) else sp
            ph=e['phases']; ph=ast.literal_eval(ph) if isinstance(ph,str) else ph
            last=max(sp.items(), key=lambda kv: kv[1][1])
            out.append('%s met %.3f fr %.3f last %.3f(#%s start %.2f) lw %.3f'%(e['kernel'][:4],e['met_s'],e['met_s']+ph.get('first_ready_s',0),e['met_s']+last[1][1],last[0],e['met_s']+last[1][0], ph.get('launcher_wait_s',0)))
        if e['event'] in ('end',): out.append('%s %.3f'%(e['event'],e['time']-t0))
    out.append('step1end %.3f steps %d'%(steps[1], len(steps)))
    print(' | '.join(out))
