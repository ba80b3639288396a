"""`pcc verify-checkpoint` (validation level 2): a rollout checkpoint is what the contract says.

Checks every shard's SHA-256 against the record the conversion wrote (pcc_convert.json), names,
dtypes and shapes of every expected tensor (scale grids included), that nothing else is there, that the tensors stored wide are exactly the plan's skip list, that config.json
carries the plan's quantization_config; then for a sample (one tensor per recipe, or all with
`--full`): scales are valid, and, given the source, codes equal pcc's quantizer byte for byte
and dequantized values lie within the scheme's error bound of the source. Every NVFP4
`input_scale` is read: not finite or not positive is a problem, 1.0 (uncalibrated) a finding;
given the source, one it carries must have been copied unchanged.
"""

from __future__ import annotations

from pathlib import Path

from pcc.convert.contract import config_of, load_plan
from pcc.convert.destination import CHECKPOINT_MARK
from pcc.convert.shards import ST_DTYPES, file_digest, hasher
from pcc.convert.source import open_source
from pcc.lang.inputs import InputError, read_json
from pcc.lower.converter import converter_plan

_WIDE = ("BF16", "F16", "F32")

def verify(contract: str, directory: str, source: str | None = None, full: bool = False) -> dict:
    root = Path(directory)
    config = config_of(root)
    if source is not None:
        src = open_source(source)
        plan = load_plan(contract, source=src)
    else:
        src = None
        plan = load_plan(contract, config={k: v for k, v in config.items() if k != "quantization_config"})
    doc = converter_plan(plan)
    out = open_source(root)
    problems: dict[str, dict] = {}

    def report(family: str, tensor: str, message: str, code: str | None = None) -> None:
        problems.setdefault(family, {"family": family, "tensor": tensor, "message": message, "count": 0,
                                     "code": code})
        problems[family]["count"] += 1

    if config.get("quantization_config") != doc["quantization_config"]:
        report("config", "config.json", f"quantization_config is {config.get('quantization_config')!r}, "
                                        f"the contract needs {doc['quantization_config']!r}")
    expected, families = {}, {}
    for e in doc["tensors"]:
        fam = e["recipe"].split("/")[0]
        for name, t in e["targets"].items():
            expected[name] = (ST_DTYPES[t["dtype"]], t["shape"])
            families[name] = fam
    for e in doc["copied"]:
        expected[e["source"]] = None
        families[e["source"]] = "other"
    for name, want in expected.items():
        got = out.entries.get(name)
        if got is None:
            report(families[name], name, "missing")
        elif want is not None and (got["dtype"], got["shape"]) != (want[0], list(want[1])):
            report(families[name], name, f"{got['dtype']} {got['shape']}, expected {want[0]} {list(want[1])}")
    for name in sorted(set(out.entries) - set(expected)):
        report("unexpected", name, "not in the converter plan")
    stored_wide = [e["source"] for e in doc["tensors"] if _stored_wide(e, out.entries)]
    if stored_wide != doc["skip"]:
        extra = sorted(set(stored_wide) - set(doc["skip"]))[:3]
        lacking = sorted(set(doc["skip"]) - set(stored_wide))[:3]
        report("skip", "skip list", f"wide tensors differ from the contract's exceptions: extra {extra}, missing {lacking}")
    checked, findings, uncalibrated = 0, [], 0
    shards_checked = _shard_hashes(root, out, report, findings)
    if set(problems) <= {"config", "shards"}:  # names and shapes right: the values can be read
        checked = _values(plan, doc, out, src, full, report)
        uncalibrated, more = _input_scales(doc, out, report)
        findings += more
    return {"ok": not problems, "directory": str(root), "layout": doc["layout"], "tensors": len(expected),
            "values_checked": checked, "shards_checked": shards_checked, "problems": sorted(problems.values(), key=lambda p: p["family"]),
            "findings": findings, "uncalibrated_input_scales": uncalibrated}


def _shard_hashes(root: Path, out, report, findings: list) -> int:
    """Each shard's digest against what the conversion recorded in pcc_convert.json (PCC712; BLAKE3, or
    SHA-256 in a record that names it, `shard_hash`): a
    shard changed, replaced or truncated after conversion fails even without --full. Returns the number
    of shards checked; a checkpoint pcc did not write (no record) is a finding."""
    record = root / CHECKPOINT_MARK
    if not record.exists():
        findings.append({"family": "shards", "tensor": CHECKPOINT_MARK, "count": 1,
                         "message": f"no {CHECKPOINT_MARK}: not written by pcc convert, shard hashes not checked"})
        return 0
    try:
        doc = read_json(record, what="conversion record")
        shards, algorithm = doc["shards"], doc.get("shard_hash", "sha256")
        if not (isinstance(shards, dict) and all(isinstance(k, str) and isinstance(v, str) for k, v in shards.items())):
            raise TypeError("'shards' must map each shard file to its digest")
        if not isinstance(algorithm, str):
            raise TypeError("'shard_hash' must name the digest")
        hasher(algorithm)
    except (InputError, ValueError, KeyError, TypeError) as err:
        report("shards", CHECKPOINT_MARK, f"unreadable record of the shards ({err})", "PCC712")
        return 0
    present = set(out.where.values())
    for file in sorted(present - set(shards)):
        report("shards", file, f"a shard {CHECKPOINT_MARK} does not list", "PCC712")
    for file, digest in sorted(shards.items()):
        path = root / file
        if file not in present or not path.is_file():
            report("shards", file, f"listed in {CHECKPOINT_MARK} but not in the checkpoint", "PCC712")
        elif file_digest(path, algorithm) != digest:
            report("shards", file, f"{algorithm} digest differs from the one recorded at conversion ({CHECKPOINT_MARK}): "
                                   "the shard changed afterwards", "PCC712")
    return len(shards)


def _input_scales(doc: dict, out, report) -> tuple[int, list[dict]]:
    """Every NVFP4 `input_scale` (scalars: all of them, always): finite and positive, else a problem;
    exactly 1.0 is the uncalibrated value (ModelOpt's amax / 2688 is 1.0 only at amax 2688), a finding:
    the checkpoint loads, but SGLang would quantize activations with an encode factor nobody measured."""
    import math

    names = [n for e in doc["tensors"] for n in e["targets"] if n.endswith(".input_scale")]
    ones = []
    for name in names:
        v = float(out.load(name).float().reshape(-1)[0])
        if not (math.isfinite(v) and v > 0):
            report("input_scale", name, f"{v}: an input_scale must be finite and positive")
        elif v == 1.0:
            ones.append(name)
    if not ones:
        return 0, []
    return len(ones), [{"family": "input_scale", "tensor": ones[0], "count": len(ones),
                        "message": f"1.0: uncalibrated ({len(ones)} of {len(names)} static input_scale tensors); "
                                   "SGLang quantizes activations with this static scale: convert with --calibrate "
                                   "or from a ModelOpt-calibrated source (docs/convert.md, 'Input scales')"}]


def _sample(doc: dict, full: bool) -> list[int]:
    seen, picks = set(), []
    for k, e in enumerate(doc["tensors"]):
        if full or e["recipe"] not in seen:
            seen.add(e["recipe"])
            picks.append(k)
    return picks


def _values(plan, doc: dict, out, src, full: bool, report) -> int:
    import torch

    from pcc.convert.calibration import shared
    from pcc.convert.quantized import Encoded, copied, rollout_of
    from pcc.plan.encode import group_amax
    from pcc.plan.encode import static_targets

    index = {op.tensor: i for i, op in enumerate(plan.catalog.operators)}
    carried = {}  # the source's input scales as convert writes them: each fused group's at its largest
    if src is not None:
        targets = static_targets(plan)
        carried = shared(plan, targets, {n: src.load(n).float().reshape(-1)[0] for n in targets.values()
                                         if n in src.where})
    checked = 0
    for k in _sample(doc, full):
        e = doc["tensors"][k]
        i, fam = index[e["source"]], e["recipe"].split("/")[0]
        layout = plan.layouts[i]
        written = {n: _rows(out.load(n), e.get("fuse")) for n in e["targets"]}
        problem = _scales_invalid(layout, written)
        if problem:
            report(fam, e["source"], problem)
            continue
        if src is not None:
            loaded = src.read(e["source"])  # a quantized source's weight: compared with its dequantized value
            x = loaded.dequantize() if isinstance(loaded, Encoded) else loaded
            copy = isinstance(loaded, Encoded) and copied(src, plan, i)
            mine = rollout_of(plan, i, loaded, amax=None if copy else group_amax(plan, i, src.weight), copy=copy)
            for name, t in mine.items():
                if name.endswith(".input_scale"):
                    have = carried.get(name, written[name])
                    if float(written[name]) != float(have):  # a source's scale is carried over unchanged
                        report(fam, name, f"{float(written[name])}, the source's input_scale is {float(have)}")
                        break
                    continue  # calibrated or uncalibrated: _input_scales
                a, b = _bytes(t), _bytes(written[name])
                if not torch.equal(a, b):
                    where = int((a != b).nonzero()[0]) if a.numel() == b.numel() else "size"
                    report(fam, name, f"bytes differ from pcc's quantizer (first at byte {where})")
                    break
            else:
                bad = _out_of_bound(plan, i, layout, written, x)
                if bad:
                    report(fam, e["source"], bad)
        checked += 1
    return checked


def _stored_wide(e: dict, entries: dict) -> bool:
    """The operator of converter-plan entry `e` is stored wide: under its own name, or, fused into its targets
    (gpt-oss BF16 experts, `experts.gate_up_proj` / `down_proj`), every target it is placed in."""
    names = list(e["targets"]) if "fuse" in e else [e["source"]]
    return all(n in entries and entries[n]["dtype"] in _WIDE for n in names)


def _rows(t, fuse):
    """A fused tensor -> this operator's piece, as the Plan's `fuse` lays it out (pcc.plan.encode.take_fused)."""
    if fuse is None:
        return t
    from pcc.plan.encode import take_fused

    return take_fused(t, fuse)


def _bytes(t):
    import torch

    return t.contiguous().reshape(-1).view(torch.uint8)


def _scales_invalid(layout, written: dict) -> str | None:
    import torch

    for name, t in written.items():
        if name.endswith(("_scale_inv", ".weight_scale", "_scale_2", ".input_scale")) and t.dtype == torch.float32:
            if not bool((torch.isfinite(t) & (t > 0)).all()):
                return f"{name}: scales must be finite and positive"
        if layout.e8m0_scales and t.dtype == torch.uint8 and name.endswith(("_scale_inv", "_scales")):
            if bool((t == 255).any()):
                return f"{name}: E8M0 byte 255 is NaN"
        if t.dtype == torch.float8_e4m3fn and bool(torch.isnan(t.float()).any()):
            return f"{name}: NaN codes"
    return None


def _out_of_bound(plan, i: int, layout, written: dict, x) -> str | None:
    """|dequantized - source| within the element format's rounding (plus saturation at the top): the
    layout's `slack`."""
    if not layout.quantized:
        return None
    op = plan.catalog.operators[i]
    q = layout.decode(list(written.values()), tuple(op.shape), plan.scheme("rollout", i))
    xf = x.float()
    err = (q.dequantize() - xf).abs()
    return _first_over(err, layout.slack(xf, _per_element(q)), x, op.tensor)


def _per_element(q):
    geo = q.geometry
    b, nbr, nbc = geo.grid
    s = geo.per_row(q.block_scales())  # [rows, nbc, 1]
    return s.expand(-1, -1, geo.block_cols).reshape(s.shape[0], nbc * geo.block_cols)[:, : geo.cols].reshape(q.shape)


def _first_over(err, slack, x, name: str) -> str | None:
    over = err > slack
    if bool(over.any()):
        idx = over.nonzero()[0].tolist()
        return (f"{name}: dequantized value off by {float(err[tuple(idx)]):.3g} at {idx} "
                f"(bound {float(slack[tuple(idx)]):.3g}, source {float(x[tuple(idx)]):.4g})")
    return None
