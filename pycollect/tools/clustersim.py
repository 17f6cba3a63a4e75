"""The old path of ``pycollect.clustersim`` (the module moved below the planner and the tools that use it).

``pycollect.tools.clustersim`` is the same module object as ``pycollect.clustersim``; new code imports ``pycollect.clustersim``.
"""
import sys

from .. import clustersim

sys.modules[__name__] = clustersim
