"""flashcp.plan's bounds, stop and argument types, and the native module's
refusals (issue 31 items 6 and 8): each case reproduced the defect."""
import os
import subprocess
import sys
import textwrap

import pytest

import flashcp
from flashcp._native import native

# A request a default planner refuses at once (RESOURCE_EXHAUSTED naming the
# bound); before, flashcp.plan took core's absolute limits and planned it.
BIG = dict(doc_lens=[64] * 70000, cp_size=8)
# Many documents at many ranks: seconds to plan (shards x ranks within a
# raised --max_shard_ranks).
SLOW = dict(doc_lens=[257] * 65000, cp_size=1024, strategy="flashcp")
SLOW_BOUNDS = dict(max_shard_ranks=1 << 40, max_response_bytes=1 << 30)


def test_plan_has_the_services_bounds_by_default_and_explicit_arguments_override_them():
    assert native().service_bounds() == {
        "max_docs": 65536, "max_tokens": 1 << 24, "max_cp_size": 1024,
        "max_shard_ranks": 1 << 30, "max_response_bytes": 64 << 20}
    with pytest.raises(flashcp.PlanError) as e:
        flashcp.plan(**BIG)
    assert e.value.code == "RESOURCE_EXHAUSTED"
    assert str(e.value).startswith("RESOURCE_EXHAUSTED: doc_lens: 70000 documents")
    assert flashcp.plan(**BIG, max_docs=70000).cp_size == 8
    with pytest.raises(flashcp.PlanError) as e:
        flashcp.plan([100, 200], 2, max_response_bytes=10)
    assert e.value.code == "RESOURCE_EXHAUSTED"
    assert "--max_response_bytes" in str(e.value)


def test_timeout_raises_timeout_error():
    with pytest.raises(TimeoutError, match=r"flashcp.plan: no plan within the timeout of 0.2 s"):
        flashcp.plan(**SLOW, **SLOW_BOUNDS, timeout=0.2)
    with pytest.raises(ValueError, match="timeout: must be finite and > 0 seconds, got 0"):
        flashcp.plan([5], 1, timeout=0)


def test_ctrl_c_interrupts_planning_promptly():
    script = textwrap.dedent(f"""
        import os, signal, threading, time
        import flashcp
        # Python keeps SIGINT ignored where its parent ignored it (a shell's
        # background job, as CI may run the suite); a user's Ctrl-C has the
        # default handler.
        signal.signal(signal.SIGINT, signal.default_int_handler)
        # Load the native module first (a CUDA build imports torch there, a
        # second or two): the signal must land in planning, not in an import.
        from flashcp._native import native
        native()
        threading.Timer(0.5, os.kill, (os.getpid(), signal.SIGINT)).start()
        t = time.monotonic()
        try:
            flashcp.plan([257] * 65000, 1024, "flashcp", **{SLOW_BOUNDS!r})
            print("PLANNED", time.monotonic() - t)
        except KeyboardInterrupt:
            print("INTERRUPTED", time.monotonic() - t)
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr
    word, seconds = out.stdout.split()
    assert word == "INTERRUPTED", out.stdout
    assert float(seconds) < 3.0, out.stdout


@pytest.mark.parametrize("kwargs, message", [
    (dict(doc_lens=[5, 5], cp_size=True), "cp_size: must be an integer, got True (bool)"),
    (dict(doc_lens=[5, 5], cp_size=2.0), "cp_size: must be an integer, got 2.0 (float)"),
    (dict(doc_lens=[5, 5], cp_size=2, min_shard_tokens=1.5),
     "min_shard_tokens: must be an integer, got 1.5 (float)"),
    (dict(doc_lens={5: 1, 7: 2}, cp_size=2),
     "doc_lens: expected a sequence of document lengths, got dict"),
    (dict(doc_lens={5, 7}, cp_size=2), "doc_lens: expected a sequence of document lengths, "
                                       "got set"),
    (dict(doc_lens=[5, 5], cp_size=2, heads=False), "heads: must be an integer, got False (bool)"),
    (dict(doc_lens=[5, 5], cp_size=2, max_docs=1.5),
     "max_docs: must be an integer, got 1.5 (float)"),
])
def test_arguments_of_the_wrong_type_raise_type_error(kwargs, message):
    with pytest.raises(TypeError) as e:
        flashcp.plan(**kwargs)
    assert str(e.value) == message


def _layout():
    view = flashcp.plan_view(flashcp.plan([8, 8], 2, "per_doc"))
    return native().RankLayout(list(view.doc_lens), 2, view.padding, list(view.shards), 0,
                               "targeted")


def test_a_bad_address_raises_instead_of_crashing():
    lay = _layout()
    att = native().CpuAttention(lay, 1, 4, 0.5, 1)
    n = lay.local_rows * 4
    import torch
    good = [torch.zeros(n) for _ in range(3)]
    stage = torch.zeros(max(att.stage_rows * 4, 1))
    lse = torch.zeros(lay.local_rows)
    bufs = [(t.data_ptr(), t.numel()) for t in good]
    st = (stage.data_ptr(), att.stage_rows * 4)
    ls = (lse.data_ptr(), lse.numel())
    out = torch.zeros(n)
    att.forward(*bufs, st, st, (out.data_ptr(), n), ls)  # the good call works
    with pytest.raises(ValueError, match=r"^q: address 0x1 is not float-aligned$"):
        att.forward((1, n), *bufs[1:], st, st, (out.data_ptr(), n), ls)
    with pytest.raises(ValueError, match=r"^o: \d+ bytes at address 0x1000 are not mapped in "
                                         r"this process"):
        att.forward(*bufs, st, st, (4096, n), ls)


def test_threads_that_cannot_be_created_raise_instead_of_aborting():
    # As the probe: 64 kernel threads under an address-space limit just above
    # what the process maps (each thread's stack is 8 MiB of it).
    script = textwrap.dedent("""
        import resource
        import flashcp
        from flashcp._native import native
        view = flashcp.plan_view(flashcp.plan([8, 8], 2, "per_doc"))
        lay = native().RankLayout(list(view.doc_lens), 2, view.padding, list(view.shards), 0,
                                  "targeted")
        pages = int(open("/proc/self/statm").read().split()[0])
        limit = pages * resource.getpagesize() + (64 << 20)
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
        try:
            native().CpuAttention(lay, 1, 4, 0.5, 64)
            print("CREATED")
        except RuntimeError as e:
            print("RAISED", e)
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, (out.returncode, out.stderr)
    assert out.stdout.startswith("RAISED RESOURCE_EXHAUSTED: threads: cannot create thread "), \
        out.stdout
