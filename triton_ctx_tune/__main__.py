"""`python -m triton_ctx_tune <verb>`: see cli.py."""
from __future__ import annotations

from .cli import main

raise SystemExit(main())
