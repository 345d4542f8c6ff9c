"""Join tokens and the cluster secret kept in the data dir (docs/cluster.md), pure: no
processes. ``exo_p2p.net.join_token`` and ``exo_p2p.cli.cluster.membership``."""

from __future__ import annotations

import stat

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from exo_p2p.cli.errors import CliError
from exo_p2p.cli.cluster.membership import NAME_FILE, SECRET_FILE, MembershipError, make_invite, resolve_membership
from exo_p2p.cli.cluster.node_config import build_node_config
from exo_p2p.net.join_token import TOKEN_PREFIX, JoinToken, TokenError, decode_token, encode_token

ADDR = "/ip4/10.0.0.2/tcp/52514/p2p/12D3KooWLwP5qJYukzwqfMwpJQ96At89hanNvGA9QnCgTzvRVCXA"
SECRET = b"ab" * 32


@settings(max_examples=100, deadline=None)
@given(
    cluster=st.text(st.characters(min_codepoint=33, max_codepoint=126), min_size=1, max_size=64),
    secret=st.binary(min_size=16, max_size=256),
    addrs=st.lists(st.text(min_size=1, max_size=80), min_size=1, max_size=4),
)
def test_token_round_trips_and_is_base64url(cluster, secret, addrs):
    token = encode_token(JoinToken(cluster, secret, tuple(addrs)))
    assert token.startswith(TOKEN_PREFIX)
    body = token[len(TOKEN_PREFIX) :]
    assert set(body) <= set("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_")
    assert decode_token("  " + token + "\n") == JoinToken(cluster, secret, tuple(addrs))


def test_damaged_or_foreign_tokens_get_a_clear_error():
    token = encode_token(JoinToken("lab", SECRET, (ADDR,)))
    with pytest.raises(TokenError, match="checksum"):
        decode_token(token[:-3])
    flipped = token[:-5] + ("A" if token[-5] != "A" else "B") + token[-4:]
    with pytest.raises(TokenError, match="damaged"):
        decode_token(flipped)
    with pytest.raises(TokenError, match="version 2"):
        decode_token("exo2_" + token[len(TOKEN_PREFIX) :])
    with pytest.raises(TokenError, match="not a join token"):
        decode_token("hello")
    with pytest.raises(TokenError, match="secret"):
        encode_token(JoinToken("lab", b"short", (ADDR,)))
    with pytest.raises(TokenError, match="no member address"):
        encode_token(JoinToken("lab", SECRET, ()))


def test_join_stores_the_secret_and_later_starts_use_it(tmp_path):
    token = encode_token(JoinToken("lab", SECRET, (ADDR,)))
    m = resolve_membership(tmp_path, join=token, secret_file=None, cluster=None)
    assert m.cluster == "lab" and m.bootstrap == (ADDR,)
    assert m.secret_file == tmp_path / SECRET_FILE and m.secret_file.read_bytes().strip() == SECRET
    assert stat.S_IMODE(m.secret_file.stat().st_mode) == 0o600
    assert (tmp_path / NAME_FILE).read_text().strip() == "lab"
    later = resolve_membership(tmp_path, join=None, secret_file=None, cluster=None)
    assert later.secret_file == m.secret_file and later.cluster == "lab" and later.bootstrap == ()
    # through the node's flags: the stored secret and name are used without any flag
    config = build_node_config(data_dir=tmp_path)
    assert config.cluster_secret_file == m.secret_file and config.cluster == "lab"
    config = build_node_config(data_dir=tmp_path / "other", join=token)
    assert config.bootstrap == [ADDR] and config.cluster == "lab"


def test_join_flag_conflicts_are_usage_errors(tmp_path):
    token = encode_token(JoinToken("lab", SECRET, (ADDR,)))
    secret_file = tmp_path / "s"
    secret_file.write_bytes(SECRET)
    with pytest.raises(MembershipError, match="do not go together"):
        resolve_membership(tmp_path, join=token, secret_file=secret_file, cluster=None)
    with pytest.raises(MembershipError, match="not the invited cluster"):
        resolve_membership(tmp_path, join=token, secret_file=None, cluster="other")
    with pytest.raises(CliError) as e:
        build_node_config(data_dir=tmp_path, join="exo1_garbage")
    assert e.value.exit_code == 2 and "--join" in e.value.message


def test_cluster_secret_flag_is_kept_and_invite_needs_a_secret(tmp_path):
    assert resolve_membership(tmp_path, join=None, secret_file=None, cluster=None).secret_file is None  # open
    with pytest.raises(MembershipError, match="open.*To close it"):
        make_invite(tmp_path, [ADDR])
    secret_file = tmp_path / "s"
    secret_file.write_bytes(SECRET + b"\n")
    m = resolve_membership(tmp_path / "d", join=None, secret_file=secret_file, cluster="lab")
    assert m.secret_file.read_bytes().strip() == SECRET
    token = make_invite(tmp_path / "d", ["/ip4/127.0.0.1/tcp/1/p2p/x", ADDR])
    assert decode_token(token) == JoinToken("lab", SECRET, (ADDR, "/ip4/127.0.0.1/tcp/1/p2p/x"))
