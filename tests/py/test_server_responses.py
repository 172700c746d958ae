"""test_server_responses.py - the OpenAI Responses API of `deltafin serve`
(POST /v1/responses) driven by the official `openai` client's
`client.responses`, with its Chat Completions route as the reference: the
same conversation must give the same greedy answer, token for token, on both
routes (both render the same chat template and share the queue and the
generation).

The model is the tiny random-weight Qwen3 with the real Qwen3 tokenizer
(make_tiny_chat_model.py): its text is random, so what is checked is the
protocol (the SDK's own types and stream accumulator), the equality with the
chat route, and the refusal rules.
"""
import json
import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import make_tiny_chat_model  # noqa: E402
from test_server import MODEL_ID, Server, raw  # noqa: E402

openai = pytest.importorskip("openai")

INSTR = "You are terse."
CONV = [{"role": "user", "content": "Say something about the sea."},
        {"role": "assistant", "content": "It is wide."},
        {"role": "user", "content": "And the sky?"}]
CHAT_CONV = [{"role": "system", "content": INSTR}] + CONV


def as_items(conv):
    """The conversation as Responses input items, with typed content parts."""
    out = []
    for m in conv:
        part = "output_text" if m["role"] == "assistant" else "input_text"
        out.append({"type": "message", "role": m["role"], "content": [{"type": part, "text": m["content"]}]})
    return out


@pytest.fixture(scope="session")
def model_dir(tmp_path_factory):
    return make_tiny_chat_model.build(str(tmp_path_factory.mktemp("tiny-chat-resp")))


@pytest.fixture(scope="session")
def srv(model_dir, tmp_path_factory):
    s = Server(model_dir, str(tmp_path_factory.mktemp("log") / "resp-main.log"),
               "--max-request-bytes", "1MiB", "--ctx", "2048", "--max-tokens", "1024")
    yield s
    s.stop()


@pytest.fixture(scope="session")
def oc(srv):
    return srv.client()


def chat_greedy(oc, conv, n):
    r = oc.chat.completions.create(model=MODEL_ID, messages=conv, max_tokens=n, temperature=0)
    return r.choices[0].message.content, r.choices[0].finish_reason, r.usage


def test_text_equals_chat_route(oc):
    want, finish, usage = chat_greedy(oc, CHAT_CONV, 24)
    r = oc.responses.create(model=MODEL_ID, instructions=INSTR, input=as_items(CONV), max_output_tokens=24,
                            temperature=0, store=False)
    assert r.object == "response" and r.id.startswith("resp_")
    assert r.output_text == want
    assert len(r.output) == 1 and r.output[0].type == "message" and r.output[0].role == "assistant"
    assert r.output[0].content[0].type == "output_text"
    assert r.usage.input_tokens == usage.prompt_tokens
    assert r.usage.output_tokens == usage.completion_tokens
    assert r.usage.total_tokens == usage.prompt_tokens + usage.completion_tokens
    assert r.instructions == INSTR and r.max_output_tokens == 24 and r.temperature == 0
    if finish == "length":
        assert r.status == "incomplete" and r.incomplete_details.reason == "max_output_tokens"
        assert r.output[0].status == "incomplete"
    else:
        assert r.status == "completed" and r.incomplete_details is None


def test_string_input_and_developer_role(oc):
    want, _, _ = chat_greedy(oc, [{"role": "user", "content": "Hello there"}], 12)
    r = oc.responses.create(model=MODEL_ID, input="Hello there", max_output_tokens=12, temperature=0)
    assert r.output_text == want
    # developer is rendered as system, as the chat route's templates know it
    want2, _, _ = chat_greedy(oc, [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}], 12)
    r2 = oc.responses.create(model=MODEL_ID, max_output_tokens=12, temperature=0,
                             input=[{"role": "developer", "content": "Be brief."}, {"role": "user", "content": "Hi"}])
    assert r2.output_text == want2


def test_max_output_tokens_incomplete(oc):
    r = oc.responses.create(model=MODEL_ID, input="Count to one hundred, slowly.", max_output_tokens=3, temperature=0)
    _, finish, usage = chat_greedy(oc, [{"role": "user", "content": "Count to one hundred, slowly."}], 3)
    assert r.usage.output_tokens == usage.completion_tokens
    if finish == "length":
        assert r.status == "incomplete" and r.incomplete_details.reason == "max_output_tokens"


def test_stream_events_and_accumulated_text(oc):
    want, finish, usage = chat_greedy(oc, CHAT_CONV, 24)
    types, seqs, deltas, last = [], [], [], None
    with oc.responses.stream(model=MODEL_ID, instructions=INSTR, input=as_items(CONV), max_output_tokens=24,
                             temperature=0) as st:
        for ev in st:
            types.append(ev.type)
            seqs.append(ev.sequence_number)
            if ev.type == "response.output_text.delta":
                deltas.append(ev.delta)
            last = ev
        # as OpenAI's API does, a response cut by max_output_tokens ends with response.incomplete,
        # which the SDK's get_final_response() does not accept: read the lifecycle event's response
        final = st.get_final_response() if finish != "length" else last.response
    assert seqs == list(range(len(seqs)))
    end = "response.incomplete" if finish == "length" else "response.completed"
    assert types[:4] == ["response.created", "response.in_progress", "response.output_item.added",
                         "response.content_part.added"]
    assert types[-4:] == ["response.output_text.done", "response.content_part.done", "response.output_item.done", end]
    assert set(types[4:-4]) <= {"response.output_text.delta"}
    assert "".join(deltas) == want
    assert final.output_text == want
    assert final.usage.output_tokens == usage.completion_tokens
    assert final.status == ("incomplete" if finish == "length" else "completed")


def test_raw_stream_is_sse_with_event_lines(srv):
    body = {"model": MODEL_ID, "input": "Hi", "max_output_tokens": 4, "temperature": 0, "stream": True}
    status, hdrs, data = raw(srv, "POST", "/v1/responses", body)
    ctype = {k.lower(): v for k, v in hdrs.items()}.get("content-type", "")
    assert status == 200 and ctype.startswith("text/event-stream")
    events = [blk for blk in data.split("\n\n") if blk.strip()]
    for blk in events:
        lines = blk.split("\n")
        assert lines[0].startswith("event: ") and lines[1].startswith("data: ")
        assert json.loads(lines[1][6:])["type"] == lines[0][7:]


@pytest.mark.parametrize("extra, param, code", [
    ({"store": True}, "store", "unsupported_parameter"),
    ({"previous_response_id": "resp_x"}, "previous_response_id", "unsupported_parameter"),
    ({"tools": [{"type": "web_search"}]}, "tools[0].type", "unsupported_parameter"),
    ({"text": {"format": {"type": "json_schema", "name": "x", "schema": {"type": "string", "pattern": "a+"}}}},
     "text.format.schema", "unsupported_parameter"),
    ({"text": {"format": {"type": "json_schema", "name": "x", "frob": 1}}}, "text.format.frob", "unknown_parameter"),
    ({"truncation": "auto"}, "truncation", "unsupported_parameter"),
    ({"background": True}, "background", "unsupported_parameter"),
    ({"include": ["message.output_text.logprobs"]}, "include[0]", "unsupported_parameter"),
    ({"reasoning": {"effort": "high"}}, "reasoning.effort", "unsupported_parameter"),  # the template never reads it
    ({"temperature": 3}, "temperature", "invalid_value"),
    ({"max_output_tokens": 0}, "max_output_tokens", "integer_below_min_value"),
    ({"max_output_tokens": 5000}, "max_output_tokens", "integer_above_max_value"),
    ({"frobnicate": 1}, "frobnicate", "unknown_parameter"),
])
def test_refusals(oc, extra, param, code):
    with pytest.raises(openai.BadRequestError) as ei:
        oc.responses.create(model=MODEL_ID, input="Hi", max_output_tokens=extra.pop("max_output_tokens", 4),
                            extra_body=extra)
    err = ei.value.body
    assert err["param"] == param and err["code"] == code and err["type"] == "invalid_request_error"
    assert param.split("[")[0].split(".")[0] in err["message"]


@pytest.mark.parametrize("items, param", [
    ([{"type": "item_reference", "id": "x"}], "input[0].type"),
    ([{"role": "user", "content": [{"type": "input_image", "image_url": "http://x"}]}], "input[0].content[0].type"),
    ([{"role": "user", "content": [{"type": "output_text", "text": "x"}]}], "input[0].content[0].type"),
    ([{"role": "wizard", "content": "x"}], "input[0].role"),
    ([{"role": "user"}], "input[0].content"),
    ([{"role": "user", "content": "x"}, {"role": "assistant", "content": "y"}], "input"),
    ([], "input"),
])
def test_item_refusals(oc, items, param):
    with pytest.raises(openai.BadRequestError) as ei:
        oc.responses.create(model=MODEL_ID, input=items, max_output_tokens=4)
    assert ei.value.body["param"] == param


def test_missing_fields_and_wrong_model(srv):
    for body, status, param in [({"input": "x"}, 400, "model"), ({"model": MODEL_ID}, 400, "input"),
                                ({"model": "other", "input": "x"}, 404, "model")]:
        st, _, data = raw(srv, "POST", "/v1/responses", body)
        assert st == status, data
        assert data["error"]["param"] == param
    st, _, data = raw(srv, "POST", "/v1/responses", "{not json")
    assert st == 400 and "JSON" in data["error"]["message"]
    st, _, _ = raw(srv, "GET", "/v1/responses")
    assert st == 405


def test_structured_output(oc):
    """text.format json_schema / json_object: the chat route's response_format, by constrained decoding."""
    jsonschema = pytest.importorskip("jsonschema")
    schema = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 10},
                                               "age": {"type": "integer"}},
              "required": ["name", "age"], "additionalProperties": False}
    r = oc.responses.create(model=MODEL_ID, input="Describe a person.", max_output_tokens=200, temperature=0,
                            text={"format": {"type": "json_schema", "name": "person", "schema": schema, "strict": True}})
    assert r.status == "completed", r
    jsonschema.validate(json.loads(r.output_text), schema)
    assert r.text.format.type == "json_schema"
    chat = oc.chat.completions.create(model=MODEL_ID, messages=[{"role": "user", "content": "Describe a person."}],
                                      max_tokens=200, temperature=0,
                                      response_format={"type": "json_schema",
                                                       "json_schema": {"name": "person", "schema": schema, "strict": True}})
    assert r.output_text == chat.choices[0].message.content
    r = oc.responses.create(model=MODEL_ID, input="Describe a person.", max_output_tokens=200, temperature=0,
                            text={"format": {"type": "json_object"}})
    if r.status == "completed":
        assert isinstance(json.loads(r.output_text), dict)
