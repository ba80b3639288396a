#!/usr/bin/env bash
# The main job of this bundle: pcc's embedded runtime runs it on this machine (no GPU).
# On a cluster: `pcc run "$here" --target nemo_rl` (see nemo_rl/launch.sh).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
exec pcc run "$here" "$@"
