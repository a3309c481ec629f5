"""A real browser for the tests whose product is a page: headless Chromium driven by Selenium.

Debian's ``chromium`` and ``chromium-driver`` packages (``.ci/run`` installs them) are used as
installed: Selenium's own driver download would need the network, which tests never use.
Outside CI a machine without them skips the browser tests, naming the packages; in CI
(``CI=true``) that skip is a failure, so every tier runs there.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from selenium.webdriver import Chrome

CHROMIUM_CANDIDATES = ("chromium", "chromium-browser", "google-chrome")
DRIVER_CANDIDATES = ("chromedriver", "/usr/lib/chromium/chromedriver")


def _first(candidates: tuple[str, ...]) -> str | None:
    for name in candidates:
        found = shutil.which(name) or (name if os.path.isfile(name) else None)
        if found:
            return found
    return None


def require_browser() -> tuple[str, str]:
    """(chromium, chromedriver) paths; a skip outside CI, a failure in CI, when absent."""
    browser, driver = _first(CHROMIUM_CANDIDATES), _first(DRIVER_CANDIDATES)
    if browser and driver:
        return browser, driver
    missing = "chromium" if not browser else "chromium-driver"
    why = (
        f"headless Chromium needs Debian's {missing} package "
        "(apt-get install chromium chromium-driver)"
    )
    if os.environ.get("CI", "").lower() in {"1", "true", "yes"}:
        pytest.fail(why)
    pytest.skip(why)


@contextmanager
def chromium(width: int = 1400, height: int = 1000) -> Iterator[Chrome]:
    """A headless Chromium session (no network beyond 127.0.0.1 is ever asked of it)."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    browser, driver = require_browser()
    options = webdriver.ChromeOptions()
    options.binary_location = browser
    for arg in (
        "--headless=new",
        "--no-sandbox",  # CI containers run as root, where Chromium's sandbox refuses to start
        "--disable-dev-shm-usage",
        "--disable-gpu",
        "--no-first-run",
        f"--window-size={width},{height}",
    ):
        options.add_argument(arg)
    session = webdriver.Chrome(service=Service(executable_path=driver), options=options)
    try:
        session.set_page_load_timeout(120)
        yield session
    finally:
        session.quit()
