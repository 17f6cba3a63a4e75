"""The old path of ``pycollect.costmodel`` (the module moved below the planner and the tools that use it).

``pycollect.tools.costmodel`` is the same module object as ``pycollect.costmodel``; new code imports ``pycollect.costmodel``.
"""
import sys

from .. import costmodel

sys.modules[__name__] = costmodel
