"""Rollout checkpoints from a contract: `pcc convert`, `pcc verify-checkpoint`, adapter export.

Streams a Hugging Face safetensors checkpoint one tensor at a time through the converter
plan (`pcc.lower.converter`) and the quantizers of `pcc.numerics`. docs/convert.md.
"""

from pcc.lang.diagnostics import PccError

class ConvertError(PccError):
    """A conversion or verification cannot proceed; the message names the file and tensor."""

    code = "PCC702"
