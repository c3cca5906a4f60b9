"""The Lua literals the local admission's models table is written with (the Lua itself runs
in Envoy: tests/integration/test_llm_gateway.py, ``test_envoy_admits_only_bodies_...``)."""

from __future__ import annotations

from inferway.xds.translate.llm_local_admit import local_admit_source, lua_models, lua_string


def test_lua_strings_carry_any_name_as_decimal_escapes() -> None:
    assert lua_string('a "b"\\\n/ü') == '"a \\034b\\034\\092\\010/\\195\\188"'
    table = lua_models({"gpt-4o": "llama 3", "llama 3": "llama 3"}, asking={"llama 3"})
    assert '["gpt-4o"] = {name = "llama 3", json = "\\034llama 3\\034", ask = true}' in table


def test_without_models_the_script_never_admits_locally() -> None:
    assert "local LOCAL = false" in local_admit_source(None, ())
    source = local_admit_source({"m": "m"}, ("m",))
    assert "local LOCAL = true" in source and '["m"] = {name = "m"' in source
