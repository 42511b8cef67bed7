"""Every Python and shell block of the docs and the README runs as written.

The blocks of one page run in order, in a fresh directory of their own (with
`examples/` at hand), each in a process of its own: a Python block with this
interpreter, a `bash` block with `bash -eu` and this environment's scripts
(`keras-scaling`, `python`) first on the PATH. An HTML comment on the line
before a block changes that:

- `<!-- illustrative: REASON -->`: the block is not run, for that reason;
- `<!-- file: NAME -->`: the block is written to the file NAME, for the blocks
  after it;
- `<!-- tested-by: TEST_FILE -->`: the block is not run here, since that test
  file runs it (the README's quick start and `keras-scaling launch` example,
  which `make test-versions` runs on every supported pair; the docs hold the
  same code, as the tests below check).

Running the blocks takes minutes, so `make docs` runs them
(KERAS_SCALING_DOCS_EXAMPLES=1) and `make test` only checks that every block
is run or says why not.
"""

import concurrent.futures
import dataclasses
import json
import os
import re
import subprocess
import sys

import pytest

from keras_scaling.throughput import baseline

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DOCS = os.path.join(REPO, "docs")
RUN_ENV = "KERAS_SCALING_DOCS_EXAMPLES"
RUNNABLE = ("python", "bash")
NOT_RUN = ("text", "json", "toml", "yaml")
_BLOCK_TIMEOUT_S = 600
_PARALLEL_PAGES = 2
_MARKER = re.compile(r"^<!--\s*(illustrative|file|tested-by):\s*(.*?)\s*-->$")


@dataclasses.dataclass(frozen=True)
class Block:
    """One fenced code block of a Markdown page."""

    page: str
    line: int
    language: str
    code: str
    marker: str = None
    marker_value: str = None

    def where(self):
        return f"{self.page}:{self.line}"


def pages():
    """The Markdown pages checked: README.md and every page under docs/."""
    found = ["README.md"]
    for directory, _, names in os.walk(DOCS):
        found += [
            os.path.relpath(os.path.join(directory, name), REPO)
            for name in names
            if name.endswith(".md")
        ]
    return sorted(found)


def blocks(page):
    """The fenced blocks of `page` (a path relative to the repository)."""
    with open(os.path.join(REPO, page), encoding="utf-8") as file:
        lines = file.read().splitlines()
    found, index = [], 0
    while index < len(lines):
        line = lines[index]
        if not line.startswith("```"):
            index += 1
            continue
        language = line[3:].strip().split(" ")[0]
        previous = next((text for text in reversed(lines[:index]) if text.strip()), "")
        marker = _MARKER.match(previous.strip())
        end = lines.index("```", index + 1)
        found.append(
            Block(
                page=page,
                line=index + 1,
                language=language,
                code="\n".join(lines[index + 1 : end]) + "\n",
                marker=marker.group(1) if marker else None,
                marker_value=marker.group(2) if marker else None,
            )
        )
        index = end + 1
    return found


def _all_blocks():
    return [block for page in pages() for block in blocks(page)]


def _runnable(page):
    return [block for block in blocks(page) if block.language in RUNNABLE]


def test_every_block_names_a_known_language():
    unknown = [
        f"{block.where()}: {block.language or 'no language'}"
        for block in _all_blocks()
        if block.language not in RUNNABLE + NOT_RUN
    ]

    assert not unknown, (
        f"use ```python or ```bash for code (they run), ```text for output: {unknown}"
    )


def test_every_python_and_shell_block_runs_or_says_why_not():
    unexplained = [
        block.where()
        for block in _all_blocks()
        if block.language in RUNNABLE and block.marker is not None and not block.marker_value
    ]
    misplaced = [
        block.where()
        for block in _all_blocks()
        if block.marker == "file" and block.language != "python"
    ]

    missing_tests = [
        block.where()
        for block in _all_blocks()
        if block.marker == "tested-by"
        and not os.path.isfile(os.path.join(REPO, block.marker_value))
    ]

    assert not unexplained, f"an illustrative block needs a reason: {unexplained}"
    assert not missing_tests, f"tested-by names no test file: {missing_tests}"
    assert not misplaced, f"only Python blocks are written to files: {misplaced}"


def _schema_keys(page):
    """The keys in the first column of the tables of a schema page."""
    with open(os.path.join(REPO, page), encoding="utf-8") as file:
        return re.findall(r"^\| `([a-z0-9_]+)` \|", file.read(), flags=re.MULTILINE)


def _tested_by(page, language):
    return [
        block.code
        for block in blocks(page)
        if block.marker == "tested-by" and block.language == language
    ]


def test_the_home_page_example_is_the_readme_quick_start():
    home = [block.code for block in blocks("docs/index.md") if block.language == "python"]

    assert home == _tested_by("README.md", "python")


def test_the_multi_worker_guide_launches_the_readme_command():
    assert _tested_by("docs/guides/multi-worker.md", "bash") == _tested_by("README.md", "bash")


def test_the_throughput_json_page_lists_every_field_of_the_file():
    assert sorted(_schema_keys("docs/reference/throughput-json.md")) == sorted(baseline.FIELDS)


def _run_block(block, work_dir):
    env = {
        **os.environ,
        "TF_CPP_MIN_LOG_LEVEL": "2",
        "PATH": os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", ""),
    }
    env.pop(RUN_ENV, None)
    if block.language == "python":
        script = os.path.join(work_dir, f"block_line_{block.line}.py")
        with open(script, "w", encoding="utf-8") as file:
            file.write(block.code)
        command = [sys.executable, script]
    else:
        command = ["bash", "-eu", "-c", block.code]
    try:
        result = subprocess.run(
            command,
            cwd=work_dir,
            env=env,
            capture_output=True,
            text=True,
            timeout=_BLOCK_TIMEOUT_S,
        )
    except subprocess.TimeoutExpired:
        return f"{block.where()} did not finish in {_BLOCK_TIMEOUT_S} s"
    if result.returncode != 0:
        return (
            f"{block.where()} exited with {result.returncode}:\n"
            f"{result.stdout[-2000:]}\n{result.stderr[-4000:]}"
        )
    return None


def run_page(page, work_dir):
    """Runs the blocks of `page` in order in `work_dir`; returns the first failure."""
    os.makedirs(work_dir, exist_ok=True)
    os.symlink(os.path.join(REPO, "examples"), os.path.join(work_dir, "examples"))
    for block in _runnable(page):
        if block.marker in ("illustrative", "tested-by"):
            continue
        if block.marker == "file":
            with open(os.path.join(work_dir, block.marker_value), "w", encoding="utf-8") as file:
                file.write(block.code)
            continue
        failure = _run_block(block, work_dir)
        if failure:
            return failure
    return None


_RUN_PAGES = [page for page in pages() if any(block.marker is None for block in _runnable(page))]


@pytest.fixture(scope="module")
def page_runs(tmp_path_factory):
    """Every page's blocks, run two pages at a time, as futures by page."""
    if not os.environ.get(RUN_ENV):
        pytest.skip(f"the docs' examples run with {RUN_ENV}=1 (make docs)")
    root = tmp_path_factory.mktemp("docs")
    with concurrent.futures.ThreadPoolExecutor(_PARALLEL_PAGES) as executor:
        yield {
            page: (
                executor.submit(run_page, page, str(root / page.replace("/", "_"))),
                root / page.replace("/", "_"),
            )
            for page in _RUN_PAGES
        }


# A page waits for the pages run before it: its time is theirs too.
@pytest.mark.timeout(_BLOCK_TIMEOUT_S * 3)
@pytest.mark.parametrize("page", _RUN_PAGES)
def test_the_page_examples_run_in_order(page_runs, page):
    future, _ = page_runs[page]

    failure = future.result()

    assert failure is None, failure


def test_the_throughput_guide_writes_the_throughput_json_of_the_schema_page(page_runs):
    future, work_dir = page_runs["docs/guides/throughput.md"]
    assert future.result() is None

    with open(work_dir / "logs" / "run1" / "throughput.json", encoding="utf-8") as file:
        record = json.load(file)

    assert set(record) == set(_schema_keys("docs/reference/throughput-json.md"))
    assert record["num_replicas"] == 2 and record["samples_per_sec"] > 0


def test_the_bench_guide_writes_the_scaling_json_of_the_schema_page(page_runs):
    future, work_dir = page_runs["docs/guides/bench.md"]
    assert future.result() is None

    with open(work_dir / "logs" / "bench" / "scaling.json", encoding="utf-8") as file:
        summary = json.load(file)

    documented = _schema_keys("docs/reference/scaling-json.md")
    assert set(summary) <= set(documented)
    assert set(summary["rows"][0]) <= set(documented)
    assert [row["replicas"] for row in summary["rows"]] == [1, 2]
