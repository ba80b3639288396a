"""`pcc convert` and `pcc verify-checkpoint`. Torch is imported only inside the handlers.

Handlers are `fn(args, rep) -> exit code` (pcc/cli.py, docs/cli.md)."""

from __future__ import annotations

import argparse
import re
import sys

_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([KMGT]?I?B?)?\s*$", re.IGNORECASE)
_UNITS = {"": 1, "B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12,
          "KIB": 2**10, "MIB": 2**20, "GIB": 2**30, "TIB": 2**40}


def _size(text: str) -> int:
    m = _SIZE.match(text)
    unit = (m.group(2) or "").upper() if m else None
    if not m or unit not in _UNITS:
        raise ValueError(f"not a size: {text!r} (e.g. 5GB, 512MiB)")
    return int(float(m.group(1)) * _UNITS[unit])


def cmd_convert(args, rep) -> int:
    from pathlib import Path

    from pcc.convert import ConvertError

    rep.contract_file(args.contract)  # exit 2 when it names no contract or bundle
    src = args.adapter or args.source
    if src is None:
        raise rep.usage("--source SRC is required (or --adapter SRC)")
    if not Path(src).exists():
        raise rep.usage(f"{src}: no such checkpoint")
    try:
        if args.adapter:
            from pcc.convert.adapter import export_adapter

            summary = export_adapter(args.contract, args.adapter, args.out, force=args.force)
        else:
            from pcc.convert.run import DEFAULT_SHARD_BYTES, convert

            shard = _size(args.max_shard_size) if args.max_shard_size else DEFAULT_SHARD_BYTES
            summary = convert(args.contract, args.source, args.out, resume=args.resume, force=args.force,
                              max_shard_bytes=shard, progress=not rep.json, calibrate=args.calibrate,
                              calibration_tokens=args.calibration_tokens)
    except (ConvertError, ValueError, OSError) as err:
        return rep.fail(str(err), code=getattr(err, "code", None) or None)
    _warn_input_scales(summary)
    rep.result = summary
    if "layout" in summary:
        rep.say(f"{summary['destination']}: {summary['layout']} rollout checkpoint, {summary['tensors']} tensors in "
                f"{summary['shards']} shard(s) ({summary['resumed_shards']} resumed), "
                f"{summary['input_bytes'] / 1e9:.3f} GB read in {summary['seconds']} s"
                + {"bundle": " (the bundle's converter plan, compiled for this checkpoint)",
                   "cached": " (the converter plan this contract compiled before for a checkpoint like this one)"}.get(
                    summary["plan"], ""))
    else:
        rep.say(f"{summary['destination']}: PEFT adapter, {summary['modules']} modules, rank {summary['rank']}")
    return 0


def _warn_input_scales(summary: dict) -> None:
    """Loud on stderr (also with --json): SGLang quantizes NVFP4 activations with these static scales."""
    n = summary.get("uncalibrated_input_scales")
    if n:
        print(f"pcc convert: WARNING: {n} of {summary['input_scales']} static input_scale tensor(s) written as 1.0, "
              f"NOT calibrated ({summary['uncalibrated_reason']}). SGLang quantizes activations with this static "
              "scale: calibrate (--calibrate, or a ModelOpt-calibrated source whose input_scale tensors are "
              "carried over) before serving. docs/convert.md, 'Input scales'.", file=sys.stderr)
    elif summary.get("calibrated_input_scales"):
        print(f"pcc convert: calibrated {summary['calibrated_input_scales']} static input_scale tensor(s) on "
              f"{summary['calibration_batch']} in {summary['calibration_seconds']} s", file=sys.stderr)


def cmd_verify(args, rep) -> int:
    from pathlib import Path

    from pcc.convert import ConvertError
    from pcc.convert.verify import verify

    rep.contract_file(args.contract)
    for what in (args.directory, args.source):
        if what is not None and not Path(what).exists():
            raise rep.usage(f"{what}: no such checkpoint")
    try:
        report = verify(args.contract, args.directory, source=args.source, full=args.full)
    except (ConvertError, ValueError, OSError) as err:
        return rep.fail(str(err), code=getattr(err, "code", None) or None)
    rep.result = report
    for p in report["problems"]:
        more = f" (+{p['count'] - 1} more in this family)" if p["count"] > 1 else ""
        rep.error(f"{p['family']}: {p['tensor']}: {p['message']}{more}", file=args.directory, code=p["code"])
    for f in report["findings"]:
        rep.warning(f"{f['family']}: {f['tensor']}: {f['message']}", file=args.directory)
    status = "ok" if report["ok"] else "FAILED"
    rep.say(f"{args.directory}: {status}: {report['layout']} layout, {report['tensors']} tensors, "
            f"values checked for {report['values_checked']}")
    return 0 if report["ok"] else 1


def _source(s) -> None:
    """`--source SRC`, the one spelling for a source checkpoint; `--from` is a hidden alias."""
    s.add_argument("--source", metavar="SRC", help="the source checkpoint (Hugging Face safetensors directory)")
    s.add_argument("--from", dest="source", help=argparse.SUPPRESS)


def register(subparsers) -> None:
    from pcc.convert.calibration import CPU_CALIBRATION_MAX_PARAMS as limit

    s = subparsers.add_parser("convert", help="build the rollout checkpoint a contract's rollout loads")
    s.add_argument("contract", metavar="CONTRACT|BUNDLE")
    _source(s)
    s.add_argument("-o", "--out", metavar="DST", help="the rollout checkpoint (or adapter) directory to write "
                   "(required)")
    s.add_argument("--to", dest="out", help=argparse.SUPPRESS)
    s.set_defaults(required_out=True)
    s.add_argument("--resume", action="store_true", help="continue an interrupted conversion")
    s.add_argument("--force", action="store_true", help="replace an existing destination, if it is pcc's own "
                   "output (a rollout checkpoint, or an exported adapter); anything else is refused")
    s.add_argument("--max-shard-size", metavar="SIZE", help="largest output shard (default 5GB)")
    s.add_argument("--adapter", metavar="SRC", help="export a trainer-side LoRA adapter to PEFT layout instead")
    s.add_argument("--calibrate", action=argparse.BooleanOptionalAction, default=None,
                   help="calibrate NVFP4 input_scale tensors the source lacks with pcc.runtime's model (default: "
                        f"when the architecture is supported and at most {limit / 1e9:g}B parameters; --calibrate "
                        "refuses unsupported architectures, --no-calibrate writes 1.0 and warns)")
    s.add_argument("--calibration-tokens", metavar="FILE",
                   help="safetensors file with one integer tensor [rows, seq] of token ids to calibrate on "
                        "(default: pcc.runtime's fixed batch)")
    s.add_argument("--json", action="store_true", help="print one JSON envelope on stdout (docs/cli.md)")
    s.set_defaults(fn=cmd_convert)

    s = subparsers.add_parser("verify-checkpoint", help="check a rollout checkpoint against a contract")
    s.add_argument("contract", metavar="CONTRACT|BUNDLE")
    s.add_argument("directory", metavar="DIR")
    _source(s)
    s.add_argument("--full", action="store_true", help="check the values of every tensor, not a sample "
                   "(--source: compare codes and values with the source)")
    s.add_argument("--json", action="store_true", help="print one JSON envelope on stdout (docs/cli.md)")
    s.set_defaults(fn=cmd_verify)
