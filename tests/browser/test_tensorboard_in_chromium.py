"""What a person sees in TensorBoard, in a real browser: Debian's chromium driven by Playwright.

Over the logs of `examples/mirrored_fit.py` (ReplicaSyncCheck, ThroughputLogger
and keras.callbacks.TensorBoard on 2 logical CPUs) and of a short
`keras-scaling bench` sweep, served by the real `tensorboard`. Every check
saves a screenshot under the test's temporary directory and names it when it
fails. Run with `make test-browser`.
"""

import json
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request

import pytest

from keras_scaling import launcher
from keras_scaling.cli.bench import _stop

pytestmark = pytest.mark.timeout(420)

_REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
_CHROMIUM = "/usr/bin/chromium"
_TRAIN_TIMEOUT_S = 240
_SERVER_TIMEOUT_S = 90
_UI_TIMEOUT_MS = 30_000
_KERAS_SCALING_TAGS = (
    "throughput/samples_per_sec",
    "throughput/steps_per_sec",
    "scaling/speedup",
    "scaling/efficiency",
    "replica_sync/max_abs_diff",
    "replica_sync/diverged_variables",
)


def _start(command, log_path):
    return subprocess.Popen(
        command,
        cwd=_REPO,
        stdout=open(log_path, "w"),
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"},
    )


def _wait(process, log_path, what):
    try:
        returncode = process.wait(timeout=_TRAIN_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        _stop(process)
        pytest.fail(f"{what} did not finish within {_TRAIN_TIMEOUT_S} s; see {log_path}")
    if returncode != 0:
        pytest.fail(f"{what} exited with {returncode}:\n{open(log_path).read()[-3000:]}")


def _get_json(url):
    with urllib.request.urlopen(url, timeout=10) as response:
        return json.load(response)


@pytest.fixture(scope="module")
def tensorboard_url(tmp_path_factory):
    """A `tensorboard` (default loader) serving the logs of a run and of a bench sweep."""
    root = tmp_path_factory.mktemp("browser")
    logs = root / "logs"
    processes = []
    try:
        run = _start(
            [
                sys.executable,
                "examples/mirrored_fit.py",
                "--cpu-devices",
                "2",
                "--epochs",
                "2",
                "--samples",
                "2048",
                "--log-dir",
                str(logs / "run"),
            ],
            root / "run.log",
        )
        processes.append(run)
        bench = _start(
            [
                sys.executable,
                "-m",
                "keras_scaling",
                "bench",
                "--cpu-devices",
                "2",
                "--replicas",
                "1,2",
                "--model",
                "mlp",
                "--per-replica-batch",
                "32",
                "--steps",
                "30",
                "--logdir",
                str(logs / "bench"),
            ],
            root / "bench.log",
        )
        processes.append(bench)
        _wait(run, root / "run.log", "examples/mirrored_fit.py")
        _wait(bench, root / "bench.log", "keras-scaling bench")

        (port,) = launcher.free_ports(1)
        server = _start(
            [
                sys.executable,
                "-m",
                "tensorboard.main",
                "--logdir",
                str(logs),
                "--host",
                "127.0.0.1",
                "--port",
                str(port),
            ],
            root / "tensorboard.log",
        )
        processes.append(server)
        url = f"http://127.0.0.1:{port}"
        expected_runs = {
            "run/train",
            "run/scaling",
            "bench/summary",
            "bench/replicas_1/scaling",
            "bench/replicas_2/scaling",
        }
        deadline = time.monotonic() + _SERVER_TIMEOUT_S
        runs = set()
        while time.monotonic() < deadline and server.poll() is None:
            try:
                runs = set(_get_json(f"{url}/data/runs"))
                if expected_runs <= runs:
                    break
            except (urllib.error.URLError, OSError):
                pass
            time.sleep(0.5)
        else:
            pytest.fail(
                f"tensorboard served runs {sorted(runs)}, not {sorted(expected_runs)}, "
                f"within {_SERVER_TIMEOUT_S} s; see {root / 'tensorboard.log'}"
            )
        yield url
    finally:
        for process in processes:
            _stop(process)


@pytest.fixture(scope="module")
def browser():
    sync_api = pytest.importorskip("playwright.sync_api", reason="make test-browser installs it")
    if not os.path.exists(_CHROMIUM):
        pytest.fail(f"{_CHROMIUM} is missing: make test-browser installs Debian's chromium")
    with sync_api.sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=_CHROMIUM)
        try:
            yield browser
        finally:
            browser.close()


@pytest.fixture
def page(browser):
    page = browser.new_page(viewport={"width": 1400, "height": 1600})
    yield page
    page.close()


class _Screenshots:
    """Takes a full-page screenshot per check, and names it in failures."""

    def __init__(self, page, directory):
        self._page = page
        self._directory = directory

    def check(self, name, check):
        """Runs `check()`; saves `name.png` whether it passes or fails."""
        path = self._directory / f"{name}.png"
        try:
            check()
        except Exception as error:
            self._page.screenshot(path=path, full_page=True)
            pytest.fail(f"{name}: {error}\nscreenshot: {path}", pytrace=False)
        # Charts draw once their data has arrived.
        self._page.wait_for_load_state("networkidle")
        self._page.wait_for_timeout(1000)
        self._page.screenshot(path=path, full_page=True)
        return path


def test_time_series_lists_keras_scaling_tags_beside_epoch_loss(page, tensorboard_url, tmp_path):
    screenshots = _Screenshots(page, tmp_path)
    page.goto(f"{tensorboard_url}/#timeseries")
    tags = ("epoch_loss", *_KERAS_SCALING_TAGS)

    def cards_are_listed():
        tag_filter = page.locator("input[placeholder='Filter tags (regex)']")
        tag_filter.fill("^(" + "|".join(tags) + ")$")
        tag_filter.press("Escape")  # closes the list of suggestions over the cards
        for tag in tags:
            page.locator(f"card-view tb-truncated-path[title='{tag}']").first.wait_for(
                timeout=_UI_TIMEOUT_MS
            )

    screenshots.check("time_series", cards_are_listed)


def test_custom_scalars_chart_holds_speedup_and_ideal(page, tensorboard_url, tmp_path):
    screenshots = _Screenshots(page, tmp_path)
    points = {}

    def record(response):
        if "/data/plugin/custom_scalars/scalars" not in response.url or not response.ok:
            return
        for tag, events in response.json().get("tag_to_events", {}).items():
            points[tag] = points.get(tag, 0) + len(events)

    page.on("response", record)
    page.goto(f"{tensorboard_url}/#custom_scalars")

    def speedup_and_ideal_have_points():
        deadline = time.monotonic() + _UI_TIMEOUT_MS / 1000
        while time.monotonic() < deadline:
            if points.get("scaling/speedup") and points.get("scaling/ideal_speedup"):
                return
            page.wait_for_timeout(500)
        raise AssertionError(f"the Custom Scalars charts fetched points for {points}")

    screenshots.check("custom_scalars", speedup_and_ideal_have_points)


def test_text_dashboard_shows_the_setup_table(page, tensorboard_url, tmp_path):
    screenshots = _Screenshots(page, tmp_path)
    page.goto(f"{tensorboard_url}/#text")

    def setup_table_is_shown():
        cell = page.locator("td", has_text="per-replica batch").first
        cell.wait_for(timeout=_UI_TIMEOUT_MS)
        page.locator("td", has_text="MirroredStrategy").first.wait_for(timeout=_UI_TIMEOUT_MS)
        page.get_by_text("Speedup over the 1-replica run").first.wait_for(timeout=_UI_TIMEOUT_MS)

    screenshots.check("text", setup_table_is_shown)


def test_images_dashboard_shows_the_scaling_plot(page, tensorboard_url, tmp_path):
    screenshots = _Screenshots(page, tmp_path)
    page.goto(f"{tensorboard_url}/#images")
    # The sweep's only image; its address is an opaque blob key.
    image = page.locator("tf-image-loader img").first

    def scaling_plot_is_shown():
        page.get_by_text("scaling/speedup_vs_replicas").first.wait_for(timeout=_UI_TIMEOUT_MS)
        image.wait_for(timeout=_UI_TIMEOUT_MS)
        page.wait_for_function(
            "image => image.complete && image.naturalWidth > 0",
            arg=image.element_handle(),
            timeout=_UI_TIMEOUT_MS,
        )
        size = image.evaluate("image => [image.naturalWidth, image.naturalHeight]")
        assert size == [640, 480], f"the plot is {size[0]} x {size[1]} pixels"

    screenshots.check("images", scaling_plot_is_shown)
    image.screenshot(path=tmp_path / "scaling_plot_card.png")
