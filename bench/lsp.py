"""How fast `pcc lsp` answers after a keystroke: the compile the server runs on the editor's text
(pcc.lsp.analysis.check, the model catalog already built in the server), beside a `pcc check` of the
same file in a fresh process (what an editor without the server would run), measured in the same run.

    python bench/lsp.py [--rounds 3] [CONTRACT ...]   # default: the largest shipped contracts

The two run interleaved; each keeps its best round.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

from machine import interleaved, machine
from pcc.lsp.analysis import check

ROOT = Path(__file__).resolve().parents[1]
DEFAULT = ["contracts/k3_mxfp4_lora.prec", "contracts/glm52_fp8_rollout.prec", "contracts/unified_fp8.prec"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("contracts", nargs="*", default=DEFAULT)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    print(machine())
    print(f"{'contract':<34} {'operators':>9} {'server (warm)':>14} {'pcc check (process)':>20}")
    for rel in args.contracts:
        path = str(ROOT / rel)
        text = Path(path).read_text()
        ops = len(check(path, text).plan.catalog.operators)  # builds the catalog once, as the server does
        best = interleaved({
            "server": lambda: check(path, text),
            "process": lambda: subprocess.run([sys.executable, "-m", "pcc.cli", "check", path], capture_output=True),
        }, args.rounds)
        print(f"{Path(rel).name:<34} {ops:>9,} {best['server']:>13.2f}s {best['process']:>19.2f}s")
    print("after: " + machine())


if __name__ == "__main__":
    main()
