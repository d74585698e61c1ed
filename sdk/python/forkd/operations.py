"""Long operations the daemon owns, and idempotency keys.

An image build, a snapshot create or compact, a background branch: the
daemon runs them on its own lifetime, so a client that goes away does not
stop them. ``client.operations`` lists, follows and cancels them.
"""

from __future__ import annotations

import json
import urllib.parse
from typing import TYPE_CHECKING, Any, Callable, Dict, List, Optional, Tuple

from .errors import ForkdError, InvalidArgument, StreamInterrupted, error_from_problem
from .models import OperationInfo

if TYPE_CHECKING:  # pragma: no cover
    from .client import Client

__all__ = ["Operations"]

# MAX_IDEMPOTENCY_KEY is the longest Idempotency-Key the daemon takes.
MAX_IDEMPOTENCY_KEY = 255


def _idempotency_headers(key: Optional[str]) -> Dict[str, str]:
    if key is None:
        return {}
    if not isinstance(key, str) or not 0 < len(key) <= MAX_IDEMPOTENCY_KEY or not all(" " <= c <= "~" for c in key):
        raise InvalidArgument("idempotency_key: want 1 to %d printable ASCII characters (a UUID)" % MAX_IDEMPOTENCY_KEY)
    return {"Idempotency-Key": key}


def _op_path(op_id: str) -> str:
    if not op_id or not isinstance(op_id, str):
        raise InvalidArgument("operation id must be a non-empty string, not %r" % (op_id,))
    return "/v1/operations/" + urllib.parse.quote(op_id, safe="")


class Operations:
    """Long operations the daemon owns: image builds, snapshot creates and
    compacts, background branches. Reach it as ``client.operations``."""

    def __init__(self, client: "Client") -> None:
        self._c = client

    def list(self) -> List[OperationInfo]:
        """Your tenant's operations (all for an admin), oldest first."""
        return [OperationInfo.from_json(d) for d in self._c._list("/v1/operations")]

    def get(self, op_id: str) -> OperationInfo:
        """One operation as it is now."""
        return OperationInfo.from_json(self._c._json("GET", _op_path(op_id)))

    def cancel(self, op_id: str) -> OperationInfo:
        """Cancel a running operation: what it staged is removed, no tag is
        left. Returns at once (``cancel_requested`` set); :meth:`wait` says
        when it has ended.

        Raises:
            Conflict: it has already ended. NotFound: no such operation.
        """
        return OperationInfo.from_json(
            self._c._json("POST", _op_path(op_id) + "/cancel", what="cancel operation %s" % op_id)
        )

    def wait(
        self,
        op_id: str,
        *,
        on_progress: Optional[Callable[[str], None]] = None,
        timeout: Optional[float] = None,
    ) -> OperationInfo:
        """Follow an operation's events until it ends and return it. A cut
        stream (a dropped connection) re-attaches: the daemon sends the
        current state first. ``timeout``: seconds without any event (None:
        no limit).

        Raises:
            StreamInterrupted: the stream was cut three times in a row.
        """
        path = _op_path(op_id) + "/events"
        f = _Follow(op_id)
        while True:
            resp = self._c._transport.request(
                "GET", path, headers={"Accept": "application/x-ndjson"}, timeout=timeout, what="operation %s" % op_id
            )
            try:
                for line in resp.lines():
                    msgs, done = f.event(line)
                    if on_progress is not None:
                        for msg in msgs:
                            on_progress(msg)
                    if done is not None:
                        return done
            except (ValueError, ForkdError) as e:
                resp.close()
                f.cut(e, None)
                continue
            f.cut(None, resp.request_id)

    @staticmethod
    def _result(op: OperationInfo) -> Dict[str, Any]:
        """A finished operation's result, or its problem raised."""
        if op.state == "succeeded" and op.result is not None:
            return op.result
        if op.error:
            raise error_from_problem(op.error)
        raise ForkdError("operation %s ended %s" % (op.id, op.state))


class _Follow:
    """Following one operation's event stream, across re-attaches: what
    the sync and asyncio waits share. A cut stream re-attaches (the daemon
    sends the current state first); three cuts in a row raise."""

    def __init__(self, op_id: str) -> None:
        self.op_id = op_id
        self.seen = 0  # progress lines already reported
        self.cuts = 0

    def event(self, line: bytes) -> Tuple[List[str], Optional[OperationInfo]]:
        """One event line: the progress messages it brings, and the
        operation once it has ended. Raises ValueError for a bad line."""
        ev = json.loads(line)
        self.cuts = 0  # an event: the stream works; cuts count in a row
        if ev.get("operation") is not None:
            op = OperationInfo.from_json(ev["operation"])
            msgs = op.progress[self.seen:] if not op.done else []
            self.seen = max(self.seen, len(op.progress))
            return list(msgs), op if op.done else None
        if ev.get("message"):
            self.seen += 1
            return [ev["message"]], None
        return [], None

    def cut(self, err: Optional[BaseException], request_id: Optional[str]) -> None:
        """The stream broke (err) or ended before the operation did."""
        self.cuts += 1
        if self.cuts < 3:
            return
        if err is not None:
            raise StreamInterrupted("operation %s: its event stream broke: %s" % (self.op_id, err))
        raise StreamInterrupted(
            "operation %s: its event stream ended before it did (did the daemon restart?)" % self.op_id,
            request_id=request_id,
        )
