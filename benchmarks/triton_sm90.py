"""Every Triton kernel of recstream compiled for an H100 (sm_90) on a machine without a GPU:
``python -m benchmarks.triton_sm90 [--json OUT] [--arch 90]``.

Triton's interpreter (``TRITON_INTERPRET=1``, how the CPU tests run the kernels) executes a
kernel's Python, so it accepts what a GPU compile refuses (atomics of mismatched types, scans and
loops the lowering does not take, constexpr misuse). This tool checks the compile itself:

1. *record* (a subprocess with ``TRITON_INTERPRET=1``): the device path's real launch sites run on
   CPU tensors -- `HashEmbedding` tables on the Triton backend (admission, LRU passes, pending
   drops, age eviction, rebuilds, eval reads; int64 and int32 keys; every ``param_init``; a lookup
   of 16,384 keys), dynamic WideDeep and DeepFM steps through `Model`, and the fused row updates of
   LazyAdam, RowWiseAdagrad, FTRL, Adam (row-sparse and `FusedTables`), plain and capturable with
   ``found_inf``, sparse and dense gradients of several widths -- and every launch is specialised
   as a GPU launch would be: Triton's own binder (``triton.runtime.jit.create_function_from_signature``, what
   ``JITFunction.run`` calls) for the CUDA backend of the target, on each argument (a tensor's dtype
   and its pointer's 16-byte alignment, an int's range, ``== 1`` and divisibility by 16, floats,
   bools, constexprs) and launch options (``num_warps``). Distinct specialisations are kept;
2. *compile* (this process, without the interpreter): each one goes through ``JITFunction._pack_args``
   and ``triton.compile`` for ``GPUTarget("cuda", arch, 32)``, ptxas included, into a fresh cache
   directory (nothing reused from an earlier run), and must give a cubin.

It exits 1 when a kernel fails to compile or a kernel of the project was never launched by the
recorded steps (``KERNELS``, kept equal to the ``triton.jit`` kernels in the package), printing
the errors. ``tests/test_triton_sm90.py`` runs it. Needs ``triton`` (its bundled ``ptxas``), no GPU.

Another Triton's compiler (the GPU machine's: torch 2.11 pins 3.6.0) checks the launches this one
recorded: ``TRITON_INTERPRET=1 python -m benchmarks.triton_sm90 --record-only launches.json``, then
``PYTHONPATH=DIR:. python -m benchmarks.triton_sm90 --launches launches.json`` with that Triton in
DIR (``pip install --no-deps --target DIR triton==3.6.0``).
"""
from __future__ import annotations

import argparse
import contextlib
import inspect
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

KERNELS = frozenset({
    "recstream.nn.hash_triton:_probe_fn", "recstream.nn.hash_triton:_round_fn",
    "recstream.nn.hash_triton:_carry_out_fn", "recstream.nn.hash_triton:_evict_stale_fn",
    "recstream.nn.hash_triton:_mark_fn", "recstream.nn.hash_triton:_evict_chosen_fn",
    "recstream.nn.hash_triton:_reinsert_fn", "recstream.nn.hash_triton:_gather_fn",
    "recstream.nn.hash_triton_unique:_starts_fn", "recstream.nn.hash_triton_unique:_runs_fn",
    "recstream.optim._triton_row_kernels:lazy_adam", "recstream.optim._triton_row_kernels:rowwise_adagrad",
    "recstream.optim._triton_row_kernels:ftrl",
})
"""The kernels (``module:function``) the project launches; every one must be recorded and compiled."""
HELPERS = frozenset({"recstream.nn.hash_triton:_start_fn", "recstream.nn.hash_triton:_claim_fn",
                     "recstream.optim._triton_row_kernels:_run_sum", "recstream.optim._triton_row_kernels:_lr",
                     "recstream.optim._triton_row_kernels:_power"})
"""The project's Triton device functions: compiled inside the kernels that call them."""


@dataclass
class Launch:
    """One distinct GPU specialisation of a kernel, as recorded: enough to rebuild its arguments."""

    kernel: str  # module:qualname
    args: dict  # parameter name -> ["tensor", dtype, pointer % 16] | ["int"|"float"|"bool", value] | ["none"]
    options: dict  # launch options (num_warps, ...)
    specialization: str  # the binder's result, for the report
    count: int = 1  # launches recorded with it


@dataclass
class Compiled:
    kernel: str
    specialization: str
    options: dict
    ok: bool
    seconds: float
    error: str = ""
    cubin_bytes: int = 0


# ---------------------------------------------------------------------------------------------- binder
class _Pointer:
    """A tensor as Triton's binder sees it: its dtype and where its data starts (only the alignment counts)."""

    def __init__(self, dtype, ptr: int):
        self.dtype, self._ptr = dtype, ptr

    def data_ptr(self) -> int:
        return self._ptr


def _describe(value) -> list:
    import torch

    if isinstance(value, torch.Tensor):
        return ["tensor", str(value.dtype).removeprefix("torch."), value.data_ptr() % 16]
    if value is None:
        return ["none"]
    for kind in (bool, int, float):  # bool before int
        if isinstance(value, kind):
            return [kind.__name__, value]
    raise TypeError(f"triton_sm90: a launch argument of type {type(value).__name__} ({value!r}) is not recorded")


def _rebuild(desc: list):
    import torch

    if desc[0] == "tensor":
        return _Pointer(getattr(torch, desc[1]), desc[2])
    return None if desc[0] == "none" else desc[1]


def _target(arch: int):
    from triton.backends.compiler import GPUTarget

    return GPUTarget("cuda", arch, 32)


class _Binder:
    """``JITFunction.run``'s first half for one target, without a device: the kwargs it adds, the
    binder's specialisation, `_pack_args`."""

    def __init__(self, arch: int):
        from triton.compiler import make_backend

        self.target = _target(arch)
        self.backend = make_backend(self.target)
        self._binders: dict = {}

    def _kwargs(self, fn, meta: dict) -> dict:
        from triton import knobs

        kwargs = dict(meta)
        kwargs["debug"] = kwargs.get("debug", fn.debug) or knobs.runtime.debug
        for name in ("instrumentation_mode", "fpsan_homomorphic_casts"):  # what run() adds in Triton 3.9
            if hasattr(knobs.compilation, name):
                kwargs[name] = getattr(knobs.compilation, name)
        return kwargs

    def specialize(self, fn, args: dict, options: dict):
        """``(bound args, specialization, binder options, kwargs)`` of `fn` (a JITFunction) called with `args`."""
        from triton.runtime.jit import create_function_from_signature

        binder = self._binders.get(id(fn))  # by identity: a JITFunction's hash parses its source
        if binder is None:
            binder = self._binders[id(fn)] = create_function_from_signature(fn.signature, fn.params, self.backend)
        kwargs = self._kwargs(fn, options)
        bound, specialization, binder_options = binder(**args, **kwargs)
        return bound, specialization, binder_options, kwargs

    def compile(self, fn, args: dict, options: dict):
        import triton

        bound, specialization, binder_options, kwargs = self.specialize(fn, args, options)
        opts, signature, constexprs, attrs = fn._pack_args(self.backend, kwargs, bound, specialization, binder_options)
        src = fn.ASTSource(fn, signature, constexprs, attrs) if hasattr(fn, "ASTSource") else \
            triton.compiler.ASTSource(fn, signature, constexprs, attrs)
        return triton.compile(src, target=self.target, options=opts.__dict__)


# --------------------------------------------------------------------------------------------- record
_JIT_KWARGS = ("do_not_specialize", "do_not_specialize_on_alignment")
"""The ``triton.jit`` arguments that change how a launch specialises (the interpreter keeps them)."""


class _Recorder:
    """Patches the interpreter's launch to note each launch's GPU specialisation (then runs it)."""

    def __init__(self, arch: int):
        self.binder = _Binder(arch)
        self.launches: dict[tuple, Launch] = {}
        self._jit: dict = {}

    def _jit_of(self, fn, jit_kwargs: dict):
        from triton.runtime.jit import JITFunction

        jit = self._jit.get(fn)
        if jit is None:  # the JITFunction a GPU process would launch (its params, its binder); its
            # ``triton.jit`` arguments (``do_not_specialize``...) as the kernel's decorator gave them
            jit = self._jit[fn] = JITFunction(fn, **{k: v for k, v in jit_kwargs.items() if k in _JIT_KWARGS})
        return jit

    def note(self, fn, args: tuple, kwargs: dict, jit_kwargs: dict | None = None) -> None:
        names = list(inspect.signature(fn).parameters)
        bound = dict(zip(names, args, strict=False))
        options = {k: v for k, v in kwargs.items() if k not in names}
        bound.update({k: v for k, v in kwargs.items() if k in names})
        described = {k: _describe(v) for k, v in bound.items()}
        jit = self._jit_of(fn, jit_kwargs or {})
        _, specialization, _, _ = self.binder.specialize(jit, {k: _rebuild(d) for k, d in described.items()}, options)
        spec = ", ".join(f"{n}={t}" + (f"[{a}]" if a not in ("", None) and t != "constexpr" else "")
                         + (f"={a}" if t == "constexpr" else "") for n, (t, a) in zip(names, specialization,
                                                                                      strict=True))
        name = f"{fn.__module__}:{fn.__qualname__}"
        key = (name, spec, json.dumps(options, sort_keys=True))
        if key in self.launches:
            self.launches[key].count += 1
        else:
            self.launches[key] = Launch(name, described, options, spec)

    @contextlib.contextmanager
    def installed(self):
        from triton.runtime.interpreter import InterpretedFunction

        original = InterpretedFunction.run
        recorder = self

        def run(self, *args, grid, warmup, **kwargs):
            recorder.note(self.fn, args, kwargs, self.kwargs)
            return original(self, *args, grid=grid, warmup=warmup, **kwargs)

        InterpretedFunction.run = run
        try:
            yield self
        finally:
            InterpretedFunction.run = original


def record(arch: int = 90) -> list[Launch]:
    """Run the device path's launch sites in the interpreter (``TRITON_INTERPRET=1`` must be set
    before triton is first imported) and return their distinct GPU specialisations."""
    if os.environ.get("TRITON_INTERPRET") != "1":
        raise RuntimeError("triton_sm90.record: set TRITON_INTERPRET=1 before triton is imported")
    from benchmarks import triton_sm90_steps

    recorder = _Recorder(arch)
    with recorder.installed():
        triton_sm90_steps.run_all()
    return list(recorder.launches.values())


# -------------------------------------------------------------------------------------------- compile
MODULES = ("recstream.nn.hash_triton", "recstream.nn.hash_triton_unique", "recstream.optim._triton_row_kernels")
"""The project's modules with Triton functions (tests/test_triton_sm90.py keeps it equal to the files
that call ``triton.jit``)."""


def _jit_functions() -> dict:
    """``module:qualname`` -> the JITFunctions of `MODULES`: their globals (a kernel decorated at
    import, a device function `hash_triton` sets) and what their factories build."""
    import importlib

    from triton.runtime.jit import JITFunction

    found = []
    for name in MODULES:
        module = importlib.import_module(name)
        for factory in ("_kernels", "kernels"):  # built on first use (triton is optional there)
            if callable(getattr(module, factory, None)):
                built = getattr(module, factory)()
                found.extend(x for group in built for x in (group if isinstance(group, tuple) else (group,)))
        found.extend(vars(module).values())
    return {f"{f.fn.__module__}:{f.fn.__qualname__}": f for f in found if isinstance(f, JITFunction)}


@contextlib.contextmanager
def _output_captured() -> Iterator[list[str]]:
    """Collect what is written to file descriptors 1 and 2 inside the block: MLIR's diagnostics (the
    line and the reason of a compile error, which the exception only summarises) and the module it
    dumps after one, which is no use printed whole."""
    sys.stdout.flush()
    sys.stderr.flush()
    saved, lines = [os.dup(1), os.dup(2)], []
    with tempfile.TemporaryFile() as f:
        os.dup2(f.fileno(), 1)
        os.dup2(f.fileno(), 2)
        try:
            yield lines
        finally:
            for fd, copy in zip((1, 2), saved, strict=True):
                os.dup2(copy, fd)
                os.close(copy)
            f.seek(0)
            lines.extend(f.read().decode(errors="replace").splitlines())


def _diagnostics(lines: list[str]) -> str:
    """The error lines of MLIR's output, each with the source line and caret after it."""
    keep = [i + d for i, line in enumerate(lines) if "error:" in line for d in range(3)]
    return "\n".join(lines[i] for i in sorted(set(keep)) if i < len(lines))


def compile_one(binder: _Binder, fn, launch: Launch) -> Compiled:
    """Compile one recorded specialisation of `fn` (a JITFunction): a cubin, or the error."""
    start, cubin, error = time.perf_counter(), b"", ""
    try:
        with _output_captured() as diagnostics:
            kernel = binder.compile(fn, {k: _rebuild(d) for k, d in launch.args.items()}, launch.options)
        cubin = kernel.asm.get("cubin", b"")
        error = "" if cubin else "no cubin produced"
    except Exception as e:  # noqa: BLE001 -- every failure is reported, the others still compile
        error = "\n".join(x for x in (f"{type(e).__name__}: {e}".strip(), _diagnostics(diagnostics)) if x)
    return Compiled(launch.kernel, launch.specialization, launch.options, not error, time.perf_counter() - start,
                    error, len(cubin))


def compile_all(launches: list[Launch], arch: int = 90) -> list[Compiled]:
    """Compile each recorded specialisation for ``cuda:arch`` (no interpreter: `TRITON_INTERPRET` unset)."""
    if os.environ.get("TRITON_INTERPRET") == "1":
        raise RuntimeError("triton_sm90.compile_all: TRITON_INTERPRET=1 makes kernels interpreted; unset it")
    functions, binder = _jit_functions(), _Binder(arch)
    unknown = sorted(set(functions) - KERNELS - HELPERS)
    if unknown:
        raise RuntimeError(f"triton_sm90: Triton functions of the project neither in KERNELS nor in HELPERS: "
                           f"{unknown} (add each to the one it is, and record its launches)")
    return [compile_one(binder, functions[launch.kernel], launch) for launch in launches]


def ptxas_missing(arch: int = 90) -> str | None:
    """Why this machine cannot compile to a cubin (None: it can)."""
    try:
        from triton.backends.nvidia.compiler import get_ptxas

        path = get_ptxas(arch).path
    except Exception as e:  # noqa: BLE001
        return f"triton's ptxas is unavailable ({type(e).__name__}: {e})"
    return None if path and os.access(path, os.X_OK) else f"ptxas not executable: {path}"


# ----------------------------------------------------------------------------------------------- main
def _record_in_subprocess(arch: int) -> tuple[list[Launch], float]:
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": os.pathsep.join(
        p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p)}
    start = time.perf_counter()
    with tempfile.NamedTemporaryFile(suffix=".json") as f:
        subprocess.run([sys.executable, "-m", "benchmarks.triton_sm90", "--record-only", f.name, "--arch", str(arch)],
                       cwd=REPO, env=env, check=True)
        data = json.loads(Path(f.name).read_text())
    return [Launch(**d) for d in data], time.perf_counter() - start


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--arch", type=int, default=90, help="CUDA compute capability x 10 (default 90: H100)")
    parser.add_argument("--json", help="write the launches compiled and their results here")
    parser.add_argument("--record-only", metavar="OUT", help="only record the launches into OUT (with "
                        "TRITON_INTERPRET=1 set; what the recording subprocess runs)")
    parser.add_argument("--launches", metavar="FILE", help="compile the launches of an earlier --record-only run "
                        "instead of recording (e.g. with another Triton on PYTHONPATH than the one that recorded)")
    args = parser.parse_args(argv)
    if args.record_only:
        Path(args.record_only).write_text(json.dumps([asdict(x) for x in record(args.arch)]))
        return 0
    if os.environ.get("TRITON_INTERPRET") == "1":
        parser.error("run without TRITON_INTERPRET=1 (the recording subprocess sets it itself)")
    os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "1")
    with tempfile.TemporaryDirectory() as cache:
        os.environ["TRITON_CACHE_DIR"] = cache  # a fresh cache: every kernel compiled now, none reused
        why = ptxas_missing(args.arch)
        if why:
            print(f"triton_sm90: cannot compile here: {why}")
            return 2
        if args.launches:
            launches, record_s = [Launch(**d) for d in json.loads(Path(args.launches).read_text())], 0.0
        else:
            launches, record_s = _record_in_subprocess(args.arch)
        start = time.perf_counter()
        results = compile_all(launches, args.arch)
        compile_s = time.perf_counter() - start
    missing = sorted(KERNELS - {r.kernel for r in results})
    failed = [r for r in results if not r.ok]
    for r in results:
        short = r.kernel.split(":")[1]
        print(f"{'ok  ' if r.ok else 'FAIL'} {short:18s} {r.seconds:5.2f}s {r.specialization} {r.options or ''}")
    for r in failed:
        print(f"\n--- {r.kernel} ({r.specialization}):\n{r.error}")
    print(f"\ntriton_sm90: {len(results) - len(failed)}/{len(results)} specialisations of "
          f"{len({r.kernel for r in results})} kernels compiled for sm_{args.arch} "
          f"(recorded in {record_s:.1f}s, compiled in {compile_s:.1f}s)"
          + (f"; never launched: {', '.join(missing)}" if missing else ""))
    if args.json:
        Path(args.json).write_text(json.dumps({"arch": args.arch, "record_s": record_s, "compile_s": compile_s,
                                               "never_launched": missing,
                                               "results": [asdict(r) for r in results]}, indent=1))
    return 1 if failed or missing else 0


if __name__ == "__main__":
    sys.exit(main())
