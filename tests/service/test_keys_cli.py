"""``driftline keys`` and ``serve``'s refusal to bind openly without a key."""

from __future__ import annotations

from pathlib import Path

from typer.testing import CliRunner

from service.auth.keys import KeySnapshot
from service.cli import app
from service.store import Database


def _run(*args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(app, list(args))
    return result.exit_code, result.stdout, result.stderr


def test_create_prints_the_key_once_and_list_never_shows_it(tmp_path: Path) -> None:
    where = ("--data-dir", str(tmp_path))
    code, out, err = _run("keys", "create", "ops", "--scope", "read", "--scope", "ingest", *where)
    assert code == 0, err
    token = out.strip()
    assert token.startswith("dlk_") and "only its hash is kept" in err
    db = Database(f"sqlite:///{tmp_path / 'driftline.db'}")
    entry = KeySnapshot.load(db).match(token)
    assert entry is not None and entry.rights == {"read", "ingest"}
    code, listing, _ = _run("keys", "list", *where)
    assert "ops" in listing and "ingest,read" in listing and token not in listing
    assert _run("keys", "create", "ops", "--scope", "read", *where)[0] == 1  # name in force
    assert _run("keys", "create", "ops", "--scope", "read", "--if-absent", *where)[0] == 0
    assert _run("keys", "revoke", "ops", *where)[0] == 0
    assert KeySnapshot.load(db).match(token) is None
    assert "ops" not in _run("keys", "list", *where)[1]
    assert "ops" in _run("keys", "list", "--all", *where)[1]
    assert _run("keys", "revoke", "ops", *where)[0] == 1
    db.dispose()


def test_an_unknown_scope_is_refused(tmp_path: Path) -> None:
    code, _, err = _run("keys", "create", "x", "--scope", "root", "--data-dir", str(tmp_path))
    assert code == 2 and "root" in err


def test_serve_refuses_a_non_loopback_address_without_keys(tmp_path: Path) -> None:
    code, _, err = _run("serve", "--host", "0.0.0.0", "--data-dir", str(tmp_path))
    assert code == 2
    assert "refusing to serve on 0.0.0.0 without API keys" in err
    assert "--insecure" in err and "driftline keys create" in err


def test_serve_checks_pass_with_a_key_or_insecure_or_on_loopback(
    tmp_path: Path, monkeypatch
) -> None:
    """The check passes (and uvicorn would start) in each case where serving is safe."""
    import uvicorn

    started: list[str] = []
    monkeypatch.setattr(uvicorn, "run", lambda *_a, **kw: started.append(kw["host"]))
    where = ("--data-dir", str(tmp_path))
    assert _run("serve", "--host", "127.0.0.1", *where)[0] == 0
    assert _run("serve", "--host", "0.0.0.0", "--insecure", *where)[0] == 0
    _run("keys", "create", "admin", "--scope", "admin", *where)
    assert _run("serve", "--host", "0.0.0.0", *where)[0] == 0
    assert started == ["127.0.0.1", "0.0.0.0", "0.0.0.0"]
