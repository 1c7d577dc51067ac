"""`python -m triton_ctx_tune <verb>`: see cli.py."""
from __future__ import annotations

from .tools.cli import main

raise SystemExit(main())
