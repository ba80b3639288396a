"""Every exception class pcc defines derives from the root PccError (pcc/lang/diagnostics.py), so a
caller can turn any of them into a coded diagnostic, and the `pcc` frame never reports one of pcc's own
refusals as an internal error. Warning categories (for warnings.warn, never raised) are not errors."""

from __future__ import annotations

import importlib
import inspect
import pkgutil

import pcc
from pcc.lang.diagnostics import PccError


def _modules() -> list[str]:
    return sorted(m.name for m in pkgutil.walk_packages(pcc.__path__, "pcc."))


def _classes(module) -> list[type]:
    """The classes `module` defines, nested ones included."""
    out, todo = [], [c for _, c in inspect.getmembers(module, inspect.isclass) if c.__module__ == module.__name__]
    while todo:
        cls = todo.pop()
        out.append(cls)
        todo += [c for c in vars(cls).values() if inspect.isclass(c) and c.__module__ == module.__name__]
    return out


def test_every_exception_derives_from_pcc_error():
    names = _modules()
    assert len(names) > 100 and "pcc.cli" in names and "pcc.runtime.loop" in names  # the walk itself works
    outside = []
    for name in names:
        for cls in _classes(importlib.import_module(name)):
            if issubclass(cls, Exception) and not issubclass(cls, (PccError, Warning)):
                outside.append(f"{name}.{cls.__qualname__}")
    assert not outside, f"exception classes outside PccError: {outside}"


def test_one_definition_of_each_engine_error():
    """VerifyError and EngineMissing are one class whichever engine's check raised them."""
    from pcc.lower import (engine_errors, side_folder, verify_fsdp, verify_megatron, verify_sglang, verify_verl,
                           verify_vllm)

    for m in (verify_fsdp, verify_megatron, verify_sglang, verify_verl, verify_vllm):
        assert m.VerifyError is engine_errors.VerifyError and m.EngineMissing is engine_errors.EngineMissing
    assert side_folder.EngineMissing is engine_errors.EngineMissing
    assert issubclass(engine_errors.EngineMissing, ImportError) and issubclass(engine_errors.VerifyError, ValueError)


def test_constructors_keep_their_arguments():
    from pcc.cli import UsageError
    from pcc.plan.patterns import PatternError

    err = PatternError("bad range", "write [0..3]")
    assert (err.message, err.hint, str(err)) == ("bad range", "write [0..3]", "bad range")
    usage = UsageError("no such file", "x.prec")
    assert (usage.file, usage.code, str(usage)) == ("x.prec", "", "no such file")
