"""The exceptions pycollect raises beyond ValueError and TypeError."""


class CollectiveError(RuntimeError):
    """A collective could not complete."""
