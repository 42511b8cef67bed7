"""What a person sees in TensorBoard, in a real browser: Debian's chromium driven by Playwright.

Over the logs of the README's quick start (ReplicaSyncCheck, ThroughputLogger
and keras.callbacks.TensorBoard on 2 logical CPUs) and of a short
`keras-scaling bench` sweep, served by the real `tensorboard` with its
default settings. Every check saves a screenshot under build/test-browser/
(ignored by git) and names it when it fails; `quick_start_charts.png` there
is the picture docs/images/ holds. Run with `make test-browser`.
"""

import json
import os
import re
import statistics
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

import pytest

from keras_scaling.cli.bench import _stop
from keras_scaling.launch import launcher

pytestmark = pytest.mark.timeout(420)

_REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
_CHROMIUM = "/usr/bin/chromium"
_TRAIN_TIMEOUT_S = 240
_SERVER_TIMEOUT_S = 90
_UI_TIMEOUT_MS = 30_000
_SCREENSHOTS = os.path.join(_REPO, "build", "test-browser")
_KERAS_SCALING_TAGS = (
    "throughput/samples_per_sec",
    "throughput/steps_per_sec",
    "scaling/speedup",
    "scaling/efficiency",
    "replica_sync/max_abs_diff",
    "replica_sync/diverged_variables",
)
# Every chart of a run's figures, in the runs of the quick start and of both
# replica counts of the sweep.
_MEASURED_TAGS = (
    "scaling/speedup",
    "scaling/efficiency",
    "throughput/samples_per_sec",
    "throughput/per_replica_samples_per_sec",
    "throughput/steps_per_sec",
    "throughput/gflops_per_sec",
    "throughput/per_replica_gflops_per_sec",
)
_MEASURED_RUNS = ("run/scaling", "bench/replicas_1/scaling", "bench/replicas_2/scaling")
_CUSTOM_SCALARS_CHARTS = (
    "speedup vs ideal",
    "scaling efficiency (1.0 = perfect)",
    "samples/sec",
    "model GFLOP/s",
)


def _quick_start():
    """The README's quick start, as a user copies it."""
    with open(os.path.join(_REPO, "README.md"), encoding="utf-8") as file:
        text = file.read()
    start = text.index("```python\n", text.index("\n## Quick start\n")) + len("```python\n")
    return text[start : text.index("```", start)]


def _start(command, log_path, env, cwd=_REPO):
    return subprocess.Popen(
        command,
        cwd=cwd,
        stdout=open(log_path, "w"),
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        env={**env, "TF_CPP_MIN_LOG_LEVEL": "2"},
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
def tensorboard(tmp_path_factory, env_with_matplotlib):
    """A `tensorboard` (default loader) serving the logs of a run and of a bench sweep.

    Every process runs as a user's does, with matplotlib: the bench draws
    the scaling plot that the images dashboard shows.
    """
    env = env_with_matplotlib
    root = tmp_path_factory.mktemp("browser")
    logs = root / "logs"
    processes = []
    try:
        # The quick start writes to logs/run of its working directory. It runs
        # alone, as a user runs it: beside the bench, the cores it shares
        # with its one-replica baseline would be shared differently.
        run = _start([sys.executable, "-c", _quick_start()], root / "run.log", env, cwd=root)
        processes.append(run)
        _wait(run, root / "run.log", "the README's quick start")
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
            env,
        )
        processes.append(bench)
        _wait(bench, root / "bench.log", "keras-scaling bench")

        url = _serve(
            logs,
            {
                "run/train",
                "run/scaling",
                "bench/summary",
                "bench/replicas_1/scaling",
                "bench/replicas_2/scaling",
            },
            root / "tensorboard.log",
            processes,
            env,
        )
        quick_start_url = _serve(
            logs / "run", {"train", "scaling"}, root / "tensorboard_run.log", processes, env
        )
        yield url, quick_start_url, logs
    finally:
        for process in processes:
            _stop(process)


def _serve(log_dir, expected_runs, log_path, processes, env):
    """Starts `tensorboard` (its default loader) on `log_dir`; its address once it lists the runs."""
    (port,) = launcher.free_ports(1)
    server = _start(
        [
            sys.executable,
            "-m",
            "tensorboard.main",
            "--logdir",
            str(log_dir),
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
        ],
        log_path,
        env,
    )
    processes.append(server)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + _SERVER_TIMEOUT_S
    runs = set()
    while time.monotonic() < deadline and server.poll() is None:
        try:
            runs = set(_get_json(f"{url}/data/runs"))
            if expected_runs <= runs:
                return url
        except (urllib.error.URLError, OSError):
            pass
        time.sleep(0.5)
    pytest.fail(
        f"tensorboard served runs {sorted(runs)}, not {sorted(expected_runs)}, "
        f"within {_SERVER_TIMEOUT_S} s; see {log_path}"
    )


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


@pytest.fixture(scope="module")
def tensorboard_url(tensorboard):
    return tensorboard[0]


class _Screenshots:
    """Takes a full-page screenshot per check, and names it in failures."""

    def __init__(self, page, directory=_SCREENSHOTS):
        os.makedirs(directory, exist_ok=True)
        self._page = page
        self._directory = Path(directory)

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


def test_time_series_lists_keras_scaling_tags_beside_epoch_loss(page, tensorboard_url):
    screenshots = _Screenshots(page)
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


def test_custom_scalars_chart_holds_speedup_and_ideal(page, tensorboard_url):
    screenshots = _Screenshots(page)
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


def test_text_dashboard_shows_the_setup_table(page, tensorboard_url):
    screenshots = _Screenshots(page)
    page.goto(f"{tensorboard_url}/#text")

    def setup_table_is_shown():
        cell = page.locator("td", has_text="per-replica batch").first
        cell.wait_for(timeout=_UI_TIMEOUT_MS)
        page.locator("td", has_text="MirroredStrategy").first.wait_for(timeout=_UI_TIMEOUT_MS)
        page.get_by_text("Speedup over the 1-replica run").first.wait_for(timeout=_UI_TIMEOUT_MS)

    screenshots.check("text", setup_table_is_shown)


def test_images_dashboard_shows_the_scaling_plot(page, tensorboard_url):
    screenshots = _Screenshots(page)
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
    image.screenshot(path=os.path.join(_SCREENSHOTS, "scaling_plot_card.png"))


def _scalar_values(url, run, tag):
    """A run's values of a tag, as TensorBoard serves them."""
    query = urllib.parse.urlencode({"run": run, "tag": tag})
    return [value for _, _, value in _get_json(f"{url}/data/plugin/scalars/scalars?{query}")]


def _tick_value(text):
    """A tick label of TensorBoard's axes as a number: `0.2`, `3e+4`, `1.5k`."""
    text = text.strip().replace(",", "").replace("\u2212", "-")
    for suffix, scale in (("k", 1e3), ("M", 1e6), ("G", 1e9), ("T", 1e12)):
        if text.endswith(suffix):
            return float(text[: -len(suffix)]) * scale
    return float(text)


@pytest.mark.parametrize("tag", _MEASURED_TAGS)
def test_every_run_draws_its_points_with_tensorboards_default_settings(page, tensorboard_url, tag):
    screenshots = _Screenshots(page)
    values = {run: _scalar_values(tensorboard_url, run, tag) for run in _MEASURED_RUNS}
    # A run of one point is dropped by "Ignore outliers in chart scaling".
    assert all(len(points) >= 2 for points in values.values()), values
    page.goto(f"{tensorboard_url}/#timeseries")

    def every_run_is_within_the_chart():
        outliers = page.get_by_role("checkbox", name="Ignore outliers in chart scaling")
        assert outliers.is_checked(), "TensorBoard's default ignores outliers"
        tag_filter = page.locator("input[placeholder='Filter tags (regex)']")
        tag_filter.fill(f"^{re.escape(tag)}$")
        tag_filter.press("Escape")
        card = page.locator("card-view", has=page.locator(f"tb-truncated-path[title='{tag}']"))
        axis = card.first.locator(".y-axis").first
        axis.wait_for(timeout=_UI_TIMEOUT_MS)
        medians = {run: statistics.median(points) for run, points in values.items()}

        def outside(ticks):
            """The runs whose median lies outside the axis `ticks`, with the axis."""
            low, high = min(ticks), max(ticks)
            gap = (high - low) / (len(ticks) - 1)
            return [
                f"{run}'s points (median {median:.4g}) are outside the chart's "
                f"axis {low:.4g} to {high:.4g}"
                for run, median in medians.items()
                if not low - gap <= median <= high + gap
            ]

        # The card draws an axis of 0 to 1 before its data arrives: wait until
        # the axis holds every run, or until the time is up.
        deadline = time.monotonic() + _UI_TIMEOUT_MS / 1000
        problems = ["no axis ticks drawn"]
        while time.monotonic() < deadline:
            ticks = [_tick_value(text) for text in axis.inner_text().split()]
            problems = outside(ticks) if len(ticks) >= 2 else ["no axis ticks drawn"]
            if not problems:
                break
            page.wait_for_timeout(500)
        assert not problems, problems

    screenshots.check(f"time_series_{tag.replace('/', '_')}", every_run_is_within_the_chart)


def test_custom_scalars_show_speedup_against_ideal_first_and_no_chart_stays_empty(
    page, tensorboard_url
):
    screenshots = _Screenshots(page)
    page.goto(f"{tensorboard_url}/#custom_scalars")

    def charts_in_order_each_with_points():
        cards = page.locator("tf-custom-scalar-multi-line-chart-card")
        page.get_by_text(_CUSTOM_SCALARS_CHARTS[0], exact=True).first.wait_for(
            timeout=_UI_TIMEOUT_MS
        )
        titles = []
        for index in range(cards.count()):
            card = cards.nth(index)
            (title,) = [
                title
                for title in _CUSTOM_SCALARS_CHARTS
                if card.get_by_text(title, exact=True).count()
            ] or ["(another chart)"]
            titles.append(title)
            matches = card.get_by_text(re.compile(r"Matches \(\d+\)"))
            matches.wait_for(timeout=_UI_TIMEOUT_MS)
            count = int(re.search(r"\d+", matches.inner_text()).group())
            assert count >= 1, f"the chart {title!r} has no series"
        # No MFU chart: no peak of a CPU is known, so it could only be empty.
        assert titles == list(_CUSTOM_SCALARS_CHARTS)

    screenshots.check("custom_scalars_order", charts_in_order_each_with_points)


def test_the_advice_is_in_the_text_tab_once_where_efficiency_is_low(page, tensorboard):
    tensorboard_url, _, logs = tensorboard
    screenshots = _Screenshots(page)
    advised = []
    for run in _MEASURED_RUNS:
        with open(logs / os.path.dirname(run) / "throughput.json") as file:
            efficiency = json.load(file)["efficiency"]
        query = urllib.parse.urlencode({"run": run, "tag": "throughput/advice"})
        advice = [
            entry["text"]
            for entry in _get_json(f"{tensorboard_url}/data/plugin/text/text?{query}")
            if "scaling efficiency is" in entry["text"]
        ]
        assert len(advice) == (1 if efficiency < 0.8 else 0), (run, efficiency, advice)
        advised += [run] if advice else []
    if not advised:
        pytest.skip("every run scaled well on this machine: no advice to look for")
    page.goto(f"{tensorboard_url}/#text")

    def advice_is_shown():
        shown = page.get_by_text(re.compile(r"^scaling efficiency is \d\.\d\d"))
        shown.first.wait_for(timeout=_UI_TIMEOUT_MS)
        assert shown.count() == len(advised)

    screenshots.check("text_advice", advice_is_shown)


_SCROLLING_INSIDE_TEXT_CARDS = """() => {
  const scrolling = [];
  const walk = (root) => {
    for (const element of root.querySelectorAll('*')) {
      const style = getComputedStyle(element);
      if (['auto', 'scroll'].includes(style.overflowY)
          && element.scrollHeight > element.clientHeight + 1 && element.clientHeight > 0) {
        scrolling.push((element.innerText || '').slice(0, 80));
      }
      if (element.shadowRoot) walk(element.shadowRoot);
    }
  };
  for (const card of document.querySelectorAll('tf-text-loader')) {
    walk(card.shadowRoot || card);
  }
  return scrolling;
}"""


def test_the_set_up_reads_without_a_scroll_box_in_plain_words(page, tensorboard_url):
    screenshots = _Screenshots(page)
    page.goto(f"{tensorboard_url}/#text")

    def set_up_is_readable():
        page.locator("td", has_text="per-replica batch").first.wait_for(timeout=_UI_TIMEOUT_MS)
        page.locator("td", has_text="measured against").first.wait_for(timeout=_UI_TIMEOUT_MS)
        page.wait_for_load_state("networkidle")
        assert page.evaluate(_SCROLLING_INSIDE_TEXT_CARDS) == []
        # The quick start's model: 4,617 FLOPs per sample, written out.
        page.locator("td", has_text=re.compile(r"^[\d,]+ FLOPs \(counted\)$")).first.wait_for(
            timeout=_UI_TIMEOUT_MS
        )
        # Bench runs name the command line's option.
        page.locator("td", has_text="--peak-flops measure").first.wait_for(timeout=_UI_TIMEOUT_MS)
        assert page.locator("td", has_text=re.compile(r"^points$")).count() == 0

    screenshots.check("text_setup", set_up_is_readable)


def test_the_quick_starts_charts_are_pictured_for_the_docs(page, tensorboard):
    # A tensorboard of the quick start's logs alone, as `tensorboard --logdir logs`.
    _, quick_start_url, _ = tensorboard
    page.goto(f"{quick_start_url}/#custom_scalars")
    page.get_by_text(_CUSTOM_SCALARS_CHARTS[0], exact=True).first.wait_for(timeout=_UI_TIMEOUT_MS)
    page.wait_for_load_state("networkidle")
    page.wait_for_timeout(2000)
    os.makedirs(_SCREENSHOTS, exist_ok=True)
    path = os.path.join(_SCREENSHOTS, "quick_start_charts.png")
    page.locator("tf-category-paginated-view").first.screenshot(path=path)
    # docs/images/quick_start_charts.png is this picture: small enough to commit.
    assert os.path.getsize(path) < 200_000
