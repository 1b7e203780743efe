"""Numbers as people read them: one set of formatters for the CLI, the chat app and pulls."""

from __future__ import annotations


def format_bytes(n: int | float | None) -> str:
    """Decimal units, as download sizes are quoted: 1.6 GB, 491.4 MB, 12.0 kB, 512 B; '?' when unknown."""
    if n is None:
        return "?"
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{int(n)} B"


def plural(n: int, word: str) -> str:
    """`1 token`, `2 tokens`."""
    return f"{n:,} {word}" + ("" if n == 1 else "s")
