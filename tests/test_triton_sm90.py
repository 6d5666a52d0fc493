"""`benchmarks/triton_sm90.py`: every Triton kernel of the project compiles for an H100 (sm_90)
with the argument types and constexprs its launches use, checked without a GPU (Triton compiles
ahead of time for a target, through its bundled ptxas). The CPU tests run the kernels in Triton's
interpreter, which accepts what a GPU compile refuses: this is the check that does not.

No ``from __future__ import annotations`` here: Triton reads the toy kernels' ``tl.constexpr``
annotations as objects."""
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

triton = pytest.importorskip("triton", reason="the sm_90 compile check needs the optional package triton")
import triton.language as tl  # noqa: E402

from benchmarks import triton_sm90  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
WHY_NOT = triton_sm90.ptxas_missing()
needs_ptxas = pytest.mark.skipif(WHY_NOT is not None, reason=f"no cubin can be built here: {WHY_NOT}")


def _cas_kernel(keys, new_keys, n, BLOCK: tl.constexpr):
    """A compare-and-swap of each key by a key of `new_keys` (the shape of the hash table's claim)."""
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    cur = tl.load(keys + i, mask=i < n, other=-1)
    tl.atomic_cas(keys + i, cur, tl.load(new_keys + i, mask=i < n, other=0))


def _launch(dtypes: tuple[str, str], n: int = 100) -> triton_sm90.Launch:
    args = {"keys": ["tensor", dtypes[0], 0], "new_keys": ["tensor", dtypes[1], 0], "n": ["int", n],
            "BLOCK": ["int", 128]}
    return triton_sm90.Launch("toy:_cas_kernel", args, {}, "")


_TOY_COMPILE = """
import json
from triton.runtime.jit import JITFunction
from benchmarks import triton_sm90
from tests.test_triton_sm90 import _cas_kernel, _launch
binder, fn = triton_sm90._Binder(90), JITFunction(_cas_kernel)
out = [triton_sm90.compile_one(binder, fn, _launch(d)) for d in (("int64", "int32"), ("int64", "int64"))]
print(json.dumps([[c.ok, c.cubin_bytes, c.error] for c in out]))
"""


@pytest.mark.e2e
@needs_ptxas
def test_the_compile_refuses_an_atomic_of_mixed_types_that_the_interpreter_runs(tmp_path):
    """int32 keys swapped into an int64 table: Triton's interpreter runs it with no error (and writes
    words that are not the keys), the sm_90 compile refuses it with MLIR's reason and the kernel's
    line; the same kernel on one dtype gives a cubin. The compile runs in a process of its own: the
    interpreter, once it ran in a process (the kernels' CPU tests), leaves ``triton.language``
    patched for itself."""
    from triton.runtime.interpreter import InterpretedFunction

    keys = torch.full((4,), -1, dtype=torch.int64)
    InterpretedFunction(_cas_kernel)[(1,)](keys, torch.arange(4, dtype=torch.int32), 4, BLOCK=128)
    assert keys.tolist() != [0, 1, 2, 3]  # silently wrong: no error to see on a CPU

    env = {**os.environ, "TRITON_CACHE_DIR": str(tmp_path), "TRITON_DEFAULT_FP_FUSION": "1"}
    env.pop("TRITON_INTERPRET", None)
    run = subprocess.run([sys.executable, "-c", _TOY_COMPILE], cwd=REPO, env=env, capture_output=True, text=True,
                         timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    (bad_ok, bad_bytes, bad_error), (good_ok, good_bytes, good_error) = json.loads(run.stdout.splitlines()[-1])
    assert not bad_ok and bad_bytes == 0
    assert "'tt.atomic_cas' op failed to verify that ptr type matches value type" in bad_error, bad_error
    assert "tl.atomic_cas(keys + i, cur" in bad_error
    assert good_ok and good_bytes > 0, good_error


def test_a_launch_is_specialised_as_a_gpu_launch_would_be():
    """Triton's own binder for the CUDA target: pointer dtypes and 16-byte alignment, ints by range,
    ``== 1`` made a constexpr, divisibility by 16, floats as fp32, launch options apart."""
    from triton.runtime.jit import JITFunction

    recorder = triton_sm90._Recorder(90)
    fn = JITFunction(_cas_kernel).fn
    recorder.note(fn, (torch.zeros(32, dtype=torch.int64), torch.zeros(32, dtype=torch.int32)[1:], 48), {"BLOCK": 128})
    recorder.note(fn, (torch.zeros(32, dtype=torch.int64), torch.zeros(32, dtype=torch.int32), 1),
                  {"BLOCK": 64, "num_warps": 8})
    recorder.note(fn, (torch.zeros(32, dtype=torch.int64), torch.zeros(32, dtype=torch.int32)[1:], 2 ** 40 + 1),
                  {"BLOCK": 128})
    recorder.note(fn, (torch.zeros(32, dtype=torch.int64), torch.zeros(32, dtype=torch.int32)[1:], 32),
                  {"BLOCK": 128})  # the first launch's specialisation again
    specs = [(x.specialization, x.options, x.count) for x in recorder.launches.values()]
    assert specs == [
        ("keys=*i64[D], new_keys=*i32, n=i32[D], BLOCK=constexpr=128", {}, 2),
        ("keys=*i64[D], new_keys=*i32[D], n=constexpr=1, BLOCK=constexpr=64", {"num_warps": 8}, 1),
        ("keys=*i64[D], new_keys=*i32, n=i64, BLOCK=constexpr=128", {}, 1),
    ], specs


def test_a_launch_keeps_the_kernels_do_not_specialize():
    """An int argument named in the kernel's ``do_not_specialize`` stays an int when it is 1 (no
    one-off compile on a GPU): the claim rounds' round index."""
    from triton.runtime.jit import JITFunction

    recorder = triton_sm90._Recorder(90)
    fn = JITFunction(_cas_kernel).fn
    args = (torch.zeros(32, dtype=torch.int64), torch.zeros(32, dtype=torch.int32), 1)
    recorder.note(fn, args, {"BLOCK": 128}, {"do_not_specialize": ["n"]})
    recorder.note(fn, args[:2] + (2,), {"BLOCK": 128}, {"do_not_specialize": ["n"]})
    specs = [(x.specialization, x.count) for x in recorder.launches.values()]
    assert specs == [("keys=*i64[D], new_keys=*i32[D], n=i32, BLOCK=constexpr=128", 2)], specs


def test_the_check_knows_every_module_with_triton_kernels():
    """A new file of kernels joins `MODULES` (and its kernels `KERNELS`, which the e2e test checks)."""
    files = {p.relative_to(REPO) for p in (REPO / "recstream").rglob("*.py") if "triton.jit" in p.read_text()}
    assert files == {Path(*m.split(".")).with_suffix(".py") for m in triton_sm90.MODULES}


@pytest.mark.e2e  # a subprocess (the interpreter records the launches) and ~130 compiles: about a minute
@needs_ptxas
def test_every_kernel_of_the_project_compiles_for_sm90_as_its_launches_specialise_it(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}  # the compile must not interpret
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH", "")) if p)
    start = time.perf_counter()
    run = subprocess.run([sys.executable, "-m", "benchmarks.triton_sm90", "--json", str(tmp_path / "out.json")],
                         cwd=REPO, env=env, capture_output=True, text=True, timeout=900)
    seconds = time.perf_counter() - start
    assert run.returncode == 0, run.stdout[-8000:] + run.stderr[-4000:]
    out = json.loads((tmp_path / "out.json").read_text())
    results = out["results"]
    assert all(r["ok"] and r["cubin_bytes"] > 0 for r in results)
    assert {r["kernel"] for r in results} == triton_sm90.KERNELS and not out["never_launched"]
    # the launch sites' variants, not one signature a kernel: the claim rounds' first and last, int32 and
    # int64 keys, the initial rows' three modes, the optimizers' dense / found_inf / capturable kernels
    spec = [r["specialization"] for r in results]
    assert any("FIRST=constexpr=True" in s for s in spec) and any("LAST=constexpr=True" in s for s in spec)
    assert any("tkeys=*i32" in s for s in spec) and any("tkeys=*i64" in s for s in spec)
    assert {s.split("INIT=constexpr=")[1] for s in spec if "INIT=" in s} == {"0", "1", "2"}
    assert any("CAPTURABLE=constexpr=True" in s and "HAS_FOUND=constexpr=True" in s for s in spec)
    assert any("_carry_out_fn" in r["kernel"] and "PBLOCK=constexpr=128" in r["specialization"] for r in results)
    flags = {}  # every kernel's bool constexprs, both ways (ROWS=False: pending keys dropped over budget)
    for r in results:
        for name, value in re.findall(r"(\w+)=constexpr=(True|False)", r["specialization"]):
            flags.setdefault((r["kernel"], name), set()).add(value)
    assert ("recstream.nn.hash_triton:_evict_chosen_fn", "ROWS") in flags
    assert all(values == {"True", "False"} for values in flags.values()), flags
    print(f"\n{run.stdout.splitlines()[-1]} -- {seconds:.0f}s in all")
