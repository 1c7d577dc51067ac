"""Imported by compile workers that were asked to preload it: appends the importing process's pid to
the file named by $PRELOAD_MARKER, so a test can see which processes imported it while they started."""
import os

_path = os.environ.get("PRELOAD_MARKER")
if _path:
    with open(_path, "a") as f:
        f.write(f"{os.getpid()}\n")
