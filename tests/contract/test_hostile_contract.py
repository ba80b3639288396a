"""Contracts written to hurt: YAML aliases and duplicate keys, coerced and non-finite numbers,
`extends` out of its folders, and a parent's `model from` (pcc.contract.io, docs/safety.md)."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from pcc.contract.io import ROOTS_ENV, load
from pcc.lang.diagnostics import DiagnosticError
from pcc.plan import compile_file

ROOT = Path(__file__).resolve().parents[2]
BASE = "name: c\nmodel: {catalog: tiny_moe}\nhardware: cpu\n"


def _codes(path: Path) -> list[tuple[str, int | None]]:
    with pytest.raises(DiagnosticError) as err:
        load(str(path))
    return [(d.code, d.span.line if d.span else None) for d in err.value.diagnostics]


def test_an_alias_bomb_is_refused_at_once(tmp_path):
    lines = ["name: bomb", "a: &a [x, x, x, x, x, x, x, x, x, x]"]
    for prev, n in zip("abcdefgh", "bcdefghi"):
        lines.append(f"{n}: &{n} [" + ", ".join([f"*{prev}"] * 10) + "]")  # 10^9 nodes expanded
    f = tmp_path / "bomb.yaml"
    f.write_text("\n".join(lines) + "\n")
    assert len(f.read_bytes()) < 700
    t0 = time.monotonic()
    assert _codes(f)[0][0] == "PCC111"
    assert time.monotonic() - t0 < 2


def test_a_self_referring_alias_and_a_few_honest_aliases(tmp_path):
    f = tmp_path / "loop.yaml"
    f.write_text(BASE + "rollout: &r {rules: [*r]}\n")
    assert _codes(f)[0][0] == "PCC111"
    ok = tmp_path / "ok.yaml"  # aliases within the budget still work
    ok.write_text(BASE + "rollout: {parallel: &p {tp: 1}}\ntrainer: {parallel: *p}\n")
    assert load(str(ok)).contract.trainer.parallel.tp == 1


def test_duplicate_keys_are_refused_in_yaml_and_json(tmp_path):
    y = tmp_path / "d.yaml"
    y.write_text(BASE + "rollout:\n  hardware: cpu\n  hardware: h100\n")
    assert _codes(y) == [("PCC110", 6)]
    j = tmp_path / "d.json"
    j.write_text('{"name": "c",\n "model": {"catalog": "tiny_moe"},\n "hardware": "cpu",\n "hardware": "h100"}\n')
    assert _codes(j) == [("PCC110", 4)]


@pytest.mark.parametrize("value, why", [("true", "valid integer"), ('"2"', "valid integer"), ("2.0", "valid integer"),
                                        ("yes", "valid integer")])
def test_numbers_are_not_coerced(tmp_path, value, why):
    f = tmp_path / "t.yaml"
    f.write_text(BASE + f"rollout: {{parallel: {{tp: {value}}}}}\n")
    with pytest.raises(DiagnosticError) as err:
        load(str(f))
    d = err.value.diagnostics[0]
    assert d.code == "PCC105" and why in d.message and d.span.line == 4


@pytest.mark.parametrize("text", ['{"x": NaN}', '{"x": Infinity}'])
def test_json_nan_and_infinity_are_refused(tmp_path, text):
    f = tmp_path / "n.json"
    f.write_text(text)
    assert _codes(f)[0][0] == "PCC105"


@pytest.mark.parametrize("value", [".nan", ".inf", "-.inf"])
def test_yaml_nan_and_infinite_bounds_are_refused(tmp_path, value):
    f = tmp_path / "n.yaml"
    f.write_text(BASE + f"expect:\n- {{metric: same_version, stat: abs_dlogp p99, op: '<=', value: {value}}}\n")
    with pytest.raises(DiagnosticError) as err:
        load(str(f))
    d = err.value.diagnostics[0]
    assert d.code == "PCC105" and "not a finite number" in d.message and d.span.line == 5


def test_a_prec_literal_beyond_float_is_refused(tmp_path):
    f = tmp_path / "big.prec"
    f.write_text("contract c {\n  model tiny_moe\n  hardware cpu\n  expect {\n    same_version abs_dlogp p99 <= 1e999\n"
                 "  }\n}\n")
    assert _codes(f)[0][0] == "PCC105"


def _child(folder: Path, ref: str) -> Path:
    f = folder / "child.prec"
    f.write_text(f'contract child extends "{ref}" {{\n  hardware cpu\n}}\n')
    return f


@pytest.mark.parametrize("ref", ["/etc/passwd", "../../../../../../../../etc/passwd", "../outside/base.prec"])
def test_extends_cannot_leave_its_folders(tmp_path, monkeypatch, ref):
    (tmp_path / "outside").mkdir()
    (tmp_path / "outside" / "base.prec").write_text("contract base {\n  model tiny_moe\n}\n")
    inner = tmp_path / "proj" / "c"
    inner.mkdir(parents=True)
    monkeypatch.chdir(inner)
    monkeypatch.delenv(ROOTS_ENV, raising=False)
    with pytest.raises(DiagnosticError) as err:
        load(str(_child(inner, ref)))
    assert [d.code for d in err.value.diagnostics] == ["PCC112"]
    assert "passwd" not in "".join(err.value.sources)  # nothing outside was read


def test_a_link_inside_the_folder_does_not_lead_out(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    inner = tmp_path / "c"
    inner.mkdir()
    (inner / "base.prec").symlink_to("/etc/hostname")
    with pytest.raises(DiagnosticError) as err:
        load(str(_child(inner, "base.prec")))
    assert [d.code for d in err.value.diagnostics] == ["PCC112"]


def test_an_allowed_root_opens_a_shared_folder(tmp_path, monkeypatch):
    shared, proj = tmp_path / "shared", tmp_path / "proj"
    shared.mkdir()
    proj.mkdir()
    (shared / "base.prec").write_text("contract base {\n  model tiny_moe\n}\n")
    monkeypatch.chdir(proj)
    monkeypatch.delenv(ROOTS_ENV, raising=False)
    child = _child(proj, "../shared/base.prec")
    with pytest.raises(DiagnosticError):
        load(str(child))
    monkeypatch.setenv(ROOTS_ENV, str(shared))
    assert load(str(child)).contract.model.catalog == "tiny_moe"
    # the working directory is a root: tests/diff/pairs extend ../../../contracts/ from the checkout
    # (an installed wheel's own contracts/ folder is another place, so the checkout must be the cwd)
    monkeypatch.delenv(ROOTS_ENV)
    monkeypatch.chdir(ROOT)
    assert load(str(ROOT / "tests" / "diff" / "pairs" / "k3_nvfp4_lora.prec")).contract.name == "k3-nvfp4-lora"


def _config_dir(path: Path, layers: int) -> None:
    config = json.loads((ROOT / "pcc" / "models" / "configs" / "tiny_dense.json").read_text())
    config["num_hidden_layers"] = layers
    path.mkdir(parents=True)
    (path / "config.json").write_text(json.dumps(config))


def test_a_parents_model_from_is_relative_to_the_parent(tmp_path, monkeypatch):
    """A parent in base/ says `model from "ckpt"`: that is base/ckpt, not the child's ckpt beside it."""
    monkeypatch.chdir(tmp_path)
    _config_dir(tmp_path / "base" / "ckpt", 3)
    _config_dir(tmp_path / "exp" / "ckpt", 5)  # a different model under the same name
    (tmp_path / "base" / "base.prec").write_text('contract base {\n  model from "ckpt"\n  hardware cpu\n}\n')
    child = tmp_path / "exp" / "child.prec"
    child.write_text('contract child extends "../base/base.prec" {\n  hardware cpu\n}\n')
    c = compile_file(str(child))
    assert c.ok, [d.render() for d in c.diagnostics]
    assert c.plan.catalog.num_layers == 3
    assert load(str(child)).contract.model.path == "../base/ckpt"


def test_a_link_loop_or_a_nul_in_extends_is_a_positioned_error(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "l1.prec").symlink_to("l2.prec")
    (tmp_path / "l2.prec").symlink_to("l1.prec")
    assert _codes(_child(tmp_path, "l1.prec")) == [("PCC107", 1)]
    nul = tmp_path / "nul.yaml"
    nul.write_text(BASE + 'extends: "a\\0b.yaml"\n')
    assert _codes(nul) == [("PCC107", 4)]
