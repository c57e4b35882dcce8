"""Redaction that cannot be undone: machine identifiers → keyed 128-bit tokens, wherever they appear.

Why keyed: deepgap used to hash a host name or a GPU serial without a key, to 48 bits. Anyone could
hash guesses and compare: the host ``vm`` mapped to the token already in committed stores, and a
13-digit serial whose first 7 digits are known (10^6 candidates) came back in 0.07 s. Here a token
is HMAC-SHA256 under a 256-bit key, cut to 128 bits. The key is random for each command (each
export, report or ``merge --redact``) and is never written anywhere, so no dictionary of candidates
can be checked against a token, and two exports of one store give different tokens. Within one
command one machine keeps one token (an export still tells its machines apart). To get the same
tokens across commands, set ``DEEPGAP_REDACT_KEY`` to a secret of your own: then whoever holds that
secret can confirm guesses, and nobody else can.

Why everywhere: a fingerprint's ``host`` is one place; the same name also sits inside a Ray lane
(``vm (3f2a1b) cuda:0``), node ids, the stored command line (``--ray vm:6379``), error reasons and
paths. `Redactor.tree` first learns every identifier of a record (the values of `REDACT_KEYS`), then
replaces them, and every learnt identifier, GPU/MIG UUID, IPv4 address and old 48-bit token inside
any other text (`Redactor.text`). Home folders (``/home/alice``, ``/root``, this user's ``~``) become
``<home>`` and ``$DEEPGAP_CACHE`` ``<cache>`` in all text (`paths`): a stored command line or an engine's
cache path names its user otherwise.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import re
import secrets
from typing import Any

from deepgap.core.precision import PRECISIONS

# Keys whose values identify one machine (compared in lower case).
REDACT_KEYS = frozenset(
    {
        "host",
        "hostname",
        "gpu_serial",
        "serial",
        "gpu_uuid",
        "uuid",
        "node_id",
        "node_ip",
        "ip",
        "address",
        "ray_node_id",
        "nodemanagerhostname",
        "nodemanageraddress",
        "node_manager_address",
        "node_name",
        "machine_id",
        "board_serial",
    }
)
TOKEN_BITS = 128
KEY_ENV = "DEEPGAP_REDACT_KEY"
_TOKEN = re.compile(r"redacted-[0-9a-f]{32}")
# identifiers found in free text whatever their key: a GPU or MIG UUID, an IPv4 address with its port
# (``--ray 10.0.0.5:6379``; a bare a.b.c.d may be a version, as TensorRT's), and a token of the old
# unkeyed 48-bit scheme (reversible, so it counts as the identifier it stands for)
_PATTERNS = re.compile(
    r"(?<![0-9A-Za-z.])(?:(?:GPU|MIG)-[0-9a-fA-F]{8}(?:-[0-9a-fA-F]{4}){3}-[0-9a-fA-F]{12}"
    r"|(?:\d{1,3}\.){3}\d{1,3}(?=:\d)"
    r"|redacted-[0-9a-f]{12})(?![0-9A-Za-z])"
)
_NODE_PREFIX = 6  # a Ray lane shows a node id's first 6 characters
# A home folder names its user (``/home/alice/.cache/deepgap/trt/…`` in engine_info, ``--store
# /home/alice/x.sqlite`` in a stored command line): it becomes ``<home>``, wherever it appears.
_HOMES = r"/home/[^/\s'\"=:,;]+|/Users/[^/\s'\"=:,;]+|/root(?=[/\s'\"]|$)"
HOME = "<home>"
CACHE = "<cache>"


def _local_paths() -> list[tuple[str, str]]:
    """This machine's own cache and home folders (longest first), wherever they sit: ``(path, stand-in)``."""
    out = []
    cache = os.environ.get("DEEPGAP_CACHE")
    if cache and len(cache.rstrip("/")) > 1:
        out.append((cache.rstrip("/"), CACHE))
    home = os.path.expanduser("~")
    if home and len(home.rstrip("/")) > 1 and not home.startswith("~"):
        out.append((home.rstrip("/"), HOME))
    return sorted(out, key=lambda p: len(p[0]), reverse=True)


# deepgap's own words, never scrubbed out of text: a host named ``cpu`` is tokenised where it is the
# host, but ``merge --redact`` turned every device value ``cpu`` (and ``--device cpu``) into its token
_VOCABULARY = frozenset(
    {"cpu", "cuda", "gpu", "mps", "auto", "eager", "nchw", "channels_last", "ok", "error", "none", "null"}
    | {"true", "false", "running", "finished", "interrupted", "localhost"}
    | set(PRECISIONS)
)


def _skip(text: str) -> bool:
    """Values that identify nothing: already a token, or an 'unavailable: …' reason."""
    return bool(_TOKEN.fullmatch(text)) or text.startswith("unavailable")


class Redactor:
    """Keyed one-way tokens for identifiers, and the text around them scrubbed of what it learnt."""

    def __init__(self, key: bytes | None = None) -> None:
        self._key = key if key is not None else secrets.token_bytes(32)
        self._known: dict[str, str] = {}  # identifier → token, for scrubbing free text
        self._scrub: re.Pattern[str] | None = None

    def token(self, value: Any) -> Any:
        """The token of ``value`` (None, "", a bool, a float, a token or an 'unavailable' reason are kept).

        Why floats are kept: no machine identifier is a float, but a measurement may sit under a key of
        `REDACT_KEYS` (the quant engine's ``{"serial": 0.000268, "branched": …}`` graph times), and a
        token there lost the number in every export and report, and taught the scrubber its digits.
        """
        if value is None or value == "" or isinstance(value, (bool, float)):
            return value
        text = str(value)
        if _skip(text):
            return value
        if text not in self._known:
            digest = hmac.new(self._key, text.encode("utf-8", "surrogatepass"), hashlib.sha256).hexdigest()
            self._known[text] = "redacted-" + digest[: TOKEN_BITS // 4]
            self._scrub = None
        return self._known[text]

    def learn(self, obj: Any, node: bool = False) -> None:
        """Give a token to every identifier in ``obj`` (the values of `REDACT_KEYS`, at any depth)."""
        if isinstance(obj, dict):
            for k, v in obj.items():
                key = str(k).lower()
                if key in REDACT_KEYS and not isinstance(v, (dict, list)):
                    self.token(v)
                    text = str(v)
                    if "node" in key and len(text) >= 4 * _NODE_PREFIX and not _skip(text):
                        self.token(text[:_NODE_PREFIX])  # the short form a lane string shows
                else:
                    self.learn(v)
        elif isinstance(obj, list):
            for v in obj:
                self.learn(v)

    def tree(self, obj: Any) -> Any:
        """``obj`` (a fingerprint, a result's details) with every identifier replaced, keyed or in text."""
        self.learn(obj)
        return self._rewrite(obj)

    def _rewrite(self, obj: Any) -> Any:
        if isinstance(obj, dict):
            return {
                k: self.token(v)
                if str(k).lower() in REDACT_KEYS and not isinstance(v, (dict, list))
                else self._rewrite(v)
                for k, v in obj.items()
            }
        if isinstance(obj, list):
            return [self._rewrite(v) for v in obj]
        if isinstance(obj, str):
            return self.text(obj)
        return obj

    def text(self, text: Any) -> Any:
        """Free text with every learnt identifier, GPU/MIG UUID, IPv4 address and old token replaced."""
        if not isinstance(text, str) or not text or _TOKEN.fullmatch(text):
            return text
        text = paths(text)
        text = _PATTERNS.sub(lambda m: self.token(m.group(0)), text)
        names = [
            k for k in self._known if len(k) >= 2 and not _TOKEN.fullmatch(k) and k.lower() not in _VOCABULARY
        ]
        if not names:
            return text
        if self._scrub is None:
            alternatives = "|".join(re.escape(k) for k in sorted(names, key=len, reverse=True))
            self._scrub = re.compile(f"(?<![0-9A-Za-z])(?:{alternatives})(?![0-9A-Za-z])")
        return self._scrub.sub(lambda m: self._known[m.group(0)], text)


def paths(text: str) -> str:
    """``text`` with home folders (any user's) and this machine's deepgap cache replaced by stand-ins.

    Why not tokens: a path says nothing a reader needs beyond its tail (``<home>/.cache/deepgap/trt/…``
    still tells which engine file was read), and a stand-in is the same in every export.
    """
    for path, stand_in in _local_paths():
        text = re.sub(re.escape(path) + r"(?=[/\s'\"]|$)", stand_in, text)
    return re.sub(_HOMES, HOME, text)


_current: Redactor | None = None


def reset(key: bytes | None = None) -> Redactor:
    """A new redactor for the next command: a fresh random key, or ``DEEPGAP_REDACT_KEY``'s."""
    global _current
    env = os.environ.get(KEY_ENV)
    _current = Redactor(key if key is not None else env.encode() if env else None)
    return _current


def current() -> Redactor:
    """This command's redactor (one key per command, so one machine keeps one token within it)."""
    return _current or reset()


def redact_value(value: Any) -> Any:
    """The token of one identifier under this command's key."""
    return current().token(value)


def redact(obj: Any) -> Any:
    """``obj`` (an environment fingerprint, a result's extra data) with every identifier redacted."""
    return current().tree(obj)


def redact_text(text: Any) -> Any:
    """Free text (a command line, an error reason, a path) with every identifier learnt so far replaced."""
    return current().text(text)
