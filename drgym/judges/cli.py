"""Commands of this area, registered on the root ``drgym`` app by :func:`register`."""

from __future__ import annotations

import typer


def register(app: typer.Typer) -> None:
    """Add this area's commands to ``app``."""
