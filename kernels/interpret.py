"""Triton's CPU interpreter without its repeated language patch (speed only, same bits).

Under ``TRITON_INTERPRET=1`` a kernel launch patches ``triton.language`` (every builtin wrapped for
the interpreter's semantic, found by ``inspect.getmembers`` of ``tl``, ``tl.tensor``, ``tl.math``)
and restores it when the launch ends.  Triton 3.x's interpreter also re-runs that patch on *every
call of a ``@triton.jit`` device function* inside the launch (and never restores those: a function
of ``triton.language.standard``, whose globals hold ``tl.core``, leaves ``tl.core`` patched).  The
kernels here call their rounding and tile helpers per program, so on the CPU tier the repeats were
half of an interpreted parity check's time: 77 ``fp8_e4m3`` checks (16x48, N=4) took 14.3 s, 60,561
``_patch_builtin`` calls; with ``install()`` 7.5 s, 11 module patches per 4 launches.

``install()`` changes two things, both inside the interpreter only:

* a device-function call inside a launch skips the patch when the modules it sees (``tl`` /
  ``tl.core`` in its globals) were patched already in this launch, by the launch or by an earlier
  device call (whose patch Triton never undoes); otherwise Triton's own patch runs;
* the builtins of a language module are listed once (they never change) instead of by
  ``inspect.getmembers`` on every patch: at its first patch after ``install()``, when a launch's
  own patch has been restored; a module that an earlier device call left patched (above) is
  listed without those members, whose wrappers stay and do the same.

It replaces only the interpreter's module-level ``_patch_lang`` / ``_patch_builtin`` and only when
they have the shape described here (``install`` returns False otherwise and changes nothing).
Nothing changes on a GPU.  ``tests/kernels/test_interpret.py`` compares kernel bits with and without.
"""

from __future__ import annotations

import contextlib
import inspect
import threading
from typing import Any, Callable, Iterator

_STATE = threading.local()
_INSTALLED: list[tuple[Callable[..., Any], Callable[..., Any]]] = []
_SUSPENDED: list[bool] = []


class _Scope:
    """A launch's patch scope that also pops the launch's record of patched modules on restore."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner

    def restore(self) -> None:
        try:
            self._inner.restore()
        finally:
            stack = getattr(_STATE, "stack", None)
            if stack:
                stack.pop()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


class _Nothing:
    @staticmethod
    def restore() -> None:
        return None


def _langs(fn: Any, lang_modules: tuple[Any, ...]) -> frozenset[int]:
    return frozenset(id(v) for v in fn.__globals__.values() if inspect.ismodule(v) and any(v is m for m in lang_modules))


def install() -> bool:
    """Install the shortcut once per process (interpreter mode only); True when it is active."""
    if _INSTALLED:
        return True
    if _SUSPENDED:
        return False
    try:
        import triton.language as tl
        from triton.runtime import interpreter
    except Exception:  # no Triton: nothing to speed up
        return False
    original = getattr(interpreter, "_patch_lang", None)
    if original is None or list(inspect.signature(original).parameters) != ["fn"]:
        return False  # another interpreter than the one described above: leave it alone
    lang_modules = (tl, tl.core)
    launch_src = inspect.getsource(interpreter.GridExecutor.__call__)
    device_src = inspect.getsource(interpreter.InterpretedFunction.__call__)
    if "patch_scope = _patch_lang(self.fn)" not in launch_src or "_patch_lang(self.fn)" not in device_src:
        return False

    def _patch_lang(fn: Any) -> Any:
        stack = getattr(_STATE, "stack", None)
        if stack is None:
            stack = _STATE.stack = []
        langs = _langs(fn, lang_modules)
        caller = inspect.currentframe().f_back  # type: ignore[union-attr]
        is_launch = caller is not None and isinstance(caller.f_locals.get("self"), interpreter.GridExecutor)
        if not is_launch and stack and langs <= stack[-1]:
            return _Nothing()  # a device function inside a launch that patched its modules already
        scope = original(fn)
        if not is_launch:
            if stack:  # Triton never restores a device call's patch: its modules stay patched for the launch
                stack[-1] = stack[-1] | langs
            return scope
        stack.append(langs)
        return _Scope(scope)

    builtins: dict[int, tuple[Any, list[tuple[str, Any]]]] = {}
    original_builtin = interpreter._patch_builtin

    def _patch_builtin(pkg: Any, builder: Any, scope: Any) -> None:
        # the builtins of a language module never change: list them once (module docstring)
        hit = builtins.get(id(pkg))
        if hit is None or hit[0] is not pkg:
            hit = builtins[id(pkg)] = (pkg, [(n, m) for n, m in inspect.getmembers(pkg) if tl.core.is_builtin(m)])
        for name, member in hit[1]:
            interpreter._patch_attr(pkg, name, member, builder, scope)

    interpreter._patch_lang = _patch_lang
    interpreter._patch_builtin = _patch_builtin
    _INSTALLED.append((original, original_builtin))
    return True


@contextlib.contextmanager
def suspended() -> Iterator[None]:
    """Triton's own interpreter inside the block (the tests compare both); reinstalled after it if it was."""
    was = bool(_INSTALLED)
    _uninstall()
    _SUSPENDED.append(True)
    try:
        yield
    finally:
        _SUSPENDED.pop()
        if was:
            install()


def _uninstall() -> None:
    if not _INSTALLED:
        return
    from triton.runtime import interpreter

    interpreter._patch_lang, interpreter._patch_builtin = _INSTALLED.pop()
