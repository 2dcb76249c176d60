"""Small text helpers the renderers of ``docs/benchmarks.md`` share: numbers, counts, the
code a run measured."""

from __future__ import annotations


def fmt(x: float, digits: int = 0) -> str:
    return f"{x:,.{digits}f}"


def ms(x: float) -> str:
    """Milliseconds: one decimal below 100, none from there."""
    return fmt(x, 1 if x < 100 else 0)


def mark(ok) -> str:
    return "n/a" if ok is None else ("yes" if ok else "**no**")


def code(machine: dict) -> str:
    """The commit a run measured; a run from a changed working tree (never one in docs/:
    the benchmark refuses) says so."""
    return machine["git"] + (" and uncommitted changes" if machine.get("uncommitted_changes")
                             else "")


def plural(n: int, word: str) -> str:
    suffix = "es" if word.endswith(("s", "ch")) else "s"
    return f"{n:,} {word}{'' if n == 1 else suffix}"
