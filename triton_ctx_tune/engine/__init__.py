"""The engine: how a tuned call runs and how its decisions are made. call.py routes each launch of a
tuned call (warm: the cached winner; otherwise it opens a Session), session.py drives a tuning call
step by step (begin, agree, decide, end: re-execution and online are its two drivers, in tuner.py),
schedule.py derives what ends a step, and which collectives, from what the ranks agreed on,
executor.py routes each launch of a step (a known config, a slot, a stand-in while compiling, a
fallback), search.py and state.py plan the slots of each
(kernel, key), decisions.py reduces the ranks' timings and commits the winners, validate.py checks a
decided key's outputs, exactly_once.py keeps a re-executed step's state writes from happening twice,
services.py builds a call's services on first use and hands them to the executor, decisions and
validate (never the session), and progress.py prints the progress
line. Imports run one way: the public modules (tuner.py, function_tuner.py) import the engine; the
engine imports runtime/, compile/, store/, tools.logs and the public leaves options.py and errors.py,
never tuner.py, function_tuner.py, tools.report or tools.cli.
"""
