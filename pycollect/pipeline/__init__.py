"""Pipeline schedules as data (pure), their simulator and timeline plots; the executor is ``pycollect.parallel.Pipeline``."""
