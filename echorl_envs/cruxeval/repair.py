"""CRUXEval code repair: a CRUXEval function with one injected bug; answer with the corrected function.

Built from CRUXEval rows (the real ``cruxeval.jsonl`` when given, else the offline generated set of
:mod:`echorl_envs.cruxeval`): for each item a deterministic AST mutation (:mod:`echorl_envs.cruxeval.mutations`)
is chosen so that ``f`` fails the item's own assertion ``assert f(<input>) == <output>``. Every item is checked
at build time in the sandbox -- the original passes, the mutant fails (an ``AssertionError`` or an exception,
not a timeout) -- and items with no such mutant are dropped. The build is cached on disk
(``$ECHORL_CACHE_DIR`` or the platform cache dir) keyed by the rows, the seed and the mutator version.
"""

from __future__ import annotations

import ast
import functools
import hashlib
import json
import os
import zlib
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from echorl_envs.core import DatasetTextEnv, InvalidAction, Transition, cache_root
from echorl_envs.cruxeval.env import file_items, generated_items, strip_fences
from echorl_envs.cruxeval.judge import JUDGE_CONFIG, Wording, check_max_attempts, resolve_data_path, verdict
from echorl_envs.cruxeval.mutations import mutants
from echorl_envs.sandbox import SandboxConfig, SandboxPool, shared_pool

__all__ = ["CRUXEvalRepairEnv", "build_repair_items", "parse_repair", "repair_program", "MUTATOR_VERSION"]

#: Bump when the mutations change: invalidates cached builds.
MUTATOR_VERSION = 1
#: Mutants tried per item (in an order seeded by the item id) before the item is dropped.
MAX_TRIES = 8
_BUILD = SandboxConfig(wall_seconds=3.0, cpu_seconds=2)
#: How a wrong repair is worded.
_WORDING = Wording("Still wrong: the assertion fails (AssertionError).", "Still wrong: running it timed out ({message}).",
                   "Still wrong: running it raised {message}.")
_TOP_LEVEL = (ast.FunctionDef, ast.Import, ast.ImportFrom)


def repair_program(answer_src: str, item: dict[str, str]) -> str:
    """The judged program: the answered function followed by the item's assertion."""
    return f"{answer_src}\nassert f({item['input']}) == {item['output']}"


def parse_repair(answer: str) -> str:
    """The answer's source if it is a whole function ``f`` (plus helper functions/imports), else ``InvalidAction``."""
    if not isinstance(answer, str):
        raise InvalidAction(f"the answer must be a string, got {type(answer).__name__}")
    src = strip_fences(answer)
    if src.startswith("python\n"):
        src = src[len("python\n"):]
    if not src.strip():
        raise InvalidAction("the answer is empty; write the whole corrected function 'def f(...): ...'")
    try:
        tree = ast.parse(src)
    except SyntaxError as e:
        raise InvalidAction(f"the answer is not valid Python ({e.msg}, line {e.lineno})") from None
    if not any(isinstance(s, ast.FunctionDef) and s.name == "f" for s in tree.body):
        raise InvalidAction("the answer must define the function f ('def f(...): ...')")
    bad = [type(s).__name__ for s in tree.body if not isinstance(s, _TOP_LEVEL)]
    if bad:
        raise InvalidAction(f"the answer may hold only function definitions and imports, found {bad[0]}")
    return src


def _cache_dir() -> Path:
    return cache_root() / "cruxeval_repair"


def _order(item_id: str, n: int, seed: int) -> list[int]:
    rng = np.random.default_rng([seed, zlib.crc32(item_id.encode())])
    return [int(i) for i in rng.permutation(n)]


def build_repair_items(
    items: list[dict[str, str]] | tuple[dict[str, str], ...],
    seed: int = 0,
    pool: SandboxPool | None = None,
    cache_dir: str | os.PathLike | None = None,
) -> list[dict[str, str]]:
    """Repair items ``{id, code, buggy, mutation, input, output, error}`` from CRUXEval rows (checked, cached).

    ``code`` is the original function, ``buggy`` the mutant, ``error`` the mutant's failure (``AssertionError``
    or the exception it raised). Rows whose original fails, or with no failing mutant among the first
    :data:`MAX_TRIES` of a seeded order, are dropped.
    """
    key = hashlib.sha256(json.dumps([MUTATOR_VERSION, MAX_TRIES, seed, list(items)], sort_keys=True).encode())
    path = Path(cache_dir) if cache_dir is not None else _cache_dir()
    path = path / f"{key.hexdigest()[:24]}.json"
    if path.is_file():
        return json.loads(path.read_text(encoding="utf-8"))
    pool = pool or shared_pool(_BUILD)
    originals = pool.run_many([repair_program(it["code"], it) for it in items])
    live = [it for it, r in zip(items, originals, strict=True) if r.passed]
    candidates = {}
    for it in live:
        ms = list(mutants(it["code"]))
        candidates[it["id"]] = [ms[i] for i in _order(it["id"], len(ms), seed)][:MAX_TRIES]
    chosen: dict[str, tuple[Any, str]] = {}
    for attempt in range(MAX_TRIES):  # one sandbox batch per round: the first candidate still untried
        todo = [it for it in live if it["id"] not in chosen and attempt < len(candidates[it["id"]])]
        if not todo:
            break
        results = pool.run_many([repair_program(candidates[it["id"]][attempt].source, it) for it in todo])
        for it, r in zip(todo, results, strict=True):
            if r.status in ("failed", "error") and "exited" not in r.message:
                chosen[it["id"]] = (candidates[it["id"]][attempt], r.message or r.status)
    out = []
    for it in live:
        if it["id"] in chosen:
            m, err = chosen[it["id"]]
            out.append({"id": it["id"], "code": it["code"], "buggy": m.source, "mutation": m.kind,
                        "input": it["input"], "output": it["output"], "error": err})
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".{os.getpid()}.part")
    tmp.write_text(json.dumps(out), encoding="utf-8")
    tmp.replace(path)
    return out


@functools.lru_cache(maxsize=8)
def _built(source: tuple, seed: int, cache_dir: str | None) -> tuple[dict[str, str], ...]:
    rows = file_items(*source[1:]) if source[0] == "file" else generated_items(*source[1:])
    return tuple(build_repair_items(rows, seed, cache_dir=cache_dir))


class CRUXEvalRepairEnv(DatasetTextEnv):
    """Repair a CRUXEval function that fails its assertion because of one injected bug.

    **Description.** One item per episode: the buggy ``f``, the failing assertion and its error. The agent
    answers with the whole corrected function; it is judged by running it with the assertion in
    :mod:`echorl_envs.sandbox` (the answer is model-written code: it runs nowhere else).

    **Data.** ``data_path`` / ``$ECHORL_DATA_DIR/cruxeval/cruxeval.jsonl`` -> the real 800 CRUXEval rows;
    else ``num_generated`` rows of the offline generator (as :class:`~echorl_envs.cruxeval.CRUXEvalEnv`).
    ``mutation_seed`` picks the mutations; ``cache_dir`` overrides where the checked build is cached.

    **Observation.** Instructions, the buggy function in a code fence, the assertion and its error; then
    feedback after each attempt (the error the answer raised, attempts left).

    **Actions.** Free text: the corrected function (a code fence is fine), possibly with helper functions
    and imports; anything else (no ``def f``, top-level statements, invalid Python) is invalid: feedback,
    no attempt used.

    **Rewards.** 1 when the assertion passes, else 0. **Termination.** On a pass or after ``max_attempts``.

    ``info``: ``task_id``, ``mutation`` (the kind of injected bug), ``attempts_left``, ``judge_status`` and
    ``expert_action`` -- the original function.

    **Registered ids.** ``EchoRL/CRUXEval-Repair-v0``.
    """

    reset_options: ClassVar[frozenset[str]] = frozenset({"index"})
    step_info_keys: ClassVar[tuple[str, ...]] = ("judge_status",)

    def __init__(
        self,
        data_path: str | os.PathLike | None = None,
        max_attempts: int = 3,
        num_generated: int = 200,
        generator_seed: int = 0,
        mutation_seed: int = 0,
        cache_dir: str | os.PathLike | None = None,
        sandbox_config: SandboxConfig | None = None,
        render_mode: str | None = None,
    ) -> None:
        super().__init__(render_mode=render_mode)
        self.max_attempts = check_max_attempts(max_attempts)
        self.sandbox_config = sandbox_config or JUDGE_CONFIG
        path = resolve_data_path(data_path)
        if path is not None:
            source: tuple = ("file", str(path), path.stat().st_mtime)
            self.data_source = "file"
        else:
            source = ("generated", num_generated, generator_seed)
            self.data_source = "generated"
        self.items = _built(source, mutation_seed, None if cache_dir is None else str(cache_dir))
        if not self.items:
            raise ValueError("no CRUXEval row yielded a repair item (every original failed or no mutant failed)")
        self._item = self.items[0]
        self._attempts = 0

    @property
    def num_tasks(self) -> int:
        return len(self.items)

    def _prompt(self) -> str:
        it = self._item
        return (
            "The Python function f below has a bug: the assertion after it fails. Fix the bug and answer with "
            "the whole corrected function (a 'def f(...):' block; a ```python fence is fine).\n\n"
            f"```python\n{it['buggy']}\n```\n\nassert f({it['input']}) == {it['output']}\n"
            f"The assertion fails with: {it['error']}\n\nYou have {self.max_attempts} attempts."
        )

    def _reset_episode(self, options: dict[str, Any]) -> Transition:
        self._item = self.items[self._select_index(options)]
        self._attempts = 0
        return Transition(self._prompt())

    def _extra_info(self) -> dict[str, Any]:
        return {"task_id": self._item["id"], "mutation": self._item["mutation"],
                "attempts_left": self.max_attempts - self._attempts}

    def _apply(self, action: str) -> Transition:
        try:
            src = parse_repair(action)
        except InvalidAction as e:
            raise InvalidAction(f"Invalid answer: {e}. Nothing was run; you still have "
                                f"{self.max_attempts - self._attempts} attempt(s).") from None
        result = shared_pool(self.sandbox_config).run(repair_program(src, self._item))
        self._attempts += 1
        return verdict(result, self.max_attempts - self._attempts, _WORDING, {"judge_status": result.status})

    def _task(self) -> str:
        return self._prompt()

    def _expert(self) -> str | None:
        return self._item["code"]
