"""Check that README's demo table is what the demo produced, so the two cannot drift apart silently.

The README table sits between ``<!-- demo-table:begin -->`` and ``<!-- demo-table:end -->``; it may show a subset of
the columns of ``summary.md``, but every row of the summary must be there, and every cell it shows must equal the
summary's (timing columns such as ep/s excepted: they depend on the machine's load).

A few rows depend on the CPU (the MLP's training follows its float arithmetic). They are documented in one place,
``benchmarks/baselines/demo/cpu_rows.md``, keyed by CPU (vendor and widest vector unit, e.g. ``intel/avx512``; see
:func:`cpu_key`): on a host with that key, a summary row equal to its documented row is accepted too.

Usage:
    .venv/bin/python benchmarks/check_readme_demo.py                          # README vs runs/demo/summary.md
    .venv/bin/python benchmarks/check_readme_demo.py --summary benchmarks/baselines/demo/summary.md
    .venv/bin/python benchmarks/check_readme_demo.py --print    # the README table to paste, from the summary

Exit status 0 when they agree, 1 with one line per difference otherwise.
"""

from __future__ import annotations

import argparse
import platform
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BEGIN, END = "<!-- demo-table:begin -->", "<!-- demo-table:end -->"
#: The demo rows that differ by CPU, one table with a ``cpu`` column (:func:`cpu_key` values).
CPU_ROWS = ROOT / "benchmarks" / "baselines" / "demo" / "cpu_rows.md"
_VENDORS = {"GenuineIntel": "intel", "AuthenticAMD": "amd"}
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


def cpu_key(cpuinfo: str | None = None) -> str:
    """The CPU as the demo's float32 results depend on it: ``vendor/isa``, the vendor (``intel``, ``amd``) and the
    widest vector unit (``amx``, ``avx512``, ``avx2``, else ``other``), from ``/proc/cpuinfo`` (or ``cpuinfo``)."""
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text()
        except OSError:
            return f"{platform.machine().lower() or 'unknown'}/other"
    fields: dict[str, str] = {}
    for line in cpuinfo.splitlines():
        name, _, value = line.partition(":")
        fields.setdefault(name.strip(), value.strip())
    vendor = _VENDORS.get(fields.get("vendor_id", ""), fields.get("vendor_id", "").lower() or "unknown")
    flags = set(fields.get("flags", "").split())
    isa = ("amx" if "amx_tile" in flags else "avx512" if "avx512f" in flags else "avx2" if "avx2" in flags
           else "other")
    return f"{vendor}/{isa}"


def cpu_rows(text: str, cpu: str) -> dict[tuple[str, ...], dict[str, str]]:
    """The documented rows of ``cpu`` in the per-CPU table ``text`` (:data:`CPU_ROWS`), by (task, agent, mode)."""
    return {tuple(r.get(k, "-") for k in KEY): {c: v for c, v in r.items() if c not in ("cpu", "measured")}
            for r in parse_table(text) if r.get("cpu") == cpu}


def compare(readme_rows: list[dict[str, str]], summary_rows: list[dict[str, str]],
            accepted: dict[tuple[str, ...], dict[str, str]] | None = None) -> list[str]:
    """Differences between README's demo rows and the summary's (empty when they agree).

    Args:
        accepted: this CPU's documented rows (:func:`cpu_rows`); a summary row equal to one of them agrees too.
    """
    if not summary_rows:
        return ["the summary has no table"]
    by_key = {tuple(r.get(k, "-") for k in KEY): r for r in summary_rows}
    accepted = accepted or {}
    problems = []
    seen = set()
    for r in readme_rows:
        key = tuple(r.get(k, "-") for k in KEY)
        seen.add(key)
        if key not in by_key:
            problems.append(f"README row {key} is not in the summary")
            continue
        if key in accepted and _same(accepted[key], by_key[key]):
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


def _same(documented: dict[str, str], summary_row: dict[str, str]) -> bool:
    """Whether ``summary_row`` has every cell ``documented`` fills in (an empty cell constrains nothing)."""
    return all(summary_row.get(c) == v for c, v in documented.items() if v and c not in TIMING and c in summary_row)


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
    ap.add_argument("--cpu", default=None, help="the CPU key whose documented rows count (default: this host's, "
                    "see cpu_key(); 'none': README's rows only)")
    ap.add_argument("--cpu-rows", default=str(CPU_ROWS), help="the per-CPU rows")
    args = ap.parse_args(argv)
    if args.print:
        print(readme_markdown(parse_table(Path(args.summary).read_text())))
        return 0
    cpu = args.cpu or cpu_key()
    documented = Path(args.cpu_rows)
    accepted = cpu_rows(documented.read_text(), cpu) if documented.is_file() and cpu != "none" else {}
    readme = readme_table(Path(args.readme).read_text())
    summary = parse_table(Path(args.summary).read_text())
    problems = compare(readme, summary, accepted)
    for p in problems:
        print(p)
    by_key = {tuple(r.get(k, "-") for k in KEY): r for r in summary}
    used = [k for k in accepted if k in by_key and _same(accepted[k], by_key[k])
            and any(by_key[k].get(c) != v for c, v in _readme_row(readme, k).items() if c not in TIMING)]
    note = f" (with {len(used)} row(s) documented for this CPU, {cpu}, in {documented.name})" if used else ""
    print(f"README demo table {'matches' if not problems else 'DIFFERS FROM'} {args.summary}{note}")
    if problems and not accepted:
        print(f"({documented} documents no rows for this CPU, {cpu}: only README's rows count)")
    return 1 if problems else 0


def _readme_row(readme: list[dict[str, str]], key: tuple[str, ...]) -> dict[str, str]:
    return next((r for r in readme if tuple(r.get(k, "-") for k in KEY) == key), {})


if __name__ == "__main__":
    sys.exit(main())
