"""``patches.versions.check_pins``: the overlay refuses any SGLang but the pinned one."""

from __future__ import annotations

import pytest

from patches.versions import PINNED, VersionMismatch, check_pins

PREFIX = "the cache-policy overlay patches SGLang internals and was written for sglang==0.5.16; installed: "


def test_pins():
    assert PINNED == {"sglang": "0.5.16"}


@pytest.mark.parametrize(
    "installed",
    [
        pytest.param({"sglang": "0.5.16"}, id="exact"),
        pytest.param({"sglang": "0.5.16", "triton": "3.9.9"}, id="unpinned-extra-ignored"),
    ],
)
def test_check_pins_accepts(installed):
    assert check_pins(installed) is None


@pytest.mark.parametrize(
    "installed, installed_text",
    [
        pytest.param({"sglang": "0.5.23"}, "sglang==0.5.23 (pinned 0.5.16)", id="newer"),
        pytest.param({"sglang": "0.5.15"}, "sglang==0.5.15 (pinned 0.5.16)", id="older"),
        pytest.param({"sglang": "0.5.16.post1"}, "sglang==0.5.16.post1 (pinned 0.5.16)", id="post-release"),
        pytest.param({"sglang": None}, "sglang==None (pinned 0.5.16)", id="not-installed"),
        pytest.param({}, "sglang==None (pinned 0.5.16)", id="missing-key"),
    ],
)
def test_check_pins_rejects(installed, installed_text):
    with pytest.raises(VersionMismatch) as info:
        check_pins(installed)
    assert str(info.value) == PREFIX + installed_text


def test_version_mismatch_is_runtime_error():
    assert issubclass(VersionMismatch, RuntimeError)
