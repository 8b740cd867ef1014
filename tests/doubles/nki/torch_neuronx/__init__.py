"""Test double of torch-neuronx's NKI operator API (``nki_op``, ``wrap_nki``) on any device.

The real ``wrap_nki`` traces an NKI kernel into a higher-order operator launched on Neuron;
this one calls the kernel double directly, with the launch grid (``[(lnc,)]``) made visible to
it the way ``get_verified_program_sharding_info()`` sees it on the device.
"""

from __future__ import annotations

import contextlib
import inspect
import threading
from typing import Any, Iterable

import torch

from torch_neuronx import utils  # noqa: F401

__version__ = "0.0.0+placeholder"

_launch = threading.local()


def current_grid() -> tuple[int, ...]:
    """The grid of the kernel launch in progress (``()`` outside one)."""
    return getattr(_launch, "grid", ())


@contextlib.contextmanager
def _launched(grid: tuple[int, ...]):
    previous = current_grid()
    _launch.grid = grid
    try:
        yield
    finally:
        _launch.grid = previous


class _Caller:
    def __init__(self, kernel: Any, grid: tuple[int, ...] = ()):
        self.kernel = kernel
        self.grid = grid
        self.arg_names = list(kernel.sign.parameters)
        self.defaults = {
            name: p.default for name, p in kernel.sign.parameters.items() if p.default is not inspect.Parameter.empty
        }

    def __getitem__(self, grid) -> "_Caller":
        return _Caller(self.kernel, tuple(map(int, grid)))  # like torch-neuronx: an iterable grid

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        bound = {**dict(zip(self.arg_names, args)), **kwargs}
        unknown = set(bound) - set(self.arg_names)
        if unknown:
            raise TypeError(f"{self.kernel.func.__name__}() got unexpected argument(s) {sorted(unknown)}")
        for name in self.arg_names:
            if name not in bound:
                if name not in self.defaults:
                    raise TypeError(f"{self.kernel.func.__name__}() missing argument {name!r}")
                bound[name] = self.defaults[name]
        with _launched(self.grid):
            return self.kernel.func(**bound)


def wrap_nki(nki_kernel: Any, **kwargs: Any) -> _Caller:
    if not hasattr(nki_kernel, "func") or not hasattr(nki_kernel, "sign"):
        raise TypeError("wrap_nki() takes an @nki.jit kernel")
    return _Caller(nki_kernel)


def nki_op(name: str, fn=None, mutates_args: str | Iterable[str] = {}):
    """A ``torch.library`` custom operator; the function is also its fake (meta) kernel."""

    def dec(fn):
        op = torch.library.custom_op(name, fn, mutates_args=mutates_args)
        op.register_fake(fn)
        return op

    return dec if fn is None else dec(fn)
