"""Search backends: the :class:`SearchBackend` interface and its implementations."""

from drgym.search.base import SearchBackend

__all__ = ["SearchBackend"]
