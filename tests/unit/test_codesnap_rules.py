"""The code snapshot's pure rules (launcher/run/codewalk.py, codestore.py):
which names are credentials, how the recorded diff is scanned, what an
entry's manifest must give (issue 52)."""

from __future__ import annotations

import pytest

from launcher.config.compose import compose
from launcher.config.validate import ConfigError, check_code_include
from launcher.run.codestore import PRIVATE_KEY, manifest_digest
from launcher.run.codewalk import credential_name, included, scan_diff


@pytest.mark.parametrize(
    "rel",
    [
        ".env",
        "app/.env.production",
        "prod.env",
        ".netrc",
        "s3/credentials",
        "gcp/application_default_credentials.json",
        ".ssh/id_ed25519",
        ".aws/config",
        "id_rsa",
        "tls/server.key",
        "store.p12",
    ],
)
def test_credential_names_are_left_out(rel: str) -> None:
    assert credential_name(rel) is not None


@pytest.mark.parametrize("rel", ["train.py", ".env.example", "id_rsa.pub", "envs/a.yaml", "keys.py"])
def test_ordinary_names_are_packed(rel: str) -> None:
    assert credential_name(rel) is None


def test_private_keys_are_found_by_content_also_inside_json() -> None:
    assert PRIVATE_KEY.search(b"x\n-----BEGIN OPENSSH PRIVATE KEY-----\nb3Blbn\n")
    assert PRIVATE_KEY.search(b'{"private_key": "-----BEGIN PRIVATE KEY-----\\nMIIE"}')
    # The scanner's own pattern (launcher/config/secrets.py) is no key.
    assert not PRIVATE_KEY.search(b're.compile(r"-----BEGIN [A-Z ]*PRIVATE KEY-----")')


def test_the_diff_is_scanned_masked_and_left_out_files_dropped() -> None:
    diff = (
        "diff --git a/train.py b/train.py\n--- a/train.py\n+++ b/train.py\n"
        "-x = 1\n+KEY = 'AKIAABCDEFGHIJKLMNOP'\n+URL = 'https://bob:hunter2@example.com/x'\n"
        "diff --git a/.env b/.env\n--- a/.env\n+++ b/.env\n+AWS_SECRET_ACCESS_KEY=abc\n"
    )
    text, said = scan_diff(diff, set())
    assert "AKIAABCDEFGHIJKLMNOP" not in text and "hunter2" not in text and "abc" not in text
    assert "+x" not in text and "-x = 1" in text and "***" in text
    assert said == ["train.py: a credential masked", ".env: left out (a credentials file)"]


def test_include_matches_a_path_or_what_is_under_it() -> None:
    assert included("secrets/.env", ("secrets",)) and included(".env", (".env",))
    assert not included(".envrc", (".env",))


def test_a_manifest_digest_covers_path_mode_and_content() -> None:
    base = manifest_digest({"a.py": "1" * 64}, {"a.py": 0o444})
    assert base != manifest_digest({"a.py": "1" * 64}, {"a.py": 0o555})
    assert base != manifest_digest({"a.py": "2" * 64}, {"a.py": 0o444})
    assert base != manifest_digest({"b.py": "1" * 64}, {"b.py": 0o444})


def test_code_include_must_name_a_path_inside_a_tree() -> None:
    cfg = compose(["launcher.code_include=[../etc/passwd]"])
    with pytest.raises(
        ConfigError, match=r"launcher.code_include\[0\]='../etc/passwd' is invalid: .*no '..'"
    ):
        check_code_include(cfg)
    check_code_include(compose(["launcher.code_include=[.env.public]"]))
