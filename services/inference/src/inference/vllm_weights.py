"""Weight versions on vLLM: the proxy's admission gate, the in-place reload cycle, and the checks that guard it.

Role: vLLM knows nothing of floe's versions, so the proxy in front of it (``vllm_proxy``) owns them. ``VllmWeights``
is the ``reloader.WeightsTarget`` of ``--engine vllm``: for a newer ``WeightsPublished`` it

1. checks the checkpoint against the served model (``check_compatible``: ``config.json`` architecture, and every
   tensor's name and shape from the safetensors headers) and refuses a mismatch, naming both directories;
2. closes the ``Admission`` gate (new requests wait in the proxy) and waits for the requests inside to finish: they
   were admitted on the old version and finish on the old weights;
3. drives vLLM: ``/pause?mode=wait`` → ``/collective_rpc reload_weights {weights_path}`` → ``/reset_prefix_cache``
   (cached KV was computed by the old weights) → ``/update_weight_version "floe:N:DIR"`` → ``/resume``;
4. sets the new version and reopens the gate. Requests admitted from then on report it.

Invariants: the version changes only while the gate is closed and no request is inside, so the version read at
admission is the version of every token of that request. A failed step before the reload leaves the old weights and
version. A failed reload may leave vLLM with a mix of both checkpoints, so the old checkpoint is loaded back before
the gate reopens; if that fails too, the weights are unknown: every request is refused (503) and ``WeightsLostError``
stops the service, whose restart starts vLLM from the served directory and follows ``floe.weights`` again.
vLLM's own ``/weight_info`` records what it holds (``floe:N:DIR``, ``floe:reloading`` during a reload): ``watch``
compares it with what the proxy stamps, and ``sync`` starts from it.

Why the checks: vLLM 0.32 kills its engine (the whole server exits) when ``reload_weights`` meets a tensor of the
wrong shape, and silently keeps the old values of tensors a checkpoint lacks. Both must be caught before the call.

Limits: one vLLM (tensor-parallel workers included) per proxy; checkpoints are local safetensors directories.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import structlog

from inference.reloader import WeightsLostError, WeightsNotLoadedError

__all__ = [
    "ARCHITECTURE_KEYS",
    "Admission",
    "IncompatibleCheckpointError",
    "ReloadFailedError",
    "VllmWeights",
    "check_compatible",
    "read_architecture",
    "read_tensor_shapes",
]

log = structlog.get_logger()

# The config.json fields an in-place reload depends on (tensor shapes are compared separately); the learner checks
# its checkpoints against the base model on the same fields (learner.checkpoint.ARCHITECTURE_FIELDS).
ARCHITECTURE_KEYS = (
    "model_type",
    "architectures",
    "hidden_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "intermediate_size",
    "vocab_size",
    "tie_word_embeddings",
)
_MAX_HEADER = 100 * 1024 * 1024  # the safetensors format's own limit on the JSON header
# vLLM's /weight_info while it holds version N of checkpoint P: "floe:N:P" (see VllmWeights.sync and watch).
MARKER_PREFIX = "floe:"
RELOADING = "floe:reloading"  # set before a reload: if it is cut off, nobody trusts what vLLM holds


class IncompatibleCheckpointError(ValueError):
    """A published checkpoint cannot be reloaded into the served model (other architecture or tensor shapes)."""


class ReloadFailedError(WeightsNotLoadedError):
    """vLLM did not take a new checkpoint; it still serves the previous version (the message says which)."""


def read_architecture(path: Path) -> dict[str, Any]:
    """The ``ARCHITECTURE_KEYS`` of ``path/config.json``; a missing or unreadable file names the path."""
    config = path / "config.json"
    try:
        data = json.loads(config.read_text())
    except FileNotFoundError:
        raise FileNotFoundError(f"not a checkpoint directory (no config.json): {path}") from None
    except (OSError, ValueError) as exc:
        raise IncompatibleCheckpointError(f"cannot read {config}: {exc}") from exc
    return {key: data.get(key) for key in ARCHITECTURE_KEYS}


def read_tensor_shapes(path: Path) -> dict[str, tuple[int, ...]]:
    """Name → shape of every tensor in ``path/*.safetensors``, from the headers only (no tensor is read).

    A file shorter than its header says (a checkpoint still being written, or truncated) is refused here."""
    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"no *.safetensors file in {path}")
    shapes: dict[str, tuple[int, ...]] = {}
    for file in files:
        try:
            with file.open("rb") as f:
                size = int.from_bytes(f.read(8), "little")
                if not 0 < size <= _MAX_HEADER:
                    raise ValueError("bad header length")
                header = json.loads(f.read(size))
            tensors = {k: m for k, m in header.items() if k != "__metadata__"}
            end = 8 + size + max((int(m["data_offsets"][1]) for m in tensors.values()), default=0)
            if file.stat().st_size < end:
                raise ValueError(f"truncated: {file.stat().st_size} bytes, the header needs {end}")
            shapes.update({k: tuple(int(d) for d in m["shape"]) for k, m in tensors.items()})
        except (ValueError, KeyError, TypeError) as exc:
            raise IncompatibleCheckpointError(f"{file} is not a readable safetensors file: {exc}") from exc
    return shapes


def _describe(arch: dict[str, Any]) -> str:
    return ", ".join(f"{k}={arch[k]}" for k in ARCHITECTURE_KEYS if arch.get(k) is not None)


def check_compatible(
    path: Path, served_path: Path, served_arch: dict[str, Any], served_shapes: dict[str, tuple[int, ...]]
) -> None:
    """Raise ``IncompatibleCheckpointError`` unless ``path`` has the served model's architecture and tensors."""
    arch = read_architecture(path)
    if arch != served_arch:
        raise IncompatibleCheckpointError(
            f"checkpoint {path} is {_describe(arch)}; the served model {served_path} is {_describe(served_arch)}: "
            "an in-place reload needs the same architecture"
        )
    shapes = read_tensor_shapes(path)
    if shapes != served_shapes:
        missing = sorted(served_shapes.keys() - shapes.keys())
        extra = sorted(shapes.keys() - served_shapes.keys())
        changed = sorted(k for k in shapes.keys() & served_shapes.keys() if shapes[k] != served_shapes[k])
        parts = [f"missing {missing[:3]}" if missing else "", f"unexpected {extra[:3]}" if extra else ""]
        parts += [f"{k} is {list(shapes[k])}, served {list(served_shapes[k])}" for k in changed[:3]]
        raise IncompatibleCheckpointError(
            f"checkpoint {path} does not match the tensors of the served model {served_path} "
            f"({len(missing)} missing, {len(extra)} unexpected, {len(changed)} of another shape): "
            + "; ".join(p for p in parts if p)
        )


class Admission:
    """The proxy's gate: requests enter while it is open; ``closed()`` shuts it and waits until none is inside."""

    def __init__(self) -> None:
        self._open = asyncio.Event()
        self._open.set()
        self._empty = asyncio.Event()
        self._empty.set()
        self.inside = 0
        self.failure: str | None = None  # set once the weights are unknown: nothing is admitted any more

    async def enter(self) -> None:
        """Wait until the gate is open, then count this request in. Raises ``WeightsLostError`` after a failure."""
        while not self._open.is_set():
            await self._open.wait()  # loop: the gate may have closed again before this task ran
        if self.failure is not None:
            raise WeightsLostError(self.failure)
        self.inside += 1
        self._empty.clear()

    def leave(self) -> None:
        self.inside -= 1
        if self.inside == 0:
            self._empty.set()

    @property
    def is_open(self) -> bool:
        return self._open.is_set()

    @contextlib.asynccontextmanager
    async def closed(self, drain_timeout_s: float) -> AsyncIterator[None]:
        """Shut the gate, wait for the requests inside (``TimeoutError`` after ``drain_timeout_s``), reopen at exit."""
        self._open.clear()
        try:
            await asyncio.wait_for(self._empty.wait(), drain_timeout_s)
            yield
        finally:
            self._open.set()  # after a failure too: waiting requests wake and get the 503


class VllmWeights:
    """The version vLLM serves, and the reload cycle that changes it (module docstring)."""

    def __init__(
        self,
        client: httpx.AsyncClient,
        url: str,
        admission: Admission,
        *,
        model_dir: Path,
        version: int,
        drain_timeout_s: float = 600.0,
        reload_timeout_s: float = 600.0,
        call_timeout_s: float = 30.0,
    ) -> None:
        self._client = client
        self.url = url
        self.admission = admission
        self.model_dir = model_dir
        self.path = model_dir  # the checkpoint vLLM holds now
        self._version = version
        self.drain_timeout_s = drain_timeout_s
        self.reload_timeout_s = reload_timeout_s
        self.call_timeout_s = call_timeout_s
        self._arch = read_architecture(model_dir)
        self._shapes = read_tensor_shapes(model_dir)
        self.stats: dict[str, float] = {"reloads": 0, "refused": 0, "failed": 0, "last_reload_s": 0.0}
        self._cycles = 0  # reload cycles started or finished: lets ``watch`` ignore answers that raced one

    @property
    def version(self) -> int:
        return self._version

    @property
    def max_apply_s(self) -> float:
        """The longest ``load_weights`` can take (the follower keeps its Kafka membership that long)."""
        return self.drain_timeout_s * 2 + self.reload_timeout_s * 2 + self.call_timeout_s * 6

    def marker(self) -> str:
        """What vLLM's ``/weight_info`` reports while it holds our weights (``/update_weight_version``)."""
        return f"{MARKER_PREFIX}{self._version}:{self.path}"

    async def _mark(self, marker: str) -> None:
        await self._call("/update_weight_version", json={"new_version": marker})

    async def _served_marker(self) -> str:
        return str((await self._call("/weight_info", method="GET")).json().get("weight_version"))

    async def sync(self) -> None:
        """Start from weights we know; ``ReloadFailedError`` if vLLM is unreachable.

        "default": vLLM holds its start weights (the served directory), so our version is recorded in it. Anything
        else (a vLLM that kept running while this service restarted, a reload cut off mid-way, or one by another
        tool): the served directory is loaded again, and the follower then brings the latest version."""
        served = await self._served_marker()
        if served == "default":
            await self._mark(self.marker())
            return
        log.warning("vllm_weights_unknown_reloading_start", reported=served, path=str(self.model_dir), url=self.url)
        await self._reload(self.model_dir, self._version)

    async def watch(self, interval_s: float = 2.0) -> None:
        """Run until cancelled; ``WeightsLostError`` once vLLM reports weights other than the version we stamp.

        That happens when vLLM was restarted (it comes back on its start weights) or reloaded by something else,
        e.g. ``deploy/vllm/reload_weights.sh`` by hand. An unreachable vLLM is not a loss: requests get a 503."""
        while True:
            await asyncio.sleep(interval_s)
            cycles = self._cycles
            if cycles % 2:  # a reload is running
                continue
            try:
                served = await self._served_marker()
            except ReloadFailedError:
                continue
            if self._cycles != cycles or served == self.marker():
                continue
            if served == "default" and self.path == self.model_dir:
                # vLLM (re)started on the directory we serve, which is what we stamp: record our version in it.
                with contextlib.suppress(ReloadFailedError):
                    await self._mark(self.marker())
                continue
            self.admission.failure = (
                f"vLLM at {self.url} reports weights {served!r}, but the proxy stamps version {self._version} "
                f"({self.path}): it was restarted or reloaded behind the proxy's back"
            )
            raise WeightsLostError(self.admission.failure)

    async def load_weights(self, path: Path, version: int) -> bool:
        """``reloader.WeightsTarget``: the reload cycle of the module docstring. True once ``version`` is served."""
        try:
            await asyncio.to_thread(check_compatible, path, self.model_dir, self._arch, self._shapes)
        except (OSError, IncompatibleCheckpointError):
            self.stats["refused"] += 1
            raise
        started = time.monotonic()
        old_version, old_path = self._version, self.path
        self._cycles += 1
        try:
            async with self.admission.closed(self.drain_timeout_s):
                drained = time.monotonic()
                await self._pause()
                try:
                    await self._reload(path, version)
                except ReloadFailedError as exc:
                    await self._restore(old_path, old_version, exc)
                    raise ReloadFailedError(
                        f"{exc}; restored {old_path}, still serving version {old_version} (version {version} "
                        "not loaded)"
                    ) from exc
                finally:
                    await self._resume()
                self._version, self.path = version, path
        except TimeoutError:
            self.stats["failed"] += 1
            raise ReloadFailedError(
                f"{self.admission.inside} request(s) still running after {self.drain_timeout_s:.0f} s; version "
                f"{version} from {path} not loaded, still serving version {old_version}"
            ) from None
        except ReloadFailedError:
            self.stats["failed"] += 1
            raise
        finally:
            self._cycles += 1
        elapsed = time.monotonic() - started
        self.stats["reloads"] += 1
        self.stats["last_reload_s"] = round(elapsed, 3)
        log.info(
            "vllm_weights_reloaded",
            version=version,
            old_version=old_version,
            path=str(path),
            drain_s=round(drained - started, 3),
            total_s=round(elapsed, 3),
        )
        return True

    async def _pause(self) -> None:
        try:
            # mode=wait: requests that reached vLLM without the proxy finish on the old weights too.
            await self._call("/pause", params={"mode": "wait"}, timeout=self.drain_timeout_s)
        except ReloadFailedError:
            # Nothing was reloaded; but a pause that timed out here may still take effect in vLLM later.
            with contextlib.suppress(ReloadFailedError):
                await self._call("/resume")
            raise

    async def _reload(self, path: Path, version: int) -> None:
        # Marked first: if this is cut off (we die mid-way), a later start sees weights it cannot trust.
        await self._mark(RELOADING)
        body = {"method": "reload_weights", "kwargs": {"weights_path": str(path)}}
        await self._call("/collective_rpc", json=body, timeout=self.reload_timeout_s)
        await self._call("/reset_prefix_cache")  # cached KV blocks were computed by the old weights
        await self._mark(f"{MARKER_PREFIX}{version}:{path}")

    async def _restore(self, old_path: Path, old_version: int, cause: ReloadFailedError) -> None:
        """After a failed reload vLLM may hold a mix of both checkpoints: load the old one back."""
        log.error("vllm_reload_failed_restoring", path=str(old_path), version=old_version, error=str(cause))
        try:
            await self._reload(old_path, old_version)
        except ReloadFailedError as exc:
            self.admission.failure = f"{cause}; restoring {old_path} failed too: {exc}"
            raise WeightsLostError(self.admission.failure) from exc

    async def _resume(self) -> None:
        try:
            await self._call("/resume")
        except ReloadFailedError as exc:
            # A vLLM left paused holds every request forever: refuse them here instead, and restart.
            self.admission.failure = f"vLLM at {self.url} could not be resumed after a reload: {exc}"
            raise WeightsLostError(self.admission.failure) from exc

    async def _call(
        self,
        path: str,
        *,
        method: str = "POST",
        json: dict[str, Any] | None = None,
        params: dict[str, str] | None = None,
        timeout: float | None = None,
    ) -> httpx.Response:
        limit = timeout or self.call_timeout_s
        try:
            response = await self._client.request(method, path, json=json, params=params, timeout=limit)
        except httpx.TimeoutException as exc:
            raise ReloadFailedError(f"{method} {self.url}{path}: no answer from vLLM in {limit:.0f} s") from exc
        except httpx.HTTPError as exc:
            raise ReloadFailedError(f"{method} {self.url}{path}: vLLM unreachable ({exc!r})") from exc
        if response.status_code >= 400:
            raise ReloadFailedError(f"{method} {self.url}{path}: {response.status_code} {response.text[:500]}")
        return response
