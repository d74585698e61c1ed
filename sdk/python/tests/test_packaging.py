"""The in-tree build backend (no daemon needed)."""

from __future__ import annotations

import os
import sys
import tarfile
import zipfile

import forkd

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "_backend"))

import forkd_build_backend as backend  # noqa: E402


def test_version_matches_pyproject() -> None:
    assert backend._project()["version"] == forkd.__version__


def test_toml_subset_parser_matches_tomllib() -> None:
    try:
        import tomllib
    except ImportError:  # Python < 3.11: the subset parser is what runs
        return
    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
        text = f.read().decode()
    assert backend._parse_toml_subset(text) == tomllib.loads(text)


def test_wheel_contents(tmp_path: "os.PathLike[str]") -> None:
    name = backend.build_wheel(str(tmp_path))
    assert name == "forkd-%s-py3-none-any.whl" % forkd.__version__
    with zipfile.ZipFile(os.path.join(str(tmp_path), name)) as z:
        names = set(z.namelist())
        meta = z.read("forkd-%s.dist-info/METADATA" % forkd.__version__).decode()
        record = z.read("forkd-%s.dist-info/RECORD" % forkd.__version__).decode()
    for want in ("forkd/__init__.py", "forkd/sandbox.py", "forkd/py.typed"):
        assert want in names and want in record
    assert not any("__pycache__" in n or n.startswith("tests/") for n in names)
    assert "Requires-Python: >=3.9" in meta and "Requires-Dist" not in meta


def test_sdist_and_editable(tmp_path: "os.PathLike[str]") -> None:
    sd = backend.build_sdist(str(tmp_path))
    with tarfile.open(os.path.join(str(tmp_path), sd)) as t:
        names = t.getnames()
    base = "forkd-%s/" % forkd.__version__
    for want in ("pyproject.toml", "PKG-INFO", "_backend/forkd_build_backend.py", "forkd/py.typed"):
        assert base + want in names
    ed = backend.build_editable(str(tmp_path))
    with zipfile.ZipFile(os.path.join(str(tmp_path), ed)) as z:
        pth = [n for n in z.namelist() if n.endswith(".pth")]
        assert len(pth) == 1 and z.read(pth[0]).decode().strip() == ROOT
