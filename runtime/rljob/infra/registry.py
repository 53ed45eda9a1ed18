"""A registry of classes by name, for extension points that backends join by
decorator (rollout engines, trainer engines, storage backends): it type-checks what it is given,
refuses a second class under a taken name, and names the choices when asked for
one it does not have."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Generic, TypeVar

T = TypeVar("T", bound=type)


class Registry(Generic[T]):
    def __init__(self, field: str, base: type):
        self.field = field  # the spec field whose values these are, for messages
        self.base = base
        self._classes: dict[str, T] = {}

    def register(self, name: str) -> Callable[[T], T]:
        def add(cls: T) -> T:
            if not (isinstance(cls, type) and issubclass(cls, self.base)):
                raise TypeError(f"{self.field} {name!r}: {cls!r} is not a "
                                f"{self.base.__name__}")
            taken = self._classes.get(name)
            if taken is not None and taken is not cls:
                raise ValueError(f"{self.field} {name!r} is registered already "
                                 f"({taken.__module__}.{taken.__qualname__})")
            self._classes[name] = cls
            return cls
        return add

    def get(self, name: str) -> T:
        try:
            return self._classes[name]
        except KeyError:
            raise ValueError(f"{self.field} {name!r} is not available here: use one of "
                             f"{', '.join(sorted(self._classes))}") from None

    def __contains__(self, name: object) -> bool:
        return name in self._classes

    def __iter__(self) -> Iterator[str]:
        return iter(sorted(self._classes))
