"""The launcher's proxy URL for harnesses: credentials that carry the rollout id and the
proxy's password, read from the same ``--set`` the addon reads."""

from __future__ import annotations

from pathlib import Path
from urllib.parse import unquote, urlsplit

import pytest

from mitm_addon.launch import ForgeError, RunningProxy
from mitm_addon.launch.proxy import _proxy_password


def proxy(password: str | None) -> RunningProxy:
    return RunningProxy(
        process=None,  # type: ignore[arg-type]  # client_url needs no process
        port=8123,
        confdir=Path("/nonexistent"),
        run_id="r",
        log_path=Path("/nonexistent/log"),
        password=password,
    )


def test_without_a_password_or_a_rollout_the_harness_gets_the_plain_address() -> None:
    assert proxy(None).client_url() == "http://127.0.0.1:8123"


def test_a_rollout_without_a_password_is_the_user_name_with_a_placeholder_password() -> None:
    assert proxy(None).client_url("task.0") == "http://task.0:x@127.0.0.1:8123"


def test_the_password_and_the_rollout_survive_any_characters() -> None:
    url = urlsplit(proxy("p@ss:w/rd %?#").client_url("task/1:a"))
    assert (unquote(url.username or ""), unquote(url.password or "")) == (
        "task/1:a",
        "p@ss:w/rd %?#",
    )
    assert (url.hostname, url.port) == ("127.0.0.1", 8123)


def test_a_password_without_a_rollout_leaves_the_user_name_empty() -> None:
    assert proxy("s3cret").client_url() == "http://:s3cret@127.0.0.1:8123"


def test_the_password_is_read_from_the_last_set_as_the_addon_reads_it(tmp_path: Path) -> None:
    secret = tmp_path / "pw"
    secret.write_text("from-file\nignored\n")
    extra = [
        "forge_proxy_password=first",
        "forge_max_body_bytes=10",
        f"forge_proxy_password=@{secret}",
    ]
    assert _proxy_password(extra) == "from-file"
    assert _proxy_password(["forge_max_body_bytes=10"]) is None
    assert _proxy_password(["forge_proxy_password="]) is None


def test_an_unreadable_password_file_is_a_clear_error_before_the_proxy_starts(
    tmp_path: Path,
) -> None:
    with pytest.raises(ForgeError, match=r"forge_proxy_password: cannot read .*missing"):
        _proxy_password([f"forge_proxy_password=@{tmp_path / 'missing'}"])
    (tmp_path / "empty").write_text("")
    with pytest.raises(ForgeError, match="is empty"):
        _proxy_password([f"forge_proxy_password=@{tmp_path / 'empty'}"])
