"""Tool calling at the ingress: rendering fallbacks, Hermes-style parsing (whole and
streamed in any chunking), and the grammar ``tool_choice`` asks for."""

from __future__ import annotations

import json

import pytest

from roundgate.deployment.openai.errors import APIError
from roundgate.deployment.openai.tool_calls import (
    ToolStream,
    parse_calls,
    render_inputs,
    tool_grammar,
)

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    },
}
TIME = {"type": "function", "function": {"name": "get_time"}}
TEXTS = [
    ("plain answer", "plain answer", []),
    (
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>',
        None,
        [("get_weather", {"city": "Paris"})],
    ),
    (
        'Let me check. <tool_call>{"name": "get_time", "arguments": {}}</tool_call>'
        '<tool_call>{"name": "get_weather", "arguments": {"city": "Oslo"}}</tool_call>',
        "Let me check.",
        [("get_time", {}), ("get_weather", {"city": "Oslo"})],
    ),
    ("<tool_call>not json</tool_call> left", "<tool_call>not json</tool_call> left", []),
    ("a < b <tool_ca", "a < b <tool_ca", []),
]


def names_args(calls):
    return [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in calls]


@pytest.mark.parametrize(("text", "content", "calls"), TEXTS)
def test_calls_are_parsed_out_of_the_text(text, content, calls) -> None:
    got_content, got = parse_calls(text)
    assert got_content == content and names_args(got) == calls
    assert all(c["id"].startswith("call_") and c["type"] == "function" for c in got)


@pytest.mark.parametrize(("text", "content", "calls"), TEXTS)
def test_streaming_in_any_two_pieces_gives_the_same(text, content, calls) -> None:
    for cut in range(len(text) + 1):
        stream = ToolStream()
        a = stream.feed(text[:cut], final=False)
        b = stream.feed(text[cut:], final=True)
        streamed = (a[0] + b[0]).strip()
        assert streamed == (content or ""), cut
        assert names_args(a[1] + b[1]) == calls and stream.num_calls == len(calls)


def test_tools_go_to_a_template_that_knows_them_and_into_a_system_message_otherwise() -> None:
    messages = [{"role": "user", "content": "Weather?"}]
    assert render_inputs(messages, [WEATHER], "{{ tools }}") == (messages, [WEATHER])
    call = {
        "id": "c1",
        "type": "function",
        "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
    }
    history = [
        *messages,
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "c1", "content": "sunny"},
    ]
    rendered, tools = render_inputs(history, [WEATHER], "{{ messages }}")
    assert tools is None and rendered[0]["role"] == "system"
    assert '"name": "get_weather"' in rendered[0]["content"]
    assert parse_calls(rendered[2]["content"])[1][0]["function"]["name"] == "get_weather"
    assert rendered[3] == history[2]


def test_tool_choice_grammars() -> None:
    assert tool_grammar([WEATHER], "auto") is None and tool_grammar([WEATHER], "none") is None
    kind, spec = tool_grammar([WEATHER, TIME], "required")
    assert kind == "tool_call"
    assert [o["properties"]["name"]["const"] for o in json.loads(spec)["anyOf"]] == [
        "get_weather",
        "get_time",
    ]
    named = {"type": "function", "function": {"name": "get_time"}}
    one = json.loads(tool_grammar([WEATHER, TIME], named)[1])
    assert one["properties"]["name"] == {"const": "get_time"}


@pytest.mark.parametrize(
    ("tools", "choice"),
    [
        (None, "required"),
        ([WEATHER], {"type": "function", "function": {"name": "nope"}}),
        ([WEATHER], "sometimes"),
    ],
)
def test_bad_tool_choices_are_a_400(tools, choice) -> None:
    with pytest.raises(APIError) as info:
        tool_grammar(tools, choice)
    assert info.value.param == "tool_choice"


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"tools": [{"type": "function", "function": "get_time"}]}, "tools"),
        ({"tools": [{"function": {"name": "a"}}]}, "tools"),
        ({"tools": [{"type": "function", "function": {"name": "a", "parameters": []}}]}, "tools"),
        ({"tools": [WEATHER], "tool_choice": {"type": "function", "function": "x"}}, "tool_choice"),
        ({"tools": [WEATHER], "tool_choice": "sometimes"}, "tool_choice"),
    ],
)
def test_malformed_tools_are_a_400_at_parse(body, param) -> None:
    from roundgate.deployment.openai.protocol import ChatRequest, parse

    with pytest.raises(APIError) as info:
        parse(ChatRequest, {"messages": [{"role": "user", "content": "x"}], **body})
    assert (info.value.status, info.value.param) == (400, param)


def test_nested_pydantic_tools_compile_with_their_defs_at_the_root() -> None:
    """A tool whose parameters reference ``#/$defs/...`` (pydantic's nested models) gets a
    grammar that compiles: the definitions move to the call schema's root, where refs resolve."""
    from xgrammar import Grammar

    opts = {"type": "object", "properties": {"unit": {"type": "string"}}, "required": ["unit"]}
    params = {
        "type": "object",
        "properties": {"opts": {"$ref": "#/$defs/Opts"}},
        "required": ["opts"],
        "$defs": {"Opts": opts},
    }
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": params}}]
    _, text = tool_grammar(tools, "required")
    schema = json.loads(text)
    assert schema["$defs"] == {"Opts": opts}
    assert "$defs" not in schema["properties"]["arguments"]
    Grammar.from_json_schema(text)  # raised "Cannot find field '$defs'" when nested
    clash = {**params, "$defs": {"Opts": {"type": "integer"}}}
    tools.append({"type": "function", "function": {"name": "other", "parameters": clash}})
    with pytest.raises(APIError, match=r"define \$defs/Opts differently"):
        tool_grammar(tools, "required")
