"""``pycollect bench fit --from F``: the fit, held-out errors, choices and tuning file again from the measurements
a run wrote to its ``--json`` file F, without MPI (tools/fit.py does the rest of ``bench fit``)."""
from __future__ import annotations

import sys

from .common import MAX_SIZE
from .fit import fit_and_report, measuring_flags_given, model_table, output_files, plot, write_fit
from .report import outputs_problem


class SavedRun:
    """What the fit reads of a world, from a ``bench fit --json`` file: its topology and tree segment, and
    the algorithm ``auto`` ran at each measured size then (its ``choices``)."""

    rank = 0

    def __init__(self, doc: dict):
        from ..engine.topology import Topology
        head = doc["header"]
        try:
            self.topology = Topology(tuple(head["node_of"]))
        except (TypeError, ValueError) as e:
            raise ValueError(f"the file's header.node_of: {e}") from None
        self.size = self.topology.size
        self.tree_segment_bytes = head.get("tree_segment_bytes", head.get("pipeline_bytes", 0))
        if isinstance(self.tree_segment_bytes, bool) or not isinstance(self.tree_segment_bytes, int) \
                or self.tree_segment_bytes < 0:
            raise ValueError(f"the file's header.tree_segment_bytes must be an integer >= 0, got "
                             f"{self.tree_segment_bytes!r}")
        choices = doc.get("choices", [])
        if not isinstance(choices, list) or not all(isinstance(c, dict) and {"collective", "size_bytes", "auto_now"}
                                                    <= c.keys() for c in choices):
            raise ValueError("the file's choices must be a list of objects with collective, size_bytes and auto_now")
        self._auto = {(c["collective"], c["size_bytes"]): c["auto_now"] for c in choices}

    def auto_algorithm(self, collective: str, nbytes: int) -> str:
        return self._auto.get((collective, nbytes), "?")


MEASURED = ("collective", "size_bytes", "algorithm", "iters", "measured_us", "passes_us")


def load_saved(path: str) -> tuple[dict, list[dict]]:
    """``(the file's document, its measured rows)``; ValueError naming the file and what it lacks."""
    import json
    try:
        with open(path) as f:
            doc = json.load(f)
    except (OSError, ValueError) as e:
        raise ValueError(f"--from {path}: cannot read it as JSON ({e})") from None
    missing = [k for k in ("header", "records") if k not in doc] if isinstance(doc, dict) else ["all"]
    if not missing and "pingpong_model" not in doc and "model" not in doc:
        missing = ["pingpong_model"]
    if missing or doc.get("kind") != "fit" or "node_of" not in doc["header"]:
        raise ValueError(f"--from {path}: not a `bench fit --json` file (kind {doc.get('kind') if isinstance(doc, dict) else None!r}; "
                         f"missing {', '.join(missing) or 'header.node_of'})")
    if not isinstance(doc["records"], list) or not all(isinstance(r, dict) for r in doc["records"]):
        raise ValueError(f"--from {path}: records is not a list of records")
    rows = [{k: r[k] for k in MEASURED if k in r} for r in doc["records"]]
    for i, row in enumerate(rows):
        problem = record_problem(row)
        if problem:
            raise ValueError(f"--from {path}: records[{i}] {problem}")
    return doc, rows


def record_problem(row: dict) -> str | None:
    """What makes a measured record unusable by the fit (a hand-edited or damaged file), or None."""
    import math

    from .. import algorithms
    from .tiers import COLLECTIVES

    def positive(value, whole: bool) -> bool:
        kinds = (int,) if whole else (int, float)
        return isinstance(value, kinds) and not isinstance(value, bool) and 0 < value < math.inf
    missing = [k for k in MEASURED if k not in row and k != "passes_us"]
    if missing:
        return f"lacks {', '.join(missing)}"
    if row["collective"] not in COLLECTIVES:
        return f"has collective {row['collective']!r}; a fit measures {', '.join(COLLECTIVES)}"
    if row["algorithm"] not in algorithms(row["collective"]):
        return f"has algorithm {row['algorithm']!r}, which {row['collective']} does not have"
    for key in ("size_bytes", "iters"):
        if not positive(row[key], whole=True):
            return f"has {key} {row[key]!r}; expected a positive integer"
    if row["size_bytes"] > MAX_SIZE:   # as -e/--max-bytes: no fit measures more, and the fit's candidates grow with it
        return f"has size_bytes {row['size_bytes']!r}, above the largest buffer a fit measures, 1024G (2**40 bytes)"
    times = [row["measured_us"], *row.get("passes_us", [])] if isinstance(row.get("passes_us", []), list) else None
    if times is None or not all(positive(t, whole=False) for t in times):
        return f"has measured_us {row['measured_us']!r} and passes_us {row.get('passes_us')!r}; expected positive times"
    return None


def run(args) -> int:
    """The model, held-out errors, choices and tuning file again from a saved run's measurements (``--from``)."""
    import datetime

    from ..costmodel import Model
    try:
        ignored = measuring_flags_given(args)
        if ignored:
            raise ValueError(f"--from measures nothing, so {', '.join(ignored)} would have no effect; "
                             "drop them, or measure again without --from")
        problem = outputs_problem(output_files(args))
        if problem:
            raise ValueError(problem)
        doc, rows = load_saved(args.from_file)
        world = SavedRun(doc)
        # a file from before the ping-pong model was kept apart has it as its only model
        key = "pingpong_model" if doc.get("pingpong_model") else "model"
        try:
            pingpong = Model.from_dict(doc[key] if isinstance(doc[key], dict) else {})
        except ValueError as e:
            raise ValueError(f"--from {args.from_file}: the file's {key}: {e}") from None
    except ValueError as e:
        sys.stderr.write(f"{args.prog_name}: error: {e}\n")
        return 2
    print(f"pycollect bench fit --from {args.from_file}: {world.topology.describe()}, measured {doc['header'].get('date', '?')}")
    print("\nping-pong model (as measured then)")
    print("\n".join(model_table(pingpong)))
    fitted = {"model": pingpong, "choices": [], "tuning": {}, "tuning_entries": [], "held": [], "stats": None}
    if rows:
        fitted = fit_and_report(args, rows, pingpong, world)
    if args.json:
        head = dict(doc["header"], refit_from=args.from_file, refit_args=list(sys.argv[1:]),
                    refit_date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"))
        print(f"wrote {write_fit(args, head, rows, pingpong, doc.get('pairs', []), fitted)}")
    if args.plot:
        print(f"wrote {plot(args.plot, rows, world.topology.describe())}")
    sys.stdout.flush()
    return 0
