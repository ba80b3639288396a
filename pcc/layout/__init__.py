"""The rollout checkpoint's tensor layout, shared by convert and runtime.

`pcc.layout.tensors` turns one operator's source weight into the named tensors of the
rollout checkpoint (codes, scales, global and input scales, fused-expert placement). It sits
below both users: `pcc convert` writes checkpoints with it and the embedded runtime's sync
builds the same bytes live, so neither imports the other for it. docs/architecture.md.
"""
