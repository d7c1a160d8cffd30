"""The package as built: the extension beside every pure-Python file of python/braid, and pyproject.toml
installing the same (scikit-build-core, the CMake component that holds the extension and libbraid)."""
import sys
from pathlib import Path

import pytest

import braid

SOURCE = Path(__file__).resolve().parents[1]  # python/
REPOSITORY = SOURCE.parent


def test_package_has_every_source_file():
    package = Path(braid.__file__).parent
    sources = {p.name for p in (SOURCE / "braid").iterdir() if p.suffix in (".py", ".pyi") or p.name == "py.typed"}
    assert sources <= {p.name for p in package.iterdir()}
    assert list(package.glob("_braid*.so")), "the extension is not in the package folder"
    for name in sources:  # the build copies, or the installed files, are the sources'
        assert (package / name).read_bytes() == (SOURCE / "braid" / name).read_bytes(), name


@pytest.mark.skipif(sys.version_info < (3, 11), reason="tomllib (Python 3.11+) reads pyproject.toml")
def test_pyproject():
    import tomllib
    project = tomllib.loads((REPOSITORY / "pyproject.toml").read_text())
    assert project["build-system"]["build-backend"] == "scikit_build_core.build"
    assert any(r.startswith("nanobind") for r in project["build-system"]["requires"])
    skbuild = project["tool"]["scikit-build"]
    assert skbuild["wheel"]["packages"] == ["python/braid"]
    assert skbuild["install"]["components"] == ["python"]
    assert project["project"]["version"] == braid.__version__
    cmake = (SOURCE / "CMakeLists.txt").read_text()
    assert "COMPONENT python" in cmake and 'INSTALL_RPATH "$ORIGIN"' in cmake
