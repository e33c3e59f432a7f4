"""The ``curl`` lines of README.md and docs/ work: each is run, with real curl, against a real ``echorl serve-env``
on a loopback port, and answers the status its comment states (``# 409 ...``; no number: 200).

A code block's ``echorl serve-env --task ...`` line says which ids the server hosts (else the ids its curl lines
name, else MiniGrid); the documented address (``127.0.0.1``, ``localhost`` or ``host``, any port) is replaced by
the test server's.
"""

from __future__ import annotations

import json
import re
import shlex
import shutil
import subprocess

import pytest

from tests.openenv_server import running_server
from tests.test_docs_commands import DOCS, FENCE, ROOT

CURL = shutil.which("curl")
ADDRESS = re.compile(r"https?://(?:127\.0\.0\.1|localhost|host|HOST)(?::\d+)?")
EXPECTED = re.compile(r"^\s*(\d{3})\b")
IDS = re.compile(r"EchoRL/[\w.-]+-v\d+")


class CurlBlock:
    """The curl lines of one code block and the ids its server must host."""

    def __init__(self, where: str, text: str) -> None:
        self.where = where
        joined = re.sub(r"\\\n\s*", " ", text)
        self.lines = [ln.strip() for ln in joined.splitlines() if ln.strip().startswith("curl ")]
        serve = next((ln for ln in joined.splitlines() if "echorl serve-env" in ln), "")
        self.tasks = list(dict.fromkeys(re.findall(r"--task\s+(\S+)", serve) or IDS.findall(joined)
                                        or ["EchoRL/MiniGrid-Empty-5x5-v0"]))


def curl_blocks() -> list[CurlBlock]:
    out = []
    for path in DOCS:
        text = path.read_text()
        for m in FENCE.finditer(text):
            if re.search(r"^\s*curl ", m.group(2), re.M):
                out.append(CurlBlock(f"{path.relative_to(ROOT).as_posix()}:{text.count(chr(10), 0, m.start()) + 1}",
                                     m.group(2)))
    return out


def run_curl(line: str, url: str) -> tuple[int, str]:
    """Run one documented curl line against ``url``; (HTTP status, body)."""
    args = shlex.split(ADDRESS.sub(url, line), comments=True)
    assert args[0] == "curl" and "-f" not in args
    done = subprocess.run([CURL, *args[1:], "-w", "\n%{http_code}", "--max-time", "60"], capture_output=True,
                          text=True, timeout=90)
    assert done.returncode == 0, done.stderr
    body, _, status = done.stdout.rpartition("\n")
    return int(status), body


def test_the_docs_have_curl_lines():
    assert sum(len(b.lines) for b in curl_blocks()) >= 4


@pytest.mark.skipif(CURL is None, reason="no curl on this machine")
@pytest.mark.parametrize("block", curl_blocks(), ids=lambda b: b.where)
def test_documented_curl_lines_answer_what_their_comment_says(block):
    with running_server(block.tasks) as url:
        for line in block.lines:
            status, body = run_curl(line, url)
            stated = EXPECTED.search(line.split(" #", 1)[1]) if " #" in line else None
            expected = int(stated.group(1)) if stated else 200
            assert status == expected, f"{block.where}: {line}\n-> {status} {body[:300]}"
            assert status < 500


@pytest.mark.skipif(CURL is None, reason="no curl on this machine")
def test_the_documented_curl_answers_carry_the_explanations():
    block = next(b for b in curl_blocks() if b.where.startswith("docs/plug-serving.md"))
    with running_server(block.tasks) as url:
        replies = [run_curl(line, url) for line in block.lines]
    assert replies[0] == (200, '{"status":"healthy"}')
    first = json.loads(replies[1][1])
    assert first["done"] is False and "go forward" in first["observation"]["admissible_actions"]
    assert "/ws" in replies[2][1] and "GenericEnvClient" in replies[2][1]
    assert '{\\"action\\": {\\"action\\": \\"<text>\\"}}' in replies[3][1]
