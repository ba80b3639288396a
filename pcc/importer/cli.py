"""`pcc import KIND SOURCE [--model M] [--hardware H] [-o CONTRACT.prec] [--json]`: exit 0 with
the contract written (warnings PCC802-PCC810 reported), 1 when the source cannot be imported (a
coded error), 2 when SOURCE names nothing readable (docs/cli.md). The handler is `fn(args, rep)`."""

from __future__ import annotations

import os
import sys

from pcc.lang.outputs import write_atomic


def cmd_import(args, rep) -> int:
    from pcc.importer import ImportFailed, import_source
    from pcc.models import CatalogError

    if not os.path.exists(args.source):
        return rep.fail(f"{args.source}: no such file or directory", 2, file=args.source)
    try:
        imported = import_source(args.kind, args.source, args.model, args.hardware)
    except ImportFailed as exc:
        rep.diagnostic(exc.to_diagnostic())
        return 2 if exc.code == "PCC109" else 1  # not a regular file (a FIFO, /dev/zero): names nothing readable
    except CatalogError as exc:
        return rep.fail(str(exc), code=exc.code)
    rep.extend(imported.diagnostics)
    text = imported.text()
    rep.result = {"kind": args.kind, "source": args.source, "out": args.out, "contract": text,
                  "warnings": len(imported.diagnostics)}
    if not args.out:
        if not rep.json:
            sys.stdout.write(text)
        return 0
    try:
        write_atomic(args.out, text)
    except OSError as exc:
        return rep.fail(f"{args.out}: cannot write: {exc.strerror}", file=args.out)
    rep.say(f"{args.out}: contract {imported.contract['name']}, {len(imported.diagnostics)} warning(s)")
    return 0


def register(subparsers) -> None:
    from pcc.importer import KINDS

    s = subparsers.add_parser("import", help="a contract from a checkpoint's quantization config, a Miles launch, a "
                              "verl job, a NeMo RL recipe or a Transformer Engine precision file (docs/import.md)")
    s.add_argument("kind", metavar="KIND", choices=KINDS, help=f"what SOURCE is: {', '.join(KINDS)}")
    s.add_argument("source", metavar="SOURCE", help="checkpoint: a checkpoint directory, config.json, "
                   "hf_quant_config.json or quantization_config JSON; miles: a launch script, an argument file or "
                   "a pcc bundle directory; verl: a Hydra YAML config, a launch script, an argument file of Hydra "
                   "overrides or the folder pcc writes a verl job to; nemo_rl: a NeMo RL recipe YAML "
                   "(defaults: resolved) or a pcc bundle directory; te: a TE per-module precision YAML")
    s.add_argument("--model", help="resolve against this checkpoint directory or catalog name (default: the "
                   "checkpoint directory SOURCE names: --hf-checkpoint, actor_rollout_ref.model.path)")
    s.add_argument("--hardware", help="the hardware the contract states (targets/hardware.yaml); the source "
                   "rarely says it")
    s.add_argument("-o", "--out", metavar="CONTRACT.prec", help="write the contract to this file (default: stdout)")
    s.add_argument("--json", action="store_true", help="print one JSON envelope on stdout (docs/cli.md)")
    s.set_defaults(fn=cmd_import)
