"""The engine: how a tuned call runs and how its decisions are made. call.py routes each launch of a
tuned call (warm: the cached winner; otherwise it opens a Session), session.py runs a tuning call
step by step and gives every launch its slot, search.py and state.py plan the slots of each
(kernel, key), decisions.py reduces the ranks' timings and commits the winners, validate.py checks a
decided key's outputs, exactly_once.py keeps a re-executed step's state writes from happening twice,
services.py is what decisions and validate may use of a session, and progress.py prints the progress
line. Imports run one way: the public modules (tuner.py, function_tuner.py) import the engine; the
engine imports runtime/, compile/, store/, tools.logs and the public leaves options.py and errors.py,
never tuner.py, function_tuner.py, tools.report or tools.cli.
"""
