"""The run directory: what `pcc run --out DIR` may write over and what `--resume` must find
(docs/runtime.md, "The run directory"; docs/safety.md).

- a new or empty DIR starts a run;
- a DIR holding a run (its `run.json`) is continued with `--resume`, started again with
  `--force` (which deletes the run's own files only, never others), and refused otherwise;
- a DIR holding anything else is refused, `--force` or not;
- `--resume` needs the run of the same contract (plan lock), model and settings, and its
  `checkpoint/state.json`: a missing or damaged one is refused, the metrics kept.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import stat
from pathlib import Path

from pcc.lang.diagnostics import PccError
from pcc.lang.inputs import InputError, read_json

RUN_JSON = "run.json"
RUN_FILES = (RUN_JSON, "metrics.jsonl", "summary.json", "summary.txt", "index.html")  # index.html: --format html
RUN_DIRS = ("checkpoint", "model", "rollout")
# RunConfig fields a resumed run must share with the run it continues (steps may grow; faults are one-off).
SETTINGS = ("seed", "prompts", "group", "lr", "temperature", "digits", "eps", "ref_coef", "bucket_bytes", "warm",
            "variant")


class RunDirError(PccError):
    """A run directory pcc will not write or resume; the message names the file and what to do (PCC707)."""

    code = "PCC707"


@contextlib.contextmanager
def writer_lock(out: Path):
    """An exclusive lock for the writer of `out`: `.NAME.pcc-lock` beside it (never inside a folder the run
    may yet refuse; `--out .` is the folder's own name), held by flock for the whole run; a second writer is
    refused at once (PCC707). The lock is a file pcc makes itself: opened without following a link and
    without truncating, then checked, so a link or another's file planted there is refused untouched."""
    where = Path(os.path.abspath(out))
    if not where.name:
        raise RunDirError(f"{out}: the root folder cannot be a run directory; choose a folder under it")
    _creatable(out, where)
    lock = where.parent / f".{where.name}.pcc-lock"
    fd = _open_lock(out, lock)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            holder = os.pread(fd, 32, 0).decode(errors="replace").strip()
            raise RunDirError(f"{out}: another pcc run (pid {holder or '?'}) is writing it now; wait for it or "
                              "choose another --out") from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        yield
    finally:
        os.close(fd)  # releases the lock; the empty-of-meaning file stays (removing it would race a waiter)


def _creatable(out: Path, where: Path) -> None:
    """Create the folder that holds `out`, or say in the user's own words why not (`--out afile/sub`)."""
    above = next((p for p in Path(out).parents if p.exists() and not p.is_dir()), None)
    if above is not None:
        raise RunDirError(f"{out}: cannot create it: {above} is a file, not a folder; --out names a run "
                          "directory", "PCC709")
    try:
        where.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise RunDirError(f"{out}: cannot create the folder that holds it ({exc.filename}: {exc.strerror})",
                          "PCC709") from None


def _open_lock(out: Path, lock: Path) -> int:
    """The lock's descriptor: created or reopened with O_NOFOLLOW and no O_TRUNC (a link there is never
    followed, its target never written), then held to be what pcc makes: a regular file of the user's with
    one link."""
    flags = os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK
    try:
        fd = os.open(lock, flags, 0o600)
    except OSError as exc:
        if lock.is_symlink():
            raise RunDirError(f"{lock}: a link where pcc run keeps the lock of {out}; pcc creates that file itself "
                              "and follows no link there (its target is untouched): remove the link") from None
        raise RunDirError(f"{out}: cannot create its lock {lock}: {exc.strerror}", "PCC709") from None
    st = os.fstat(fd)
    why = ("not a regular file" if not stat.S_ISREG(st.st_mode) else f"a file with {st.st_nlink} links"
           if st.st_nlink != 1 else f"owned by uid {st.st_uid}" if st.st_uid != os.geteuid() else None)
    if why:
        os.close(fd)
        raise RunDirError(f"{lock}: not a lock pcc run made ({why}) where it keeps the lock of {out}; remove it")
    return fd


def identity(plan_lock: str, model_override: str | None, cfg) -> dict:
    """What makes two runs one run: the plan, the model it runs on, the settings."""
    return {"plan_lock": plan_lock, "model_override": model_override,
            "settings": {k: getattr(cfg, k) for k in SETTINGS}}


def prepare(out: Path, ident: dict, resume: bool, force: bool) -> None:
    """Check `out` against what this run may do there (module docstring); with `force`, clear a run's files."""
    if out.exists() and not out.is_dir():
        raise RunDirError(f"{out}: exists and is not a directory; --out names a run directory")
    entries = sorted(p.name for p in out.iterdir()) if out.is_dir() else []
    ours = (out / RUN_JSON).is_file()
    if resume:
        _check_resume(out, ident, ours)
        return
    if not entries:
        return
    if not ours:
        raise RunDirError(f"{out}: holds files ({', '.join(entries[:3])}{', ...' if len(entries) > 3 else ''}) and "
                          "is not a run directory; pcc run writes only into a new, empty or run directory "
                          "(--force does not change this): choose another --out")
    if not force:
        raise RunDirError(f"{out}: holds a run; --resume continues it, --force starts it again (deleting its "
                          "metrics and checkpoints)")
    for name in RUN_FILES:
        (out / name).unlink(missing_ok=True)
    for name in RUN_DIRS:
        if (out / name).is_dir() and not (out / name).is_symlink():
            shutil.rmtree(out / name)
        else:
            (out / name).unlink(missing_ok=True)
    for png in out.glob("*.png"):
        png.unlink()


def _check_resume(out: Path, ident: dict, ours: bool) -> None:
    if not ours:
        raise RunDirError(f"{out / RUN_JSON}: missing: {out} holds no run to resume; run without --resume")
    try:
        rec = read_json(out / RUN_JSON, what="run record")
    except InputError as exc:
        raise RunDirError(f"{exc.message}; the run cannot be resumed (--force starts it again)") from None
    was = rec.get("identity") if isinstance(rec, dict) else None
    if not isinstance(was, dict):
        raise RunDirError(f"{out / RUN_JSON}: records no plan lock and settings (written by an older pcc?); "
                          "it cannot be resumed safely: --force starts it again")
    differ = [k for k in ("plan_lock", "model_override") if was.get(k) != ident[k]]
    settings = was.get("settings") if isinstance(was.get("settings"), dict) else {}
    differ += [k for k in SETTINGS if settings.get(k) != ident["settings"][k]]
    if differ:
        raise RunDirError(f"{out}: a run of another contract or settings ({', '.join(differ)} differ from "
                          f"{out / RUN_JSON}); resume with the ones it began with, or choose another --out")
    state = out / "checkpoint" / "state.json"
    if not state.exists():
        raise RunDirError(f"{state}: missing: no completed step to resume (the metrics are kept); --force starts "
                          "the run again")
