"""Payloads refused with messages that quote a secret: the refusal's text comes from
the payload's own type (a pydantic validator, msgspec, a dataclass's ``__post_init__``),
not from replayq's ``got …`` part.

Each type has a declared secret field (``api_key``, ``password``, ``card_number``: the
defaults; ``account_number``: ``settle``'s own rule) and a message that quotes it, or
quotes a value the patterns find (a bearer token, a card number). ``spawn`` enqueues a
child with such a payload from a real worker (its failure: the trace, ``last_error``).
``settle`` v2 decodes, at lease, a payload stored by ``build(v1=True)`` before its
shape changed (``account_number`` was a text, and not yet a secret field); ``enroll`` v2
one of two text fields, now a ``Member`` (the whole payload) whose ``__post_init__``
refuses it quoting its ``holder`` (since named secret). ``unlock``'s ``Vault`` checks
its own secret field in ``__post_init__``, ``unlock_model``'s ``Keyring`` (pydantic) in a
validator, a pattern, a length and a ``Literal``, ``unlock_struct``'s ``Locker`` (msgspec)
in a ``Meta`` pattern and length: their markers, at lease, are not refused.
"""

from __future__ import annotations

import dataclasses
import datetime
import enum
from typing import Annotated, Any, Literal

import msgspec
import pydantic

import replayq

TOKEN = "sk_live_7f3a9c2e5b8d1f4a"
BEARER = f"Bearer {TOKEN}"
CARD = "4111111111111111"
API_KEY = "plain-api-key-zq81"  # no pattern finds it: only its field's name makes it secret
PASSWORD = "hunter2-correct-horse"
ACCOUNT = "DE-acct-77120045"
SECRETS = (TOKEN, CARD, API_KEY, PASSWORD, ACCOUNT)


class Grant(pydantic.BaseModel):
    api_key: str
    scope: str = "read"

    @pydantic.field_validator("api_key")
    @classmethod
    def _known(cls, value: str) -> str:
        if not value.startswith("ak_"):
            raise ValueError(f"unknown key {value}")
        return value

    @pydantic.field_validator("scope")
    @classmethod
    def _scope(cls, value: str) -> str:
        if value not in ("read", "write"):
            raise ValueError(f"scope {value!r} is not read or write")
        return value


class Tier(enum.Enum):
    GOLD = "gold"
    SILVER = "silver"


class Login(msgspec.Struct):
    password: Tier  # an odd type for a password: msgspec's message quotes the value
    tier: Tier = Tier.SILVER


@dataclasses.dataclass
class Card:
    card_number: str
    holder: str = ""

    def __post_init__(self) -> None:
        if self.card_number.endswith("0"):
            return
        raise ValueError(f"card {self.card_number} of {self.holder} is not accepted")


@dataclasses.dataclass(frozen=True)
class Vault:
    """Checks its secret (``api_key``, a default secret field) in ``__post_init__``: the
    real key passes at enqueue; the row holds its marker, which the check would refuse."""

    api_key: str
    region: str = "eu"

    def __post_init__(self) -> None:
        if not self.api_key.startswith("ak_"):
            raise ValueError(f"unknown key {self.api_key}")


def unlock(ctx: replayq.Context, vault: Vault) -> str:
    return f"{vault.api_key} in {vault.region}"


class Keyring(pydantic.BaseModel):
    """``Vault`` as a pydantic model: its secret is checked by a validator, a pattern and
    a length, the real key passing at enqueue; the row holds the marker, which each
    refuses. ``opened`` is converted at lease as always (a datetime, not its text)."""

    api_key: Annotated[str, pydantic.Field(min_length=12, pattern=r"^ak_")]
    password: Literal["swordfish"]  # (a Literal's values are in the contract's schema)
    opened: datetime.datetime
    region: str = "eu"

    @pydantic.field_validator("api_key")
    @classmethod
    def _known(cls, value: str) -> str:
        if not value.startswith("ak_"):
            raise ValueError(f"unknown key {value}")
        return value


class Locker(msgspec.Struct):
    """``Vault`` as a msgspec Struct: its secret is checked by a pattern and a length."""

    api_key: Annotated[str, msgspec.Meta(pattern=r"^ak_", min_length=12)]
    opened: datetime.datetime
    region: str = "eu"


def unlock_model(ctx: replayq.Context, keyring: Keyring) -> str:
    return f"{keyring.api_key} {keyring.password} in {keyring.region} {keyring.opened.year}"


def unlock_struct(ctx: replayq.Context, locker: Locker) -> str:
    return f"{locker.api_key} in {locker.region} {locker.opened.year}"


def grant(ctx: replayq.Context, grant: Grant) -> None:
    return None


def login(ctx: replayq.Context, login: Login) -> None:
    return None


@dataclasses.dataclass
class Member:
    holder: str
    tier: str = "silver"

    def __post_init__(self) -> None:
        if self.tier not in ("gold", "silver"):
            raise ValueError(f"tier {self.tier} of {self.holder} is not offered")


def charge(ctx: replayq.Context, card: Card, amount: int = 0) -> None:
    return None


# Each refused by its type's own check, in a message quoting a secret.
REFUSED: tuple[tuple[str, dict[str, Any]], ...] = (
    ("grant", {"api_key": API_KEY}),  # the validator's "unknown key …"
    ("grant", {"api_key": "ak_1", "scope": BEARER}),
    ("login", {"password": PASSWORD}),  # msgspec's "Invalid enum value …"
    ("login", {"password": "gold", "tier": CARD}),
    ("charge", {"card": {"card_number": CARD, "holder": BEARER}}),  # ``__post_init__``
)


def spawn(ctx: replayq.Context, case: int) -> None:
    # The secrets come from the handler (as from its environment), not from its payload.
    child, payload = REFUSED[case]
    with ctx.step("spawn"):
        ctx.enqueue(child, payload)


def settle_v1(ctx: replayq.Context, account_number: str) -> None:
    return None


def settle_v2(ctx: replayq.Context, account_number: int) -> None:
    return None


def enroll_v1(ctx: replayq.Context, holder: str, tier: str) -> None:
    return None


def enroll_v2(ctx: replayq.Context, member: Member) -> None:
    return None


def build(url: str | None = None, *, v1: bool = False, **options: Any) -> replayq.App:
    built = replayq.App(url, **options)
    once = replayq.Retry(max_attempts=1)
    built.job("grant", retry=once)(grant)
    built.job("login", retry=once)(login)
    built.job("charge", retry=once)(charge)
    built.job("spawn", retry=once)(spawn)
    built.job("unlock", retry=once)(unlock)
    built.job("unlock_model", retry=once)(unlock_model)
    built.job("unlock_struct", retry=once)(unlock_struct)
    if v1:
        built.job("settle", retry=once)(settle_v1)
        built.job("enroll", retry=once)(enroll_v1)
    else:
        rules = replayq.Redaction(fields=["account_number"])
        built.job("settle", retry=once, redact=rules)(settle_v2)
        built.job("enroll", retry=once, redact=replayq.Redaction(fields=["holder"]))(enroll_v2)
    return built


app = build()
