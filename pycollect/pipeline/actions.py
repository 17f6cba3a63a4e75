"""The vocabulary of pipeline schedules: what one stage does, in order.

A pipeline of ``p`` stages with ``v`` virtual stages (chunks) per stage splits the model into
``p * v`` model chunks; stage ``s`` holds local chunks ``c = 0 .. v-1``, which are model chunks
``c * p + s`` (Megatron-LM's interleaving; v = 1 is the plain pipeline), or, placed V-wise (ZB-V,
v = 2, ``vshape``), model chunks s and 2p - 1 - s. Activations flow from
model chunk k to k + 1 and gradients back; model chunk 0 takes the input data, model chunk
p*v - 1 computes the loss and starts the backward pass.

A schedule lists, for one stage, ``Action``s in the order the stage performs them:

    F, B                   forward / backward of micro-batch ``micro`` on local chunk ``chunk``
    W                      the weight gradient of (micro, chunk), split off its B
    SEND_ACT, RECV_ACT     the activation of (micro, chunk) to / from stage ``peer``
    SEND_GRAD, RECV_GRAD   the gradient of (micro, chunk) to / from stage ``peer``

For a send, (micro, chunk) names the sender's chunk; for a receive, the receiver's. Sends are
non-blocking (posted, completed at the latest before the step ends); a receive blocks until its
message has arrived. Every F of a chunk that is not model chunk 0 is preceded by its RECV_ACT,
every F of a chunk that is not the last model chunk is followed by its SEND_ACT; likewise RECV_GRAD
before and SEND_GRAD after each B, mirrored.

The backward split (Qi et al., "Zero Bubble Pipeline Parallelism", ICLR 2024): a B computes the
gradient the previous model chunk waits for and the weight gradient, which no one waits for. A list
that holds a W of (micro, chunk) splits that pair's backward: its B is the input gradient alone, its
W (after the B, on the same stage) the weight gradient. A pair without a W keeps B as the whole
backward, as every schedule without W (gpipe, 1f1b, interleaved) has it. The simulator prices
accordingly: ``costs["B"]`` is the whole backward, ``costs["W"]`` the part a W takes from it.
"""
from __future__ import annotations

from typing import NamedTuple

__all__ = ["Action", "F", "B", "W", "SEND_ACT", "RECV_ACT", "SEND_GRAD", "RECV_GRAD", "COMPUTE", "COMM",
           "model_chunk", "stage_of", "next_of", "prev_of"]

F, B, W = "F", "B", "W"
SEND_ACT, RECV_ACT, SEND_GRAD, RECV_GRAD = "SEND_ACT", "RECV_ACT", "SEND_GRAD", "RECV_GRAD"
COMPUTE = (F, B, W)
COMM = (SEND_ACT, RECV_ACT, SEND_GRAD, RECV_GRAD)


class Action(NamedTuple):
    op: str
    micro: int
    chunk: int = 0
    peer: int = -1  # the other stage of a send or receive; -1 for F, B and W

    def __str__(self) -> str:
        where = f"{self.op}{self.micro}" + (f".{self.chunk}" if self.chunk else "")
        return where + (f"->{self.peer}" if self.op.startswith("SEND") else
                        f"<-{self.peer}" if self.op.startswith("RECV") else "")


def model_chunk(stage: int, chunk: int, p: int, vshape: bool = False) -> int:
    """The model chunk that local chunk ``chunk`` of ``stage`` holds.

    ``vshape``: two chunks per stage placed V-wise (ZB-V): stage s holds model chunks s and 2p - 1 - s,
    so the first stage holds the first and the last, and the forward goes down the stages and back up."""
    if vshape:
        return stage if chunk == 0 else 2 * p - 1 - stage
    return chunk * p + stage


def stage_of(k: int, p: int, vshape: bool = False) -> tuple[int, int]:
    """(stage, local chunk) holding model chunk ``k``."""
    if vshape:
        return (k, 0) if k < p else (2 * p - 1 - k, 1)
    return k % p, k // p


def next_of(stage: int, chunk: int, p: int, vshape: bool = False) -> tuple[int, int]:
    """(stage, chunk) that receives the activation of (stage, chunk): model chunk k + 1."""
    return stage_of(model_chunk(stage, chunk, p, vshape) + 1, p, vshape)


def prev_of(stage: int, chunk: int, p: int, vshape: bool = False) -> tuple[int, int]:
    """(stage, chunk) that sent the activation to (stage, chunk): model chunk k - 1."""
    return stage_of(model_chunk(stage, chunk, p, vshape) - 1, p, vshape)
