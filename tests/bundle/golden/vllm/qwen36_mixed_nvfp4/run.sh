#!/usr/bin/env bash
# The main job of this bundle: pcc's embedded runtime runs it on this machine (no GPU).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
exec pcc run "$here" "$@"
