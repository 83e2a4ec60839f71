"""Stand-in for ``torchvision`` on CPU installs, installed before anything imports sglang.

Why this cannot wait for the plugin: ``import sglang`` itself runs
``from torchvision.io import decode_jpeg`` (sglang/srt/utils/common.py), and SGLang loads its
plugins only after that. PyPI's torchvision wheels are CUDA builds that fail to import beside the
CPU torch wheel ("operator torchvision::nms does not exist"), so the CPU install leaves
torchvision out and this module supplies a stand-in.

It is loaded from a ``.pth`` file that ``scripts/setup_env.sh`` writes into the venv, so it runs
at interpreter start in every process (spawned scheduler and detokenizer processes included).
It does nothing when a real torchvision is importable (GPU installs).

The stand-in: any ``torchvision.*`` module imports; any attribute is a placeholder that raises
``ImportError`` when called or used. Transformers must not mistake it for a real torchvision
(it would pick torchvision-based image processors), so ``is_torchvision_available`` is forced
to False right after ``transformers.utils.import_utils`` executes.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import sys
import types

STUB_ROOT = "torchvision"
TRANSFORMERS_IMPORT_UTILS = "transformers.utils.import_utils"


class _Missing:
    """A torchvision attribute on a host without torchvision: fails only when actually used."""

    def __init__(self, name: str):
        self._name = name

    def __getattr__(self, attr: str) -> "_Missing":
        if attr.startswith("__"):
            raise AttributeError(attr)
        return _Missing(f"{self._name}.{attr}")

    def __call__(self, *args, **kwargs):
        raise ImportError(f"{self._name} needs torchvision, which this CPU install leaves out")

    def __repr__(self) -> str:
        return f"<missing {self._name}>"


class _StubModule(types.ModuleType):
    def __getattr__(self, attr: str):
        if attr.startswith("__"):
            raise AttributeError(attr)
        return _Missing(f"{self.__name__}.{attr}")


class _Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, fullname, path=None, target=None):
        if fullname == STUB_ROOT or fullname.startswith(STUB_ROOT + "."):
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        if fullname == TRANSFORMERS_IMPORT_UTILS:
            return self._wrap_transformers(fullname, path, target)
        return None

    def _wrap_transformers(self, fullname, path, target):
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None:
                break
        else:
            return None
        real_exec = spec.loader.exec_module

        def exec_module(module):
            real_exec(module)
            module.is_torchvision_available = lambda: False

        spec.loader.exec_module = exec_module
        return spec

    def create_module(self, spec):
        module = _StubModule(spec.name)
        module.__path__ = []
        module.__version__ = "0.0.0+cpu-stub"
        return module

    def exec_module(self, module):
        return None


def install() -> bool:
    """Install the stand-in if torchvision is missing; returns whether it was installed."""
    if any(isinstance(f, _Finder) for f in sys.meta_path):
        return True
    if importlib.util.find_spec(STUB_ROOT) is not None:
        return False
    sys.meta_path.insert(0, _Finder())
    return True


install()
