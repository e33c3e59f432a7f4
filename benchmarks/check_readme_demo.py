"""Check that README's demo table is what the demo produced, so the two cannot drift apart silently.

The README table sits between ``<!-- demo-table:begin -->`` and ``<!-- demo-table:end -->``; it may show a subset of
the columns of ``summary.md``, but every row of the summary must be there, and every cell it shows must equal the
summary's (timing columns such as ep/s excepted: they depend on the machine's load).

Usage:
    .venv/bin/python benchmarks/check_readme_demo.py                          # README vs runs/demo/summary.md
    .venv/bin/python benchmarks/check_readme_demo.py --summary benchmarks/baselines/demo/summary.md
    .venv/bin/python benchmarks/check_readme_demo.py --print    # the README table to paste, from the summary

Exit status 0 when they agree, 1 with one line per difference otherwise.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BEGIN, END = "<!-- demo-table:begin -->", "<!-- demo-table:end -->"
#: Columns that depend on the machine's speed, never compared.
TIMING = {"ep/s"}
KEY = ("task", "agent", "mode")
#: The summary columns README shows.
README_COLUMNS = ("task", "agent", "mode", "max steps", "n", "Success@1 [95% CI]", "Δ vs random [95% CI]",
                  "McNemar p", "return", "steps", "prompt tok", "KV reuse")


def parse_table(text: str) -> list[dict[str, str]]:
    """The rows of the first GitHub Markdown table in ``text`` (cells stripped), as header -> cell dicts."""
    lines = [ln.strip() for ln in text.splitlines() if ln.strip().startswith("|")]
    if len(lines) < 2:
        return []
    cells = [[c.strip() for c in ln.strip("|").split("|")] for ln in lines]
    header, body = cells[0], [c for c in cells[2:] if len(c) == len(cells[0])]
    return [dict(zip(header, row, strict=True)) for row in body]


def readme_table(readme: str) -> list[dict[str, str]]:
    """The demo table of README's text (between the markers); ValueError if the markers are missing."""
    if BEGIN not in readme or END not in readme:
        raise ValueError(f"README has no demo table between {BEGIN!r} and {END!r}")
    return parse_table(readme.split(BEGIN, 1)[1].split(END, 1)[0])


def compare(readme_rows: list[dict[str, str]], summary_rows: list[dict[str, str]]) -> list[str]:
    """Differences between README's demo rows and the summary's (empty when they agree)."""
    if not summary_rows:
        return ["the summary has no table"]
    by_key = {tuple(r.get(k, "-") for k in KEY): r for r in summary_rows}
    problems = []
    seen = set()
    for r in readme_rows:
        key = tuple(r.get(k, "-") for k in KEY)
        seen.add(key)
        if key not in by_key:
            problems.append(f"README row {key} is not in the summary")
            continue
        for col, val in r.items():
            if col in TIMING or col not in by_key[key]:
                continue
            if by_key[key][col] != val:
                problems.append(f"{key} {col}: README {val!r}, summary {by_key[key][col]!r}")
    problems += [f"summary row {k} is missing from README" for k in by_key if k not in seen]
    missing_cols = [c for c in readme_rows[0] if c not in summary_rows[0]] if readme_rows else []
    problems += [f"README column {c!r} is not in the summary" for c in missing_cols]
    return problems


def readme_markdown(summary_rows: list[dict[str, str]]) -> str:
    """README's demo table (the :data:`README_COLUMNS` of the summary), between the markers."""
    cols = [c for c in README_COLUMNS if summary_rows and c in summary_rows[0]]
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    lines += ["| " + " | ".join(r[c] for c in cols) + " |" for r in summary_rows]
    return "\n".join([BEGIN, *lines, END])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--readme", default=str(ROOT / "README.md"))
    ap.add_argument("--summary", default=str(ROOT / "runs" / "demo" / "summary.md"))
    ap.add_argument("--print", action="store_true", help="print the README table made from the summary and exit")
    args = ap.parse_args(argv)
    if args.print:
        print(readme_markdown(parse_table(Path(args.summary).read_text())))
        return 0
    problems = compare(readme_table(Path(args.readme).read_text()), parse_table(Path(args.summary).read_text()))
    for p in problems:
        print(p)
    print(f"README demo table {'matches' if not problems else 'DIFFERS FROM'} {args.summary}")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
