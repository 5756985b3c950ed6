"""A speed-up of Beam's local streaming runner (``BundleBasedDirectRunner``) for the streaming job.

The runner asks :func:`apache_beam.transforms.userstate.get_dofn_specs` for a DoFn's state and timer
specifications at the start of every bundle (``_ParDoEvaluator.start_bundle``, and
``TransformEvaluatorRegistry.should_execute_serially`` for every ParDo it schedules). The function
inspects the signature of every method of the DoFn (``inspect.signature`` over ``dir(dofn)``, some
30 methods), which cost a third of the streaming job's time on this machine (py-spy, 1 M impressions
as 100 watched files, 2026-11-26, Beam 2.77). The answer depends on the DoFn's class only (the
specifications are the default values of its methods' parameters), so :func:`install` memoises it
per class. Beam's own code is unchanged otherwise; a Beam version without the function skips the
patch (``tests/test_stream_columnar.py`` fails loudly if it moved, so an upgrade is noticed).

Two more per-bundle costs of the same runner are memoised the same way (issue 21: a session-window
job of 10,000 impressions spent 28 % of its time pickling, 12 % in ``inspect.signature``; py-spy,
2026-11-26): the runner pickles each DoFn and unpickles the copy at the start of every bundle
(``pickler.roundtrip``, so that every bundle gets a fresh instance): the pickled bytes of a DoFn
object are now kept and only unpickled per bundle (a fresh instance still); and
``core.get_function_arguments`` (a DoFn method's arguments and defaults, read by ``DoFnRunner``
for every bundle) is kept per (DoFn class, method) for methods defined on the class.
"""

from __future__ import annotations

import threading

_LOCK = threading.Lock()
_TIMER = threading.local()  # .watermark: the input watermark (micros) of the timer being processed


def install() -> bool:
    """Memoise ``get_dofn_specs`` per DoFn class in this process (idempotent). Returns whether the
    patch is in place."""
    try:
        from apache_beam.runners.direct import transform_evaluator
        from apache_beam.transforms import userstate
    except ImportError:  # pragma: no cover (a Beam without the local runner)
        return False
    original = getattr(userstate, "get_dofn_specs", None)
    if original is None:  # pragma: no cover (moved in another Beam version)
        return False
    if getattr(original, "_streameval_memoised", False):
        return True
    cache: dict = {}

    def get_dofn_specs(dofn):
        key = type(dofn)
        with _LOCK:
            found = cache.get(key)
        if found is None:
            found = original(dofn)
            with _LOCK:
                cache[key] = found
        states, timers = found
        return set(states), set(timers)  # callers get their own sets, as from the original

    get_dofn_specs._streameval_memoised = True
    get_dofn_specs.__wrapped__ = original
    userstate.get_dofn_specs = get_dofn_specs  # also is_stateful_dofn's (a module global)
    if hasattr(transform_evaluator, "get_dofn_specs"):
        transform_evaluator.get_dofn_specs = get_dofn_specs
    _memoise_roundtrip(transform_evaluator)
    _memoise_function_arguments()
    _memoise_function_args()
    _expose_timer_watermark(transform_evaluator)
    return True


class _MemoisedPickler:
    """Stands for the ``pickler`` module in the local runner's evaluators: ``roundtrip(obj)``
    unpickles the bytes pickled the first time ``obj`` (the same object) was seen; everything else
    is the module's."""

    def __init__(self, module):
        self._module = module
        self._bytes: dict = {}  # id(obj) -> (obj, pickled bytes); obj kept so that its id stays its own

    def __getattr__(self, name):
        return getattr(self._module, name)

    def roundtrip(self, obj):
        key = id(obj)
        with _LOCK:
            found = self._bytes.get(key)
        # the pickle library's own uncompressed pair when it has one (the module's dumps compresses
        # with bz2, whose decompression then costs as much as the unpickling)
        lib = getattr(self._module, "desired_pickle_lib", None)
        dumps, loads = ((lib._dumps, lib._loads) if hasattr(lib, "_dumps") and hasattr(lib, "_loads")
                        else (self._module.dumps, self._module.loads))
        if found is None or found[0] is not obj:
            found = (obj, dumps(obj))
            with _LOCK:
                self._bytes[key] = found
        return loads(found[1])


def _memoise_roundtrip(transform_evaluator) -> None:
    current = getattr(transform_evaluator, "pickler", None)
    if current is None or isinstance(current, _MemoisedPickler) or not hasattr(current, "roundtrip"):
        return
    transform_evaluator.pickler = _MemoisedPickler(current)


def _memoise_function_arguments() -> None:
    from apache_beam.transforms import core

    original = getattr(core, "get_function_arguments", None)
    if original is None or getattr(original, "_streameval_memoised", False):
        return
    cache: dict = {}

    def get_function_arguments(obj, func):
        cls = type(obj)
        # memoised only for a method defined on the class: not an instance's own callable nor an
        # _inspect_<func> hook (beam.Map's wrapper answers for the function it wraps)
        if hasattr(obj, f"_inspect_{func}") or func in getattr(obj, "__dict__", {}):
            return original(obj, func)
        return _args_lists(cache, (cls, func), lambda: original(obj, func))

    get_function_arguments._streameval_memoised = True
    get_function_arguments.__wrapped__ = original
    core.get_function_arguments = get_function_arguments


def _args_lists(cache: dict, key, compute):
    """``(args, defaults)`` of ``cache[key]`` (``compute()`` the first time), as new lists: callers
    may change what they get."""
    with _LOCK:
        found = cache.get(key)
    if found is None:
        found = compute()
        with _LOCK:
            cache[key] = found
    args, defaults = found
    return list(args), list(defaults)


def _memoise_function_args() -> None:
    """Memoise ``apache_beam.transforms.core.get_function_args_defaults`` for plain functions and
    bound methods (keyed by the function object: its signature cannot change); the runner calls it
    for every DoFn method at the start of every bundle (``DoFnSignature``; 3 % of a 10 M watch
    profile). Other callables go to Beam's function. Callers get their own lists."""
    import types

    from apache_beam.transforms import core

    original = getattr(core, "get_function_args_defaults", None)
    if original is None or getattr(original, "_streameval_memoised", False):  # pragma: no cover
        return
    cache: dict = {}

    def get_function_args_defaults(f):
        if isinstance(f, types.MethodType) and isinstance(f.__func__, types.FunctionType):
            key = ("method", f.__func__)
        elif isinstance(f, types.FunctionType):
            key = ("function", f)
        else:
            return original(f)
        return _args_lists(cache, key, lambda: original(f))

    get_function_args_defaults._streameval_memoised = True
    get_function_args_defaults.__wrapped__ = original
    core.get_function_args_defaults = get_function_args_defaults  # get_function_arguments' global


def timer_watermark() -> int | None:
    """While the local runner processes a timer of a stateful DoFn (after :func:`install`): the input
    watermark (micros) of the DoFn's transform at the firing, read by Beam's watermark manager (every
    element behind it has been processed by the transform); None elsewhere (other runners, outside
    a timer callback). A timer callback may then do at once the work of its later timers due by this
    watermark, instead of one runner round (a bundle, a state read and write) per timer (issue 21)."""
    return getattr(_TIMER, "watermark", None)


def _expose_timer_watermark(transform_evaluator) -> None:
    cls = getattr(transform_evaluator, "_ParDoEvaluator", None)
    original = getattr(cls, "process_timer", None)
    if original is None or getattr(original, "_streameval_watermark", False):  # pragma: no cover
        return

    def process_timer(self, timer_firing):
        try:
            wm = self._evaluation_context._watermark_manager.get_watermarks(self._applied_ptransform).input_watermark
            _TIMER.watermark = wm.micros
        except AttributeError:  # pragma: no cover (another Beam version)
            _TIMER.watermark = None
        try:
            return original(self, timer_firing)
        finally:
            _TIMER.watermark = None

    process_timer._streameval_watermark = True
    process_timer.__wrapped__ = original
    cls.process_timer = process_timer
