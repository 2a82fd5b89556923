"""The profile: what one instance of a model on one kind of hardware measured (pure).

``pdctl profile`` writes it; ``pdctl plan`` reads it. It holds raw points (prefill time
against prompt length, decode inter-token gap against batch and context) and the KV
path's measured bandwidth; the curves the planner uses are fitted here:

* prefill ``t(L) = a + b·L + c·L²`` (fixed cost, linear layers, attention);
* decode step ``g(B, C) = d0 + d1·B + d2·B·C`` (fixed step cost, per-sequence cost,
  attention over every sequence's context).

Both are non-negative least squares on relative error, so a small point weighs as much
as a large one.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import combinations
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from pdctl.sdk.errors import PdctlError
from pdctl.sdk.preflight.kvsize import KvLayout

SCHEMA_VERSION = 1


class ProfileError(PdctlError):
    """A profile cannot be read or does not hold what the planner needs."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class PrefillPoint(_Strict):
    input_len: int = Field(ge=1)
    ttft_s: float = Field(gt=0, description="Median TTFT of single requests (1 output token).")
    samples: int = Field(default=1, ge=1)


class DecodePoint(_Strict):
    batch: int = Field(ge=1, description="Sequences decoding together.")
    context: int = Field(ge=1, description="Tokens in each sequence's context.")
    itl_s: float = Field(gt=0, description="Median gap between tokens in the steady batch.")
    samples: int = Field(default=1, ge=1)


class DisaggPoint(_Strict):
    input_len: int = Field(ge=1)
    ttft_s: float = Field(gt=0, description="Median TTFT through a real 1P1D pair.")
    mode: Literal["push", "pull"] = "push"
    samples: int = Field(default=1, ge=1)


class KvPath(_Strict):
    bytes_per_s: float = Field(gt=0)
    overhead_s: float = Field(default=0.0, ge=0, description="Fixed cost per transfer.")
    source: str = Field(description="How it was measured (pdctl probe, a log line, given).")


class KvShape(_Strict):
    """The fields of :class:`~pdctl.sdk.preflight.kvsize.KvLayout`."""

    kind: Literal["standard", "mla"] = "standard"
    num_layers: int = Field(ge=1)
    sliding_layers: int = 0
    sliding_window: int | None = None
    layer_token_bytes: int = Field(ge=1)
    kv_heads: int | None = None
    dtype: str = "bfloat16"
    dtype_bytes: int = 2

    def layout(self) -> KvLayout:
        return KvLayout(
            self.kind,
            self.num_layers,
            self.sliding_layers,
            self.sliding_window,
            self.layer_token_bytes,
            self.kv_heads,
            self.dtype,
            self.dtype_bytes,
        )

    @classmethod
    def of(cls, kv: KvLayout) -> KvShape:
        return cls(
            kind=kv.kind,
            num_layers=kv.num_layers,
            sliding_layers=kv.sliding_layers,
            sliding_window=kv.sliding_window,
            layer_token_bytes=kv.layer_token_bytes,
            kv_heads=kv.kv_heads,
            dtype=kv.dtype,
            dtype_bytes=kv.dtype_bytes,
        )


class Profile(_Strict):
    schema_version: int = SCHEMA_VERSION
    model: str = Field(description="Served model name (or path).")
    model_path: str | None = None
    hardware: str = Field(description="GPU product name, or 'cpu: <model> x<cores>'.")
    platform: Literal["gpu", "cpu"] = "gpu"
    tp: int = Field(default=1, ge=1)
    vllm_version: str = "unknown"
    max_num_seqs: int = Field(default=256, ge=1, description="Decode batch limit.")
    chunk_tokens: int = Field(
        default=2048, ge=1, description="Prompt tokens per scheduler step (chunked prefill)."
    )
    max_model_len: int | None = None
    kv: KvShape
    prefill: list[PrefillPoint] = Field(default_factory=list)
    decode: list[DecodePoint] = Field(default_factory=list)
    kv_path: KvPath | None = None
    disagg: list[DisaggPoint] = Field(
        default_factory=list, description="TTFT through a real 1P1D pair (KV path as served)."
    )
    spec_source: str | None = Field(default=None, description="The spec it was taken on.")
    created: str | None = None
    notes: list[str] = Field(default_factory=list)

    def tag(self) -> str:
        return f"{self.model} on {self.hardware}, TP {self.tp}, vLLM {self.vllm_version}"


def load_profile(path: str | Path) -> Profile:
    p = Path(path)
    try:
        raw = json.loads(p.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ProfileError(f"--profile {p}: no such file; write one with pdctl profile") from None
    except (OSError, ValueError) as e:
        raise ProfileError(f"--profile {p}: not readable JSON ({e})") from None
    try:
        return Profile.model_validate(raw)
    except ValidationError as e:
        first = e.errors()[0]
        where = ".".join(str(x) for x in first["loc"]) or "(top level)"
        raise ProfileError(
            f"--profile {p}: {where}: {first['msg']} — fix the field or re-run pdctl profile"
        ) from None


def save_profile(profile: Profile, path: str | Path) -> None:
    """Write atomically (a resumed profile never sees half a file)."""
    p = Path(path)
    tmp = p.with_name(p.name + ".tmp")
    tmp.write_text(profile.model_dump_json(indent=2) + "\n", encoding="utf-8")
    tmp.replace(p)


def nnls(rows: Sequence[Sequence[float]], ys: Sequence[float]) -> list[float]:
    """Non-negative least squares on relative error for a handful of columns: every
    subset of columns is solved exactly and the best all-non-negative one is kept."""
    n = len(rows[0])
    best: tuple[float, list[float]] | None = None
    for k in range(n, 0, -1):
        for cols in combinations(range(n), k):
            coef = _lstsq([[r[c] / y for c in cols] for r, y in zip(rows, ys, strict=True)])
            if coef is None or min(coef) < 0:
                continue
            full = [0.0] * n
            for c, v in zip(cols, coef, strict=True):
                full[c] = v
            sse = sum(
                (sum(f * x for f, x in zip(full, r, strict=True)) / y - 1) ** 2
                for r, y in zip(rows, ys, strict=True)
            )
            if best is None or sse < best[0] - 1e-15:
                best = (sse, full)
    if best is None:
        raise ProfileError("cannot fit the profile's points (all fits went negative)")
    return best[1]


def _lstsq(a: list[list[float]]) -> list[float] | None:
    """Least squares of ``a·x ≈ 1`` by the normal equations (tiny, well-scaled systems)."""
    n = len(a[0])
    m = [[sum(r[i] * r[j] for r in a) for j in range(n)] + [sum(r[i] for r in a)] for i in range(n)]
    for i in range(n):
        piv = max(range(i, n), key=lambda k: abs(m[k][i]))
        if abs(m[piv][i]) < 1e-300:
            return None
        m[i], m[piv] = m[piv], m[i]
        for k in range(n):
            if k != i:
                f = m[k][i] / m[i][i]
                m[k] = [x - f * y for x, y in zip(m[k], m[i], strict=True)]
    return [m[i][n] / m[i][i] for i in range(n)]


@dataclass(frozen=True)
class Curves:
    """Fitted prefill time and decode step time of one instance."""

    prefill: tuple[float, float, float]
    decode: tuple[float, float, float]

    def prefill_s(self, tokens: float) -> float:
        a, b, c = self.prefill
        return a + b * tokens + c * tokens * tokens

    def step_s(self, batch: float, context: float) -> float:
        d0, d1, d2 = self.decode
        return d0 + d1 * batch + d2 * batch * context

    def as_dict(self) -> dict[str, Any]:
        return {"prefill_abc": list(self.prefill), "decode_d012": list(self.decode)}


def fit(profile: Profile) -> Curves:
    """The curves; errors name what to measure when points are missing."""
    if len(profile.prefill) < 2:
        raise ProfileError(
            "profile.prefill: the fit needs at least 2 prompt lengths; re-run pdctl profile"
        )
    if not profile.decode:
        raise ProfileError("profile.decode: no decode points; re-run pdctl profile")
    pf = nnls(
        [[1.0, float(p.input_len), float(p.input_len) ** 2] for p in profile.prefill],
        [p.ttft_s for p in profile.prefill],
    )
    dc = nnls(
        [[1.0, float(d.batch), float(d.batch * d.context)] for d in profile.decode],
        [d.itl_s for d in profile.decode],
    )
    return Curves((pf[0], pf[1], pf[2]), (dc[0], dc[1], dc[2]))
