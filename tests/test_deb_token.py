"""deb/gpuagent-aggregator.postinst generates the aggregator's command token once,
root-only. Runs the real script with its token directory pointed at a temporary one (the
rest of what it does is harmless here: byte-compiling a virtualenv that is not installed).
The node's package makes no token."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
TOKEN_DIR = "/etc/gpuagent/aggregator"


def _postinst(tmp_path: Path, token_dir: Path) -> Path:
    text = (REPO / "deb" / "gpuagent-aggregator.postinst").read_text()
    assert f"TOKEN_DIR={TOKEN_DIR}\n" in text
    script = tmp_path / "postinst"
    script.write_text(text.replace(f"TOKEN_DIR={TOKEN_DIR}\n", f"TOKEN_DIR={token_dir}\n"))
    return script


def _run(script: Path, *args: str) -> None:
    subprocess.run(["sh", "-e", str(script), *args], check=True, timeout=60, capture_output=True)


def test_postinst_makes_a_root_only_token_once(tmp_path: Path) -> None:
    token_dir = tmp_path / "etc" / "aggregator"
    script = _postinst(tmp_path, token_dir)
    _run(script, "configure", "")
    token = token_dir / "command-token"
    text = token.read_text()
    assert re.fullmatch(r"[0-9a-f]{64}\n", text), text
    assert token.stat().st_mode & 0o777 == 0o600
    assert token_dir.stat().st_mode & 0o777 == 0o755  # certificates beside it stay readable
    assert sorted(p.name for p in token_dir.iterdir()) == ["command-token"]
    _run(script, "configure", "0.1.0")  # an upgrade keeps it
    assert token.read_text() == text
    token.unlink()
    _run(script, "configure", "0.1.0")  # a new one if it went missing, not the same one
    assert token.read_text() != text


def test_postinst_keeps_a_token_an_admin_put_there(tmp_path: Path) -> None:
    token_dir = tmp_path / "aggregator"
    token_dir.mkdir()
    (token_dir / "command-token").write_text("mine\n")
    _run(_postinst(tmp_path, token_dir), "configure", "")
    assert (token_dir / "command-token").read_text() == "mine\n"


def test_postinst_does_nothing_on_other_actions(tmp_path: Path) -> None:
    token_dir = tmp_path / "aggregator"
    _run(_postinst(tmp_path, token_dir), "abort-upgrade", "0.1.0")
    assert not token_dir.exists()


def test_only_the_aggregator_package_makes_a_token() -> None:
    assert "TOKEN_DIR" not in (REPO / "deb" / "gpuagent.postinst").read_text()
    assert "command-token" not in (REPO / "deb" / "gpuagent.postrm").read_text()


def test_purge_removes_the_token() -> None:
    text = (REPO / "deb" / "gpuagent-aggregator.postrm").read_text()
    purge = text[text.index('if [ "$1" = "purge" ]') :]
    assert f"rm -f {TOKEN_DIR}/command-token" in purge
    assert purge.index(f"rmdir {TOKEN_DIR}") < purge.index("rmdir /etc/gpuagent ")
