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


def split_equals_fused(make, inputs, dys, forward=None, backward=None, backward_input=None, backward_weight=None):
    """Problems (a list of strings, empty when none) between two fresh layers from ``make()`` run on the
    micro-batches ``inputs`` with upstream gradients ``dys``: the first forward then ``backward`` per
    micro-batch; the second, as a zero-bubble pipeline runs it, every forward (caches stashed), then
    every B (``backward_input``, what it keeps stashed again), then every W (``backward_weight``) in
    order. Input gradients and accumulated weight gradients must be equal bit for bit.

    The four callables take (layer, i, ...) for layers whose methods take more than the array (a
    model chunk's micro-batch number); by default they call the layer's methods with the array alone."""
    from pycollect.nn._base import layers_in, restore_caches, stash_caches
    forward = forward or (lambda layer, i, x: layer.forward(x))
    backward = backward or (lambda layer, i, dy: layer.backward(dy))
    backward_input = backward_input or (lambda layer, i, dy: layer.backward_input(dy))
    backward_weight = backward_weight or (lambda layer, i: layer.backward_weight())
    fused, split = make(), make()
    dx_fused = []
    for i, (x, dy) in enumerate(zip(inputs, dys)):
        forward(fused, i, x)
        dx_fused.append(backward(fused, i, dy))
    layers, saved = layers_in(split), []
    for i, x in enumerate(inputs):
        forward(split, i, x)
        saved.append(stash_caches(layers))
    dx_split = []
    for i, dy in enumerate(dys):
        restore_caches(layers, saved[i])
        dx_split.append(backward_input(split, i, dy))
        saved[i] = stash_caches(layers)
    for i in range(len(dys)):
        restore_caches(layers, saved[i])
        backward_weight(split, i)
    problems = [f"dx of micro-batch {i} differs" for i, (a, b) in enumerate(zip(dx_fused, dx_split))
                if not (a is None and b is None) and not np.array_equal(a, b)]
    problems += [f"gradient {name} differs" for name in fused.grads
                 if not np.array_equal(fused.grads[name], split.grads[name])]
    problems += [f"{type(layer).__name__} holds a cache after W" for layer in layers if layer.cache is not None]
    return problems
