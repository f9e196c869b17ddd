"""A PEP 517 build backend in the standard library alone.

It builds the pure-Python wheel (and sdist) of ckpt-client, so that
`pip install ./clients/python` needs nothing from a package index, not even
setuptools or wheel. The metadata is read from pyproject.toml's [project].
"""

from __future__ import annotations

import base64
import hashlib
import io
import os
import re
import tarfile
import zipfile
from typing import Any, Dict, List, Optional

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGE = "ckpt_client"


def _project() -> Dict[str, str]:
    text = open(os.path.join(ROOT, "pyproject.toml"), encoding="utf-8").read()
    section = text.split("[project]", 1)[1].split("\n[", 1)[0]
    out = {}
    for key in ("name", "version", "description", "requires-python"):
        m = re.search(rf'^{re.escape(key)}\s*=\s*"([^"]*)"', section, re.M)
        if m:
            out[key] = m.group(1)
    return out


def _dist() -> str:
    p = _project()
    return f"{p['name'].replace('-', '_')}-{p['version']}"


def _metadata() -> str:
    p = _project()
    readme = open(os.path.join(ROOT, "README.md"), encoding="utf-8").read()
    return (f"Metadata-Version: 2.1\nName: {p['name']}\nVersion: {p['version']}\nSummary: {p['description']}\n"
            f"Requires-Python: {p['requires-python']}\nLicense: Apache-2.0\n"
            f"Description-Content-Type: text/markdown\n\n{readme}")


def _files() -> List[str]:
    out = []
    for name in sorted(os.listdir(os.path.join(ROOT, PACKAGE))):
        if name.endswith(".py") or name == "py.typed":
            out.append(f"{PACKAGE}/{name}")
    return out


def get_requires_for_build_wheel(config_settings: Optional[Dict[str, Any]] = None) -> List[str]:
    return []


def get_requires_for_build_sdist(config_settings: Optional[Dict[str, Any]] = None) -> List[str]:
    return []


def prepare_metadata_for_build_wheel(metadata_directory: str,
                                     config_settings: Optional[Dict[str, Any]] = None) -> str:
    info = f"{_dist()}.dist-info"
    os.makedirs(os.path.join(metadata_directory, info), exist_ok=True)
    with open(os.path.join(metadata_directory, info, "METADATA"), "w", encoding="utf-8") as f:
        f.write(_metadata())
    return info


def build_wheel(wheel_directory: str, config_settings: Optional[Dict[str, Any]] = None,
                metadata_directory: Optional[str] = None) -> str:
    dist = _dist()
    name = f"{dist}-py3-none-any.whl"
    info = f"{dist}.dist-info"
    entries = [(f, open(os.path.join(ROOT, f), "rb").read()) for f in _files()]
    entries.append((f"{info}/METADATA", _metadata().encode()))
    entries.append((f"{info}/WHEEL", b"Wheel-Version: 1.0\nGenerator: ckpt_build\nRoot-Is-Purelib: true\nTag: py3-none-any\n"))
    record = io.StringIO()
    for path, data in entries:
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        record.write(f"{path},sha256={digest},{len(data)}\n")
    record.write(f"{info}/RECORD,,\n")
    entries.append((f"{info}/RECORD", record.getvalue().encode()))
    with zipfile.ZipFile(os.path.join(wheel_directory, name), "w", zipfile.ZIP_DEFLATED) as z:
        for path, data in entries:
            z.writestr(zipfile.ZipInfo(path, date_time=(2020, 1, 1, 0, 0, 0)), data)
    return name


def build_sdist(sdist_directory: str, config_settings: Optional[Dict[str, Any]] = None) -> str:
    dist = _dist()
    name = f"{dist}.tar.gz"
    with tarfile.open(os.path.join(sdist_directory, name), "w:gz") as tar:
        for f in _files() + ["pyproject.toml", "README.md", "_build/ckpt_build.py"]:
            tar.add(os.path.join(ROOT, f), arcname=f"{dist}/{f}")
        data = _metadata().encode()
        ti = tarfile.TarInfo(f"{dist}/PKG-INFO")
        ti.size = len(data)
        tar.addfile(ti, io.BytesIO(data))
    return name
