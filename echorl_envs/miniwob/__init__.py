"""MiniWoB++ (Farama's ``miniwob`` package, a real headless Chromium through Selenium) behind the text protocol.

Needs the ``miniwob`` extra (``pip install 'echorl[miniwob]'``) and a Chromium with its chromedriver
(``apt-get install chromium chromium-driver``; ``make install-browser``). Importing this module needs neither:
the browser starts at an env's first ``reset``.
"""

from __future__ import annotations

from echorl_envs.miniwob.browser import BrowserNotFound, chromium_missing_reason, find_chromium
from echorl_envs.miniwob.env import MiniWoBEnv, miniwob_tasks
from echorl_envs.miniwob.experts import EXPERTS

__all__ = ["TASKS", "EXPERTS", "MiniWoBEnv", "BrowserNotFound", "chromium_missing_reason", "find_chromium",
           "miniwob_tasks"]

#: Registered tasks: MiniWoB task name -> (kind, max episode steps). Kinds: click, select (choose among
#: options), type, form (several fields then submit, or several pages).
TASKS: dict[str, tuple[str, int]] = {
    "click-test": ("click", 5),
    "click-test-2": ("click", 5),
    "click-button": ("click", 5),
    "click-button-sequence": ("click", 8),
    "click-link": ("click", 5),
    "click-dialog": ("click", 5),
    "click-dialog-2": ("click", 5),
    "click-tab": ("click", 5),
    "click-widget": ("click", 5),
    "click-collapsible-nodelay": ("click", 8),
    "focus-text": ("click", 5),
    "focus-text-2": ("click", 5),
    "click-option": ("select", 8),
    "click-checkboxes": ("select", 12),
    "choose-list": ("select", 8),
    "enter-text": ("type", 8),
    "enter-text-2": ("type", 8),
    "enter-text-dynamic": ("type", 8),
    "enter-password": ("form", 10),
    "login-user": ("form", 10),
    "login-user-popup": ("form", 12),
    "use-autocomplete-nodelay": ("form", 10),
    "search-engine": ("form", 15),
    "email-inbox": ("form", 15),
}
