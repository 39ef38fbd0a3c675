"""The allowed-token bitmask of the constrained rows of a batch, and its application to logits.

Bit t of row r (int32 word t // 32, bit t % 32) says whether token t may follow. Only the
constrained rows get a mask; unconstrained rows are never touched.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from llguidance import LLExecutor, LLMatcher

_EXECUTOR: LLExecutor | None = None


def _executor() -> LLExecutor:
    global _EXECUTOR
    if _EXECUTOR is None:
        _EXECUTOR = LLExecutor()
    return _EXECUTOR


@dataclass
class GrammarBitmask:
    rows: list[int]  # the rows of the sampler's batch that are constrained
    bitmask: torch.Tensor  # int32 [len(rows), ceil(vocab / 32)]

    def apply(self, logits: torch.Tensor) -> None:
        """Forbidden tokens of the constrained rows to -inf, in place (logits [batch, vocab])."""
        forbidden = ~unpack(self.bitmask, logits.shape[-1])
        if self.rows == list(range(logits.shape[0])):
            logits.masked_fill_(forbidden, float("-inf"))
        else:
            idx = torch.tensor(self.rows)
            logits[idx] = logits[idx].masked_fill_(forbidden, float("-inf"))


def unpack(bitmask: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """int32 [n, words] -> bool [n, vocab_size] (little-endian words: token t is bit t % 8 of byte t // 8)."""
    bits = np.unpackbits(bitmask.numpy().view(np.uint8), axis=1, bitorder="little")[:, :vocab_size]
    return torch.from_numpy(bits).bool()


def fill_bitmask(matchers: list[LLMatcher], vocab_size: int) -> torch.Tensor:
    """The next-token masks of `matchers`, computed in llguidance's thread pool."""
    # imported here, at the first constrained request: llguidance.torch calls torch.compile when
    # imported, which loads torch._dynamo (about 3 s of every engine start otherwise)
    import llguidance.torch as llg_torch
    bitmask = llg_torch.allocate_token_bitmask(len(matchers), vocab_size)
    if len(matchers) == 1:
        llg_torch.fill_next_token_bitmask(matchers[0], bitmask)
    else:
        llg_torch.fill_next_token_bitmask_par(_executor(), [(m, i) for i, m in enumerate(matchers)], bitmask)
    return bitmask
