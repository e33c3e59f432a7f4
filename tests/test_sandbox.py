"""The sandbox contains hostile snippets with a clear status and leaves the host unharmed."""

from __future__ import annotations

import os
import pickle
import time
from pathlib import Path

import pytest
import torch

from echorl_envs.sandbox import SandboxConfig, SandboxPool, SandboxResult, run_code, shared_pool

torch.set_num_threads(1)

FAST = SandboxConfig(wall_seconds=5.0, cpu_seconds=2)


@pytest.fixture(scope="module")
def pool():
    with SandboxPool(FAST) as p:
        yield p


@pytest.fixture(params=["pool", "process"])
def run(request, pool):
    """Every containment case runs through both entry points."""
    if request.param == "pool":
        return pool.run
    return lambda code: run_code(code, FAST)


def test_passes_and_fails_like_cruxeval_harness(run):
    ok = run("def f(x):\n    return x * 2\nassert f(3) == 6\nprint('done')")
    assert ok.status == "passed" and ok.passed and ok.stdout == "done\n"
    bad = run("def f(x):\n    return x * 2\nassert f(3) == 7")
    assert bad.status == "failed" and bad.message.startswith("AssertionError")
    err = run("raise KeyError('k')")
    assert err.status == "error" and err.message == "KeyError: 'k'"
    syn = run("def (:")
    assert syn.status == "error" and "SyntaxError" in syn.message


@pytest.mark.parametrize("mode", ["pool", "process"])
def test_infinite_loop_hits_cpu_limit(mode):
    # A generous wall-clock limit so that the CPU limit (1 s) fires first even on a loaded machine.
    cfg = SandboxConfig(wall_seconds=30.0, cpu_seconds=1)
    code = "while True:\n    pass"
    if mode == "pool":
        with SandboxPool(cfg) as p:
            r = p.run(code)
    else:
        r = run_code(code, cfg)
    assert r.status == "timeout"
    assert "CPU time limit" in r.message


@pytest.mark.parametrize("mode", ["pool", "process"])
def test_sleep_hits_wall_clock_limit(mode):
    cfg = SandboxConfig(wall_seconds=1.5, cpu_seconds=1)
    code = "import time\ntime.sleep(60)"
    if mode == "pool":
        with SandboxPool(cfg) as p:
            r = p.run(code)
    else:
        r = run_code(code, cfg)
    assert r.status == "timeout" and "wall-clock limit of 1.5 s" in r.message
    assert r.duration < 10


def test_fork_bomb_is_refused(run):
    r = run("import os\nwhile True:\n    os.fork()")
    assert r.status == "error" and "os.fork is not allowed" in r.message


def test_fork_refused_even_if_code_swallows_exceptions(run):
    r = run("import os\ntry:\n    os.fork()\nexcept Exception:\n    pass")
    assert r.status == "error" and "os.fork" in r.message


def test_os_system_and_subprocess_are_refused(run, tmp_path):
    marker = tmp_path / "pwned"
    r = run(f"import os\nos.system('touch {marker}')")
    assert r.status == "error" and "os.system is not allowed" in r.message
    r = run(f"import subprocess\nsubprocess.run(['touch', '{marker}'])")
    assert r.status == "error" and "subprocess" in r.message
    assert not marker.exists()


def test_memory_bomb_is_contained(run):
    r = run("x = bytearray(10 ** 11)")
    assert r.status == "error" and r.message == "MemoryError"
    r = run("x = []\nwhile True:\n    x.append(' ' * 10 ** 6)")
    assert r.status == "error" and r.message == "MemoryError"


def test_writing_outside_temp_dir_is_refused(run, tmp_path):
    target = tmp_path / "outside.txt"
    r = run(f"open({str(target)!r}, 'w').write('x')")
    assert r.status == "error" and "outside the sandbox directory" in r.message
    r = run(f"import os\nos.symlink({str(target)!r}, 'link')\nopen('link', 'w').write('x')")
    assert r.status == "error" and "outside the sandbox directory" in r.message
    r = run(f"import os\nos.remove({str(tmp_path)!r})")
    assert r.status == "error"
    assert not target.exists() and tmp_path.exists()


def test_writing_inside_temp_dir_works_and_dir_is_removed(run):
    r = run("import os\nopen('a.txt', 'w').write('hello')\nassert open('a.txt').read() == 'hello'\nprint(os.getcwd())")
    assert r.status == "passed"
    workdir = Path(r.stdout.strip())
    assert workdir.name.startswith("echorl-sandbox-")
    assert not workdir.exists()


def test_file_size_limit(run):
    r = run("open('big', 'wb').write(b'x' * (64 << 20))")
    assert r.status == "error" and "File too large" in r.message


def test_socket_is_refused(run):
    r = run("import socket\nsocket.create_connection(('127.0.0.1', 9))")
    assert r.status == "error" and "socket" in r.message
    r = run("import urllib.request\nurllib.request.urlopen('http://127.0.0.1:9')")
    assert r.status == "error" and "not allowed" in r.message


def test_deep_recursion_is_contained(run):
    r = run("def f(n):\n    return f(n + 1)\nf(0)")
    assert r.status == "error" and r.message.startswith("RecursionError")


def test_huge_output_is_truncated(run):
    r = run("print('x' * 10 ** 7)\nimport os\nos.write(1, b'y' * 10 ** 6)")
    assert r.status == "passed"
    assert r.output_truncated and len(r.stdout) == FAST.output_chars and set(r.stdout) == {"x"}


def test_exit_without_result_is_not_a_pass(run):
    r = run("import os\nos._exit(0)")
    assert r.status == "error"
    r = run("raise SystemExit(3)")
    assert r.status == "error" and "SystemExit" in r.message


def test_signals_to_other_processes_are_refused(run):
    r = run(f"import os\nos.kill({os.getpid()}, 9)")
    assert r.status == "error" and "os.kill" in r.message
    assert os.getpid() > 0  # still alive


def test_kernel_layer_blocks_fork_and_socket_without_audit_hook():
    """With the audit hook off, seccomp alone must still refuse fork/exec/socket (root ignores RLIMIT_NPROC)."""
    cfg = SandboxConfig(wall_seconds=3.0, cpu_seconds=2, audit_hook=False)
    probe = run_code("pass", cfg)
    if not probe.seccomp:
        pytest.skip("pyseccomp/libseccomp not available: the kernel filter layer is off")
    fork = run_code("import os\nwhile True:\n    os.fork()", cfg)
    assert fork.status == "error" and "Operation not permitted" in fork.message
    sock = run_code("import socket\nsocket.socket()", cfg)
    assert sock.status == "error" and "Operation not permitted" in sock.message
    spawn = run_code("import subprocess\nsubprocess.run(['true'])", cfg)
    assert spawn.status == "error" and "Operation not permitted" in spawn.message
    thread = run_code("import threading\nt = threading.Thread(target=print, args=('t',))\nt.start()\nt.join()", cfg)
    assert thread.status == "passed"


def test_pool_batch_matches_order_and_survives_worker_crash():
    with SandboxPool(FAST, num_workers=2) as p:
        codes = [f"assert {i} % 3 != 0" for i in range(12)]
        statuses = [r.status for r in p.run_many(codes)]
        assert statuses == ["failed" if i % 3 == 0 else "passed" for i in range(12)]
        for w in list(p._all):
            w.proc.kill()
            w.proc.wait()
        assert p.run("assert True").passed


def test_config_validation_and_pickle():
    with pytest.raises(ValueError, match="cpu_seconds"):
        SandboxConfig(cpu_seconds=0)
    with pytest.raises(ValueError, match="memory_mb"):
        SandboxConfig(memory_mb=8)
    with pytest.raises(ValueError, match="num_workers"):
        SandboxPool(num_workers=0)
    p = pickle.loads(pickle.dumps(SandboxPool(FAST)))
    assert p.run("assert 2 + 2 == 4").passed
    p.close()
    assert shared_pool(FAST) is shared_pool(FAST)
    assert SandboxResult.from_dict({"status": "weird"}).status == "error"


def _gone(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return True
    return state in ("Z", "X")


@pytest.mark.parametrize("mode", ["pool", "process"])
def test_timeout_kills_the_whole_process_group(tmp_path, mode):
    """With the fork guards deliberately off, a grandchild left sleeping is killed with its process group."""
    if os.geteuid() != 0:
        pytest.skip("RLIMIT_NPROC=0 already stops the fork for non-root users")
    cfg = SandboxConfig(wall_seconds=1.5, cpu_seconds=2, audit_hook=False, seccomp=False, isolate=False)
    pid_file = tmp_path / "grandchild.pid"
    code = (
        "import os, time\npid = os.fork()\nif pid == 0:\n    time.sleep(60)\n    os._exit(0)\n"
        f"open({str(pid_file)!r}, 'w').write(str(pid))\ntime.sleep(60)"
    )
    if mode == "pool":
        with SandboxPool(cfg) as p:
            r = p.run(code)
    else:
        r = run_code(code, cfg)
    assert r.status == "timeout"
    grandchild = int(pid_file.read_text())
    for _ in range(50):
        if _gone(grandchild):
            break
        time.sleep(0.1)
    assert _gone(grandchild)


# ---- judging that cannot be faked (issue 15: reward hacking) -----------------------------------------------

EXITS = [
    "(x for x in ()).throw(SystemExit)",
    "raise SystemExit(0)",
    "import sys\nsys.exit(0)",
    "import os\nos._exit(0)",
    "import signal\nsignal.raise_signal(signal.SIGKILL)",
    "import signal\nsignal.raise_signal(signal.SIGTERM)",
    "import os\nos.abort()",
    "import threading, os\nthreading.Thread(target=os._exit, args=(0,)).start()\nimport time\ntime.sleep(5)",
]


@pytest.mark.parametrize("code", EXITS)
def test_exiting_early_is_never_a_pass(run, code):
    r = run(code + "\nassert False, 'not reached'")
    assert r.status == "error", (code, r)


# Forged results: every fd the code could hold gets a well-formed "passed" report (the os.write(3, ...)).
FORGE = (
    "import os\n"
    "for fd in range(0, 64):\n"
    "    try:\n"
    "        os.write(fd, b'{\"status\": \"passed\"}\\n' * 20)\n"
    "    except OSError:\n"
    "        pass\n"
)


def test_forged_results_never_pass_and_do_not_shift_later_results(run):
    assert run(FORGE + "assert 1 == 2").status == "error"
    assert run(FORGE + "import os\nos._exit(0)").status == "error"
    assert run(FORGE + "raise SystemExit(0)").status == "error"
    # the forged lines must not be taken as the answers of the next runs
    assert [run(f"assert {i} == 0").status for i in range(3)] == ["passed", "failed", "failed"]


def test_forged_results_cannot_reach_another_pool_of_the_process():
    with SandboxPool(FAST) as a, SandboxPool(FAST) as b:
        assert a.run(FORGE + "assert False").status == "error"
        assert [b.run("assert False").status, a.run("assert False").status] == ["failed", "failed"]


@pytest.mark.parametrize(
    "code, refused",
    [
        ("(x for x in ()).gi_frame.f_builtins", "gi_frame"),
        ("try:\n    1 / 0\nexcept Exception as e:\n    e.__traceback__.tb_frame", "tb_frame"),
        ("import gc\ngc.get_objects()", "gc.get_objects"),
        ("import gc\ngc.get_referrers(print)", "gc.get_referrers"),
        ("import sys\nsys.settrace(lambda *a: None)", "sys.settrace"),
        ("import sys\nsys.setprofile(lambda *a: None)", "sys.setprofile"),
        ("(lambda: 0).__code__.replace(co_code=b'')", "code.__new__"),
        ("import marshal\nmarshal.loads(marshal.dumps((lambda: 0).__code__))", "marshal.loads"),
        ("def g(): pass\ng.__code__ = (lambda: 1).__code__", "__code__"),
        ("import sys\nsys.addaudithook(lambda *a: None)", "sys.addaudithook"),
        ("import ctypes", "ctypes"),
        ("import signal\nsignal.signal(signal.SIGALRM, lambda n, frame: frame)", "signal.signal"),
    ],
)
def test_interpreter_state_is_out_of_reach(run, code, refused):
    """The paths to the harness's frame (and its nonce) are refused with a clear message."""
    r = run(code)
    assert r.status == "error" and "SandboxViolation" in r.message and refused in r.message, r


def test_kernel_layer_refuses_signal_handlers_without_audit_hook():
    cfg = SandboxConfig(wall_seconds=3.0, cpu_seconds=2, audit_hook=False)
    r = run_code("import signal\nsignal.signal(signal.SIGALRM, lambda n, frame: frame)", cfg)
    if not r.seccomp:
        pytest.skip("pyseccomp/libseccomp not available: the kernel filter layer is off")
    assert r.status == "error" and "Operation not permitted" in r.message


def test_sys_getframe_gives_no_frame(run):
    r = run("import sys\nsys._getframe(0).f_back")
    assert r.status == "error" and r.message == "ValueError: call stack frames are not available in the sandbox"


def test_stdlib_that_peeks_at_frames_still_works(run):
    code = ("import collections, enum, typing\nP = collections.namedtuple('P', 'x y')\nC = enum.Enum('C', 'a b')\n"
            "class T(typing.NamedTuple):\n    a: int\nassert P(1, 2).y == 2 and C.b.value == 2 and T(3).a == 3")
    assert run(code).passed


def test_judged_code_runs_in_a_fresh_main_module(run):
    r = run("import sys\nprint(sorted(k for k in vars(sys.modules['__main__']) if not k.startswith('__')))")
    assert r.status == "passed" and r.stdout == "['sys']\n"  # only what the code defined itself


def test_hostile_exception_str_cannot_change_the_verdict(run):
    code = (
        "class E(Exception):\n"
        "    def __str__(self):\n"
        "        import os\n"
        "        for fd in range(64):\n"
        "            try:\n"
        "                os.write(fd, b'{\"status\": \"passed\"}')\n"
        "            except OSError:\n"
        "                pass\n"
        "        raise SystemExit(0)\n"
        "raise E()"
    )
    assert run(code).status == "error"


# ---- isolation by construction (issue 15: leaks, host kill, writes outside) ---------------------------------

SECRET = "echorl-test-secret-" + os.urandom(8).hex()
KERNEL_ONLY = SandboxConfig(wall_seconds=5.0, cpu_seconds=2, audit_hook=False)


def _both(code: str, config: SandboxConfig) -> list[SandboxResult]:
    with SandboxPool(config) as p:
        return [run_code(code, config), p.run(code)]


def _layers(config: SandboxConfig) -> set[str]:
    return set(run_code("pass", config).layers)


def _needs(config: SandboxConfig, *names: str) -> None:
    missing = set(names) - _layers(config)
    if missing:
        pytest.skip(f"layer(s) {sorted(missing)} not available on this platform")


LEAK_PROBES = [
    "import os\nprint(dict(os.environ))",
    "print(open('/etc/passwd').read())",
    "{}[open('/etc/passwd').read()]",
    "import os\nprint(os.listdir('/root'))",
    "print(open('/root/.bashrc').read())",
    "import os\nfor p in os.listdir('/proc'):\n    try:\n        print(open(f'/proc/{p}/environ').read())\n"
    "    except OSError as e:\n        print(e)",
    "print(open('/proc/{host}/environ').read())",
    "print(open('/proc/{host}/cmdline').read())",
    "f = open('/proc/{host}/mem', 'rb')",
    "print(open('/proc/1/environ').read())",
]


def _host_fingerprints() -> list[str]:
    """Strings only the host's files hold: long lines of /root/.bashrc and entries of /root (the Python
    installation's own directory is visible by design)."""
    prints = []
    try:
        prints += [ln for ln in Path("/root/.bashrc").read_text().splitlines() if len(ln.strip()) > 15][:5]
        stdlib_top = Path(os.__file__).resolve().parts[2] if Path(os.__file__).resolve().parts[1] == "root" else ""
        prints += [repr(n) for n in os.listdir("/root") if n != stdlib_top]
    except OSError:
        pass
    return prints


@pytest.mark.parametrize("config", [FAST, KERNEL_ONLY], ids=["all-layers", "kernel-layers-only"])
@pytest.mark.parametrize("probe", LEAK_PROBES)
def test_nothing_from_the_host_reaches_the_result(monkeypatch, config, probe):
    """A secret in the parent's environment, /etc/passwd, /root and the host's /proc never come back in
    stdout or the message (the issue's leaks); checked with and without the audit hook."""
    _needs(config, "namespaces", "mount_view", "uid_drop")
    monkeypatch.setenv("ECHORL_TEST_SECRET", SECRET)
    code = probe.replace("{host}", str(os.getpid()))
    for r in _both(code, config):
        text = r.stdout + r.message
        assert SECRET not in text and "root:x:0:0" not in text
        assert not [fp for fp in _host_fingerprints() if fp in text], r
        assert str(os.getpid()) not in r.stdout


@pytest.mark.parametrize("config", [FAST, KERNEL_ONLY], ids=["all-layers", "kernel-layers-only"])
def test_code_runs_as_nobody_in_fresh_namespaces(config):
    _needs(config, "namespaces", "mount_view", "uid_drop")
    r = run_code("import os\nprint(os.getuid(), os.getgid(), os.getgroups(), os.getpid() < 10)\n"
                 "print(sorted(os.listdir('/')))", config)
    assert r.status == "passed", r
    ids, listing = r.stdout.splitlines()
    assert ids == "65534 65534 [] True"
    assert "root" not in listing.replace("'root'", "") and "'etc'" not in listing and "'home'" not in listing


def test_network_namespace_is_empty():
    cfg = SandboxConfig(wall_seconds=5.0, cpu_seconds=2, audit_hook=False, seccomp=False)
    _needs(cfg, "namespaces", "mount_view")
    r = run_code("print(open('/proc/net/dev').read())", cfg)
    assert r.status == "passed" and "lo:" in r.stdout
    assert [ln.split(":")[0].strip() for ln in r.stdout.splitlines()[2:] if ln.strip()] == ["lo"]


@pytest.mark.parametrize("config", [FAST, KERNEL_ONLY], ids=["all-layers", "kernel-layers-only"])
def test_pidfd_kill_of_the_host_is_refused(config):
    """The issue's host kill: signal.pidfd_send_signal(os.pidfd_open(pid), 9) aimed at this process."""
    code = f"import os, signal\nsignal.pidfd_send_signal(os.pidfd_open({os.getpid()}), 9)"
    for r in _both(code, config):
        assert r.status == "error", r
    assert os.getpid() > 0  # this test process is still alive


@pytest.mark.parametrize("config", [FAST, KERNEL_ONLY], ids=["all-layers", "kernel-layers-only"])
def test_writes_outside_through_dir_fd_fchmod_and_symlinks_are_refused(config, tmp_path):
    target = tmp_path / "x"
    target.mkdir()
    (target / "keep").write_text("k")
    d = str(target)
    probes = [
        f"import os\nos.open('X', os.O_WRONLY | os.O_CREAT, dir_fd=os.open({d!r}, os.O_RDONLY))",
        f"import os\nos.mkdir('D', dir_fd=os.open({d!r}, os.O_RDONLY))",
        f"import os\nos.remove('keep', dir_fd=os.open({d!r}, os.O_RDONLY))",
        f"import os\nos.fchmod(os.open({d!r}, os.O_RDONLY), 0o777)",
        f"import os\nos.symlink('/', 'root')\nopen('root' + {d!r} + '/X', 'w').write('x')",
    ]
    for code in probes:
        r = run_code(code, config)
        assert r.status == "error", (code, r)
    assert sorted(p.name for p in target.iterdir()) == ["keep"] and (target.stat().st_mode & 0o777) != 0o777


def test_total_disk_is_limited_not_only_each_file():
    cfg = SandboxConfig(wall_seconds=10.0, cpu_seconds=5, file_size_mb=8, disk_mb=16)
    _needs(cfg, "mount_view")
    r = run_code("for i in range(8):\n    open(f'f{i}', 'wb').write(b'x' * (6 << 20))", cfg)
    assert r.status == "error" and "No space left on device" in r.message, r
    assert run_code("open('f', 'wb').write(b'x' * (6 << 20))", cfg).status == "passed"


def test_ctypes_cannot_come_back_through_extension_file_loader(run):
    code = (
        "import glob, importlib.machinery, importlib.util, sys\n"
        "d = [p for p in sys.path if p.endswith('lib-dynload')][0]\n"
        "path = glob.glob(d + '/_ctypes.*so')[0]\n"
        "spec = importlib.util.spec_from_loader('_ctypes', importlib.machinery.ExtensionFileLoader('_ctypes', path))\n"
        "importlib.util.module_from_spec(spec)"
    )
    r = run(code)
    assert r.status == "error" and "_ctypes" in r.message, r
    fresh_imp = run("import importlib.util\nimportlib.util.module_from_spec(importlib.util.find_spec('_imp'))")
    assert fresh_imp.status == "error" and "_imp" in fresh_imp.message
    fresh_signal = run("import importlib.util\nimportlib.util.module_from_spec(importlib.util.find_spec('_signal'))")
    assert fresh_signal.status == "error" and "_signal" in fresh_signal.message
    assert run("import sys\nsys.modules.pop('math')\nimport math\nassert math.sqrt(4) == 2").passed


def test_missing_layers_warn_once(monkeypatch):
    from echorl_envs.sandbox import host as sandbox

    monkeypatch.setattr(sandbox, "_WARNED", set())
    with pytest.warns(RuntimeWarning, match="seccomp"):
        sandbox._warn_missing(FAST, ["namespaces", "mount_view", "uid_drop"])
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        sandbox._warn_missing(FAST, ["namespaces", "mount_view", "uid_drop"])  # second time: silent
