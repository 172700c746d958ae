"""test_server_tools.py - tool calls and reasoning through `deltafin serve`
(issue 14 items 1 and 3), end to end with the official openai SDK,
LangChain's ChatOpenAI and a LangGraph ReAct agent.

The model is make_scripted_chat_model.py: the tiny Qwen3 shape with the real
Qwen3 tokenizer and chat template, whose hand-set weights make greedy
decoding emit a real Qwen3 <tool_call> for get_weather when no tool result is
in the context, and the answer "Sunny in Paris." once one is. Nothing in the
server knows this: it renders the template, runs the engine and parses what
comes out, as for any model.
"""
import json
import os
import shutil
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import make_scripted_chat_model as scripted  # noqa: E402
from test_server import Server, assert_error_shape, raw  # noqa: E402

openai = pytest.importorskip("openai")

MODEL_ID = "tiny-chat"
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]


@pytest.fixture(scope="module")
def sdir(tmp_path_factory):
    return scripted.build(str(tmp_path_factory.mktemp("scripted")))


@pytest.fixture(scope="module")
def srv(sdir, tmp_path_factory):
    s = Server(sdir, str(tmp_path_factory.mktemp("log") / "tools.log"), "--ctx", "2048")
    yield s
    s.stop()


@pytest.fixture(scope="module")
def srv_notools(sdir, tmp_path_factory):
    """The same model with a ChatML template that never reads `tools`."""
    d = tmp_path_factory.mktemp("notools")
    for f in os.listdir(sdir):
        shutil.copy(os.path.join(sdir, f), d / f)
    cfg = json.loads((d / "tokenizer_config.json").read_text())
    cfg["chat_template"] = ("{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
                            "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
    (d / "tokenizer_config.json").write_text(json.dumps(cfg))
    s = Server(str(d), str(tmp_path_factory.mktemp("log") / "notools.log"))
    yield s
    s.stop()


@pytest.fixture(scope="module")
def srv_tool_use(sdir, tmp_path_factory):
    """chat_template as a list: a "default" without tools, and Qwen3's own as "tool_use"."""
    d = tmp_path_factory.mktemp("tool_use")
    for f in os.listdir(sdir):
        shutil.copy(os.path.join(sdir, f), d / f)
    cfg = json.loads((d / "tokenizer_config.json").read_text())
    cfg["chat_template"] = [
        {"name": "default", "template": "DEFAULT TEMPLATE {% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}"
                                        "<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"},
        {"name": "tool_use", "template": cfg["chat_template"]}]
    (d / "tokenizer_config.json").write_text(json.dumps(cfg))
    s = Server(str(d), str(tmp_path_factory.mktemp("log") / "tool_use.log"))
    yield s
    s.stop()


@pytest.fixture(scope="module")
def client(srv):
    return srv.client()


def test_tool_call_non_streaming(client):
    r = client.chat.completions.create(model=MODEL_ID, messages=ASK, tools=[WEATHER], max_tokens=64)
    ch = r.choices[0]
    assert ch.finish_reason == "tool_calls"
    assert ch.message.content is None
    (call,) = ch.message.tool_calls
    assert call.type == "function" and call.function.name == "get_weather"
    assert json.loads(call.function.arguments) == scripted.CALL_ARGS
    assert call.id.startswith("call_") and len(call.id) > 10
    # a second answer has another id
    r2 = client.chat.completions.create(model=MODEL_ID, messages=ASK, tools=[WEATHER], max_tokens=64)
    assert r2.choices[0].message.tool_calls[0].id != call.id


def test_tool_call_streaming_equals_non_streaming(client):
    full = client.chat.completions.create(model=MODEL_ID, messages=ASK, tools=[WEATHER], max_tokens=64, seed=1)
    calls, finish, content, order = {}, None, "", []
    for chunk in client.chat.completions.create(model=MODEL_ID, messages=ASK, tools=[WEATHER], max_tokens=64,
                                                stream=True):
        if not chunk.choices:
            continue
        d = chunk.choices[0].delta
        content += d.content or ""
        for tc in d.tool_calls or []:
            c = calls.setdefault(tc.index, {"id": None, "name": "", "arguments": ""})
            if tc.id:
                order.append("id")
                c["id"] = tc.id
            if tc.function and tc.function.name:
                order.append("name")
                c["name"] += tc.function.name
            if tc.function and tc.function.arguments:
                order.append("args")
                c["arguments"] += tc.function.arguments
        finish = chunk.choices[0].finish_reason or finish
    want = [{"name": c.function.name, "arguments": c.function.arguments} for c in full.choices[0].message.tool_calls]
    got = [{"name": calls[i]["name"], "arguments": calls[i]["arguments"]} for i in sorted(calls)]
    assert got == want
    assert finish == "tool_calls" and content == ""
    assert order[:2] == ["id", "name"] and order[2:] and set(order[2:]) == {"args"}
    assert calls[0]["id"].startswith("call_")


def test_tool_result_turn_with_null_content(client):
    """The history OpenAI clients send back: the assistant's call with
    content None, then the tool result; the model answers."""
    r = client.chat.completions.create(model=MODEL_ID, messages=ASK, tools=[WEATHER], max_tokens=64)
    m = r.choices[0].message
    hist = ASK + [m.model_dump(exclude_none=False, exclude={"refusal", "annotations", "audio", "function_call"}),
                  {"role": "tool", "tool_call_id": m.tool_calls[0].id, "content": "sunny, 24C"}]
    assert hist[1]["content"] is None
    r2 = client.chat.completions.create(model=MODEL_ID, messages=hist, tools=[WEATHER], max_tokens=64)
    assert r2.choices[0].message.content == scripted.ANSWER_TEXT
    assert r2.choices[0].message.tool_calls is None
    assert r2.choices[0].finish_reason == "stop"


def test_tool_choice_none_returns_text(client):
    r = client.chat.completions.create(model=MODEL_ID, messages=ASK, tools=[WEATHER], tool_choice="none", max_tokens=64)
    assert r.choices[0].message.tool_calls is None
    assert r.choices[0].message.content == scripted.CALL_TEXT
    assert r.choices[0].finish_reason == "stop"


def test_no_tools_no_parsing(client):
    r = client.chat.completions.create(model=MODEL_ID, messages=ASK, max_tokens=64)
    assert r.choices[0].message.content == scripted.CALL_TEXT and r.choices[0].message.tool_calls is None


def test_parallel_tool_calls_false(client):
    r = client.chat.completions.create(model=MODEL_ID, messages=ASK, tools=[WEATHER], parallel_tool_calls=False,
                                       max_tokens=64)
    assert len(r.choices[0].message.tool_calls) == 1 and r.choices[0].finish_reason == "tool_calls"


def test_undeclared_tool_is_content(client):
    """The model calls get_weather, but only `search` is declared: not a valid call, returned as text."""
    search = {"type": "function", "function": {"name": "search", "parameters": {"type": "object"}}}
    r = client.chat.completions.create(model=MODEL_ID, messages=ASK, tools=[search], max_tokens=64)
    assert r.choices[0].message.tool_calls is None
    assert r.choices[0].message.content == scripted.CALL_TEXT


def test_reasoning_content_in_history_accepted(client):
    hist = ASK + [{"role": "assistant", "content": "Hmm.", "reasoning_content": "Think about Paris."},
                  {"role": "user", "content": "And now?"}]
    r = client.chat.completions.create(model=MODEL_ID, messages=hist, max_tokens=4)
    assert r.choices[0].finish_reason in ("stop", "length")


def test_chat_template_kwargs(srv):
    # Qwen3's template reads enable_thinking: accepted, and it changes the prompt (an empty think block)
    st, _, a = raw(srv, "POST", "/v1/chat/completions", {"model": MODEL_ID, "messages": ASK, "max_tokens": 1})
    st2, _, b = raw(srv, "POST", "/v1/chat/completions", {"model": MODEL_ID, "messages": ASK, "max_tokens": 1,
                                                         "chat_template_kwargs": {"enable_thinking": False}})
    assert st == 200 and st2 == 200, (a, b)
    assert b["usage"]["prompt_tokens"] == a["usage"]["prompt_tokens"] + 4  # "<think>\n\n</think>\n\n"


REFUSALS = [
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {
        "type": "object", "properties": {"a": {"type": "string", "pattern": "^x"}}}}}], "tool_choice": "required"},
     "tools[0].function.parameters", "pattern"),
    ({"tools": [WEATHER], "tool_choice": "required", "response_format": {"type": "json_object"}}, "response_format",
     "tool_choice"),
    ({"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "nope"}}}, "tool_choice", "nope"),
    ({"tool_choice": "required"}, "tool_choice", "only allowed when 'tools'"),
    ({"tools": [WEATHER, WEATHER]}, "tools", "unique"),
    ({"tools": [{"type": "function", "function": {"name": "bad name"}}]}, "tools[0].function.name", "pattern"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": []}}]}, "tools[0].function.parameters",
     "object"),
    ({"tools": [{"type": "function", "function": {"name": "f", "x": 1}}]}, "tools[0].function.x", "Unrecognized"),
    ({"tools": [{"type": "function"}]}, "tools[0].function", "Missing"),
    ({"tool_choice": "sometimes"}, "tool_choice", "Supported values"),
    ({"reasoning_effort": "high"}, "reasoning_effort", "does not read 'reasoning_effort'"),
    ({"reasoning_effort": "extreme"}, "reasoning_effort", "expected one of"),
    ({"chat_template_kwargs": {"tools": []}}, "chat_template_kwargs.tools", "set by the request"),
    ({"chat_template_kwargs": {"nonexistent_var": 1}}, "chat_template_kwargs.nonexistent_var", "does not read"),
    ({"chat_template_kwargs": [1]}, "chat_template_kwargs", "object"),
]


@pytest.mark.parametrize("extra,param,needle", REFUSALS, ids=[p + ":" + n for _, p, n in REFUSALS])
def test_refusals(srv, extra, param, needle):
    body = {"model": MODEL_ID, "messages": ASK, "max_tokens": 4, **extra}
    st, _, resp = raw(srv, "POST", "/v1/chat/completions", body)
    assert st == 400, resp
    assert_error_shape(resp, param)
    assert needle in resp["error"]["message"], resp


def test_template_without_tools_refused(srv_notools):
    st, _, resp = raw(srv_notools, "POST", "/v1/chat/completions",
                      {"model": MODEL_ID, "messages": ASK, "tools": [WEATHER], "max_tokens": 4})
    assert st == 400, resp
    assert_error_shape(resp, "tools")
    assert "does not support tools" in resp["error"]["message"]
    # without tools the same model answers
    st, _, resp = raw(srv_notools, "POST", "/v1/chat/completions", {"model": MODEL_ID, "messages": ASK, "max_tokens": 4})
    assert st == 200, resp


def test_langchain_tool_calls(srv):
    lc = pytest.importorskip("langchain_openai")
    llm = lc.ChatOpenAI(base_url=srv.base, api_key="unused", model=MODEL_ID, max_retries=0, max_tokens=64)
    msg = llm.bind_tools([WEATHER]).invoke("What is the weather in Paris?")
    assert msg.tool_calls and msg.tool_calls[0]["name"] == "get_weather"
    assert msg.tool_calls[0]["args"] == scripted.CALL_ARGS


def test_langgraph_react_agent(srv):
    """A ReAct agent loop: the model calls get_weather, LangGraph runs the tool
    and sends its result back (content null next to tool_calls), the model
    answers."""
    lc = pytest.importorskip("langchain_openai")
    prebuilt = pytest.importorskip("langgraph.prebuilt")
    from langchain_core.tools import tool

    seen = []

    @tool
    def get_weather(city: str) -> str:
        """The weather in a city."""
        seen.append(city)
        return "sunny, 24C"

    llm = lc.ChatOpenAI(base_url=srv.base, api_key="unused", model=MODEL_ID, max_retries=0, max_tokens=64)
    agent = prebuilt.create_react_agent(llm, [get_weather])
    out = agent.invoke({"messages": [("user", "What is the weather in Paris?")]}, {"recursion_limit": 6})
    msgs = out["messages"]
    assert seen == ["Paris"]
    assert [type(m).__name__ for m in msgs] == ["HumanMessage", "AIMessage", "ToolMessage", "AIMessage"]
    assert msgs[1].tool_calls[0]["name"] == "get_weather"
    assert msgs[2].content == "sunny, 24C"
    assert msgs[-1].content == scripted.ANSWER_TEXT


def test_tool_use_template_variant(srv, srv_tool_use):
    """With tools the "tool_use" template renders (it reads tools, and the model's call is parsed);
    without tools the "default" one does (as transformers picks them)."""
    c = srv_tool_use.client()
    r = c.chat.completions.create(model=MODEL_ID, messages=ASK, tools=[WEATHER], max_tokens=64)
    assert r.choices[0].message.tool_calls[0].function.name == "get_weather"
    ref = srv.client().chat.completions.create(model=MODEL_ID, messages=ASK, tools=[WEATHER], max_tokens=64)
    assert r.usage.prompt_tokens == ref.usage.prompt_tokens  # the same template as the plain Qwen3 model
    st, _, plain = raw(srv_tool_use, "POST", "/v1/chat/completions", {"model": MODEL_ID, "messages": ASK, "max_tokens": 1})
    st2, _, ref2 = raw(srv, "POST", "/v1/chat/completions", {"model": MODEL_ID, "messages": ASK, "max_tokens": 1})
    assert st == 200 and st2 == 200
    assert plain["usage"]["prompt_tokens"] > ref2["usage"]["prompt_tokens"]  # "DEFAULT TEMPLATE " in front
