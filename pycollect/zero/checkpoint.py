"""Sharded ZeroAdamW checkpoints that reload at any world size and any stage.

A checkpoint is a directory (shared by every rank of the group)::

    checkpoint.json                        metadata, written last, by rank 0
    rank-00000-of-00004.<tag>.npz          rank 0's shard: arrays "master", "m", "v", each (S,)
    ...
    rank-00003-of-00004.<tag>.npz

The rank files follow ``FlatLayout(shapes, N)`` for the N ranks of the saving group (at stage 0,
where every rank holds everything, rank r writes the slice rank r would own at stage 1). The
parameters are not stored: they are the master weights cast to the compute dtype. ``<tag>`` is 16
hex digits drawn for each save, so a new save never overwrites the files an older metadata file
names. ``checkpoint.json`` holds the format and version, the names, shapes, offsets, numel, shard
and padded size, the compute and master dtypes, the saving world size and stage, the step ``t``,
the loss-scale state, the hyperparameters, and every rank file's name, byte size and sha256.

The metadata carries its own checksum (format version 2): its "sha256" field is the sha256 of the
canonical JSON of every other field (``json.dumps(fields, sort_keys=True, separators=(",", ":"),
allow_nan=False)``, UTF-8). It covers the content, not the file's layout (whitespace may change), and
a load checks it right after parsing, before any other field is trusted: a missing, malformed or
mismatching checksum is refused, so one altered character (the step count, the loss scale, a
hyperparameter, a rank file's sha256) cannot load silently. Like the rank files' sha256, it catches
accidents and stray edits, not a deliberate forgery (anyone can recompute it). A version-1 file
(no checksum of its own) is refused with a message saying so.

Every file is written atomically (a temporary file in the directory, fsync, ``os.replace``, fsync of
the directory). The rank files come first; after every rank reports success (one allreduce), rank 0
writes the metadata, so a metadata file only ever names complete rank files, and a save that fails
or crashes before that point leaves the previous checkpoint as it was. After the new metadata is in
place rank 0 removes the rank files it no longer names.

Loading at M ranks and stage s: each rank reads the metadata, checks that every listed rank file
exists with its recorded size, reads (and checks the sha256 of) only the files that overlap its new
shard, ``FlatLayout(shapes, M)``'s (all of them at stage 0), and assembles its master weights and
moments. The ranks then agree in one allreduce: if any rank found a problem, every rank raises
``CheckpointError`` with the first failing rank's message, before any optimizer exists. Files are
read as data only: JSON, and ``np.load(..., allow_pickle=False)``.

Owned parameters (``ZeroAdamW(owned_params=...)``: each rank's own experts) are saved whole in their
rank's file ("owned_master", "owned_m", "owned_v", each (Po,)) and described in the metadata's
"owned" field (names and shapes, the same on every rank). They follow the saving group's placement,
so such a checkpoint loads at the same group size only (any stage), into the ``owned_params`` and
``owned_grads`` the caller passes.
"""
from __future__ import annotations

import hashlib
import io
import json
import math
import os
import re
import secrets
import tempfile

import numpy as np

from ..engine.backend import array_module
from ..parallel.agree import as_text, check_group, ranks_differing
from .layout import FlatLayout
from .optimizer import STAGES, ZeroAdamW, check_hyperparameters

__all__ = ["save_checkpoint", "load_checkpoint", "read_metadata", "CheckpointError", "METADATA", "VERSION"]

METADATA = "checkpoint.json"
FORMAT = "pycollect.zero.checkpoint"
VERSION = 2  # 2: the metadata carries the sha256 of its own canonical JSON
ARRAYS = ("master", "m", "v")
OWNED_ARRAYS = ("owned_master", "owned_m", "owned_v")
DTYPES = ("float16", "bfloat16", "float32", "float64")  # compute dtypes a checkpoint may name
SETTINGS = ("lr", "betas", "eps", "weight_decay", "no_decay", "max_grad_norm", "growth_interval", "bucket_bytes",
            "model_parallel", "norm_skip", "owned_params", "owned_grads")
AGREED = ("lr", "betas", "eps", "weight_decay", "no_decay", "max_grad_norm", "growth_interval", "bucket_bytes")
# ^ the settings every rank must pass alike (the groups, norm_skip and owned parameters are each rank's own)
_TMP = ".tmp-ckpt-"
_RANK_FILE = re.compile(r"rank-(\d{5})-of-(\d{5})\.([0-9a-f]{16})\.npz")
_MSG_BYTES = 2048  # room for one rank's error message in the agreement


class CheckpointError(ValueError):
    """A checkpoint that cannot be written or read as it is; raised on every rank of the group."""


# -- files ----------------------------------------------------------------------------------------------
def rank_file_name(rank: int, world: int, tag: str) -> str:
    return f"rank-{rank:05d}-of-{world:05d}.{tag}.npz"


def _fsync_dir(directory: str) -> None:
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:  # some file systems do not sync directories
        pass
    finally:
        os.close(fd)


def _write_atomic(path: str, data: bytes) -> None:
    """``data`` at ``path`` whole or not at all: a temporary file beside it, fsync, os.replace."""
    directory = os.path.dirname(path)
    fd, tmp = tempfile.mkstemp(prefix=_TMP, dir=directory)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    _fsync_dir(directory)


def _host(a) -> np.ndarray:
    return a.get() if not isinstance(a, np.ndarray) and hasattr(a, "get") else np.asarray(a)


# -- agreement --------------------------------------------------------------------------------------------
def _agree(group, exc: BaseException | None, where: str) -> None:
    """Raise CheckpointError on every rank when any rank's ``exc`` is set: one 1-element allreduce, and an
    allgather of the messages only when something failed."""
    mine = None if exc is None else (str(exc) if isinstance(exc, CheckpointError)
                                     else f"{type(exc).__name__}: {exc}") or type(exc).__name__
    if group.size == 1:
        if mine is not None:
            raise CheckpointError(f"{where}: {mine}") from exc
        return
    flag = group.allreduce(np.array([0 if mine is None else 1], np.int64), op="max")
    if not flag[0]:
        return
    buf = np.zeros(_MSG_BYTES, np.uint8)
    if mine is not None:
        enc = mine.encode("utf-8", "replace")[:_MSG_BYTES]
        buf[:len(enc)] = np.frombuffer(enc, np.uint8)
    rows = _host(group.allgather(buf)).reshape(group.size, _MSG_BYTES)
    failed = [(r, bytes(row).rstrip(b"\0").decode("utf-8", "replace")) for r, row in enumerate(rows) if row.any()]
    first_rank, first = failed[0]
    raise CheckpointError(f"{where}: {first} (found by rank {first_rank}; ranks {[r for r, _ in failed]} "
                          f"of {group.size} failed)") from exc


# -- save -------------------------------------------------------------------------------------------------
def _shards(opt) -> tuple[FlatLayout, dict]:
    """The saving layout (the group's size) and this rank's (S,) host arrays in it."""
    n, rank = opt.group.size, opt.group.rank
    layout = FlatLayout(opt.layout.shapes, n)
    owned = {} if opt.owned is None else {f"owned_{k}": _host(getattr(opt.owned, k)) for k in ("master", "m", "v")}
    if opt.stage != 0:
        return layout, {**{k: _host(getattr(opt, k)) for k in ARRAYS}, **owned}
    lo, hi = layout.shard_span(rank)  # stage 0 holds everything: cut rank's stage-1 slice, padded with zeros
    out = {}
    for k in ARRAYS:
        full = _host(getattr(opt, k))  # (numel or 1,)
        part = np.zeros(layout.shard, full.dtype)
        take = full[lo:min(hi, layout.numel)]
        part[:take.size] = take
        out[k] = part
    return layout, {**out, **owned}


def _npz_bytes(arrays: dict) -> bytes:
    bio = io.BytesIO()
    np.savez(bio, **arrays)
    return bio.getvalue()


def _metadata(opt, layout: FlatLayout, files: list) -> dict:
    d = layout.describe()
    return {"format": FORMAT, "version": VERSION, "world": layout.world, "stage": opt.stage, "t": int(opt.t),
            "names": d["names"], "shapes": d["shapes"], "offsets": d["offsets"], "numel": d["numel"],
            "shard": d["shard"], "padded": d["padded"], "dtype": opt.dtype.name, "master_dtype": opt.master_dtype.name,
            "loss_scale": {"value": float(opt.loss_scale), "dynamic": bool(opt.dynamic_loss_scale),
                           "good_steps": int(opt.good_steps), "skipped": int(opt.skipped),
                           "growth_interval": int(opt.growth_interval)},
            "hyperparameters": {"lr": opt.lr, "betas": list(opt.betas), "eps": opt.eps,
                                "weight_decay": opt.weight_decay,
                                "no_decay": [n for n in layout.names + _owned_names(opt) if n in opt.no_decay],
                                "max_grad_norm": opt.max_grad_norm},
            "owned": None if opt.owned is None else {"names": _owned_names(opt),
                                                     "shapes": opt.owned.layout.describe()["shapes"]},
            "files": files}


def _owned_names(opt) -> list:
    return [] if opt.owned is None else list(opt.owned.layout.names)


def _metadata_sha256(meta: dict) -> str:
    """The metadata's own checksum: sha256 of the canonical JSON of every field but "sha256"."""
    rest = {k: v for k, v in meta.items() if k != "sha256"}
    return hashlib.sha256(json.dumps(rest, sort_keys=True, separators=(",", ":"), allow_nan=False)
                          .encode("utf-8")).hexdigest()


def _write_metadata(path: str, meta: dict) -> None:
    signed = {**meta, "sha256": _metadata_sha256(meta)}
    _write_atomic(os.path.join(path, METADATA), json.dumps(signed, indent=1, allow_nan=False).encode())


def _remove_unlisted(path: str, keep: set) -> None:
    """Rank files the metadata no longer names, and temporary files of interrupted writes (best effort)."""
    for entry in os.listdir(path):
        if (_RANK_FILE.fullmatch(entry) and entry not in keep) or entry.startswith(_TMP):
            try:
                os.unlink(os.path.join(path, entry))
            except OSError:
                pass


def _check_listed(path: str, files: list) -> None:
    """Every rank file the new metadata will name is in ``path``, of its size: CheckpointError otherwise (ranks
    given paths that are not one directory), before the metadata or any old file is touched."""
    astray = [f["rank"] for f in files if not _has_size(os.path.join(path, f["name"]), f["bytes"])]
    if astray:
        raise CheckpointError(f"the files of ranks {astray} are not in {path!r}, where rank 0 writes the metadata: "
                              "every rank must save to the same directory (its previous checkpoint is kept)")


def _has_size(file: str, size: int) -> bool:
    try:
        return os.stat(file).st_size == size
    except OSError:
        return False


def save_checkpoint(opt: ZeroAdamW, path: str) -> None:
    """Write ``opt``'s checkpoint to the directory ``path`` (created if missing); collective over ``opt.group``.

    Raises CheckpointError on every rank when any rank could not write; the previous checkpoint in
    ``path`` then stays loadable."""
    where = f"save_checkpoint({path!r})"
    if not isinstance(opt, ZeroAdamW):
        raise TypeError(f"{where}: opt must be a ZeroAdamW, got {type(opt).__name__}")
    group = opt.group
    n, rank = group.size, group.rank
    tag_bytes = np.frombuffer(secrets.token_bytes(8), np.uint8).copy()  # (8,): one save's file names
    if n > 1:
        tag_bytes = _host(group.broadcast(tag_bytes, root=0))
    tag = bytes(tag_bytes).hex()
    exc: BaseException | None = None
    digest: np.ndarray | None = None
    try:
        if opt.handed_in():
            raise CheckpointError(f"rank {rank}: called between grad_ready and step "
                                  f"({opt.handed_in()} gradients handed in); save between steps")
        os.makedirs(path, exist_ok=True)
        layout, arrays = _shards(opt)
        data = _npz_bytes(arrays)
        _write_atomic(os.path.join(path, rank_file_name(rank, n, tag)), data)
        digest = np.frombuffer(hashlib.sha256(data).digest() + len(data).to_bytes(8, "little"), np.uint8)  # (40,)
    except Exception as e:  # noqa: BLE001 (every rank must learn of it)
        exc = e
    _agree(group, exc, where)  # every rank file is in place before the metadata is written
    assert digest is not None  # set on every rank, or _agree raised
    table = (_host(group.allgather(digest)) if n > 1 else digest).reshape(n, 40)
    files = [{"rank": r, "name": rank_file_name(r, n, tag), "bytes": int.from_bytes(bytes(row[32:]), "little"),
              "sha256": bytes(row[:32]).hex()} for r, row in enumerate(table)]
    exc = None
    if rank == 0:
        try:
            _check_listed(path, files)   # a rank that wrote elsewhere (another path) leaves this one unreplaced
            _write_metadata(path, _metadata(opt, layout, files))
            _remove_unlisted(path, {f["name"] for f in files})
        except Exception as e:  # noqa: BLE001
            exc = CheckpointError(f"writing {os.path.join(path, METADATA)}: {type(e).__name__}: {e}")
            exc.__cause__ = e
    _agree(group, exc, where)


# -- metadata ---------------------------------------------------------------------------------------------
def _is_int(x, low=0) -> bool:
    return isinstance(x, int) and not isinstance(x, bool) and x >= low


def _is_number(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def _is_stage(x) -> bool:
    """One of STAGES, as an integer (not a bool, not 1.0)."""
    return isinstance(x, (int, np.integer)) and not isinstance(x, (bool, np.bool_)) and x in STAGES


def _no_constant(name):
    raise ValueError(f"{name} is not a number JSON allows")


def read_metadata(path: str) -> dict:
    """The checkpoint's metadata, checked for consistency; CheckpointError naming the file and the fault."""
    file = os.path.join(path, METADATA)
    try:
        with open(file, "rb") as f:
            raw = f.read()
    except FileNotFoundError:
        raise CheckpointError(f"{file}: no checkpoint metadata there (missing file)") from None
    except OSError as e:
        raise CheckpointError(f"{file}: cannot read: {e}") from None
    try:
        meta = json.loads(raw.decode("utf-8"), parse_constant=_no_constant)
    except (UnicodeDecodeError, ValueError) as e:
        raise CheckpointError(f"{file}: not valid JSON ({e}); truncated or altered") from None
    _check_checksum(file, meta)
    _check_metadata(file, meta)
    return meta


def _check_checksum(file: str, meta) -> None:
    """The metadata's own sha256, before any other field is trusted (format and version only choose the
    message when there is none)."""
    def bad(what):
        raise CheckpointError(f"{file}: {what}")
    if not isinstance(meta, dict) or (meta.get("format") != FORMAT and "sha256" not in meta):
        bad(f"not a {FORMAT} metadata file (format {meta.get('format') if isinstance(meta, dict) else None!r})")
    if "sha256" not in meta:
        if meta.get("version") == 1:
            bad(f"metadata version 1 has no sha256 of its own (written by an older pycollect); this pycollect "
                f"reads version {VERSION} only (metadata with a checksum)")
        bad("no sha256 of the metadata (written by an older pycollect, or altered)")
    digest = meta["sha256"]
    if not isinstance(digest, str) or not re.fullmatch(r"[0-9a-f]{64}", digest):
        bad(f"sha256 checksum of the metadata malformed: {digest!r:.80} (altered)")
    expected: str | None
    try:
        expected = _metadata_sha256(meta)
    except ValueError:  # a number JSON cannot hold (1e999 parses as inf): never written by save
        expected = None
    if digest != expected:
        bad("sha256 checksum of the metadata mismatch (altered)")


def _check_metadata(file: str, meta) -> None:
    def bad(what):
        raise CheckpointError(f"{file}: {what}")
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        bad(f"not a {FORMAT} metadata file (format {meta.get('format') if isinstance(meta, dict) else None!r})")
    if meta.get("version") != VERSION:
        bad(f"unknown metadata version {meta.get('version')!r}; this pycollect reads version {VERSION}")
    missing = sorted({"world", "stage", "t", "names", "shapes", "offsets", "numel", "shard", "padded", "dtype",
                      "master_dtype", "loss_scale", "hyperparameters", "files"} - set(meta))
    if missing:
        bad(f"lacks the fields {missing}")
    world, names, shapes = meta["world"], meta["names"], meta["shapes"]
    if not _is_int(world, 1):
        bad(f"world must be an integer >= 1, got {world!r}")
    files = meta["files"]
    if not isinstance(files, list) or len(files) != world:
        bad(f"world {world} but {len(files) if isinstance(files, list) else files!r} rank files listed")
    if not _is_stage(meta["stage"]):
        bad(f"stage must be one of {STAGES}, got {meta['stage']!r}")
    if not _is_int(meta["t"]):
        bad(f"t must be an integer >= 0, got {meta['t']!r}")
    if (not isinstance(names, list) or not names or not all(isinstance(n, str) for n in names)
            or len(set(names)) != len(names)):
        bad("names must be a non-empty list of distinct strings")
    if not isinstance(shapes, dict) or list(shapes) != names:
        bad(f"shapes must name exactly the parameters in names, in order; got {list(shapes) if isinstance(shapes, dict) else shapes!r}")
    for n, s in shapes.items():
        if not isinstance(s, list) or not all(_is_int(d) for d in s):
            bad(f"shape of {n!r} must be a list of integers >= 0, got {s!r}")
    layout = FlatLayout(shapes, world)
    for key in ("offsets", "numel", "shard", "padded"):
        if meta[key] != getattr(layout, key):
            bad(f"{key} {meta[key]!r} disagree with the shapes, which give {getattr(layout, key)!r} "
                f"at world {world}; the shapes or the offsets were altered")
    dtype, master = meta["dtype"], meta["master_dtype"]
    if dtype not in DTYPES:
        bad(f"dtype {dtype!r} is not one of {DTYPES}")
    if master != ("float32" if dtype in ("float16", "bfloat16") else dtype):
        bad(f"master_dtype {master!r} does not go with dtype {dtype!r}")
    _check_state_fields(bad, meta)


def _check_state_fields(bad, meta: dict) -> None:
    """The loss-scale state, the owned parameters, the hyperparameters and the rank file entries;
    ``bad(what)`` raises naming the file."""
    names, world, files = meta["names"], meta["world"], meta["files"]
    ls = meta["loss_scale"]
    if (not isinstance(ls, dict) or not _is_number(ls.get("value")) or not ls["value"] > 0
            or not isinstance(ls.get("dynamic"), bool) or not _is_int(ls.get("good_steps"))
            or not _is_int(ls.get("skipped")) or not _is_int(ls.get("growth_interval"), 1)):
        bad(f"loss_scale must hold value > 0, dynamic, good_steps, skipped, growth_interval; got {ls!r}")
    owned = meta.get("owned")  # absent in checkpoints without owned parameters
    if owned is not None:
        o_names = owned.get("names") if isinstance(owned, dict) else None
        if (not isinstance(o_names, list) or not o_names or not all(isinstance(n, str) for n in o_names)
                or len(set(o_names)) != len(o_names) or set(o_names) & set(names)
                or not isinstance(owned.get("shapes"), dict) or list(owned["shapes"]) != o_names
                or not all(isinstance(s, list) and all(_is_int(d) for d in s) for s in owned["shapes"].values())):
            bad(f"owned must hold names (distinct, none of the sharded ones) and their shapes, in order; got {owned!r}")
    every = set(names) | set(owned["names"] if owned else [])
    hp = meta["hyperparameters"]
    if (not isinstance(hp, dict) or not all(_is_number(hp.get(k)) for k in ("lr", "eps", "weight_decay"))
            or not isinstance(hp.get("betas"), list) or len(hp["betas"]) != 2 or not all(map(_is_number, hp["betas"]))
            or not (hp.get("max_grad_norm") is None or _is_number(hp["max_grad_norm"]))
            or not isinstance(hp.get("no_decay"), list) or not set(hp["no_decay"]) <= every):
        bad(f"hyperparameters must hold lr, betas, eps, weight_decay, no_decay (parameter names), max_grad_norm; got {hp!r}")
    try:   # in range, as ZeroAdamW takes them: the optimizer would refuse them only after the load had read every file
        check_hyperparameters("hyperparameters", hp["lr"], hp["betas"], hp["eps"], hp["weight_decay"],
                              hp["max_grad_norm"], ls["growth_interval"])
    except ValueError as e:
        bad(str(e))   # "hyperparameters: lr must be a finite number >= 0.0, got -1"
    for r, f in enumerate(files):
        m = _RANK_FILE.fullmatch(f.get("name", "")) if isinstance(f, dict) and isinstance(f.get("name"), str) else None
        if (m is None or f.get("rank") != r or int(m.group(1)) != r or int(m.group(2)) != world
                or not _is_int(f.get("bytes")) or not isinstance(f.get("sha256"), str)
                or not re.fullmatch(r"[0-9a-f]{64}", f["sha256"])):
            bad(f"rank file entry {r} is malformed for world {world}: {f!r}")


# -- load -------------------------------------------------------------------------------------------------
def _read_rank_file(path: str, entry: dict, shard: int, master_dtype: str, owned: int | None = None) -> dict:
    """The (S,) arrays of one rank file (and its (Po,) owned ones when ``owned`` = Po), after checking
    its size and sha256."""
    file = os.path.join(path, entry["name"])
    try:
        with open(file, "rb") as f:
            data = f.read(entry["bytes"] + 1)
    except FileNotFoundError:
        raise CheckpointError(f"{file}: rank file missing") from None
    if len(data) != entry["bytes"]:
        got = str(len(data)) if len(data) <= entry["bytes"] else f"more than {entry['bytes']}"
        raise CheckpointError(f"{file}: {got} bytes, expected {entry['bytes']} (truncated or altered)")
    if hashlib.sha256(data).hexdigest() != entry["sha256"]:
        raise CheckpointError(f"{file}: sha256 checksum mismatch (altered)")
    try:
        with np.load(io.BytesIO(data), allow_pickle=False) as z:
            expected = ARRAYS + (OWNED_ARRAYS if owned is not None else ())
            if sorted(z.files) != sorted(expected):
                raise CheckpointError(f"{file}: holds arrays {sorted(z.files)}, expected {sorted(expected)}")
            out = {k: z[k] for k in expected}
    except CheckpointError:
        raise
    except Exception as e:  # noqa: BLE001 (a malformed archive: data, never code)
        raise CheckpointError(f"{file}: not a readable .npz ({type(e).__name__}: {e})") from None
    for k, a in out.items():
        size = owned if k in OWNED_ARRAYS else shard
        if a.dtype.name != master_dtype or a.shape != (size,):
            raise CheckpointError(f"{file}: array {k!r} is {a.dtype}{a.shape}, expected {master_dtype}({size},)")
    return out


def _check_expected(file: str, params, meta: dict, stage: int) -> None:
    """The caller's parameters against the checkpoint's metadata ``file``: names in order, shapes, dtype; every
    one checked before the load writes into any (at stages 0 to 2 it fills them with the saved values, so each
    must be writeable)."""
    if not isinstance(params, dict) or not params:
        raise CheckpointError(f"{file}: params must be a non-empty dict name -> array, got {type(params).__name__}")
    for n, p in params.items():
        try:
            array_module(p)
        except TypeError:
            raise CheckpointError(f"params[{n!r}] must be a NumPy or CuPy array, got {type(p).__name__}") from None
        if stage != 3 and not getattr(p.flags, "writeable", True):   # CuPy's arrays are always writeable
            raise CheckpointError(f"params[{n!r}] is read-only; at stage {stage} the load writes the saved values "
                                  f"into params (pass writeable arrays)")
    names = meta["names"]
    if list(params) != names:
        extra, lacking = sorted(set(params) - set(names)), sorted(set(names) - set(params))
        raise CheckpointError(f"{file}: parameter names differ from the checkpoint's: params has {extra} that it lacks, lacks "
                              f"{lacking}" + ("" if extra or lacking else " (same names, another order)"))
    for n in names:
        p, shape = params[n], tuple(meta["shapes"][n])
        if tuple(p.shape) != shape:
            raise CheckpointError(f"{file}: parameter {n!r} has shape {tuple(p.shape)} but the checkpoint has {shape}")
        if p.dtype.name != meta["dtype"]:
            raise CheckpointError(f"{file}: parameter {n!r} has dtype {p.dtype} but the checkpoint has {meta['dtype']}")


def _assemble(path: str, meta: dict, lo: int, hi: int, group) -> dict:
    """This rank's new shard [lo, hi) of master, m and v, from the rank files that overlap it."""
    old = FlatLayout(meta["shapes"], meta["world"])
    files = meta["files"]
    for f in files:  # cheap, on every rank: every listed file is there with its size
        file = os.path.join(path, f["name"])
        try:
            size = os.stat(file).st_size
        except FileNotFoundError:
            raise CheckpointError(f"{file}: rank file missing (the metadata lists {meta['world']})") from None
        if size != f["bytes"]:
            raise CheckpointError(f"{file}: {size} bytes, expected {f['bytes']} (truncated or altered)")
    out = {k: np.zeros(hi - lo, meta["master_dtype"]) for k in ARRAYS}  # (S',), zeros in the padding
    top = min(hi, old.numel)
    for k in range(meta["world"]):
        a, b = old.shard_span(k)
        a2, b2 = max(a, lo), min(b, top)
        padding_only = a >= old.numel
        if a2 >= b2 and not (padding_only and k % group.size == group.rank):
            continue  # a file of padding only is still checked, by one rank
        arrays = _read_rank_file(path, files[k], old.shard, meta["master_dtype"], _owned_numel(meta))
        for name in ARRAYS:
            if a2 < b2:
                out[name][a2 - lo:b2 - lo] = arrays[name][a2 - a:b2 - a]
    return out


def _owned_numel(meta: dict) -> int | None:
    owned = meta.get("owned")
    return None if owned is None else sum(math.prod(s) for s in owned["shapes"].values())


def _owned_state(path: str, meta: dict, group, owned_params) -> dict | None:
    """This rank's saved owned arrays (its own rank file), after checking that the loading group and
    the caller's ``owned_params`` match what was saved."""
    file = os.path.join(path, METADATA)
    owned = meta.get("owned")
    if owned is None:
        if owned_params:
            raise CheckpointError(f"{file}: the checkpoint holds no owned parameters, but owned_params were passed")
        return None
    if group.size != meta["world"]:
        raise CheckpointError(f"{file}: holds each rank's owned parameters (experts) for {meta['world']} ranks; "
                              f"load it at {meta['world']} ranks, not {group.size}")
    if not isinstance(owned_params, dict) or list(owned_params) != owned["names"] or any(
            list(owned_params[n].shape) != owned["shapes"][n] or owned_params[n].dtype.name != meta["dtype"]
            for n in owned["names"]):
        got = {n: (list(a.shape), a.dtype.name) for n, a in owned_params.items()} if isinstance(owned_params, dict) \
            else owned_params
        raise CheckpointError(f"{file}: owned_params must be {owned['shapes']} ({meta['dtype']}), in that order; got {got}")
    return _read_rank_file(path, meta["files"][group.rank], meta["shard"], meta["master_dtype"], _owned_numel(meta))


def _settings(meta: dict, overrides: dict) -> dict:
    hp, ls = meta["hyperparameters"], meta["loss_scale"]
    kw = {"lr": hp["lr"], "betas": tuple(hp["betas"]), "eps": hp["eps"], "weight_decay": hp["weight_decay"],
          "no_decay": tuple(hp["no_decay"]), "max_grad_norm": hp["max_grad_norm"],
          "growth_interval": ls["growth_interval"],
          "loss_scale": "dynamic" if ls["dynamic"] else (None if ls["value"] == 1.0 else ls["value"])}
    kw.update(overrides)
    return kw


def load_checkpoint(path: str, group, stage: int = 1, **settings) -> ZeroAdamW:
    """The ZeroAdamW saved in ``path``, resharded to ``group`` (any size) and ``stage``; collective.

    ``settings``: ``params`` (dict name -> array: checked against the checkpoint's names, order,
    shapes and dtype; at stages 0 to 2 filled with the saved parameters and kept by the optimizer,
    as if passed to its constructor; at stage 3 only checked) and any of ``lr``, ``betas``, ``eps``,
    ``weight_decay``, ``no_decay``, ``max_grad_norm``, ``growth_interval`` (override the saved
    values), ``bucket_bytes`` (not saved; pass the saving run's for a bit-identical continuation),
    ``model_parallel``, ``norm_skip`` (not saved: groups are the loading run's) and ``owned_params``,
    ``owned_grads`` (required when the checkpoint holds owned parameters: the group size must then
    be the saving one).
    Any problem with the files raises CheckpointError on every rank and constructs nothing."""
    where = f"load_checkpoint({path!r})"
    check_group("load_checkpoint", group)   # before anything collective: mpi4py's own communicator has no allgather here
    params = settings.pop("params", None)
    exc: Exception | None = None
    meta: dict | None = None
    shard: dict | None = None
    owned: dict | None = None
    try:   # arguments too: a rank that refuses its own must not leave the others waiting
        if not _is_stage(stage):
            raise CheckpointError(f"stage must be one of {STAGES}, got {stage!r}")
        unknown = sorted(set(settings) - set(SETTINGS))
        if unknown:
            raise CheckpointError(f"unknown settings {unknown}; expected params or some of {list(SETTINGS)}")
        meta = read_metadata(path)
        if params is not None:
            _check_expected(os.path.join(path, METADATA), params, meta, stage)
        owned = _owned_state(path, meta, group, settings.get("owned_params"))
        new = FlatLayout(meta["shapes"], 1 if stage == 0 else group.size)
        lo, hi = new.shard_span(0 if stage == 0 else group.rank)
        shard = _assemble(path, meta, lo, hi, group)
    except Exception as e:  # noqa: BLE001 (every rank must learn of it before anything is built)
        exc = e
    _agree(group, exc, where)
    assert meta is not None and shard is not None  # read on every rank, or _agree raised
    _agree_read(group, where, f"checkpoint {meta['sha256']}, stage {stage}, settings "
                + ", ".join(f"{k}={as_text(settings[k])}" for k in AGREED if k in settings))   # np.float64(0.01) is 0.01
    opt = _build(meta, shard, new, group, stage, params, settings)
    if owned is not None:
        assert opt.owned is not None  # a checkpoint with owned arrays builds an optimizer that owns them
        for k in ("master", "m", "v"):
            getattr(opt.owned, k)[...] = opt.xp.asarray(owned[f"owned_{k}"])
        opt.owned.publish()  # the caller's arrays hold the saved values, as the sharded ones do
    return opt


def _agree_read(group, where: str, read: str) -> None:
    """CheckpointError on every rank unless every rank read the same checkpoint with the same stage and settings
    (ranks given other paths, stages or overrides would build shards of different optimizers)."""
    differ = ranks_differing(read, group)
    if differ:
        raise CheckpointError(f"{where}: ranks {differ} read another checkpoint, or pass another stage or other "
                              f"settings, than rank 0; rank {group.rank} read {read[:300]}")


def _compute_dtype(name: str) -> np.dtype:
    if name == "bfloat16":
        import ml_dtypes  # NumPy knows the name only once ml_dtypes is imported
        return np.dtype(ml_dtypes.bfloat16)
    return np.dtype(name)


def _build(meta: dict, shard: dict, new: FlatLayout, group, stage: int, params, overrides: dict) -> ZeroAdamW:
    """The optimizer from the assembled shard: full parameters (master cast), then the saved state."""
    xp = np if params is None else array_module(next(iter(params.values())))
    dtype = _compute_dtype(meta["dtype"])
    if stage == 3:  # the constructor's transient full copy; the shard is written below
        full = params if params is not None else {n: xp.zeros(s, dtype) for n, s in new.shapes.items()}
    else:
        mine = shard["master"].astype(dtype)  # (S',) or (padded,) at stage 0
        flat = mine if stage == 0 or group.size == 1 else _host(group.allgather(mine, counts=[new.shard] * group.size))
        full = {n: xp.asarray(v) for n, v in new.views(flat).items()}
        if params is None:
            full = {n: v.copy() for n, v in full.items()}
    # built before the caller's params are written: an override or a setting it refuses leaves them untouched
    opt = ZeroAdamW(full, group, stage=stage, **_settings(meta, overrides))
    if stage != 3 and params is not None:
        for n, v in full.items():
            params[n][...] = v
        opt.params = params   # the optimizer keeps and updates the caller's arrays, as if passed to it
    for k in ARRAYS:
        getattr(opt, k)[...] = xp.asarray(shard[k])
    if stage == 3:
        opt.param_shard[...] = opt.master.astype(dtype)
    ls = meta["loss_scale"]
    opt.t, opt.loss_scale, opt.good_steps, opt.skipped = meta["t"], float(ls["value"]), ls["good_steps"], ls["skipped"]
    return opt
