"""The package as pip installs it: one version, a license, TensorFlow as an extra."""

import importlib.metadata
import os
import subprocess
import sys

import pytest

import keras_scaling

tomllib = pytest.importorskip("tomllib")

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _pyproject():
    with open(os.path.join(REPO, "pyproject.toml"), "rb") as file:
        return tomllib.load(file)


def _python(code, **env):
    return subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, **env},
    )


def test_the_version_is_written_once_and_installed_metadata_agrees():
    project = _pyproject()["project"]

    assert "version" not in project and project["dynamic"] == ["version"]
    assert importlib.metadata.version("keras-scaling") == keras_scaling.__version__


def test_the_license_file_is_the_apache_2_text_that_pyproject_declares():
    with open(os.path.join(REPO, "LICENSE"), encoding="utf-8") as file:
        text = file.read()

    assert _pyproject()["project"]["license"] == "Apache-2.0"
    assert "Apache License" in text and "Version 2.0, January 2004" in text
    assert "END OF TERMS AND CONDITIONS" in text


def test_tensorflow_is_an_extra_so_pip_keeps_an_installed_tensorflow_build():
    project = _pyproject()["project"]
    names = [requirement.split(">")[0].split("=")[0] for requirement in project["dependencies"]]

    assert not [name for name in names if name.startswith(("tensorflow", "tf-"))]
    assert project["optional-dependencies"]["tensorflow"] == ["tensorflow>=2.18"]
    assert project["optional-dependencies"]["tensorflow-cpu"] == ["tensorflow-cpu>=2.18"]


def test_import_loads_neither_tensorflow_nor_the_plotting_libraries(env_with_matplotlib):
    result = _python(
        "import sys, keras_scaling, keras_scaling.cli; "
        "print(sorted(name for name in ('tensorflow', 'PIL', 'keras', 'matplotlib') "
        "if name in sys.modules))",
        PYTHONPATH=env_with_matplotlib.get("PYTHONPATH", ""),
    )

    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.strip() == "[]"


def test_matplotlib_is_the_plot_extra_and_pillow_is_no_dependency():
    project = _pyproject()["project"]
    names = [requirement.split(">")[0].split("=")[0] for requirement in project["dependencies"]]

    assert not [name for name in names if name.lower() in ("pillow", "matplotlib")]
    assert project["optional-dependencies"]["plot"] == ["matplotlib>=3.7"]
    # `make test` runs the tests of the charts.
    assert "keras-scaling[tensorflow,plot]" in project["optional-dependencies"]["test"]


def test_without_tensorflow_the_import_error_names_the_extras_to_install():
    hide_tensorflow = (
        "import sys\n"
        "class HideTensorFlow:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name == 'tensorflow':\n"
        "            raise ModuleNotFoundError(name)\n"
        "sys.meta_path.insert(0, HideTensorFlow())\n"
        "import keras_scaling\n"
    )

    result = _python(hide_tensorflow)

    assert result.returncode == 1
    message = result.stderr.strip().splitlines()[-1]
    assert message.startswith("ImportError: TensorFlow is not installed.")
    assert "pip install 'keras-scaling[tensorflow]'" in message
    assert "keras-scaling[tensorflow-cpu]" in message
