"""The runtime: what the package touches of Triton and torch.distributed, and nothing of its own.
compat.py holds everything that depends on the Triton version, patch.py replaces Triton's
Autotuner.run while a tuner is active, resolver.py attributes a launch to the tuned call it belongs
to (across threads), timing.py times one slot (CUDA events, CUDA graphs or the host clock) and
collectives.py is the bounded, schedule-checked all-gather/broadcast every rank meets in (on a gloo
group of the tuner's own); buckets.py maps a kernel key
to its shape bucket, devices.py knows GPU peaks and streams.py notes the streams a re-executed
function works on (to tell a key that overlaps their work), collector.py keeps the garbage collector's
pauses out of a tuning call's steps, and clean_exit.py keeps the package from
holding the user's process group past destroy_process_group(). It is the bottom layer:
runtime modules import each other and errors.py only, and every other layer may import them.
"""
