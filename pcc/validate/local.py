"""The embedded runtime behind the engine protocol: its rollout engine, and its trainer as the scorer.

A version reaches the rollout engine the way the runtime's sync moves it: serialized
into safetensors buckets (`pcc.runtime.sync.transfer`), received, verified against
its manifest and activated whole (`RolloutEngine.activate`).
"""

from __future__ import annotations

import torch

from pcc.runtime.model import KVCache, forward
from pcc.runtime.rollout import RolloutEngine, Weights
from pcc.runtime.sync import SyncError, receive, transfer

from .engine import ActivationRefused, EngineError, Generated, Scores, Version


class LocalEngine:
    name = "local"

    def __init__(self, plan, arch, lora_scaling: float = 0.0, bucket_bytes: int = 1 << 20):
        self.rollout = RolloutEngine(arch, plan, lora_scaling)
        self.arch, self.bucket_bytes = arch, bucket_bytes
        self.installed: dict[int, tuple[dict, dict[str, torch.Tensor]]] = {}
        self.bytes_moved = 0

    # -- versions --------------------------------------------------------------------------
    def install(self, version: Version) -> None:
        buckets = transfer(version.tensors, self.bucket_bytes)
        self.bytes_moved += sum(len(b) for b in buckets)
        self.installed[version.version] = (version.manifest, receive(buckets))

    def activate(self, version: int) -> None:
        if version not in self.installed:
            raise EngineError(f"version {version} was never installed")
        man, received = self.installed[version]
        try:
            self.rollout.activate(man, received)
        except SyncError as exc:
            raise ActivationRefused(str(exc)) from None
        self._loaded(self.rollout.active)

    def _loaded(self, w: Weights) -> None:
        """Called after each activation with what the kernels now read (fault injection overrides it)."""

    def active(self) -> tuple[int, dict]:
        w = self.rollout.active
        return w.version, w.manifest

    def read_tensor(self, name: str) -> torch.Tensor:
        w = self.rollout.active
        if name in w.quantized:
            return w.quantized[name].dequantize(torch.float32)
        if name in w.values:
            return w.values[name]
        for mod, (a, b) in w.adapters.items():
            base = mod.removesuffix(".weight")
            if name == f"{base}.lora_A.weight":
                return a
            if name == f"{base}.lora_B.weight":
                return b
        if name in w.tensors:
            return w.tensors[name].float()
        raise EngineError(f"no installed tensor named '{name}' in version {w.version}")

    # -- execution -------------------------------------------------------------------------
    @torch.no_grad()
    def kernel(self, name: str, x: torch.Tensor) -> torch.Tensor:
        """One operator through the engine's own GEMM path on its installed weights (level 3)."""
        return self.rollout._exec(self.rollout.active).linear(name, x)

    def _serving(self, w: Weights, w_now: Weights) -> Weights:
        """The weights token t+1 runs on: the batch's own version (fault injection overrides it)."""
        return w

    @torch.no_grad()
    def score(self, tokens: torch.Tensor, prompt_len: int, routes: bool = False,
              cached_prefix: bool = False) -> Scores:
        w = self.rollout.active
        ex = self.rollout._exec(w)
        cache = KVCache(self.arch.layers)
        if cached_prefix:  # prompt prefill, then one token at a time through the KV cache
            logits, r = forward(self.arch, ex, tokens[:, :prompt_len], cache)
            parts, rparts = [logits], [[x] for x in r.used]
            for t in range(prompt_len, tokens.shape[1] - 1):
                lg, r = forward(self.arch, ex, tokens[:, t:t + 1], cache)
                parts.append(lg)
                for acc, x in zip(rparts, r.used):
                    acc.append(x)
            logits, used = torch.cat(parts, 1), [torch.cat(p, 1) for p in rparts]
        else:
            logits, r = forward(self.arch, ex, tokens[:, :-1], cache)
            used = r.used
        lsm = torch.log_softmax(logits[:, prompt_len - 1:], -1)
        logp = lsm.gather(-1, tokens[:, prompt_len:, None]).squeeze(-1).double()
        return Scores(logp, used if routes and self.arch.is_moe else None, w.version)

    @torch.no_grad()
    def generate(self, prompts: torch.Tensor, new_tokens: int, seed: int, between=None) -> Generated:
        gen = torch.Generator().manual_seed(seed)
        if between is None:
            b = self.rollout.generate(prompts, new_tokens, 1.0, gen)
            return Generated(b.tokens, b.logp.double(), b.version)
        # The runtime's generate has no hook between tokens; this loop is the same decode with one,
        # so an activation can arrive inside the batch.
        w0 = self.rollout.active
        cache = KVCache(self.arch.layers)
        logits, _ = forward(self.arch, self.rollout._exec(w0), prompts, cache)
        last, toks, lps = logits[:, -1], [], []
        for t in range(new_tokens):
            lsm = torch.log_softmax(last, -1)
            nxt = torch.multinomial(lsm.exp(), 1, generator=gen)
            toks.append(nxt)
            lps.append(lsm.gather(-1, nxt))
            between(t)
            if t + 1 < new_tokens:
                w = self._serving(w0, self.rollout.active)
                logits, _ = forward(self.arch, self.rollout._exec(w), nxt, cache)
                last = logits[:, -1]
        versions = torch.full((prompts.shape[0], new_tokens), w0.version, dtype=torch.long)
        return Generated(torch.cat([prompts, *toks], 1), torch.cat(lps, 1).double(), versions)


class LocalTrainer:
    """The trainer side of fixed-prefix scoring: the runtime's Trainer at the plan's FProp."""

    name = "runtime trainer"

    def __init__(self, trainer):
        self.trainer = trainer

    @torch.no_grad()
    def score(self, tokens: torch.Tensor, prompt_len: int, replay: list[torch.Tensor] | None = None):
        """(log-probs [N, G] float64, the trainer router's own expert ids per MoE layer)."""
        logp, _, routes = self.trainer.logprobs(tokens, prompt_len, 1.0, replay)
        return logp.double(), routes.own
