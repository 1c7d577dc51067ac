"""Compiling ahead of the first timed slot. precompile.py compiles every config of a new (kernel, key)
in parallel, splitting them over a node's ranks; compile_workers.py owns the per-rank pool of compile
worker processes (and the TRITON_CTX_TUNE_COMPILE_WORKERS variable) that does the compiling; shared_ptxas.py
has those workers run ptxas once per PTX on the node; node_lock.py holds the file lock it shares with
precompile's node-wide claims.
compile/ imports runtime/ and errors.py; it is imported by the engine (session.py), options.py and the
package's __init__ (start_compile_workers). One edge runs upward: precompile.py names the engine's
KeyState (engine/state.py) in its signatures.
"""
