"""Placeholder while this subcommand is being written (replaced in this session)."""


def add_arguments(parser) -> None:
    pass


def run(args) -> int:
    raise NotImplementedError("pycollect: this subcommand is not written yet")
