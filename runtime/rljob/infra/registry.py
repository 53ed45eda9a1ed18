"""The one style of every extension point: a registry of named things (rollout and
trainer engines, storage backends, advantage estimators, policy losses, claim
policies, step sinks, rewards, length predictors). The project's own join by
decorator; an installed package joins by an entry point in the registry's group
(`[project.entry-points."rljob.rollout_engines"] mine = "my_pkg.engine:MyEngine"`),
loaded the first time its name is asked for; `module:attribute` names an
importable one directly, and `path/to/file.py:attribute` one in a file (a relative
path is read from the job file's directory: preflight.resolve_paths). A registry
checks what it is given (a subclass of its base, or a callable), refuses a second
thing under a taken name, and names the choices when asked for one it does not have
(the closest first, as "did you mean", where one is close)."""

from __future__ import annotations

import difflib
import hashlib
import importlib
import importlib.util
import logging
import sys
from collections.abc import Callable, Iterator
from importlib.metadata import EntryPoint, entry_points
from pathlib import Path
from typing import Generic, TypeVar

T = TypeVar("T")
log = logging.getLogger("rljob.registry")


class Registry(Generic[T]):
    def __init__(self, field: str, base: type | None, group: str):
        self.field = field  # the spec field (or what) these are, for messages
        self.base = base  # None: any callable (functions, factories)
        self.group = group  # the entry point group installed packages add to
        self._things: dict[str, T] = {}

    def _check(self, name: str, thing) -> None:
        if self.base is None:
            if not callable(thing):
                raise TypeError(f"{self.field} {name!r}: {thing!r} is not callable")
        elif not (isinstance(thing, type) and issubclass(thing, self.base)):
            raise TypeError(f"{self.field} {name!r}: {thing!r} is not a {self.base.__name__}")

    def register(self, name: str) -> Callable[[T], T]:
        def add(thing: T) -> T:
            self._check(name, thing)
            taken = self._things.get(name)
            if taken is not None and taken is not thing:
                raise ValueError(f"{self.field} {name!r} is registered already "
                                 f"({_where(taken)})")
            self._things[name] = thing
            return thing
        return add

    def _entry_points(self) -> dict[str, EntryPoint]:
        return {ep.name: ep for ep in entry_points(group=self.group)}

    def _load(self, ep: EntryPoint) -> T:
        try:
            thing = ep.load()
        except Exception as exc:  # noqa: BLE001 - an installed package, broken on import
            raise ValueError(f"{self.field} {ep.name!r}: the entry point {ep.value!r} "
                             f"(group {self.group}) fails to load: {type(exc).__name__}: "
                             f"{exc}") from None
        try:
            return self.register(ep.name)(thing)
        except TypeError as exc:  # it loads, but is not what this registry holds
            raise ValueError(f"{exc} (the entry point {ep.value!r}, group {self.group})"
                             ) from None

    def get(self, name: str) -> T:
        found = self._things.get(name)
        if found is not None:
            return found
        ep = self._entry_points().get(name)
        if ep is not None:
            return self._load(ep)
        if ":" in name:
            return self._import(name)
        raise ValueError(f"{self.field} {name!r} is not available here{self.suggest(name)}: "
                         f"use one of {', '.join(self.names())}, module:attribute or "
                         "path/to/file.py:attribute")

    def suggest(self, name: str) -> str:
        """' (did you mean "x"?)' where `name` is close to one of the names, else ''."""
        close = difflib.get_close_matches(name, self.names(), n=1, cutoff=0.75)
        return f' (did you mean "{close[0]}"?)' if close else ""

    def _import(self, name: str) -> T:
        """`module:attribute` or `path/to/file.py:attribute`, imported (not
        registered: the name is its address)."""
        module, _, attribute = name.rpartition(":")
        try:
            loaded = (import_file(Path(module)) if module.endswith(".py")
                      else importlib.import_module(module))
            thing = getattr(loaded, attribute)
        except Exception as exc:  # noqa: BLE001 - a user's module: missing, or broken
            raise ValueError(f"{self.field} {name!r}: cannot import it: "
                             f"{type(exc).__name__}: {' '.join(str(exc).split())}") from None
        try:
            self._check(name, thing)
        except TypeError as exc:
            raise ValueError(str(exc)) from None
        return thing

    def loaded(self) -> dict[str, T]:
        """Every thing by name, the installed packages' entry points loaded too (one
        that fails to load is logged and left out), in registration order."""
        for name, ep in self._entry_points().items():
            if name not in self._things:
                try:
                    self._load(ep)
                except ValueError as exc:
                    log.warning("%s", exc)
        return dict(self._things)

    def remove(self, name: str) -> None:
        """Forget `name` (a test's registration)."""
        self._things.pop(name, None)

    def names(self) -> list[str]:
        """The names registered and those installed packages offer (not loaded)."""
        return sorted(set(self._things) | set(self._entry_points()))

    def __contains__(self, name: object) -> bool:
        return name in self._things or name in self._entry_points()

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())


def file_part(name: str) -> str | None:
    """The file of `path/to/file.py:attribute` (None for a name or a module)."""
    module, sep, _ = name.rpartition(":")
    return module if sep and module.endswith(".py") else None


def import_file(path: Path):
    """The module a Python file defines, loaded once per file (its own directory on
    the path while it loads, so it imports the helpers beside it; those helpers are
    then forgotten by name, so another directory's `helper` is its own)."""
    path = Path(path).resolve()
    if not path.is_file():
        raise FileNotFoundError(f"{path} is not a file")
    module_name = f"rljob_file_{hashlib.sha256(str(path).encode()).hexdigest()[:16]}"
    if module_name in sys.modules:
        return sys.modules[module_name]
    spec = importlib.util.spec_from_file_location(module_name, path)
    module = importlib.util.module_from_spec(spec)
    before = set(sys.modules)
    sys.path.insert(0, str(path.parent))
    try:
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(path.parent))
        for name in set(sys.modules) - before:
            file = getattr(sys.modules[name], "__file__", None) or ""
            if Path(file).parent == path.parent:
                del sys.modules[name]
    sys.modules[module_name] = module
    return module


def _where(thing) -> str:
    return f"{getattr(thing, '__module__', '?')}.{getattr(thing, '__qualname__', thing)}"
