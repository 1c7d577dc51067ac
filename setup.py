from __future__ import annotations

import re
from pathlib import Path

from setuptools import find_packages, setup

here = Path(__file__).parent
version = re.search(r'__version__ = "([^"]+)"', (here / "triton_ctx_tune" / "__init__.py").read_text()).group(1)

setup(
    name="triton_ctx_tune",
    version=version,
    description="A torch.distributed-native contextual autotuner for Triton",
    long_description=(here / "README.md").read_text(),
    long_description_content_type="text/markdown",
    packages=find_packages(include=["triton_ctx_tune", "triton_ctx_tune.*"]),
    python_requires=">=3.10",  # dataclass(kw_only=True) (engine/state.py, engine/search.py), X | Y aliases
    # torch 2.8 is Triton 3.4's own; an older one can hang in destroy_process_group (runtime/compat.OLDEST_TORCH).
    install_requires=["triton>=3.4", "torch>=2.8", "numpy"],
    extras_require={
        # The linters are pinned: a new release's new checks would fail CI on code that did not change.
        "test": ["pytest>=7", "mypy==2.4.1", "ruff==0.17.6"],
        "plot": ["matplotlib"],
        "clients": ["fla-core==0.6.0", "cut-cross-entropy==25.1.1"],
        # The conformance zoo's libraries (benchmarks/zoo, docs/zoo.md); FLA and CCE come from `clients`.
        "zoo": ["flag-gems==5.0.2", "gemlite==0.6.0.post2", "torchao==0.18.0"],
    },
    entry_points={"console_scripts": ["triton-ctx-tune=triton_ctx_tune.tools.cli:main"]},
)
