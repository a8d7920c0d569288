"""Argument checks shared by the strategies: one error type, messages that name the argument."""

from __future__ import annotations

from fuzz.errors import InvalidArgument
from fuzz.model import MAX_WORLD_SIZE


def check_bounds(name_lo: str, lo: int, name_hi: str, hi: int, *, floor: int, ceiling: int) -> None:
    for name, value in ((name_lo, lo), (name_hi, hi)):
        if isinstance(value, bool) or not isinstance(value, int):
            raise InvalidArgument(f"{name}={value!r} must be an integer")
        if not floor <= value <= ceiling:
            raise InvalidArgument(f"{name}={value} is outside {floor}..{ceiling}")
    if lo > hi:
        raise InvalidArgument(f"{name_lo}={lo} is greater than {name_hi}={hi}; swap them")


def check_world_size(world_size: int) -> None:
    if isinstance(world_size, bool) or not isinstance(world_size, int) or not 1 <= world_size <= MAX_WORLD_SIZE:
        raise InvalidArgument(f"world_size={world_size!r} must be an integer in 1..{MAX_WORLD_SIZE}")
