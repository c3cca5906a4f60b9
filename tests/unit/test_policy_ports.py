"""The servers a policy's gateway runs each need their own address: an endpoint picker, the
LLM processor (and its reports port), the mask sink and a listener that would bind the same
one are refused, located at the later of the two; moving one apart is accepted."""

from __future__ import annotations

import pytest

from inferway.policies import PolicyError, load_policy_text

HEAD = """\
listeners: [{name: edge, port: 18080}]
"""
OPENAI = """\
routes:
  - name: chat
    openai: {model: m}
    backends: [{service: a}]
"""
PICKED = """\
services:
  - name: a
    endpoints: ["127.0.0.1:9000"]
    picker: PICKER
"""


def _load(text: str) -> None:
    load_policy_text(text, "policy.yaml")


@pytest.mark.parametrize(
    ("llm", "picker", "line", "expected"),
    [
        (  # the picker's default moved onto the LLM processor's
            "llm: {port: 18094}\n",
            "{}",
            6,
            "service 'a''s picker would listen on 127.0.0.1:18094, which is the LLM processor's",
        ),
        (  # the reports port's default (port + 1) is the picker's http_listen
            "llm: {port: 18094}\n",
            '{listen: "127.0.0.1:18097", http_listen: "127.0.0.1:18095"}',
            6,
            "http_listen would listen on 127.0.0.1:18095, which is the LLM processor's reports",
        ),
    ],
)
def test_a_picker_on_the_llm_processors_address_is_refused(
    llm: str, picker: str, line: int, expected: str
) -> None:
    text = HEAD + llm + PICKED.replace("PICKER", picker) + OPENAI
    with pytest.raises(PolicyError, match=rf"policy.yaml:{line}:.*{expected}"):
        _load(text)


def test_pickers_and_the_llm_processor_apart_are_accepted() -> None:
    picker = '{transport: http, listen: "127.0.0.1:18094", http_listen: "127.0.0.1:18095"}'
    _load(HEAD + PICKED.replace("PICKER", picker) + OPENAI)


def test_every_server_on_its_default_port_is_accepted() -> None:
    """The LLM processor, a picker on each transport, the mask sink and the feature router,
    all on their defaults, bind apart."""
    text = (
        HEAD
        + PICKED.replace("PICKER", "{transport: http}")
        + OPENAI
        + "observability: {access_log: {enabled: true}}\n"
        + "mask: {fields: [secret]}\n"
    )
    _load(text)


def test_a_mask_sink_on_a_pickers_address_is_refused() -> None:
    text = (
        HEAD
        + PICKED.replace("PICKER", "{listen: 127.0.0.1:18096}")
        + "routes:\n  - {name: r, match: {path: {prefix: /}}, backends: [{service: a}]}\n"
        + "observability: {access_log: {enabled: true}}\n"
        + "mask: {fields: [secret]}\n"
    )
    with pytest.raises(
        PolicyError, match=r"the mask sink would listen on 127.0.0.1:18096, which is service"
    ):
        _load(text)
    _load(text.replace("mask: {fields: [secret]}", "mask: {fields: [secret], sink: {port: 18099}}"))


def test_a_picker_on_a_listeners_port_is_refused() -> None:
    text = HEAD.replace("18080", "18094") + PICKED.replace("PICKER", "{}")
    text += "routes:\n  - {name: r, match: {path: {prefix: /}}, backends: [{service: a}]}\n"
    with pytest.raises(PolicyError, match=r"which is listener 'edge''s"):
        _load(text)
