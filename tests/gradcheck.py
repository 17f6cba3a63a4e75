"""Central differences for the layer tests (tests/test_nn.py, tests/test_moe_router.py)."""
import numpy as np


def numgrad(f, x, eps=1e-5):
    """Central differences of scalar f() with respect to array x (perturbed in place, restored)."""
    g = np.zeros_like(x)
    it = np.nditer(x, flags=["multi_index"])
    for _ in it:
        i = it.multi_index
        old = x[i]
        x[i] = old + eps
        fp = f()
        x[i] = old - eps
        fm = f()
        x[i] = old
        g[i] = (fp - fm) / (2 * eps)
    return g
