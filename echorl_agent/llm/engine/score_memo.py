"""Results of scoring requests the engine already answered under its current weights.

An RL rollout scores the same request again and again: a GiGPO group's K episodes start from one state and keep
meeting the same states, and with a short history an agent that turns left and then right is back at a prompt it
has scored. The prefix cache serves such a prompt's full KV blocks, but the partial last block and every candidate
token are prefilled again (on BabyAI-GoToLocal with the gotolocal-rl recipe: 83 of 177 states in one iteration, ~21
tokens each). The memo returns the earlier :class:`~echorl_agent.llm.engine.config.ScoreResult` instead -- the same
object, as :func:`~echorl_agent.llm.engine.scoring.score_batch` already does for duplicates within one call -- so a
repeated request prefills nothing and its log-probabilities are those of the first computation (exact: the
request, the weights and the captured layer are the same).

Everything is forgotten when the prefix cache's generation moves (new weights, a new int8 calibration, another
capture layer, a reset: :attr:`PrefixCache.generation`). Requests with soft tokens are never memoised (the plan's
soft tokens are computed per call).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from echorl_agent.llm.engine.config import ScoreResult

__all__ = ["ScoreMemo", "ScoreMemoStats"]

_Key = tuple[bool, tuple[int, ...], tuple[tuple[int, ...], ...]]


@dataclass
class ScoreMemoStats:
    """Counters of the memo (monotone)."""

    num_hits: int = 0
    """Requests answered from the memo (nothing prefilled)."""
    num_misses: int = 0
    """Requests the engine computed (and the memo then kept)."""
    num_hit_prompt_tokens: int = 0
    """Prompt tokens of the requests answered from the memo."""


class ScoreMemo:
    """An LRU map ``(capture, prompt, candidates) -> ScoreResult`` holding at most ``max_tokens`` prompt tokens.

    Args:
        max_tokens: the most prompt tokens (summed over the kept requests) the memo holds; 0 turns it off. A kept
            result with captured activations holds ``[prompt, hidden]`` floats (SmolLM2: 2.3 kB a token).
    """

    def __init__(self, max_tokens: int) -> None:
        if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 0:
            raise ValueError(f"score_memo_tokens must be an int >= 0, got score_memo_tokens={max_tokens!r}")
        self.max_tokens = max_tokens
        self.stats = ScoreMemoStats()
        self._entries: OrderedDict[_Key, ScoreResult] = OrderedDict()  # first = least recently used
        self._num_tokens = 0
        self._generation: int | None = None

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def num_tokens(self) -> int:
        """Prompt tokens of the kept requests."""
        return self._num_tokens

    def clear(self) -> None:
        self._entries.clear()
        self._num_tokens = 0

    def score_batch(
        self,
        compute: Callable[[list[list[int]], list[list[list[int]]], list], list[ScoreResult]],
        generation: int,
        prompts: Sequence[list[int]],
        candidates: Sequence[list[list[int]]],
        soft: Sequence | None,
        capture: bool,
    ) -> list[ScoreResult]:
        """The results of ``compute(prompts, candidates, soft)``, computing only the requests not kept already.

        Args:
            compute: scores a batch (:func:`~echorl_agent.llm.engine.scoring.score_batch` on the engine's runner).
            generation: the prefix cache's generation; a different one than last time empties the memo first.
            prompts, candidates, soft, capture: as :meth:`LLMEngine.score_batch` takes them.
        """
        softs = list(soft) if soft is not None else [None] * len(prompts)
        if not self.max_tokens:
            return compute(list(prompts), list(candidates), softs)
        if generation != self._generation:
            self.clear()
            self._generation = generation
        keys = [(capture, tuple(p), tuple(tuple(c) for c in cands)) if s is None else None
                for p, cands, s in zip(prompts, candidates, softs, strict=True)]
        out: list[ScoreResult | None] = [None] * len(prompts)
        todo = []
        for i, key in enumerate(keys):
            hit = self._entries.get(key) if key is not None else None
            if hit is None:
                todo.append(i)
                continue
            self._entries.move_to_end(key)
            out[i] = hit
            self.stats.num_hits += 1
            self.stats.num_hit_prompt_tokens += len(prompts[i])
        if todo:
            computed = compute([prompts[i] for i in todo], [candidates[i] for i in todo], [softs[i] for i in todo])
            for i, res in zip(todo, computed, strict=True):
                out[i] = res
                if keys[i] is not None and keys[i] not in self._entries:
                    self.stats.num_misses += 1
                    self._keep(keys[i], res)
        return out  # type: ignore[return-value]

    def _keep(self, key: _Key, res: ScoreResult) -> None:
        n = len(key[1])
        if n > self.max_tokens:
            return
        self._entries[key] = res
        self._num_tokens += n
        while self._num_tokens > self.max_tokens:
            old, _ = self._entries.popitem(last=False)
            self._num_tokens -= len(old[1])
