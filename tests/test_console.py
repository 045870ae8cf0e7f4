"""The web console in a real browser: Debian's headless chromium, driven by Playwright, loads
the console from `gpulens api` on the session's demo data (tests/api_demo.py) and each view
shows what the API answers; the "as of" picker moves it to the past; a wrong token says 401;
ClickHouse cut off from a second API says so until it is back; and no view logs an error. The
overview's screenshot is the README's (GPULENS_SCREENSHOT=PATH saves it there:
docs/console.png).

Playwright drives the system's chromium by its path: nothing is downloaded at run time, and the
test is skipped, saying why, where no chromium is installed.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import socket
import subprocess
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from urllib.parse import urlparse

import pytest
from api_demo import ALI, GEN, TOKEN, Demo, busiest_window_end, gpulens, rfc3339, utc, wait_answering
from playwright.sync_api import Browser, BrowserContext, ConsoleMessage, Page, expect, sync_playwright

from gpulens.platform import free_port

WAIT_MS = 30_000
"""How long an assertion waits for the page (two shared cores, ClickHouse behind the API)."""
DASH = "\u2013"
"""What the console shows for a value missing (js/dom.js)."""


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    executable = shutil.which("chromium")
    if executable is None:
        pytest.skip("no chromium binary: install Debian's chromium (.ci/run does) to test the console")
    expect.set_options(timeout=WAIT_MS)
    with sync_playwright() as playwright:
        launched = playwright.chromium.launch(
            executable_path=executable, args=["--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"]
        )
        yield launched
        launched.close()


@dataclass
class Console:
    """A browser page on the console, and every error it logged (console.error, uncaught)."""

    page: Page
    base: str
    errors: list[str] = field(default_factory=list)

    def open(self, address: str) -> None:
        self.page.goto(f"{self.base}/{address}")

    def texts(self, selector: str) -> list[str]:
        self.page.locator(selector).first.wait_for()
        return self.page.locator(selector).all_inner_texts()


def _console(browser: Browser, base: str, token: str) -> tuple[Console, BrowserContext]:
    """A page of its own (a new browser context) on the console at ``base``, ``token`` stored."""
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    context.add_init_script(f"localStorage.setItem('gpulens.token', {json.dumps(token)})")
    page = context.new_page()
    page.set_default_timeout(WAIT_MS)
    console = Console(page, base)

    def logged(message: ConsoleMessage) -> None:
        if message.type == "error":
            console.errors.append(message.text)

    page.on("console", logged)
    page.on("pageerror", lambda error: console.errors.append(f"uncaught: {error}"))
    return console, context


@pytest.fixture
def console(browser: Browser, demo: Demo) -> Iterator[Console]:
    """The console with the API's token; at the end, it must have logged no error at all."""
    shown, context = _console(browser, demo.base, TOKEN)
    yield shown
    context.close()
    assert shown.errors == [], shown.errors


def rate(fraction: float | None) -> str:
    """As the console writes a fraction (js/dom.js rate())."""
    return DASH if fraction is None else f"{fraction * 100:.1f} %"


def test_the_overview_and_heatmap_show_the_apis_numbers(console: Console, demo: Demo) -> None:
    clusters = demo.get("/api/clusters")["data"]
    console.open("")
    page = console.page
    largest = max(clusters, key=lambda c: c["gpu_capacity"])["name"]
    expect(page.locator("#cluster")).to_have_value(largest)  # the default: the most GPUs
    expect(page.locator("#cluster option")).to_have_count(len(clusters))

    overview = demo.get(f"/api/clusters/{GEN}/overview")
    heatmap = demo.get(f"/api/clusters/{GEN}/gpuHeatmap", step=300)  # as js/views/heatmap.js asks
    page.locator("#cluster").select_option(GEN)
    expect(page.get_by_test_id("allocation-rate")).to_have_text(rate(overview["now"]["allocation_rate"]))
    nodes = overview["nodes"]
    for name, value in (
        ("nodes-idle", nodes["nodes_fully_idle"]),
        ("nodes-partly", nodes["nodes_partially_idle"]),
        ("nodes-busy", nodes["nodes_busy"]),
        ("nodes-faulty", len(overview["faulty_nodes"])),
    ):
        expect(page.get_by_test_id(name)).to_have_text(str(value))
    expect(page.get_by_test_id("utilization")).to_have_text(f"{nodes['gpu_utilization_avg']:.1f} %")
    rows = sorted({cell["node"] for cell in heatmap["data"]})
    assert rows, "the GenAI slice has GPU samples in its last hour"
    expect(page.get_by_test_id("heatmap-row")).to_have_count(len(rows))
    assert console.texts("[data-testid=heatmap-row]") == rows
    slider = page.locator("[data-testid=heatmap] input[type=range]")
    times = sorted({cell["time"] for cell in heatmap["data"]})
    expect(slider).to_have_attribute("max", str(len(times) - 1))
    slider.fill("0")
    expect(page.get_by_test_id("heatmap-time")).to_contain_text(times[0][:19].replace("T", " "))
    expect(page.locator("#refreshed")).to_contain_text("live, refreshed")

    shot = Path(os.environ.get("GPULENS_SCREENSHOT") or demo.config.parent / "console.png")
    slider.fill(str(len(times) - 1))
    slider.blur()
    page.screenshot(path=str(shot), full_page=True)
    assert shot.stat().st_size > 10_000


def test_as_of_moves_every_view_to_the_past_and_now_comes_back(console: Console, demo: Demo) -> None:
    at = busiest_window_end(demo)
    live = demo.get(f"/api/clusters/{ALI}/overview")["now"]["allocation_rate"]
    past = demo.get(f"/api/clusters/{ALI}/overview", asOf=rfc3339(at))["now"]["allocation_rate"]
    assert rate(live) != rate(past), "the busiest instant differs from the end of the slice"
    console.open(f"#/overview?cluster={ALI}")
    page = console.page
    expect(page.get_by_test_id("allocation-rate")).to_have_text(rate(live))
    page.locator("#as-of").fill(at.strftime("%Y-%m-%dT%H:%M:%S"))
    page.locator("#as-of").dispatch_event("change")
    expect(page.get_by_test_id("allocation-rate")).to_have_text(rate(past))
    expect(page.locator("#refreshed")).to_contain_text(f"as of {at.strftime('%Y-%m-%dT%H:%M:%S')}")
    page.get_by_role("link", name="Workloads", exact=True).click()
    workloads = demo.get("/api/workloads", cluster=ALI, asOf=rfc3339(at), pageSize=100)
    expect(page.get_by_test_id("workloads-table").locator("tbody tr")).to_have_count(len(workloads["data"]))
    page.locator("#live").click()
    page.get_by_role("link", name="Overview", exact=True).click()
    expect(page.get_by_test_id("allocation-rate")).to_have_text(rate(live))


def test_idle_workloads_and_a_workloads_page(console: Console, demo: Demo) -> None:
    idle = demo.get(f"/api/clusters/{GEN}/idleWorkloads", pageSize=25)["data"]
    assert idle
    console.open(f"#/idle?cluster={GEN}")
    page = console.page
    table = page.get_by_test_id("idle-table")
    expect(table.locator("tbody tr")).to_have_count(len(idle))
    assert [row.split("\t")[:3] for row in console.texts("[data-testid=idle-table] tbody tr")] == [
        [f"{w['kind']}/{w['name']}", w["namespace"], f"{w['idle_gpu_hours']:.2f}"] for w in idle
    ]
    top = idle[0]
    table.get_by_role("link", name=f"{top['kind']}/{top['name']}").click()
    pods = demo.get(f"/api/workloads/{top['uid']}/pods", cluster=GEN)["data"]
    expect(page.get_by_test_id("pods-table").locator("tbody tr")).to_have_count(len(pods))
    assert [row.split("\t")[0] for row in console.texts("[data-testid=pods-table] tbody tr")] == [
        f"{p['namespace']}/{p['name']}" for p in pods
    ]
    expect(page.get_by_test_id("hierarchy")).to_contain_text(f"{top['kind']} {top['name']}")
    expect(page.locator("[data-testid=workload-chart] canvas")).to_have_count(1)
    expect(page.locator("[data-testid=workload-chart] .u-legend")).to_contain_text("utilization %")


def why(pending: dict) -> str:
    """The pending table's "why" cell: the reason class in words, and whether consolidating would
    make room."""
    if pending["reason_class"] is None:
        return DASH
    fits = " (fits after consolidation)" if pending["fits_after_consolidation"] else ""
    return pending["reason_class"].replace("_", " ") + fits


def test_pending_pods_and_open_alerts_are_the_apis(console: Console, demo: Demo) -> None:
    opened = demo.sql(
        "SELECT min(event_time) FROM alerts FINAL WHERE cluster = {c:String} AND alert = 'GpuPodPending'",
        c=ALI,
    )[0][0]
    at = rfc3339(utc(opened) + timedelta(milliseconds=1))
    pending = demo.get("/api/pending", cluster=ALI, asOf=at)["data"]
    assert pending, "pods wait when the first GpuPodPending alert opens"
    console.open(f"#/pending?cluster={ALI}&asOf={at}")
    page = console.page
    expect(page.get_by_test_id("pending-table").locator("tbody tr")).to_have_count(len(pending))
    rows = [row.split("\t") for row in console.texts("[data-testid=pending-table] tbody tr")]
    assert [(r[0], r[4], r[5]) for r in rows] == [
        (f"{p['namespace']}/{p['name']}", p["reason"] or DASH, why(p)) for p in pending
    ]

    idle_since = demo.sql(
        "SELECT min(event_time) FROM alerts FINAL WHERE cluster = {c:String} AND alert = 'GpuIdle'", c=GEN
    )[0][0]
    at = rfc3339(utc(idle_since) + timedelta(minutes=30))
    alerts = demo.get("/api/alerts", cluster=GEN, state="open", pageSize=200, asOf=at)
    assert alerts["data"], "GPUs idle half an hour after the first GpuIdle alert"
    console.open(f"#/alerts?cluster={GEN}&asOf={at}")
    expect(page.get_by_test_id("alerts-total")).to_have_text(f" {alerts['total']} alerts")
    expect(page.get_by_test_id("alerts-table").locator("tbody tr")).to_have_count(len(alerts["data"]))
    assert {row.split("\t")[1] for row in console.texts("[data-testid=alerts-table] tbody tr")} == {"OPENED"}


def test_a_wrong_token_says_401_and_the_right_one_shows_the_console(browser: Browser, demo: Demo) -> None:
    console, context = _console(browser, demo.base, "not-the-token")
    try:
        console.open(f"#/overview?cluster={GEN}")
        page = console.page
        expect(page.locator("#problem")).to_have_text(
            "401: the API refused this token. Enter api.token above and save."
        )
        expect(page.get_by_test_id("overview")).to_have_count(0)
        page.locator("#token").fill(TOKEN)
        page.get_by_role("button", name="save").click()
        expect(page.get_by_test_id("overview")).to_be_visible()
        expect(page.locator("#problem")).to_be_hidden()
        # the browser logs each refused request; nothing else may be logged
        assert console.errors and all("401" in error for error in console.errors), console.errors
    finally:
        context.close()


class Relay:
    """A TCP relay to ``target`` on a port of its own, which the test cuts and mends: ClickHouse
    goes away for a process that talks to it through the relay, and for no one else (the
    session's data and its API stay up)."""

    def __init__(self, target: tuple[str, int]) -> None:
        self.target = target
        self.port = free_port()
        self._listener: socket.socket | None = None
        self._open: list[socket.socket] = []
        self.mend()

    def mend(self) -> None:
        """Listen again (on the same port) and relay every connection."""
        self._listener = socket.create_server(("127.0.0.1", self.port))
        threading.Thread(target=self._accept, args=(self._listener,), daemon=True).start()

    def cut(self) -> None:
        """Refuse new connections and break the open ones, as a ClickHouse that went away."""
        assert self._listener is not None
        with contextlib.suppress(OSError):
            self._listener.shutdown(socket.SHUT_RDWR)  # wakes its accept()
        self._listener.close()
        for connection in self._open:
            with contextlib.suppress(OSError):
                connection.shutdown(socket.SHUT_RDWR)
            connection.close()
        self._open.clear()

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                client, _ = listener.accept()
                server = socket.create_connection(self.target)
            except OSError:
                return  # cut
            self._open += [client, server]
            for source, sink in ((client, server), (server, client)):
                threading.Thread(target=self._pump, args=(source, sink), daemon=True).start()

    @staticmethod
    def _pump(source: socket.socket, sink: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while data := source.recv(65_536):
                sink.sendall(data)
        with contextlib.suppress(OSError):
            sink.shutdown(socket.SHUT_WR)


def test_clickhouse_away_says_so_and_the_console_comes_back_when_it_returns(
    browser: Browser, demo: Demo, spawned: list[subprocess.Popen[bytes]]
) -> None:
    url = urlparse(demo.settings.clickhouse.url)
    relay = Relay((url.hostname or "127.0.0.1", url.port or 8123))
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPULENS_")}
    env["GPULENS_CLICKHOUSE__URL"] = f"http://127.0.0.1:{relay.port}"
    api = subprocess.Popen(
        gpulens(demo.config, "api", "--port", str(port)), env=env, stderr=subprocess.DEVNULL
    )  # no token: the console asks without one
    spawned.append(api)
    try:
        wait_answering(f"http://127.0.0.1:{port}", api)
        console, context = _console(browser, f"http://127.0.0.1:{port}", "")
        console.open(f"#/overview?cluster={GEN}")
        page = console.page
        expect(page.get_by_test_id("overview")).to_be_visible()
        relay.cut()
        expect(page.locator("#problem")).to_have_text("ClickHouse unavailable, retrying")
        expect(page.get_by_test_id("overview")).to_be_visible()  # what was shown stays
        relay.mend()
        expect(page.locator("#problem")).to_be_hidden()
        expect(page.locator("#refreshed")).to_contain_text("live, refreshed")
        # the browser logs each request answered 503; nothing else may be logged
        assert console.errors and all("503" in error for error in console.errors), console.errors
        context.close()
    finally:
        relay.cut()
