"""The one redactor: which environment values are secrets, and URL passwords in any text."""

from __future__ import annotations

import pytest

from capacity_pack import redact
from capacity_pack.plan.system import OpenAITarget


def test_a_url_password_is_redacted_however_short_and_the_user_name_kept() -> None:
    text = "API request to http://alice:PW@127.0.0.1:5000/api/2.0/mlflow/runs/get failed"
    assert redact.redact_text(text, []) == (
        "API request to http://alice:[redacted]@127.0.0.1:5000/api/2.0/mlflow/runs/get failed"
    )
    # An unencoded "@" in the password: the userinfo ends at the last "@", as urllib reads it.
    assert redact.redact_text("see https://u:p@ss@host/x, then", []) == (
        "see https://u:[redacted]@host/x, then"
    )
    for kept in ("http://127.0.0.1:8000/v1", "postgresql://mlflow@db:5432/x", "a@b c:d"):
        assert redact.redact_text(kept, []) == kept


def test_every_uri_variable_and_the_tracking_credentials_count(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://alice:track-pw-123@127.0.0.1:5000")
    monkeypatch.setenv("CP_STORE_URL", "postgresql://bob:store%40pw-456@db/x")
    monkeypatch.setenv("MLFLOW_TRACKING_PASSWORD", "basic-pw-789")
    monkeypatch.setenv("MLFLOW_TRACKING_TOKEN", "token-abc-012")
    monkeypatch.setenv("CP_PLAIN_URL", "http://127.0.0.1:8000")
    found = set(redact.secret_values())
    assert {"track-pw-123", "store@pw-456", "store%40pw-456"} <= found
    assert {"basic-pw-789", "token-abc-012"} <= found
    assert "http://127.0.0.1:8000" not in found
    assert redact.redact_text("dsn password=store@pw-456 token-abc-012") == (
        "dsn password=[redacted] [redacted]"
    )


def test_a_validated_target_makes_its_key_a_secret_of_the_process(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A variable name that no secret heuristic recognises: only api_key_env tells.
    monkeypatch.setenv("CP_ENDPOINT_X7Q", "sk-watched-value-1234")
    assert "sk-watched-value-1234" not in redact.secret_values()
    OpenAITarget(
        kind="openai",
        base_url="http://127.0.0.1:8000",
        cache_reset="none",
        api_key_env="CP_ENDPOINT_X7Q",
    )
    assert "sk-watched-value-1234" in redact.secret_values()
    assert redact.redact_text("Bearer sk-watched-value-1234") == "Bearer [redacted]"
