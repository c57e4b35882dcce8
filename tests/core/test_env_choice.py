"""`core.errors.env_choice`: the one reader of deepgap's environment switches (unit tests, no process)."""

import pytest

from deepgap.core.errors import UsageError, env_choice

NAME = "DEEPGAP_TEST_SWITCH"
CHOICES = ("auto", "on", "off")


def test_unset_gives_the_default_and_a_choice_is_returned(monkeypatch):
    monkeypatch.delenv(NAME, raising=False)
    assert env_choice(NAME, CHOICES, "off") == "off"
    monkeypatch.setenv(NAME, "on")
    assert env_choice(NAME, CHOICES, "off") == "on"


def test_empty_is_a_bad_value_unless_it_means_unset(monkeypatch):
    monkeypatch.setenv(NAME, "")
    with pytest.raises(UsageError, match=f"^{NAME}=''; set it to one of auto, on, off$"):
        env_choice(NAME, CHOICES, "off")
    assert env_choice(NAME, CHOICES, "off", empty_is_unset=True) == "off"


def test_a_bad_value_names_itself_and_the_fix(monkeypatch):
    monkeypatch.setenv(NAME, "yes")
    with pytest.raises(UsageError, match=f"^{NAME}='yes'; set it to one of auto, on, off$"):
        env_choice(NAME, CHOICES, "off", empty_is_unset=True)
    with pytest.raises(UsageError, match=f"^{NAME}=yes; leave it unset$") as caught:
        env_choice(NAME, CHOICES, "off", fix="leave it unset", quote=False)
    assert caught.value.exit_code == 2 and caught.value.problem == f"{NAME}=yes"
