"""The checkpoint-wide name of a ModelOpt MIXED_PRECISION rollout checkpoint (pcc.plan.mixed)."""

from __future__ import annotations

from pcc.plan.layouts import Layout, register


@register("mixed")
class Mixed(Layout):
    """No weight has this layout: each is in its member's (`Plan.layouts`). It names the checkpoint for what
    reads one name per checkpoint (the targets' method tables, the converter plan's `layout`); its config is
    per module (pcc.lower.checkpoint_config.mixed_config)."""

    members = True

    def accepts(self, spec):
        return False

    def targets(self, plan, i):
        return None

    def decode(self, t, shape, scheme):
        raise TypeError("a mixed checkpoint decodes each weight in its member's layout")

    def quantization_config(self, spec, skip, kv):
        raise TypeError("a mixed checkpoint's quantization_config is per module (checkpoint_config.mixed_config)")
