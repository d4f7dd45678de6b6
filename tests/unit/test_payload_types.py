"""Payload types without a database: what each annotation accepts, the JSON form it stores,
a pydantic model as the whole payload, and untyped payloads stored exactly as before."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any, Optional

import pydantic
import pytest

import replayq
from replayq import codec
from replayq.queue.contracts import JobContract, build_contract, diff_contracts
from replayq.queue.handlers import Handler, PayloadShape
from replayq.queue.payload_types import field_type
from tests.apps.refused_secrets import Keyring, Locker


def handler_of(fn: Any) -> Handler:
    shape = PayloadShape.from_function(fn)
    contract = build_contract(fn.__name__, fields=shape.fields, payload_schema=shape.schema())
    return Handler(contract, fn, shape, {})


def counts(
    ctx: replayq.Context,
    ids: list[int],
    limit: Optional[int],  # noqa: UP045 (the typing spelling is checked too)
    tag: str | None = None,
) -> None: ...


@pytest.mark.parametrize(
    ("payload", "message"),
    [
        ({"ids": [1, "2"], "limit": 3}, r"field 'ids\[1\]' expects int, got str '2'"),
        ({"ids": [1, True], "limit": 3}, r"field 'ids\[1\]' expects int, got bool"),
        ({"ids": 1, "limit": 3}, r"field 'ids' expects list\[int\]"),
        ({"ids": [], "limit": "3"}, r"field 'limit' expects int"),
        ({"ids": [], "limit": None, "tag": 5}, r"field 'tag' expects str"),
    ],
)
def test_list_of_int_and_optional_are_checked(payload: dict[str, Any], message: str) -> None:
    with pytest.raises(replayq.PayloadError, match=f"counts: {message}"):
        handler_of(counts).encode_payload(payload)


def test_optional_takes_none_and_list_of_int_takes_ints() -> None:
    text = handler_of(counts).encode_payload({"ids": [1, 2], "limit": None})
    assert text == '{"ids":[1,2],"limit":null}'


class Invoice(pydantic.BaseModel):
    number: int
    total: Decimal
    issued: datetime
    lines: list[str] = []


def invoice(ctx: replayq.Context, inv: Invoice) -> None: ...


def test_a_pydantic_model_is_the_whole_payload_validated_and_round_tripped() -> None:
    handler = handler_of(invoice)
    issued = datetime(2026, 11, 30, 20, 0, tzinfo=UTC)
    plain, text = handler.prepare_payload(Invoice(number=7, total=Decimal("99.95"), issued=issued))

    assert handler.shape.fields == ("number", "total", "issued", "lines")
    assert handler.shape.required == ("number", "total", "issued")
    (decoded,) = handler.shape.decode("invoice", codec.loads(text))
    assert decoded == Invoice(number=7, total=Decimal("99.95"), issued=issued)
    assert decoded.total.as_tuple() == Decimal("99.95").as_tuple()
    assert plain["total"] == "99.95"
    with pytest.raises(replayq.PayloadError, match=r"invoice: field 'number': Input should be"):
        handler.encode_payload({**plain, "number": "seven"})
    assert "Invoice" in handler.contract.payload_schema  # type: ignore[operator]


def untyped(ctx: replayq.Context, order_id, note="", **extra):  # type: ignore[no-untyped-def]
    ...


def test_untyped_payloads_are_stored_and_fingerprinted_exactly_as_before() -> None:
    payload = {"order_id": 5, "note": "é", "nested": {"b": [1, 2.5], "a": None}}
    plain, text = handler_of(untyped).prepare_payload(payload)

    assert plain is payload, "an untyped payload is not copied or converted"
    assert text == '{"nested":{"a":null,"b":[1,2.5]},"note":"é","order_id":5}'
    assert codec.fingerprint_text(text) == codec.fingerprint(payload)


def test_a_contract_stored_before_payload_schemas_is_no_change() -> None:
    def typed(ctx: replayq.Context, amount: Decimal) -> None: ...

    declared = handler_of(typed).contract
    older = declared.to_dict()
    del older["payload_schema"]
    stored = JobContract.from_dict(older)

    assert stored.payload_schema is None
    assert diff_contracts(stored, declared) == []
    assert declared.payload_schema == {"amount": "decimal"}


def priced(ctx: replayq.Context, amount: Decimal, note: str = "") -> None: ...


def test_none_in_an_optional_field_passes_beside_typed_fields() -> None:
    plain, _ = handler_of(priced).prepare_payload({"amount": Decimal("1.5"), "note": None})
    assert plain == {"amount": "1.5", "note": None}


@dataclass
class Node:
    name: str
    children: list[Node] = field(default_factory=list)


def tree(ctx: replayq.Context, root: Node) -> None: ...


def test_a_recursive_dataclass_is_checked_at_every_depth() -> None:
    handler = handler_of(tree)
    given = Node("a", [Node("b", [Node("c")])])
    plain, _ = handler.prepare_payload(given)

    assert plain == {
        "name": "a",
        "children": [{"name": "b", "children": [{"name": "c", "children": []}]}],
    }
    assert handler.shape.decode("tree", plain) == (given,)
    with pytest.raises(replayq.PayloadError, match=r"field 'children\[0\]\.children\[0\]\.name'"):
        handler.encode_payload(
            {"name": "a", "children": [{"name": "b", "children": [{"name": 1}]}]}
        )


def test_a_refusal_is_screened_for_the_secrets_a_struct_instance_holds() -> None:
    """A Struct's constructor checks nothing: an instance holding a bad value is refused by
    msgspec, whose message quotes the value; the instance's secret field is found on it."""
    from replayq.queue.payload_types import without_secrets
    from replayq.redaction import Redactor
    from tests.apps.refused_secrets import PASSWORD, Login, login

    given = Login(password=PASSWORD)  # type: ignore[arg-type]
    redactor = Redactor.build(replayq.Redaction(key="k" * 20))
    handler = Handler(handler_of(login).contract, login, handler_of(login).shape, {}, redactor)
    with pytest.raises(replayq.PayloadError) as refused:
        handler.prepare_payload(given)
    assert "Invalid enum value '[redacted:" in str(refused.value), refused.value
    assert PASSWORD not in str(refused.value)

    # Markers already in the message are kept whole, even by a secret short enough to
    # be in one; a secret as ``repr`` escapes it is found too.
    message = replayq.PayloadError("cvv 1 in [redacted:0123456789abcdef]; got 'a\\nb'")
    screened = str(without_secrets(message, redactor, {"cvv": "1", "secret": "a\nb"}))
    assert "[redacted:0123456789abcdef]" in screened, screened
    assert " 1 " not in screened and "a\\nb" not in screened, screened


MARKER = "[redacted:0123456789abcdef]"


@pytest.mark.parametrize(
    ("record", "payload", "message"),
    [
        # No marker: the constraint's refusal stands.
        (Keyring, {"api_key": "bk_1234567890", "password": "swordfish"}, "should match pattern"),
        (Locker, {"api_key": "bk_1234567890"}, "matching regex"),
        # A marker, and another field refused: the refusal stands, of that field.
        (Keyring, {"api_key": MARKER, "password": "guess"}, "'password': Input should be"),
        (Locker, {"api_key": MARKER, "opened": "soon"}, "'opened': Invalid RFC3339"),
        (Locker, {"api_key": MARKER, "region": 7}, "'region': Expected `str`, got `int`"),
    ],
)
def test_a_stored_record_is_refused_unless_only_a_marker_is(
    record: type[Any], payload: dict[str, Any], message: str
) -> None:
    kind = field_type(record)
    assert kind is not None
    stored = {"opened": "2026-01-02T03:04:05Z", **payload}
    with pytest.raises(replayq.PayloadError, match=message):
        kind.from_json(stored, "")


@pytest.mark.parametrize("record", [Keyring, Locker])
def test_a_stored_record_takes_a_marker_its_constraints_refuse(record: type[Any]) -> None:
    kind = field_type(record)
    assert kind is not None
    given = {"api_key": MARKER, "opened": "2026-01-02T03:04:05Z"}
    if record is Keyring:
        given["password"] = MARKER
    built = kind.from_json(given, "")
    assert isinstance(built, record)
    assert built.api_key == MARKER
    assert built.opened == datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)
    assert built.region == "eu"
    with pytest.raises(replayq.PayloadError, match=r"pattern|regex"):
        kind.to_json(given, "")  # at enqueue a marker is checked like any value
