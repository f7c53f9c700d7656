"""What every module of this torchvision stand-in exports: names that import, and fail
when used.

Why a stand-in: PyPI's torchvision is built against a CUDA torch and fails to import beside
the CPU torch 2.13.0 these machines install (``operator torchvision::nms does not exist``).
SGLang and vLLM import torchvision at module level only for their multimodal image
processors (``InterpolationMode``, ``transforms.functional``), on import paths that also
lead to the KV-cache host pools and offloading code the integration tests drive. Nothing
the tests and ``kvstore bench engines`` run touches an image, so a name that imports and
raises when called is enough. ``.ci/engines`` copies this package into the venv only when
no real torchvision imports there (a GPU machine's own torchvision is left alone).
"""

from __future__ import annotations


class Absent:
    """A torchvision name: attribute access gives another, any call raises."""

    def __init__(self, name: str) -> None:
        self._name = name

    def __getattr__(self, attr: str) -> Absent:
        if attr.startswith("__"):
            raise AttributeError(attr)
        return Absent(f"{self._name}.{attr}")

    def __call__(self, *args, **kwargs):
        raise RuntimeError(f"{self._name} is not available: this is kvstored's CPU-only "
                           "torchvision stand-in (.ci/standins, installed by .ci/engines)")

    def __repr__(self) -> str:
        return f"<absent {self._name}>"


def module_getattr(module: str):
    def __getattr__(attr: str) -> Absent:
        if attr.startswith("__"):
            raise AttributeError(attr)
        return Absent(f"{module}.{attr}")

    return __getattr__
