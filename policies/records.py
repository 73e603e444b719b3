"""`record`: how brim declares the small immutable objects every request makes many of."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TypeVar, dataclass_transform

_T = TypeVar("_T")


@dataclass_transform(frozen_default=True, field_specifiers=(field,))
def record(cls: type[_T]) -> type[_T]:
    """A frozen dataclass to the type checker — mypy refuses any assignment to a field, and
    copies are made with `dataclasses.replace` — built as a plain slots dataclass. A frozen
    dataclass sets each field through `object.__setattr__` when it is made: ~1.2k instructions
    a field under callgrind (18k an `Exchange`, of which every request makes two or more),
    where a plain one stores it in a few dozen. Hashed by its fields, as a frozen one is."""
    return dataclass(slots=True, unsafe_hash=True)(cls)
