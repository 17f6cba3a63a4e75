"""Inputs no call, file or plan could have, refused by the tools and the cost models by name (found by an audit,
2026-12-05: each of these returned a number, printed a table of negative or NaN times, or raised from deep inside)."""
import json
import math

import numpy as np
import pytest

import pycollect as pc
from pycollect import clustersim, costmodel
from pycollect.costmodel import Link, Model
from pycollect.engine.topology import Topology
from pycollect.plan.model import ModelSpec
from pycollect.plan.rank import SearchSpace
from pycollect.select import load_tuning

MODEL = Model({"intra-node": Link(2e-6, 1e-10), "inter-node": Link(9e-6, 8e-10)}, gamma=3e-11)


def _tier(**kw):
    doc = MODEL.to_dict()
    doc["tiers"]["intra-node"].update(kw)
    return doc


@pytest.mark.parametrize("doc, message", [
    (_tier(alpha_s=-0.002), "tiers.intra-node.alpha_s must be a finite number >= 0, got -0.002"),
    (_tier(beta_s_per_byte=float("nan")), "tiers.intra-node.beta_s_per_byte must be a finite number >= 0, got nan"),
    (_tier(alpha_s="2us"), "tiers.intra-node.alpha_s must be a finite number >= 0, got '2us'"),
    (_tier(far_bytes=1.5), "tiers.intra-node.far_bytes must be an integer >= 0, got 1.5"),
    (_tier(port="yes"), "tiers.intra-node.port must be true or false, got 'yes'"),
    (dict(MODEL.to_dict(), gamma_s_per_byte=-1.0), "fitted model: gamma_s_per_byte must be a finite number >= 0"),
    (dict(MODEL.to_dict(), overhead_s_per_round=float("inf")), "overhead_s_per_round must be a finite number >= 0"),
    (dict(MODEL.to_dict(), eager_sends=1), "eager_sends must be true or false, got 1"),
    (dict(MODEL.to_dict(), tiers={"intra-node": [1, 2]}), "tiers.intra-node must be an object, got list"),
    (dict(MODEL.to_dict(), tiers={"intra-node": {"alpha_s": 1e-6}}), "tiers.intra-node lacks beta_s_per_byte"),
    (dict(MODEL.to_dict(), tiers={}), "tiers must be an object of one entry a tier"),
])
def test_a_fitted_model_out_of_range_is_refused_by_field(doc, message):
    with pytest.raises(ValueError, match="fitted model: ") as e:
        Model.from_dict(doc)
    assert message in str(e.value)


def test_a_fitted_model_loads_as_it_was_written():
    doc = MODEL.to_dict()
    assert Model.from_dict(doc) == MODEL and Model.from_dict(json.loads(json.dumps(doc))) == MODEL
    del doc["gamma_far_s_per_byte"], doc["tiers"]["intra-node"]["port"]     # an older file: the defaults
    assert Model.from_dict(doc) == MODEL


@pytest.mark.parametrize("command", [
    ["explain", "allreduce", "--algorithm", "ring", "--size", "16", "--nodes", "2", "--bytes", "64M", "--predict",
     "--model"],
    ["plan", "--model", "7B", "--gpus", "16", "--gpus-per-node", "8", "--batch", "64", "--tuning"],
])
def test_a_command_given_a_model_of_negative_or_nan_terms_exits_with_one_line(tmp_path, capsys, command):
    """Before: explain printed a ring of -62914589874080.8 us, and plan ranked ten configurations of step time nan
    with exit status 0."""
    from pycollect.cli import main
    for value, shown in ((-1.0, "-1.0"), (float("nan"), "nan")):
        path = tmp_path / "fit.json"
        path.write_text(json.dumps({"model": dict(MODEL.to_dict(), gamma_s_per_byte=value)}))
        assert main(command + [str(path)]) == 2
        err = capsys.readouterr().err
        assert f"{path}: fitted model: gamma_s_per_byte must be a finite number >= 0, got {shown}" in err, err
        assert err.count("\n") == 1, err


@pytest.mark.parametrize("rows, message", [
    ([[1024, "ring"], [512, "tree"], [None, "mpi"]], "comes after one of max_bytes 1024"),   # 512 never used
    ([[1024, "ring"], [1024, "tree"], [None, "mpi"]], "comes after one of max_bytes 1024"),
    ([[True, "ring"], [None, "mpi"]], "is not [max_bytes or null, algorithm]"),
    ([[None, "ring"], [None, "mpi"]], "must end with a row of max_bytes null, and only the last"),
    ([[1024, ["ring"]], [None, "mpi"]], "names unknown algorithm ['ring']"),
])
def test_a_tuning_file_whose_rows_cannot_all_be_reached_is_refused(tmp_path, rows, message):
    path = tmp_path / "tuning.json"
    path.write_text(json.dumps({"allreduce": rows}))
    with pytest.raises(ValueError) as e:
        load_tuning(str(path))
    assert message in str(e.value) and str(path) in str(e.value)


ONE = Topology.single_node(8)


@pytest.mark.parametrize("kwargs, error, message", [
    ({"nbytes": -(1 << 20)}, ValueError, "nbytes must be an integer of at least 0, got -1048576"),
    ({"nbytes": 1022}, ValueError, "nbytes = 1022 is not a whole number of elements (4 bytes each)"),
    ({"itemsize": 0}, ValueError, "itemsize must be an integer of at least 1, got 0"),
    ({"tree_segment_bytes": -1}, ValueError, "tree_segment_bytes must be an integer of at least 0, got -1"),
])
def test_the_cost_model_and_the_simulator_price_only_calls_that_could_be_made(kwargs, error, message):
    """Before: a negative size was priced (5.56e-05 s), a negative segment cut into one-element pieces (166x
    slower), an itemsize of 0 divided by zero."""
    call = dict({"nbytes": 1 << 20, "itemsize": 4, "tree_segment_bytes": 0}, **kwargs)
    with pytest.raises(error) as e:
        costmodel.predict(MODEL, "allreduce", "tree", ONE, call["nbytes"], call["itemsize"], call["tree_segment_bytes"])
    assert f"predict: {message}" in str(e.value)
    with pytest.raises(error) as e:
        clustersim.predict(clustersim.Cluster(MODEL), "allreduce", "tree", ONE, call["nbytes"], call["itemsize"],
                           call["tree_segment_bytes"])
    assert f"simulate: {message}" in str(e.value)


def test_the_simulator_and_traffic_refuse_roots_topologies_and_dtypes_by_name():
    cluster = clustersim.Cluster(MODEL)
    for root in (True, 1.5, 8):
        with pytest.raises(ValueError, match=r"simulate: root must be a rank in \[0, 8\), got " + repr(root)):
            clustersim.predict(cluster, "broadcast", "binomial", ONE, 64, root=root)
    with pytest.raises(TypeError, match="traffic: topology must be a pycollect Topology .* got str"):
        pc.traffic("allreduce", "ring", 8, 64, topology="x")
    with pytest.raises(TypeError, match="traffic: dtype 'foo' is not a NumPy dtype"):
        pc.traffic("allreduce", "ring", 8, 64, dtype="foo")
    with pytest.raises(TypeError, match="traffic: dtype object is not supported"):
        pc.traffic("allreduce", "ring", 8, 64, dtype=object)
    assert pc.traffic("allreduce", "ring", 8, 64, dtype=np.float64).itemsize == 8


@pytest.mark.parametrize("space, message", [
    ({"dp": (0,)}, "SearchSpace: dp must be None or integers of at least 1, got (0,)"),   # planned nothing
    ({"tp": (1.0,)}, "tp must be None or integers of at least 1"),
    ({"max_bubble": math.nan}, "max_bubble must be a fraction in [0, 1], got nan"),       # let every bubble in
    ({"max_bubble": 2}, "max_bubble must be a fraction in [0, 1], got 2"),
    ({"zero": (4,)}, "zero must hold ZeRO stages 0-3, got (4,)"),
])
def test_a_search_space_that_could_plan_nothing_or_everything_is_refused(space, message):
    with pytest.raises(ValueError) as e:
        SearchSpace(**space)
    assert message in str(e.value)


def test_a_parameter_count_is_a_finite_number():
    assert ModelSpec.from_params(np.int64(7_000_000_000), 8).params == 7_000_000_000
    for bad in (math.inf, math.nan, "7B", True, 0):   # inf: "math domain error"; "7B": a TypeError from a comparison
        with pytest.raises(ValueError, match="the parameter count must be a finite number of at least 1, got"):
            ModelSpec.from_params(bad, 8)


def test_the_planners_formulas_take_only_sizes_a_model_could_have():
    """Before: zero_memory of -1e9 parameters gave negative bytes, a negative sequence positive activations, stage 9
    of 4 a parameter count, and t=0 or pp=0 divided by zero."""
    from pycollect.plan import activation_bytes_per_layer, stage_params, zero_memory
    spec = ModelSpec.from_params(7e9, 8)
    cases = [(lambda: zero_memory(-1e9, 8, 1), "zero_memory: params must be a finite number >= 0, got -1000000000.0"),
             (lambda: zero_memory(1e9, 0, 1), "zero_memory: n must be an integer of at least 1, got 0"),
             (lambda: activation_bytes_per_layer(-2048, 1, 4096, 32), "s must be an integer of at least 1, got -2048"),
             (lambda: activation_bytes_per_layer(2048, 1, 4096, 32, t=0), "t must be an integer of at least 1, got 0"),
             (lambda: stage_params(spec, 1, 4, 9), "stage_params: stage must be one of the 4 stages, 0..3, got 9"),
             (lambda: stage_params(spec, 1, 0, 0), "stage_params: pp must be an integer of at least 1, got 0")]
    for call, message in cases:
        with pytest.raises(ValueError) as e:
            call()
        assert message in str(e.value)
    assert stage_params(spec, 1, 4, 3) > 0 and zero_memory(1e9, 8, 3)["parameters"] == 2 * 1e9 / 8


def test_an_algorithm_variable_of_no_collective_is_refused_not_ignored(tmp_path):
    """A misspelt PYCOLLECT_ALGO_* variable, or reduce_scatter_block's (which runs reduce_scatter's algorithms),
    changed nothing without a word; a tuning file's rows under reduce_scatter_block said "unknown collective"."""
    from pycollect.select import env_overrides
    assert env_overrides({"PYCOLLECT_ALGO_ALLREDUCE": "ring", "PYCOLLECT_ALGO_X": ""}) == {"allreduce": "ring"}
    with pytest.raises(ValueError, match="PYCOLLECT_ALGO_ALREDUCE: no collective is called 'alreduce'; expected one "
                                         "of PYCOLLECT_ALGO_ALLREDUCE"):
        env_overrides({"PYCOLLECT_ALGO_ALREDUCE": "ring"})
    with pytest.raises(ValueError, match="PYCOLLECT_ALGO_REDUCE_SCATTER_BLOCK: reduce_scatter_block runs "
                                         "reduce_scatter's algorithms: set PYCOLLECT_ALGO_REDUCE_SCATTER"):
        env_overrides({"PYCOLLECT_ALGO_REDUCE_SCATTER_BLOCK": "ring"})
    path = tmp_path / "tuning.json"
    path.write_text(json.dumps({"reduce_scatter_block": [[None, "ring"]]}))
    with pytest.raises(ValueError, match="reduce_scatter_block runs reduce_scatter's algorithms: give its rows under"):
        load_tuning(str(path))
