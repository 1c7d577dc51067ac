import sys

sys.setswitchinterval(0.0005)  # session 24 experiment: GIL hand-offs at 0.5 ms
