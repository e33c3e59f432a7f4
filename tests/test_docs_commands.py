"""Every ``echorl SUBCOMMAND ... --flag`` quoted in README.md and docs/ names a subcommand and flags that exist.

A reader copies commands from the docs; a flag that the parser rejects (``unrecognized arguments: --omega``) ends
the first hour. Commands are read from fenced code blocks (lines joined at a trailing backslash) and from inline
code spans; a command runs to the end of its line or span, a shell comment, ``&&``, ``;``, ``|`` or ``)``. The
flags are checked against the real parser (:func:`echorl_agent.cli.build_parser`), so a renamed flag fails here
whatever the README says today.
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path
from typing import NamedTuple

import pytest

from echorl_agent import cli

ROOT = Path(__file__).resolve().parents[1]
DOCS = sorted([ROOT / "README.md", *(ROOT / "docs").rglob("*.md")])
FENCE = re.compile(r"^ *(```|~~~)[^\n]*\n(.*?)^ *\1 *$", re.S | re.M)
SPAN = re.compile(r"(?<!`)`([^`\n]+)`(?!`)")
#: ``echorl WORD`` where echorl is the program (start of the text, after a space, a path or a shell prompt).
COMMAND = re.compile(r"(?:^|[\s/$(])echorl\s+([a-z][a-z0-9-]*)(.*)")
#: Where a command ends inside a line: a shell comment, a command separator, a closing subshell.
END = re.compile(r"\s#|&&|\|\||;|\||\)")
FLAG = re.compile(r"(?:^|\s)(--[a-z0-9][a-z0-9-]*)")
#: A paragraph that says its commands are not there yet ("**not built yet**"): its quotes are not checked.
PLANNED = re.compile(r"\bnot (?:built|implemented)\b|\bplanned\b", re.I)
#: Programs whose own flags the docs quote in prose (vLLM's `--enable-lora`): a lone flag in a paragraph that
#: names one of them is taken as that program's.
OTHER_PROGRAMS = re.compile(r"\b(?:vLLM|vllm|llama\.cpp|llama-server|SGLang|rl_zoo3|rl-baselines3-zoo|pytest|pip|"
                            r"TRL|verifiers|prime-rl|alfworld-download)\b")


class Quote(NamedTuple):
    """One ``echorl`` command quoted in a document."""

    where: str  # file:line
    command: str  # the subcommand
    flags: tuple[str, ...]


def _line_of(text: str, index: int) -> int:
    return text.count("\n", 0, index) + 1


def _commands(snippet: str) -> list[tuple[str, str]]:
    """(subcommand, rest of the command) for every ``echorl`` command in one line of code."""
    out = []
    for m in COMMAND.finditer(snippet):
        rest = END.split(m.group(2), maxsplit=1)[0]
        out.append((m.group(1), rest))
    return out


def quoted_commands(path: Path, root: Path = ROOT) -> list[Quote]:
    """The ``echorl`` commands quoted in the Markdown file ``path`` (named relative to ``root``): those of the
    code blocks first, then those of the inline code spans."""
    text = path.read_text()
    name = path.relative_to(root).as_posix()
    found: list[Quote] = []
    prose = FENCE.sub(lambda m: "\n" * m.group(0).count("\n"), text)  # blanked out, line numbers kept
    for block in FENCE.finditer(text):
        first = _line_of(text, block.start(2))
        lines = block.group(2).split("\n")
        i = 0
        while i < len(lines):
            start, joined = i, lines[i]
            while joined.rstrip().endswith("\\") and i + 1 < len(lines):
                i += 1
                joined = joined.rstrip()[:-1] + " " + lines[i]
            for sub, rest in _commands(joined):
                found.append(Quote(f"{name}:{first + start}", sub, tuple(FLAG.findall(rest))))
            i += 1
    for first, para in _paragraphs(prose):
        if PLANNED.search(para):  # a command the text says does not exist yet
            continue
        for span in SPAN.finditer(para):
            for sub, rest in _commands(span.group(1)):
                found.append(Quote(f"{name}:{first + para.count(chr(10), 0, span.start())}", sub,
                                   tuple(FLAG.findall(rest))))
    return found


def _subparsers() -> dict[str, argparse.ArgumentParser]:
    parser = cli.build_parser()
    action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return dict(action.choices)


@pytest.fixture(scope="module")
def parsers() -> dict[str, argparse.ArgumentParser]:
    return _subparsers()


def problems(quotes: list[Quote], parsers: dict[str, argparse.ArgumentParser]) -> list[str]:
    """One line per quoted subcommand or flag the parser does not have (with the close match)."""
    import difflib

    out = []
    for q in quotes:
        if q.command not in parsers:
            # "echorl is ..." in a code span is prose; only a command-looking word counts as a subcommand
            if q.flags:
                hint = difflib.get_close_matches(q.command, list(parsers), n=1)
                out.append(f"{q.where}: `echorl {q.command}` is no subcommand"
                           + (f" (did you mean {hint[0]!r}?)" if hint else ""))
            continue
        known = parsers[q.command]._option_string_actions
        for flag in q.flags:
            if flag not in known:
                hint = difflib.get_close_matches(flag, list(known), n=1)
                out.append(f"{q.where}: `echorl {q.command}` has no {flag}" + (f" (did you mean {hint[0]}?)"
                                                                              if hint else ""))
    return out


#: A flag quoted on its own (`` `--omega 0` ``), not inside a command.
LONE_FLAG = re.compile(r"`(--[a-z0-9][a-z0-9-]*)[^`]*`")
#: A script of this repository named in the text.
SCRIPT = re.compile(r"\b((?:benchmarks|examples|docs)/[\w/]+\.py)\b")
#: A program other than echorl at the start of a code line (its flags are its own).
OTHER_PROGRAM = re.compile(r"^\s*(?:\$\s*)?(?:python3?|pip|pytest|make|uv|\S+/python3?)\s", re.M)


def _paragraphs(prose: str) -> list[tuple[int, str]]:
    """(first line, text) of each paragraph of a Markdown text (blank lines, headings and list items end one)."""
    starts = sorted({0, *(m.end() for m in re.finditer(r"\n\s*\n", prose)),
                     *(m.start() + 1 for m in re.finditer(r"\n(?=#|\s*[-*] |\s*\d+\. )", prose))})
    ends = [*starts[1:], len(prose)]
    return [(_line_of(prose, a), prose[a:b]) for a, b in zip(starts, ends, strict=True) if b > a]


def other_programs_flags(paths: list[Path]) -> set[str]:
    """Flags that follow a program other than echorl on a code line of ``paths`` (``python -m rl_zoo3.train
    --gym-packages ...``, ``python benchmarks/x.py --loops ...``): they belong to that program."""
    flags: set[str] = set()
    for path in paths:
        for block in FENCE.finditer(path.read_text()):
            for line in block.group(2).replace("\\\n", " ").splitlines():
                if OTHER_PROGRAM.match(line) and not COMMAND.search(line):
                    flags.update(FLAG.findall(line.split(" #")[0]))
    return flags


def lone_flag_problems(path: Path, parsers: dict[str, argparse.ArgumentParser], others: set[str],
                       root: Path = ROOT) -> list[str]:
    """Flags quoted on their own in ``path`` that are no flag of an echorl subcommand, of a script named on the page
    (``"--flag"`` in its source) or of another program's command in the docs. (A flag of a script named elsewhere on
    the page passes even where the text means ``echorl``: which command a sentence means is left to the reader.)"""
    echorl_flags = set().union(*(p._option_string_actions for p in parsers.values()))
    text = path.read_text()
    prose = FENCE.sub(lambda m: "\n" * m.group(0).count("\n"), text)
    name = path.relative_to(root).as_posix()
    page_scripts = [root / s for s in dict.fromkeys(SCRIPT.findall(text)) if (root / s).is_file()]
    out = []
    for first, para in _paragraphs(prose):
        if OTHER_PROGRAMS.search(para) or PLANNED.search(para):
            continue
        for m in LONE_FLAG.finditer(para):
            flag, where = m.group(1), f"{name}:{first + para.count(chr(10), 0, m.start())}: {m.group(0)}"
            if flag in echorl_flags or flag in others:
                continue
            if any(re.search(rf"[\"']{re.escape(flag)}[\"']", s.read_text()) for s in page_scripts):
                continue
            out.append(f"{where} is no flag of echorl"
                       + (f" nor of {', '.join(s.relative_to(root).as_posix() for s in page_scripts)}"
                          if page_scripts else "")
                       + " (name the command it belongs to, e.g. `echorl train-llm --flag` or `script.py --flag`)")
    return out


def test_docs_quote_echorl_commands():
    """The reader is real: README and docs/ quote commands with flags (so the check below checks something)."""
    quotes = [q for path in DOCS for q in quoted_commands(path)]
    assert sum(len(q.flags) for q in quotes) >= 20
    assert {"bench", "train-llm", "serve-env"} <= {q.command for q in quotes}


@pytest.mark.parametrize("path", DOCS, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_every_flag_quoted_in_the_docs_exists(path, parsers):
    assert problems(quoted_commands(path), parsers) == []


@pytest.mark.parametrize("path", DOCS, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_every_flag_quoted_on_its_own_belongs_to_a_command_nearby(path, parsers):
    assert lone_flag_problems(path, parsers, other_programs_flags(DOCS)) == []


def test_the_reader_finds_commands_in_blocks_and_spans_and_catches_a_wrong_flag(tmp_path, parsers):
    doc = tmp_path / "doc.md"
    doc.write_text(
        "Run `echorl train-llm --task T --omega 0` or `--omega` alone (not a command).\n\n"
        "```bash\n"
        "echorl bench --tasks A B \\\n"
        "    --agents random --seeds 2   # --not-a-flag in a comment\n"
        "cd x && .venv/bin/echorl serve-env --task A --no-web | tee log --nope\n"
        "echorl trian-llm --task T\n"
        "```\n"
        "and `pip install echorl` is no command.\n")
    doc.write_text(doc.read_text() + "\nServing over `echorl train-llm --env-url` is **not built yet**.\n")
    quotes = quoted_commands(doc, root=tmp_path)
    assert [(q.command, q.flags) for q in quotes] == [
        ("bench", ("--tasks", "--agents", "--seeds")),
        ("serve-env", ("--task", "--no-web")),
        ("trian-llm", ("--task",)),
        ("train-llm", ("--task", "--omega")),
    ]
    assert [q.where for q in quotes] == ["doc.md:4", "doc.md:6", "doc.md:7", "doc.md:1"]
    assert problems(quotes, parsers) == [
        "doc.md:7: `echorl trian-llm` is no subcommand (did you mean 'train-llm'?)",
        "doc.md:1: `echorl train-llm` has no --omega",
    ]


def test_a_lone_flag_must_belong_to_echorl_or_a_script_of_its_page(tmp_path, parsers):
    (tmp_path / "benchmarks").mkdir()
    (tmp_path / "benchmarks" / "sig.py").write_text('ap.add_argument("--omega", type=float)')
    doc = tmp_path / "doc.md"
    doc.write_text("# A\n\nWith `echorl train-llm`, the recipe sets `--omega 0` and `--step-advantage-weight 0`.\n")
    assert lone_flag_problems(doc, parsers, set(), root=tmp_path) == [
        "doc.md:3: `--omega 0` is no flag of echorl (name the command it belongs to, e.g. `echorl train-llm --flag` "
        "or `script.py --flag`)"]
    doc.write_text("# A\n\nThe recipe sets `--omega 0`.\n\n# B\n\n`benchmarks/sig.py` takes\n`--zzz`; "
                   "`--gym-packages x` too.\n")
    assert lone_flag_problems(doc, parsers, {"--gym-packages"}, root=tmp_path) == [
        "doc.md:8: `--zzz` is no flag of echorl nor of benchmarks/sig.py (name the command it belongs to, e.g. "
        "`echorl train-llm --flag` or `script.py --flag`)"]
    (tmp_path / "z.md").write_text("```bash\npython -m rl_zoo3.train --algo ppo \\\n  --gym-packages echorl_envs\n"
                                   "echorl bench --tasks T\n```\n")
    assert other_programs_flags([tmp_path / "z.md"]) == {"--algo", "--gym-packages"}


def test_flags_of_other_programs_named_in_the_paragraph_are_theirs(tmp_path, parsers):
    doc = tmp_path / "doc.md"
    doc.write_text("vLLM needs `--enable-lora`.\n\nThe server needs `--enable-lora`.\n")
    assert [p.split(": ", 1)[0] for p in lone_flag_problems(doc, parsers, set(), root=tmp_path)] == ["doc.md:3"]
