"""Peak throughput of the GPUs we know, for "fraction of peak" next to a call's achieved TFLOP/s and GB/s.

Dense bf16/fp16 tensor-core TFLOP/s and HBM GB/s from the vendors' data sheets (SXM parts). A
device not listed has no peak, and no fraction is shown.
"""
from __future__ import annotations

import torch

from .compat import interpret_mode

PEAKS: dict[str, tuple[float, float]] = {  # name fragment -> (TFLOP/s, GB/s)
    "H200": (989.0, 4800.0),
    "H100": (989.0, 3350.0),
    "B200": (2250.0, 8000.0),
    "A100": (312.0, 2039.0),
    "L40S": (362.0, 864.0),
    "MI300X": (1307.0, 5300.0),
}


def peak() -> tuple[float | None, float | None]:
    """This process's GPU's (TFLOP/s, GB/s) peaks, or (None, None)."""
    if interpret_mode() or not torch.cuda.is_available():
        return None, None
    name = torch.cuda.get_device_name()
    for fragment, peaks in PEAKS.items():
        if fragment in name:
            return peaks
    return None, None
