"""The task: reverse a string of digits, with a verifiable reward.

Prompt `BOS d1 .. dn SEP`, answer `dn .. d1 EOS`. Every prompt has the same length
and every answer n + 1 tokens, so batches need no padding. The reward is the
fraction of answer positions that are right (1.0 exactly when the whole answer
is); tokens after a premature EOS are not part of the answer the policy gave.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

BOS, SEP, EOS, DIGIT0 = 1, 2, 3, 4


@dataclass(frozen=True)
class ReverseTask:
    digits: int = 4

    @property
    def prompt_len(self) -> int:
        return self.digits + 2

    @property
    def answer_len(self) -> int:
        return self.digits + 1

    def prompts(self, n: int, gen: torch.Generator) -> torch.Tensor:
        d = torch.randint(0, 10, (n, self.digits), generator=gen) + DIGIT0
        return torch.cat([torch.full((n, 1), BOS), d, torch.full((n, 1), SEP)], 1)

    def answers(self, prompts: torch.Tensor) -> torch.Tensor:
        d = prompts[:, 1:1 + self.digits].flip(1)
        return torch.cat([d, torch.full((prompts.shape[0], 1), EOS)], 1)

    def reward(self, tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(partial reward in [0, 1], exact match) per sequence of tokens [N, P + G]."""
        ans = self.answers(tokens[:, :self.prompt_len])
        got = tokens[:, self.prompt_len:self.prompt_len + self.answer_len]
        right = (got == ans).float()
        return right.mean(1), right.all(1).float()

    def response_mask(self, tokens: torch.Tensor) -> torch.Tensor:
        """1 for generated tokens up to and including the first EOS."""
        gen = tokens[:, self.prompt_len:]
        eos = (gen == EOS).long()
        after = (eos.cumsum(1) - eos) > 0
        return (~after).float()

    def sequences(self, n: int, gen: torch.Generator) -> torch.Tensor:
        """Supervised examples for the warm start: prompt + correct answer."""
        p = self.prompts(n, gen)
        return torch.cat([p, self.answers(p)], 1)
