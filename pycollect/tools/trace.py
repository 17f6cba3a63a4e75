"""``pycollect trace merge DIR [-o FILE]``: the ranks' ``PYCOLLECT_TRACE`` files as one timeline.

The merged file has every rank's events (pid = rank, named ``rank R (node N)``), opens in
https://ui.perfetto.dev or chrome://tracing, and a table says how long each rank spent in
collectives and how much of that it waited on its peers. Runs in one process, communicates with no one
and loads no MPI, so it runs on a login node where MPI cannot start.
"""
from __future__ import annotations

import json
import math
import os

from ..engine.trace_files import FILE_RE
from . import report
from .report import format_table

DEFAULT_OUTPUT = "pycollect-trace.json"  # inside DIR; not a per-rank name, so a second merge ignores it
COLUMNS = [("rank", "rank", "{}"), ("node", "node", "{}"), ("calls", "calls", "{}"),
           ("collective_ms", "in collectives ms", "{:.3f}"), ("wait_ms", "waiting ms", "{:.3f}"),
           ("wait_share", "waiting %", "{:.1f}")]


def add_arguments(parser) -> None:
    sub = parser.add_subparsers(dest="action", metavar="ACTION", parser_class=type(parser))
    sub.required = True
    p = sub.add_parser("merge", help="join DIR/pycollect-trace-rank*.json into one trace file",
                       description="join DIR/pycollect-trace-rank*.json into one trace file")
    p.add_argument("directory", metavar="DIR", help="the PYCOLLECT_TRACE directory of a run")
    p.add_argument("-o", "--output", metavar="FILE", help=f"merged trace (default DIR/{DEFAULT_OUTPUT})")
    p.set_defaults(_trace_parser=p)


def run(args) -> int:
    path = os.path.abspath(args.output or os.path.join(args.directory, DEFAULT_OUTPUT))
    try:
        files = rank_files(args.directory)
        if args.output == "":
            raise ValueError("-o/--output: the path is empty; name a file")
        problem = report.output_problem(path, "-o/--output" if args.output else "the merged trace")
        if problem:
            raise ValueError(problem)
        if any(os.path.samefile(path, f) for _, f in files if os.path.exists(path)):
            raise ValueError(f"-o/--output {path} is one of the rank traces it merges; name another file")
        merged = merge(files)
        rows = summary(merged["traceEvents"])
        report.write_atomically(path, lambda f: json.dump(merged, f, separators=(",", ":"), allow_nan=False))
    except OSError as e:
        args._trace_parser.error(f"cannot write {path}: {e.strerror}")
    except ValueError as e:
        args._trace_parser.error(str(e))  # one line, exit status 2; nothing written
    for line in format_table(rows, COLUMNS):
        print(line)
    print(f"wrote {path}: {len(files)} rank(s), {len(merged['traceEvents'])} events "
          "(open in https://ui.perfetto.dev or chrome://tracing)")
    for note in merged["otherData"]["notes"]:
        print(f"note: {note}")
    return 0


def rank_files(directory: str) -> list[tuple[int, str]]:
    """``(rank, path)`` of every per-rank trace file in ``directory``, by rank; ValueError where two name one rank
    (``rank1`` and ``rank01``)."""
    if not os.path.isdir(directory):
        raise ValueError(f"{directory}: no such directory")
    found = sorted((int(m.group(1)), os.path.join(directory, name))
                   for name in os.listdir(directory) if (m := FILE_RE.match(name)))
    if not found:
        raise ValueError(f"{directory}: no pycollect-trace-rank*.json files (run with PYCOLLECT_TRACE={directory})")
    for (rank, a), (other, b) in zip(found, found[1:]):
        if rank == other:
            raise ValueError(f"{a} and {b} are both rank {rank}'s trace: remove one")
    return found


def load(path: str, rank: int | None = None) -> dict:
    """A checked trace file as ``{"traceEvents": [...], "otherData": {...}}`` (the JSON array form is accepted too).

    ValueError, naming ``path``, where it is not a trace this merge can read: not UTF-8 JSON (NaN and Infinity
    included), an event that is not an object or lacks what the merge and the summary read (an integer ``pid``,
    numbers ``ts`` and ``dur`` of a span, the name of a process), a malformed ``otherData``; and, given the
    ``rank`` the file's name says, a file holding another rank's trace.
    """
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f, parse_constant=_no_constant)
    except UnicodeDecodeError as e:
        raise ValueError(f"{path}: not a trace file: not UTF-8 text ({e.reason} at byte {e.start})") from None
    except json.JSONDecodeError as e:
        raise ValueError(f"{path}: not JSON ({e})") from None
    except ValueError as e:    # _no_constant's
        raise ValueError(f"{path}: not JSON ({e})") from None
    except OSError as e:
        raise ValueError(f"{path}: cannot read ({e.strerror})") from None
    if isinstance(data, list):
        data = {"traceEvents": data}
    if not isinstance(data, dict) or not isinstance(data.get("traceEvents"), list):
        raise ValueError(f"{path}: not a trace-event file (expected a list or an object with traceEvents)")
    data.setdefault("otherData", {})
    try:
        _check_info(data["otherData"], rank)
        for i, event in enumerate(data["traceEvents"]):
            _check_event(event, rank, i)
    except ValueError as e:
        raise ValueError(f"{path}: {e}") from None
    return data


def _no_constant(name: str):
    raise ValueError(f"{name} is not a JSON number")


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value) -> bool:
    return (isinstance(value, (int, float)) and not isinstance(value, bool)) and math.isfinite(value)


def _check_info(info, rank: int | None) -> None:
    """``otherData`` as the tracer writes it: an object; its rank, world size and clock of the right types."""
    if not isinstance(info, dict):
        raise ValueError(f"otherData is a {type(info).__name__}, not an object")
    world = info.get("world_size")
    if world is not None and not (_is_int(world) and world >= 1):
        raise ValueError(f"otherData.world_size is {world!r}, not a positive integer")
    own = info.get("rank")
    if own is not None and not _is_int(own):
        raise ValueError(f"otherData.rank is {own!r}, not an integer")
    if rank is not None and own is not None and own != rank:
        raise ValueError(f"holds rank {own}'s trace (otherData.rank), not rank {rank}'s as its name says")
    if rank is not None and world is not None and rank >= world:
        raise ValueError(f"rank {rank} is outside its world of {world} ranks (otherData.world_size)")
    clock = info.get("clock")
    if clock is not None and not isinstance(clock, dict):
        raise ValueError(f"otherData.clock is {clock!r}, not an object")
    if clock is not None:
        if clock.get("ranks") is not None and not (_is_int(clock["ranks"]) and clock["ranks"] >= 1):
            raise ValueError(f"otherData.clock.ranks is {clock['ranks']!r}, not a positive integer")
        if clock.get("origin_s") is not None and not _is_number(clock["origin_s"]):
            raise ValueError(f"otherData.clock.origin_s is {clock['origin_s']!r}, not a number")


def _check_event(e, rank: int | None, i: int) -> None:
    """One trace event: an object with an integer pid (the file's rank), numbers where the summary adds them."""
    if not isinstance(e, dict):
        raise ValueError(f"event {i} is {e!r}, not an object")
    if not _is_int(e.get("pid")):
        raise ValueError(f"event {i} has pid {e.get('pid')!r}, not an integer rank")
    if rank is not None and e["pid"] != rank:
        raise ValueError(f"event {i} has pid {e['pid']}: it is rank {e['pid']}'s, not rank {rank}'s as the "
                         "file's name says")
    for key in ("ts", "dur"):
        if (key in e or (key == "dur" and e.get("ph") == "X")) and not _is_number(e.get(key)):
            raise ValueError(f"event {i} ({e.get('ph')!r} {e.get('name')!r}) has {key} {e.get(key)!r}, "
                             "not a finite number")
    if e.get("ph") == "X" and e["dur"] < 0:
        raise ValueError(f"event {i} ({e.get('name')!r}) lasts {e['dur']} us, less than nothing")
    if e.get("ph") == "M" and e.get("name") == "process_name" and not (
            isinstance(e.get("args"), dict) and isinstance(e["args"].get("name"), str)):
        raise ValueError(f"event {i} names its process without args.name")


def merge(files: list[tuple[int, str]]) -> dict:
    """One trace of every rank's events; each rank keeps its pid and gets a process_name if it had none.

    ValueError where the files are not of one run: their world sizes differ, or their clocks, aligned over the
    whole world, have different origins (a directory holding an earlier run's files too).
    """
    events, ranks, notes = [], {}, []
    loaded = [(rank, path, load(path, rank)) for rank, path in files]
    _check_one_run([(path, data["otherData"]) for _, path, data in loaded])
    for rank, path, data in loaded:
        info = data["otherData"]
        ranks[str(rank)] = info
        own = data["traceEvents"]
        if not any(e.get("ph") == "M" and e.get("name") == "process_name" for e in own):
            events.append({"ph": "M", "pid": rank, "tid": 0, "name": "process_name",
                           "args": {"name": f"rank {rank} (node {info.get('node', '?')})"}})
        events.extend(own)
        aligned = (info.get("clock") or {}).get("ranks")
        world = info.get("world_size")
        if aligned is not None and world is not None and aligned < world:
            notes.append(f"rank {rank}: clock aligned over {aligned} of {world} ranks "
                         "(its first traced Communicator was not the world); times across groups may be offset")
    world = max((i.get("world_size") or 0 for i in ranks.values()), default=0)
    if world > len(files):
        missing = sorted(set(range(world)) - {r for r, _ in files})
        notes.append(f"no file for rank(s) {missing} of a world of {world}")
    return {"traceEvents": events, "displayTimeUnit": "ms", "otherData": {"ranks": ranks, "notes": notes}}


def _check_one_run(infos: list[tuple[str, dict]]) -> None:
    """ValueError naming two files of different runs: world sizes, or origins of clocks aligned over the world."""
    worlds = [(path, i["world_size"]) for path, i in infos if i.get("world_size") is not None]
    for path, world in worlds[1:]:
        if world != worlds[0][1]:
            raise ValueError(f"{worlds[0][0]} (world_size {worlds[0][1]}) and {path} (world_size {world}) are "
                             "traces of different runs: merge one run's files (remove the others)")
    origins = [(path, i["clock"]["origin_s"]) for path, i in infos
               if isinstance(i.get("clock"), dict) and i["clock"].get("origin_s") is not None
               and i["clock"].get("ranks") is not None and i["clock"]["ranks"] == i.get("world_size")]
    for path, origin in origins[1:]:
        if origin != origins[0][1]:
            raise ValueError(f"{origins[0][0]} and {path} count time from different origins (otherData.clock."
                             f"origin_s {origins[0][1]} and {origin}): traces of different runs; merge one run's "
                             "files (remove the others)")


def summary(events: list[dict]) -> list[dict]:
    """Per rank: collective calls, time in them and time waiting on requests (the wait spans)."""
    rows: dict[int, dict] = {}
    nodes = {}
    for e in events:
        if e.get("ph") == "M" and e.get("name") == "process_name":
            nodes[e["pid"]] = e["args"]["name"].partition("(node ")[2].rstrip(")") or "?"
        if e.get("ph") != "X":
            continue
        row = rows.setdefault(e["pid"], {"rank": e["pid"], "calls": 0, "collective_ms": 0.0, "wait_ms": 0.0})
        if e.get("cat") == "collective":
            row["calls"] += 1
            row["collective_ms"] += e["dur"] / 1e3
        elif e.get("cat") == "wait":
            row["wait_ms"] += e["dur"] / 1e3
    for pid, row in rows.items():
        row["node"] = nodes.get(pid, "?")
        row["wait_share"] = 100 * row["wait_ms"] / row["collective_ms"] if row["collective_ms"] else 0.0
    return [rows[k] for k in sorted(rows)]
