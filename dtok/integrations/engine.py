"""What dtok's serving-engine hooks share (SGLang, vLLM): identity checks of the live tokenizer,
a per-tokenizer cache of dtok wrappers, the request's session key, the encode call itself
(in process or through a :class:`dtok.Pool`), and patching.

An engine module (``dtok.integrations.sglang``, ``dtok.integrations.vllm``) owns one
:class:`EngineHook`, binds :data:`SESSION_KEY` where the engine parses a request, and calls
:meth:`EngineHook.encode` / :meth:`EngineHook.encode_async` where the engine tokenizes a prompt.
Either returns ``None`` when dtok must stay out; the hook then calls the engine's own code.

Identity: dtok is built from the engine's live tokenizer; when the engine's environment names
the model's tokenizer.json (``DTOK_SGLANG_TOKENIZER`` / ``DTOK_VLLM_TOKENIZER``), from that file,
after checking that it equals the live tokenizer in every section that decides IDs (so the
fast encoder's guard tables, which are keyed by the file's hash, apply, and a pool can load
it); then probe texts must encode identically both ways.

Pool (``DTOK_POOL_WORKERS=N`` in the server's environment, or :func:`configure`): keyed
sessions and stateless prompts of at least ``DTOK_POOL_MIN_CHARS`` characters (default 16384)
go to a :class:`dtok.Pool` built from the same dtok tokenizer, awaited without blocking the
event loop; shorter prompts stay in process. The pool starts in a background thread on first
use (requests are encoded in process until it is ready); if it cannot start, everything
stays in process and :meth:`EngineHook.pool_state` says why. Unkeyed prompts sent to the pool
get its content lookup (a prompt sharing at least half of a stored one continues it).

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
import contextlib
import contextvars
import functools
import hashlib
import inspect
import json
import logging
import os
import sys
import threading
import weakref
from dataclasses import dataclass
from typing import Any, Callable, Hashable, Iterator, NamedTuple

log = logging.getLogger("dtok.integrations")

__all__ = ["SESSION_KEY", "SECTIONS", "PROBES", "EncodeOptions", "EngineHook", "RequestKey", "bound_key",
           "compare_sections", "configure", "encode_options", "patch", "resolve", "run_in_context",
           "session_key"]

class RequestKey(NamedTuple):
    """Where dtok keeps a request's state: ``session`` (``("sid", id)``, ``("rid", prefix)``, or
    None: content lookup) inside ``scope`` (``(cache_salt, model)``, None when neither is
    known). Tuples: no separator a salt or id could contain makes two tenants' keys equal."""

    session: Hashable | None
    scope: Hashable | None


#: The key of the request being served (set where the engine parses the request).
SESSION_KEY: contextvars.ContextVar[RequestKey | None] = contextvars.ContextVar(
    "dtok_session_key", default=None)
#: tokenizer.json sections that decide IDs; a live tokenizer must equal a frozen file in each.
SECTIONS = ("model", "normalizer", "pre_tokenizer", "added_tokens", "post_processor")
#: Texts encoded by the engine's tokenizer and by dtok before dtok may serve the engine.
PROBES = (
    "", "Hello, world!", " leading space",
    "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n",
    "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nx<|eot_id|>",
    "<｜User｜>x<｜Assistant｜>", "<|start|>user<|message|>x<|end|>",
    "数字 12345 καλημέρα 🙂\r\n\t  end   ", "a" * 5000, "don't you'll  \n\n\n  x",
    "cafe\u0301 \u0958/",
)


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


def _bounded(value: str) -> str | tuple[str, str]:
    """A client's string as kept in a key: itself, or past KEY_CHARS its SHA-256 (a 1 MB
    session id must not be held once per session; collisions are out of reach)."""
    if len(value) <= KEY_CHARS:
        return value
    return ("sha256", hashlib.sha256(value.encode("utf-8", "surrogatepass")).hexdigest())


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


def _canonical(document: str) -> dict[str, Any]:
    """A tokenizer.json document as the installed ``tokenizers`` writes it (merges as pairs or
    strings, defaults spelled out), without ``trim_offsets``, which changes offsets only."""
    try:
        from tokenizers import Tokenizer

        document = Tokenizer.from_str(document).to_str()
    except Exception:  # noqa: BLE001 - compare as written; the reference will refuse it anyway
        pass

    def strip(node):
        if isinstance(node, dict):
            return {k: strip(v) for k, v in node.items() if k != "trim_offsets"}
        if isinstance(node, list):
            return [strip(v) for v in node]
        return node

    return strip(json.loads(document))


def compare_sections(live_json: str, file_json: str) -> list[str]:
    """The :data:`SECTIONS` in which two tokenizer.json documents differ (empty: identical),
    compared as the installed ``tokenizers`` serializes them."""
    live, frozen = _canonical(live_json), _canonical(file_json)
    return [s for s in SECTIONS if live.get(s) != frozen.get(s)]


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
    body = ids[pre:len(ids) - suf]
    kept = body[-keep:] if options.side == "left" else body[:keep]
    return ids[:pre] + kept + ids[len(ids) - suf:]


# --- configuration --------------------------------------------------------------------------

_CONFIG: dict[str, Any] = {"workers": None, "min_chars": None, "options": None, "knobs": None}


def configure(*, pool_workers: int | None = None, pool_min_chars: int | None = None,
              pool_options: dict[str, Any] | None = None,
              knobs: dict[str, Any] | None = None) -> None:
    """Configure every hook in this process (overrides ``DTOK_POOL_WORKERS``,
    ``DTOK_POOL_MIN_CHARS`` and ``DTOK_KNOBS``; None: the environment's value).
    ``pool_workers=0`` keeps everything in process; ``pool_options`` go to :class:`dtok.Pool`;
    ``knobs`` to :class:`dtok.Tokenizer` (e.g. ``{"session_bytes": 1 << 30}``) for tokenizers
    built after this call."""
    for name, value in (("workers", pool_workers), ("min_chars", pool_min_chars)):
        if value is not None and (type(value) is not int or value < 0):
            raise ValueError(f"pool_{name} must be a non-negative int, got {value!r}")
    _CONFIG.update(workers=pool_workers, min_chars=pool_min_chars, options=pool_options,
                   knobs=knobs)


def _knobs() -> dict[str, Any]:
    if _CONFIG["knobs"] is not None:
        return dict(_CONFIG["knobs"])
    raw = os.environ.get("DTOK_KNOBS")
    try:
        knobs = json.loads(raw) if raw else {}
        if not isinstance(knobs, dict):
            raise ValueError("not a JSON object")
        return knobs
    except ValueError as exc:
        log.warning("dtok: DTOK_KNOBS=%r ignored: %s", raw, exc)
        return {}


def _env_int(name: str, default: int) -> int:
    try:
        return max(0, int(os.environ.get(name, default)))
    except ValueError:
        log.warning("dtok: %s=%r is not an int; using %d", name, os.environ.get(name), default)
        return default


def _pool_workers() -> int:
    return (_CONFIG["workers"] if _CONFIG["workers"] is not None
            else _env_int("DTOK_POOL_WORKERS", 0))


def _pool_min_chars() -> int:
    return (_CONFIG["min_chars"] if _CONFIG["min_chars"] is not None
            else _env_int("DTOK_POOL_MIN_CHARS", 16384))


# The open-loop testbed's best design (README, Benchmarks): the Pool's own shortest-first order
# and aging, with small chunks. Applied where this Pool version has the parameter.
POOL_DEFAULTS = {"chunks_per_worker": 8, "name": "serving"}


def _new_pool(tok, workers: int):
    import dtok

    accepted = inspect.signature(dtok.Pool).parameters
    options = {k: v for k, v in POOL_DEFAULTS.items() if k in accepted}
    options.update(_CONFIG["options"] or {})
    return dtok.Pool(tok, workers=workers, **options)


class _PoolSlot:
    """One pool for one dtok tokenizer, started in a background thread on first use."""

    def __init__(self, tok, workers: int) -> None:
        self.pool = None
        self.error: str | None = None
        self.ready = threading.Event()
        threading.Thread(target=self._start, args=(tok, workers), name="dtok-pool-start",
                         daemon=True).start()

    def _start(self, tok, workers: int) -> None:
        try:
            self.pool = _new_pool(tok, workers)
            log.info("dtok: pool of %d workers ready", workers)
        except Exception as exc:  # noqa: BLE001 - in process is always exact
            self.error = f"{type(exc).__name__}: {exc}"
            log.warning("dtok: no pool, encoding in process: %s", self.error)
        finally:
            self.ready.set()


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



def _list_of(owner, text: str, key, special: bool) -> list[int]:
    """IDs as a list: the owner's ``encode_list`` when it has one, else ``list()`` of a view."""
    session, scope = _parts(key)
    if hasattr(owner, "encode_list"):
        return owner.encode_list(text, session=session, scope=scope, add_special_tokens=special)
    return list(owner.encode(text, session=session, scope=scope, add_special_tokens=special))


async def _list_of_async(pool, text: str, key, special: bool) -> list[int]:
    session, scope = _parts(key)
    if hasattr(pool, "encode_list_async"):
        return await pool.encode_list_async(text, session=session, scope=scope,
                                            add_special_tokens=special)
    return list(await pool.encode_async(text, session=session, scope=scope,
                                        add_special_tokens=special))


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
        #: False: every hook passes through to the engine's own code (checks, operators)
        self.enabled = True
        if os.environ.get("DTOK_STATS_FILE") and not _HOOKS:
            atexit.register(_write_reports)
        _HOOKS.append(self)

    # --- which tokenizers dtok serves -------------------------------------------------------

    def dtok_for(self, hf_tokenizer, *, wait: bool = True):
        """dtok's wrapper for the engine's tokenizer, or None when dtok must stay out (cached
        per tokenizer object). Building it takes seconds (the probes, the fast encoder); with
        ``wait=False`` (on an event loop) a tokenizer not built yet is built in a background
        thread and None is returned meanwhile: the engine's own code serves those requests."""
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
                    threading.Thread(target=self.dtok_for, args=(hf_tokenizer,),
                                     name="dtok-build", daemon=True).start()
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

    def refusal(self, hf_tokenizer) -> str | None:
        """Why dtok stays out of this tokenizer (after :meth:`dtok_for` refused it), or None."""
        try:
            return self._refused.get(hf_tokenizer)
        except TypeError:
            return "not weak-referenceable"

    def _overridden(self, hf, name: str) -> bool:
        if name in vars(hf):
            return True
        fn = getattr(type(hf), name)
        module = getattr(fn, "__module__", "") or ""
        qualname = getattr(fn, "__qualname__", "") or ""
        return "transformers" not in module and not any(
            f"{module}.{qualname}".startswith(prefix) for prefix in self.trusted_overrides)

    def build(self, hf) -> tuple[Any, str]:
        """(wrapper, "") when dtok reproduces ``hf`` exactly on every probe, else (None, why)."""
        backend = getattr(hf, "backend_tokenizer", None)
        if not getattr(hf, "is_fast", False) or backend is None or not hasattr(backend, "to_str"):
            return None, f"not a tokenizers-backed fast tokenizer ({type(hf).__name__})"
        if getattr(hf, "split_special_tokens", False):
            return None, "split_special_tokens is on"
        for name in ("encode", "__call__"):
            if self._overridden(hf, name):
                return None, f"{type(hf).__name__}.{name} is overridden"
        frozen = os.environ.get(self.frozen_env) or None
        try:
            from dtok.integrations.transformers import wrap

            # built from the frozen file when given (checked equal to the live backend)
            wrapper = wrap(hf, source=frozen, **_knobs())
            for special in (True, False):
                for text in PROBES:
                    want = hf([text], add_special_tokens=special)["input_ids"][0]
                    if list(want) != list(wrapper.dtok.encode(text, add_special_tokens=special)):
                        return None, f"probe {text[:30]!r} encodes differently"
        except Exception as exc:  # noqa: BLE001
            return None, f"{type(exc).__name__}: {exc}"
        return wrapper, ""

    # --- pools ------------------------------------------------------------------------------

    def pool_for(self, tok, *, wait: float | None = None):
        """The started pool for a dtok tokenizer, or None (no pool configured, still starting,
        or failed). ``wait``: seconds to wait for a pool that is starting."""
        workers = _pool_workers()
        if workers < 1:
            return None
        slot = self._pools.get(tok)
        if slot is None:
            with self._lock:
                slot = self._pools.get(tok)
                if slot is None:
                    slot = self._pools[tok] = _PoolSlot(tok, workers)
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
        """The hook's counters, each served tokenizer's session stats, and the pools' stats."""
        tokenizers = []
        for wrapper in list(self._by_tok.values()):
            tok = wrapper.dtok
            tokenizers.append({"path": str(tok.files.path), "encoder": tok.stats()["encoder"],
                               "sessions": tok.sessions.stats()})
        return {"engine": self.engine, "pid": os.getpid(), "stats": dict(self.stats),
                "tokenizers": tokenizers, "pools": self.pool_state()}

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
        if _parts(key)[0] is None and len(text) < _pool_min_chars():
            return None
        return self.pool_for(wrapper.current())

    # --- encoding ---------------------------------------------------------------------------

    def _count(self, key, pooled: bool) -> None:
        self.stats["dtok_calls"] += 1
        self.stats["keyed_calls"] += _parts(key)[0] is not None
        self.stats["pool_calls"] += pooled

    def _finish(self, tok, ids: list[int], options: EncodeOptions) -> list[int] | None:
        out = _truncated(ids, tok, options)
        if out is not ids and out is not None:
            self.stats["truncated"] += 1
        return out

    def encode(self, wrapper, text: str, options: EncodeOptions = EncodeOptions(),
               key: Any = None) -> list[int] | None:
        """The IDs the engine's tokenizer returns for ``text`` with ``options``, through dtok;
        None when dtok cannot reproduce the call. Blocking: a prompt routed to the pool is
        waited for in this thread. Raises what the encode raises."""
        tok, pool = wrapper.current(), self.pool_route(wrapper, text, key)
        return self._encode_with(tok, tok if pool is None else pool, text, options, key)

    def _encode_with(self, tok, owner, text, options, key) -> list[int] | None:
        """Encode with ``owner``: the pool, or ``tok`` itself (in process)."""
        self._count(key, owner is not tok)
        return self._finish(tok, _list_of(owner, text, key, options.add_special_tokens), options)

    async def encode_async(self, wrapper, text: str, options: EncodeOptions = EncodeOptions(),
                           key: Any = None) -> list[int] | None:
        """:meth:`encode` for an event loop: a prompt routed to the pool is awaited, so the
        loop never waits behind it; the rest is encoded here, in the loop's thread."""
        tok, pool = wrapper.current(), self.pool_route(wrapper, text, key)
        if pool is None:  # in process (routed once: a pool ready meanwhile is not waited for)
            return self._encode_with(tok, tok, text, options, key)
        self._count(key, True)
        ids = await _list_of_async(pool, text, key, options.add_special_tokens)
        return self._finish(tok, ids, options)

    def error(self, exc: BaseException) -> None:
        """Count and log a hook error (the engine's own code then tokenizes)."""
        self.stats["errors"] += 1
        log.warning("dtok hook failed, %s tokenizes: %s: %s", self.engine, type(exc).__name__, exc)


# --- patching ---------------------------------------------------------------------------------


def resolve(target: str) -> tuple[Any, str]:
    """(owner, attribute) of a dotted target such as ``pkg.mod.Class.method``; owner None when
    it cannot be imported or has no such attribute."""
    import pkgutil

    owner_name, _, attr = target.rpartition(".")
    try:
        owner = pkgutil.resolve_name(owner_name)
    except (ImportError, AttributeError, ValueError):
        return None, attr
    return (owner, attr) if hasattr(owner, attr) else (None, attr)


def patch(targets, package: str) -> list[str]:
    """Wrap each ``(target, hook)`` so that ``hook(original, *args, **kwargs)`` runs instead of
    the target (an AROUND hook; coroutine functions stay coroutine functions). A module-level
    function is also replaced where modules of ``package`` imported it by name. Idempotent;
    returns the targets patched now."""
    done = []
    for target, hook in targets:
        owner, attr = resolve(target)
        if owner is None:
            continue
        orig = getattr(owner, attr)
        if getattr(orig, "__dtok_hook__", False):
            continue
        if inspect.iscoroutinefunction(orig):
            async def patched(*a, __orig=orig, __hook=hook, **k):
                return await __hook(__orig, *a, **k)
        else:
            def patched(*a, __orig=orig, __hook=hook, **k):
                return __hook(__orig, *a, **k)
        patched = functools.wraps(orig)(patched)
        patched.__dtok_hook__ = True
        setattr(owner, attr, patched)
        if not isinstance(owner, type):  # a module function: also where it was imported to
            for module in list(sys.modules.values()):
                if (getattr(module, "__name__", "").startswith(package)
                        and getattr(module, attr, None) is orig):
                    setattr(module, attr, patched)
        done.append(target)
    return done


def run_in_context(loop: asyncio.AbstractEventLoop, executor, fn: Callable, *args):
    """``loop.run_in_executor`` that carries the caller's context variables (the session key)
    into the executor thread, which ``run_in_executor`` itself does not."""
    return loop.run_in_executor(executor, functools.partial(
        contextvars.copy_context().run, fn, *args))
