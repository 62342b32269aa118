"""The event-loop lag probe (dtok/integrations/lag.py): it sees a blocked loop, names the code
that held it, and does not blame dtok for a stall inside its own beat."""
from __future__ import annotations

import asyncio
import json
import os
import time

from dtok.integrations import lag


def test_a_blocked_loop_is_a_stall_named_by_its_stack(tmp_path):
    async def main():
        probe = lag.LoopLagProbe(asyncio.get_running_loop(), str(tmp_path / "lag-{pid}.json"))
        probe.start()
        await asyncio.sleep(0.05)
        time.sleep(0.04)  # this coroutine holds the loop: not dtok's code
        await asyncio.sleep(0.05)
        return probe

    probe = asyncio.run(main())
    snap = probe.snapshot()
    assert snap["max_ms"] >= 30, snap["max_ms"]
    held = [s for s in snap["stalls"] if s["ms"] >= 30]
    assert held and not held[0]["dtok"] and not held[0]["native"], held
    assert any("test_loop_lag.py" in line for line in held[0]["stack"])
    probe.write()
    assert json.loads((tmp_path / f"lag-{os.getpid()}.json").read_text())["beats"] > 0


def test_stalls_are_attributed_by_the_innermost_frame():
    dtok_dir = os.path.dirname(os.path.dirname(os.path.abspath(lag.__file__)))
    loop_top = '  File "/usr/lib/python3.11/asyncio/base_events.py", line 1, in run_until_complete'
    pool = f'  File "{dtok_dir}/pool/api.py", line 300, in stats'
    beat = f'  File "{os.path.abspath(lag.__file__)}", line 100, in _beat'
    engine = '  File "/venv/site-packages/vllm/renderer.py", line 9, in render'
    assert lag._innermost_is_dtok([loop_top, pool]) and not lag._waited_natively([loop_top, pool])
    # late inside the probe's own beat: the loop waited (for the GIL), dtok's code did not run
    assert not lag._innermost_is_dtok([loop_top, beat]) and lag._waited_natively([loop_top, beat])
    assert not lag._innermost_is_dtok([loop_top, engine])
    assert lag._waited_natively([loop_top]) and not lag._innermost_is_dtok([loop_top])


def test_a_stall_says_whether_the_loop_was_on_a_cpu(tmp_path):
    """A loop that computes through a stall was on a CPU for as much of it as the machine gave
    its thread (all of it on an idle machine; on a busy one, the share the loop's thread itself
    measures over the same stretch); one that waits (here asleep in a callback, as it waits for
    the GIL or for a CPU the machine gave to other threads) for little of it, whatever its
    stack shows."""
    got = {}

    def seen(probe):
        # until the watchdog has seen the stall (a busy machine may start it late): the probe
        # measures from then to the beat that ends the stall
        give_up = time.perf_counter() + 10
        while probe._pending is None:
            assert time.perf_counter() < give_up, "the watchdog never saw the stall"
            yield

    def compute(probe, cpu_s):
        # computes on, then for cpu_s seconds of its own CPU time (longer on a busy machine),
        # measuring the share of the time it was on a CPU from when the watchdog saw the stall
        # (the watchdog holds the GIL a while then, as it takes the stack: this thread waits)
        for _ in seen(probe):
            pass
        t, cpu = probe._pending["_t0"], time.thread_time()
        while time.thread_time() - cpu < cpu_s:
            pass
        got["share"] = (time.thread_time() - cpu) / (time.perf_counter() - t)

    def wait(probe, s):
        for _ in seen(probe):
            time.sleep(0.001)
        time.sleep(s)

    async def main():
        probe = lag.LoopLagProbe(asyncio.get_running_loop(), str(tmp_path / "lag-{pid}.json"))
        probe.start()
        await asyncio.sleep(0.05)
        k = len(probe.stalls)  # the next stall is this one's: no beat runs before it ends
        compute(probe, 0.1)
        await asyncio.sleep(0.05)
        computing = probe.stalls[k]
        k = len(probe.stalls)
        wait(probe, 0.04)
        await asyncio.sleep(0.05)
        return computing, probe.stalls[k]

    for _ in range(3):  # a busy machine can deschedule the loop between the two readings
        computing, waiting = asyncio.run(main())
        if abs(computing["on_cpu"] - got["share"]) <= 0.1 and waiting["on_cpu"] <= 0.3:
            break
    assert computing["ms"] >= 30 and waiting["ms"] >= 30, (computing, waiting)
    # the computing loop's share is the one its own thread measured (about 1 on an idle
    # machine, less where other work takes the CPU: a full run on a shared 2-core machine saw
    # 0.25); the sleeping loop's is near 0 either way: the two stalls are told apart
    assert abs(computing["on_cpu"] - got["share"]) <= 0.1, (got, computing)
    assert waiting["on_cpu"] <= 0.3 and computing["on_cpu"] > waiting["on_cpu"], \
        (got, computing, waiting)
