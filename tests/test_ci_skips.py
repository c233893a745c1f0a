"""A test that cannot get what it needs skips on a developer's machine and fails under CI."""

import pytest

from _ci import skip_or_fail_in_ci


@pytest.mark.parametrize("value", ["true", "1", "TRUE"])
def test_fails_under_ci(monkeypatch, value):
    monkeypatch.setenv("CI", value)
    with pytest.raises(pytest.fail.Exception, match="could not install x"):
        skip_or_fail_in_ci("could not install x")


@pytest.mark.parametrize("value", [None, "", "false"])
def test_skips_elsewhere(monkeypatch, value):
    if value is None:
        monkeypatch.delenv("CI", raising=False)
    else:
        monkeypatch.setenv("CI", value)
    with pytest.raises(pytest.skip.Exception, match="could not install x"):
        skip_or_fail_in_ci("could not install x")
