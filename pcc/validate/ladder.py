"""Run the ladder: levels in order, each figure against its expectation, stop at the first
failing level (unless keep_going), and write report.json, report.md and the plots."""

from __future__ import annotations

import sys
import time
import traceback
from dataclasses import asdict, dataclass, field
from pathlib import Path

from pcc.lang.outputs import write_atomic

from . import expect, faults as F
from .context import Context, ValidateConfig
from .levels import Outcome, l1_contract, l2_converter, l3_operator, l4_scoring, l5_routes, l6_update, l7_step, l8_run

RUNNERS = {2: l2_converter.run, 3: l3_operator.run, 4: l4_scoring.run, 5: l5_routes.run, 6: l6_update.run,
           7: l7_step.run, 8: l8_run.run, 9: l8_run.profile}
NAMES = {1: "precision contract", 2: "quantizer and converter", 3: "one operator", 4: "fixed-prefix scoring",
         5: "routes and request state", 6: "live update", 7: "deterministic training step", 8: "bounded RL run",
         9: "performance profile"}


@dataclass
class LevelResult:
    level: int
    name: str
    status: str  # pass | fail | error | skipped
    compares: str = ""
    localizes: str = ""
    figures: dict = field(default_factory=dict)
    checks: list = field(default_factory=list)
    findings: list = field(default_factory=list)
    look: list = field(default_factory=list)
    data: dict = field(default_factory=dict)
    seconds: float = 0.0
    error: str | None = None


def parse_levels(text: str) -> list[int]:
    """'1-8', '4', '2,4-6' -> sorted level numbers in 1..9."""
    out: set[int] = set()
    for part in text.split(","):
        lo, _, hi = part.strip().partition("-")
        if not lo.isdigit() or (hi and not hi.isdigit()):
            raise ValueError(f"--levels {text!r}: expected e.g. 1-8, 4 or 2,4-6")
        a, b = int(lo), int(hi or lo)
        if not 1 <= a <= b <= 9:
            raise ValueError(f"--levels {text!r}: levels are 1..9")
        out.update(range(a, b + 1))
    return sorted(out)


def _result(level: int, o: Outcome, doc: dict, seconds: float) -> LevelResult:
    info = expect.level_info(doc, level)
    checks = [expect.compare(t, o.figures) for t in expect.thresholds(doc, level)] + o.checks
    unmeasured = [c["metric"] for c in checks if c["ok"] is None]
    findings = list(o.findings) + [f"not measured: {m}" for m in unmeasured]
    status = "fail" if any(c["ok"] is not True for c in checks) else "pass"
    return LevelResult(level, NAMES[level], status, info.get("compares", ""), info.get("localizes", ""),
                       o.figures, checks, findings, o.look if status != "pass" else [], o.data, round(seconds, 3))


def _say(progress: bool, text: str) -> None:
    if progress:
        print(text, file=sys.stderr, flush=True)


MARKER = ".pcc-validate"  # written first into the run directory: what a later validate may write over


def _claim(out: Path) -> None:
    """validate writes `source/`, `rollout/`, `versions/` and reports into `out`: only into a new or empty
    directory or one a validate wrote (its marker), so a user's folder is never written over (PCC707)."""
    from pcc.runtime.rundir import RunDirError

    if out.exists() and not out.is_dir():
        raise RunDirError(f"{out}: exists and is not a directory; --out names the validation's run directory")
    if out.is_dir() and not (out / MARKER).is_file() and any(out.iterdir()):
        raise RunDirError(f"{out}: holds files and is not a validation run directory (no {MARKER}); validate "
                          "writes only into a new, empty or earlier validation directory: choose another --out")
    try:
        out.mkdir(parents=True, exist_ok=True)
        write_atomic(out / MARKER, "pcc validate run directory\n")
    except OSError as exc:
        raise RunDirError(f"{exc.filename or out}: cannot write: {exc.strerror}", "PCC709") from None


def validate(target: str, levels: list[int], out: Path, engine: str = "local", model: str | None = None,
             keep_going: bool = False, cfg: ValidateConfig | None = None, inject: tuple = (),
             progress: bool = False, plots: bool = True) -> dict:
    out = Path(out)
    _claim(out)
    cfg = cfg or ValidateConfig()
    inject = F.check(inject)
    results: list[LevelResult] = []
    t0 = time.perf_counter()
    compiled, o1 = l1_contract.compile_contract(target, model)
    if compiled is None:
        results.append(_result(1, o1, {}, time.perf_counter() - t0))
        return _finish(target, engine, model, out, results, {}, inject, plots)
    doc = expect.load(compiled.plan, target)
    _say(progress, f"pcc validate: {compiled.plan.contract.name} on {compiled.plan.catalog.name}, "
                   f"regime {doc.get('regime')}, levels {levels[0]}-{levels[-1]}, engine {engine}")
    with F.active(inject):
        ctx = Context(compiled, cfg, out, engine, inject, doc)
        if 1 in levels:
            results.append(_result(1, l1_contract.run(ctx, o1), doc, time.perf_counter() - t0))
            _say(progress, f"  level 1 {NAMES[1]}: {results[-1].status}")
        for lv in [x for x in levels if x > 1]:
            if results and results[-1].status != "pass" and not keep_going:
                results.append(LevelResult(lv, NAMES[lv], "skipped"))
                continue
            t = time.perf_counter()
            try:
                r = _result(lv, RUNNERS[lv](ctx), doc, time.perf_counter() - t)
            except Exception as exc:  # a level that cannot finish is a finding, with its traceback
                tb = traceback.format_exc(limit=4)
                info = expect.level_info(doc, lv)
                r = LevelResult(lv, NAMES[lv], "error", info.get("compares", ""), info.get("localizes", ""),
                                error=f"{type(exc).__name__}: {exc}", findings=[tb.strip().splitlines()[-1]],
                                seconds=round(time.perf_counter() - t, 3))
            results.append(r)
            _say(progress, f"  level {lv} {NAMES[lv]}: {r.status} ({r.seconds:.1f} s)"
                 + (f": {r.findings[0]}" if r.status != "pass" and r.findings else ""))
    return _finish(target, engine, model, out, results, doc, inject, plots,
                   compiled.plan.contract.name, compiled.plan.catalog.name)


def _finish(target, engine, model, out: Path, results: list[LevelResult], doc: dict, inject, plots: bool,
            contract: str | None = None, catalog: str | None = None) -> dict:
    from pcc.runtime.checkpoint import write_json

    from .report import markdown

    failed = [r for r in results if r.status in ("fail", "error")]
    report = {"target": target, "contract": contract, "model": catalog, "model_override": model, "engine": engine,
              "regime": doc.get("regime"), "injected_faults": list(inject), "out": str(out),
              "ok": not failed, "first_failure": failed[0].level if failed else None,
              "levels": [asdict(r) for r in results], "plots": []}
    if plots:
        from .plots import plot

        report["plots"] = plot(report, out)
    write_json(out / "report.json", report)
    write_atomic(out / "report.md", markdown(report))
    return report
