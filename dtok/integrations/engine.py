"""What dtok's serving-engine hooks share (SGLang, vLLM): the request's session key, the options
of one encode call, a per-tokenizer cache of dtok wrappers, the encode itself (in process or
through a :class:`dtok.Pool`), and the one body every hooked encode runs
(:meth:`EngineHook.serve` / :meth:`EngineHook.serve_async`).

An engine module (``dtok.integrations.sglang``, ``dtok.integrations.vllm``) owns one
:class:`EngineHook`, binds :data:`SESSION_KEY` where the engine parses a request, and calls
:meth:`EngineHook.serve` / :meth:`EngineHook.serve_async` where the engine tokenizes a prompt:
dtok answers, or (dtok must stay out, or failed) the engine's own code does.

Identity (:mod:`dtok.integrations.identity`): dtok is built from the engine's live tokenizer;
when the engine's environment names the model's tokenizer.json (``DTOK_SGLANG_TOKENIZER`` /
``DTOK_VLLM_TOKENIZER``), from that file, after checking that it equals the live tokenizer in
every section that decides IDs (so the fast encoder's guard tables, which are keyed by the
file's hash, apply, and a pool can load it); then probe texts must encode identically both
ways. Patching: :mod:`dtok.integrations.patching`.

Pool (``DTOK_POOL_WORKERS=N`` in the server's environment, or :func:`configure`; see
:mod:`dtok.integrations.config`): keyed sessions and stateless prompts of at least
``DTOK_POOL_MIN_CHARS`` characters (default 16384) go to a :class:`dtok.Pool` built from the
same dtok tokenizer, awaited without blocking the event loop; shorter prompts stay in process.
The pool starts in a background thread on first use (requests are encoded in process until it
is ready); if it cannot start, everything stays in process and :meth:`EngineHook.pool_state`
says why. Unkeyed prompts sent to the pool get its content lookup (a prompt sharing at least
half of a stored one continues it). An engine that tokenizes in an executor (vLLM) gets the
in-process answers that encode at most ``DTOK_LOOP_CHARS`` characters on its event loop
(:meth:`EngineHook.serve_async`).

``DTOK_STATS_FILE=PATH`` (``{pid}`` expands to the process id): each hook's
:meth:`EngineHook.report` is written there as JSON when the process exits.

Tenants: a request's key is its session (a session id, else the request id's prefix) inside
its scope (``cache_salt`` and the served model or LoRA adapter, where the engine says): dtok
passes both to the pool or the tokenizer, which keep sessions and content lookup of different
scopes apart, so the same session id under two salts names two sessions, and a salted request
without a session id continues its own conversation by content lookup inside its tenant.

>>> session_key(session_id="conv-1", cache_salt="tenant")
RequestKey(session=('sid', 'conv-1'), scope=('tenant', None))
>>> session_key(request_id="conv-7:turn-3", rid_separator=":")
RequestKey(session=('rid', 'conv-7'), scope=None)
>>> session_key(cache_salt="tenant", model="lora-a")
RequestKey(session=None, scope=('tenant', 'lora-a'))
"""
from __future__ import annotations

import asyncio
import atexit
import collections
import contextlib
import contextvars
import json
import logging
import os
import threading
import time
import weakref
from dataclasses import dataclass
from typing import Any, Callable, Hashable, Iterator, NamedTuple

from dtok.digests import sha256
from dtok.integrations import config, identity
from dtok.integrations.config import configure
from dtok.integrations.transformers import wrap

log = logging.getLogger("dtok.integrations")

__all__ = ["SESSION_KEY", "EncodeOptions", "EngineHook", "RequestKey", "bound_key", "configure",
           "encode_options", "session_key"]


class RequestKey(NamedTuple):
    """Where dtok keeps a request's state: ``session`` (``("sid", id)``, ``("rid", prefix)``, or
    None: content lookup) inside ``scope`` (``(cache_salt, model)``, None when neither is
    known). Tuples: no separator a salt or id could contain makes two tenants' keys equal."""

    session: Hashable | None
    scope: Hashable | None


#: The key of the request being served (set where the engine parses the request).
SESSION_KEY: contextvars.ContextVar[RequestKey | None] = contextvars.ContextVar(
    "dtok_session_key", default=None)


def session_key(*, session_id: Any = None, cache_salt: Any = None, request_id: Any = None,
                rid_separator: str | None = None, model: Any = None) -> RequestKey | None:
    """The request's key: its session, first found (a session id, the request id up to
    ``rid_separator`` when set and present), inside its scope (the cache salt and the served
    model or adapter); None: neither (content lookup, unscoped)."""
    salt = _bounded(cache_salt) if isinstance(cache_salt, str) and cache_salt else None
    model = _bounded(model) if isinstance(model, str) and model else None
    scope = None if salt is None and model is None else (salt, model)
    session = None
    if isinstance(session_id, str) and session_id:
        session = ("sid", _bounded(session_id))
    elif rid_separator and isinstance(request_id, str) and rid_separator in request_id:
        session = ("rid", _bounded(request_id.split(rid_separator, 1)[0]))
    return None if session is None and scope is None else RequestKey(session, scope)


KEY_CHARS = 256  # a longer id, salt or model name is kept as its SHA-256
WARM_TEXT = "A thread's first encode sets up the fast encoder's state for it. " * 16


def _bounded(value: str) -> str | tuple[str, str]:
    """A client's string as kept in a key: itself, or past KEY_CHARS its SHA-256 (a 1 MB
    session id must not be held once per session; collisions are out of reach)."""
    if len(value) <= KEY_CHARS:
        return value
    return ("sha256", sha256(value.encode("utf-8", "surrogatepass")).hexdigest())


def _parts(key) -> tuple[Hashable | None, Hashable | None]:
    """(session, scope) of a request's key (a plain key: a session without a scope)."""
    if key is None:
        return None, None
    return (key.session, key.scope) if isinstance(key, RequestKey) else (key, None)


@contextlib.contextmanager
def bound_key(key: RequestKey | None) -> Iterator[None]:
    """Bind :data:`SESSION_KEY` for the duration of a request's parsing and tokenization."""
    token = SESSION_KEY.set(key)
    try:
        yield
    finally:
        SESSION_KEY.reset(token)

# --- the options of one encode call ---------------------------------------------------------


@dataclass(frozen=True)
class EncodeOptions:
    """What a hooked call asks for: special tokens, and truncation to ``max_length`` IDs from
    ``side`` (None: no truncation)."""

    add_special_tokens: bool = True
    max_length: int | None = None
    side: str = "right"


def encode_options(hf_tokenizer, kwargs: dict[str, Any]) -> EncodeOptions | None:
    """The options of ``hf_tokenizer(text, **kwargs)`` when dtok can reproduce that call, else
    None. Accepted: ``add_special_tokens``, and ``truncation`` off, or on with an int
    ``max_length`` (the tokenizer's own ``truncation_side`` applies, as in transformers)."""
    if set(kwargs) - {"add_special_tokens", "truncation", "max_length"}:
        return None
    special = kwargs.get("add_special_tokens", True)
    truncation = kwargs.get("truncation", None)
    max_length = kwargs.get("max_length", None)
    if type(special) is not bool:
        return None
    if truncation in (None, False, "do_not_truncate"):
        return EncodeOptions(special)
    if truncation is not True or type(max_length) is not int or max_length < 1:
        return None  # other strategies, or the model's own limit: transformers decides
    side = getattr(hf_tokenizer, "truncation_side", "right")
    if side not in ("left", "right"):
        return None
    return EncodeOptions(special, max_length, side)


def _truncated(ids: list[int], tok, options: EncodeOptions) -> list[int] | None:
    """``ids`` as the reference returns them with truncation on: the text's IDs cut to
    ``max_length`` minus the post-processor's IDs, from ``options.side``, then the prefix and
    suffix put back. None where dtok does not know the post-processor's IDs."""
    if options.max_length is None or len(ids) <= options.max_length:
        return ids
    a = tok.admission
    if not a.admitted:
        return None
    pre, suf = (len(a.prefix), len(a.suffix)) if options.add_special_tokens else (0, 0)
    keep = options.max_length - pre - suf
    if keep < 1:
        return None
    # the body, ids[pre:end], is longer than keep: only the kept part is copied (on an event
    # loop, copying a rejected 1M-character document's whole body took milliseconds)
    end = len(ids) - suf
    kept = ids[end - keep:end] if options.side == "left" else ids[pre:pre + keep]
    return ids[:pre] + kept + ids[end:]


# --- the hook state of one engine -----------------------------------------------------------

_HOOKS: list["EngineHook"] = []


def _write_reports() -> None:
    """At exit with ``DTOK_STATS_FILE=PATH`` (``{pid}`` is replaced by the process id): each
    hook's :meth:`EngineHook.report` as JSON, e.g. to compare replicas behind a router."""
    path = os.environ["DTOK_STATS_FILE"].replace("{pid}", str(os.getpid()))
    try:
        with open(path, "w") as f:
            json.dump([h.report() for h in _HOOKS if h.stats["dtok_calls"]], f, indent=1)
    except Exception as exc:  # noqa: BLE001 - never fail an exiting server
        log.warning("dtok: cannot write %s: %s", path, exc)




class EngineHook:
    """The state of one engine's hooks: which tokenizers dtok serves, the pools, counters.

    ``frozen_env`` names the environment variable holding a tokenizer.json path that the live
    tokenizer must equal section by section; ``trusted_overrides`` are qualified-name prefixes
    of engine classes whose ``encode``/``__call__`` only delegate to transformers' own (e.g.
    vLLM's thread-pool proxy); any other override keeps dtok out."""

    def __init__(self, engine: str, *, frozen_env: str,
                 trusted_overrides: tuple[str, ...] = ()) -> None:
        self.engine = engine
        self.frozen_env = frozen_env
        self.trusted_overrides = trusted_overrides
        self.stats = {"dtok_calls": 0, "keyed_calls": 0, "pool_calls": 0, "truncated": 0,
                      "passed_through": 0, "errors": 0}
        self._lock = threading.Lock()  # quick bookkeeping only: an event loop may take it
        self._build_lock = threading.Lock()  # held for a whole build (seconds)
        self._by_tok: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
        self._refused: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
        self._pools: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
        self._building: weakref.WeakSet = weakref.WeakSet()
        #: (ms, characters, keyed) of the last answered calls (see :meth:`serve`)
        self.timings: collections.deque = collections.deque(maxlen=4096)
        #: False: every hook passes through to the engine's own code (checks, operators)
        self.enabled = True
        if os.environ.get("DTOK_STATS_FILE") and not _HOOKS:
            atexit.register(_write_reports)
        _HOOKS.append(self)

    # --- which tokenizers dtok serves -------------------------------------------------------

    def dtok_for(self, hf_tokenizer, *, wait: bool = True, warm_loop=None):
        """dtok's wrapper for the engine's tokenizer, or None when dtok must stay out (cached
        per tokenizer object). Building it takes seconds (the probes, the fast encoder); with
        ``wait=False`` (on an event loop) a tokenizer not built yet is built in a background
        thread and None is returned meanwhile: the engine's own code serves those requests.
        ``warm_loop``: an event loop that will encode with it, whose thread then encodes a
        short text as soon as it is built (:meth:`_warm`)."""
        if hf_tokenizer is None or not self.enabled:
            return None
        try:
            if hf_tokenizer in self._by_tok:
                return self._by_tok[hf_tokenizer]
            if hf_tokenizer in self._refused:
                return None
        except TypeError:  # not weak-referenceable
            return None
        if not wait:
            with self._lock:
                if hf_tokenizer not in self._building:
                    self._building.add(hf_tokenizer)
                    threading.Thread(target=self._build_in_background,
                                     args=(hf_tokenizer, warm_loop), name="dtok-build",
                                     daemon=True).start()
            return None
        with self._build_lock:
            if hf_tokenizer not in self._by_tok and hf_tokenizer not in self._refused:
                wrapper, why = self.build(hf_tokenizer)
                if wrapper is None:
                    self._refused[hf_tokenizer] = why
                    log.warning("dtok stays out of %s's tokenization: %s", self.engine, why)
                else:
                    self._by_tok[hf_tokenizer] = wrapper
                    log.info("dtok encodes %s's prompts (%r)", self.engine, wrapper.dtok)
            return self._by_tok.get(hf_tokenizer)

    def _build_in_background(self, hf_tokenizer, warm_loop) -> None:
        wrapper = self.dtok_for(hf_tokenizer)
        if wrapper is not None and warm_loop is not None:
            try:
                warm_loop.call_soon_threadsafe(self._warm, wrapper)
            except RuntimeError:  # the loop closed meanwhile
                pass

    @staticmethod
    def _warm(wrapper) -> None:
        """Encode a short text in this thread (an event loop's, between requests): a thread's
        first call into the fast encoder sets up its per-thread state, which the first request
        answered on this loop would otherwise wait for (docs/serving.md)."""
        try:
            wrapper.current().encode(WARM_TEXT)
        except Exception as exc:  # noqa: BLE001 - only a warm-up
            log.debug("dtok: warm-up failed: %s", exc)

    def refusal(self, hf_tokenizer) -> str | None:
        """Why dtok stays out of this tokenizer (after :meth:`dtok_for` refused it), or None."""
        try:
            return self._refused.get(hf_tokenizer)
        except TypeError:
            return "not weak-referenceable"

    def build(self, hf) -> tuple[Any, str]:
        """(wrapper, "") when dtok reproduces ``hf`` exactly on every probe, else (None, why)."""
        why = identity.unsupported(hf, self.trusted_overrides)
        if why is not None:
            return None, why
        frozen = os.environ.get(self.frozen_env) or None
        try:
            # built from the frozen file when given (checked equal to the live backend)
            wrapper = wrap(hf, source=frozen, **config.knobs())
            why = identity.probe_mismatch(hf, wrapper.dtok)
        except Exception as exc:  # noqa: BLE001
            return None, f"{type(exc).__name__}: {exc}"
        return (None, why) if why is not None else (wrapper, "")

    # --- pools ------------------------------------------------------------------------------

    def pool_for(self, tok, *, wait: float | None = None):
        """The started pool for a dtok tokenizer, or None (no pool configured, still starting,
        or failed). ``wait``: seconds to wait for a pool that is starting."""
        workers = config.pool_workers()
        if workers < 1:
            return None
        slot = self._pools.get(tok)
        if slot is None:
            with self._lock:
                slot = self._pools.get(tok)
                if slot is None:
                    slot = self._pools[tok] = config.PoolSlot(tok, workers)
        if wait is not None:
            slot.ready.wait(wait)
        return slot.pool

    def pool_state(self, tok=None) -> list[dict[str, Any]]:
        """Each pool of this engine's hooks (or only ``tok``'s): ready, error, and the pool's
        own stats."""
        out = []
        slots = list(self._pools.values()) if tok is None else [self._pools.get(tok)]
        for slot in filter(None, slots):
            state = {"ready": slot.pool is not None, "error": slot.error}
            if slot.pool is not None:
                state["stats"] = slot.pool.stats()
            out.append(state)
        return out

    def report(self) -> dict[str, Any]:
        """The hook's counters, each served tokenizer's session stats, and the pools' stats
        (milliseconds: :meth:`dtok.Pool.stats` reads ``/proc``; call it off the event loop)."""
        tokenizers = []
        for wrapper in list(self._by_tok.values()):
            tok = wrapper.dtok
            tokenizers.append({"path": str(tok.files.path), "encoder": tok.stats()["encoder"],
                               "sessions": tok.sessions.stats(),
                               "bounds": tok.sessions.describe()})
        ms = sorted(t[0] for t in self.recent_timings())
        took = {"calls": len(ms), "median_ms": ms[len(ms) // 2] if ms else None,
                "max_ms": ms[-1] if ms else None}
        return {"engine": self.engine, "pid": os.getpid(), "stats": dict(self.stats),
                "hook_time": took,
                "tokenizers": tokenizers, "pools": self.pool_state()}

    def recent_timings(self) -> list[tuple[float, int, bool]]:
        """A copy of :attr:`timings`: threads append to it while a stats endpoint reads it, and
        even a C-level copy can let another thread run (a collection it triggers calls back
        into Python), so both hold the lock."""
        with self._lock:
            return list(self.timings)

    def close(self) -> None:
        """Close this engine's pools (requests after this are encoded in process)."""
        for slot in list(self._pools.values()):
            slot.ready.wait()
            if slot.pool is not None:
                slot.pool.close()
        self._pools.clear()

    def pool_route(self, wrapper, text: str, key: Any = None):
        """The pool that should encode ``text`` (keyed, or at least ``DTOK_POOL_MIN_CHARS``
        long, and a pool is ready), or None: encode in process."""
        if _parts(key)[0] is None and len(text) < config.pool_min_chars():
            return None
        return self.pool_for(wrapper.current())

    # --- encoding ---------------------------------------------------------------------------

    def _bump(self, **counts: int) -> None:
        """Add to the counters (executor threads and the event loop answer calls at once)."""
        with self._lock:
            for name, n in counts.items():
                self.stats[name] += n

    def _count(self, key, pooled: bool) -> None:
        self._bump(dtok_calls=1, keyed_calls=_parts(key)[0] is not None, pool_calls=pooled)

    def _finish(self, tok, ids: list[int], options: EncodeOptions) -> list[int] | None:
        out = _truncated(ids, tok, options)
        if out is not ids and out is not None:
            self._bump(truncated=1)
        return out

    def encode(self, wrapper, text: str, options: EncodeOptions = EncodeOptions(),
               key: Any = None) -> list[int] | None:
        """The IDs the engine's tokenizer returns for ``text`` with ``options``, through dtok;
        None when dtok cannot reproduce the call. Blocking: a prompt routed to the pool is
        waited for in this thread. Raises what the encode raises."""
        tok, pool = wrapper.current(), self.pool_route(wrapper, text, key)
        return self._encode_with(tok, tok if pool is None else pool, text, options, key)

    def _encode_with(self, tok, owner, text, options, key, max_chars: int | None = None
                     ) -> list[int] | None:
        """Encode with ``owner``: the pool, or ``tok`` itself (in process); ``max_chars`` (in
        process): only an answer that encodes at most that many characters
        (:meth:`dtok.Tokenizer.try_encode_list`), else None."""
        session, scope = _parts(key)
        if max_chars is None:
            self._count(key, owner is not tok)
            ids = owner.encode_list(text, session=session, scope=scope,
                                    add_special_tokens=options.add_special_tokens)
        else:
            ids = tok.try_encode_list(text, max_chars=max_chars, session=session, scope=scope,
                                      add_special_tokens=options.add_special_tokens)
            if ids is None:
                return None
            self._count(key, False)
        return self._finish(tok, ids, options)

    async def encode_async(self, wrapper, text: str, options: EncodeOptions = EncodeOptions(),
                           key: Any = None, loop_chars: int | None = None) -> list[int] | None:
        """:meth:`encode` for an event loop: a prompt routed to the pool is awaited, so the
        loop never waits behind it (a session's next turn planned on the loop only within
        ``DTOK_LOOP_CHARS``' budget); the rest is encoded here, in the loop's thread (with
        ``loop_chars``, only where that encodes at most so many characters; else None)."""
        tok, pool = wrapper.current(), self.pool_route(wrapper, text, key)
        if pool is None:  # in process (routed once: a pool ready meanwhile is not waited for)
            return self._encode_with(tok, tok, text, options, key, loop_chars)
        self._count(key, True)
        session, scope = _parts(key)
        ids = await pool.encode_list_async(text, session=session, scope=scope,
                                           add_special_tokens=options.add_special_tokens,
                                           loop_chars=config.loop_chars())
        return self._finish(tok, ids, options)

    # --- the body of every hooked encode ------------------------------------------------------

    def _answered(self, t0: float, target, ids: list[int] | None) -> list[int] | None:
        """``ids``, an answered call's timing kept (None: no answer, nothing kept)."""
        if ids is not None:
            # (ms, characters, keyed) of an answered call: from the hook's entry to the IDs
            # handed on (awaited pool calls include the wait)
            took = (round((time.perf_counter() - t0) * 1e3, 3), len(target[1]),
                    _parts(target[3])[0] is not None)
            with self._lock:
                self.timings.append(took)
        return ids

    def _target(self, call: Callable[[], Any], wait: bool, warm_loop=None
                ) -> tuple[Any, str, EncodeOptions, Any] | None:
        """(wrapper, text, options, key) when dtok answers: ``call()`` gave (the engine's
        tokenizer, text, :class:`EncodeOptions`) and dtok serves that tokenizer; else None."""
        request = call()
        if request is None:
            return None
        tokenizer, text, options = request
        wrapper = self.dtok_for(tokenizer, wait=wait, warm_loop=warm_loop)
        return None if wrapper is None else (wrapper, text, options, SESSION_KEY.get())

    def serve(self, call: Callable[[], Any], original: Callable[[], Any],
              answer: Callable[[list[int]], Any] | None = None, *, wait: bool = True):
        """One hooked encode, blocking: dtok's IDs (through ``answer``, if given), else ``original()``
        (the engine's own code: ``call()`` returned None, dtok stays out of the tokenizer or
        cannot reproduce the call, or failed; errors are counted and logged). ``call`` runs
        inside the error guard: it returns (the engine's tokenizer, text, options) or None.
        ``wait=False``: a tokenizer dtok has not built yet is built in the background."""
        try:
            t0 = time.perf_counter()
            target = self._target(call, wait)
            ids = None if target is None else self._answered(t0, target, self.encode(*target))
        except Exception as exc:  # noqa: BLE001 - never break serving
            self.error(exc)
            ids = None
        if ids is None:
            self._bump(passed_through=1)
            return original()
        return ids if answer is None else answer(ids)

    async def serve_async(self, call: Callable[[], Any], original: Callable[[], Any],
                          answer: Callable[[list[int]], Any] | None = None, *,
                          executor_backed: bool = False):
        """:meth:`serve` on an event loop: never builds dtok here (in the background instead),
        awaits a prompt routed to the pool, and awaits ``original()`` otherwise.
        ``executor_backed``: ``original()`` runs the blocking hook in the engine's executor, so
        here only pool-routed prompts are answered, and in process the prompts whose answer
        encodes at most ``DTOK_LOOP_CHARS`` characters (a session's next turn: answered at once,
        without the executor's hop there and back); the rest go to ``original()``, and are not
        counted as passed through here."""
        loop_chars = config.loop_chars() if executor_backed else None
        if executor_backed and not loop_chars and config.pool_workers() < 1:
            return await original()  # nothing for the loop to do, not even the checks
        try:
            t0 = time.perf_counter()
            # answering on the loop: its thread is warmed up once dtok is built
            target = self._target(call, False, asyncio.get_running_loop() if loop_chars else None)
            ids = None if target is None else self._answered(
                t0, target, await self.encode_async(*target, loop_chars))
        except Exception as exc:  # noqa: BLE001 - never break serving
            self.error(exc)
            ids = None
        if ids is None:
            self._bump(passed_through=not executor_backed)
            return await original()
        return ids if answer is None else answer(ids)

    def error(self, exc: BaseException) -> None:
        """Count and log a hook error (the engine's own code then tokenizes)."""
        self._bump(errors=1)
        log.warning("dtok hook failed, %s tokenizes: %s: %s", self.engine, type(exc).__name__, exc)
