"""``pycollect trace merge DIR [-o FILE]``: the ranks' ``PYCOLLECT_TRACE`` files as one timeline.

The merged file has every rank's events (pid = rank, named ``rank R (node N)``), opens in
https://ui.perfetto.dev or chrome://tracing, and a table says how long each rank spent in
collectives and how much of that it waited on its peers. Runs in one process, communicates with no one
and loads no MPI, so it runs on a login node where MPI cannot start.
"""
from __future__ import annotations

import json
import os

from ..engine.trace_files import FILE_RE
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
    try:
        files = rank_files(args.directory)
        merged = merge(files)
        path = os.path.abspath(args.output or os.path.join(args.directory, DEFAULT_OUTPUT))
        with open(path, "w") as f:
            json.dump(merged, f, separators=(",", ":"))
    except (OSError, ValueError) as e:
        args._trace_parser.error(str(e))  # one line, exit status 2
    rows = summary(merged["traceEvents"])
    for line in format_table(rows, COLUMNS):
        print(line)
    print(f"wrote {path}: {len(files)} rank(s), {len(merged['traceEvents'])} events "
          "(open in https://ui.perfetto.dev or chrome://tracing)")
    for note in merged["otherData"]["notes"]:
        print(f"note: {note}")
    return 0


def rank_files(directory: str) -> list[tuple[int, str]]:
    """``(rank, path)`` of every per-rank trace file in ``directory``, by rank."""
    if not os.path.isdir(directory):
        raise ValueError(f"{directory}: no such directory")
    found = sorted((int(m.group(1)), os.path.join(directory, name))
                   for name in os.listdir(directory) if (m := FILE_RE.match(name)))
    if not found:
        raise ValueError(f"{directory}: no pycollect-trace-rank*.json files (run with PYCOLLECT_TRACE={directory})")
    return found


def load(path: str) -> dict:
    """A trace file as ``{"traceEvents": [...], "otherData": {...}}`` (the JSON array form is accepted too)."""
    try:
        with open(path) as f:
            data = json.load(f)
    except json.JSONDecodeError as e:
        raise ValueError(f"{path}: not JSON ({e})") from None
    if isinstance(data, list):
        data = {"traceEvents": data}
    if not isinstance(data, dict) or not isinstance(data.get("traceEvents"), list):
        raise ValueError(f"{path}: not a trace-event file (expected a list or an object with traceEvents)")
    return data


def merge(files: list[tuple[int, str]]) -> dict:
    """One trace of every rank's events; each rank keeps its pid and gets a process_name if it had none."""
    events, ranks, notes = [], {}, []
    for rank, path in files:
        data = load(path)
        info = data.get("otherData", {})
        ranks[str(rank)] = info
        own = data["traceEvents"]
        if not any(e.get("ph") == "M" and e.get("name") == "process_name" for e in own):
            events.append({"ph": "M", "pid": rank, "tid": 0, "name": "process_name",
                           "args": {"name": f"rank {rank} (node {info.get('node', '?')})"}})
        events.extend(own)
        aligned = info.get("clock", {}).get("ranks")
        world = info.get("world_size")
        if aligned is not None and world is not None and aligned < world:
            notes.append(f"rank {rank}: clock aligned over {aligned} of {world} ranks "
                         "(its first traced Communicator was not the world); times across groups may be offset")
    world = max((i.get("world_size", 0) for i in ranks.values()), default=0)
    if world > len(files):
        missing = sorted(set(range(world)) - {r for r, _ in files})
        notes.append(f"no file for rank(s) {missing} of a world of {world}")
    return {"traceEvents": events, "displayTimeUnit": "ms", "otherData": {"ranks": ranks, "notes": notes}}


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
