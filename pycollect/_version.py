"""The version of pycollect, read by the package and by what writes files that name it (engine/trace.py)."""
__version__ = "0.1.0"
