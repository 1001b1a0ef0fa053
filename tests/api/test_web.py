"""The web UI in real headless Chromium (selenium + the system chromium / chromedriver): ask for the key, submit a
prompt, follow the live progress bar, play the finished clip, show the gallery and the sweeps page."""
from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

import pytest

from tests.api.conftest import KEY_A, wait_job
from tests.service_stack import REPO

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
CHROMEDRIVER = shutil.which("chromedriver")
webdriver = pytest.importorskip("selenium.webdriver", reason="selenium is not installed (pip install selenium)")

pytestmark = pytest.mark.skipif(CHROMIUM is None or CHROMEDRIVER is None,
                                reason="needs Chromium: apt-get install -y chromium chromium-driver")

SCREENSHOT_DIR = REPO / "docs" / "img"
"""With H3BATCH_UPDATE_SCREENSHOTS=1 the screenshots are written here (committed); else only to tmp."""
HANG_S = 600
"""Every wait for the page is a hang guard, far above a loaded machine's time (renders queue behind each other)."""
BIG_SEED = 2**53 + 1
"""A seed JavaScript cannot hold as a Number (9007199254740993 would become ...992)."""


@pytest.fixture
def browser():
    from selenium.webdriver.chrome.options import Options
    from selenium.webdriver.chrome.service import Service

    options = Options()
    options.binary_location = CHROMIUM
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                 "--window-size=1280,900", "--autoplay-policy=no-user-gesture-required"):
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    driver.set_page_load_timeout(30)
    yield driver
    driver.quit()


def _shot(driver, tmp_path: Path, name: str) -> Path:
    path = tmp_path / name
    driver.save_screenshot(str(path))
    if os.environ.get("H3BATCH_UPDATE_SCREENSHOTS") == "1":
        shutil.copyfile(path, SCREENSHOT_DIR / name)
    return path


def test_submit_progress_video_and_gallery(stack, browser, tmp_path):
    """The page asks for the key after a 401, submits a job, shows progress to 100 % and plays the MP4
    (readyState ≥ 1, duration > 0); the gallery then lists clips by their thumbnails, each fetching its MP4 only
    when played."""
    from selenium.common.exceptions import TimeoutException
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    wait = WebDriverWait(browser, HANG_S, poll_frequency=0.05)
    browser.get(stack.base + "/")
    wait.until(lambda d: d.find_element(By.ID, "key-form").is_displayed())  # the gallery call got 401
    assert "API key" in browser.find_element(By.ID, "message").text
    browser.find_element(By.ID, "api-key").send_keys(KEY_A)
    browser.find_element(By.CSS_SELECTOR, "#key-form button").click()
    wait.until(lambda d: not d.find_element(By.ID, "key-form").is_displayed())
    assert browser.execute_script("return localStorage.getItem('h3batch.apiKey')") == KEY_A

    browser.find_element(By.ID, "prompt").send_keys("Waves on a pebble beach, gulls calling")
    browser.find_element(By.ID, "seed").send_keys(str(BIG_SEED))  # past 2^53: a JS Number would round it
    browser.find_element(By.ID, "submit").click()
    seen = set()

    shot = []

    def progressed(d):
        value = int(d.find_element(By.ID, "progress").get_attribute("value"))
        seen.add(value)
        if not shot and 30 <= value <= 85:  # the committed screenshot shows the bar mid-render
            shot.append(_shot(d, tmp_path, "web-submit.png"))
        return d.find_element(By.ID, "current-status").text in ("completed", "failed", "cancelled")

    wait.until(progressed)
    assert browser.find_element(By.ID, "current-status").text == "completed"
    assert any(0 < v < 100 for v in seen), seen  # the bar moved through intermediate values (SSE, not one jump)
    ready = "const v = document.getElementById('current-video'); return [v.readyState, v.duration];"
    wait.until(lambda d: d.execute_script(ready)[0] >= 1)
    ready_state, duration = browser.execute_script(ready)
    assert ready_state >= 1 and duration > 4.0
    assert browser.find_element(By.ID, "progress").get_attribute("value") == "100"
    if not shot:
        _shot(browser, tmp_path, "web-submit.png")

    clips = "return [...document.querySelectorAll('#gallery video')].map(v => [v.readyState, v.duration]);"
    wait.until(lambda d: d.execute_script(clips))
    # Thumbnails only until a clip is played: no gallery video has fetched its MP4 yet.
    assert browser.execute_script("return [...document.querySelectorAll('#gallery video')].every(v => !v.src)")
    browser.execute_script("document.querySelectorAll('#gallery button.play').forEach(b => b.click())")
    wait.until(lambda d: all(s >= 1 for s, _ in d.execute_script(clips)))
    states = browser.execute_script(clips)
    assert len(states) >= 1 and all(duration > 0 for _, duration in states)
    posters = "return [...document.querySelectorAll('#gallery video')].map(v => v.poster.startsWith('blob:'));"
    wait.until(lambda d: all(d.execute_script(posters)))  # thumbnails (PNG variant) fetched with the key
    gallery = browser.find_element(By.ID, "gallery")
    browser.execute_script("arguments[0].previousElementSibling.scrollIntoView()", gallery)
    # For the screenshot only: show a decoded frame (HAVE_CURRENT_DATA) rather than the loading spinner.
    browser.execute_script("document.querySelectorAll('video').forEach(v => { v.currentTime = v.duration / 2; })")
    settled = "return [...document.querySelectorAll('video')].every(v => v.readyState >= 2 && !v.seeking);"
    try:
        WebDriverWait(browser, 15).until(lambda d: d.execute_script(settled))
        time.sleep(1.0)  # Chromium fades its loading spinner out after the seek completes
    except TimeoutException:
        pass
    assert f"seed {BIG_SEED}" in gallery.text
    _shot(browser, tmp_path, "web-gallery.png")


def test_sweeps_page_lists_sweeps(compat_api, browser):
    """The sweeps page loads with the stored key and renders the sweep list from GET /sweeps."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    browser.get(compat_api.base + "/ui/sweeps")
    browser.execute_script("localStorage.setItem('h3batch.apiKey', arguments[0])", KEY_A)
    browser.refresh()
    wait = WebDriverWait(browser, HANG_S)
    wait.until(lambda d: d.find_element(By.ID, "sweeps").text.strip())
    assert browser.find_element(By.ID, "sweeps").text.strip() == "No sweeps yet."
    assert not browser.find_element(By.ID, "key-form").is_displayed()


def test_batch_upload_progress_items_and_archive(stack, browser, tmp_path):
    """/ui/batches: a bad JSONL file is answered with the server's per-line errors; a good one (2 items) is uploaded
    as multipart, its progress bar and item rows follow the batch to completed, and the archive link (fetched with
    the stored key into a blob: URL) yields a zip holding both clips; an item's link opens its job, playable."""
    import json

    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    browser.get(stack.base + "/ui/batches")
    browser.execute_script("localStorage.setItem('h3batch.apiKey', arguments[0])", KEY_A)
    browser.refresh()
    wait = WebDriverWait(browser, HANG_S, poll_frequency=0.05)
    wait.until(lambda d: d.find_element(By.ID, "batches").text.strip())  # GET /batches answered with the key

    canvas = {"width": 128, "height": 64, "seconds": 4}
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"prompt": "fine", **canvas}) + "\n" + json.dumps({"prompt": "x", "width": 100}) + "\n")
    browser.find_element(By.ID, "batch-file").send_keys(str(bad))
    browser.find_element(By.ID, "batch-submit").click()
    wait.until(lambda d: d.find_element(By.ID, "batch-errors").is_displayed())
    assert browser.find_element(By.ID, "batch-errors").text.startswith("line 2: width")
    assert browser.find_element(By.ID, "batch").is_displayed() is False

    good = tmp_path / "good.jsonl"
    good.write_text(json.dumps({"custom_id": "harbour", "prompt": "A harbour at dawn, halyards clinking", "seed": 11,
                                **canvas}) + "\n" +
                    json.dumps({"custom_id": "market", "prompt": "A busy market, voices and carts", "seed": 12,
                                **canvas}) + "\n")
    field = browser.find_element(By.ID, "batch-file")
    field.clear()
    field.send_keys(str(good))
    browser.find_element(By.ID, "batch-submit").click()
    seen = set()

    def finished(d):
        seen.add(int(d.find_element(By.ID, "batch-progress").get_attribute("value")))
        return d.find_element(By.ID, "batch-status").text in ("completed", "cancelled")

    WebDriverWait(browser, HANG_S, poll_frequency=0.05).until(finished)  # two renders on a loaded box: minutes
    assert browser.find_element(By.ID, "batch-status").text == "completed"
    assert browser.find_element(By.ID, "batch-progress").get_attribute("value") == "100"
    assert "2/2 done" in browser.find_element(By.ID, "batch-counts").text
    rows = browser.execute_script(
        "return [...document.querySelectorAll('#batch-items tr')].map(r => [...r.cells].map(c => c.textContent));")
    assert [row[:3] for row in rows] == [["0", "harbour", "completed"], ["1", "market", "completed"]], rows
    batch_id = browser.find_element(By.ID, "batch-id").text
    assert browser.execute_script("return location.hash") == "#" + batch_id

    link = browser.find_element(By.ID, "batch-archive")
    assert link.is_displayed() and link.get_attribute("data-href").endswith(f"/batches/{batch_id}/archive")
    link.click()
    wait.until(lambda d: d.find_element(By.ID, "batch-archive").get_attribute("data-state") == "ready")
    href = link.get_attribute("href")
    assert href.startswith("blob:")
    size, head = browser.execute_async_script(
        "const done = arguments[arguments.length - 1];"
        "fetch(arguments[0]).then(r => r.arrayBuffer()).then(b => done([b.byteLength,"
        " String.fromCharCode(...new Uint8Array(b.slice(0, 2)))]));", href)
    assert head == "PK" and size > 2 * 5_000
    _shot(browser, tmp_path, "web-batch.png")

    # Each item opens its job on the generate page: status, the player and the download link.
    item = browser.find_element(By.CSS_SELECTOR, "#item-0 a.job-link")
    job_id = item.text
    item.click()
    wait.until(lambda d: d.find_element(By.ID, "current-id").text == job_id
               and d.find_element(By.ID, "current-status").text == "completed"
               and d.find_element(By.ID, "current-download").is_displayed())
    ready = "return document.getElementById('current-video').readyState;"
    wait.until(lambda d: d.execute_script(ready) >= 1)


def test_cancel_and_download_buttons(stack, browser):
    """A job queued behind three renders shows its place in line, its ETA and a cancel button that cancels it (badge
    `cancelled`, button gone);
    a job that completes offers its MP4 as a download (a blob of the video, named after the job), and so does each
    gallery clip."""
    import requests
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    wait = WebDriverWait(browser, HANG_S, poll_frequency=0.05)
    done = requests.post(f"{stack.base}/jobs", json={"prompt": "a job done first", "width": 256, "height": 128},
                         headers={"Authorization": f"Bearer {KEY_A}"}, timeout=60)
    assert wait_job(stack.base, done.json()["id"])["status"] == "completed"  # a measured job time for the ETA
    browser.get(stack.base + "/")
    browser.execute_script("localStorage.setItem('h3batch.apiKey', arguments[0])", KEY_A)
    browser.get(stack.base + "/")
    for n in range(3):  # the page's job waits behind these (one worker renders one job at a time)
        reply = requests.post(f"{stack.base}/jobs", json={"prompt": f"a blocker {n}", "width": 256, "height": 128},
                              headers={"Authorization": f"Bearer {KEY_A}"}, timeout=60)
        assert reply.status_code == 202, reply.text
    browser.find_element(By.ID, "prompt").send_keys("A job to cancel")
    browser.find_element(By.ID, "submit").click()
    wait.until(lambda d: d.find_element(By.ID, "current-cancel").is_displayed())
    assert browser.find_element(By.ID, "current-status").text == "queued"  # behind the blockers
    assert "queued · position" in browser.find_element(By.ID, "current-stage").text
    assert " left" in browser.find_element(By.ID, "current-stage").text  # "… · about 3s left": the server's eta_s
    browser.find_element(By.ID, "current-cancel").click()
    # the badge follows the event; the button goes once the page has read the final record (a request later)
    wait.until(lambda d: d.find_element(By.ID, "current-status").text == "cancelled"
               and not d.find_element(By.ID, "current-cancel").is_displayed())
    assert not browser.find_element(By.ID, "current-download").is_displayed()

    prompt = browser.find_element(By.ID, "prompt")
    prompt.clear()
    prompt.send_keys("A job to download")
    browser.find_element(By.ID, "submit").click()
    wait.until(lambda d: d.find_element(By.ID, "current-status").text == "completed"
               and d.find_element(By.ID, "current-download").is_displayed())
    link = browser.find_element(By.ID, "current-download")
    job_id = browser.find_element(By.ID, "current-id").text
    assert link.get_attribute("href").startswith("blob:") and link.get_attribute("download") == f"{job_id}.mp4"
    size = browser.execute_async_script("const done = arguments[arguments.length - 1];"
                                        "fetch(arguments[0]).then(r => r.blob()).then(b => done(b.size));",
                                        link.get_attribute("href"))
    stored = requests.head(f"{stack.base}/jobs/{job_id}/content", headers={"Authorization": f"Bearer {KEY_A}"},
                           timeout=60)
    assert size == int(stored.headers["Content-Length"]) > 0
    browser.execute_script("document.querySelectorAll('#gallery button.play').forEach(b => b.click())")
    links = "return [...document.querySelectorAll('#gallery a.download')].map(a => [a.href, a.download]);"
    wait.until(lambda d: d.execute_script(links) and all(h.startswith("blob:") for h, _ in d.execute_script(links)))
    assert all(name.endswith(".mp4") for _, name in browser.execute_script(links))


def test_batch_page_help_shows_the_limit_not_its_variable(compat_api):
    """The batch form's help text names the server's batch limit as a number, not `H3BATCH_MAX_BATCH`."""
    import requests

    from h3batch.settings import Settings

    page = " ".join(requests.get(compat_api.base + "/ui/batches", timeout=60).text.split())
    assert f"up to the server's {Settings().max_batch} lines" in page and "H3BATCH_MAX_BATCH" not in page


def test_first_and_last_frame_drop_preview_and_send_as_fl2va(stack, browser, tmp_path, rc):
    """The generate form's first/last-frame inputs show a preview of the chosen image, and a submit with frames goes
    out as multipart fl2va: this fleet (FastH3 V2 workers) serves t2va only, so the page shows the server's 422
    naming task fl2va, and no job is created."""
    import numpy as np
    from PIL import Image
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    frames = []
    for name, size in (("first.png", (96, 64)), ("last.png", (64, 96))):
        path = tmp_path / name
        Image.fromarray(np.random.default_rng(1).integers(0, 256, (size[1], size[0], 3), dtype=np.uint8)).save(path)
        frames.append(path)
    browser.get(stack.base + "/")
    browser.execute_script("localStorage.setItem('h3batch.apiKey', arguments[0])", KEY_A)
    browser.refresh()
    wait = WebDriverWait(browser, HANG_S, poll_frequency=0.05)
    for input_id, path in zip(("first-frame", "last-frame"), frames):
        browser.find_element(By.ID, input_id).send_keys(str(path))
        preview = browser.find_element(By.ID, f"{input_id}-preview")
        wait.until(lambda d, p=preview: d.execute_script("return arguments[0].complete && "
                                                         "arguments[0].naturalWidth", p))
        assert preview.is_displayed()
    assert browser.execute_script("return document.getElementById('first-frame-preview').naturalWidth") == 96
    browser.find_element(By.ID, "prompt").send_keys("The door opens onto the sea")
    jobs_before = rc.zcard("h3b:jobs")
    browser.find_element(By.ID, "submit").click()
    wait.until(lambda d: "fl2va" in d.find_element(By.ID, "message").text)
    assert "no_capable_worker" in browser.find_element(By.ID, "message").text or \
        "no worker" in browser.find_element(By.ID, "message").text
    assert rc.zcard("h3b:jobs") == jobs_before
    _shot(browser, tmp_path, "web-keyframes.png")


def _tab_to(browser, element_id: str, presses: int = 60) -> list[str]:
    """Press Tab until `element_id` has the focus; the ids (or tag names) passed on the way. Fails if never."""
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.common.keys import Keys

    passed = []
    for _ in range(presses):
        ActionChains(browser).send_keys(Keys.TAB).perform()
        focused = browser.execute_script("const e = document.activeElement; return e.id || e.tagName.toLowerCase();")
        passed.append(focused)
        if focused == element_id:
            return passed
    raise AssertionError(f"Tab never reached #{element_id}; it went {passed}")


def test_readable_at_375_px_and_usable_from_the_keyboard(stack, browser, tmp_path):
    """At a phone's 375 px width no page scrolls sideways; from the keyboard alone (Tab, typing, Enter) a prompt is
    submitted, its download link and a gallery clip's play button are reached and work, and the focused control
    shows a focus outline. Screenshots: docs/img/web-narrow-generate.png, web-narrow-batches.png."""
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys
    from selenium.webdriver.support.ui import WebDriverWait

    browser.execute_cdp_cmd("Emulation.setDeviceMetricsOverride",
                            {"width": 375, "height": 812, "deviceScaleFactor": 1, "mobile": True})
    wait = WebDriverWait(browser, HANG_S, poll_frequency=0.05)
    browser.get(stack.base + "/")
    browser.execute_script("localStorage.setItem('h3batch.apiKey', arguments[0])", KEY_A)
    overflow = "return [document.documentElement.scrollWidth, window.innerWidth];"
    for page in ("/ui/batches", "/ui/sweeps", "/"):
        browser.get(stack.base + page)
        wait.until(lambda d: d.execute_script("return document.readyState") == "complete")
        scroll_width, width = browser.execute_script(overflow)
        assert width == 375 and scroll_width <= width, (page, scroll_width, width)
        if page == "/ui/batches":
            _shot(browser, tmp_path, "web-narrow-batches.png")

    _tab_to(browser, "prompt")
    ActionChains(browser).send_keys("Lanterns over a night market, a crowd murmuring").perform()
    _tab_to(browser, "submit")
    outline = browser.execute_script("return getComputedStyle(document.activeElement).outlineStyle;")
    assert outline != "none"
    ActionChains(browser).send_keys(Keys.ENTER).perform()
    wait.until(lambda d: d.find_element(By.ID, "current-status").text in ("completed", "failed", "cancelled")
               and d.find_element(By.ID, "current-download").is_displayed())
    assert browser.find_element(By.ID, "current-status").text == "completed"
    assert browser.execute_script(overflow)[0] <= 375  # the player and the clip's facts fit too
    _tab_to(browser, "current-download")
    wait.until(lambda d: d.find_elements(By.CSS_SELECTOR, "#gallery button.play"))
    plays = "return [...document.querySelectorAll('#gallery button.play')];"
    first = browser.execute_script(plays)[0]
    browser.execute_script("arguments[0].setAttribute('id', 'first-play')", first)
    _tab_to(browser, "first-play", presses=120)
    ActionChains(browser).send_keys(Keys.ENTER).perform()
    wait.until(lambda d: d.execute_script("return document.querySelector('#gallery video').src.startsWith('blob:')"))
    browser.execute_script("document.getElementById('current').scrollIntoView()")  # the finished job, its player
    _shot(browser, tmp_path, "web-narrow-generate.png")
