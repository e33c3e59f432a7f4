"""CRUXEval: predict a short Python function's output (CRUXEval-O) or an input that yields an output (CRUXEval-I).

Items are ``{"code", "input", "output", "id"}`` as in CRUXEval's ``cruxeval.jsonl`` (Gu et al., 2024). An
answer is judged exactly as CRUXEval's harness does: the program ``code + "\\nassert f(<input>) == <output>"``
is executed (here in :mod:`echorl_envs.sandbox`) and the answer is right iff it runs without error.
"""

from __future__ import annotations

import ast
import functools
import json
import os
import urllib.request
from pathlib import Path
from typing import Any, ClassVar

from echorl_envs.core import DatasetTextEnv, InvalidAction, Transition
from echorl_envs.cruxeval.generator import generate_items
from echorl_envs.cruxeval.judge import JUDGE_CONFIG, Wording, check_max_attempts, resolve_data_path, verdict
from echorl_envs.sandbox import SandboxConfig, SandboxPool, SandboxResult, shared_pool

__all__ = [
    "CRUXEvalEnv", "load_cruxeval", "download_cruxeval", "judge", "judge_many", "check_program",
    "parse_answer", "gold_answer", "strip_fences", "generated_items", "file_items", "CRUXEVAL_URL", "MAX_ANSWER_CHARS",
]

#: Where CRUXEval's authors publish the 800 items (used only by :func:`download_cruxeval`).
CRUXEVAL_URL = "https://raw.githubusercontent.com/facebookresearch/cruxeval/main/data/cruxeval.jsonl"
_KEYS = ("code", "input", "output", "id")
_MODES = ("output", "input")
#: Names an answer may not use: calling ``f`` itself (CRUXEval's harness zeroes output answers that contain
#: ``f(<input>)``) or reaching the interpreter's internals (rebinding ``f.__code__`` would fake a pass).
_FORBIDDEN_NAMES = frozenset(
    {"f", "eval", "exec", "compile", "open", "globals", "locals", "vars", "getattr", "setattr", "delattr",
     "__import__", "breakpoint", "input", "help", "exit", "quit", "memoryview", "type", "object", "super"}
)
#: Calls allowed in an output answer besides literals (``set()`` has no literal form; ``float('inf')``).
#: Attributes that hand out frames, builtins or generator control (``(x for x in ()).gi_frame.f_builtins``
#: reaches every builtin; ``.throw(SystemExit)`` tried to end the judge early).
_FORBIDDEN_ATTRIBUTES = frozenset(
    {"gi_frame", "gi_code", "gi_yieldfrom", "gi_running", "cr_frame", "cr_code", "cr_await", "ag_frame",
     "ag_code", "ag_await", "tb_frame", "tb_next", "f_back", "f_builtins", "f_globals", "f_locals", "f_code",
     "f_trace", "throw", "send", "close", "mro", "func_globals"}
)
_OUTPUT_CALLS = frozenset({"set", "frozenset", "float", "complex", "bytes", "bytearray", "range"})
#: How a wrong answer is worded (CRUXEval-O and -I: the assertion is the item's own).
_WORDING = Wording("Incorrect: the assertion fails.", "Incorrect: running the assertion timed out ({message}).",
                   "Incorrect: running the assertion raised {message}.")


def load_cruxeval(path: str | os.PathLike) -> list[dict[str, str]]:
    """Read a ``cruxeval.jsonl`` file (one JSON object per line with keys code, input, output, id)."""
    path = Path(path)
    if path.is_dir():
        path = path / "cruxeval.jsonl"
    if not path.is_file():
        raise ValueError(f"data_path must be a cruxeval.jsonl file or a folder holding one, got data_path={str(path)!r}")
    items = []
    with path.open(encoding="utf-8") as fh:
        for n, line in enumerate(fh, 1):
            if not line.strip():
                continue
            row = json.loads(line)
            missing = [k for k in _KEYS if k not in row]
            if missing:
                raise ValueError(f"{path}:{n}: a CRUXEval item needs keys {_KEYS}, missing {missing}")
            items.append({k: str(row[k]) for k in _KEYS})
    return items


def download_cruxeval(dest: str | os.PathLike | None = None, url: str = CRUXEVAL_URL) -> Path:
    """Download the real CRUXEval set to ``dest`` (default ``$ECHORL_DATA_DIR/cruxeval`` or
    ``~/.cache/echorl/cruxeval``) and return the file's path. For users; the tests never call it."""
    if dest is None:
        root = os.environ.get("ECHORL_DATA_DIR")
        dest = Path(root) / "cruxeval" if root else Path.home() / ".cache" / "echorl" / "cruxeval"
    dest = Path(dest)
    dest.mkdir(parents=True, exist_ok=True)
    target = dest / "cruxeval.jsonl"
    with urllib.request.urlopen(url, timeout=60) as resp:  # noqa: S310 - a fixed https URL
        data = resp.read()
    tmp = target.with_suffix(".part")
    tmp.write_bytes(data)
    load_cruxeval(tmp)  # validate before replacing
    tmp.replace(target)
    return target


def strip_fences(text: str) -> str:
    """``text`` without a surrounding Markdown code fence (and its language tag's line) or backticks."""
    t = text.strip()
    if t.startswith("```"):
        t = t.split("\n", 1)[1] if "\n" in t else t.strip("`")
        if t.rstrip().endswith("```"):
            t = t.rstrip()[:-3]
    return t.strip().strip("`").strip()


def _check_names(tree: ast.AST) -> None:
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and (node.id in _FORBIDDEN_NAMES or node.id.startswith("__")):
            raise InvalidAction(f"the answer may not use {node.id!r}")
        if isinstance(node, ast.Attribute) and (node.attr.startswith("_") or node.attr in _FORBIDDEN_ATTRIBUTES):
            raise InvalidAction(f"the answer may not access the attribute {node.attr!r}")
        if isinstance(node, (ast.NamedExpr, ast.Await, ast.Yield, ast.YieldFrom)):
            raise InvalidAction("the answer must be a plain expression")


def _is_output_literal(node: ast.AST) -> bool:
    if isinstance(node, ast.Constant):
        return True
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return all(_is_output_literal(e) for e in node.elts)
    if isinstance(node, ast.Dict):
        return all(k is not None and _is_output_literal(k) for k in node.keys) and all(
            _is_output_literal(v) for v in node.values
        )
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        return _is_output_literal(node.operand)
    if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Add, ast.Sub)):  # complex literals: 1+2j
        return _is_output_literal(node.left) and _is_output_literal(node.right)
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in _OUTPUT_CALLS:
        return not node.keywords and all(_is_output_literal(a) for a in node.args)
    return False


#: Longest answer parsed (CRUXEval's 800 gold outputs are at most 50 characters, inputs at most 128).
MAX_ANSWER_CHARS = 2000


def parse_answer(answer: str, mode: str) -> str:
    """Normalise an answer to the Python source that goes into the assertion, or raise ``InvalidAction``.

    See :func:`_parse_answer` for the accepted forms. Any ``str`` is safe to pass: answers longer than
    ``MAX_ANSWER_CHARS``, with unpaired surrogates, or nested too deeply for the parser are invalid answers,
    never exceptions of another kind.
    """
    if mode not in _MODES:
        raise ValueError(f"mode must be one of {_MODES}, got mode={mode!r}")
    if not isinstance(answer, str):
        raise InvalidAction(f"the answer must be text, got {type(answer).__name__}")
    if len(answer) > MAX_ANSWER_CHARS:
        raise InvalidAction(f"the answer is too long ({len(answer)} > {MAX_ANSWER_CHARS} characters)")
    try:
        answer.encode("utf-8")
    except UnicodeEncodeError:
        raise InvalidAction("the answer holds characters that are not valid text (unpaired surrogates)") from None
    try:
        return _parse_answer(answer, mode)
    except (RecursionError, MemoryError):
        raise InvalidAction("the answer is nested too deeply to parse") from None
    except ValueError as e:  # e.g. null bytes in the source
        raise InvalidAction(f"the answer is not valid Python ({e})") from None


def _parse_answer(answer: str, mode: str) -> str:
    """The forms ``parse_answer`` accepts (may raise RecursionError on deeply nested text).

    Accepted: the bare expression (output mode: the output literal; input mode: the argument list, e.g.
    ``'abc', 3``), the same wrapped in backticks or a code fence, ``f(<args>)`` in input mode, or a whole
    ``assert f(...) == ...`` line. Output answers must be literals (CRUXEval's prompt: "a literal (no
    unsimplified expressions, no function calls)"); neither mode may call ``f`` or reach interpreter internals.
    """
    text = strip_fences(answer)
    if text.startswith("assert "):
        try:
            stmt = ast.parse(text).body
        except SyntaxError as e:
            raise InvalidAction(f"the assertion is not valid Python ({e.msg})") from None
        if len(stmt) != 1 or not isinstance(stmt[0], ast.Assert) or not isinstance(stmt[0].test, ast.Compare):
            raise InvalidAction("write a single 'assert f(...) == ...' line or just the answer")
        cmp = stmt[0].test
        if len(cmp.ops) != 1 or not isinstance(cmp.ops[0], ast.Eq):
            raise InvalidAction("the assertion must compare with a single '=='")
        part = cmp.comparators[0] if mode == "output" else cmp.left
        text = ast.get_source_segment(text, part) or ""
    if mode == "output":
        if not text:
            raise InvalidAction("the answer is empty; write the output as a Python literal")
        try:
            tree = ast.parse(text, mode="eval")
        except SyntaxError as e:
            raise InvalidAction(f"the answer is not a valid Python expression ({e.msg})") from None
        _check_names(tree)
        if not _is_output_literal(tree.body):
            raise InvalidAction("the output must be a literal (no variables, no function calls)")
        return text
    # input mode: the argument list of f
    if not text:
        raise InvalidAction("the answer is empty; write the arguments of f (or 'f()' for no arguments)")
    if text.startswith("f(") and text.endswith(")"):
        try:
            call = ast.parse(text, mode="eval").body
            if isinstance(call, ast.Call) and isinstance(call.func, ast.Name) and call.func.id == "f":
                text = text[2:-1].strip()
        except SyntaxError:
            pass
    try:
        tree = ast.parse(f"f({text})", mode="eval")
    except SyntaxError as e:
        raise InvalidAction(f"the input is not a valid argument list for f ({e.msg})") from None
    call = tree.body
    if not (isinstance(call, ast.Call) and isinstance(call.func, ast.Name) and call.func.id == "f"):
        raise InvalidAction("the input must be the arguments of a single call to f")
    for arg in [*call.args, *(k.value for k in call.keywords)]:
        _check_names(arg)
    return text


def gold_answer(item: dict[str, str], mode: str) -> str:
    """The item's own answer in the form :func:`parse_answer` accepts (``f()`` for a call without arguments)."""
    if mode == "output":
        return item["output"]
    return item["input"] if item["input"].strip() else "f()"


def check_program(item: dict[str, str], answer_src: str, mode: str) -> str:
    """The program CRUXEval's harness runs: the code followed by ``assert f(<input>) == <output>``."""
    if mode == "output":
        return f"{item['code']}\nassert f({item['input']}) == {answer_src}"
    return f"{item['code']}\nassert f({answer_src}) == {item['output']}"


def judge(item: dict[str, str], answer: str, mode: str, pool: SandboxPool | None = None) -> SandboxResult:
    """Judge one answer (``parse_answer`` then the sandboxed assertion); invalid answers are ``error``."""
    return judge_many([item], [answer], mode, pool)[0]


def judge_many(
    items: list[dict[str, str]], answers: list[str], mode: str, pool: SandboxPool | None = None
) -> list[SandboxResult]:
    """Judge many answers in one batch on ``pool`` (default: the process's shared sandbox pool)."""
    if len(items) != len(answers):
        raise ValueError(f"items and answers must have the same length, got {len(items)} and {len(answers)}")
    pool = pool or shared_pool(JUDGE_CONFIG)
    programs: list[str | None] = []
    results: list[SandboxResult | None] = []
    for item, answer in zip(items, answers, strict=True):
        try:
            programs.append(check_program(item, parse_answer(answer, mode), mode))
            results.append(None)
        except InvalidAction as e:
            programs.append(None)
            results.append(SandboxResult("error", f"invalid answer: {e}"))
    ran = iter(pool.run_many([p for p in programs if p is not None]))
    return [r if r is not None else next(ran) for r in results]


@functools.lru_cache(maxsize=8)
def generated_items(num_items: int, seed: int) -> tuple[dict[str, str], ...]:
    """The offline generated items (cached per process: every env of a worker shares one copy)."""
    return tuple(generate_items(num_items, seed))


@functools.lru_cache(maxsize=8)
def file_items(path: str, mtime: float) -> tuple[dict[str, str], ...]:
    """The items of a ``cruxeval.jsonl`` (cached per path and modification time)."""
    return tuple(load_cruxeval(path))


class CRUXEvalEnv(DatasetTextEnv):
    """CRUXEval output prediction (``mode="output"``) or input prediction (``mode="input"``).

    **Description.** One item per episode: a short Python function ``f`` and either its input (predict the
    output) or its output (find an input). Judged by running ``assert f(<input>) == <output>`` in the sandbox,
    as CRUXEval's harness does.

    **Data.** ``data_path`` (a ``cruxeval.jsonl`` file or folder) → the real 800 items; else
    ``$ECHORL_DATA_DIR/cruxeval/cruxeval.jsonl`` when it exists; else ``num_generated`` items built offline
    by :mod:`echorl_envs.cruxeval.generator` (deterministic for ``generator_seed``).

    **Observation.** The instruction, the code and the assertion with ``??`` in place of the answer, then
    feedback after each attempt ("Incorrect", the error an answer raised, or attempts left).

    **Actions.** Free text: a Python literal (output mode) or an argument list (input mode); code fences,
    ``f(...)`` and a whole ``assert`` line are accepted (see :func:`parse_answer`). Unparsable answers, names
    like ``f``/``eval``/dunder attributes, and non-literal outputs are invalid (feedback, no attempt used).

    **Rewards.** 1 for a passing answer, else 0.

    **Termination.** On a passing answer, or after ``max_attempts`` judged answers.

    ``info``: ``task_id``, ``attempts_left``, ``judge_status`` (sandbox status of the last judged answer) and
    ``expert_action`` -- the gold answer (an oracle, since the gold output/input is known).

    **Registered ids.** ``EchoRL/CRUXEval-O-v0`` (output), ``EchoRL/CRUXEval-I-v0`` (input).
    """

    reset_options: ClassVar[frozenset[str]] = frozenset({"index"})
    step_info_keys: ClassVar[tuple[str, ...]] = ("judge_status",)

    def __init__(
        self,
        mode: str = "output",
        data_path: str | os.PathLike | None = None,
        max_attempts: int = 3,
        num_generated: int = 500,
        generator_seed: int = 0,
        sandbox_config: SandboxConfig | None = None,
        render_mode: str | None = None,
    ) -> None:
        super().__init__(render_mode=render_mode)
        if mode not in _MODES:
            raise ValueError(f"mode must be 'output' or 'input', got mode={mode!r}")
        self.mode = mode
        self.max_attempts = check_max_attempts(max_attempts)
        self.sandbox_config = sandbox_config or JUDGE_CONFIG
        path = resolve_data_path(data_path)
        if path is not None:
            self.items = file_items(str(path), path.stat().st_mtime)
            self.data_source = "file"
        else:
            self.items = generated_items(num_generated, generator_seed)
            self.data_source = "generated"
        self._item: dict[str, str] = self.items[0]
        self._attempts = 0
        self._feedback: list[str] = []

    @property
    def num_tasks(self) -> int:
        return len(self.items)

    def _prompt(self) -> str:
        it = self._item
        if self.mode == "output":
            head = ("You are given a Python function and an assertion containing an input to the function. "
                    "Complete the assertion with a literal (no unsimplified expressions, no function calls) "
                    "containing the output when executing the provided code on the given input.")
            assertion = f"assert f({it['input']}) == ??"
            tail = "Answer with the output literal only."
        else:
            head = ("You are given a Python function and an output. Find any input such that executing f on "
                    "the input leads to the given output.")
            assertion = f"assert f(??) == {it['output']}"
            tail = "Answer with the arguments of f only (e.g. 'abc', 3)."
        return f"{head}\n\n{it['code']}\n{assertion}\n\n{tail} You have {self.max_attempts} attempts."

    def _reset_episode(self, options: dict[str, Any]) -> Transition:
        self._item = self.items[self._select_index(options)]
        self._attempts = 0
        return Transition(self._prompt())

    def _extra_info(self) -> dict[str, Any]:
        return {"task_id": self._item["id"], "attempts_left": self.max_attempts - self._attempts}

    def _apply(self, action: str) -> Transition:
        try:
            answer_src = parse_answer(action, self.mode)
        except InvalidAction as e:
            raise InvalidAction(f"Invalid answer: {e}. Nothing was judged; you still have "
                                f"{self.max_attempts - self._attempts} attempt(s).") from None
        result = shared_pool(self.sandbox_config).run(check_program(self._item, answer_src, self.mode))
        self._attempts += 1
        return verdict(result, self.max_attempts - self._attempts, _WORDING, {"judge_status": result.status},
                       reveal=f" A correct answer was: {gold_answer(self._item, self.mode)}")

    def _task(self) -> str:
        return self._prompt()

    def _expert(self) -> str | None:
        return gold_answer(self._item, self.mode)
