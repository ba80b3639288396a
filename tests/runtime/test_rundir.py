"""The run directory is never lost and never resumed wrongly (pcc.runtime.rundir, docs/runtime.md)."""

from __future__ import annotations

import json

import pytest
from runtime_helpers import CONTRACTS, small

from pcc.runtime.contract import ContractError, compile_for_runtime
from pcc.runtime.loop import InjectedCrash, RunConfig
from pcc.runtime.rundir import RunDirError
from pcc.runtime.session import execute, set_threads
from pcc.runtime.settings import SettingError
from pcc.runtime.warmstart import cache_dir


@pytest.fixture(scope="module")
def compiled():
    return compile_for_runtime(str(CONTRACTS / "tiny_cpu.prec"))


def _run(c, out, **kw):
    cfg = kw.pop("cfg", None) or small(steps=kw.pop("steps", 2))
    return execute(c, cfg, out, plots=False, progress=False, **kw)


def _metrics(out):
    return (out / "metrics.jsonl").read_text()


def test_an_existing_run_is_refused_without_resume_or_force(compiled, tmp_path):
    out = tmp_path / "r"
    _run(compiled, out)
    before = _metrics(out)
    with pytest.raises(RunDirError, match="holds a run; --resume continues it, --force starts it again") as err:
        _run(compiled, out)
    assert err.value.code == "PCC707" and _metrics(out) == before


def test_force_starts_again_deleting_only_the_runs_files(compiled, tmp_path):
    out = tmp_path / "r"
    _run(compiled, out)
    (out / "notes.txt").write_text("mine")
    _run(compiled, out, force=True)
    assert (out / "notes.txt").read_text() == "mine"
    assert len(_metrics(out).splitlines()) == 2


def test_a_directory_of_other_files_is_never_written_into(compiled, tmp_path):
    out = tmp_path / "data"
    out.mkdir()
    (out / "weights.bin").write_text("precious")
    for force in (False, True):
        with pytest.raises(RunDirError, match="is not a run directory"):
            _run(compiled, out, force=force)
    assert sorted(p.name for p in out.iterdir()) == ["weights.bin"]
    (tmp_path / "afile").write_text("x")
    with pytest.raises(RunDirError, match="not a directory"):
        _run(compiled, tmp_path / "afile")


def test_resume_without_state_keeps_the_metrics(compiled, tmp_path):
    out = tmp_path / "r"
    _run(compiled, out)
    before = _metrics(out)
    (out / "checkpoint" / "state.json").unlink()
    with pytest.raises(RunDirError, match=r"state\.json: missing: no completed step to resume"):
        _run(compiled, out, steps=3, resume=True)
    assert _metrics(out) == before
    with pytest.raises(RunDirError, match="no run to resume"):
        _run(compiled, tmp_path / "new", resume=True)


def test_resume_refuses_another_contract_or_settings(compiled, tmp_path):
    out = tmp_path / "r"
    _run(compiled, out)
    other = compile_for_runtime(str(CONTRACTS / "miles_mode1.prec"), "tiny_moe")
    with pytest.raises(RunDirError, match="plan_lock, model_override differ"):
        _run(other, out, steps=3, resume=True)
    with pytest.raises(RunDirError, match="prompts, lr differ"):
        _run(compiled, out, cfg=small(steps=3, prompts=16, lr=1e-3), resume=True)
    assert len(_metrics(out).splitlines()) == 2


def test_a_damaged_checkpoint_is_named_not_loaded(compiled, tmp_path):
    out = tmp_path / "r"
    with pytest.raises(InjectedCrash):
        _run(compiled, out, cfg=small(steps=3, crash_at=2))
    state = json.loads((out / "checkpoint" / "state.json").read_text())
    trainer = out / "checkpoint" / state["files"]["trainer"]["name"]
    data = bytearray(trainer.read_bytes())
    data[-5] ^= 0x10  # one bit of one weight
    trainer.write_bytes(bytes(data))
    with pytest.raises(RunDirError, match=rf"{trainer.name}: damaged \(its SHA-256"):
        _run(compiled, out, steps=3, resume=True)
    trainer.write_bytes(bytes(data[:100]))  # truncated
    with pytest.raises(RunDirError, match=trainer.name):
        _run(compiled, out, steps=3, resume=True)
    (out / "checkpoint" / "state.json").write_text('{"completed": 2')
    with pytest.raises(RunDirError, match=r"state\.json: not valid JSON"):
        _run(compiled, out, steps=3, resume=True)


def test_a_damaged_warm_start_cache_is_rebuilt_and_the_resume_is_exact(compiled, tmp_path, monkeypatch):
    import shutil

    private = tmp_path / "cache"  # a copy: the shared test cache stays whole for other tests
    shutil.copytree(cache_dir().parent, private)
    monkeypatch.setenv("PCC_CACHE", str(private))
    a, b = tmp_path / "a", tmp_path / "b"
    with pytest.raises(InjectedCrash):
        _run(compiled, a, cfg=small(steps=3, crash_at=1))
    for f in cache_dir().glob("*.safetensors"):  # every cached warm start damaged
        f.write_bytes(f.read_bytes()[:-64] + b"\0" * 64)
    with pytest.warns(UserWarning, match="not usable"):
        _run(compiled, a, steps=3, resume=True)
    _run(compiled, b, steps=3)

    def values(out):
        return [{k: v for k, v in json.loads(x).items() if k != "time"} for x in _metrics(out).splitlines()]

    assert values(a) == values(b) and len(values(a)) == 3
    state = a / "checkpoint" / "state.json"
    st = json.loads(state.read_text())
    st["warm_sha256"] = "0" * 64  # a run that began from another warm start
    state.write_text(json.dumps(st))
    with pytest.raises(RunDirError, match="another warm start"):
        _run(compiled, a, steps=4, resume=True)


def test_a_checkpoint_model_is_not_trained_as_if_it_were_its_weights(tmp_path):
    from pathlib import Path

    config = json.loads((Path(CONTRACTS).parent / "pcc" / "models" / "configs" / "tiny_dense.json").read_text())
    (tmp_path / "ckpt").mkdir()
    (tmp_path / "ckpt" / "config.json").write_text(json.dumps(config))
    src = tmp_path / "c.prec"
    src.write_text('contract c {\n  model from "ckpt"\n  hardware cpu\n}\n')
    c = compile_for_runtime(str(src))
    with pytest.raises(ContractError, match="trains its own warm-started weights, never a checkpoint's"):
        _run(c, tmp_path / "r")
    assert not (tmp_path / "r").exists()


@pytest.mark.parametrize("field, value", [("temperature", 0.0), ("temperature", -1.0), ("lr", -1.0), ("lr", 0.0),
                                          ("lr", float("nan")), ("prompts", 0), ("prompts", 10**8), ("group", 1),
                                          ("steps", -3), ("temperature", float("inf")), ("seed", -1),
                                          ("prompts", True), ("lr", "3e-4")])
def test_run_settings_out_of_range_are_refused(field, value):
    cfg = RunConfig(**{field: value})
    with pytest.raises(SettingError, match=field) as err:
        cfg.check()
    assert err.value.code == "PCC708"
    with pytest.raises(SettingError, match="prompts x group"):
        RunConfig(prompts=4096, group=256).check()
    RunConfig().check()


@pytest.mark.parametrize("value", ["0", "-1", "x", "1e3", "100000"])
def test_pcc_threads_out_of_range(monkeypatch, value):
    monkeypatch.setenv("PCC_THREADS", value)
    with pytest.raises(SettingError, match="PCC_THREADS"):
        set_threads()
    monkeypatch.setenv("PCC_THREADS", "1")
    set_threads()


def test_a_second_writer_is_refused_while_the_first_runs(compiled, tmp_path):
    from pcc.runtime.rundir import writer_lock

    out = tmp_path / "r"
    with writer_lock(out):  # the first `pcc run` (its lock, as another process would hold it)
        with pytest.raises(RunDirError, match=r"another pcc run \(pid \d+\) is writing it now"):
            _run(compiled, out)
    assert not out.exists()
    _run(compiled, out)  # the lock is gone with its holder


def test_a_summary_or_metrics_write_cut_short_leaves_no_half_file(compiled, tmp_path, monkeypatch, full_disk_at):
    """summary.txt and the metrics a resume rewrites go through pcc.lang.outputs: whole, or the old file
    (none for a new one), and no temporary beside it."""
    out = tmp_path / "r"
    full_disk_at("summary.txt")
    with pytest.raises(OSError, match="No space left"):
        _run(compiled, out)
    assert not (out / "summary.txt").exists() and not list(out.glob(".summary.txt*"))
    monkeypatch.undo()
    _run(compiled, out, force=True)
    before = _metrics(out)
    full_disk_at("metrics.jsonl")
    with pytest.raises(OSError, match="No space left"):
        _run(compiled, out, steps=3, resume=True)
    assert _metrics(out) == before and not list(out.glob(".metrics.jsonl*"))
