"""A PEP 517 / PEP 660 build backend for the forkd SDK, standard library only.

Why: ``pip install ./sdk/python`` builds in an isolated environment and
would download the backend (setuptools, wheel) from PyPI first, which fails
on a machine without PyPI. This backend has no requirements, so the plain
command works offline, with or without build isolation, on any Python the
SDK supports. The package is pure Python (one ``forkd`` package plus
``py.typed``), so the wheel is a zip of it with the metadata from
``pyproject.toml``'s ``[project]`` table.

Hooks: build_wheel, build_sdist, build_editable (a .pth file pointing at
this checkout), prepare_metadata_for_build_wheel/_editable, and the
get_requires_for_* hooks (all empty).
"""

from __future__ import annotations

import base64
import hashlib
import io
import os
import re
import tarfile
import time
import zipfile
from typing import Any, Dict, List, Optional, Tuple

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGE = "forkd"
TAG = "py3-none-any"

# -- pyproject.toml ------------------------------------------------------------


def _parse_toml_subset(text: str) -> Dict[str, Any]:
    """Parse the subset of TOML this pyproject.toml uses (tables, strings,
    arrays of strings, inline tables of strings), for Pythons without
    tomllib (< 3.11)."""
    out: Dict[str, Any] = {}
    table: Dict[str, Any] = out
    lines = text.splitlines()
    i = 0
    str_re = r'"((?:[^"\\]|\\.)*)"'

    def unq(s: str) -> str:
        return bytes(s, "utf-8").decode("unicode_escape") if "\\" in s else s

    def strip_comment(line: str) -> str:
        quoted = escaped = False
        for n, ch in enumerate(line):
            if escaped:
                escaped = False
            elif ch == "\\" and quoted:
                escaped = True
            elif ch == '"':
                quoted = not quoted
            elif ch == "#" and not quoted:
                return line[:n].strip()
        return line.strip()

    while i < len(lines):
        line = strip_comment(lines[i])
        i += 1
        if not line:
            continue
        m = re.match(r"^\[([A-Za-z0-9_.\-]+)\]$", line)
        if m:
            table = out
            for part in m.group(1).split("."):
                table = table.setdefault(part, {})
            continue
        m = re.match(r"^([A-Za-z0-9_\-]+)\s*=\s*(.*)$", line)
        if not m:
            continue
        key, val = m.group(1), m.group(2).strip()
        if val.startswith("["):
            buf = val
            while buf.count("[") > buf.count("]") and i < len(lines):
                buf += " " + strip_comment(lines[i])
                i += 1
            table[key] = [unq(x) for x in re.findall(str_re, buf)]
        elif val.startswith("{"):
            table[key] = {k: unq(v) for k, v in re.findall(r"([A-Za-z0-9_\-]+)\s*=\s*" + str_re, val)}
        elif val.startswith('"'):
            sm = re.match(str_re, val)
            table[key] = unq(sm.group(1)) if sm else ""
        else:
            table[key] = val
    return out


def _pyproject() -> Dict[str, Any]:
    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
        data = f.read()
    try:
        import tomllib  # Python >= 3.11
    except ImportError:
        return _parse_toml_subset(data.decode("utf-8"))
    return tomllib.loads(data.decode("utf-8"))


def _project() -> Dict[str, Any]:
    p = dict(_pyproject().get("project") or {})
    if not p.get("name") or not p.get("version"):
        raise RuntimeError("pyproject.toml: [project] needs name and version")
    return p


def _dist_name(p: Dict[str, Any]) -> str:
    return re.sub(r"[-_.]+", "_", p["name"]).lower()


def _metadata(p: Dict[str, Any]) -> str:
    lines = [
        "Metadata-Version: 2.1",
        "Name: %s" % p["name"],
        "Version: %s" % p["version"],
    ]
    if p.get("description"):
        lines.append("Summary: %s" % p["description"])
    if p.get("requires-python"):
        lines.append("Requires-Python: %s" % p["requires-python"])
    lic = p.get("license")
    if isinstance(lic, dict) and lic.get("text"):
        lines.append("License: %s" % lic["text"])
    if p.get("keywords"):
        lines.append("Keywords: %s" % ",".join(p["keywords"]))
    for c in p.get("classifiers") or []:
        lines.append("Classifier: %s" % c)
    for k, v in (p.get("urls") or {}).items():
        lines.append("Project-URL: %s, %s" % (k, v))
    for d in p.get("dependencies") or []:
        lines.append("Requires-Dist: %s" % d)
    body = ""
    readme = p.get("readme")
    if isinstance(readme, str) and os.path.exists(os.path.join(ROOT, readme)):
        lines.append("Description-Content-Type: text/markdown" if readme.endswith(".md") else "Description-Content-Type: text/plain")
        with open(os.path.join(ROOT, readme), encoding="utf-8") as f:
            body = f.read()
    return "\n".join(lines) + "\n\n" + body


def _package_files() -> List[Tuple[str, str]]:
    """(path in the wheel, path on disk) of the package, sorted."""
    out = []
    base = os.path.join(ROOT, PACKAGE)
    for dirpath, dirnames, filenames in os.walk(base):
        dirnames[:] = sorted(d for d in dirnames if d != "__pycache__")
        for fn in sorted(filenames):
            if fn.endswith((".py", ".typed")):
                full = os.path.join(dirpath, fn)
                out.append((os.path.relpath(full, ROOT).replace(os.sep, "/"), full))
    return out


# -- wheels --------------------------------------------------------------------


def _dist_info_files(p: Dict[str, Any], top_level: str) -> List[Tuple[str, bytes]]:
    di = "%s-%s.dist-info" % (_dist_name(p), p["version"])
    wheel = "Wheel-Version: 1.0\nGenerator: forkd_build_backend\nRoot-Is-Purelib: true\nTag: %s\n" % TAG
    return [
        (di + "/METADATA", _metadata(p).encode("utf-8")),
        (di + "/WHEEL", wheel.encode()),
        (di + "/top_level.txt", (top_level + "\n").encode()),
    ]


def _record_line(name: str, data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return "%s,sha256=%s,%d" % (name, digest, len(data))


def _write_wheel(wheel_directory: str, entries: List[Tuple[str, bytes]], p: Dict[str, Any]) -> str:
    name = "%s-%s-%s.whl" % (_dist_name(p), p["version"], TAG)
    di = "%s-%s.dist-info" % (_dist_name(p), p["version"])
    record = [_record_line(n, d) for n, d in entries] + [di + "/RECORD,,"]
    entries = entries + [(di + "/RECORD", ("\n".join(record) + "\n").encode())]
    epoch = os.environ.get("SOURCE_DATE_EPOCH")
    stamp = time.gmtime(int(epoch)) if epoch else time.gmtime()
    date_time = tuple(stamp[:6]) if stamp.tm_year >= 1980 else (1980, 1, 1, 0, 0, 0)
    path = os.path.join(wheel_directory, name)
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as z:
        for n, d in entries:
            zi = zipfile.ZipInfo(n, date_time=date_time)  # type: ignore[arg-type]
            zi.external_attr = 0o644 << 16
            zi.compress_type = zipfile.ZIP_DEFLATED
            z.writestr(zi, d)
    return name


def get_requires_for_build_wheel(config_settings: Optional[Dict[str, Any]] = None) -> List[str]:
    return []


def get_requires_for_build_sdist(config_settings: Optional[Dict[str, Any]] = None) -> List[str]:
    return []


def get_requires_for_build_editable(config_settings: Optional[Dict[str, Any]] = None) -> List[str]:
    return []


def prepare_metadata_for_build_wheel(metadata_directory: str, config_settings: Optional[Dict[str, Any]] = None) -> str:
    p = _project()
    files = _dist_info_files(p, PACKAGE)
    for n, d in files:
        full = os.path.join(metadata_directory, n)
        os.makedirs(os.path.dirname(full), exist_ok=True)
        with open(full, "wb") as f:
            f.write(d)
    return files[0][0].split("/")[0]


prepare_metadata_for_build_editable = prepare_metadata_for_build_wheel


def build_wheel(
    wheel_directory: str,
    config_settings: Optional[Dict[str, Any]] = None,
    metadata_directory: Optional[str] = None,
) -> str:
    p = _project()
    entries: List[Tuple[str, bytes]] = []
    for arc, full in _package_files():
        with open(full, "rb") as f:
            entries.append((arc, f.read()))
    return _write_wheel(wheel_directory, entries + _dist_info_files(p, PACKAGE), p)


def build_editable(
    wheel_directory: str,
    config_settings: Optional[Dict[str, Any]] = None,
    metadata_directory: Optional[str] = None,
) -> str:
    """An editable wheel: a .pth file that puts this checkout on sys.path."""
    p = _project()
    pth = ("_%s_editable.pth" % _dist_name(p), (ROOT + "\n").encode())
    return _write_wheel(wheel_directory, [pth] + _dist_info_files(p, PACKAGE), p)


def build_sdist(sdist_directory: str, config_settings: Optional[Dict[str, Any]] = None) -> str:
    p = _project()
    base = "%s-%s" % (_dist_name(p), p["version"])
    name = base + ".tar.gz"
    files = ["pyproject.toml", "README.md", "bench_overhead.py", "_backend/forkd_build_backend.py"]
    files += [arc for arc, _ in _package_files()]
    tests = os.path.join(ROOT, "tests")
    if os.path.isdir(tests):
        files += sorted("tests/" + f for f in os.listdir(tests) if f.endswith(".py"))
    path = os.path.join(sdist_directory, name)
    mtime = int(os.environ.get("SOURCE_DATE_EPOCH") or time.time())
    with tarfile.open(path, "w:gz", format=tarfile.PAX_FORMAT) as t:
        def add(arc: str, data: bytes) -> None:
            ti = tarfile.TarInfo("%s/%s" % (base, arc))
            ti.size, ti.mtime, ti.mode = len(data), mtime, 0o644
            t.addfile(ti, io.BytesIO(data))

        for rel in files:
            full = os.path.join(ROOT, rel)
            if os.path.exists(full):
                with open(full, "rb") as f:
                    add(rel, f.read())
        add("PKG-INFO", _metadata(p).encode("utf-8"))
    return name
