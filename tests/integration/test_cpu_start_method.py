"""The CPU start method for SGLang's child processes (``patches/cpu/platform.py``): ``fork`` by
default, ``spawn`` on request, anything else refused with the variable named; under ``fork`` an
AFTER hook on the function where SGLang sets ``spawn`` sets ``fork`` again, and under ``spawn``
nothing is hooked (SGLang's own choice stands)."""

from __future__ import annotations

import multiprocessing

import pytest

from patches.cpu import platform as cpu_platform

pytestmark = pytest.mark.integration


@pytest.mark.parametrize("environ, expected", [
    ({}, "fork"),
    ({cpu_platform.START_METHOD_ENV: "fork"}, "fork"),
    ({cpu_platform.START_METHOD_ENV: "spawn"}, "spawn"),
])
def test_start_method(environ, expected):
    assert cpu_platform.start_method(environ) == expected


@pytest.mark.parametrize("value", ["", "forkserver", "Fork", "spawn "])
def test_other_start_methods_are_refused_naming_the_variable(value):
    with pytest.raises(ValueError, match=f"{cpu_platform.START_METHOD_ENV}={value!r}: choose one of fork, spawn"):
        cpu_platform.start_method({cpu_platform.START_METHOD_ENV: value})


def _registered(environ):
    calls = []
    targets = cpu_platform.register_start_method(lambda target, hook, kind: calls.append((target, hook, kind)),
                                                 environ)
    return calls, targets


@pytest.mark.parametrize("environ", [{}, {cpu_platform.START_METHOD_ENV: "fork"}])
def test_fork_hooks_where_sglang_sets_spawn(environ):
    calls, targets = _registered(environ)
    assert calls == [(cpu_platform.ENGINE_CONFIG, cpu_platform._fork_after_engine_config, "after")]
    assert targets == [cpu_platform.ENGINE_CONFIG]


def test_spawn_leaves_sglang_alone():
    assert _registered({cpu_platform.START_METHOD_ENV: "spawn"}) == ([], [])


def test_a_bad_value_registers_nothing():
    calls = []
    with pytest.raises(ValueError):
        cpu_platform.register_start_method(lambda *a: calls.append(a), {cpu_platform.START_METHOD_ENV: "x"})
    assert calls == []


def test_the_hook_replaces_spawn_with_fork():
    before = multiprocessing.get_start_method(allow_none=True)
    try:
        multiprocessing.set_start_method("spawn", force=True)  # what SGLang's function ends with
        assert cpu_platform._fork_after_engine_config(None, object()) is None  # result unchanged
        assert multiprocessing.get_start_method() == "fork"
    finally:
        multiprocessing.set_start_method(before, force=True)


def test_the_target_is_where_sglang_sets_spawn():
    """The hooked function exists and is the one that sets ``spawn`` (a moved call would leave the
    hook in place and the children spawned)."""
    import inspect

    from patches.plugin import _resolve

    source = inspect.getsource(inspect.unwrap(_resolve(cpu_platform.ENGINE_CONFIG)))
    assert 'mp.set_start_method("spawn", force=True)' in source
