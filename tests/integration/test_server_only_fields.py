"""The server-set fields of ``tests/unit/test_route_server_only_fields.py`` against SGLang 0.5.16's
own ``GenerateReqInput`` and the ``/generate`` schema built from it (no server): each is a field
of SGLang's class with the default the unit test assumes, and a client's value for it is refused
naming it. (The module's own table, ``route_schemas.SERVER_ONLY``, is not what is checked.)"""

from __future__ import annotations

import dataclasses

import pytest

from patches import validation
from serving.route_schemas import GENERATE
from tests.unit.test_route_server_only_fields import SERVER_SET, assert_refused_and_default_accepted

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def generate():
    return validation.route_schemas()[GENERATE]


def test_every_server_set_field_is_sglangs_with_the_default_assumed():
    from sglang.srt.managers.io_struct import GenerateReqInput

    defaults = {f.name: f.default for f in dataclasses.fields(GenerateReqInput)}
    assert {name: defaults.get(name, "absent") for name in SERVER_SET} == \
        {name: default for name, (_, default) in SERVER_SET.items()}


@pytest.mark.parametrize("name", SERVER_SET)
def test_a_client_value_is_refused_by_the_real_route(generate, name):
    assert_refused_and_default_accepted(generate, name)
