"""Who may act: a token, a session cookie, and a CSRF token per session.

Reading needs nothing; the server binds 127.0.0.1 unless told otherwise. Every
action (dry-run, fork, requeue, cancel) needs ``REPLAYQ_WEB_TOKEN``: either sent
as ``Authorization: Bearer TOKEN`` (scripts; no cookie, so no CSRF), or entered
once on ``/login``, which starts a session (an ``HttpOnly``, ``SameSite=Strict``
cookie holding a random id kept in memory). A form posted with that cookie must
also carry the session's CSRF token, an HMAC of the session id under a key made
at startup. Without a configured token every action is refused (403).
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import threading

SESSION_COOKIE = "replayq_session"


class Guard:
    """The token, the live sessions and their CSRF tokens of one dashboard process."""

    def __init__(self, token: str | None) -> None:
        self.token = token or None
        self._key = secrets.token_bytes(32)
        self._sessions: set[str] = set()
        self._lock = threading.Lock()

    @property
    def enabled(self) -> bool:
        return self.token is not None

    def token_matches(self, offered: str | None) -> bool:
        if self.token is None or not offered:
            return False
        return hmac.compare_digest(offered.encode(), self.token.encode())

    def start_session(self) -> str:
        session = secrets.token_urlsafe(32)
        with self._lock:
            self._sessions.add(session)
        return session

    def end_session(self, session: str | None) -> None:
        with self._lock:
            self._sessions.discard(session or "")

    def session_valid(self, session: str | None) -> bool:
        with self._lock:
            return self.enabled and bool(session) and session in self._sessions

    def csrf_for(self, session: str) -> str:
        return hmac.new(self._key, session.encode(), hashlib.sha256).hexdigest()

    def may_act(self, *, bearer: str | None, session: str | None, csrf: str | None) -> bool:
        """A bearer token, or a live session with its CSRF token."""
        if self.token_matches(bearer):
            return True
        if not self.session_valid(session) or not csrf:
            return False
        assert session is not None
        return hmac.compare_digest(csrf, self.csrf_for(session))
