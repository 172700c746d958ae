"""test_server_responses_tools.py - function calls and reasoning on the OpenAI
Responses API (POST /v1/responses), as Codex uses it, with the official
openai SDK's client.responses; the chat route's answers to the same
conversation are the reference.

The model is make_scripted_chat_model.py (see test_server_tools.py): greedy
decoding emits a real Qwen3 <tool_call> for get_weather when no tool result
is in the context, and the answer "Sunny in Paris." once one is.
"""
import json
import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import make_scripted_chat_model as scripted  # noqa: E402
from test_server import Server, raw  # noqa: E402

openai = pytest.importorskip("openai")

MODEL_ID = "tiny-chat"
PARAMS = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
WEATHER = {"type": "function", "name": "get_weather", "description": "The weather in a city", "parameters": PARAMS}
CHAT_WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "The weather in a city",
                                                 "parameters": PARAMS}}
QUESTION = "What is the weather in Paris?"
ASK = [{"role": "user", "content": QUESTION}]


@pytest.fixture(scope="module")
def srv(tmp_path_factory):
    d = scripted.build(str(tmp_path_factory.mktemp("scripted-resp")))
    s = Server(d, str(tmp_path_factory.mktemp("log") / "resp-tools.log"), "--ctx", "2048")
    yield s
    s.stop()


@pytest.fixture(scope="module")
def client(srv):
    return srv.client()


def test_function_call_equals_chat_route(client):
    chat = client.chat.completions.create(model=MODEL_ID, messages=ASK, tools=[CHAT_WEATHER], max_tokens=64)
    (want,) = chat.choices[0].message.tool_calls
    r = client.responses.create(model=MODEL_ID, input=QUESTION, tools=[WEATHER], max_output_tokens=64)
    assert r.status == "completed"
    calls = [o for o in r.output if o.type == "function_call"]
    assert [o.type for o in r.output] == ["function_call"]
    (c,) = calls
    assert c.name == want.function.name and c.arguments == want.function.arguments
    assert json.loads(c.arguments) == scripted.CALL_ARGS
    assert c.call_id.startswith("call_") and c.id.startswith("fc_") and c.status == "completed"
    assert r.tools[0].name == "get_weather"  # the request's tools, echoed in their shape
    assert r.usage.input_tokens == chat.usage.prompt_tokens


def test_function_call_output_turn(client):
    """The Codex loop: the call and its output sent back as input items; the
    model answers, as the chat route does with the same history."""
    r = client.responses.create(model=MODEL_ID, input=QUESTION, tools=[WEATHER], max_output_tokens=64)
    (c,) = [o for o in r.output if o.type == "function_call"]
    items = [{"role": "user", "content": QUESTION},
             {"type": "function_call", "call_id": c.call_id, "name": c.name, "arguments": c.arguments, "id": c.id,
              "status": "completed"},
             {"type": "function_call_output", "call_id": c.call_id, "output": "sunny, 24C"}]
    r2 = client.responses.create(model=MODEL_ID, input=items, tools=[WEATHER], max_output_tokens=64)
    hist = ASK + [{"role": "assistant", "content": None,
                   "tool_calls": [{"id": c.call_id, "type": "function",
                                   "function": {"name": c.name, "arguments": c.arguments}}]},
                  {"role": "tool", "tool_call_id": c.call_id, "content": "sunny, 24C"}]
    chat = client.chat.completions.create(model=MODEL_ID, messages=hist, tools=[CHAT_WEATHER], max_tokens=64)
    assert r2.output_text == chat.choices[0].message.content == scripted.ANSWER_TEXT
    assert r2.usage.input_tokens == chat.usage.prompt_tokens
    assert [o.type for o in r2.output] == ["message"]
    # the SDK's own objects sent back as input items (what a client that keeps r.output does)
    items2 = [{"role": "user", "content": QUESTION}] + [o.model_dump(exclude_none=True) for o in r.output] + \
             [{"type": "function_call_output", "call_id": c.call_id, "output": [{"type": "input_text", "text": "sunny, 24C"}]}]
    r3 = client.responses.create(model=MODEL_ID, input=items2, tools=[WEATHER], max_output_tokens=64)
    assert r3.output_text == scripted.ANSWER_TEXT


def test_function_call_streaming(client):
    full = client.responses.create(model=MODEL_ID, input=QUESTION, tools=[WEATHER], max_output_tokens=64)
    (want,) = [o for o in full.output if o.type == "function_call"]
    types, args = [], ""
    with client.responses.stream(model=MODEL_ID, input=QUESTION, tools=[WEATHER], max_output_tokens=64) as st:
        for ev in st:
            types.append(ev.type)
            if ev.type == "response.function_call_arguments.delta":
                args += ev.delta
        final = st.get_final_response()
    assert types[:2] == ["response.created", "response.in_progress"]
    assert types[-1] == "response.completed"
    i = types.index("response.output_item.added")
    assert types[i:i + 4] == ["response.output_item.added", "response.function_call_arguments.delta",
                              "response.function_call_arguments.done", "response.output_item.done"]
    assert args == want.arguments
    (c,) = [o for o in final.output if o.type == "function_call"]
    assert (c.name, c.arguments) == (want.name, want.arguments)


def test_agent_loop(client):
    """A minimal Codex-style loop over the SDK: call tools until the model answers."""
    ran, items = [], [{"role": "user", "content": QUESTION}]
    for _ in range(4):
        r = client.responses.create(model=MODEL_ID, input=items, tools=[WEATHER], max_output_tokens=64)
        calls = [o for o in r.output if o.type == "function_call"]
        if not calls:
            break
        for c in calls:
            ran.append(json.loads(c.arguments)["city"])
            items += [c.model_dump(exclude_none=True),
                      {"type": "function_call_output", "call_id": c.call_id, "output": "sunny, 24C"}]
    assert ran == ["Paris"]
    assert r.output_text == scripted.ANSWER_TEXT


def test_tool_choice_none_and_parallel(client):
    r = client.responses.create(model=MODEL_ID, input=QUESTION, tools=[WEATHER], tool_choice="none",
                                max_output_tokens=64)
    assert [o.type for o in r.output] == ["message"] and r.output_text == scripted.CALL_TEXT
    r = client.responses.create(model=MODEL_ID, input=QUESTION, tools=[WEATHER], parallel_tool_calls=False,
                                max_output_tokens=64)
    assert [o.type for o in r.output] == ["function_call"]


def test_reasoning_item_in_history_renders_as_reasoning_content(srv):
    """A reasoning item before an assistant message reaches the template as
    that message's reasoning_content, as on the chat route."""
    items = [{"role": "user", "content": "Hi"},
             {"type": "reasoning", "id": "rs_1", "summary": [],
              "content": [{"type": "reasoning_text", "text": "Think about Paris."}]},
             {"role": "assistant", "content": [{"type": "output_text", "text": "Hmm."}]},
             {"role": "user", "content": "And now?"}]
    hist = [{"role": "user", "content": "Hi"},
            {"role": "assistant", "content": "Hmm.", "reasoning_content": "Think about Paris."},
            {"role": "user", "content": "And now?"}]
    st, _, a = raw(srv, "POST", "/v1/responses", {"model": MODEL_ID, "input": items, "max_output_tokens": 2})
    st2, _, b = raw(srv, "POST", "/v1/chat/completions", {"model": MODEL_ID, "messages": hist, "max_tokens": 2})
    assert st == 200 and st2 == 200, (a, b)
    assert a["usage"]["input_tokens"] == b["usage"]["prompt_tokens"]
    assert a["output"][0]["content"][0]["text"] == b["choices"][0]["message"]["content"]


REFUSALS = [
    ({"tools": [{"type": "web_search"}]}, "tools[0].type", "'web_search' tools"),
    ({"tools": [{"type": "function", "name": "bad name"}]}, "tools[0].name", "pattern"),
    ({"tools": [WEATHER, WEATHER]}, "tools", "unique"),
    ({"tools": [{"type": "function", "name": "f", "parameters": []}]}, "tools[0].parameters", "object"),
    ({"tools": [WEATHER], "tool_choice": {"type": "function", "name": "nope"}}, "tool_choice", "nope"),
    ({"tool_choice": "required"}, "tool_choice", "only allowed when 'tools'"),
    ({"tools": [WEATHER], "tool_choice": {"type": "file_search"}}, "tool_choice.type", "names a tool"),
    ({"reasoning": {"effort": "high"}}, "reasoning.effort", "does not read"),
    ({"reasoning": {"summary": "detailed"}}, "reasoning.summary", "summaries"),
    ({"input": [{"type": "reasoning", "summary": [], "encrypted_content": "xyz"},
                {"role": "user", "content": "x"}]}, "input[0].encrypted_content", "encrypted"),
    ({"input": [{"role": "user", "content": "x"},
                {"type": "function_call", "call_id": "c", "name": "f", "arguments": "{}"}]}, "input", "function call"),
    ({"input": [{"type": "function_call", "call_id": "c", "name": "f"}, {"role": "user", "content": "x"}]},
     "input[0].arguments", "Missing"),
    ({"input": [{"type": "function_call_output", "call_id": "c"}, {"role": "user", "content": "x"}]},
     "input[0].output", "Missing"),
    ({"input": [{"type": "function_call_output", "call_id": "c", "output": "x", "extra": 1}]},
     "input[0].extra", "Unknown"),
]


@pytest.mark.parametrize("extra,param,needle", REFUSALS, ids=[p + ":" + n for _, p, n in REFUSALS])
def test_refusals(srv, extra, param, needle):
    body = {"model": MODEL_ID, "input": QUESTION, "max_output_tokens": 4, **extra}
    st, _, resp = raw(srv, "POST", "/v1/responses", body)
    assert st == 400, resp
    assert resp["error"]["param"] == param, resp
    assert needle in resp["error"]["message"], resp


@pytest.fixture(scope="module")
def srv_think(tmp_path_factory):
    d = scripted.build(str(tmp_path_factory.mktemp("scripted-resp-think")), think=True)
    s = Server(d, str(tmp_path_factory.mktemp("log") / "resp-think.log"), "--ctx", "2048")
    yield s
    s.stop()


def test_reasoning_item_then_call(srv_think):
    """A model that thinks before its call: a reasoning item (its think block,
    as the chat route's reasoning_content), then the function_call; streamed
    as a reasoning item's events, then the call's."""
    client = srv_think.client()
    chat = client.chat.completions.create(model=MODEL_ID, messages=ASK, tools=[CHAT_WEATHER], max_tokens=64)
    want_r = chat.choices[0].message.model_extra.get("reasoning_content")
    assert want_r and scripted.THINK_TEXT in want_r
    r = client.responses.create(model=MODEL_ID, input=QUESTION, tools=[WEATHER], max_output_tokens=64)
    assert [o.type for o in r.output] == ["reasoning", "function_call"]
    assert r.output[0].content[0].type == "reasoning_text" and r.output[0].content[0].text == want_r
    assert r.output[1].name == "get_weather"
    types, rtext = [], ""
    with client.responses.stream(model=MODEL_ID, input=QUESTION, tools=[WEATHER], max_output_tokens=64) as st:
        for ev in st:
            types.append(ev.type)
            if ev.type == "response.reasoning_text.delta":
                rtext += ev.delta
        final = st.get_final_response()
    assert rtext == want_r
    assert types.index("response.reasoning_text.done") < types.index("response.function_call_arguments.delta")
    assert [o.type for o in final.output] == ["reasoning", "function_call"]
    assert final.output[0].content[0].text == want_r
    # sent back as history (reasoning item, call, output): the answer, as on the chat route
    items = [{"role": "user", "content": QUESTION}] + [o.model_dump(exclude_none=True) for o in final.output] + \
            [{"type": "function_call_output", "call_id": final.output[1].call_id, "output": "sunny, 24C"}]
    r2 = client.responses.create(model=MODEL_ID, input=items, tools=[WEATHER], max_output_tokens=64)
    assert r2.output_text == scripted.ANSWER_TEXT
