"""pycollect: MPI collectives for NumPy and CuPy arrays, written as schedules."""
