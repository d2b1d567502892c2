"""llama.cpp through llama-cpp-python's ctypes bindings (see docs/architecture.md).

llama-cpp-python's package `__init__` imports its high-level `Llama` class too, and with it
numpy, jinja2 and the chat formats: about 150 ms on two cores, all of it before the model's
load can begin (model_load.py), though nothing here uses that class. So, unless something
imported `llama_cpp` first, the package is registered here as a bare module over the same
folder: its submodules (`llama_cpp.llama_cpp`, `llama_cpp.mtmd_cpp`) import as usual, and
the first look-up of anything else on the package (`from llama_cpp import Llama`, in a
test) runs the real `__init__` into it then.
"""

from __future__ import annotations

import importlib.util
import re
import sys
import types
from typing import Any

_PACKAGE = "llama_cpp"


def _register_bare_package() -> None:
    if _PACKAGE in sys.modules:
        return
    spec = importlib.util.find_spec(_PACKAGE)  # finds the package without running its __init__
    if spec is None or spec.origin is None or spec.submodule_search_locations is None:
        return  # not installed as a plain package: the imports below fail or succeed as usual
    origin = spec.origin
    with open(origin, encoding="utf-8") as f:
        init_source = f.read()
    package = types.ModuleType(_PACKAGE)
    package.__file__ = spec.origin
    package.__path__ = list(spec.submodule_search_locations)
    package.__spec__ = spec
    package.__package__ = _PACKAGE
    version = re.search(r'^__version__\s*=\s*"([^"]+)"', init_source, re.MULTILINE)
    if version is not None:
        package.__dict__["__version__"] = version.group(1)
    completed = [False]

    def complete(name: str) -> Any:
        # Module-level __getattr__ (PEP 562): called only for names the module lacks.
        if not completed[0]:
            completed[0] = True
            exec(compile(init_source, origin, "exec"), package.__dict__)
        try:
            return package.__dict__[name]
        except KeyError:
            raise AttributeError(f"module {_PACKAGE!r} has no attribute {name!r}") from None

    package.__dict__["__getattr__"] = complete
    sys.modules[_PACKAGE] = package


_register_bare_package()
