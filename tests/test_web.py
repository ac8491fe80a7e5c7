"""End-to-end tests of the web page (suffixspec/web/) in headless Chromium against a real server on 127.0.0.1.

The server is the real Flask app (``create_app``) with the embedded default models when they are in
the package, else the tiny llama fixture. Chromium and chromedriver come from Debian's ``chromium``
and ``chromium-driver`` packages (``.ci/run`` installs them); when they are missing the tests skip
with the install command, except in CI (``CI=true``), where they fail. Screenshots go to ``artifacts/web/``.
"""

from __future__ import annotations

import base64
import os
import re
import shutil
import threading
from pathlib import Path

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.browser]
ROOT = Path(__file__).resolve().parent.parent
ARTIFACTS = ROOT / "artifacts" / "web"
EMBEDDED_TARGET = ROOT / "suffixspec" / "default_models" / "demo-target" / "config.json"
API_KEY = "web-test-key"
WAIT_S = 120  # generous upper bound for a CPU shared with other jobs; waits end as soon as the condition holds
CHROME_FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                "--disable-component-update", "--disable-quic", "--no-first-run", "--disable-sync",
                "--disable-dev-shm-usage")


def _browser_paths() -> tuple[str, str]:
    chromium = shutil.which("chromium") or "/usr/bin/chromium"
    driver = shutil.which("chromedriver") or "/usr/bin/chromedriver"
    missing = [p for p in (chromium, driver) if not Path(p).exists()]
    if missing:
        why = (f"headless browser tests need Chromium and chromedriver, missing: {missing}; install them with "
               "`apt-get install chromium chromium-driver` (.ci/run does)")
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(why)  # CI installs them: a missing browser there is a broken CI, not a skip
        pytest.skip(why)
    return chromium, driver


# ------------------------------------------------------------------------------------- fixtures

def serve(cfg: dict):
    """Context manager: the real app with ``cfg`` (plus the API key) on an ephemeral 127.0.0.1 port; its base URL."""
    import contextlib

    from werkzeug.serving import make_server

    from suffixspec.server.app import create_app

    @contextlib.contextmanager
    def run():
        app = create_app({**cfg, "api_key": API_KEY})
        httpd = make_server("127.0.0.1", 0, app, threaded=True)
        thread = threading.Thread(target=httpd.serve_forever, daemon=True)
        thread.start()
        try:
            yield f"http://127.0.0.1:{httpd.server_port}/"
        finally:
            httpd.shutdown()
            app.extensions["suffixspec"].shutdown()
            thread.join(10)

    return run()


@pytest.fixture(scope="module")
def server(tiny_model_dirs, tmp_path_factory):
    """The real app on an ephemeral 127.0.0.1 port, with an API key; yields its base URL."""
    if EMBEDDED_TARGET.exists():
        cfg = {"model": "suffixspec/demo-target"}  # + its different-tokenizer draft model ("auto")
    else:
        cfg = {"model": str(tiny_model_dirs["llama"]), "draft_model": None}
    with serve({**cfg, "db": str(tmp_path_factory.mktemp("webdb") / "docs.db")}) as url:
        yield url


@pytest.fixture(scope="module")
def chat_server(tiny_model_dirs, tmp_path_factory):
    """A tiny llama whose tokenizer has a chat template, served without a draft model (`--draft-model none`)."""
    with serve({"model": str(tiny_model_dirs["llama"]), "draft_model": None,
                "db": str(tmp_path_factory.mktemp("chatdb") / "docs.db")}) as url:
        yield url


@pytest.fixture(scope="module")
def browser(tmp_path_factory):
    chromium, driver_path = _browser_paths()
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    opts = webdriver.ChromeOptions()
    opts.binary_location = chromium
    for flag in CHROME_FLAGS:
        opts.add_argument(flag)
    opts.add_argument(f"--user-data-dir={tmp_path_factory.mktemp('chromium-profile')}")
    opts.add_argument("--window-size=1280,900")
    opts.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service(driver_path), options=opts)
    driver.set_page_load_timeout(60)
    yield driver
    driver.quit()


def open_page(browser, url: str):
    """Load the page at ``url`` (light scheme, 1280 px) with the right API key in sessionStorage, once it
    has heard from the server (the model's card included); yields it, then checks for JS errors."""
    browser.set_window_size(1280, 900)
    color_scheme(browser, "light")
    browser.get(url + "favicon.svg")  # same origin, so the page's sessionStorage; the page itself not yet
    browser.execute_script("sessionStorage.setItem('suffixspec.apiKey', arguments[0])", API_KEY)
    browser.get(url)
    wait(browser).until(lambda d: "connecting" not in d.find_element("id", "server-status").text
                        and "·" in d.find_element("id", "server-status").text)  # "server ok · <model>"
    yield browser
    errors = [e["message"] for e in browser.get_log("browser")
              if e["level"] == "SEVERE" and "401" not in e["message"] and "favicon.ico" not in e["message"]]
    assert not errors, f"JavaScript errors in the page: {errors}"


@pytest.fixture
def page(server, browser):
    yield from open_page(browser, server)


@pytest.fixture
def chat_page(chat_server, browser):
    yield from open_page(browser, chat_server)


def color_scheme(driver, scheme: str) -> None:
    """Emulate the user's light or dark preference (prefers-color-scheme)."""
    driver.execute_cdp_cmd("Emulation.setEmulatedMedia",
                           {"features": [{"name": "prefers-color-scheme", "value": scheme}]})


def wait(driver, timeout: float = WAIT_S):
    """Polls a condition; an element replaced by a re-render while it is read just means "poll again"."""
    from selenium.common.exceptions import StaleElementReferenceException
    from selenium.webdriver.support.ui import WebDriverWait

    return WebDriverWait(driver, timeout, ignored_exceptions=(StaleElementReferenceException,))


def screenshot(driver, name: str) -> Path:
    """A full-page PNG in artifacts/web/ (the whole document, not only the viewport)."""
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    m = driver.execute_cdp_cmd("Page.getLayoutMetrics", {})
    size = m.get("cssContentSize") or m["contentSize"]
    # Capturing beyond the viewport drops the scrollbar, so the page lays out at the full window width.
    width = max(size["width"], driver.execute_script("return window.innerWidth"))
    shot = driver.execute_cdp_cmd("Page.captureScreenshot", {
        "format": "png", "captureBeyondViewport": True,
        "clip": {"x": 0, "y": 0, "width": width, "height": size["height"], "scale": 1}})
    path = ARTIFACTS / f"{name}.png"
    path.write_bytes(base64.b64decode(shot["data"]))
    return path


def by_id(driver, id_: str):
    return driver.find_element("id", id_)


def fill(driver, id_: str, text: str) -> None:
    el = by_id(driver, id_)
    el.clear()
    el.send_keys(text)


def list_idle(driver, query: str | None = None) -> bool:
    table = by_id(driver, "doc-table")
    return table.get_attribute("aria-busy") == "false" and (query is None or table.get_attribute("data-query") == query)


def search(driver, query: str) -> None:
    """Search the document list and wait for the answer to that very query."""
    fill(driver, "doc-search", query)
    by_id(driver, "doc-search").submit()
    wait(driver).until(lambda d: list_idle(d, query))


def remove_row(driver, name: str) -> None:
    """Click Remove on the row named ``name`` and wait until the reloaded list no longer has it."""

    def click(d):
        if not list_idle(d):
            return False
        rows = [r for r in d.find_elements("css selector", "#doc-table tbody tr") if name in r.text]
        assert rows, f"{name} is not listed"
        rows[0].find_element("css selector", "button.remove").click()
        return True

    wait(driver).until(click)
    wait(driver).until(lambda d: list_idle(d) and name not in by_id(d, "doc-table").text)


# A prompt whose continuation repeats it: the prompt drafter's suffix matches are accepted.
PROMPT = ("def add(a, b):\n    return a + b\n\n\ndef add(a, b):\n    return a + b\n\n\n"
          "def add(a, b):\n    return a + b\n\n\ndef add(a, b):\n")


def set_mode(driver, mode: str) -> None:
    driver.find_element("css selector", f'input[name="mode"][value="{mode}"]').click()
    wait(driver, 10).until(lambda d: by_id(d, "user-msg" if mode == "chat" else "prompt").is_displayed())


def set_request(driver, max_tokens: int = 48) -> None:
    """A Prompt-mode request (the page opens in Chat mode for a model with a chat template)."""
    set_mode(driver, "prompt")
    driver.execute_script("arguments[0].value = arguments[1]", by_id(driver, "prompt"), PROMPT)
    fill(driver, "max-tokens", str(max_tokens))
    fill(driver, "temperature", "0")


# ---------------------------------------------------------------------------------------- tests

def test_page_assets_are_served_without_external_urls(server):
    """Every asset the page names is served by the app; nothing is fetched from another host."""
    import urllib.request

    html = urllib.request.urlopen(server, timeout=30).read().decode()
    assets = re.findall(r'(?:src|href)="([^"#]+)"', html)
    assert "app.js" in assets and "style.css" in assets
    for a in assets:
        assert "://" not in a and not a.startswith("//"), f"external asset {a}"
    web = ROOT / "suffixspec" / "web"
    for f in [*web.glob("*.js"), *web.glob("*.css"), web / "index.html"]:
        text = f.read_text()
        assert not re.search(r"https?://(?!www\.w3\.org/2000/svg)", text), f"{f.name} refers to an external URL"
        with urllib.request.urlopen(server + f.name, timeout=30) as resp:
            assert resp.status == 200
            if f.suffix == ".js":  # ES modules need a JavaScript MIME type
                assert "javascript" in resp.headers["Content-Type"]


def test_generate_streams_tokens_coloured_by_source(page):
    set_request(page)
    by_id(page, "generate").click()
    wait(page).until(lambda d: by_id(d, "stat-mal").text not in ("", "–"))
    spans = page.find_elements("css selector", "#output .tok")
    assert spans, "no output tokens were rendered"
    sources = {s.get_attribute("data-source") for s in spans}
    assert sources <= {"target", "prompt", "history", "documents", "references", "prediction", "draft_model"}
    # Every piece carries its source's class, and drafted pieces have a coloured background.
    for s in spans:
        assert f"src-{s.get_attribute('data-source')}" in s.get_attribute("class")
    accepted = int(by_id(page, "stat-drafted").text.split("/")[1])
    drafted_spans = [s for s in spans if s.get_attribute("data-source") != "target"]
    if accepted:
        assert drafted_spans, "the stats say drafts were accepted but no token is shown as drafted"
        bg = drafted_spans[0].value_of_css_property("background-color")
        assert bg not in ("rgba(0, 0, 0, 0)", "transparent"), bg
    assert by_id(page, "stat-tps").text not in ("", "–")
    legend = by_id(page, "legend").text
    assert "target (bonus / correction)" in legend and "prompt suffix" in legend
    # The per-step chart is drawn.
    assert page.find_elements("css selector", "#step-chart svg rect")
    # Tooltip: hovering a token names its source.
    from selenium.webdriver import ActionChains

    # Hover a piece with visible width; output made only of newlines has none to hover, and then the
    # keyboard path (output focused, Right arrow) shows the same tooltip for the first piece.
    visible = [(k, s) for k, s in enumerate(spans) if s.size["width"] > 0 and s.size["height"] > 0]
    if visible:
        k, target = visible[0]
        ActionChains(page).move_to_element(target).perform()
    else:
        from selenium.webdriver.common.keys import Keys

        k, target = 0, spans[0]
        by_id(page, "output").send_keys(Keys.ARROW_RIGHT)
    wait(page, 10).until(lambda d: by_id(d, "tooltip").is_displayed())
    tip = by_id(page, "tooltip").text
    labels = {"target": "target (bonus / correction)", "prompt": "prompt suffix", "history": "output history",
              "documents": "documents", "references": "references", "prediction": "prediction",
              "draft_model": "draft model"}
    assert tip.startswith(labels[target.get_attribute("data-source")]) and f"piece {k + 1} of" in tip
    screenshot(page, "generate")


def test_compare_shows_speedup_and_identical_outputs(page):
    set_request(page)
    by_id(page, "compare").click()
    wait(page).until(lambda d: d.find_elements("id", "speedup"))
    speedup = by_id(page, "speedup").text
    assert re.fullmatch(r"\d+\.\d\d×", speedup), speedup
    # Greedy decoding is lossless: speculation on and off give the same text.
    assert by_id(page, "identical").text == "identical"
    screenshot(page, "compare")


def test_chat_mode_keeps_the_conversation(page):
    set_mode(page, "chat")
    assert not by_id(page, "prompt").is_displayed()
    fill(page, "user-msg", "def add(a, b):")
    fill(page, "max-tokens", "12")
    by_id(page, "generate").click()
    wait(page).until(lambda d: "assistant:" in by_id(d, "chat-log").text)
    assert "user: def add(a, b):" in by_id(page, "chat-log").text
    assert by_id(page, "user-msg").get_attribute("value") == ""
    assert page.find_elements("css selector", "#output .tok")
    screenshot(page, "chat")


def test_prediction_tokens_are_shown_as_prediction(page):
    """Greedy output fed back as the prediction: with only that drafter on, drafted tokens are 'prediction'."""
    set_request(page, max_tokens=24)
    for box in page.find_elements("css selector", 'input[name="drafter"]'):
        if box.is_selected() != (box.get_attribute("value") == "references"):
            box.click()
    by_id(page, "generate").click()
    wait(page).until(lambda d: by_id(d, "stat-mal").text not in ("", "–"))
    first = page.execute_script("return document.getElementById('output').textContent")
    page.find_element("css selector", "#gen-form details summary").click()
    page.execute_script("arguments[0].value = arguments[1]", by_id(page, "prediction"), first)
    by_id(page, "generate").click()
    wait(page).until(lambda d: by_id(d, "stat-mal").text not in ("", "–"))
    sources = {s.get_attribute("data-source") for s in page.find_elements("css selector", "#output .tok")}
    assert "prediction" in sources, sources
    assert sources <= {"prediction", "target"}, sources
    assert "Prediction tokens accepted / rejected" in by_id(page, "stats").text
    screenshot(page, "prediction")


def test_add_list_and_remove_document(page, tmp_path):
    by_id(page, "tab-index").click()
    wait(page).until(lambda d: by_id(d, "view-index").is_displayed())
    name = "web-test-notes.md"
    fill(page, "doc-name", name)
    fill(page, "doc-text", "def area(r):\n    return 3.14159 * r * r\n")
    by_id(page, "doc-add").click()
    wait(page).until(lambda d: name in by_id(d, "doc-table").text)
    assert "Added" in by_id(page, "add-status").text
    wait(page).until(lambda d: by_id(d, "index-stats").text.strip())
    screenshot(page, "index-added")
    # Search finds it; removing it takes it off the list.
    search(page, "3.14159")
    assert name in by_id(page, "doc-table").text
    remove_row(page, name)
    assert "Removed" in by_id(page, "doc-status").text
    # Upload a file; it is listed under its file name.
    upload = tmp_path / "uploaded-notes.txt"
    upload.write_text("class Circle:\n    def __init__(self, r):\n        self.r = r\n")
    by_id(page, "doc-files").send_keys(str(upload))
    by_id(page, "doc-upload").click()
    wait(page).until(lambda d: "Added 1 file" in by_id(d, "add-status").text)
    search(page, "")
    assert upload.name in by_id(page, "doc-table").text
    screenshot(page, "index-uploaded")
    remove_row(page, upload.name)


def test_wrong_api_key_shows_clear_message(page):
    fill(page, "api-key", "not-the-key")
    by_id(page, "key-save").click()
    wait(page).until(lambda d: by_id(d, "auth-banner").is_displayed())
    banner = by_id(page, "auth-banner").text
    assert "Wrong API key" in banner and "401" in banner
    assert by_id(page, "key-state").text == "key rejected"
    # A request with the wrong key says the same in the playground.
    set_request(page, max_tokens=4)
    by_id(page, "generate").click()
    wait(page).until(lambda d: by_id(d, "gen-error").is_displayed())
    assert "Wrong API key" in by_id(page, "gen-error").text
    screenshot(page, "wrong-key")
    # The right key clears the message.
    fill(page, "api-key", API_KEY)
    by_id(page, "key-save").click()
    wait(page).until(lambda d: not by_id(d, "auth-banner").is_displayed())
    assert by_id(page, "key-state").text == "key accepted"


def generate_between_polls(page, max_tokens: int) -> None:
    """Poll the metrics, run one generation, poll again: the charts then have an interval holding it."""
    by_id(page, "tab-metrics").click()  # showing the view polls
    wait(page).until(lambda d: "Last poll" in by_id(d, "metrics-status").text)
    by_id(page, "tab-playground").click()
    set_request(page, max_tokens=max_tokens)
    by_id(page, "generate").click()
    wait(page).until(lambda d: by_id(d, "stat-mal").text not in ("", "–"))
    by_id(page, "tab-metrics").click()
    page.execute_async_script("import('./metrics.js').then((m) => m.poll()).then(arguments[arguments.length - 1])")


def test_metrics_view_polls_prometheus_text(page):
    generate_between_polls(page, 8)
    totals = by_id(page, "metric-totals").text
    m = re.search(r"Requests\s+(\d+)", totals)
    assert m and int(m.group(1)) >= 1, totals
    assert re.search(r"Completion tokens\s+\d+", totals), totals
    # The charts are drawn (a line per drafting source once anything was drafted).
    assert page.find_elements("css selector", "#acc-chart svg, #acc-chart .empty")
    if re.search(r"Drafted / accepted\s+[1-9]", totals):
        wait(page, 10).until(lambda d: d.find_elements("css selector", "#acc-chart svg path"))
    screenshot(page, "metrics")


def test_prometheus_parser_in_the_browser(page):
    samples = page.execute_async_script("""
        const done = arguments[arguments.length - 1];
        import('./metrics.js').then((m) => done(m.parsePrometheus([
          '# HELP x_total a counter',
          'x_total{source="prompt",path="a\\\\"b"} 3',
          'y 1.5e+2',
          'bad line',
          'z{le="+Inf"} +Inf',
        ].join('\\n')).map((s) => [s.name, s.labels, s.value === Infinity ? 'inf' : s.value])));
    """)
    assert samples == [["x_total", {"source": "prompt", "path": 'a"b'}, 3], ["y", {}, 150], ["z", {"le": "+Inf"}, "inf"]]


def test_metrics_charts_show_something_on_first_view(page, server):
    """The first poll charts the figures since the server started (its uptime from /health): the token rate
    and every drafting source's acceptance have a point before any second poll."""
    api(server, "POST", "/v1/completions", {"prompt": PROMPT, "max_tokens": 16, "temperature": 0})
    by_id(page, "tab-metrics").click()  # its first poll starts now
    data = wait(page).until(lambda d: d.execute_async_script(
        "import('./metrics.js').then((m) => arguments[arguments.length - 1]("
        "m.chartData().tokens.length ? m.chartData() : null))"))
    assert len(data["tokens"]) == 1 and data["tokens"][0][1] > 0, data
    assert data["acceptance"] and all(len(s["points"]) == 1 for s in data["acceptance"]), data["acceptance"]
    assert page.find_elements("css selector", "#tok-chart svg") and not page.find_elements("css selector",
                                                                                           "#tok-chart .empty")
    screenshot(page, "metrics-first-view")


def test_step_chart_sources_are_exact_whatever_the_chunks(page):
    """Chunks that do not line up with steps (a step's text held back into the next chunk): with the stats'
    sources_per_step every bar keeps its sources' colours, none "source not known"; without them (an older
    server) a step drafted by two sources cannot be told apart."""
    got = page.execute_async_script("""
        const done = arguments[arguments.length - 1];
        import('./playground.js').then((m) => {
          const stats = {accepted_per_step: [0, 3, 2], per_source: {prompt: {accepted: 3}, history: {accepted: 2}},
                         sources_per_step: [{}, {prompt: 3}, {history: 2}]};
          const steps = [{target: 4}, {prompt: 9, history: 6, target: 1}];  // two chunks for three steps
          const name = (b) => b.parts.filter((p) => p.value).map((p) => p.name);
          const exact = m.stepBars({stats, steps});
          const old = m.stepBars({stats: {...stats, sources_per_step: undefined}, steps});
          done({exact: exact.bars.map(name), exactUnknown: exact.unknown, oldUnknown: old.unknown});
        });""")
    assert got["exact"] == [["target (bonus / correction)"], ["prompt suffix", "target (bonus / correction)"],
                            ["output history", "target (bonus / correction)"]], got
    assert got["exactUnknown"] is False and got["oldUnknown"] is True


def test_a_result_drafted_from_the_output_history_says_so(page):
    """The same request twice: the second is drafted from the first's output, and the page says so. (A
    prompt that does not hold its own answer: else the prompt drafts the repeat, not the history.)"""
    set_request(page, max_tokens=24)
    unique = "def history_note_check(values):\n    total = 0\n"
    page.execute_script("arguments[0].value = arguments[1]", by_id(page, "prompt"), unique)
    for _ in range(2):
        by_id(page, "generate").click()
        wait(page).until(lambda d: by_id(d, "stat-mal").text not in ("", "–") and by_id(d, "generate").is_enabled())
    note = by_id(page, "history-note")
    assert note.is_displayed() and "were drafted from the output history" in note.text, note.text


def test_keyboard_tabs_and_shortcut(page):
    from selenium.webdriver.common.keys import Keys

    by_id(page, "tab-playground").send_keys(Keys.ARROW_RIGHT)
    wait(page, 10).until(lambda d: by_id(d, "tab-index").get_attribute("aria-selected") == "true")
    assert page.switch_to.active_element.get_attribute("id") == "tab-index"
    page.switch_to.active_element.send_keys(Keys.ARROW_LEFT)
    wait(page, 10).until(lambda d: by_id(d, "view-playground").is_displayed())
    # Ctrl+Enter in the prompt generates.
    set_request(page, max_tokens=4)
    by_id(page, "prompt").send_keys(Keys.CONTROL, Keys.ENTER)
    wait(page).until(lambda d: by_id(d, "stat-mal").text not in ("", "–"))
    # Every form control has an accessible name.
    unnamed = page.execute_script("""
        return [...document.querySelectorAll('input, textarea, select, button')].filter((el) => {
          if (el.closest('[hidden]')) return false;
          const id = el.id && document.querySelector(`label[for="${el.id}"]`);
          return !(id || el.closest('label') || el.getAttribute('aria-label') || (el.textContent || '').trim());
        }).map((el) => el.outerHTML);
    """)
    assert not unnamed, unnamed


def test_stop_cancels_a_running_generation(page):
    # Sampled at temperature 1 the tiny model does not loop, so drafts rarely pass and 1,900 tokens take
    # seconds: a greedy repeat could finish before the click lands, and then there is nothing to stop.
    set_request(page, max_tokens=1900)
    fill(page, "temperature", "1")
    by_id(page, "generate").click()
    wait(page).until(lambda d: d.find_elements("css selector", "#output .tok"))
    by_id(page, "stop").click()
    wait(page).until(lambda d: by_id(d, "gen-error").is_displayed())
    assert by_id(page, "gen-error").text == "Stopped."
    assert by_id(page, "generate").is_enabled() and not by_id(page, "stop").is_enabled()


def test_narrow_window_layout(page):
    page.set_window_size(390, 900)
    wait(page, 10).until(lambda d: d.execute_script("return window.innerWidth") <= 400)
    set_request(page, max_tokens=16)
    by_id(page, "generate").click()
    wait(page).until(lambda d: by_id(d, "stat-mal").text not in ("", "–"))
    overflow = page.execute_script("return document.documentElement.scrollWidth - document.documentElement.clientWidth")
    assert overflow <= 1, f"the page scrolls sideways by {overflow}px on a narrow window"
    # Controls stack above the output in one column.
    form = by_id(page, "gen-form").rect
    out = by_id(page, "output").rect
    assert out["y"] > form["y"] + form["height"] - 1
    screenshot(page, "narrow")
    for tab in ("index", "metrics"):
        by_id(page, f"tab-{tab}").click()
        wait(page).until(lambda d, tab=tab: by_id(d, f"view-{tab}").is_displayed())
        overflow = page.execute_script(
            "return document.documentElement.scrollWidth - document.documentElement.clientWidth")
        assert overflow <= 1, f"the {tab} view scrolls sideways by {overflow}px on a narrow window"
    screenshot(page, "narrow-metrics")


# ------------------------------------------------------------------------- a page people can read

def api(server: str, method: str, path: str, body: dict | None = None) -> dict:
    import json
    import urllib.request

    req = urllib.request.Request(server.rstrip("/") + path, method=method,
                                 data=None if body is None else json.dumps(body).encode(),
                                 headers={"Authorization": f"Bearer {API_KEY}", "Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=60) as resp:
        return json.loads(resp.read() or b"{}")


def test_index_statistics_are_in_words_with_paths_out_of_the_way(page, server):
    stats = api(server, "GET", "/v1/index/stats")
    by_id(page, "tab-index").click()
    wait(page).until(lambda d: "Documents" in by_id(d, "index-stats").text)
    shown = by_id(page, "index-stats").text  # what is visible: the closed "Files" disclosure is not
    for raw in ("db bytes", "arrays bytes", "documents loaded tokens", "memory estimate bytes", "document bytes",
                "arrays current", "bytes on disk", "tokenizers "):
        assert raw not in shown.lower(), f"raw key name {raw!r} shown:\n{shown}"
    paths = [stats["db"], *(t["tokenizer"] for t in stats["tokenizers"].values())]
    assert not [p for p in paths if p in shown], shown
    for words in ("Documents", "Tokens", "On disk", "Memory to serve", "Loaded in this server", "Output history"):
        assert words in shown, shown
    page.find_element("css selector", "#index-stats details.files summary").click()
    files = page.find_element("css selector", "#index-stats details.files").text
    assert all(p in files for p in paths), files  # the machine paths are one click away


def test_documents_with_the_same_name_are_told_apart(page, server):
    long_dir = "/srv/projects/" + "/".join(f"level-{i}-of-a-deep-folder" for i in range(6)) + "/"
    docs = [{"text": "VALUE_A = 1\n", "source": "/srv/projects/alpha/__init__.py"},
            {"text": "VALUE_B = 2\n", "source": long_dir + "__init__.py"},
            {"text": "a pasted note with no name, tagged zq-pasted\n"}]
    ids = [d["id"] for d in api(server, "POST", "/v1/index/documents", {"documents": docs})["data"]]
    try:
        by_id(page, "tab-index").click()
        wait(page).until(lambda d: by_id(d, "view-index").is_displayed())
        search(page, "VALUE_")
        rows = [r.text for r in page.find_elements("css selector", "#doc-table tbody tr")]
        assert len(rows) == 2 and all("__init__.py" in r for r in rows), rows
        assert any("/srv/projects/alpha/" in r for r in rows) and any("level-5-of-a-deep-folder/" in r for r in rows)
        assert sorted(re.search(r"id (\d+)", r).group(1) for r in rows) == sorted(map(str, ids[:2]))
        search(page, "zq-pasted")
        row = page.find_element("css selector", "#doc-table tbody tr").text
        assert "Pasted text" in row and f"id {ids[2]}" in row, row
        screenshot(page, "index-same-names")
        # On a phone the list is one card per document, with nothing cut off or scrolling sideways.
        page.set_window_size(390, 900)
        wait(page, 10).until(lambda d: d.execute_script("return window.innerWidth") <= 400)
        search(page, "VALUE_")
        overflow = page.execute_script("return document.documentElement.scrollWidth - document.documentElement.clientWidth")
        assert overflow <= 1, f"the index view scrolls sideways by {overflow}px on a phone"
        assert "level-5-of-a-deep-folder/" in by_id(page, "doc-table").text
        screenshot(page, "index-phone")
    finally:
        api(server, "DELETE", "/v1/index/documents", {"ids": ids})


def test_metrics_list_every_source_even_where_lines_overlap(page, server):
    import urllib.request

    generate_between_polls(page, 16)
    wait(page).until(lambda d: by_id(d, "acc-table").is_displayed())
    status = by_id(page, "metrics-status").text
    assert re.search(r"\d+ values read from /metrics", status) and "samples" not in status, status
    with urllib.request.urlopen(server + "metrics", timeout=30) as resp:
        text = resp.read().decode()
    drafting = set(re.findall(r'^suffixspec_drafted_tokens_total\{source="(\w+)"\}', text, re.M))
    rows = page.find_elements("css selector", "#acc-table tbody tr")
    assert {r.get_attribute("data-source") for r in rows} == drafting  # every source, 0% ones included
    for r in rows:
        assert re.search(r"\d+(\.\d)?%$", r.text), r.text
    # Each line of the chart has its own dash pattern, so one lying on another still shows; a source that
    # drafted nothing in the interval has no line there (a gap).
    data = page.execute_async_script(
        "import('./metrics.js').then((m) => arguments[arguments.length - 1](m.chartData().acceptance))")
    drawn = [s["id"] for s in data if any(p[1] is not None for p in s["points"])]
    assert drawn, data
    dashes = [p.get_attribute("stroke-dasharray") or "" for p in page.find_elements("css selector", "#acc-chart svg path")]
    assert len(dashes) == len(drawn) and len(set(dashes)) == len(dashes), dashes


def test_api_key_placeholder_fits_at_desktop_and_phone_widths(page):
    fits = """
        const el = document.getElementById('api-key');
        const cs = getComputedStyle(el);
        const ctx = document.createElement('canvas').getContext('2d');
        ctx.font = `${cs.fontStyle} ${cs.fontWeight} ${cs.fontSize} ${cs.fontFamily}`;
        const room = el.clientWidth - parseFloat(cs.paddingLeft) - parseFloat(cs.paddingRight);
        return [ctx.measureText(el.placeholder).width, room];
    """
    by_id(page, "key-forget").click()  # as a first visit: no key kept, the placeholder shows
    assert by_id(page, "api-key").get_attribute("value") == "" and not by_id(page, "key-forget").is_displayed()
    for width in (1280, 390):
        page.set_window_size(width, 900)
        wait(page, 10).until(lambda d, w=width: abs(d.execute_script("return window.innerWidth") - w) < 20)
        text_w, room = page.execute_script(fits)
        assert text_w <= room, f"the API key placeholder is cut off at {width}px ({text_w:.0f} > {room:.0f})"
        overflow = page.execute_script("return document.documentElement.scrollWidth - document.documentElement.clientWidth")
        assert overflow <= 1, f"the header scrolls sideways by {overflow}px at {width}px"
    fill(page, "api-key", API_KEY)
    by_id(page, "key-save").click()
    wait(page).until(lambda d: by_id(d, "key-state").text == "key accepted")
    assert by_id(page, "key-forget").is_displayed()


# ------------------------------------------------------------------ first use with a chat model (issue 29)

def visible_drafters(driver) -> set[str]:
    return {b.get_attribute("value") for b in driver.find_elements("css selector", 'input[name="drafter"]')
            if b.find_element("xpath", "..").is_displayed()}


def model_card(url: str) -> dict:
    return api(url, "GET", "/v1/models")["data"][0]


# The colours the step chart draws and the colours of the legend's swatches, both as the browser resolves them.
CHART_AND_LEGEND_COLOURS = """
    const bars = [...document.querySelectorAll('#step-chart svg rect')].map((r) => getComputedStyle(r).fill);
    const legend = [...document.querySelectorAll('#legend .swatch')].map((s) => getComputedStyle(s).backgroundColor);
    return [[...new Set(bars)], [...new Set(legend)]];
"""


def check_layouts(driver, name: str) -> list[Path]:
    """Screenshots at 1280 and 390 px, light and dark; no width may scroll sideways."""
    shots = []
    for width in (1280, 390):
        driver.set_window_size(width, 900)
        wait(driver, 10).until(lambda d, w=width: abs(d.execute_script("return window.innerWidth") - w) < 20)
        for scheme in ("light", "dark"):
            color_scheme(driver, scheme)
            overflow = driver.execute_script(
                "return document.documentElement.scrollWidth - document.documentElement.clientWidth")
            assert overflow <= 1, f"{name}: the page scrolls sideways by {overflow}px at {width}px ({scheme})"
            shots.append(screenshot(driver, f"{name}-{width}-{scheme}"))
    color_scheme(driver, "light")
    driver.set_window_size(1280, 900)
    return shots


def ask(driver, question: str, max_tokens: int) -> str:
    """Ask in Chat mode (the page must have opened in it); the assistant's answer as the chat log shows it."""
    assert driver.find_element("css selector", 'input[name="mode"][value="chat"]').is_selected()
    assert by_id(driver, "user-msg").is_displayed() and not by_id(driver, "prompt").is_displayed()
    fill(driver, "user-msg", question)
    fill(driver, "max-tokens", str(max_tokens))
    by_id(driver, "generate").click()
    wait(driver).until(lambda d: d.find_elements("css selector", "#chat-log .msg.assistant")
                       and by_id(d, "generate").is_enabled())
    assert not by_id(driver, "gen-error").is_displayed(), by_id(driver, "gen-error").text
    assert f"user: {question}" in by_id(driver, "chat-log").text
    return driver.find_element("css selector", "#chat-log .msg.assistant").text.removeprefix("assistant:").strip()


def test_chat_model_opens_in_chat_mode_with_only_the_servers_drafters(chat_page, chat_server):
    """A model with a chat template: the page opens in Chat mode, lists only the drafters the server has
    (no draft model here), a first question gets an answer, and the step chart's colours are in the legend."""
    card = model_card(chat_server)
    assert card["chat_template"] is True and "draft_model" not in card["drafters"]
    assert visible_drafters(chat_page) == set(card["drafters"]) - {"prediction"}  # the prediction has its box
    assert "draft model" not in by_id(chat_page, "gen-form").text
    answer = ask(chat_page, "What is the capital of France?", 24)
    assert answer and chat_page.execute_script("return document.getElementById('output').textContent.trim()")
    bars, legend = chat_page.execute_script(CHART_AND_LEGEND_COLOURS)
    assert bars and set(bars) <= set(legend), f"step chart colours {bars} not all in the legend {legend}"
    # Prompt mode on a chat model says what Chat mode does; choosing a mode sticks.
    set_mode(chat_page, "prompt")
    assert by_id(chat_page, "mode-hint").is_displayed()
    set_mode(chat_page, "chat")
    check_layouts(chat_page, "chat-tiny")


def test_drafter_controls_follow_the_server(page, server):
    card = model_card(server)
    assert visible_drafters(page) == set(card["drafters"]) - {"prediction"}
    if EMBEDDED_TARGET.exists():  # the embedded target comes with its draft model
        assert "draft_model" in visible_drafters(page)


def test_metrics_token_rate_follows_a_running_generation(page, server):
    """The completion tokens/s line rises while a long request runs (tokens are counted per step, not when
    the request ends); once idle, the acceptance chart has a gap, not a flat line at the all-time rate."""
    set_request(page, max_tokens=1800)
    by_id(page, "generate").click()
    wait(page).until(lambda d: d.find_elements("css selector", "#output .tok"))
    by_id(page, "tab-metrics").click()
    poll = """
        const done = arguments[arguments.length - 1];
        import('./metrics.js').then(async (m) => {
          await m.poll();
          done({running: !document.getElementById('stop').disabled, data: m.chartData()});
        });"""

    def rate_while_running(d):
        got = d.execute_async_script(poll)
        assert got["running"], f"the request ended before the token rate rose: {got['data']['tokens']}"
        return got["data"]["tokens"] and got["data"]["tokens"][-1][1] > 0

    wait(page).until(rate_while_running)
    page.execute_script("document.getElementById('stop').click()")
    wait(page).until(lambda d: by_id(d, "generate").is_enabled())
    wait(page).until(lambda d: not api(server, "GET", "/health")["busy"])  # the stopped request is recorded
    # Idle: two polls with nothing drafted between them end every acceptance line in a gap.
    for _ in range(2):
        data = page.execute_async_script(poll)["data"]
    assert data["acceptance"] and all(s["points"][-1][1] is None for s in data["acceptance"]), data["acceptance"]
    assert data["tokens"][-1][1] == 0
    screenshot(page, "metrics-after-long-request")


@pytest.fixture(scope="module")
def smollm2_server(tmp_path_factory):
    """SmolLM2-135M-Instruct (by name, or the folder ``SUFFIXSPEC_SMOLLM2`` names), no draft model."""
    import os

    model = os.environ.get("SUFFIXSPEC_SMOLLM2") or "smollm2-135m-instruct"
    with serve({"model": model, "draft_model": None, "db": str(tmp_path_factory.mktemp("smoldb") / "docs.db")}) as url:
        yield url


@pytest.mark.real_model
def test_real_chat_model_first_question(smollm2_server, browser):
    """What the issue's user did: SmolLM2 served with --draft-model none, a question typed into the page."""
    for page in open_page(browser, smollm2_server):
        assert visible_drafters(page) == {"prompt", "history", "documents", "references"}
        answer = ask(page, "What is the capital of France?", 24)
        assert "Paris" in answer, answer
        bars, legend = page.execute_script(CHART_AND_LEGEND_COLOURS)
        assert set(bars) <= set(legend), f"step chart colours {bars} not all in the legend {legend}"
        check_layouts(page, "chat-smollm2")


@pytest.mark.real_model
def test_real_model_compare_keeps_colours_and_names_the_history(smollm2_server, browser):
    """Compare on a fresh function, then the same request again: the step chart keeps its source colours
    (all in the legend, none "source not known"), and the repeat, drafted from the output history, says so."""
    for page in open_page(browser, smollm2_server):
        question = "Write a Python function that returns the squares of the even numbers in a list."
        for round_ in ("fresh", "repeat"):
            fill(page, "user-msg", question)
            fill(page, "max-tokens", "64")
            fill(page, "temperature", "0")
            by_id(page, "compare").click()
            wait(page).until(lambda d: d.find_elements("id", "speedup") and by_id(d, "generate").is_enabled())
            assert by_id(page, "identical").text == "identical"
            bars, legend = page.execute_script(CHART_AND_LEGEND_COLOURS)
            assert bars and set(bars) <= set(legend), (round_, bars, legend)
            assert "source not known" not in by_id(page, "legend").text, round_
            note = by_id(page, "history-note")
            if round_ == "repeat":
                assert note.is_displayed() and "output history" in note.text, note.text
            else:
                assert not note.is_displayed(), note.text
            screenshot(page, f"compare-smollm2-{round_}")
            page.execute_script("document.getElementById('chat-log').replaceChildren()")
            page.refresh()
            wait(page).until(lambda d: "·" in d.find_element("id", "server-status").text)
