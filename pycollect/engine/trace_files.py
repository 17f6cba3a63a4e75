"""The names of ``PYCOLLECT_TRACE``'s per-rank files: what the tracer writes (engine/trace.py) and what ``pycollect
trace merge`` reads (tools/trace.py). A module of its own, without MPI, so that merging runs where MPI cannot start."""
from __future__ import annotations

import re

FILE = "pycollect-trace-rank{rank}.json"
FILE_RE = re.compile(r"^pycollect-trace-rank(\d+)\.json$")
