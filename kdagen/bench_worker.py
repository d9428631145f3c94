# SPDX-License-Identifier: Apache-2.0
"""A FlashKDA build timed in its own process for `python -m kdagen bench --flashkda NAME=DIR`.

vLLM's fork and upstream FlashKDA both import as `flash_kda`, so one process cannot hold both. The bench
starts `python -m kdagen.bench_worker NAME` with DIR first on PYTHONPATH and speaks one JSON line each way
per request: "check" (errors against the float64 reference at the bench's CHECK_SHAPE), "time" (one shape:
the worker rebuilds the bench's inputs from the same lengths and seed, converts them, checks one call and
times it; with "dump" it saves that call's output and final state for the bench to compare with its own
float64 reference, which is computed once, in the bench) and "quit". Replies carry "error" on failure.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import traceback
from pathlib import Path
from typing import Any

from kdagen.bench_shapes import Shape


def _reply(obj: dict) -> None:
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


def serve(name: str) -> int:
    """The worker's loop (runs in the child)."""
    import torch

    from kdagen import bench
    from kdagen.bench_peers import flashkda_maker

    try:
        import flash_kda
    except Exception as exc:
        _reply({"error": f"flash_kda not importable: {type(exc).__name__}: {str(exc).splitlines()[0][:200]}"})
        return 1
    make = flashkda_maker(flash_kda.fwd)
    _reply({"ready": True, "file": flash_kda.__file__})
    for line in sys.stdin:
        req = json.loads(line)
        try:
            if req["cmd"] == "quit":
                return 0
            if req["cmd"] == "check":
                from kdagen.reference import chunk_kda_prefill_reference

                args, ci, co = bench.shape_inputs(*bench.CHECK_SHAPE, seed=1)
                _reply({"errors": bench.check_errors(make, chunk_kda_prefill_reference(**args), args, ci, co)})
                continue
            args, ci, co = bench.make_inputs(req["H"], req["lens"], seed=req.get("seed", 0))
            fn = make(args, ci, co, None)
            o, s = fn()
            torch.cuda.synchronize()
            if req.get("dump"):
                torch.save((o.cpu(), s.cpu()), req["dump"])
            del o, s
            _reply({"timed": bench.time_call(fn, req["rep_ms"], name)})
            del fn, args, ci, co
            torch.cuda.empty_cache()
        except Exception as exc:
            print(traceback.format_exc(), file=sys.stderr)
            _reply({"error": f"{type(exc).__name__}: {str(exc).splitlines()[0][:200] if str(exc) else ''}"})
    return 0


class Worker:
    """The bench's handle on one worker process."""

    def __init__(self, name: str, proc: subprocess.Popen, tmp: Path):
        self.name, self.proc, self.tmp = name, proc, tmp

    @classmethod
    def start(cls, name: str, pkg_dir: Path) -> Worker | None:
        """The worker for the flash_kda package under pkg_dir, or None (said why) when it cannot import it."""
        env = dict(os.environ, FLA_FLASH_KDA="0")
        root = str(Path(__file__).resolve().parent.parent)  # kdagen itself, wherever the bench runs from
        env["PYTHONPATH"] = os.pathsep.join([str(pkg_dir), root, env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
        proc = subprocess.Popen([sys.executable, "-m", "kdagen.bench_worker", name], stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, text=True, env=env)
        shm = Path("/dev/shm")
        w = cls(name, proc, Path(tempfile.mkdtemp(prefix=f"kdagen-{name}-", dir=shm if shm.is_dir() else None)))
        hello = w._read()
        if "ready" not in hello:
            print(f"{name}: {hello.get('error', 'worker did not start')}; not timing it", file=sys.stderr)
            w.close()
            return None
        if not hello["file"].startswith(str(pkg_dir)):
            print(f"{name}: flash_kda came from {hello['file']}, not {pkg_dir}; not timing it", file=sys.stderr)
            w.close()
            return None
        print(f"{name}: worker process for {hello['file']}", file=sys.stderr)
        return w

    def _read(self) -> dict:
        line = self.proc.stdout.readline()
        return json.loads(line) if line else {"error": f"worker exited ({self.proc.poll()})"}

    def _ask(self, req: dict) -> dict:
        try:
            self.proc.stdin.write(json.dumps(req) + "\n")
            self.proc.stdin.flush()
        except (BrokenPipeError, OSError):
            return {"error": f"worker exited ({self.proc.poll()})"}
        return self._read()

    def check(self) -> tuple[float, float] | None:
        """Errors at the check shape, or None (said why) when they are over the peer tolerance or it failed."""
        from kdagen.bench import PEER_TOL

        r = self._ask({"cmd": "check"})
        if "errors" not in r:
            print(f"{self.name}: check failed ({r.get('error')}); not timing it", file=sys.stderr)
            return None
        eo, es = r["errors"]
        print(f"check {self.name}: rel L2 output {eo:.2e}, final state {es:.2e}", file=sys.stderr)
        if not (eo < PEER_TOL and es < PEER_TOL):
            print(f"{self.name} disagrees with the float64 reference (over {PEER_TOL:g}); not timing it",
                  file=sys.stderr)
            return None
        return eo, es

    def time(self, shape: Shape, rep_ms: int, dump: bool) -> tuple[dict | None, Any]:
        """(timings, (output, final state) or None); (None, None), said why, when the worker failed."""
        import torch

        path = self.tmp / "out.pt"
        r = self._ask({"cmd": "time", "H": shape.H, "lens": list(shape.lens), "seed": 0, "rep_ms": rep_ms,
                       "dump": str(path) if dump else None})
        if "timed" not in r:
            print(f"{self.name} at {shape.label()}: {r.get('error')}", file=sys.stderr)
            return None, None
        got = None
        if dump:
            o, s = torch.load(path)
            path.unlink()
            got = (o.cuda(), s.cuda())
        return r["timed"], got

    def close(self) -> None:
        if self.proc.poll() is None:
            try:
                self._ask({"cmd": "quit"})
            except Exception:
                pass
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        for f in self.tmp.glob("*"):
            f.unlink()
        self.tmp.rmdir()


if __name__ == "__main__":
    sys.exit(serve(sys.argv[1]))
