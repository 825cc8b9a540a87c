"""Runs a function on N real processes joined in a torch.distributed gloo
group, and returns what each rank returned.

Processes come from a forkserver that has imported torch and flashcp once
(fast starts; no process forks after torch has started threads). The group's
rendezvous is a FileStore in a fresh temporary directory (no fixed port);
gloo binds loopback only (GLOO_SOCKET_IFNAME=lo). Every wait has a deadline:
a rank that does not report in time is killed and the run fails naming it.
"""
import datetime
import faulthandler
import multiprocessing as mp
import os
import queue
import tempfile
import time
import traceback

_CTX = None


def _context():
    global _CTX
    if _CTX is None:
        _CTX = mp.get_context("forkserver")
        # The forkserver (a fresh interpreter) is given our sys.path but does
        # not apply it before preloading: without this folder on its
        # PYTHONPATH, the preload of cases and hf_cases fails silently (an
        # ImportError is skipped) and every rank imports them itself (seconds
        # each for transformers). hf_cases is skipped the same way where
        # transformers is not installed.
        here = os.path.dirname(os.path.abspath(__file__))
        path = os.environ.get("PYTHONPATH")
        if here not in (path or "").split(os.pathsep):
            os.environ["PYTHONPATH"] = here + (os.pathsep + path if path else "")
        _CTX.set_forkserver_preload(["torch", "torch.distributed", "flashcp", "flashcp.torch",
                                     "cases", "hf_cases"])
    return _CTX


def _child(fn, rank, n, store_path, timeout_s, args, out, report_s):
    os.environ["GLOO_SOCKET_IFNAME"] = "lo"
    # A rank still running shortly before the parent's deadline prints every
    # thread's stack to stderr: where a stuck rank waits.
    faulthandler.dump_traceback_later(report_s, exit=False)
    import torch
    import torch.distributed as dist
    torch.set_num_threads(1)
    try:
        store = dist.FileStore(store_path, n)
        dist.init_process_group("gloo", store=store, rank=rank, world_size=n,
                                timeout=datetime.timedelta(seconds=timeout_s))
        result = fn(rank, n, *args)
        out.put((rank, "ok", result))
    except BaseException as e:  # reported to the parent, which fails the test
        out.put((rank, "error", f"{type(e).__name__}: {e}\n{traceback.format_exc()}"))
    # Flush the result before the group's teardown: a teardown that blocks
    # holding the GIL would otherwise keep the queue's feeder thread from
    # sending it (the parent kills a rank that has reported but not exited).
    out.close()
    out.join_thread()
    try:
        dist.destroy_process_group()
    except Exception:
        pass


class RankFailed(AssertionError):
    pass


def run(fn, n, *args, timeout_s=60.0, group_timeout_s=30.0, allow_errors=False):
    """fn(rank, n, *args) on n processes; returns [result or ("error", text)]
    by rank. Raises RankFailed for a rank that errs (unless allow_errors),
    exits without reporting, or does not report within timeout_s."""
    ctx = _context()
    out = ctx.Queue()
    with tempfile.TemporaryDirectory(prefix="flashcp-dist-") as d:
        store = os.path.join(d, "store")
        procs = [ctx.Process(target=_child, args=(fn, r, n, store, group_timeout_s, args, out,
                                   max(1.0, timeout_s - 5.0)),
                             daemon=True) for r in range(n)]
        for p in procs:
            p.start()
        results = {}
        deadline = time.monotonic() + timeout_s
        try:
            while len(results) < n:
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                try:
                    rank, status, value = out.get(timeout=min(left, 0.5))
                except queue.Empty:
                    dead = [r for r, p in enumerate(procs)
                            if r not in results and p.exitcode is not None]
                    if dead and out.empty():
                        time.sleep(0.2)  # a result may still be in the pipe
                        if out.empty():
                            for r in dead:
                                results[r] = ("exited", f"exit code {procs[r].exitcode}")
                    continue
                results[rank] = (status, value)
        finally:
            for p in procs:
                p.join(timeout=min(10.0, max(0.0, deadline - time.monotonic()))
                       if len(results) == n else 0)
                if p.is_alive():
                    p.kill()
                    p.join()
        missing = [r for r in range(n) if r not in results]
        if missing:
            raise RankFailed(f"ranks {missing} did not report within {timeout_s} s")
        bad = {r: v for r, (s, v) in results.items() if s != "ok"}
        if bad and not allow_errors:
            raise RankFailed("\n".join(f"rank {r}: {v}" for r, v in sorted(bad.items())))
        return [results[r][1] if results[r][0] == "ok" else (results[r][0], results[r][1])
                for r in range(n)]
