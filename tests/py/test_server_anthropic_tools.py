"""test_server_anthropic_tools.py - tool use and thinking through
`deltafin serve`: the Anthropic Messages API with the official anthropic SDK
(plain and streamed), and reasoning on the OpenAI route (issue 14 items 3
and 4).

Two scripted models (make_scripted_chat_model.py, real Qwen3 tokenizer and
template, hand-set weights): `plain` emits a Qwen3 <tool_call> for
get_weather, `think` emits <think>THINK_TEXT</think> before it; both answer
ANSWER_TEXT once a tool result is in the context.
"""
import json
import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import make_scripted_chat_model as scripted  # noqa: E402
from test_server import Server, raw  # noqa: E402

anthropic = pytest.importorskip("anthropic")
openai = pytest.importorskip("openai")

MODEL_ID = "tiny-chat"
TOOL = {"name": "get_weather", "description": "The weather in a city",
        "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}
OAI_TOOL = {"type": "function", "function": {"name": TOOL["name"], "description": TOOL["description"],
                                             "parameters": TOOL["input_schema"]}}
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]


@pytest.fixture(scope="module")
def srv(tmp_path_factory):
    d = scripted.build(str(tmp_path_factory.mktemp("plain")))
    s = Server(d, str(tmp_path_factory.mktemp("log") / "plain.log"), "--ctx", "2048")
    yield s
    s.stop()


@pytest.fixture(scope="module")
def srv_think(tmp_path_factory):
    d = scripted.build(str(tmp_path_factory.mktemp("think")), think=True)
    s = Server(d, str(tmp_path_factory.mktemp("log") / "think.log"), "--ctx", "2048")
    yield s
    s.stop()


def aclient(s):
    return anthropic.Anthropic(base_url=f"http://127.0.0.1:{s.port}", api_key="unused", max_retries=0, timeout=60)


def test_tool_use(srv):
    m = aclient(srv).messages.create(model=MODEL_ID, max_tokens=64, messages=ASK, tools=[TOOL])
    assert m.stop_reason == "tool_use"
    (b,) = m.content
    assert b.type == "tool_use" and b.name == "get_weather" and b.input == scripted.CALL_ARGS
    assert b.id.startswith("toolu_")


def test_tool_use_streaming_equals_plain(srv):
    c = aclient(srv)
    plain = c.messages.create(model=MODEL_ID, max_tokens=64, messages=ASK, tools=[TOOL])
    events = []
    with c.messages.stream(model=MODEL_ID, max_tokens=64, messages=ASK, tools=[TOOL]) as st:
        for ev in st:
            events.append(ev.type)
        final = st.get_final_message()
    assert [(b.type, b.name, b.input) for b in final.content] == [(b.type, b.name, b.input) for b in plain.content]
    assert final.stop_reason == "tool_use"
    assert "content_block_start" in events and "input_json" in events and "content_block_stop" in events


def test_tool_result_turn(srv):
    c = aclient(srv)
    m = c.messages.create(model=MODEL_ID, max_tokens=64, messages=ASK, tools=[TOOL])
    hist = ASK + [{"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in m.content]},
                  {"role": "user", "content": [{"type": "tool_result", "tool_use_id": m.content[0].id,
                                                "content": [{"type": "text", "text": "sunny, 24C"}]}]}]
    m2 = c.messages.create(model=MODEL_ID, max_tokens=64, messages=hist, tools=[TOOL])
    assert m2.stop_reason == "end_turn"
    assert [(b.type, b.text) for b in m2.content] == [("text", scripted.ANSWER_TEXT)]


def test_same_prompt_as_openai(srv):
    """A tool_use / tool_result history renders the prompt the OpenAI route
    renders for the same conversation (count_tokens vs prompt_tokens)."""
    hist_a = ASK + [{"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_1", "name": "get_weather",
                                                       "input": {"city": "Paris"}}]},
                    {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "sunny"}]}]
    hist_o = ASK + [{"role": "assistant", "content": None, "tool_calls": [
        {"id": "toolu_1", "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\":\"Paris\"}"}}]},
                    {"role": "tool", "tool_call_id": "toolu_1", "content": "sunny"}]
    n = aclient(srv).messages.count_tokens(model=MODEL_ID, messages=hist_a, tools=[TOOL]).input_tokens
    st, _, r = raw(srv, "POST", "/v1/chat/completions", {"model": MODEL_ID, "messages": hist_o, "tools": [OAI_TOOL],
                                                         "max_tokens": 1})
    assert st == 200, r
    assert n == r["usage"]["prompt_tokens"]


def test_tool_choice_none_is_text(srv):
    m = aclient(srv).messages.create(model=MODEL_ID, max_tokens=64, messages=ASK, tools=[TOOL], tool_choice={"type": "none"})
    assert [(b.type, b.text) for b in m.content] == [("text", scripted.CALL_TEXT)]
    assert m.stop_reason == "end_turn"


def test_tool_choice_any_and_tool(srv):
    """any / tool are enforced by constrained decoding: the answer is a call
    of the tool, in Qwen3's syntax, whose input follows the schema."""
    for tc in ({"type": "any"}, {"type": "tool", "name": "get_weather"}):
        m = aclient(srv).messages.create(model=MODEL_ID, max_tokens=64, messages=ASK, tools=[TOOL], tool_choice=tc)
        assert [b.type for b in m.content] == ["tool_use"] and m.stop_reason == "tool_use"
        assert m.content[0].name == "get_weather"
        assert isinstance(m.content[0].input.get("city"), str)


# ---- thinking ----------------------------------------------------------------


def test_thinking_blocks(srv_think):
    c = aclient(srv_think)
    m = c.messages.create(model=MODEL_ID, max_tokens=64, messages=ASK, tools=[TOOL],
                          thinking={"type": "enabled", "budget_tokens": 1024})
    assert [b.type for b in m.content] == ["thinking", "tool_use"]
    assert m.content[0].thinking == scripted.THINK_TEXT
    assert m.content[1].input == scripted.CALL_ARGS and m.stop_reason == "tool_use"
    kinds = []
    with c.messages.stream(model=MODEL_ID, max_tokens=64, messages=ASK, tools=[TOOL]) as st:
        for ev in st:
            if ev.type == "content_block_delta":
                kinds.append(ev.delta.type)
        final = st.get_final_message()
    assert "thinking_delta" in kinds and "input_json_delta" in kinds
    assert [b.type for b in final.content] == ["thinking", "tool_use"]
    assert final.content[0].thinking == scripted.THINK_TEXT
    # the thinking block goes back into the history (reasoning_content for the template)
    hist = ASK + [{"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in m.content]},
                  {"role": "user", "content": [{"type": "tool_result", "tool_use_id": m.content[1].id, "content": "sunny"}]}]
    m2 = c.messages.create(model=MODEL_ID, max_tokens=64, messages=hist, tools=[TOOL])
    assert m2.content[-1].text == scripted.ANSWER_TEXT


def test_thinking_disabled_switches_template(srv_think):
    """thinking disabled sets Qwen3's enable_thinking false: the prompt gets the empty think block."""
    c = aclient(srv_think)
    on = c.messages.count_tokens(model=MODEL_ID, messages=ASK)
    off = c.messages.count_tokens(model=MODEL_ID, messages=ASK, thinking={"type": "disabled"})
    assert off.input_tokens == on.input_tokens + 4


def test_openai_reasoning_content(srv_think):
    oc = openai.OpenAI(base_url=srv_think.base, api_key="unused", max_retries=0)
    r = oc.chat.completions.create(model=MODEL_ID, messages=ASK, tools=[OAI_TOOL], max_tokens=64)
    m = r.choices[0].message
    assert m.model_extra.get("reasoning_content") == scripted.THINK_TEXT
    assert m.content is None and m.tool_calls[0].function.name == "get_weather"
    reasoning, calls = "", []
    for ch in oc.chat.completions.create(model=MODEL_ID, messages=ASK, tools=[OAI_TOOL], max_tokens=64, stream=True):
        d = ch.choices[0].delta
        reasoning += (d.model_extra or {}).get("reasoning_content") or ""
        assert not d.content
        calls += d.tool_calls or []
    assert reasoning == scripted.THINK_TEXT and calls
    # without tools: the call is text, the think block still reasoning
    r = oc.chat.completions.create(model=MODEL_ID, messages=ASK, max_tokens=64)
    assert r.choices[0].message.content == scripted.CALL_TEXT
    assert r.choices[0].message.model_extra.get("reasoning_content") == scripted.THINK_TEXT
    # reasoning_content sent back in the history is rendered by the template
    hist = ASK + [{"role": "assistant", "content": None, "reasoning_content": scripted.THINK_TEXT,
                   "tool_calls": [tc.model_dump() for tc in m.tool_calls]},
                  {"role": "tool", "tool_call_id": m.tool_calls[0].id, "content": "sunny"}]
    r2 = oc.chat.completions.create(model=MODEL_ID, messages=hist, tools=[OAI_TOOL], max_tokens=64)
    assert r2.choices[0].message.content == scripted.ANSWER_TEXT
    del hist[1]["reasoning_content"]
    r3 = oc.chat.completions.create(model=MODEL_ID, messages=hist, tools=[OAI_TOOL], max_tokens=64)
    assert r2.usage.prompt_tokens > r3.usage.prompt_tokens  # the think block of the history is in the prompt
