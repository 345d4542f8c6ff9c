"""A partial copy's pure rules: the journal's lines (``exo_p2p.models.copies.journal``), a
chunk checked against its manifest (``manifest.verify_chunk``) and what a shard view still
lacks (``shard_views.unverified_chunks``)."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from exo_p2p.models.copies.journal import ends_torn, journal_lines, parse_journal, without_file
from exo_p2p.models.manifest import ChunkVerificationError, verify_chunk
from exo_p2p.models.copies.shard_views import unverified_chunks
from exo_p2p.types.manifest import Chunk, ManifestFile, ModelManifest

DATA = b"abcdefgh"
MANIFEST = ModelManifest("m", 4, (
    ManifestFile("a", 8, (Chunk(0, 4, hashlib.sha256(DATA[:4]).hexdigest()), Chunk(4, 8, ""))),
    ManifestFile("d/b", 4, (Chunk(0, 4, hashlib.sha256(b"wxyz").hexdigest()),)),
))


def test_journal_lines_read_back_and_a_torn_or_foreign_line_is_skipped():
    text = journal_lines([("a", 1), ("d/b", 0)]) + "7 a\n0 nope\nx a\n1"
    assert text.startswith("1 a\n0 d/b\n")
    assert parse_journal(text, MANIFEST, lambda p: True) == [("a", 1), ("d/b", 0)]
    assert parse_journal(text, MANIFEST, lambda p: p != "a") == [("d/b", 0)]  # its file is gone


def test_without_file_drops_only_that_files_lines():
    assert without_file("0 a\n1 a\n0 d/b\n1 a b\n", "a") == "0 d/b\n1 a b\n"


def test_a_journal_ending_mid_line_is_torn(tmp_path: Path):
    journal = tmp_path / ".verified"
    assert not ends_torn(journal)
    journal.write_text("")
    assert not ends_torn(journal)
    journal.write_text("0 a\n")
    assert not ends_torn(journal)
    journal.write_text("0 a\n1")
    assert ends_torn(journal)


def test_a_chunk_is_checked_for_length_then_hash_and_a_hub_chunk_for_length_only():
    assert verify_chunk(MANIFEST, "a", 0, DATA[:4]) == (0, 4)
    assert verify_chunk(MANIFEST, "a", 1, b"????") == (4, 8)  # "": no hash yet
    with pytest.raises(ChunkVerificationError, match="hash mismatch"):
        verify_chunk(MANIFEST, "a", 0, b"abcx")
    with pytest.raises(ChunkVerificationError, match="3 bytes, expected 4"):
        verify_chunk(MANIFEST, "a", 1, b"abc")
    with pytest.raises(IndexError):
        verify_chunk(MANIFEST, "a", 2, b"")
    with pytest.raises(KeyError):
        verify_chunk(MANIFEST, "nope", 0, b"")


def test_unverified_chunks_are_what_a_view_still_lacks():
    held = {"a": {0}, "d/b": set()}
    assert unverified_chunks(held, {"a": [1, 0, 1], "d/b": [0], "c": []}) == {"a": [1], "d/b": [0]}
    assert unverified_chunks(held, {"a": [0]}) == {}
