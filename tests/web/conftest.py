"""Fixtures of the page tests: one headless Chromium per session (see webharness.py for the controller)."""

from __future__ import annotations

import os

import pytest
from webharness import CHROME_FLAGS, CHROMEDRIVER, CHROMIUM

# --------------------------------------------------------------------------------------------------------
# The browser
# --------------------------------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def browser():
    webdriver = pytest.importorskip("selenium.webdriver")
    from selenium.webdriver.chrome.service import Service

    if not (os.access(CHROMIUM, os.X_OK) and os.access(CHROMEDRIVER, os.X_OK)):
        if os.environ.get("CI"):
            pytest.fail("chromium / chromedriver missing (apt-get install chromium chromium-driver)")
        pytest.skip("chromium / chromedriver not installed (apt-get install chromium chromium-driver)")
    opts = webdriver.ChromeOptions()
    opts.binary_location = CHROMIUM
    for flag in CHROME_FLAGS:
        opts.add_argument(flag)
    opts.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=opts)
    driver.set_page_load_timeout(30)
    yield driver
    driver.quit()
