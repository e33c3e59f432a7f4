"""Tree-of-thought search with the LLM (Yao et al., 2023, "Tree of Thoughts", Sec. 4.1 and 4.2).

**Game of 24** (:func:`game24_bfs`): breadth-first search over *thoughts*, one arithmetic step each
("4 + 5 = 9 (left: 6 9 10)"), three levels for four numbers:

1. *propose*: for every state of the frontier the LLM proposes next steps. ``propose="generate"`` is the paper's
   sampler: the model continues a few-shot "Possible next steps:" prompt and each line it writes is parsed.
   ``propose="score"`` (default) asks the same model for the log-likelihood of every legal step line after the same
   prompt -- one shared-prefix scoring call (one prefix, N short suffixes) -- and keeps the ``k`` most likely: the
   model's own proposal distribution restricted to well-formed steps, and much cheaper than sampling on a CPU.
   In both modes a step's result and the numbers left are computed with exact fractions (a calculator), so a
   thought never carries the model's arithmetic slips; steps naming numbers that are not on the table are dropped.
2. *evaluate*: the LLM judges every new state with a few-shot "sure / likely / impossible" value prompt. Instead of
   sampling the verdict three times as the paper does, we read the model's probabilities of the three words in
   one scoring call and take the expected value with the paper's weights (sure 20, likely 1, impossible 0.001).
   A state with one number left is judged by arithmetic (it equals the target or not).
3. *select*: keep the ``b`` best states (the paper's greedy selection, b = 5).

The answers are the expressions of the final states, best first (states that reach the target exactly first).

**Other math tasks** (:func:`propose_and_vote`): the paper's creative-writing scheme with one step -- sample ``k``
chains of thought, read each final answer, and let the LLM vote for the most promising candidate. The vote is a
scoring call over "The best choice is <i>" instead of sampled votes.

All LLM calls go through :class:`~echorl_agent.llm.engine.LLMEngine` (prefix cache on), and every call is counted
in the caller's :class:`~echorl_agent.llm.engine.usage.TokenMeter`.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from fractions import Fraction

import numpy as np

from echorl_agent.llm import LLMEngine, SamplingParams
from echorl_agent.llm.engine.usage import TokenMeter
from echorl_envs.math.answers import extract_answer, format_number

__all__ = ["ToTConfig", "Game24State", "LevelRecord", "SearchResult", "game24_bfs", "propose_and_vote",
           "legal_steps", "parse_game24"]

PROPOSE_PROMPT = """Combine two of the numbers with + - * / to get a new number.
Input: 3 5 7 12
Possible next steps:
5 + 7 = 12 (left: 3 12 12)
12 / 3 = 4 (left: 4 5 7)
7 - 3 = 4 (left: 4 5 12)
3 * 5 = 15 (left: 7 12 15)
12 - 5 = 7 (left: 3 7 7)
7 + 12 = 19 (left: 3 5 19)
Input: 1 6 10
Possible next steps:
10 - 6 = 4 (left: 1 4)
6 * 1 = 6 (left: 6 10)
10 + 1 = 11 (left: 6 11)
6 + 10 = 16 (left: 1 16)
Input: {left}
Possible next steps:
"""

VALUE_PROMPT = """Can the numbers reach {target} with + - * / using each number once? Answer sure, likely or impossible.
Numbers: 4 6 -> sure
Numbers: 1 2 -> impossible
Numbers: 10 14 -> sure
Numbers: 5 5 -> impossible
Numbers: 2 3 4 -> sure
Numbers: 1 1 1 -> impossible
Numbers: 4 4 10 -> sure
Numbers: 6 9 13 -> likely
Numbers: 5 7 8 -> impossible
Numbers: 2 2 11 -> likely
Numbers: {left} ->"""

VALUE_WORDS = ("sure", "likely", "impossible")

COT_SYSTEM = "Solve the problem. Think step by step in a few short sentences, then end with the line 'Answer: <answer>'."
VOTE_SYSTEM = "Several candidate solutions to a problem follow. Decide which choice is most likely correct."

_STEP_RE = re.compile(r"(-?\d+(?:\.\d+)?)\s*([-+*/x\u00d7\u00f7])\s*(-?\d+(?:\.\d+)?)\s*=")
_PUZZLE_RE = re.compile(r"Use the numbers ([\d ]+?) to make (-?\d+)")


@dataclass
class ToTConfig:
    """Search sizes (defaults: Yao et al. 2023, Game of 24)."""

    beam_size: int = 5
    """b: states kept per level (the paper's n_select_sample)."""
    proposals_per_state: int = 8
    """k: proposed next steps kept per expanded state."""
    propose: str = "score"
    """'score' (rank legal steps by LLM likelihood) or 'generate' (parse sampled lines, the paper's sampler)."""
    max_proposal_tokens: int = 96
    """Generation budget of one proposal call (propose='generate')."""
    value_weights: tuple[float, float, float] = (20.0, 1.0, 0.001)
    """Values of the verdicts sure / likely / impossible."""
    num_samples: int = 3
    """Propose-and-vote: chains of thought sampled per problem."""
    sample_temperature: float = 0.7
    """Propose-and-vote: temperature of the sampled chains."""
    max_solution_tokens: int = 160
    """Propose-and-vote: generation budget of one chain of thought."""

    def __post_init__(self) -> None:
        for name in ("beam_size", "proposals_per_state", "max_proposal_tokens", "num_samples", "max_solution_tokens"):
            v = getattr(self, name)
            if not isinstance(v, int) or v < 1:
                raise ValueError(f"{name} must be an int >= 1, got {name}={v!r}")
        if self.propose not in ("score", "generate"):
            raise ValueError(f"propose must be 'score' or 'generate', got propose={self.propose!r}")
        if len(self.value_weights) != 3:
            raise ValueError(f"value_weights must hold 3 values (sure, likely, impossible), got {self.value_weights!r}")
        if self.sample_temperature < 0:
            raise ValueError(f"sample_temperature must be >= 0, got sample_temperature={self.sample_temperature}")


# ----------------------------------------------------------------------------------------------- Game of 24
@dataclass(frozen=True)
class Game24State:
    """Numbers on the table, the expression that made each one, and the steps taken so far."""

    values: tuple[Fraction, ...]
    exprs: tuple[str, ...]
    steps: tuple[str, ...] = ()

    @classmethod
    def start(cls, numbers: Sequence[int]) -> Game24State:
        return cls(tuple(Fraction(n) for n in numbers), tuple(str(n) for n in numbers))

    @property
    def left(self) -> str:
        """The numbers on the table, ascending (the paper's "left: ..." text)."""
        return " ".join(format_number(v) for v in sorted(self.values))

    @property
    def key(self) -> tuple[Fraction, ...]:
        return tuple(sorted(self.values))

    @property
    def expression(self) -> str:
        """The expression of the last number (meaningful once one number is left)."""
        e = self.exprs[0]
        return e[1:-1] if e.startswith("(") and e.endswith(")") else e


def _apply(state: Game24State, i: int, j: int, op: str) -> tuple[str, Game24State] | None:
    a, b = state.values[i], state.values[j]
    if op == "/" and b == 0:
        return None
    value = {"+": a + b, "-": a - b, "*": a * b, "/": a / b if b else None}[op]
    rest = [k for k in range(len(state.values)) if k not in (i, j)]
    values = tuple(state.values[k] for k in rest) + (value,)
    exprs = tuple(state.exprs[k] for k in rest) + (f"({state.exprs[i]} {op} {state.exprs[j]})",)
    nxt = Game24State(values, exprs)
    line = f"{format_number(a)} {op} {format_number(b)} = {format_number(value)} (left: {nxt.left})"
    return line, Game24State(values, exprs, state.steps + (line,))


def legal_steps(state: Game24State) -> list[tuple[str, Game24State]]:
    """Every distinct step line from ``state`` (both operand orders for - and /), with the state it leads to."""
    out, seen = [], set()
    for i, j in itertools.permutations(range(len(state.values)), 2):
        for op in "+-*/":
            if op in "+*" and i > j:
                continue  # commutative: one order is enough
            r = _apply(state, i, j, op)
            if r is not None and r[0] not in seen:
                seen.add(r[0])
                out.append(r)
    return out


def _parse_step(line: str, state: Game24State) -> tuple[str, Game24State] | None:
    """Read "a op b = ..." from a generated line; the step is recomputed exactly, None if a or b is not on the table."""
    m = _STEP_RE.search(line)
    if not m:
        return None
    op = {"x": "*", "\u00d7": "*", "\u00f7": "/"}.get(m.group(2), m.group(2))
    try:
        a, b = Fraction(m.group(1)), Fraction(m.group(3))
    except ValueError:
        return None
    idx = list(range(len(state.values)))
    i = next((k for k in idx if state.values[k] == a), None)
    j = next((k for k in idx if k != i and state.values[k] == b), None)
    if i is None or j is None:
        return None
    return _apply(state, i, j, op)


@dataclass
class LevelRecord:
    """What one BFS level did (for inspection and tests of the search structure)."""

    depth: int
    expanded: int
    """Frontier states expanded at this level."""
    proposal_calls: int
    """LLM calls made to propose (one per expanded state)."""
    proposals: int
    """Children proposed (before de-duplication across the frontier)."""
    evaluations: int
    """LLM value calls (states with more than one number left)."""
    kept: int
    """States kept for the next level (<= beam_size)."""


@dataclass
class SearchResult:
    """Answers best first, and the search record."""

    answers: list[str]
    solved: bool
    """Whether the best answer reaches the target (known by arithmetic once one number is left)."""
    levels: list[LevelRecord] = field(default_factory=list)


def parse_game24(text: str) -> tuple[list[int], int] | None:
    """(numbers, target) from a Game24 observation ("Use the numbers 1 2 3 4 to make 24"), or None."""
    m = _PUZZLE_RE.search(text)
    if not m:
        return None
    return [int(x) for x in m.group(1).split()], int(m.group(2))


def _propose(engine: LLMEngine, frontier: list[Game24State], cfg: ToTConfig, meter: TokenMeter,
             seed: int) -> list[list[tuple[str, Game24State]]]:
    llm = engine.llm
    if cfg.propose == "score":
        out = []
        for s in frontier:
            steps = legal_steps(s)
            res = engine.score(PROPOSE_PROMPT.format(left=s.left), [line + "\n" for line, _ in steps])
            meter.add(res.num_cached_tokens, res.num_computed_tokens)
            order = np.argsort(-np.asarray(res.logprobs), kind="stable")[: cfg.proposals_per_state]
            out.append([steps[i] for i in order])
        return out
    prompts = [llm.encode(PROPOSE_PROMPT.format(left=s.left)) for s in frontier]
    params = SamplingParams(max_tokens=cfg.max_proposal_tokens, temperature=0.0, seed=seed, stop=("Input:",))
    results = engine.generate(prompts, params)
    out = []
    for s, r in zip(frontier, results, strict=True):
        meter.add(r.num_cached_tokens, r.num_computed_tokens, len(r.token_ids))
        kids, seen = [], set()
        for line in r.text.splitlines():
            step = _parse_step(line, s)
            if step is not None and step[0] not in seen:
                seen.add(step[0])
                kids.append(step)
        out.append(kids[: cfg.proposals_per_state])
    return out


def _value(engine: LLMEngine, state: Game24State, target: int, cfg: ToTConfig, meter: TokenMeter) -> float:
    res = engine.score(VALUE_PROMPT.format(target=target, left=state.left), [f" {w}\n" for w in VALUE_WORDS])
    meter.add(res.num_cached_tokens, res.num_computed_tokens)
    ll = np.asarray(res.logprobs, dtype=np.float64)
    p = np.exp(ll - ll.max())
    p /= p.sum()
    return float(np.dot(p, cfg.value_weights))


def game24_bfs(engine: LLMEngine, numbers: Sequence[int], target: int = 24, config: ToTConfig | None = None,
               meter: TokenMeter | None = None, seed: int = 0) -> SearchResult:
    """ToT-BFS for the Game of 24 (see the module docstring).

    Args:
        engine: the LLM engine (prefix cache on: the few-shot prompts are shared by every call).
        numbers: the puzzle.
        target: the value to reach.
        config: search sizes.
        meter: token counter to charge (a fresh one if None).
        seed: sampling seed (propose='generate').

    Returns:
        The answers best first and one :class:`LevelRecord` per level.
    """
    cfg = config or ToTConfig()
    meter = meter if meter is not None else TokenMeter()
    if len(numbers) < 2:
        raise ValueError(f"numbers must hold at least 2 numbers, got numbers={list(numbers)!r}")
    frontier = [Game24State.start(numbers)]
    scored: list[tuple[float, Game24State]] = []
    levels: list[LevelRecord] = []
    for depth in range(1, len(numbers)):
        proposals = _propose(engine, frontier, cfg, meter, seed + depth)
        children, seen = [], set()
        for kids in proposals:
            for _, child in kids:
                if child.key not in seen:  # the same numbers left = the same state (the paper de-duplicates too)
                    seen.add(child.key)
                    children.append(child)
        evaluations = 0
        scored = []
        for child in children:
            if len(child.values) == 1:
                v = cfg.value_weights[0] if child.values[0] == target else cfg.value_weights[2]
            else:
                v = _value(engine, child, target, cfg, meter)
                evaluations += 1
            scored.append((v, child))
        scored.sort(key=lambda x: -x[0])  # stable: ties keep the proposal order
        frontier = [c for _, c in scored[: cfg.beam_size]]
        levels.append(LevelRecord(depth, len(proposals), len(proposals), sum(map(len, proposals)), evaluations,
                                  len(frontier)))
        if not frontier:
            break
    finals = [c for _, c in scored if len(c.values) == 1]
    finals.sort(key=lambda c: c.values[0] != target)  # exact hits first, then the value order
    answers = list(dict.fromkeys(c.expression for c in finals))
    solved = bool(finals) and finals[0].values[0] == target
    return SearchResult(answers, solved, levels)


# ----------------------------------------------------------------------------------------------- propose and vote
def propose_and_vote(engine: LLMEngine, problem: str, config: ToTConfig | None = None,
                     meter: TokenMeter | None = None, seed: int = 0) -> SearchResult:
    """Sample ``num_samples`` chains of thought, read their answers, let the LLM vote (see the module docstring).

    Returns:
        Distinct answers ranked by the vote (ties: more chains agreeing first); one level record with the number
        of sampled chains as proposals and one vote call as the evaluation.
    """
    cfg = config or ToTConfig()
    meter = meter if meter is not None else TokenMeter()
    llm = engine.llm
    prompt = llm.chat_ids([{"role": "system", "content": COT_SYSTEM}, {"role": "user", "content": problem}])
    results = [
        engine.generate([prompt], SamplingParams(max_tokens=cfg.max_solution_tokens,
                                                 temperature=cfg.sample_temperature, seed=seed * 1000 + i))[0]
        for i in range(cfg.num_samples)
    ]
    counts: dict[str, int] = {}
    texts: dict[str, str] = {}
    for r in results:
        meter.add(r.num_cached_tokens, r.num_computed_tokens, len(r.token_ids))
        try:
            value = extract_answer(r.text)
        except ValueError:
            value = None
        if value is None:
            continue
        ans = format_number(value)
        counts[ans] = counts.get(ans, 0) + 1
        texts.setdefault(ans, r.text.strip())
    cands = list(counts)
    votes = 0
    if len(cands) > 1:
        body = problem.strip() + "\n\n" + "\n\n".join(
            f"Choice {i + 1}:\n{texts[a][-600:]}" for i, a in enumerate(cands))
        body += "\n\nWhich choice is most likely correct?"
        vote = llm.chat_ids([{"role": "system", "content": VOTE_SYSTEM}, {"role": "user", "content": body}])
        vote += llm.encode("The best choice is")
        res = engine.score(vote, [f" {i + 1}" for i in range(len(cands))])
        meter.add(res.num_cached_tokens, res.num_computed_tokens)
        votes = 1
        ll = res.logprobs
        cands = sorted(cands, key=lambda a: (-ll[list(counts).index(a)], -counts[a]))
    if not cands:  # no chain produced a number: hand the env the first chain's last line (it says what went wrong)
        lines = [ln for ln in results[0].text.splitlines() if ln.strip()]
        cands = [lines[-1].strip() if lines else results[0].text.strip() or "0"]
    level = LevelRecord(1, 1, 1, len(results), votes, len(cands))
    return SearchResult(cands, False, [level])

