"""What a user reads and runs afterwards. logs.py writes the per-rank text and JSONL logs (and declares
every event kind in EVENTS); report.py reads those logs back into what was chosen and why; cli.py is
`python -m triton_ctx_tune` (cache list/show/clear/export/import and report). logs.py imports
runtime.compat only and is imported by the engine and options.py; report.py and cli.py read the
stores and logs (report imports tools.logs; cli imports store.cache, tools.logs and tools.report) and nothing
imports them but __main__.py.
"""
