"""The README's whole programs (its Python blocks that start with the imports) run as written, at every world
size the launches use: a reader copies them first."""
import contextlib
import io
import os
import re

import pycollect as pc
from helpers import agree

README = os.path.join(os.path.dirname(__file__), os.pardir, os.pardir, "README.md")
START = "import numpy as np\nimport pycollect as pc\n"


def programs() -> list[str]:
    with open(README, encoding="utf-8") as f:
        blocks = re.findall(r"^```python\n(.*?)^```", f.read(), re.M | re.S)
    return [b for b in blocks if b.startswith(START)]


def test_readme_programs_run_at_this_size(comm):
    found, problems = programs(), []
    for i, source in enumerate(found, 1):
        names: dict = {"__name__": "readme"}
        try:
            with contextlib.redirect_stdout(io.StringIO()):
                exec(compile(source, f"README.md, program {i}", "exec"), names)
        except Exception as e:   # every rank runs the same lines on arrays of the same shapes: all raise alike
            problems.append(f"program {i}: {type(e).__name__}: {e}")
        finally:
            if isinstance(names.get("comm"), pc.Communicator):
                names["comm"].free()
    agree(comm, len(found) == 2 and not problems, f"{len(found)} programs (2 expected); {problems}")
