"""The ``/web`` page of ``echorl serve-env`` played by a person in real headless Chromium (Debian ``chromium`` +
``chromium-driver``, driven by Selenium): reset, type an action, see the observation and admissible actions."""

from __future__ import annotations

import shutil
import tempfile

import pytest

from tests.openenv_server import running_server

CHROMIUM, CHROMEDRIVER = shutil.which("chromium"), shutil.which("chromedriver")
pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not (CHROMIUM and CHROMEDRIVER),
                       reason="needs Debian's chromium and chromium-driver (make install-browser)"),
]
MINIGRID = "EchoRL/MiniGrid-DoorKey-5x5-v0"


@pytest.fixture
def browser():
    webdriver = pytest.importorskip("selenium.webdriver", reason="selenium is not installed (the miniwob extra)")
    opts = webdriver.ChromeOptions()
    opts.binary_location = CHROMIUM
    profile = tempfile.mkdtemp(prefix="echorl-chromium-")
    for flag in ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync",
                 "--disable-dev-shm-usage", f"--user-data-dir={profile}", "--window-size=1400,2400"):
        opts.add_argument(flag)
    driver = webdriver.Chrome(service=webdriver.ChromeService(executable_path=CHROMEDRIVER), options=opts)
    try:
        yield driver
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)


def test_a_person_plays_an_episode_on_the_web_page(browser):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys
    from selenium.webdriver.support import expected_conditions as ec
    from selenium.webdriver.support.ui import WebDriverWait

    wait = WebDriverWait(browser, 60)

    def shown() -> str:
        return browser.find_element(By.CSS_SELECTOR, ".echorl-obs").text

    with running_server([MINIGRID, "EchoRL/Game24-v0"], web=True) as url:
        browser.get(url + "/web/")
        reset = wait.until(ec.element_to_be_clickable((By.XPATH, "//button[normalize-space()='Reset']")))
        # the page names the served ids and the address it really serves on (not OpenEnv's localhost:8000)
        header = browser.find_element(By.CSS_SELECTOR, ".oe-header").text
        assert f"echorl serve-env at {url}. Reset plays {MINIGRID}" in header
        assert "clients pick among EchoRL/MiniGrid-DoorKey-5x5-v0, EchoRL/Game24-v0 with reset(task=ID)" in header
        code = browser.find_element(By.CSS_SELECTOR, ".oe-code").get_attribute("textContent")
        assert f'base_url="{url}", task="{MINIGRID}"' in code and "localhost:8000" not in code
        assert browser.title == f"echorl serve-env: {MINIGRID}, EchoRL/Game24-v0"
        reset.click()
        wait.until(lambda d: d.find_elements(By.CSS_SELECTOR, ".echorl-obs pre"))
        first = shown()
        assert "Mission: use the key to open the door" in first
        assert "Admissible actions (7): turn left, turn right, go forward, pick up, drop, toggle, done" in first
        box = browser.find_element(By.XPATH, "//label[contains(., 'action')]//textarea | "
                                             "//label[contains(., 'action')]//input")
        box.send_keys("turn left")
        browser.find_element(By.XPATH, "//button[normalize-space()='Run step']").click()
        wait.until(lambda d: shown() != first)
        after = shown()
        assert after.startswith("Task: use the key to open the door") and "You turned left." in after
        # an invalid typed action is reported on the page, and the episode goes on
        box.clear()
        box.send_keys("fly away", Keys.ENTER)
        wait.until(lambda d: "Invalid action" in shown())
        assert "invalid action" in shown()
        # the one-click admissible actions step the env too
        radio = browser.find_element(By.XPATH, "//label[.//span[normalize-space()='turn right']]")
        radio.click()
        wait.until(lambda d: "You turned right." in shown())
        steps = browser.find_element(By.CSS_SELECTOR, ".oe-episode").text
        assert "turn left" in steps and "fly away" in steps and "turn right" in steps
