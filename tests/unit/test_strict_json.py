"""Strict JSON bodies (api/jsonbody.py): the cheap checks on the raw bytes agree with
a full walk of the parsed value, whatever the strings hold."""

from __future__ import annotations

import contextlib
import json
from datetime import UTC, datetime
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cronwheel import jsontext
from cronwheel.api.jsonbody import InvalidJsonError, _deeper_than, loads_strict
from cronwheel.domain.bounds import JSON_DEPTH_MAX
from cronwheel.domain.errors import ValidationError

# Strings full of what could fool a byte scan: brackets, quotes, backslashes.
tricky = st.text(alphabet='[]{}"\\ab\n', max_size=8)
scalars = st.none() | st.booleans() | st.integers() | tricky


def _trees(max_leaves: int) -> st.SearchStrategy[Any]:
    return st.recursive(
        scalars,
        lambda kids: st.lists(kids, max_size=3) | st.dictionaries(tricky, kids, max_size=3),
        max_leaves=max_leaves,
    )


def _depth(value: Any) -> int:
    if isinstance(value, dict):
        return 1 + max(map(_depth, value.values()), default=0)
    if isinstance(value, list):
        return 1 + max(map(_depth, value), default=0)
    return 0


def _chain(levels: int, leaf: Any) -> Any:
    for i in range(levels):
        leaf = [leaf] if i % 2 else {"k": leaf}
    return leaf


@settings(deadline=None, max_examples=300)
@given(
    tree=_trees(40),
    extra=st.integers(0, 40),
    ascii_only=st.booleans(),
    limit=st.integers(1, JSON_DEPTH_MAX),
)
def test_the_bracket_skeleton_measures_depth_exactly(
    tree: Any, extra: int, ascii_only: bool, limit: int
) -> None:
    value = _chain(extra, tree)
    body = json.dumps(value, ensure_ascii=ascii_only).encode()
    assert _deeper_than(body, limit) == (_depth(value) > limit)


@pytest.mark.parametrize(
    "value",
    [
        {"a": "x\x00y"},
        {"k\x00": 1},
        [[{"deep": ["\ud800"]}]],
        {"a": "\udfff tail"},
    ],
)
@pytest.mark.parametrize("ascii_only", [True, False])
def test_unstorable_strings_are_found_however_written(value: Any, ascii_only: bool) -> None:
    # Escaped (\\u0000, \\ud800) or written raw (a surrogate's own UTF-8 bytes).
    body = json.dumps(value, ensure_ascii=ascii_only).encode("utf-8", "surrogatepass")
    with pytest.raises(ValidationError):
        loads_strict(body)


def test_a_surrogate_pair_is_text() -> None:
    assert loads_strict(b'{"emoji": "\\ud83d\\ude00"}') == {"emoji": "\U0001f600"}


@pytest.mark.parametrize("token", [b"NaN", b"Infinity", b"-Infinity"])
def test_non_json_constants_are_refused(token: bytes) -> None:
    with pytest.raises(InvalidJsonError):
        loads_strict(b'{"x": ' + token + b"}")


def test_an_overflowing_float_is_refused_where_it_is() -> None:
    with pytest.raises(ValidationError) as caught:
        loads_strict(b'{"a": [1, 1e999]}')
    assert caught.value.field == "a.1"


def test_an_integer_of_too_many_digits_is_not_json_we_take() -> None:
    with pytest.raises(InvalidJsonError):
        loads_strict(b'{"a": ' + b"9" * 5000 + b"}")


def test_depth_is_refused_at_the_bound_and_not_before() -> None:
    ok = json.dumps(_chain(JSON_DEPTH_MAX, 1)).encode()
    assert loads_strict(ok) is not None
    too_deep = json.dumps(_chain(JSON_DEPTH_MAX + 1, 1)).encode()
    with pytest.raises(ValidationError, match="nested deeper than 32"):
        loads_strict(too_deep)


def _typed(value: Any) -> Any:
    """``value`` with each number's type beside it: 1, 1.0 and True are told apart."""
    if isinstance(value, dict):
        return {k: _typed(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_typed(v) for v in value]
    return (type(value).__name__, value)


numbers = (
    st.integers()  # past 64 bits too: orjson would read those as floats
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.sampled_from([0, -0.0, 2**63, -(2**63) - 1, 2**64, 10**19, 1e-7, 5e-324])
)
json_trees = st.recursive(
    numbers | scalars,
    lambda kids: st.lists(kids, max_size=4) | st.dictionaries(tricky, kids, max_size=4),
    max_leaves=30,
)


@settings(deadline=None, max_examples=300)
@given(tree=json_trees, ascii_only=st.booleans())
def test_a_body_reads_as_json_reads_it(tree: Any, ascii_only: bool) -> None:
    # Read by orjson where it reads the body as ``json`` does, else by ``json``: the
    # same values of the same types either way.
    body = json.dumps({"t": tree}, ensure_ascii=ascii_only).encode()
    if _depth(tree) < JSON_DEPTH_MAX:
        assert _typed(loads_strict(body)) == _typed(json.loads(body))


@settings(deadline=None, max_examples=300)
@given(tree=json_trees, ascii_only=st.booleans())
def test_what_the_database_hands_back_reads_as_json_reads_it(tree: Any, ascii_only: bool) -> None:
    # The stores read JSON columns with jsontext.loads: as text (asyncpg, SQLite) or
    # bytes, the same values of the same types as json.loads, big integers included.
    text = json.dumps(tree, ensure_ascii=ascii_only)
    assert _typed(jsontext.loads(text)) == _typed(json.loads(text))
    with contextlib.suppress(UnicodeEncodeError):  # an unpaired surrogate has no bytes
        assert _typed(jsontext.loads(text.encode())) == _typed(json.loads(text))


@settings(deadline=None, max_examples=300)
@given(tree=json_trees | st.dictionaries(st.integers(), numbers, max_size=3))
def test_what_is_written_reads_back_as_json_wrote_it(tree: Any) -> None:
    # The worker protocol's answers are written with jsontext.dumps: orjson where it can
    # write the value exactly, json where not (integers past 64 bits, keys that are not
    # text, unpaired surrogates) — the same JSON values either way.
    assert _typed(json.loads(jsontext.dumps(tree))) == _typed(json.loads(json.dumps(tree)))


@pytest.mark.parametrize(
    ("value", "written"),
    [
        ({"s": "\ud800"}, b'{"s":"\\ud800"}'),  # orjson refuses an unpaired surrogate
        ({1: 2**64}, b'{"1":18446744073709551616}'),
        ({"s": "caf\u00e9"}, '{"s":"café"}'.encode()),
    ],
)
def test_what_orjson_refuses_is_written_by_json(value: Any, written: bytes) -> None:
    assert jsontext.dumps(value) == written


@pytest.mark.parametrize(
    "instant",
    [datetime(2031, 3, 4, 12, 0, tzinfo=UTC), datetime(2031, 3, 4, 12, 0, 0, 500, tzinfo=UTC)],
)
def test_an_instant_is_written_alike_by_both(instant: datetime) -> None:
    """A lease's answer holds instants as they are: UTC ending in Z, orjson or json."""
    text = instant.isoformat().replace("+00:00", "Z")
    assert jsontext.dumps({"at": instant}) == f'{{"at":"{text}"}}'.encode()
    assert jsontext.dumps({"at": instant, "n": 2**64}) == (
        f'{{"at":"{text}","n":18446744073709551616}}'.encode()
    )


def test_what_neither_can_write_is_refused() -> None:
    with pytest.raises(TypeError):
        jsontext.dumps({"n": 2**64, "x": object()})


@pytest.mark.parametrize("value", [5, 2.5, True, None])
def test_what_is_not_text_is_refused_as_json_refuses_it(value: Any) -> None:
    # SQLite hands back a JSON number as a number; SQLAlchemy's SQLite dialect keeps it
    # when the reader raises TypeError, as json.loads does.
    with pytest.raises(TypeError):
        json.loads(value)
    with pytest.raises(TypeError):
        jsontext.loads(value)


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        (b"\xef\xbb\xbf{}", {}),  # a byte order mark, which orjson refuses
        (b'{"a": 1, "a": 2}', ValidationError),  # a key twice: one value would be lost
        (b'"\\ud800"', ValidationError),  # an unpaired surrogate: the bounds refuse it
        (b"[1e400]", ValidationError),  # infinity: the bounds refuse it, named
        (b"{} x", json.JSONDecodeError),
        (b"\xff", InvalidJsonError),  # not UTF-8
    ],
)
def test_bodies_orjson_refuses_are_answered_by_json(body: bytes, expected: Any) -> None:
    if isinstance(expected, type):
        with pytest.raises(expected):
            loads_strict(body)
    else:
        assert loads_strict(body) == expected


# Keys full of colons and quotes: what a count of colons could be fooled by.
colon_keys = st.text(alphabet=':"\\ab', max_size=6)
colon_trees = st.recursive(
    scalars | colon_keys,
    lambda kids: st.lists(kids, max_size=3) | st.dictionaries(colon_keys, kids, max_size=3),
    max_leaves=30,
)


def _escaped_colons(text: str) -> str:
    """``text`` (JSON) with every colon inside a string written ``\\u003a``."""
    out, inside, escape = [], False, False
    for ch in text:
        if inside and ch == ":":
            out.append("\\u003a")
            continue
        out.append(ch)
        if escape:
            escape = False
        elif ch == "\\":
            escape = True
        elif ch == '"':
            inside = not inside
    return "".join(out)


@settings(deadline=None, max_examples=300)
@given(tree=colon_trees, escape=st.booleans())
def test_a_body_giving_each_key_once_is_taken(tree: Any, escape: bool) -> None:
    text = json.dumps(tree)
    body = (_escaped_colons(text) if escape else text).encode()
    assert loads_strict(body) == tree


@settings(deadline=None, max_examples=300)
@given(
    members=st.dictionaries(colon_keys, colon_trees, min_size=1, max_size=4),
    again=st.data(),
    value=colon_trees,
    nest=st.integers(0, 3),
    escape=st.booleans(),
)
def test_a_key_given_twice_is_refused_wherever_it_is(
    members: dict[str, Any], again: st.DataObject, value: Any, nest: int, escape: bool
) -> None:
    key = again.draw(st.sampled_from(sorted(members)))
    # The key first with ``value``, then every member (the key again among them).
    text = "{" + json.dumps(key) + ":" + json.dumps(value) + "," + json.dumps(members)[1:]
    for level in range(nest):
        text = f"[{text}]" if level % 2 else '{"k":' + text + "}"
    body = (_escaped_colons(text) if escape else text).encode()
    with pytest.raises(ValidationError) as caught:
        loads_strict(body)
    assert caught.value.message == (
        f"the request body is ambiguous: the key {key!r} is given twice in one object"
    )


def test_a_key_given_twice_is_refused_on_the_slow_path_too() -> None:
    # A number of 19 digits sends the body to json: the hook refuses there.
    with pytest.raises(ValidationError, match="the key 'task' is given twice"):
        loads_strict(b'{"n": 1234567890123456789, "task": "a", "task": "b"}')
