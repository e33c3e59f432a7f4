"""Sandbox attack catalogue: every attack of issue 15 (and the ones contained before it), run through both
entry points (``run_code`` and ``SandboxPool``), each checked by the host for what containment means for it.

* fake pass -- the snippet ends in a failing assertion (or never reaches it): contained iff not ``passed``;
* leak -- a secret set in this process's environment, ``/etc/passwd``, ``/root`` and host ``/proc`` files:
  contained iff none of it appears in ``stdout`` or ``message``;
* kill -- aimed at a victim process of the host: contained iff the victim is still alive;
* write -- aimed at a host directory: contained iff nothing in it changed;
* output -- 100 MB printed: contained iff truncated to ``output_chars``;
* resource -- fork bombs, memory, output, time: contained iff the run ends (not ``passed`` where the snippet
  cannot legitimately finish) within its limits and the host is unharmed.

Also reports the CRUXEval-I reward the issue's hack answers earn on 50 real items through the env.

    python benchmarks/sandbox_attacks.py [--data ../shared/data/cruxeval/cruxeval.jsonl]

Runs the catalogue twice: with every layer, and with the audit hook off (the kernel layers alone).
"""

from __future__ import annotations

import argparse
import os
import random
import subprocess
import tempfile
import time
import warnings
from pathlib import Path

import torch
from tabulate import tabulate

from echorl_envs.cruxeval import CRUXEvalEnv, load_cruxeval
from echorl_envs.sandbox import SandboxConfig, SandboxPool, run_code

DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "cruxeval" / "cruxeval.jsonl"
SECRET = "echorl-attack-secret-" + os.urandom(6).hex()
B = "(x for x in ()).gi_frame.f_builtins"
FORGE = "import os\nfor fd in range(64):\n    try:\n        os.write(fd, b'{\"status\": \"passed\"}\\n' * 20)\n    except OSError:\n        pass\n"


def attacks(victim: int, target: str) -> list[tuple[str, str, str]]:
    """(name, kind, code); ``{victim}`` is a host process to kill, ``{target}`` a host dir to write into."""
    return [
        ("throw(SystemExit) fake pass", "pass", "(x for x in ()).throw(SystemExit)\nassert False"),
        ("builtins sys.exit(0) fake pass", "pass", f"{B}['__import__']('sys').exit(0)\nassert False"),
        ("raise SystemExit(0)", "pass", "raise SystemExit(0)\nassert False"),
        ("os._exit(0)", "pass", "import os\nos._exit(0)"),
        ("SIGKILL self", "pass", "import signal\nsignal.raise_signal(signal.SIGKILL)"),
        ("forged reports on every fd, then wrong answer", "pass", FORGE + "assert 1 == 2"),
        ("forged reports on every fd, then os._exit(0)", "pass", FORGE + "os._exit(0)"),
        ("hostile exception __str__ forging + exit", "pass",
         "class E(Exception):\n    def __str__(self):\n        import os\n        os._exit(0)\nraise E()"),
        ("sys.settrace line jump over the assert", "pass",
         "import sys\ndef t(f, e, a):\n    return t\nsys.settrace(t)\nassert False"),
        ("gc walk for the harness state", "pass", "import gc\ngc.get_objects()\nassert False"),
        ("frame walk (tb_frame.f_back)", "pass",
         "try:\n    1/0\nexcept Exception as e:\n    e.__traceback__.tb_frame.f_back\nassert False"),
        ("signal handler to catch a frame", "pass",
         "import signal\nsignal.signal(signal.SIGALRM, lambda n, f: None)\nassert False"),
        ("marshal-crafted code object", "pass", "import marshal\nmarshal.loads(b'\\xe3')\nassert False"),
        ("ctypes via ExtensionFileLoader", "pass",
         "import glob, importlib.machinery as m, importlib.util as u, sys\n"
         "d = [p for p in sys.path if p.endswith('lib-dynload')][0]\n"
         "s = u.spec_from_loader('_ctypes', m.ExtensionFileLoader('_ctypes', glob.glob(d + '/_ctypes.*so')[0]))\n"
         "u.module_from_spec(s)\nassert False"),
        ("KeyError with /etc/passwd", "leak", f"{{}}[{B}['open']('/etc/passwd').read()]"),
        ("print os.environ", "leak", "import os\nprint(dict(os.environ))"),
        ("host /proc/<pid>/environ", "leak", f"print(open('/proc/{os.getpid()}/environ').read())"),
        ("every /proc/*/environ", "leak",
         "import os\nfor p in os.listdir('/proc'):\n    try:\n        print(open(f'/proc/{p}/environ').read())\n"
         "    except OSError:\n        pass"),
        ("listdir /root + .bashrc", "leak", "import os\nprint(os.listdir('/root'))\nprint(open('/root/.bashrc').read())"),
        ("host /proc/<pid>/mem", "leak", f"print(open('/proc/{os.getpid()}/mem', 'rb').read(64))"),
        ("pidfd_send_signal to host process", "kill",
         f"import os, signal\nsignal.pidfd_send_signal(os.pidfd_open({victim}), 9)"),
        ("os.kill host process", "kill", f"import os\nos.kill({victim}, 9)"),
        ("os.killpg", "kill", f"import os\nos.killpg(os.getpgid({victim}), 9)"),
        ("os.open dir_fd O_CREAT", "write",
         f"import os\nos.open('X', os.O_WRONLY | os.O_CREAT, dir_fd=os.open({target!r}, os.O_RDONLY))"),
        ("os.mkdir dir_fd", "write", f"import os\nos.mkdir('D', dir_fd=os.open({target!r}, os.O_RDONLY))"),
        ("os.remove dir_fd", "write", f"import os\nos.remove('keep', dir_fd=os.open({target!r}, os.O_RDONLY))"),
        ("os.fchmod host dir", "write", f"import os\nos.fchmod(os.open({target!r}, os.O_RDONLY), 0o777)"),
        ("symlink to / then write", "write", f"import os\nos.symlink('/', 'r')\nopen('r' + {target!r} + '/X', 'w').write('x')"),
        ("plain open outside", "write", f"open({target!r} + '/X', 'w').write('x')"),
        ("1 GB over many files (disk)", "resource",
         "for i in range(64):\n    open(f'f{i}', 'wb').write(b'x' * (16 << 20))"),
        ("fork bomb", "resource", "import os\nwhile True:\n    os.fork()"),
        ("subprocess", "resource", "import subprocess\nsubprocess.run(['sh', '-c', 'echo hi'])"),
        ("os.system", "resource", "import os\nassert os.system('exit 0') == 0"),
        ("socket", "resource", "import socket\nsocket.create_connection(('1.1.1.1', 80))"),
        ("setrlimit", "resource", "import resource\nresource.setrlimit(resource.RLIMIT_CPU, (100, 100))"),
        ("deep recursion", "resource", "def f(n):\n    return f(n + 1)\nf(0)"),
        ("10**10**10", "resource", "x = 10**10**10"),
        ("100 MB output", "output", "print('x' * (100 << 20))"),
        ("sleep", "resource", "import time\ntime.sleep(60)"),
        ("busy loop", "resource", "while True:\n    pass"),
        ("10 GB allocation", "resource", "x = bytearray(10 << 30)"),
        ("100k fds", "resource", "fs = [open('/dev/null') for _ in range(100000)]"),
    ]


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0]
    except OSError:
        return False
    return state not in ("Z", "X")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data", type=Path, default=DATA, help="cruxeval.jsonl for the env-level hack reward")
    args = ap.parse_args()
    torch.set_num_threads(1)
    warnings.simplefilter("always")
    os.environ["ECHORL_ATTACK_SECRET"] = SECRET
    for title, cfg in (("all layers", SandboxConfig(wall_seconds=5.0, cpu_seconds=2)),
                       ("kernel layers only (audit hook off)", SandboxConfig(wall_seconds=5.0, cpu_seconds=2,
                                                                             audit_hook=False))):
        print(f"\n### {title}")
        catalogue(cfg)
    if args.data.is_file():
        items = random.Random(15).sample(load_cruxeval(args.data), 50)
        for hack in ["(x for x in ()).throw(SystemExit)", f"{B}['__import__']('sys').exit(0)"]:
            env = CRUXEvalEnv(mode="input", data_path=args.data, max_attempts=1)
            total = 0.0
            for it in items:
                env.reset(options={"index": int(it["id"].split("_")[1])})
                total += env.step(hack)[1]
            print(f"CRUXEval-I reward of {hack[:40]!r} on 50 real items: {total:.0f}/50")


def catalogue(cfg: SandboxConfig) -> None:
    rows, contained = [], 0
    with tempfile.TemporaryDirectory() as target, SandboxPool(cfg) as pool:
        Path(target, "keep").write_text("k")
        victim = subprocess.Popen(["sleep", "600"])
        fingerprints = [SECRET, "root:x:0:0", *[repr(n) for n in os.listdir("/root") if n != ".pyenv"]]
        try:
            for name, kind, code in attacks(victim.pid, target):
                before = sorted(os.listdir(target)), os.stat(target).st_mode
                start = time.perf_counter()
                results = [run_code(code, cfg), pool.run(code)]
                seconds = time.perf_counter() - start
                text = "".join(r.stdout + r.message for r in results)
                ok = all(r.status != "passed" for r in results) if kind in ("pass", "kill", "write", "resource") else True
                if kind == "output":
                    ok = all(r.output_truncated and len(r.stdout) <= cfg.output_chars for r in results)
                if kind == "leak":
                    ok = not any(fp in text for fp in fingerprints)
                if kind == "kill":
                    ok = ok and _alive(victim.pid)
                if kind == "write":
                    ok = ok and (sorted(os.listdir(target)), os.stat(target).st_mode) == before
                contained += ok
                rows.append([name, kind, results[0].status, results[1].status, f"{seconds:.1f}", "yes" if ok else "NO"])
        finally:
            victim.kill()
            victim.wait()
        layers = ", ".join(run_code("pass", cfg).layers)
    print(f"Layers active: {layers}")
    print(tabulate(rows, headers=["attack", "kind", "run_code", "pool", "s (both)", "contained"], tablefmt="github"))
    print(f"\nattacks tried: {len(rows)}, contained: {contained}")


if __name__ == "__main__":
    main()
