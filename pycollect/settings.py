"""A Communicator's settings: read once from its arguments and the environment, then agreed by every rank.

Settings decide how messages flow (validation adds a fingerprint exchange to every call, a
timeout turns MPI's blocking calls into polled non-blocking ones, the segment sizes cut messages
into pieces that both ends must cut alike, the tuning table and the topology choose the
algorithm, tracing aligns the ranks' clocks by messages), so ranks that differ in any of them
would pair wrong messages. ``agree`` compares them in one ``Allgather`` when the Communicator is
built: every rank raises when any rank's settings were bad or when they differ, naming the
setting and which ranks had what.
"""
from __future__ import annotations

import json
import math
import os
import zlib
from dataclasses import dataclass
from typing import cast

import numpy as np

from .engine import args, environment as env
from .engine.exchange import allgather_json
from .engine.topology import Topology
from .engine.validate import failures, ranks_by_value, ranks_text
from .select import env_overrides, load_tuning

FIELDS = ("validate", "timeout", "abort_on_timeout", "segment_bytes", "tree_segment_bytes", "tuning", "topology",
          "trace")


@dataclass(frozen=True)
class Settings:
    """What every rank of a Communicator must share. ``tuning``: the table rows from a file (empty
    without one); ``forced``: ``PYCOLLECT_ALGO_*``; ``topology``: passed by the caller, or None (detected);
    ``trace``: ``PYCOLLECT_TRACE``'s directory, or None. Only whether it is set is shared: traced ranks
    align their clocks when the runner is made (engine/trace.py), and each rank may write to a directory of
    its own (a node's local disk)."""

    validate: bool
    timeout: float | None
    abort_on_timeout: bool
    segment_bytes: int
    tree_segment_bytes: int
    tuning: dict
    forced: dict
    topology: Topology | None
    trace: str | None = None

    def record(self) -> list[float]:
        """One float64 per field (names and tables as CRC-32 ids): the same on ranks whose settings agree."""
        table = json.dumps([self.tuning, self.forced], sort_keys=True)
        topo = None if self.topology is None else list(self.topology.node_of)
        return [float(self.validate), -1.0 if self.timeout is None else self.timeout, float(self.abort_on_timeout),
                float(self.segment_bytes), float(self.tree_segment_bytes), float(zlib.crc32(table.encode())),
                float(zlib.crc32(repr(topo).encode())), float(self.trace is not None)]


def read(*, tuning=None, segment_bytes=None, tree_segment_bytes=None, topology=None, validate=None, timeout=None,
         abort_on_timeout=None, environ=os.environ) -> Settings:
    """Each setting from its argument, else its environment variable, checked; the first bad one raises."""
    if topology is not None and not isinstance(topology, Topology):
        raise TypeError(f"Communicator: topology must be a pycollect Topology, got {type(topology).__name__}")
    if tuning is not None:
        table = load_tuning(args.path("Communicator: tuning", tuning), "Communicator: tuning")
    else:
        path = env.path(env.TUNING, environ)
        table = load_tuning(path, env.TUNING) if path else {}
    return Settings(
        validate=(args.flag("Communicator: validate", validate) if validate is not None else
                  env.switch(env.DEBUG, False, "0 (off) or 1 (compare every collective's arguments across ranks)",
                             environ)),
        timeout=(args.seconds("Communicator: timeout", timeout) if timeout is not None
                 else env.seconds(env.TIMEOUT, environ)),
        abort_on_timeout=(args.flag("Communicator: abort_on_timeout", abort_on_timeout)
                          if abort_on_timeout is not None else
                          env.switch(env.TIMEOUT_ABORT, True, "0 (raise CollectiveTimeout) or 1 (abort the job)",
                                     environ)),
        segment_bytes=(args.nbytes("segment_bytes", segment_bytes) if segment_bytes is not None
                       else env.nbytes(env.SEGMENT_BYTES, 4 << 20, environ)),
        tree_segment_bytes=(args.nbytes("tree_segment_bytes", tree_segment_bytes) if tree_segment_bytes is not None
                            else env.tree_segment_bytes(environ=environ)),
        tuning=table, forced=env_overrides(environ), topology=topology, trace=env.directory(env.TRACE, environ))


# -- agreement ------------------------------------------------------------------------------------------------
def agree(comm, settings: Settings | None, error: BaseException | None) -> None:
    """Every rank's settings against every other's, in one ``Allgather`` on ``comm`` (the caller's).

    Raises on every rank when a rank's settings failed their checks (that rank its own error,
    the others a ValueError quoting it) or when they differ (a ValueError naming each setting
    that differs and which ranks had what). Returns when they agree.
    """
    size = comm.Get_size()
    mine = np.array([0.0] + [math.nan] * len(FIELDS) if settings is None else [1.0] + settings.record())
    table = np.empty((size, mine.size))
    comm.Allgather(mine, table)
    if table[:, 0].all() and (table == table[0]).all():
        return
    if not table[:, 0].all():
        messages = allgather_json(comm, None if error is None else f"{type(error).__name__}: {error}")
        if error is not None:
            raise error
        failed = {r: m for r, m in enumerate(messages) if m is not None}
        raise ValueError("Communicator: " + failures(failed, "settings checks"))
    parts = [_differs(name, table[:, 1 + i]) for i, name in enumerate(FIELDS) if len(set(table[:, 1 + i])) > 1]
    raise ValueError("Communicator: every rank must use the same settings; " + "; ".join(parts))


_WHERE = {"tuning": " (tuning=, PYCOLLECT_TUNING and PYCOLLECT_ALGO_*)", "topology": " (topology=, else detected)",
          "trace": " (PYCOLLECT_TRACE: set it on every rank or on none; the directories may differ)"}


def _differs(name: str, column) -> str:
    """``timeout differs: rank 1 has 5 s, ranks 0, 2-3 have none``, the smallest group first."""
    said = [f"{ranks_text(rs)} {'has' if len(rs) == 1 else 'have'} {_value(name, cast(float, v), i)}"
            for i, (v, rs) in enumerate(ranks_by_value(column.tolist()))]
    return f"{name} differs: {', '.join(said)}{_WHERE.get(name, '')}"


def _value(name: str, v: float, index: int) -> str:
    if name in ("validate", "abort_on_timeout", "trace"):
        return "on" if v else "off"
    if name == "timeout":
        return "none" if v < 0 else f"{v:g} s"
    if name in ("segment_bytes", "tree_segment_bytes"):
        return str(int(v))
    return f"{name} {index + 1}"   # tables and topologies travel as ids: say only which ranks share one
