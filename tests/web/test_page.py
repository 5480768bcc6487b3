"""The mission-control page in headless Chromium against a real running controller (see conftest.py).

A GPU fault injected on a real fake-backend agent (XID 79) must turn that node quarantined on the page (the
attention table and the floor's canvas pixel), the hover text must say why, a hostile drain reason must stay
text, and the browser log must hold no error. Screenshots are kept as CI artefacts.
"""

from __future__ import annotations

import pytest
from webharness import HOSTILE_REASON, Controller, artifacts_dir, console_errors, wait_for

NODES = ("gpu-01", "gpu-02", "gpu-03")
QUARANTINED_RGB = (0x86, 0x2E, 0x9C)  # app.js TIER_COLOR.quarantined


@pytest.fixture
def controller(tmp_path):
    c = Controller(tmp_path, NODES).start()
    yield c
    c.close()


def _row_tier(driver, node: str) -> str | None:
    return driver.execute_script(
        "const r = document.querySelector(`#attention tr[data-node='${arguments[0]}']`);"
        "return r ? r.getAttribute('data-tier') : null;",
        node,
    )


def _frame_pixel(driver, node: str) -> list[int] | None:
    """RGB of the node's tier frame on the canvas (one pixel inside its top-left corner)."""
    return driver.execute_script(
        "const c = window.fleetyield.cellOf(arguments[0]); if (!c) return null;"
        "const cv = document.getElementById('floor'); const d = window.devicePixelRatio || 1;"
        "const p = cv.getContext('2d')"
        ".getImageData(Math.round((c.x + 0.5) * d), Math.round((c.y + 0.5) * d), 1, 1).data;"
        "return [p[0], p[1], p[2]];",
        node,
    )


def test_fault_turns_the_node_quarantined_on_the_page(browser, controller):
    wait_for(lambda: controller.get("/v1/fleet")["tick"], what="a first committed tick")
    wait_for(
        lambda: all(n["gpus"] for n in controller.get("/v1/fleet")["nodes"] if n["node"] in NODES),
        what="every GPU node scraped",
    )
    browser.get(controller.url + "/?poll=500")
    wait_for(
        lambda: browser.execute_script("return document.getElementById('floor').dataset.nodes") == "4",
        what="the floor drawn with 4 nodes",
    )
    assert _row_tier(browser, "gpu-01") != "quarantined"
    # the admin's drain reason on cpu-01 is shown as text, never parsed
    assert wait_for(lambda: _row_tier(browser, "cpu-01"), what="cpu-01 in the attention table")
    cell = browser.execute_script(
        "return document.querySelector(\"#attention tr[data-node='cpu-01'] td:last-child\").textContent"
    )
    assert HOSTILE_REASON in cell
    assert browser.execute_script(
        "return window.__pwned === undefined && !document.querySelector('main img')"
    )
    browser.save_screenshot(str(artifacts_dir() / "page-before-fault.png"))

    controller.agents["gpu-01"].inject(gpu=3, xid=79)
    wait_for(lambda: _row_tier(browser, "gpu-01") == "quarantined", timeout_s=30, what="gpu-01 quarantined")
    assert tuple(wait_for(lambda: _frame_pixel(browser, "gpu-01"), what="gpu-01 cell")) == QUARANTINED_RGB
    assert _row_tier(browser, "gpu-02") in (None, "yellow", "unknown")  # the others are untouched
    assert any("State=DRAIN" in " ".join(c) and "NodeName=gpu-01" in c for c in controller.slurm.calls)

    # hover: the tooltip names the node, its tier and the XID
    from selenium.webdriver.common.action_chains import ActionChains

    cell_box = browser.execute_script("return window.fleetyield.cellOf('gpu-01')")
    canvas = browser.find_element("id", "floor")
    size = canvas.size
    ActionChains(browser).move_to_element_with_offset(
        canvas,
        int(cell_box["x"] + cell_box["w"] / 2 - size["width"] / 2),
        int(cell_box["y"] + cell_box["h"] / 2 - size["height"] / 2),
    ).perform()
    tip = wait_for(
        lambda: browser.execute_script(
            "const t = document.getElementById('tip'); return t.hidden ? '' : t.textContent"
        ),
        what="the hover text",
    )
    assert tip.startswith("gpu-01: quarantined") and "reason: fleetyield:" in tip, tip

    # the loop saw the drain; the ladder holds the node
    wait_for(
        lambda: browser.execute_script(
            "return [...document.querySelectorAll('#events tbody tr')].some(r => r.dataset.kind === 'drain')"
        ),
        what="the drain in the loop's event list",
    )
    ladder = browser.execute_script(
        "return [...document.querySelectorAll('.rung')].map(r => [r.dataset.stage, r.textContent])"
    )
    drained = ("quarantined", "remediating", "needs_human")  # it climbs fast: Slurm shows it drained at once
    assert any(stage in drained and "gpu-01" in text for stage, text in ladder), ladder
    browser.save_screenshot(str(artifacts_dir() / "page-after-fault.png"))
    errors = console_errors(browser)
    browser.get("about:blank")  # stop polling before the controller goes away
    assert errors == []


def test_the_page_is_served_with_a_strict_policy(controller):
    import urllib.request

    with urllib.request.urlopen(controller.url + "/", timeout=5) as r:
        csp = r.headers["Content-Security-Policy"]
        body = r.read().decode()
    assert "script-src 'self'" in csp and "default-src 'none'" in csp and "frame-ancestors 'none'" in csp
    assert "<script>" not in body and "http://" not in body and "https://" not in body  # no CDN, no inline
    for name in ("app.js", "style.css", "favicon.svg"):
        with urllib.request.urlopen(f"{controller.url}/static/{name}", timeout=5) as r:
            assert r.status == 200 and r.headers["X-Content-Type-Options"] == "nosniff"
