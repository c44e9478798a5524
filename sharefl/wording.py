"""Counted nouns in the messages of the command line and the server's log: "1 cluster",
"2 clusters", never "1 clusters"."""

from __future__ import annotations


def counted(n: int, noun: str, plural: str | None = None) -> str:
    """``"<n> <noun>"`` for ``n`` = 1 (and -1), else ``"<n> <plural>"``; ``plural``
    defaults to ``noun + "s"`` (give it for irregular nouns: ``counted(n, "entry",
    "entries")``)."""
    return f"{n} {noun if abs(n) == 1 else plural or noun + 's'}"
