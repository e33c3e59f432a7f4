"""Headless Chromium for MiniWoB++: discovery, the Selenium instance, lifecycle (lazy start, close, atexit).

The task pages and their JavaScript are the ``miniwob`` package's own (Farama, 1.1.0); this module only decides
how Chromium is launched (flags that work as root in containers, a fresh profile per browser) and makes sure no
browser outlives its env: :meth:`MiniWoBBrowser.close` quits the driver, kills any process of the browser's
tree still alive and removes the profile; browsers still open at interpreter exit are closed by an ``atexit``
hook (only in the process that started them, so a forked worker never closes its parent's browsers).
"""

from __future__ import annotations

import atexit
import contextlib
import os
import shutil
import tempfile
import threading
import weakref
from typing import Any

__all__ = ["CHROMIUM_FLAGS", "BrowserNotFound", "MiniWoBBrowser", "find_chromium", "chromium_missing_reason"]

#: Flags that run Chromium headless as root in a container, offline, without background services.
CHROMIUM_FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",
)
_BINARIES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
_INSTALL_HINT = (
    "install Chromium and its driver (Debian/Ubuntu: `apt-get install chromium chromium-driver`; "
    "`make install-browser` does it when run as root) or point ECHORL_CHROMIUM and ECHORL_CHROMEDRIVER at them"
)


class BrowserNotFound(RuntimeError):
    """No Chromium/chromedriver pair was found on this machine."""


def find_chromium() -> tuple[str, str] | None:
    """``(chromium binary, chromedriver)`` from ``$ECHORL_CHROMIUM``/``$ECHORL_CHROMEDRIVER`` or ``PATH``."""
    binary = os.environ.get("ECHORL_CHROMIUM") or next(filter(None, map(shutil.which, _BINARIES)), None)
    driver = os.environ.get("ECHORL_CHROMEDRIVER") or shutil.which("chromedriver")
    if binary and driver and os.access(binary, os.X_OK) and os.access(driver, os.X_OK):
        return binary, driver
    return None


def chromium_missing_reason() -> str | None:
    """Why MiniWoB envs cannot run here (None when they can): the missing package or browser."""
    try:
        import miniwob  # noqa: F401
        import selenium  # noqa: F401
    except ImportError as e:
        return f"the MiniWoB++ envs need the `miniwob` extra (pip install 'echorl[miniwob]'): {e}"
    if find_chromium() is None:
        return "no Chromium/chromedriver found: " + _INSTALL_HINT
    return None


# ----------------------------------------------------------------------------- lifecycle registry
_LIVE: weakref.WeakSet[MiniWoBBrowser] = weakref.WeakSet()
_LOCK = threading.Lock()


@atexit.register
def _close_all() -> None:
    for browser in list(_LIVE):
        if browser.owner_pid == os.getpid():
            browser.close()


def _process_tree(pid: int) -> list[int]:
    import psutil

    try:
        root = psutil.Process(pid)
        return [pid, *(c.pid for c in root.children(recursive=True))]
    except psutil.Error:
        return []


def _kill(pids: list[int]) -> None:
    import psutil

    procs = []
    for pid in pids:
        with contextlib.suppress(psutil.Error):
            p = psutil.Process(pid)
            p.kill()
            procs.append(p)
    psutil.wait_procs(procs, timeout=5)


#: Resolves after two hops of the page's task queue, so timers an action scheduled with delay 0 (and the zero-delay
#: timers those schedule) have run; longer delays (a task's own animation or debounce) are left to the task.
_SETTLE_JS = "const done = arguments[arguments.length - 1]; setTimeout(() => setTimeout(done, 0), 0);"


def _make_instance_class() -> type:
    """The ``SeleniumInstance`` subclass (built lazily so importing echorl_envs never needs selenium)."""
    from miniwob.selenium_instance import SeleniumInstance
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as ec
    from selenium.webdriver.support.wait import WebDriverWait

    class _Instance(SeleniumInstance):
        """MiniWoB's instance with our launch: explicit binaries, container flags, fresh profile, episode time."""

        def __init__(self, *, chromium: tuple[str, str], episode_ms: int, **kwargs: Any) -> None:
            super().__init__(**kwargs)
            self.chromium = chromium
            self.episode_ms = episode_ms
            self.profile_dir: str | None = None
            self.driver_pid: int | None = None

        def create_driver(self) -> None:
            opts = webdriver.ChromeOptions()
            for flag in CHROMIUM_FLAGS:
                opts.add_argument(flag)
            self.profile_dir = tempfile.mkdtemp(prefix="echorl-chromium-")
            opts.add_argument(f"--user-data-dir={self.profile_dir}")
            opts.add_argument(f"--window-size={self.window_width},{self.window_height}")
            opts.binary_location = self.chromium[0]
            # chromedriver and Chromium die with this process even when it is SIGKILLed: chromedriver starts a
            # session of its own (Chromium joins its process group) and a reaper kills that group when we die
            from echorl_envs.core.lifeline import reap_group_with_this_process

            service = Service(executable_path=self.chromium[1], popen_kw={"start_new_session": True})
            self.driver = webdriver.Chrome(service=service, options=opts)
            self.driver_pid = service.process.pid
            # (create_driver runs on this instance's own thread, which lives until close)
            self.reaper = reap_group_with_this_process(self.driver_pid, thread_outlives_group=True)
            self.driver.get(self.url)
            WebDriverWait(self.driver, 30).until(ec.element_to_be_clickable((By.ID, self.SYNC_SCREEN_ID)))
            # MiniWoB's own episode limit (core.EPISODE_MAX_TIME, 10 s by default) -- set once per page load.
            self.driver.execute_script(f"core.EPISODE_MAX_TIME = {int(self.episode_ms)};")
            self.inner_width, self.inner_height = self.driver.execute_script(
                "return [window.innerWidth, window.innerHeight];"
            )

        def perform(self, action: Any, action_space_config: Any) -> None:
            super().perform(action, action_space_config)
            # Let the page's zero-delay timers run before the DOM is read: a widget that reacts to a key through
            # setTimeout(..., 0) (jQuery UI's autocomplete with delay 0) would otherwise show up in the next
            # observation or not depending on how fast the next action came -- and a replayed clone would differ.
            self.driver.execute_async_script(_SETTLE_JS)

        @property
        def pids(self) -> list[int]:
            return _process_tree(self.driver_pid) if self.driver_pid is not None else []

        def close(self) -> None:
            tree = self.pids  # before quit(): chromium's processes are the driver's children
            driver = getattr(self, "driver", None)
            if driver is not None:
                with contextlib.suppress(Exception):
                    driver.quit()
            _kill(tree)  # whatever quit() left behind (a hung or half-crashed browser)
            reaper = getattr(self, "reaper", None)
            if reaper is not None:  # it exits once the group is gone; collect it
                with contextlib.suppress(Exception):
                    reaper.kill()
                    reaper.wait(timeout=5)
            if self.profile_dir:
                shutil.rmtree(self.profile_dir, ignore_errors=True)
            self.died = True

    return _Instance


class MiniWoBBrowser:
    """One headless Chromium running one MiniWoB task page through ``miniwob.MiniWoBEnvironment``.

    Started by :meth:`start` (the env calls it lazily, at the first ``reset``), closed by :meth:`close`
    (idempotent) or at interpreter exit. ``env`` is the real ``miniwob`` gymnasium env; its reward processor
    is MiniWoB's raw reward (see :class:`~echorl_envs.miniwob.MiniWoBEnv` for why).
    """

    def __init__(self, task: str, episode_ms: int = 10_000) -> None:
        self.task = task
        self.episode_ms = episode_ms
        self.env: Any = None
        self.owner_pid = os.getpid()

    @property
    def started(self) -> bool:
        return self.env is not None

    @property
    def pids(self) -> list[int]:
        """Process ids of chromedriver and the browser it started (empty before :meth:`start`)."""
        return list(self.env.instance.pids) if self.env is not None else []

    def start(self) -> None:
        chromium = find_chromium()
        if chromium is None:
            raise BrowserNotFound("MiniWoB++ needs a Chromium browser: " + _INSTALL_HINT)
        from miniwob.environment import MiniWoBEnvironment
        from miniwob.reward import get_raw_reward

        instance_cls = _make_instance_class()
        episode_ms = self.episode_ms

        class _Env(MiniWoBEnvironment):
            def _hard_reset_instance(self) -> None:
                if getattr(self, "instance", None) is not None:
                    self.instance.close()
                self.instance = instance_cls(index=0, chromium=chromium, episode_ms=episode_ms, **self.instance_kwargs)
                try:
                    self.instance.start()  # non-threaded instance: start() is create_driver()
                except BaseException:
                    self.instance.close()
                    raise

        self.env = _Env(subdomain=self.task, reward_processor=get_raw_reward)
        self.env.set_record_screenshots(False)  # text observations: no screenshot per step
        self.owner_pid = os.getpid()
        with _LOCK:
            _LIVE.add(self)

    def alive(self) -> bool:
        """True when the browser answers a trivial script (False when it crashed or was killed)."""
        if self.env is None:
            return False
        try:
            return self.env.instance.driver.execute_script("return 1;") == 1
        except Exception:
            return False

    def close(self) -> None:
        env, self.env = self.env, None
        if env is not None:
            env.instance.close()
        with _LOCK:
            _LIVE.discard(self)

    def __del__(self) -> None:
        if getattr(self, "owner_pid", None) == os.getpid():
            with contextlib.suppress(Exception):
                self.close()
