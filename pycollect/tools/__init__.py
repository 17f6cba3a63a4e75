"""Tools on top of the engine: the command line, benchmarks, the cost model, traces, reports."""
