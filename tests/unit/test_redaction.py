"""Secrets redaction: what counts as a secret, the markers, and where the rules apply."""

from __future__ import annotations

from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

import replayq
from replayq import codec, redaction
from replayq.errors import ConfigurationError
from replayq.redaction import Redaction, Redactor, is_marker, mask_url_passwords
from replayq.testing import run_inline

CARD = "4111111111111111"


def test_defaults_cover_headers_secret_fields_cards_and_url_passwords() -> None:
    redactor = Redactor.build(key=b"k")
    value = {
        "headers": {"Authorization": "Bearer abcdefgh12345", "X-Api-Key": "k-123"},
        "Password": "pw",
        "card_number": int(CARD),
        "note": "paid with 4111 1111 1111 1111 today",
        "dsn": "postgresql://app:s3cret@db/shop",
        "order": 12345678901234567,  # not Luhn-valid, not a secret field: kept
        "ids": ["1234567812345678"],  # sixteen digits failing Luhn: kept
    }
    out = redactor.value(value)
    assert out["headers"]["Authorization"].startswith("Bearer [redacted:")
    assert is_marker(out["headers"]["X-Api-Key"]) and is_marker(out["Password"])
    assert is_marker(out["card_number"])
    assert out["note"].startswith("paid with [redacted:") and out["note"].endswith(" today")
    assert out["dsn"].startswith("postgresql://app:[redacted:") and "s3cret" not in out["dsn"]
    assert out["order"] == value["order"] and out["ids"] == value["ids"]
    assert value["Password"] == "pw", "the input is not modified"


def test_url_passwords_are_masked_wherever_they_occur_in_a_message() -> None:
    line = "cannot connect to postgresql://app:s3cr%40t@db:5432/shop (and redis://:pw@cache/0)"
    masked = mask_url_passwords(line)
    assert (
        masked == "cannot connect to postgresql://app:***@db:5432/shop (and redis://:***@cache/0)"
    )
    assert mask_url_passwords("sqlite:///tmp/x.db and postgresql://app@db/shop") == (
        "sqlite:///tmp/x.db and postgresql://app@db/shop"
    )
    # The trace redactor uses the same pattern: an empty user no longer slips through.
    stored = Redactor.build(key=b"k").text("cache at redis://:pw-secret@cache/0")
    assert "pw-secret" not in stored and stored.startswith("cache at redis://:[redacted:")


# Texts (log lines, errors) that ``Redactor.text``'s cheap screen passes or sends to the
# regex: each must come out as the patterns alone make it (``_plain``).
TEXTS = [
    "2026-12-04 15:40:29,325 INFO replayq.worker: 12 jobs succeeded (one group commit): "
    "2981 in 0.000s, 2982 in 0.001s",  # a worker's log line: nothing to find, kept as is
    "job 1234567890123 failed",  # 13 digits, not a card (Luhn): kept by the regex too
    "header BEARER abcdefgh12345 sent",  # upper case: the needles are matched lowered
    "retry with Basic dXNlcjpwYXNzd29yZA== now",
    "lost redis://:hunter2-pw@cache/0",
    "paid with 4111 1111 1111 1111 today",  # spaces between the digit groups
    "paid with 4111-1111-1111-1111 today",  # dashes between them
    "ba\u017fic dXNlcjpwYXNzd29yZA==",  # not ASCII: the long s folds to s in the regex
]


@pytest.mark.parametrize("text", TEXTS)
def test_the_screen_of_a_text_decides_as_the_patterns_do(text: str) -> None:
    redactor = Redactor.build(key=b"k")
    assert redactor.text(text) == redactor._plain(text)
    secrets = ("abcdefgh12345", "dXNlcjpwYXNzd29yZA==", "hunter2-pw", "4111")
    if any(secret in text for secret in secrets) and text.isascii():
        assert redactor.text(text) != text, "a secret the patterns find is never skipped"


# Values whose JSON text the one-search screen (``Redactor.clean_text``) passes or sends
# to the walk: escapes, non-ASCII, secrets deep in lists, secret names in values only.
SCREENED = [
    {"sku": "SKU-1", "qty": 2, "lines": [{"unit_cents": 212, "tax_rate": 0.2}]},
    {"note": "the password field is empty"},  # a secret name in a value: kept
    {"deep": [[{"Client-Secret": "abc"}]]},
    {"deep": [{"x": "token: Bearer abcdefgh12345 end"}]},
    {"text": "line one\nBasic dXNlcjpwYXNzd29yZA=="},  # the secret after an escape
    {"text": "été Bearer abcdefgh12345"},  # not ASCII
    {"quoted": 'say "Bearer abcdefgh12345"'},
    {"card": "4111-1111-1111-1111", "ref": 12345678901234567},
    {"dsn": "redis://u:pw@host/0", "n": None, "ok": True},
    {'k"ey': {"api_key": "zzz"}},
    ["Bearer", "abcdefgh12345"],  # neither text alone is a credential: kept
]


@pytest.mark.parametrize("value", SCREENED)
def test_the_screen_of_a_values_text_decides_as_the_walk_does(value: object) -> None:
    redactor = Redactor.build(key=b"k")
    out = redactor.value(value)
    assert out == redactor._walk(value, 0)
    if out == value:
        assert out is value, "a value without secrets is not copied"
    else:
        assert "abcdefgh12345" not in str(out) and "4111" not in str(out)
        assert "zzz" not in str(out) and "abc'" not in str(out) and ":pw@" not in str(out)


# Flat objects (``Redactor._flat_clean``: keys judged at once, texts searched as one):
# an event's data as replayq passes it, and the secrets the walk finds in such data.
FLAT = [
    {"call": "pricing.quote", "fingerprint": "617d26ad00922ef3", "duration": 0.000121},
    {"key": "charge:1", "claim": "ab" * 16, "kind": "payment.charge", "n": None},
    {"auth": "Bearer abcdefgh12345", "n": 1},
    {"password": "hunter2", "x": 1},  # a secret field
    {"Client-Secret": "abc'", "x": 1},
    {"card": "4111 1111 1111 1111"},
    {"a": "4111111111", "b": "111111"},  # neither text a card number: kept
    {"n": 4111111111111111, "ok": True},  # a number, not a text: kept as the walk keeps it
    {"dsn": "postgres://u:pw@h/db", "z": 0.5},
    {"text": "été Bearer abcdefgh12345"},  # not ASCII
    {"text": "a\0Bearer abcdefgh12345"},  # the joining NUL in a text
    {1: "Bearer abcdefgh12345", "k": "v"},  # a key that is not a text
    {},
]


@pytest.mark.parametrize("value", FLAT)
def test_a_flat_objects_texts_searched_as_one_decide_as_the_walk_does(value: object) -> None:
    redactor = Redactor.build(key=b"k")
    for _ in range(2):  # keys judged once are known the second time
        out = redactor.value(value)
        assert out == redactor._walk(value, 0)
        if out == value:
            assert out is value, "a value without secrets is not copied"
        else:
            assert "abcdefgh12345" not in str(out) and "4111 1111" not in str(out)
            assert "hunter2" not in str(out) and "abc'" not in str(out) and ":pw@" not in str(out)


def test_own_anchored_patterns_and_globs_still_apply_to_every_value() -> None:
    redactor = Redactor.build(Redaction(fields=["*_pin"], patterns=[r"^(sk_live_\w+)$"]))
    out = redactor.value({"a": [{"card_pin": "1234"}], "b": ["sk_live_abc"], "c": "x"})
    assert is_marker(out["a"][0]["card_pin"]) and is_marker(out["b"][0]) and out["c"] == "x"


def test_markers_are_keyed_hashes_equal_for_equal_secrets_and_redaction_is_idempotent() -> None:
    one, other = Redactor.build(key=b"one"), Redactor.build(key=b"two")
    first = one.value({"password": "same", "token": {"password": "same"}})
    assert first["password"] == first["token"]["password"]
    assert one.value({"password": "different"})["password"] != first["password"]
    assert other.value({"password": "same"})["password"] != first["password"]
    assert one.value(first) == first
    assert one.value({"password": first["password"]}) == {"password": first["password"]}
    # A secret inside an already redacted text is still found.
    mixed = one.text(f"{first['password']} and Bearer abcdefgh12345")
    assert mixed.startswith(first["password"]) and "abcdefgh12345" not in mixed


def test_without_a_key_the_marker_is_plain() -> None:
    plain = Redactor().extended(Redaction())
    assert plain.value({"password": "pw"}) == {"password": "[redacted]"}


def test_the_key_comes_from_the_environment_or_a_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("REPLAYQ_REDACTION_KEY", raising=False)
    key_file = tmp_path / "redaction.key"
    key_file.write_text("from-a-file\n")
    monkeypatch.setenv("REPLAYQ_REDACTION_KEY_FILE", str(key_file))
    assert Redactor.build().key == b"from-a-file"
    monkeypatch.setenv("REPLAYQ_REDACTION_KEY", "from-env")
    assert Redactor.build().key == b"from-env"
    monkeypatch.delenv("REPLAYQ_REDACTION_KEY")
    key_file.write_text("")
    with pytest.raises(ConfigurationError, match="empty"):
        Redactor.build()


def test_own_fields_globs_and_patterns_and_no_defaults() -> None:
    redactor = Redactor.build(
        Redaction(["iban", "*_pin"], [r"ssn=(\d+)", r"ACCT-\d{6}"], defaults=False), key=b"k"
    )
    out = redactor.value(
        {"IBAN": "DE89", "card_pin": 1234, "q": "ssn=123 ACCT-000001", "password": "x"}
    )
    assert is_marker(out["IBAN"]) and is_marker(out["card_pin"])
    assert out["q"].startswith("ssn=[redacted:") and "ACCT-000001" not in out["q"]
    assert out["password"] == "x", "defaults=False drops the default names"
    with pytest.raises(ConfigurationError, match="redaction pattern"):
        Redactor.build(Redaction(patterns=["("]))


def test_a_job_types_rules_add_to_the_apps(tmp_path: Path) -> None:
    app = replayq.App(f"sqlite:///{tmp_path / 'q.db'}", redaction=Redaction(key="k"))
    seen: list[str] = []

    @app.job("pay", redact=Redaction(["iban"]))
    def pay(ctx: replayq.Context, iban: str, password: str) -> None:
        seen.append(iban)
        ctx.call("bank", lambda i, password: {"ok": True, "iban": i}, iban, password=password)

    @app.job("plain")
    def plain(ctx: replayq.Context, iban: str) -> None:
        ctx.call("bank", lambda i: {"ok": True}, iban)

    try:
        paid = run_inline(app, "pay", {"iban": "DE89370400440532013000", "password": "pw"})
        other = run_inline(app, "plain", {"iban": "DE89370400440532013000"})
        assert is_marker(paid.payload["iban"]) and is_marker(paid.payload["password"])
        assert seen == [paid.payload["iban"]], "the handler sees the marker of a redacted field"
        assert other.payload["iban"] == "DE89370400440532013000", "iban is pay's rule only"
        call = next(e for e in app.trace(paid.id) if e.name == "call")
        assert call.data["response"]["iban"] == paid.payload["iban"]
        assert call.data["request"]["kwargs"]["password"] == paid.payload["password"]
    finally:
        app.close()


def test_a_calls_and_a_decisions_values_are_redacted_once_as_every_events_data(
    tmp_path: Path,
) -> None:
    # The call's request and response and the decision's value and reasons are redacted
    # when they are checked (``encoded``) and the event takes them without a second
    # screen; a rule naming one of those fields still marks all of it.
    app = replayq.App(f"sqlite:///{tmp_path / 'q.db'}", redaction=Redaction(key="k"))
    token = "Bearer abcdefgh12345678"

    @app.job("pay")
    def pay(ctx: replayq.Context, n: int) -> None:
        ctx.call("bank", lambda t: {"ok": True, "auth": t, "api_key": "k-1"}, token)
        ctx.decide("route", {"header": token}, password="pw", n=n)

    @app.job("strict", redact=Redaction(["response", "why"]))
    def strict(ctx: replayq.Context, n: int) -> None:
        ctx.call("bank", lambda: {"ok": True})
        ctx.decide("route", "ship", n=n)

    try:
        paid = run_inline(app, "pay", {"n": 1})
        events = {e.name: e.data for e in app.trace(paid.id) if e.name in ("call", "decision")}
        redactor = Redactor.build(Redaction(key="k"))
        call, decision = events["call"], events["decision"]
        assert call["request"] == {"args": [redactor.text(token)], "kwargs": {}}
        assert call["response"] == {
            "ok": True,
            "auth": redactor.text(token),
            "api_key": redactor.marker("k-1"),
        }
        assert decision["value"] == {"header": redactor.text(token)}
        assert decision["why"] == {"password": redactor.marker("pw"), "n": 1}
        assert "abcdefgh12345678" not in str(events)

        done = run_inline(app, "strict", {"n": 2})
        events = {e.name: e.data for e in app.trace(done.id) if e.name in ("call", "decision")}
        assert is_marker(events["call"]["response"]), events["call"]
        assert is_marker(events["decision"]["why"]) and events["decision"]["value"] == "ship"
    finally:
        app.close()


def test_a_state_writes_delta_is_redacted_as_its_data_is(tmp_path: Path) -> None:
    # A clean write's delta is not encoded and screened again; a removed field's name, a
    # secret in the new data and a rule naming the delta's own keys still redact it.
    app = replayq.App(f"sqlite:///{tmp_path / 'q.db'}", redaction=Redaction(key="k"))
    redactor = Redactor.build(Redaction(key="k"))

    @app.job("write")
    def write(ctx: replayq.Context, first: dict[str, object], then: dict[str, object]) -> None:
        with ctx.step("a"):
            ctx.state.put("account", 1, first)
        with ctx.step("b"):
            ctx.state.put("account", 1, then)

    @app.job("strict", redact=Redaction(["replace"]))
    def strict(ctx: replayq.Context) -> None:
        with ctx.step("a"):
            ctx.state.put("account", 2, {"n": 1})

    def deltas(job_id: int) -> list[object]:
        return [e.data["delta"] for e in app.trace(job_id) if e.name == "state.write"]

    try:
        done = run_inline(app, "write", {"first": {CARD: 1, "n": 1}, "then": {"n": 2}})
        assert deltas(done.id)[1] == {"set": {"n": 2}, "unset": [redactor.marker(CARD)]}
        done = run_inline(app, "write", {"first": {"n": 1}, "then": {"n": 2, "cvv": "123"}})
        assert deltas(done.id)[1] == {"set": {"n": 2, "cvv": redactor.marker("123")}, "unset": []}
        done = run_inline(app, "strict", {})
        assert is_marker(deltas(done.id)[0]["replace"])
    finally:
        app.close()


def test_a_state_reads_data_is_screened_as_every_events_data(tmp_path: Path) -> None:
    # ``state.read``'s data is replayq's own (built without a value walk): a rule naming one
    # of its keys, or a pattern matching the branch's name, still redacts it.
    app = replayq.App(f"sqlite:///{tmp_path / 'q.db'}", redaction=Redaction(key="k"))

    def reader(ctx: replayq.Context) -> None:
        with ctx.step("a"):
            ctx.state.get("account", 1)

    app.job("plain")(reader)
    app.job("by_field", redact=Redaction(["branch"]))(reader)
    app.job("by_pattern", redact=Redaction(patterns=[r"^(main)$"]))(reader)

    def read(job_type: str) -> dict[str, object]:
        done = run_inline(app, job_type, {})
        [event] = [e for e in app.trace(done.id) if e.name == "state.read"]
        assert (event.resource, event.resource_version) == ("account:1", 0)
        return event.data

    try:
        assert read("plain") == {"exists": False, "branch": "main"}
        by_field = read("by_field")
        assert by_field["exists"] is False and is_marker(by_field["branch"])
        by_pattern = read("by_pattern")
        assert by_pattern["exists"] is False and is_marker(by_pattern["branch"])
    finally:
        app.close()


def test_the_same_app_on_another_database_keeps_its_redaction(tmp_path: Path) -> None:
    # ``--db`` with ``--app``: the CLI runs the app's job types on another database.
    app = replayq.App(f"sqlite:///{tmp_path / 'a.db'}", redaction=Redaction(["iban"], key="k"))

    @app.job("pay")
    def pay(ctx: replayq.Context, iban: str) -> None:
        pass

    other = app.on_database(f"sqlite:///{tmp_path / 'b.db'}")
    try:
        done = run_inline(other, "pay", {"iban": "DE89370400440532013000"})
        assert is_marker(done.payload["iban"])
        assert b"DE89370400440532013000" not in (tmp_path / "b.db").read_bytes()
    finally:
        other.close()
        app.close()


@dataclass
class Card:
    card_number: int
    amount: Decimal


def test_a_redacted_field_of_a_whole_payload_dataclass_reaches_the_handler_as_its_marker(
    tmp_path: Path,
) -> None:
    app = replayq.App(f"sqlite:///{tmp_path / 'q.db'}", redaction=Redaction(key="k"))
    seen: list[Card] = []

    @app.job("charge")
    def charge(ctx: replayq.Context, card: Card) -> None:
        seen.append(card)

    try:
        job = run_inline(app, "charge", Card(int(CARD), Decimal("12.30")))
        assert job.state.value == "succeeded", job.last_error
        assert is_marker(seen[0].card_number) and seen[0].amount == Decimal("12.30")
    finally:
        app.close()


_json_leaves = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text()
)
_json_values = st.recursive(
    _json_leaves,
    lambda inner: (
        st.lists(inner, max_size=4)
        | st.lists(st.dictionaries(st.text(max_size=5), inner, max_size=3), max_size=4)
        | st.dictionaries(st.text(max_size=5), inner, max_size=4)
    ),
    max_leaves=25,
)


@settings(max_examples=500, deadline=None)
@given(_json_values)
@example([{"": "", ":": None}])  # a key starting with ":" after a string value
def test_the_keys_of_a_value_are_the_keys_its_text_shows(value: object) -> None:
    # clean_text takes a value's keys from the value (keys_of) instead of searching its
    # canonical text: both must name the same keys, or a secret field could slip by.
    text = codec.dumps(value)
    if "\\" in text:
        return  # clean_text walks such a text without looking at keys
    assert redaction.keys_of(value) == redaction.keys_in(text)


def test_a_secret_key_after_a_string_value_is_found_in_the_text() -> None:
    # The text's keys are searched where the value's cannot be taken (a dict subclass,
    # the texts of a quick check): a key that starts with ":" after a string value too.
    redactor = Redactor.build(Redaction(fields=["*token*"]))
    value = _OddDict({"0": "x", ":token": "s3cret"})  # ":token" sorts after "0"
    redacted, text = redactor.encoded(value, codec.dumps)
    assert "s3cret" not in text
    assert redacted[":token"] != "s3cret"


def test_a_secret_field_deep_in_a_list_of_objects_is_still_found() -> None:
    redactor = Redactor.build(Redaction(key="k"))
    lines = [{"sku": f"S{n}", "qty": n} for n in range(20)]
    lines[7] = {"sku": "S7", "qty": 7, "meta": {"password": "hunter2"}}
    value, _ = redactor.encoded({"lines": lines}, codec.dumps)
    assert "hunter2" not in codec.dumps(value)
    assert redaction.keys_of(ODD) is None  # a dict subclass: the text is searched instead


class _OddDict(dict):  # type: ignore[type-arg]
    pass


ODD = {"a": _OddDict(password="x")}


@settings(max_examples=500, deadline=None)
@given(_json_values)
def test_encoded_keyed_answers_as_encoded(value: object) -> None:
    # Recorder.encoded takes the keys from the codec's walk (dumps_keyed) instead of
    # keys_of: the same value and text come out, secrets or not.
    redactor = Redactor.build(Redaction(key="k", fields=["*tok*"]))
    assert redactor.encoded_keyed(value, codec.dumps_keyed) == redactor.encoded(value, codec.dumps)


def test_a_secret_field_in_a_list_of_objects_is_found_by_the_keyed_encoding() -> None:
    redactor = Redactor.build(Redaction(key="k"))
    lines = [{"sku": f"S{n}", "qty": n} for n in range(20)]
    lines[3] = {"sku": "S3", "password": "hunter2"}
    value, text = redactor.encoded_keyed({"lines": lines, "n": 1}, codec.dumps_keyed)
    assert "hunter2" not in text
    assert value["lines"][3]["password"] != "hunter2"


RESOURCE_TEXTS = st.text(
    alphabet=st.sampled_from(list("0123456789 -:/@abcsBearerBasic_.x[]")), max_size=30
)


@settings(max_examples=400, deadline=None)
@given(RESOURCE_TEXTS)
@example("card:4111111111111111")
@example("Basic abcdefgh")
@example("u://:pw@h")
@example("order:57")
def test_a_resource_is_redacted_as_its_text_and_again_alike_from_the_cache(text: str) -> None:
    """``Redactor.resource`` (what a trace stores for a resource, and what a look-up
    asks for) is ``text`` whatever its fast paths take: a short name, a remembered one."""
    rules = redaction.Redactor.build(replayq.Redaction(key="k" * 16))
    expected = rules.text(text)
    assert rules.resource(text) == expected
    assert rules.resource(text) == expected  # remembered, if clean
    assert rules.resource(expected) == expected  # a marker is not redacted again
    own = rules.extended(replayq.Redaction(patterns=[r"ab(c)"]))
    assert own.resource(text) == own.text(text)


def test_remembered_resources_start_anew_when_full() -> None:
    rules = redaction.Redactor.build(replayq.Redaction(key="k" * 16))
    for n in range(4096 + 5):
        assert rules.resource(f"order:{n:06d}-abcdefgh") == f"order:{n:06d}-abcdefgh"
    assert 0 < len(rules._clean_resources) <= 4096
    assert rules.resource("card:4111111111111111").startswith("card:[redacted:")
    assert "card:4111111111111111" not in rules._clean_resources
