"""``pycollect bench fit --from F``: the fit, held-out errors, choices and tuning file again from the measurements
a run wrote to its ``--json`` file F, without MPI (tools/fit.py does the rest of ``bench fit``)."""
from __future__ import annotations

import sys

from .fit import fit_and_report, model_table, output_files, plot, write_fit
from .report import outputs_problem


class SavedRun:
    """What the fit reads of a world, from a ``bench fit --json`` file: its topology and tree segment, and
    the algorithm ``auto`` ran at each measured size then (its ``choices``)."""

    rank = 0

    def __init__(self, doc: dict):
        from ..engine.topology import Topology
        head = doc["header"]
        self.topology = Topology(tuple(head["node_of"]))
        self.size = self.topology.size
        self.tree_segment_bytes = head.get("tree_segment_bytes", head.get("pipeline_bytes", 0))
        self._auto = {(c["collective"], c["size_bytes"]): c["auto_now"] for c in doc.get("choices", [])}

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
    rows = [{k: r[k] for k in MEASURED if k in r} for r in doc["records"]]
    return doc, rows


def run(args) -> int:
    """The model, held-out errors, choices and tuning file again from a saved run's measurements (``--from``)."""
    import datetime

    from ..costmodel import Model
    try:
        problem = outputs_problem(output_files(args))
        if problem:
            raise ValueError(problem)
        doc, rows = load_saved(args.from_file)
    except ValueError as e:
        sys.stderr.write(f"{args.prog_name}: error: {e}\n")
        return 2
    world = SavedRun(doc)
    # a file from before the ping-pong model was kept apart has it as its only model
    pingpong = Model.from_dict(doc.get("pingpong_model") or doc["model"])
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
