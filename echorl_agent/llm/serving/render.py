"""Response pieces of the OpenAI-compatible server: usage, logprob objects, incremental detokenization."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

__all__ = ["Detokenizer", "usage", "completion_logprobs", "chat_logprobs"]

log = logging.getLogger(__name__)


def usage(prompts: Sequence[Sequence[int]], results: Sequence[Any], n: int) -> dict[str, Any]:
    """OpenAI's ``usage``: prompt tokens once per prompt (its ``n`` samples share one prefill), completion tokens
    of every sample, and the prompt tokens served from the prefix cache."""
    n_prompt = sum(len(p) for p in prompts)
    n_gen = sum(len(r.token_ids) for r in results if r is not None)
    cached = sum(results[i * n].num_cached_tokens for i in range(len(prompts))
                 if i * n < len(results) and results[i * n] is not None)
    return {"prompt_tokens": n_prompt, "completion_tokens": n_gen, "total_tokens": n_prompt + n_gen,
            "prompt_tokens_details": {"cached_tokens": cached}}


def _tok_str(tok: Any, t: int) -> str:
    return tok.decode([t], skip_special_tokens=False)


def completion_logprobs(tok: Any, r: Any, prompt_ids: Sequence[int] | None, echo: tuple | None, k: int,
                        offset: int) -> dict[str, Any]:
    """The legacy completions ``logprobs`` object: ``tokens``, ``token_logprobs``, ``top_logprobs`` (dicts of the
    ``k`` most likely tokens; None when ``k == 0``) and ``text_offset``. With ``echo`` (the prompt's
    ``(ids, logprobs, tops)``), the prompt's tokens come first and the first one has logprob None."""
    ids: list[int] = []
    lps: list[float | None] = []
    tops: list[Any] = []
    if prompt_ids is not None and echo is not None:
        ids += list(echo[0])
        lps += list(echo[1])
        tops += list(echo[2])
    if r is not None:
        ids += list(r.token_ids)
        lps += list(r.logprobs or [None] * len(r.token_ids))
        tops += list(r.top_logprobs or [None] * len(r.token_ids))
    strs = [_tok_str(tok, t) for t in ids]
    offsets, pos = [], offset
    for s in strs:
        offsets.append(pos)
        pos += len(s)
    top_dicts = None
    if k:
        top_dicts = [None if t is None else {_tok_str(tok, i): v for i, v in t} for t in tops]
    return {"tokens": strs, "token_logprobs": lps, "top_logprobs": top_dicts, "text_offset": offsets}


def chat_logprobs(tok: Any, token_ids: Sequence[int], logprobs: Sequence[float | None] | None,
                  tops: Sequence[Any] | None) -> dict[str, Any]:
    """The chat ``logprobs`` object: ``{"content": [{token, logprob, bytes, top_logprobs}]}``."""

    def entry(t: int, lp: float | None) -> dict[str, Any]:
        s = _tok_str(tok, t)
        return {"token": s, "logprob": lp, "bytes": list(s.encode("utf-8"))}

    content = []
    for j, t in enumerate(token_ids):
        top = tops[j] if tops else None
        content.append({**entry(t, logprobs[j] if logprobs else None),
                        "top_logprobs": [entry(i, v) for i, v in top] if top else []})
    return {"content": content}


class Detokenizer:
    """Text deltas of a streamed generation whose concatenation equals the non-streamed text.

    A delta is emitted only while it is certain: an incomplete UTF-8 character (``\\ufffd``) waits for its next
    bytes, and with stop strings the last ``max(len(stop)) - 1`` characters wait, since the engine cuts the text
    before a stop string that may still be completing. :meth:`finish` emits the rest of the engine's final text.
    """

    def __init__(self, tokenizer: Any, stops: Sequence[str] = ()) -> None:
        self.tok = tokenizer
        self.ids: list[int] = []
        self.emitted = ""
        self.holdback = max((len(s) for s in stops), default=1) - 1

    def push(self, token_id: int) -> str:
        self.ids.append(token_id)
        text = self.tok.decode(self.ids, skip_special_tokens=True).rstrip("\ufffd")
        safe = text[: len(text) - self.holdback] if self.holdback else text
        if len(safe) <= len(self.emitted) or not safe.startswith(self.emitted):
            return ""
        delta, self.emitted = safe[len(self.emitted) :], safe
        return delta

    def finish(self, final_text: str) -> str:
        if not final_text.startswith(self.emitted):  # cannot happen for prefix-stable tokenizers; never duplicate
            log.warning("streamed text %r is not a prefix of the final text %r", self.emitted, final_text)
            return ""
        rest, self.emitted = final_text[len(self.emitted) :], final_text
        return rest
