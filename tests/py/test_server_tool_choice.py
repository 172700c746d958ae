"""test_server_tool_choice.py - tool_choice "required" and a named function
(and Anthropic's any / tool, the Responses API's required) enforced by
constrained decoding, on a model that never calls on its own: the tiny
random-weight Qwen3 with the real Qwen3 tokenizer and template
(make_tiny_chat_model.py). Whatever its weights, the answer must be a call
in Qwen3's native syntax to a declared tool (the named one when named), with
arguments valid under the tool's schema (checked with the `jsonschema`
package), greedy and sampled; and a LangGraph ReAct agent whose model must
call gets a tool result back and goes on.
"""
import json
import os
import shutil
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import make_tiny_chat_model  # noqa: E402
from test_server import MODEL_ID, Server, raw  # noqa: E402

openai = pytest.importorskip("openai")
jsonschema = pytest.importorskip("jsonschema")

WEATHER_P = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 12},
                                              "unit": {"type": "string", "enum": ["c", "f"]}},
             "required": ["city", "unit"], "additionalProperties": False}
TIME_P = {"type": "object", "properties": {"zone": {"type": "integer"}}, "required": ["zone"],
          "additionalProperties": False}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "The weather", "parameters": WEATHER_P}},
         {"type": "function", "function": {"name": "get_time", "description": "The time", "parameters": TIME_P}}]
SCHEMAS = {"get_weather": WEATHER_P, "get_time": TIME_P}
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return make_tiny_chat_model.build(str(tmp_path_factory.mktemp("tiny-tc")))


@pytest.fixture(scope="module")
def srv(model_dir, tmp_path_factory):
    s = Server(model_dir, str(tmp_path_factory.mktemp("log") / "tc.log"), "--ctx", "2048", "--no-memo")
    yield s
    s.stop()


@pytest.fixture(scope="module")
def client(srv):
    return srv.client()


def check_calls(calls, only=None):
    assert calls, "no tool call"
    for c in calls:
        assert c.function.name in SCHEMAS and (only is None or c.function.name == only)
        jsonschema.validate(json.loads(c.function.arguments), SCHEMAS[c.function.name])


def test_auto_does_not_call(client):
    """The premise: left to itself this model answers in text."""
    r = client.chat.completions.create(model=MODEL_ID, messages=ASK, tools=TOOLS, max_tokens=48, temperature=0)
    assert r.choices[0].message.tool_calls is None


@pytest.mark.parametrize("parallel", [True, False])
def test_required_greedy(client, parallel):
    r = client.chat.completions.create(model=MODEL_ID, messages=ASK, tools=TOOLS, tool_choice="required",
                                       parallel_tool_calls=parallel, max_tokens=400, temperature=0)
    ch = r.choices[0]
    check_calls(ch.message.tool_calls)
    if not parallel:
        assert ch.finish_reason == "tool_calls", ch
        assert len(ch.message.tool_calls) == 1
    else:  # the grammar lets the model add calls until it ends the answer: a random model may go on to max_tokens
        assert ch.finish_reason in ("tool_calls", "length"), ch


@pytest.mark.parametrize("seed", [1, 2, 3, 4])
def test_required_sampled(client, seed):
    r = client.chat.completions.create(model=MODEL_ID, messages=ASK, tools=TOOLS, tool_choice="required",
                                       parallel_tool_calls=False, max_tokens=400, temperature=1.0, seed=seed)
    assert r.choices[0].finish_reason == "tool_calls"
    check_calls(r.choices[0].message.tool_calls)


@pytest.mark.parametrize("name", ["get_weather", "get_time"])
def test_named(client, name):
    r = client.chat.completions.create(model=MODEL_ID, messages=ASK, tools=TOOLS, max_tokens=400, temperature=0,
                                       parallel_tool_calls=False,
                                       tool_choice={"type": "function", "function": {"name": name}})
    assert r.choices[0].finish_reason == "tool_calls"
    check_calls(r.choices[0].message.tool_calls, only=name)


def test_required_streamed_equals_plain(client):
    kw = dict(model=MODEL_ID, messages=ASK, tools=TOOLS, tool_choice="required", parallel_tool_calls=False,
              max_tokens=400, temperature=0)
    full = client.chat.completions.create(**kw).choices[0].message.tool_calls
    calls, finish = {}, None
    for chunk in client.chat.completions.create(stream=True, **kw):
        if not chunk.choices:
            continue
        for tc in chunk.choices[0].delta.tool_calls or []:
            c = calls.setdefault(tc.index, {"name": "", "arguments": ""})
            c["name"] += (tc.function.name or "") if tc.function else ""
            c["arguments"] += (tc.function.arguments or "") if tc.function else ""
        finish = chunk.choices[0].finish_reason or finish
    assert finish == "tool_calls"
    assert [(calls[i]["name"], calls[i]["arguments"]) for i in sorted(calls)] == \
        [(c.function.name, c.function.arguments) for c in full]


def test_anthropic_any_and_tool(srv):
    anthropic = pytest.importorskip("anthropic")
    ac = anthropic.Anthropic(base_url=f"http://127.0.0.1:{srv.port}", api_key="unused", max_retries=0, timeout=60)
    tools = [{"name": t["function"]["name"], "description": t["function"]["description"],
              "input_schema": t["function"]["parameters"]} for t in TOOLS]
    for tc, only in (({"type": "any", "disable_parallel_tool_use": True}, None),
                     ({"type": "tool", "name": "get_time", "disable_parallel_tool_use": True}, "get_time")):
        m = ac.messages.create(model=MODEL_ID, max_tokens=400, messages=ASK, tools=tools, tool_choice=tc,
                               extra_body={"temperature": 0})
        assert m.stop_reason == "tool_use"
        uses = [b for b in m.content if b.type == "tool_use"]
        assert len(uses) == 1 and (only is None or uses[0].name == only)
        jsonschema.validate(uses[0].input, SCHEMAS[uses[0].name])


def test_responses_required(client):
    tools = [{"type": "function", **t["function"]} for t in TOOLS]
    r = client.responses.create(model=MODEL_ID, input="What is the weather in Paris?", tools=tools,
                                tool_choice={"type": "function", "name": "get_weather"}, max_output_tokens=400,
                                temperature=0, parallel_tool_calls=False)
    calls = [o for o in r.output if o.type == "function_call"]
    assert len(calls) >= 1 and all(c.name == "get_weather" for c in calls)
    for c in calls:
        jsonschema.validate(json.loads(c.arguments), WEATHER_P)


def test_langgraph_required_loop(srv):
    """A ReAct loop whose model must call: the random model calls get_weather,
    LangGraph runs the tool and sends its result back; the next turn (still
    required) calls again with the result in its context; the graph ends at
    its recursion limit, having run the tool with valid arguments each time."""
    lc = pytest.importorskip("langchain_openai")
    prebuilt = pytest.importorskip("langgraph.prebuilt")
    from langchain_core.tools import tool
    from langgraph.errors import GraphRecursionError

    seen = []

    @tool
    def get_weather(city: str, unit: str) -> str:
        """The weather in a city."""
        seen.append((city, unit))
        return "sunny, 24C"

    llm = lc.ChatOpenAI(base_url=srv.base, api_key="unused", model=MODEL_ID, max_retries=0, max_tokens=400,
                        temperature=0)
    agent = prebuilt.create_react_agent(llm.bind_tools([TOOLS[0]], tool_choice="required", parallel_tool_calls=False),
                                        [get_weather])
    with pytest.raises(GraphRecursionError):
        agent.invoke({"messages": [("user", "What is the weather in Paris?")]}, {"recursion_limit": 5})
    assert len(seen) >= 2
    for city, unit in seen:
        jsonschema.validate({"city": city, "unit": unit}, WEATHER_P)


def test_think_open_prompt_refused(model_dir, tmp_path_factory):
    """A template whose generation prompt opens a think block: the answer
    cannot start with the required call, so required is refused (auto works)."""
    d = tmp_path_factory.mktemp("think-open")
    for f in os.listdir(model_dir):
        shutil.copy(os.path.join(model_dir, f), d / f)
    cfg = json.loads((d / "tokenizer_config.json").read_text())
    cfg["chat_template"] = ("{% if tools %}<|im_start|>system\n{{ tools | tojson }} <tool_call><|im_end|>\n{% endif %}"
                            "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
                            "{% if add_generation_prompt %}<|im_start|>assistant\n<think>\n{% endif %}")
    (d / "tokenizer_config.json").write_text(json.dumps(cfg))
    s = Server(str(d), str(tmp_path_factory.mktemp("log") / "think-open.log"))
    try:
        body = {"model": MODEL_ID, "messages": ASK, "tools": TOOLS, "max_tokens": 4}
        st, _, r = raw(s, "POST", "/v1/chat/completions", dict(body, tool_choice="required"))
        assert st == 400 and r["error"]["param"] == "tool_choice" and "think block" in r["error"]["message"], r
        st, _, r = raw(s, "POST", "/v1/chat/completions", body)
        assert st == 200, r
    finally:
        s.stop()
