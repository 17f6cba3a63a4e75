"""One module per algorithm, each a pure ``schedule(Problem) -> Schedule``; ``registry`` maps names to them."""
from .registry import COLLECTIVES, algorithms, get_schedule, schedule_algorithms

__all__ = ["COLLECTIVES", "algorithms", "get_schedule", "schedule_algorithms"]
