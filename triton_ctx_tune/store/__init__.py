"""Where results are stored: cache.py is the persistent per-(kernel, key) tuning cache that rank 0
reads and writes, function_cache.py the cache of function-level (@autotune) points, fingerprint.py
the digest of a kernel's code and everything it calls that keys both caches, incremental.py the plan
for re-tuning a key whose config list alone changed since its entry, and quarantine.py the
record of slots that hung or crashed a process, so a later run skips them. store/ imports runtime/
(compat, collectives) and errors.py only; the engine, options.py, function_tuner.py and tools.cli
import it.
"""
