"""Constrained decoding (src/grammar, docs/GRAMMAR.md), checked against independent references:

- the JSON schema converter: random documents the grammar allows (tests/unit/test_grammar.c --gen) parse and
  validate under the `jsonschema` package; documents that jsonschema rejects (mutations of valid ones) are rejected
  by the grammar;
- end to end with the official `openai` SDK against the real binary and a random-weight Qwen3-tokenizer model:
  response_format json_schema (strict) and json_object outputs parse and validate; greedy output is the argmax among
  allowed tokens (every top-20 alternative that the model ranked above the chosen token cannot continue the
  document, judged by the grammar on the text so far); streaming gives the same text; every refusal is a 400 naming
  the field and the keyword; `deltafin run --json-schema/--grammar` and their refusals."""
import json
import os
import random
import subprocess
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))
from conftest import REPO, deltafin_bin  # noqa: E402

jsonschema = pytest.importorskip("jsonschema")

O = os.environ.get("O", "build")
HELPER = REPO / O / "tests" / "test_grammar"

SCHEMAS = [
    {"type": "object", "properties": {"name": {"type": "string", "maxLength": 8}, "age": {"type": "integer"},
                                      "ok": {"type": "boolean"}},
     "required": ["name", "age", "ok"], "additionalProperties": False},
    {"type": "object", "properties": {"a": {"type": ["string", "null"]}, "b": {"type": "number"},
                                      "c": {"type": "array", "items": {"type": "integer"}, "minItems": 1, "maxItems": 3}},
     "required": ["a"], "additionalProperties": False},
    {"type": "array", "items": {"enum": ["red", "green", 3, None, {"k": [1]}]}, "maxItems": 4},
    {"anyOf": [{"type": "string", "minLength": 2, "maxLength": 4}, {"const": 7}, {"type": "boolean"}]},
    {"$defs": {"node": {"type": "object", "properties": {"v": {"type": "integer"},
                                                        "kids": {"type": "array", "items": {"$ref": "#/$defs/node"},
                                                                 "maxItems": 2}},
                        "required": ["v", "kids"], "additionalProperties": False}},
     "$ref": "#/$defs/node"},
    {"type": "object", "properties": {"x": {"type": "string"}}, "required": ["x"]},  # additional properties allowed
    {"type": "object"},
    {},
]


def helper(*args, stdin=None):
    if not HELPER.exists():
        pytest.fail(f"{HELPER} not built (make unit-grammar)")
    return subprocess.run([str(HELPER), *map(str, args)], capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize("i", range(len(SCHEMAS)))
def test_generated_documents_validate(tmp_path, i):
    schema = SCHEMAS[i]
    sf = tmp_path / "s.json"
    sf.write_text(json.dumps(schema))
    r = helper("--gen", sf, 1000 + i, 60)
    assert r.returncode == 0, r.stdout + r.stderr
    docs = json.loads(r.stdout)
    assert len(docs) == 60
    for d in docs:
        v = json.loads(d)
        jsonschema.validate(v, schema)
    assert len(set(docs)) > 10, docs  # the walks are not stuck on one document


def mutations(v, rnd):
    """Documents near v: change, drop, add or retype one part."""
    out = []
    if isinstance(v, dict):
        for k in list(v):
            w = dict(v); del w[k]; out.append(w)
            for bad in ("zz", 1.5, None, [], True, "x" * 20):
                w = dict(v); w[k] = bad; out.append(w)
            for m in mutations(v[k], rnd)[:6]:
                w = dict(v); w[k] = m; out.append(w)
        w = dict(v); w["extra"] = 1; out.append(w)
    elif isinstance(v, list):
        out += [v + v, v[:-1], v + [{"q": 1}], v + ["blue"]]
        for j in range(len(v)):
            for m in mutations(v[j], rnd)[:4]:
                out.append(v[:j] + [m] + v[j + 1:])
    else:
        out += ["s", "", "toolongstring", 0, -1, 2.5, None, True, [], {}]
    return out


@pytest.mark.parametrize("i", range(len(SCHEMAS)))
def test_invalid_documents_rejected(tmp_path, i):
    schema = SCHEMAS[i]
    sf = tmp_path / "s.json"
    sf.write_text(json.dumps(schema))
    r = helper("--gen", sf, 7 + i, 15)
    assert r.returncode == 0, r.stderr
    rnd = random.Random(i)
    invalid = []
    for d in json.loads(r.stdout):
        for m in mutations(json.loads(d), rnd):
            try:
                jsonschema.validate(m, schema)
            except jsonschema.ValidationError:
                invalid.append(json.dumps(m))
    if not invalid:
        pytest.skip("every mutation is valid under this schema")
    df = tmp_path / "d.json"
    df.write_text(json.dumps(invalid))
    r = helper("--check", sf, df)
    assert r.returncode == 0, r.stderr
    verdicts = r.stdout.split()
    assert len(verdicts) == len(invalid)
    accepted = [d for d, v in zip(invalid, verdicts) if v == "1"]
    assert not accepted, f"the grammar accepts documents jsonschema rejects: {accepted[:5]}"


# ---- end to end: the server through the openai SDK ---------------------------------------------------------

openai = pytest.importorskip("openai")
import test_server as ts  # noqa: E402


@pytest.fixture(scope="module")
def srv(tmp_path_factory):
    import make_tiny_chat_model
    model = make_tiny_chat_model.build(str(tmp_path_factory.mktemp("tiny-chat")))
    s = ts.Server(model, str(tmp_path_factory.mktemp("log") / "g.log"))
    yield s
    s.stop()


PERSON = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 10}, "age": {"type": "integer"},
                                           "tags": {"type": "array", "items": {"enum": ["a", "b"]}, "maxItems": 2}},
          "required": ["name", "age", "tags"], "additionalProperties": False}


def rf_schema(schema, strict=True):
    return {"type": "json_schema", "json_schema": {"name": "person", "schema": schema, "strict": strict,
                                                   "description": "a person"}}


def chat(client, **kw):
    kw.setdefault("model", ts.MODEL_ID)
    kw.setdefault("messages", [{"role": "user", "content": "Describe a person as JSON."}])
    return client.chat.completions.create(**kw)


def test_json_schema_strict_validates_and_is_greedy_among_allowed(srv, tmp_path):
    client = srv.client()
    r = chat(client, response_format=rf_schema(PERSON), max_tokens=400, temperature=0, logprobs=True, top_logprobs=20)
    text = r.choices[0].message.content
    assert r.choices[0].finish_reason == "stop", text
    jsonschema.validate(json.loads(text), PERSON)
    assert r.usage.completion_tokens == len(r.choices[0].logprobs.content)
    # greedy among the allowed: every alternative ranked above the chosen token must not continue the document
    sf = tmp_path / "s.json"
    sf.write_text(json.dumps(PERSON))
    prefix, probes, chosen_ok = b"", [], []
    for t in r.choices[0].logprobs.content:
        chosen = bytes(t.bytes)
        chosen_ok.append((prefix + chosen).decode("utf-8", "surrogateescape"))
        for alt in t.top_logprobs:
            if alt.logprob > t.logprob and bytes(alt.bytes) != chosen:
                probes.append((prefix + bytes(alt.bytes)).decode("utf-8", "surrogateescape"))
        prefix += chosen
    assert prefix.decode() == text
    df = tmp_path / "p.json"
    df.write_text(json.dumps(chosen_ok))
    v = helper("--prefix", sf, df)
    assert v.stdout.split() == ["1"] * len(chosen_ok), v.stdout + v.stderr
    if probes:
        df.write_text(json.dumps(probes))
        v = helper("--prefix", sf, df)
        bad = [p for p, x in zip(probes, v.stdout.split()) if x == "1"]
        assert not bad, f"an allowed token ranked above the chosen one: {bad[:3]}"
    # the unconstrained answer differs (the model's own choice is not JSON), so the mask did the work
    free = chat(client, max_tokens=20, temperature=0)
    assert not free.choices[0].message.content.startswith("{")


def test_json_schema_sampled_and_streamed(srv):
    client = srv.client()
    for seed in (1, 2, 3):
        r = chat(client, response_format=rf_schema(PERSON), max_tokens=400, temperature=1.0, seed=seed)
        jsonschema.validate(json.loads(r.choices[0].message.content), PERSON)
    full = chat(client, response_format=rf_schema(PERSON), max_tokens=400, temperature=0)
    chunks = chat(client, response_format=rf_schema(PERSON), max_tokens=400, temperature=0, stream=True,
                  stream_options={"include_usage": True})
    text, usage = "", None
    for c in chunks:
        if c.choices and c.choices[0].delta.content:
            text += c.choices[0].delta.content
        if c.usage:
            usage = c.usage
    assert text == full.choices[0].message.content
    assert usage.completion_tokens == full.usage.completion_tokens


def test_json_object(srv):
    r = chat(srv.client(), response_format={"type": "json_object"}, max_tokens=300, temperature=0)
    if r.choices[0].finish_reason == "stop":
        assert isinstance(json.loads(r.choices[0].message.content), dict)
    else:  # cut by max_tokens: still a prefix of an object
        assert r.choices[0].message.content.startswith("{")


def test_max_tokens_cuts_the_document(srv):
    r = chat(srv.client(), response_format=rf_schema(PERSON), max_tokens=3, temperature=0)
    assert r.choices[0].finish_reason == "length"
    assert r.usage.completion_tokens == 3


BAD_FORMATS = [
    (rf_schema({"type": "string", "pattern": "^a"}), "response_format.json_schema.schema", "'pattern'"),
    (rf_schema({"type": "number", "minimum": 0}), "response_format.json_schema.schema", "'minimum'"),
    (rf_schema({"type": "object", "properties": {"a": {"oneOf": [{}]}}}), "response_format.json_schema.schema",
     "at /properties/a: unsupported keyword 'oneOf'"),
    (rf_schema({"type": "string", "format": "date-time"}), "response_format.json_schema.schema", "'format'"),
    (rf_schema({"$ref": "#/$defs/nope"}), "response_format.json_schema.schema", "#/$defs/nope"),
    (rf_schema({"$ref": "#"}), "response_format.json_schema.schema", "left recursion"),
    (rf_schema({"type": "object", "properties": {f"p{i}": {"type": "string", "maxLength": 10000} for i in range(400)}}),
     "response_format.json_schema.schema", "too large"),
    ({"type": "json_schema"}, "response_format.json_schema", "Missing required parameter"),
    ({"type": "json_schema", "json_schema": {"schema": {}}}, "response_format.json_schema.name", "Missing"),
    ({"type": "json_schema", "json_schema": {"name": "a b", "schema": {}}}, "response_format.json_schema.name", "a-z"),
    ({"type": "json_schema", "json_schema": {"name": "x", "schema": {}, "frob": 1}}, "response_format.json_schema.frob",
     "Unrecognized"),
    ({"type": "json_schema", "json_schema": {"name": "x", "schema": []}}, "response_format.json_schema.schema", "object"),
    ({"type": "json_schema", "json_schema": {"name": "x", "strict": "yes"}}, "response_format.json_schema.strict", "boolean"),
    ({"type": "xml"}, "response_format.type", "json_schema"),
    ({"type": "json_object", "schema": {}}, "response_format", "Unrecognized"),
]


@pytest.mark.parametrize("rf,param,words", BAD_FORMATS, ids=[p + ":" + w for _, p, w in BAD_FORMATS])
def test_refusals(srv, rf, param, words):
    st, _, resp = ts.raw(srv, "POST", "/v1/chat/completions",
                         {"model": ts.MODEL_ID, "messages": ts.USER, "response_format": rf})
    assert st == 400, resp
    assert resp["error"]["param"] == param, resp
    assert words in resp["error"]["message"], resp


def test_refusal_through_sdk(srv):
    with pytest.raises(openai.BadRequestError) as ei:
        chat(srv.client(), response_format=rf_schema({"type": "string", "pattern": "x"}))
    assert ei.value.status_code == 400 and "pattern" in ei.value.message


# ---- CLI ------------------------------------------------------------------------------------------------------

def test_cli_flags(srv, tmp_path):
    import make_tiny_chat_model
    model = make_tiny_chat_model.build(str(tmp_path / "m"))
    sf = tmp_path / "s.json"
    sf.write_text(json.dumps(PERSON))
    r = subprocess.run([deltafin_bin(), "run", "--model", model, "--chat", "--prompt", "JSON please", "--json-schema",
                        str(sf), "--max-new", "400", "--threads", "1"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    jsonschema.validate(json.loads(r.stdout), PERSON)
    gf = tmp_path / "g.gbnf"
    gf.write_text('root ::= "answer: " ("yes" | "no" | [0-9]{1,3}) "."\n')
    r = subprocess.run([deltafin_bin(), "run", "--model", model, "--prompt", "Q", "--grammar", str(gf), "--threads", "1"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    import re
    assert re.fullmatch(r"answer: (yes|no|[0-9]{1,3})\.\n", r.stdout), r.stdout
    for content, flag, words in [('{"type":"string","pattern":"a"}', "--json-schema", "unsupported keyword 'pattern'"),
                                 ('root ::= "a" | b\n', "--grammar", "line 1:16 in rule 'root'")]:
        f = tmp_path / "bad"
        f.write_text(content)
        r = subprocess.run([deltafin_bin(), "run", "--model", model, "--prompt", "Q", flag, str(f)],
                           capture_output=True, text=True, timeout=300)
        assert r.returncode == 2 and words in r.stderr, r.stderr
    r = subprocess.run([deltafin_bin(), "run", "--model", model, "--prompt", "Q", "--grammar", str(gf), "--json-schema",
                        str(sf)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "at most one of --json-schema and --grammar" in r.stderr
