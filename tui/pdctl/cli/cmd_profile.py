"""``pdctl profile``: measure one instance of a spec for ``pdctl plan``.

Starts one colocated instance built from the spec's first group (same model, TP, cores
or GPUs, engine flags), sweeps prompt lengths (TTFT) and (batch, context) (inter-token
gap) through it, then TTFT through a real 1P1D push pair of the spec at three prompt
lengths (the KV path as served: connector, router, scheduling), measures the raw KV path
with ``pdctl probe`` at two prompt lengths, and writes the profile JSON tagged with
model, hardware, TP and vLLM version. Every point is saved as measured; running again
with the same ``-o`` resumes (``--fresh`` starts over).
Exit codes: 0 written, 2 bad input or the instance failed, 130 interrupted.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pdctl.cli.args import Grammar, emit, human
from pdctl.cli.common import console, progress_bars
from pdctl.cli.tinymodel import spec_or_demo
from pdctl.sdk.plan.recommend import DEFAULT_PROFILE

if TYPE_CHECKING:
    from pdctl.sdk.plan.profile import KvPath, Profile
    from pdctl.sdk.plan.profiler import Sweep
    from pdctl.sdk.spec import FleetSpec


GRAMMAR = Grammar(
    backends=("local",),
    backend_why="profile starts its instances on this machine",
    out_path=True,
)
"""-o table|json|yaml is the summary printed; the profile goes to --out (the old -o PATH
still works, with a note)."""


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--out",
        metavar="FILE",
        default=DEFAULT_PROFILE,
        help="profile JSON to write, and to resume from (default %(default)s)",
    )
    p.add_argument("--quick", action="store_true", help="few points, few repeats (minutes)")
    p.add_argument("--fresh", action="store_true", help="discard points already in --out")
    p.add_argument("--no-probe", action="store_true", help="skip the KV path measurement")
    p.add_argument("--no-disagg", action="store_true", help="skip the 1P1D push TTFT measurement")
    p.add_argument("--repeats", type=int, help="requests per prefill point")


def _base_profile(spec: FleetSpec, source: str) -> tuple[Profile, int]:
    from pdctl.sdk.modelinfo import read_model_info, text_config
    from pdctl.sdk.plan.profile import KvShape, Profile, ProfileError
    from pdctl.sdk.plan.profiler import hardware_name
    from pdctl.sdk.preflight.kvsize import kv_layout, resolve_dtype

    info = read_model_info(spec.model.path)
    if info is None:
        raise ProfileError(
            f"model.path {spec.model.path}: no config.json; the profile needs the KV shape"
        )
    cfg = text_config(info.raw)
    vocab = cfg.get("vocab_size")
    if not isinstance(vocab, int) or vocab < 4:
        raise ProfileError(f"{spec.model.path}/config.json: vocab_size missing")
    dtype, _ = resolve_dtype(spec.model.kv_cache_dtype, spec.model.dtype, cfg)
    group = (spec.prefill or spec.decode)[0]
    chunk = 2048
    args = [*spec.fleet.vllm_args, *group.vllm_args]
    for i, a in enumerate(args):
        if a.startswith("--max-num-batched-tokens"):
            val = a.split("=", 1)[1] if "=" in a else (args[i + 1] if i + 1 < len(args) else "")
            chunk = int(val) if val.isdigit() else chunk
    prof = Profile(
        model=spec.model.effective_served_name,
        model_path=spec.model.path,
        hardware=hardware_name(spec.fleet.platform),
        platform=spec.fleet.platform,
        tp=group.tp,
        max_num_seqs=group.max_num_seqs or 256,
        chunk_tokens=chunk,
        max_model_len=spec.model.max_model_len,
        kv=KvShape.of(kv_layout(cfg, dtype)),
        spec_source=None if source.startswith("<") else str(Path(source).resolve()),
        created=dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
    )
    return prof, vocab


def run(args: argparse.Namespace) -> int:
    from pdctl.sdk.errors import PdctlError
    from pdctl.sdk.plan.planner import Layout
    from pdctl.sdk.plan.profile import load_profile, save_profile
    from pdctl.sdk.plan.profiler import Sweep, default_sweep, same_target
    from pdctl.sdk.plan.specout import spec_for_layout

    base, source = spec_or_demo(args)
    prof, vocab = _base_profile(base, source)
    out_path = Path(args.out)
    resumed = 0
    if out_path.exists() and not args.fresh:
        old = load_profile(out_path)
        if same_target(old, prof):
            prof.prefill, prof.decode, prof.kv_path = old.prefill, old.decode, old.kv_path
            prof.disagg = old.disagg
            prof.vllm_version = old.vllm_version
            resumed = len(old.prefill) + len(old.decode) + len(old.disagg)
    max_len = base.model.max_model_len or 8192
    sweep = default_sweep(max_len, prof.max_num_seqs, args.quick)
    if args.repeats:
        sweep = Sweep(sweep.prefill_lens, sweep.decode_points, args.repeats, sweep.decode_tokens)
    one = spec_for_layout(base, Layout("colocated", 1, 0, prof.tp))
    one = one.model_copy(
        update={"fleet": one.fleet.model_copy(update={"name": f"{base.fleet.name}-profile"})}
    )
    done_p = {p.input_len for p in prof.prefill}
    done_d = {(d.batch, d.context) for d in prof.decode}
    if not (set(sweep.prefill_lens) <= done_p and set(sweep.decode_points) <= done_d):
        what = f"one instance of {source}"
        prof = asyncio.run(_measure(args, one, what, prof, vocab, sweep, out_path))
    lens = sorted(sweep.prefill_lens)
    disagg = (lens[0], lens[len(lens) // 2], lens[-1])
    if not args.no_disagg and not set(disagg) <= {d.input_len for d in prof.disagg}:
        try:
            pair = spec_for_layout(base, Layout("push", 1, 1, prof.tp))
        except PdctlError as e:
            prof.notes.append(f"no 1P1D measurement: {e}")
        else:
            pair = pair.model_copy(
                update={
                    "fleet": pair.fleet.model_copy(update={"name": f"{base.fleet.name}-profile"})
                }
            )
            what = f"a 1P1D push pair of {source}"
            prof = asyncio.run(_measure(args, pair, what, prof, vocab, sweep, out_path, disagg))
    if not args.no_probe and prof.kv_path is None:
        console(stderr=True).print("[dim]measuring the KV path (pdctl probe)[/]")
        prof.kv_path = _probe_path(base, prof, sweep)
    if prof.kv_path is None:
        prof.notes.append("no KV path measured: pdctl plan needs --topology or --kv-gbps")
    save_profile(prof, out_path)
    return _report(args, prof, out_path, resumed)


async def _measure(
    args: argparse.Namespace,
    spec: FleetSpec,
    what: str,
    prof: Profile,
    vocab: int,
    sweep: Sweep,
    out_path: Path,
    disagg: tuple[int, ...] = (),
) -> Profile:
    """Start ``spec``, measure through its router (or its only instance), stop it:
    the colocated sweep, or with ``disagg`` the 1P1D TTFT at those prompt lengths."""
    from pdctl.sdk.fleet import AsyncFleet
    from pdctl.sdk.plan.profiler import ProfileProgress, Profiler, vllm_version

    err = console(stderr=True)
    fleet = AsyncFleet(spec, ready_timeout=600.0)
    err.print(f"[dim]starting {what} ({prof.hardware})[/]")
    await fleet.up()
    try:
        first = fleet.plan.instances[0].url
        url = fleet.router_url if spec.router is not None else first
        if not disagg:
            prof.vllm_version = await vllm_version(first)
        with progress_bars(err, not human(args)) as bar:
            task = bar.add_task("profile", total=len(disagg) or sweep.total)
            hooks = ProfileProgress(
                on_point=lambda what: bar.update(task, description=what),
                on_done=lambda what, skipped: bar.advance(task),
            )
            model = spec.model.effective_served_name
            profiler = Profiler(url, model, vocab, sweep, _saver(out_path), hooks)
            if disagg:
                prof = await profiler.run_disagg(prof, disagg, spec.fleet.mode)
            else:
                prof = await profiler.run(prof)
    finally:
        err.print("[dim]stopping it[/]")
        await fleet.down()
    return prof


def _report(args: argparse.Namespace, prof: Profile, out_path: Path, resumed: int) -> int:
    from pdctl.sdk.plan.profiler import describe

    summary = {**describe(prof), "output": str(out_path), "resumed_points": resumed}
    if not emit(args, summary):
        out = console()
        out.print(f"profile of {prof.tag()} written to {out_path}")
        out.print(
            f"  {len(prof.prefill)} prefill points, {len(prof.decode)} decode points, "
            f"{len(prof.disagg)} 1P1D points" + (f" ({resumed} resumed)" if resumed else "")
        )
        if prof.kv_path is not None:
            out.print(
                f"  KV path {prof.kv_path.bytes_per_s / 1e9:.3g} GB/s + "
                f"{prof.kv_path.overhead_s * 1e3:.1f} ms ({prof.kv_path.source})"
            )
    return 0


def _saver(path: Path) -> Any:
    from pdctl.sdk.plan.profile import save_profile

    return lambda p: save_profile(p, path)


def _probe_path(spec: FleetSpec, prof: Profile, sweep: Any) -> KvPath | None:
    """Two probe runs (short and long prompt) → bandwidth and fixed cost per transfer."""
    from pdctl.cli.proberun import ProbeFailed, run_probe
    from pdctl.sdk.plan.profile import KvPath

    lens = (min(sweep.prefill_lens), max(sweep.prefill_lens))
    kv = prof.kv.layout()
    points: list[tuple[float, float]] = []
    for length in lens:
        model = os.path.expanduser(spec.model.path)
        argv = [sys.executable, "-m", "pdctl.connector.probe", "--model", model]
        argv += ["--prompt-len", str(length), "--tp", str(prof.tp), "--device", "auto"]
        argv += ["--block-size", str(spec.fleet.block_size or 16)]
        argv += ["--count", "8", "--warmup", "2", "--progress"]
        try:
            result = run_probe(argv, timeout_s=600.0)
        except ProbeFailed as e:
            console(stderr=True).print(f"[yellow]probe skipped: {e}[/]")
            return None
        p50 = (result.get("transfer_ms") or {}).get("p50")
        if not result.get("ok") or p50 is None:
            return None
        points.append((float(kv.per_rank(length, prof.tp)), p50 / 1e3))
    (b0, t0), (b1, t1) = points
    if b1 > b0 and t1 > t0:
        bps = (b1 - b0) / (t1 - t0)
        overhead = max(0.0, t0 - b0 / bps)
    else:
        bps, overhead = b1 / t1, 0.0
    how = ", ".join(f"{b / 1e6:.2f} MB in {t * 1e3:.2f} ms" for b, t in points)
    return KvPath(bytes_per_s=bps, overhead_s=overhead, source=f"pdctl probe p50: {how}")
